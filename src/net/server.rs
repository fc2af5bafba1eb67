//! The mio event loop: accepts TCP, reads HTTP requests (keep-alive, bodies
//! bounded by maxPayload), serves Engine.IO over WebSocket and over HTTP
//! long-polling (GETs held until there is something to send, POSTs of
//! packets, the upgrade of a polling session to WebSocket), decodes frames,
//! runs the Engine.IO heartbeat and the handler's timers, and flushes each
//! connection's queued bytes once per loop turn (so many deliveries leave in
//! one write).
//!
//! Readiness is a hint (edge-triggered): sockets are read until WouldBlock or
//! a per-turn budget, and a connection that hit the budget is read again next
//! turn before the loop sleeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use super::conn::{
    Conn, ConnId, Io, KeptBuffers, NetStats, State, TimerEntry, BUFFER_KEEP_BYTES_MAX, LAG_GRACE,
};
use super::http::{self, HttpError, Request, Response};
use super::polling::{self, Item};
use super::ws::{self, Flow, WsEvent};
use super::{Handler, Payload};
use crate::protocol::engineio::{self, Beat, HandshakeError, Heartbeat, OpenInfo, Transport};

const LISTENER: Token = Token(usize::MAX);
/// The loop's waker: other threads (the fsync thread) report through it.
const WAKER: Token = Token(usize::MAX - 1);
/// Client-closed polling sessions remembered for their last GET.
const CLOSED_SIDS_MAX: usize = 1024;
/// Bytes read from one socket per loop turn before others get a turn.
const READ_TURN_BYTES_MAX: usize = 1 << 20;
/// The shared read buffer; partial frames are copied out of it.
const SCRATCH_BYTES: usize = 64 * 1024;
const _: () = assert!(READ_TURN_BYTES_MAX >= SCRATCH_BYTES);
/// Longest a shutdown waits for queued bytes (goodbyes) to leave.
const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(2);
/// Longest one wait for writable sockets during the drain.
const SHUTDOWN_POLL_MAX: Duration = Duration::from_millis(50);
/// How early a deadline may fire: the poller's sleep granularity.
const TIMER_GRANULARITY: Duration = Duration::from_millis(2);
/// Content type of long-polling answers.
const PAYLOAD_TYPE: &str = "text/plain; charset=UTF-8";

/// Engine.IO settings the loop applies to every session.
#[derive(Debug, Clone)]
pub struct Settings {
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// Largest WebSocket message accepted (the open packet's `maxPayload`).
    pub message_bytes_max: usize,
    /// Per-connection outbound bound (`-max-pending`).
    pub out_bytes_max: usize,
    /// `Access-Control-Allow-Origin` for Engine.IO's HTTP answers (`*`
    /// answers any origin, with credentials allowed).
    pub cors_origin: Option<String>,
    /// Whether Engine.IO v3 clients are served.
    pub allow_eio3: bool,
    /// Most long-polling sessions open at once (they hold no socket, so
    /// nothing else bounds them); past it a handshake gets 503.
    pub polling_sessions_max: usize,
    /// Most input bytes held across all connections (partial requests and
    /// frames, fragmented messages), so many connections each holding
    /// most of a message cannot exhaust memory together; past it the
    /// connection whose input grew is closed.
    pub in_bytes_max: usize,
    /// Most outbound bytes queued across all connections
    /// (`-max-pending-total`), so many consumers that stop reading cannot
    /// together hold connections × `out_bytes_max`; past it the largest
    /// queues are cut as slow consumers (see `Server::shed`).
    pub out_total_max: usize,
}

/// A default for [`Settings::in_bytes_max`].
pub const IN_BYTES_MAX: usize = 256 << 20;

/// A default for [`Settings::polling_sessions_max`]: about 100 MB of idle
/// sessions at roughly 1 KB each.
pub const POLLING_SESSIONS_MAX: usize = 100_000;

/// Why a WebSocket request is refused.
enum WsRefusal {
    /// 400 with the Engine.IO error body.
    Engine(HandshakeError),
    /// `Sec-WebSocket-Version` missing or not 13: 426.
    Version,
}

pub struct Server<H: Handler> {
    poll: Poll,
    listener: TcpListener,
    handler: H,
    settings: Settings,
    table: ConnTable,
    scratch: Vec<u8>,
    sid_rng: u64,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    trimmer: super::trim::Trimmer,
    /// Whether the handler got the waker ([`Server::attach`]).
    attached: bool,
}

/// Asks a running [`Server`] to shut down; cheap to clone, usable from
/// any thread and from a signal handler (an atomic store and a write to
/// the loop's eventfd, nothing allocated).
#[derive(Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl Stopper {
    /// Makes [`Server::run`] shut down and return at its next turn.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
    }

    /// Wakes the loop without stopping it: the handler's `woken` runs.
    pub fn wake(&self) {
        let _ = self.waker.wake();
    }
}

/// The loop's connections and their bookkeeping (queues, timers,
/// counters), apart from the handler so both can be borrowed.
struct ConnTable {
    conns: Vec<Option<Conn>>,
    free: Vec<ConnId>,
    dirty: Vec<ConnId>,
    closing: Vec<ConnId>,
    /// Connections that used up this turn's read budget: read again after
    /// the other ready sockets, before the loop sleeps.
    read_later: Vec<ConnId>,
    /// Connections whose reading is paused, and since when.
    stalled: Vec<ConnId>,
    /// When the earliest lagging receiver's grace ends.
    stall_until: Option<Instant>,
    lagging: Vec<ConnId>,
    pressure: bool,
    /// Outbound bytes past which a receiver counts as lagging: a quarter of
    /// the slow-consumer bound.
    stall_bytes: usize,
    timers: BinaryHeap<Reverse<TimerEntry>>,
    stats: NetStats,
    serial: u64,
    out_bytes_max: usize,
    /// Sessions that began on long-polling, by Engine.IO sid.
    sids: HashMap<Box<str>, ConnId>,
    /// Polling sessions the client closed with no GET held, oldest first:
    /// (sid, endpoint, eio, until). Their next GET gets the `6` noop that
    /// would have answered a held one (a close POST can overtake the
    /// client's own concurrent GET); after that, or past `until`, the sid
    /// is unknown. At most [`CLOSED_SIDS_MAX`] are kept.
    closed_sids: VecDeque<(Box<str>, u8, u8, Instant)>,
    /// Polling sessions in handshake order (slot and serial), for making
    /// room at the cap: the oldest never used after its handshake goes.
    /// Entries of sessions used or gone are skipped (and pruned).
    unused: VecDeque<(ConnId, u64)>,
    /// Input bytes held across connections (the sum of their `held_in`).
    in_bytes: usize,
    /// Outbound bytes queued across connections (the sum of their
    /// `held_out`).
    out_bytes: usize,
    /// Keep-alive connections whose held GET was answered while more
    /// requests waited in their input (pipelined); read next turn.
    http_ready: Vec<ConnId>,
    /// Busy connections keeping a large emptied outbound buffer.
    kept: KeptBuffers,
}

impl ConnTable {
    fn io(&mut self, now: Instant) -> Io<'_> {
        Io {
            conns: &mut self.conns,
            dirty: &mut self.dirty,
            closing: &mut self.closing,
            timers: &mut self.timers,
            stats: &mut self.stats,
            now,
            out_bytes_max: self.out_bytes_max,
            lagging: &mut self.lagging,
            pressure: &mut self.pressure,
            stall_bytes: self.stall_bytes,
            out_bytes: &mut self.out_bytes,
        }
    }

    /// Counts what `id` has queued now into the outbound total.
    fn settle_out(&mut self, id: ConnId) {
        if let Some(Some(c)) = self.conns.get_mut(id) {
            let held = c.pending_out();
            debug_assert!(self.out_bytes >= c.held_out);
            self.out_bytes = self.out_bytes.saturating_sub(c.held_out) + held;
            c.held_out = held;
        }
    }
}

impl<H: Handler> Server<H> {
    /// Binds the listener; nothing runs until [`Server::run`].
    pub fn bind(addr: SocketAddr, settings: Settings, handler: H) -> io::Result<Server<H>> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(addr)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let table = ConnTable {
            conns: Vec::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            closing: Vec::new(),
            read_later: Vec::new(),
            stalled: Vec::new(),
            stall_until: None,
            lagging: Vec::new(),
            pressure: false,
            stall_bytes: settings.out_bytes_max / 4,
            timers: BinaryHeap::new(),
            stats: NetStats::default(),
            serial: 0,
            out_bytes_max: settings.out_bytes_max,
            sids: HashMap::new(),
            closed_sids: VecDeque::new(),
            unused: VecDeque::new(),
            in_bytes: 0,
            out_bytes: 0,
            http_ready: Vec::new(),
            kept: KeptBuffers::default(),
        };
        Ok(Server {
            poll,
            listener,
            handler,
            settings,
            table,
            scratch: vec![0; SCRATCH_BYTES],
            sid_rng: crate::rand::random_seed(),
            waker,
            stop: Arc::new(AtomicBool::new(false)),
            trimmer: super::trim::Trimmer::new(Instant::now()),
            attached: false,
        })
    }

    /// Gives the handler the loop's waker ([`Handler::attach`]: it hands
    /// it to its helper threads), once; an error is the handler's reason
    /// it cannot serve. [`Server::run`] attaches first if this was not called.
    pub fn attach(&mut self) -> Result<(), String> {
        if !self.attached {
            self.attached = true;
            self.handler.attach(Arc::clone(&self.waker))?;
        }
        Ok(())
    }

    /// The loop's waker, for helper threads started outside the handler
    /// (a cluster node's Raft thread and peer links): a thread that has
    /// output for the handler calls it, and the loop calls
    /// [`Handler::woken`].
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// The handler, to hand it what was started for it before the loop
    /// runs.
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }

    /// A handle that makes [`Server::run`] shut down (SIGTERM, tests).
    pub fn stopper(&self) -> Stopper {
        Stopper {
            stop: Arc::clone(&self.stop),
            waker: Arc::clone(&self.waker),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Runs the loop until a [`Stopper`] asks it to stop (then it shuts
    /// down cleanly and returns `Ok`) or the poller itself fails.
    pub fn run(&mut self) -> io::Result<()> {
        self.attach().map_err(io::Error::other)?;
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = Instant::now();
            // Deadlines that passed apply before the input of this turn: a
            // request that arrives as its session expires finds it gone.
            self.fire_timers(now);
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(now),
                    WAKER => {
                        let Server { table, handler, .. } = self;
                        handler.woken(&mut table.io(now));
                    }
                    Token(id) => {
                        let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                        if readable && !self.is_stalled(id) {
                            self.read(id, now);
                        }
                        if ev.is_writable() {
                            self.mark_dirty(id);
                        }
                    }
                }
            }
            let read_later = std::mem::take(&mut self.table.read_later);
            for id in read_later {
                if !self.is_stalled(id) {
                    self.read(id, now);
                }
            }
            for id in std::mem::take(&mut self.table.http_ready) {
                self.process_http(id, now);
                self.account_input(id, now);
            }
            self.fire_timers(now);
            let Server { table, handler, .. } = self;
            handler.tick(&mut table.io(now));
            self.flush_dirty(now);
            self.handler.after_output();
            self.table.kept.turn(&mut self.table.conns, now);
            if self.table.out_bytes > self.settings.out_total_max {
                self.shed();
            }
            self.finish_closing(now);
            self.resume_stalled(now);
            if let Some(took) = self.trimmer.turn(now) {
                crate::log_debug!("returned freed heap memory to the system in {took:?}");
            }
            if self.stop.load(Ordering::Acquire) {
                return self.shutdown();
            }
        }
    }

    /// Stops accepting, lets the handler say goodbye and persist
    /// ([`Handler::shutdown`]), closes every session and waits a bounded
    /// time for the queued bytes to leave; then the same for what is left
    /// (the held long-polling GETs, answered with their sessions' last
    /// packets, and other HTTP connections).
    fn shutdown(&mut self) -> io::Result<()> {
        let _ = self.poll.registry().deregister(&mut self.listener);
        let now = Instant::now();
        let deadline = now + SHUTDOWN_DRAIN_MAX;
        {
            let Server { table, handler, .. } = self;
            let mut io = table.io(now);
            handler.shutdown(&mut io);
            for id in 0..io.conns.len() {
                if matches!(&io.conns[id], Some(c) if c.session) {
                    io.close(id);
                }
            }
        }
        self.drain(deadline)?;
        self.finish_closing(Instant::now());
        {
            let mut io = self.table.io(Instant::now());
            for id in 0..io.conns.len() {
                io.close(id);
            }
        }
        self.drain(deadline)?;
        self.finish_closing(Instant::now());
        Ok(())
    }

    /// Flushes until no socket has bytes queued or `deadline` passes.
    fn drain(&mut self, deadline: Instant) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        loop {
            self.flush_dirty(Instant::now());
            let waiting: Vec<ConnId> = (0..self.table.conns.len())
                .filter(|&id| {
                    matches!(&self.table.conns[id],
                        Some(c) if c.stream.is_some() && c.pending_out() > 0)
                })
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            for id in waiting {
                self.mark_dirty(id);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            match self
                .poll
                .poll(&mut events, Some(left.min(SHUTDOWN_POLL_MAX)))
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn is_stalled(&self, id: ConnId) -> bool {
        matches!(self.table.conns.get(id), Some(Some(c)) if c.stalled)
    }

    /// Pauses reading `id`: what it sent went to receivers that lag.
    fn stall(&mut self, id: ConnId) {
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        if !c.stalled {
            c.stalled = true;
            self.table.stalled.push(id);
        }
    }

    /// Reads paused connections again once no receiver lags within its
    /// grace (a receiver stops lagging when its queue is back under half
    /// the stall mark, see `flush_dirty`).
    fn resume_stalled(&mut self, now: Instant) {
        let conns = &self.table.conns;
        let mut grace_end: Option<Instant> = None;
        self.table.lagging.retain(|&id| {
            let end = match conns.get(id) {
                Some(Some(c)) => c.lag_since.map(|t| t + LAG_GRACE),
                _ => None,
            };
            match end {
                Some(end) if now < end => {
                    grace_end = Some(grace_end.map_or(end, |g| g.min(end)));
                    true
                }
                _ => false,
            }
        });
        // The loop wakes when the first grace ends, if nothing drains first.
        self.table.stall_until = grace_end;
        if self.table.stalled.is_empty() || !self.table.lagging.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.table.stalled) {
            if let Some(Some(c)) = self.table.conns.get_mut(id) {
                c.stalled = false;
                self.table.read_later.push(id);
            }
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.table.read_later.is_empty()
            || !self.table.dirty.is_empty()
            || !self.table.http_ready.is_empty()
        {
            return Some(Duration::ZERO);
        }
        let stall_end = if self.table.stalled.is_empty() {
            None
        } else {
            self.table.stall_until
        };
        let next_timer = self.table.timers.peek().map(|Reverse(t)| t.at);
        let next_timer = match (next_timer, stall_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next = [
            self.handler.next_deadline(),
            self.trimmer.next_deadline(),
            self.table.kept.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .fold(next_timer, |next, at| Some(next.map_or(at, |n| n.min(at))));
        next.map(|at| at.saturating_duration_since(Instant::now()))
    }

    fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let id = self.table.free.pop().unwrap_or_else(|| {
                        self.table.conns.push(None);
                        self.table.conns.len() - 1
                    });
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(id), interest)
                        .is_err()
                    {
                        self.table.free.push(id);
                        continue;
                    }
                    self.table.serial += 1;
                    let mut conn = Conn::new(stream, self.table.serial);
                    // A connection that never sends a request head is dropped.
                    let at = now + self.idle_time();
                    conn.idle_until = Some(at);
                    self.table.conns[id] = Some(conn);
                    self.table.stats.connections_open += 1;
                    self.table.stats.connections_total += 1;
                    self.table.io(now).schedule(id, at);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors and the like: try again on the next event.
                Err(_) => return,
            }
        }
    }

    fn mark_dirty(&mut self, id: ConnId) {
        if let Some(Some(c)) = self.table.conns.get_mut(id) {
            if !c.dirty {
                c.dirty = true;
                self.table.dirty.push(id);
            }
        }
    }

    /// Reads what the socket has (up to the turn budget) and processes it.
    fn read(&mut self, id: ConnId, now: Instant) {
        self.table.pressure = false;
        self.read_some(id, now);
        if std::mem::take(&mut self.table.pressure) {
            self.stall(id);
        }
    }

    fn read_some(&mut self, id: ConnId, now: Instant) {
        let mut budget = READ_TURN_BYTES_MAX;
        loop {
            let Some(Some(c)) = self.table.conns.get_mut(id) else {
                return;
            };
            if c.state == State::Closing {
                return;
            }
            let Some(stream) = c.stream.as_mut() else {
                return;
            };
            match stream.read(&mut self.scratch) {
                Ok(0) => return self.drop_peer(id, now),
                Ok(n) => {
                    self.table.stats.bytes_in += n as u64;
                    self.ingest(id, n, now);
                    self.account_input(id, now);
                    if self.table.out_bytes > self.settings.out_total_max {
                        // What it sent filled queues past the budget.
                        self.shed();
                    }
                    if self.table.pressure {
                        // Its messages went to a lagging receiver.
                        return;
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        self.table.read_later.push(id);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.drop_peer(id, now),
            }
        }
    }

    /// Counts the input `id` holds into the loop's total; past the bound
    /// the connection is closed (a WebSocket with 1013, try again later).
    fn account_input(&mut self, id: ConnId, now: Instant) {
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        let held = c.inbuf.len() + c.decoder.held();
        self.table.in_bytes = self.table.in_bytes.saturating_sub(c.held_in) + held;
        c.held_in = held;
        if held == 0 || self.table.in_bytes <= self.settings.in_bytes_max {
            return;
        }
        match c.state {
            State::Closing => {}
            State::WebSocket => self.table.io(now).close_with(id, 1013),
            _ => {
                if c.abort() {
                    self.table.closing.push(id);
                }
            }
        }
    }

    /// The peer went away: its session ends without a goodbye.
    fn drop_peer(&mut self, id: ConnId, now: Instant) {
        if let Some(Some(c)) = self.table.conns.get_mut(id) {
            if c.abort() {
                self.table.closing.push(id);
            }
        }
        self.finish_closing(now);
    }

    fn ingest(&mut self, id: ConnId, n: usize, now: Instant) {
        let state = match self.table.conns.get(id) {
            Some(Some(c)) => c.state,
            _ => return,
        };
        match state {
            State::Http => self.ingest_http(id, n, now),
            State::WebSocket => self.ingest_ws(id, n, now),
            State::Probe => self.ingest_probe(id, n, now),
            State::Polling | State::Closing => {}
        }
    }

    fn ingest_http(&mut self, id: ConnId, n: usize, now: Instant) {
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        // All of the read is kept (it is at most the scratch buffer): what
        // follows a body or a head in the same read is the next request.
        c.inbuf.extend_from_slice(&self.scratch[..n]);
        self.process_http(id, now);
        // Requests wait unanswered only behind a held GET; past room for a
        // head and the largest body the client is cut, not buffered.
        let room = http::HEAD_BYTES_MAX + 1 + self.settings.message_bytes_max;
        if let Some(Some(c)) = self.table.conns.get_mut(id) {
            if c.state == State::Http && c.inbuf.len() > room && c.abort() {
                self.table.closing.push(id);
            }
        }
    }

    /// Answers the complete requests in the connection's input, one after
    /// another while the connection stays open and holds no GET.
    fn process_http(&mut self, id: ConnId, now: Instant) {
        loop {
            let Some(Some(c)) = self.table.conns.get_mut(id) else {
                return;
            };
            if c.state != State::Http || c.link.is_some() {
                return;
            }
            if let Some(wait) = c.body_wait.take() {
                if c.inbuf.len() < wait.1 {
                    c.body_wait = Some(wait);
                    return;
                }
                let (req, len) = *wait;
                let body: Vec<u8> = c.inbuf.drain(..len).collect();
                if c.inbuf.is_empty() && c.inbuf.capacity() > BUFFER_KEEP_BYTES_MAX {
                    c.inbuf = Vec::new();
                }
                self.route(id, &req, &body, now);
                continue;
            }
            match http::parse_request(&c.inbuf) {
                Ok(None) => return,
                Ok(Some((req, used))) => {
                    c.inbuf.drain(..used);
                    c.keep_alive = req.keep_alive();
                    c.origin = req.header("Origin").map(Into::into);
                    self.table.stats.http_requests += 1;
                    match req.body_len() {
                        Ok(0) => self.route(id, &req, &[], now),
                        Ok(len) if len <= self.settings.message_bytes_max => {
                            c.body_wait = Some(Box::new((req, len)));
                        }
                        Ok(_) => return self.fail(id, HttpError::PayloadTooLarge, now),
                        Err(e) => return self.fail(id, e, now),
                    }
                }
                Err(e) => return self.fail(id, e, now),
            }
        }
    }

    /// Answers a request the HTTP layer refused, and closes.
    fn fail(&mut self, id: ConnId, e: HttpError, now: Instant) {
        let resp = Response::text(e.status(), format!("{}\n", http::reason(e.status())));
        self.respond_to(id, &resp, false, now);
    }

    /// Queues the answer and closes after it; `head_only` leaves the body
    /// out (a HEAD request) while keeping its Content-Length.
    fn respond_to(&mut self, id: ConnId, resp: &Response, head_only: bool, now: Instant) {
        let mut bytes = resp.encode();
        if head_only {
            bytes.truncate(bytes.len() - resp.body.len());
        }
        let mut io = self.table.io(now);
        io.send_raw(id, &bytes);
        io.close(id);
    }

    /// An Engine.IO error answer (400 with the JSON body), then close.
    fn refuse(&mut self, id: ConnId, e: HandshakeError, now: Instant) {
        let mut resp = Response::json(400, e.body());
        self.cors(id, &mut resp);
        self.respond_to(id, &resp, false, now);
    }

    /// Adds the CORS headers when `-cors-origin` is set: `*` answers the
    /// request's own origin (so credentials work), else the configured one.
    fn cors(&self, id: ConnId, resp: &mut Response) {
        let Some(allowed) = &self.settings.cors_origin else {
            return;
        };
        let origin = match self.table.conns.get(id) {
            Some(Some(c)) => c.origin.as_deref(),
            _ => None,
        };
        let value = match (allowed.as_str(), origin) {
            ("*", Some(o)) => o.to_string(),
            (a, _) => a.to_string(),
        };
        let credentials = value != "*";
        resp.headers
            .push(("Access-Control-Allow-Origin".into(), value));
        if credentials {
            resp.headers
                .push(("Access-Control-Allow-Credentials".into(), "true".into()));
            resp.headers.push(("Vary".into(), "Origin".into()));
        }
    }

    fn route(&mut self, id: ConnId, req: &Request, body: &[u8], now: Instant) {
        let Some(endpoint) = self.handler.endpoint(&req.path) else {
            let Server { table, handler, .. } = self;
            let resp = handler.http(&mut table.io(now), req);
            return self.respond_to(id, &resp, req.method == "HEAD", now);
        };
        if req.method == "OPTIONS" && self.settings.cors_origin.is_some() {
            // A CORS preflight.
            let mut resp = Response::text(204, "");
            self.cors(id, &mut resp);
            resp.headers
                .push(("Access-Control-Allow-Methods".into(), "GET, POST".into()));
            let asked = req.header("Access-Control-Request-Headers");
            resp.headers.push((
                "Access-Control-Allow-Headers".into(),
                asked.unwrap_or("Content-Type").to_string(),
            ));
            return self.answer_http(id, resp, now);
        }
        let supported: &[u8] = if self.settings.allow_eio3 {
            &[3, 4]
        } else {
            &[4]
        };
        let hs = match engineio::parse_query(&req.query, supported) {
            Ok(hs) => hs,
            Err(e) => return self.refuse(id, e, now),
        };
        let legacy_token = (hs.eio == 3)
            .then(|| req.query_param("token"))
            .flatten()
            .map(Box::from);
        match (hs.transport, hs.sid) {
            (Transport::Polling, None) if req.method == "GET" => {
                if self.table.stats.polling_sessions as usize >= self.settings.polling_sessions_max
                    && !self.evict_unused(now)
                {
                    let mut resp =
                        Response::json(503, r#"{"code":3,"message":"Too many sessions"}"#);
                    self.cors(id, &mut resp);
                    return self.respond_to(id, &resp, false, now);
                }
                self.open_polling(id, endpoint, hs.eio, legacy_token, now)
            }
            (Transport::Polling, None) => self.refuse(id, HandshakeError::BadHandshakeMethod, now),
            (Transport::Polling, Some(sid)) => {
                let Some(session) = self.polling_session(&sid, endpoint) else {
                    if req.method == "GET" {
                        if let Some(eio) = self.take_closed_sid(&sid, endpoint, now) {
                            let mut body = Vec::new();
                            polling::push_text(&mut body, eio, b"6", &[]);
                            return self.answer_http(
                                id,
                                Response::new(200, PAYLOAD_TYPE, body),
                                now,
                            );
                        }
                    }
                    return self.refuse(id, HandshakeError::UnknownSid, now);
                };
                self.mark_used(session);
                match req.method.as_str() {
                    "GET" => self.poll_get(session, id, now),
                    "POST" => self.poll_post(session, id, body, now),
                    _ => self.refuse(id, HandshakeError::BadRequest, now),
                }
            }
            (Transport::WebSocket, sid) => {
                if sid
                    .as_deref()
                    .is_some_and(|sid| !self.table.sids.contains_key(sid))
                {
                    return self.refuse(id, HandshakeError::UnknownSid, now);
                }
                let key = match Self::check_ws_request(req) {
                    Ok(k) => k,
                    Err(WsRefusal::Engine(e)) => return self.refuse(id, e, now),
                    Err(WsRefusal::Version) => return self.refuse_ws_version(id, now),
                };
                let Some(sid) = sid else {
                    return self.upgrade(id, endpoint, hs.eio, legacy_token, &key, now);
                };
                match self.polling_session(&sid, endpoint) {
                    Some(session) if !self.upgrading(session) => {
                        self.mark_used(session);
                        self.start_probe(id, session, &key, now)
                    }
                    // A session that upgraded (or is upgrading) already:
                    // the WebSocket opens and is closed at once, as
                    // Engine.IO servers do.
                    _ if self.table.sids.contains_key(sid.as_str()) => {
                        let mut bytes = http::upgrade_response(&ws::accept_key(&key));
                        ws::write_close(&mut bytes, 1000);
                        let mut io = self.table.io(now);
                        io.send_raw(id, &bytes);
                        io.close(id);
                    }
                    _ => self.refuse(id, HandshakeError::UnknownSid, now),
                }
            }
        }
    }

    /// How long an HTTP connection may sit without a request.
    fn idle_time(&self) -> Duration {
        self.settings.ping_interval + self.settings.ping_timeout
    }

    fn heartbeat(&self, eio: u8, now: Instant) -> Heartbeat {
        let (interval, timeout) = (self.settings.ping_interval, self.settings.ping_timeout);
        if eio == 3 {
            Heartbeat::passive(now, interval, timeout)
        } else {
            Heartbeat::new(now, interval, timeout)
        }
    }

    /// The polling session with Engine.IO sid `sid` on `endpoint`.
    fn polling_session(&self, sid: &str, endpoint: u8) -> Option<ConnId> {
        let &id = self.table.sids.get(sid)?;
        match self.table.conns.get(id) {
            Some(Some(c)) if c.state == State::Polling && c.endpoint == endpoint => Some(id),
            _ => None,
        }
    }

    fn upgrading(&self, session: ConnId) -> bool {
        match self.table.conns.get(session) {
            Some(Some(c)) => c.polling.as_ref().is_some_and(|p| p.upgrading.is_some()),
            _ => false,
        }
    }

    fn mark_used(&mut self, session: ConnId) {
        if let Some(Some(s)) = self.table.conns.get_mut(session) {
            if let Some(p) = s.polling.as_mut() {
                p.used = true;
            }
        }
    }

    /// Whether `(slot, serial)` is still a polling session never used
    /// since its handshake.
    fn is_unused(&self, (slot, serial): (ConnId, u64)) -> bool {
        matches!(self.table.conns.get(slot), Some(Some(c))
            if c.serial == serial && c.state == State::Polling
                && c.polling.as_ref().is_some_and(|p| !p.used))
    }

    /// Makes room for a polling handshake at the cap by closing the oldest
    /// session that was never used after its own handshake (a client that
    /// opens sessions and abandons them cannot lock others out); false if
    /// every session is in use.
    fn evict_unused(&mut self, now: Instant) -> bool {
        while let Some(entry) = self.table.unused.pop_front() {
            if self.is_unused(entry) {
                self.close_polling(entry.0, b"1", now);
                return true;
            }
        }
        false
    }

    /// Lists a new session for [`Server::evict_unused`], pruning the list
    /// when it holds many more entries than there are sessions.
    fn list_unused(&mut self, entry: (ConnId, u64)) {
        self.table.unused.push_back(entry);
        let sessions = self.table.stats.polling_sessions as usize;
        if self.table.unused.len() > 2 * sessions + 1024 {
            let mut list = std::mem::take(&mut self.table.unused);
            list.retain(|&e| self.is_unused(e));
            self.table.unused = list;
        }
    }

    /// A handshake GET: a new session whose open packet answers it.
    fn open_polling(
        &mut self,
        id: ConnId,
        endpoint: u8,
        eio: u8,
        legacy_token: Option<Box<str>>,
        now: Instant,
    ) {
        let sid = self.next_sid();
        let slot = self.table.free.pop().unwrap_or_else(|| {
            self.table.conns.push(None);
            self.table.conns.len() - 1
        });
        self.table.serial += 1;
        let mut conn = Conn::polling_session(self.table.serial, eio, &sid);
        conn.legacy_token = legacy_token;
        conn.endpoint = endpoint;
        conn.session = true;
        let hb = self.heartbeat(eio, now);
        let deadline = hb.deadline();
        conn.heartbeat = Some(hb);
        let serial = conn.serial;
        self.table.conns[slot] = Some(conn);
        self.table.sids.insert(sid.as_str().into(), slot);
        self.table.stats.sessions_open += 1;
        self.table.stats.polling_sessions += 1;
        self.list_unused((slot, serial));
        let open = OpenInfo {
            sid: &sid,
            upgrades: &["websocket"],
            ping_interval: self.settings.ping_interval,
            ping_timeout: self.settings.ping_timeout,
            max_payload: self.settings.message_bytes_max,
        }
        .encode();
        let Server { table, handler, .. } = self;
        let mut io = table.io(now);
        io.send_engine(slot, open.as_bytes());
        io.arm_heartbeat(slot, deadline);
        handler.opened(&mut io, slot, endpoint);
        self.poll_get(slot, id, now);
    }

    /// A GET on a polling session: answered now if packets are queued (or
    /// with a noop while an upgrade is probed), else held. A second GET
    /// while one is held breaks the protocol: it is refused and the session
    /// ends (the held GET gets the close packet).
    fn poll_get(&mut self, session: ConnId, id: ConnId, now: Instant) {
        let Some(serial) = self.serial_of(id) else {
            return;
        };
        let Some(Some(s)) = self.table.conns.get_mut(session) else {
            return;
        };
        let s_serial = s.serial;
        let pending = s.pending_out() > 0;
        let Some(p) = s.polling.as_mut() else {
            return;
        };
        if p.get.is_some() {
            self.refuse(id, HandshakeError::BadRequest, now);
            return self.close_polling(session, b"1", now);
        }
        if p.upgrading.is_some() {
            let mut body = Vec::new();
            polling::push_text(&mut body, p.eio, b"6", &[]);
            return self.answer_http(id, Response::new(200, PAYLOAD_TYPE, body), now);
        }
        p.get = Some((id, serial));
        if let Some(Some(c)) = self.table.conns.get_mut(id) {
            c.link = Some((session, s_serial));
        }
        if pending {
            self.answer_get(session, false, now);
        }
    }

    /// A POST of packets to a polling session; answered `ok` once they were
    /// handled. A malformed payload is refused and ends the session.
    fn poll_post(&mut self, session: ConnId, id: ConnId, body: &[u8], now: Instant) {
        let eio = match self.table.conns.get(session) {
            Some(Some(c)) => c.eio,
            _ => return,
        };
        // All or nothing: the packets are checked first, then handled in
        // a second pass (neither pass holds them as a list).
        let valid = polling::packets(body, eio).is_ok_and(|mut packets| {
            packets.all(|item| match item {
                Ok(Item::Text(t)) => {
                    !matches!(engineio::decode(t), Err(_) | Ok(engineio::Packet::Open(_)))
                }
                Ok(Item::Binary(_)) => true,
                Err(_) => false,
            })
        });
        let (Ok(items), true) = (polling::packets(body, eio), valid) else {
            self.refuse(id, HandshakeError::BadRequest, now);
            return self.table.io(now).close(session);
        };
        for item in items.flatten() {
            let Server { table, handler, .. } = self;
            let mut io = table.io(now);
            if !io.is_open(session) {
                break;
            }
            match item {
                Item::Text(t) if engineio::decode(t) == Ok(engineio::Packet::Close) => {
                    // The client ends the session: a held GET ends quietly,
                    // and so does one still on its way.
                    self.remember_closed(session, now);
                    self.close_polling(session, b"6", now);
                    break;
                }
                Item::Text(t) => on_engine_text(&mut io, handler, session, t),
                Item::Binary(b) => handler.message(&mut io, session, Payload::Binary(b.as_slice())),
            }
        }
        self.answer_http(id, Response::new(200, PAYLOAD_TYPE, "ok"), now);
    }

    /// Notes a polling session the client is closing while no GET is held,
    /// so that its GET still in flight gets the `6` noop, not an error.
    fn remember_closed(&mut self, session: ConnId, now: Instant) {
        let Some(Some(c)) = self.table.conns.get(session) else {
            return;
        };
        let (Some(sid), Some(p)) = (c.sid.as_ref(), c.polling.as_ref()) else {
            return;
        };
        if p.get.is_some() {
            return;
        }
        let entry = (sid.clone(), c.endpoint, c.eio, now + self.idle_time());
        let closed = &mut self.table.closed_sids;
        while closed.len() >= CLOSED_SIDS_MAX || closed.front().is_some_and(|e| e.3 <= now) {
            closed.pop_front();
        }
        closed.push_back(entry);
    }

    /// The eio of a session the client closed, if `sid` is one (once).
    fn take_closed_sid(&mut self, sid: &str, endpoint: u8, now: Instant) -> Option<u8> {
        let closed = &mut self.table.closed_sids;
        let i = closed
            .iter()
            .position(|e| &*e.0 == sid && e.1 == endpoint && e.3 > now)?;
        closed.remove(i).map(|e| e.2)
    }

    /// Ends a polling session now; its held GET (if any) gets `packet`.
    fn close_polling(&mut self, session: ConnId, packet: &[u8], now: Instant) {
        let Some(Some(s)) = self.table.conns.get_mut(session) else {
            return;
        };
        if s.state != State::Polling {
            return;
        }
        s.out.clear();
        s.out_pos = 0;
        polling::push_text(&mut s.out, s.eio, packet, &[]);
        self.answer_get(session, false, now);
        if let Some(Some(s)) = self.table.conns.get_mut(session) {
            s.out = Vec::new();
            s.state = State::Closing;
            self.table.closing.push(session);
        }
    }

    /// Answers a polling session's held GET with its queue (or, with
    /// `noop`, with a noop packet, leaving the queue for the upgrade).
    fn answer_get(&mut self, session: ConnId, noop: bool, now: Instant) {
        let Some(Some(s)) = self.table.conns.get_mut(session) else {
            return;
        };
        let eio = s.eio;
        let Some((get, serial)) = s.polling.as_mut().and_then(|p| p.get.take()) else {
            return;
        };
        let body = if noop {
            let mut b = Vec::new();
            polling::push_text(&mut b, eio, b"6", &[]);
            b
        } else {
            s.lag_since = None;
            let mut out = std::mem::take(&mut s.out);
            out.drain(..s.out_pos);
            s.out_pos = 0;
            out
        };
        match self.table.conns.get_mut(get) {
            Some(Some(c)) if c.serial == serial && c.state == State::Http => c.link = None,
            _ => return,
        }
        self.answer_http(get, Response::new(200, PAYLOAD_TYPE, body), now);
    }

    /// Answers the request on HTTP connection `id` (with CORS headers),
    /// writes it at once, and keeps the connection if the request asked.
    fn answer_http(&mut self, id: ConnId, mut resp: Response, now: Instant) {
        self.cors(id, &mut resp);
        let idle_at = now + self.idle_time();
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        let keep = c.keep_alive;
        if c.pending_out() > self.table.out_bytes_max {
            // Earlier answers (to pipelined requests) are not read: a slow
            // consumer, cut like a session's socket at the same bound.
            if c.abort() {
                self.table.closing.push(id);
            }
            self.table.stats.slow_consumers += 1;
            return;
        }
        resp.encode_into(keep, &mut c.out);
        match c.flush() {
            Ok(written) => self.table.stats.bytes_out += written as u64,
            Err(_) => {
                if c.abort() {
                    self.table.closing.push(id);
                }
                return;
            }
        }
        let mut io = self.table.io(now);
        if keep {
            // The connection's one timer (armed at accept) sees the new
            // deadline when it fires.
            let mut pipelined = false;
            if let Some(c) = io.conn_mut(id) {
                c.idle_until = Some(idle_at);
                pipelined = !c.inbuf.is_empty();
                if c.pending_out() > 0 && !c.dirty {
                    c.dirty = true;
                    io.dirty.push(id);
                }
            }
            if pipelined {
                self.table.http_ready.push(id);
            }
        } else {
            io.close(id);
        }
    }

    fn serial_of(&self, id: ConnId) -> Option<u64> {
        match self.table.conns.get(id) {
            Some(Some(c)) => Some(c.serial),
            _ => None,
        }
    }

    /// A WebSocket asking to take over polling session `session`: after
    /// the handshake it waits for `2probe` and `5`.
    fn start_probe(&mut self, id: ConnId, session: ConnId, key: &str, now: Instant) {
        let Some(s_serial) = self.serial_of(session) else {
            return;
        };
        let idle_at = now + self.idle_time();
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        c.state = State::Probe;
        c.link = Some((session, s_serial));
        c.idle_until = Some(idle_at);
        c.out
            .extend_from_slice(&http::upgrade_response(&ws::accept_key(key)));
        if c.flush().is_err() {
            return self.drop_peer(id, now);
        }
        let leftover = !c.inbuf.is_empty();
        if leftover {
            self.ingest_probe(id, 0, now);
        }
    }

    /// Decodes a probing WebSocket's frames: `2probe` is answered `3probe`
    /// (and the session's GETs get noops from then on), `5` completes the
    /// upgrade; anything else ends the probe.
    fn ingest_probe(&mut self, id: ConnId, n: usize, now: Instant) {
        #[derive(PartialEq)]
        enum Step {
            Probe,
            Upgrade,
            Bad,
        }
        let Server {
            table,
            scratch,
            settings,
            ..
        } = self;
        let Some(Some(c)) = table.conns.get_mut(id) else {
            return;
        };
        let mut held = std::mem::take(&mut c.inbuf);
        held.extend_from_slice(&scratch[..n]);
        let mut steps = Vec::new();
        let result = c
            .decoder
            .decode(&mut held, settings.message_bytes_max, &mut |ev| {
                let step = match ev {
                    WsEvent::Text("2probe") => Step::Probe,
                    WsEvent::Text("5") => Step::Upgrade,
                    WsEvent::Ping(_) | WsEvent::Pong => return Flow::Continue,
                    _ => Step::Bad,
                };
                let go_on = step == Step::Probe;
                steps.push(step);
                if go_on {
                    Flow::Continue
                } else {
                    Flow::Stop
                }
            });
        match result {
            Ok(used) => {
                held.drain(..used);
                c.inbuf = held;
            }
            Err(e) => return self.table.io(now).close_with(id, e.close_code()),
        }
        for step in steps {
            match step {
                Step::Probe => self.probe_answered(id, now),
                Step::Upgrade => return self.complete_upgrade(id, now),
                Step::Bad => return self.table.io(now).close_with(id, 1002),
            }
        }
    }

    /// The probe's session, if it is still the polling session it was.
    fn probe_target(&self, probe: ConnId) -> Option<ConnId> {
        let Some(Some(c)) = self.table.conns.get(probe) else {
            return None;
        };
        let (session, serial) = c.link?;
        match self.table.conns.get(session) {
            Some(Some(s)) if s.serial == serial && s.state == State::Polling => Some(session),
            _ => None,
        }
    }

    fn probe_answered(&mut self, probe: ConnId, now: Instant) {
        let mut frame = Vec::with_capacity(8);
        ws::write_header(&mut frame, ws::TEXT, 6);
        frame.extend_from_slice(b"3probe");
        self.table.io(now).send_reply(probe, &frame);
        let Some(session) = self.probe_target(probe) else {
            return self.table.io(now).close(probe);
        };
        let probe_serial = self.serial_of(probe).unwrap_or_default();
        if let Some(Some(s)) = self.table.conns.get_mut(session) {
            if let Some(p) = s.polling.as_mut() {
                p.upgrading = Some((probe, probe_serial));
            }
        }
        // The held GET ends with a noop so the client stops polling.
        self.answer_get(session, true, now);
    }

    /// `5` on the probe: its socket becomes the session's transport, and
    /// what was queued for polling leaves as WebSocket frames.
    fn complete_upgrade(&mut self, probe: ConnId, now: Instant) {
        let Some(session) = self.probe_target(probe) else {
            return self.table.io(now).close(probe);
        };
        self.answer_get(session, true, now);
        let Some(mut p) = self.table.conns[probe].take() else {
            return;
        };
        // Its input and output move to the session's slot and are
        // counted there.
        self.table.in_bytes = self.table.in_bytes.saturating_sub(p.held_in);
        self.table.out_bytes = self.table.out_bytes.saturating_sub(p.held_out);
        self.table.free.push(probe);
        let Some(mut stream) = p.stream.take() else {
            return;
        };
        let registry = self.poll.registry();
        let _ = registry.deregister(&mut stream);
        let interest = Interest::READABLE | Interest::WRITABLE;
        if registry
            .register(&mut stream, Token(session), interest)
            .is_err()
        {
            self.table.stats.connections_open -= 1;
            return self.table.io(now).close(session);
        }
        let Some(Some(s)) = self.table.conns.get_mut(session) else {
            return;
        };
        let queued = std::mem::take(&mut s.out);
        let queued = &queued[s.out_pos..];
        s.out_pos = 0;
        s.lag_since = None;
        s.stream = Some(stream);
        s.state = State::WebSocket;
        s.polling = None;
        s.decoder = std::mem::take(&mut p.decoder);
        s.inbuf = std::mem::take(&mut p.inbuf);
        // What the probe had not written yet (its `3probe`) goes first.
        s.out.extend_from_slice(&p.out[p.out_pos..]);
        self.table.stats.polling_sessions -= 1;
        let items = if queued.is_empty() {
            Vec::new()
        } else {
            polling::decode(queued, s.eio).unwrap_or_default()
        };
        for item in items {
            match item {
                Item::Text(t) => {
                    ws::write_header(&mut s.out, ws::TEXT, t.len());
                    s.out.extend_from_slice(t.as_bytes());
                }
                Item::Binary(b) if s.eio == 3 => {
                    ws::write_header(&mut s.out, ws::BINARY, b.len() + 1);
                    s.out.push(4);
                    s.out.extend_from_slice(&b);
                }
                Item::Binary(b) => {
                    ws::write_header(&mut s.out, ws::BINARY, b.len());
                    s.out.extend_from_slice(&b);
                }
            }
        }
        let leftover = !s.inbuf.is_empty();
        self.mark_dirty(session);
        if leftover {
            self.ingest_ws(session, 0, now);
        }
        self.account_input(session, now);
    }

    /// Undoes the links of a connection that is gone: a held GET leaves its
    /// session, a probe gives polling back, a polling session's sid is
    /// forgotten and its held GET gets what was queued (the close packet).
    fn unlink(&mut self, id: ConnId, c: &mut Conn, now: Instant) {
        if let Some(sid) = c.sid.take() {
            self.table.sids.remove(&sid);
        }
        if let Some(p) = c.polling.take() {
            self.table.stats.polling_sessions -= 1;
            if let Some((get, serial)) = p.get {
                let mut body = std::mem::take(&mut c.out);
                if body.is_empty() {
                    polling::push_text(&mut body, p.eio, b"1", &[]);
                }
                match self.table.conns.get_mut(get) {
                    Some(Some(g)) if g.serial == serial && g.state == State::Http => {
                        g.link = None;
                        self.answer_http(get, Response::new(200, PAYLOAD_TYPE, body), now);
                    }
                    _ => {}
                }
            }
        }
        if let Some((session, serial)) = c.link.take() {
            if let Some(Some(s)) = self.table.conns.get_mut(session) {
                if s.serial == serial {
                    if let Some(p) = s.polling.as_mut() {
                        if p.get.is_some_and(|(g, gs)| g == id && gs == c.serial) {
                            p.get = None;
                        } else if p.upgrading == Some((id, c.serial)) {
                            // The probe that was answered is gone: GETs
                            // are held again. (Another probe going away
                            // leaves the upgrade under way.)
                            p.upgrading = None;
                        }
                    }
                }
            }
        }
    }

    /// Engine.IO's and RFC 6455's checks on a WebSocket request (§4.2.1:
    /// upgrade headers, version 13, a key that is the base64 of 16 bytes);
    /// the client's key when all pass.
    fn check_ws_request(req: &Request) -> Result<String, WsRefusal> {
        let bad = WsRefusal::Engine(HandshakeError::BadRequest);
        if req.method != "GET" {
            return Err(WsRefusal::Engine(HandshakeError::BadHandshakeMethod));
        }
        let upgrade = req
            .header("Upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !upgrade || !req.header_has_token("Connection", "upgrade") {
            return Err(bad);
        }
        if req.header("Sec-WebSocket-Version") != Some("13") {
            return Err(WsRefusal::Version);
        }
        match req.header("Sec-WebSocket-Key") {
            Some(key) if ws::is_valid_client_key(key) => Ok(key.to_string()),
            _ => Err(bad),
        }
    }

    /// A WebSocket version other than 13: 426 naming the one spoken (RFC
    /// 6455 §4.4), with the Engine.IO error body, then close.
    fn refuse_ws_version(&mut self, id: ConnId, now: Instant) {
        let mut resp = Response::json(426, HandshakeError::BadRequest.body());
        resp.headers
            .push(("Sec-WebSocket-Version".into(), "13".into()));
        self.cors(id, &mut resp);
        self.respond_to(id, &resp, false, now);
    }

    fn upgrade(
        &mut self,
        id: ConnId,
        endpoint: u8,
        eio: u8,
        legacy_token: Option<Box<str>>,
        key: &str,
        now: Instant,
    ) {
        let sid = self.next_sid();
        let open = OpenInfo {
            sid: &sid,
            upgrades: &[],
            ping_interval: self.settings.ping_interval,
            ping_timeout: self.settings.ping_timeout,
            max_payload: self.settings.message_bytes_max,
        }
        .encode();
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        c.state = State::WebSocket;
        c.endpoint = endpoint;
        c.session = true;
        c.eio = eio;
        c.legacy_token = legacy_token;
        c.out
            .extend_from_slice(&http::upgrade_response(&ws::accept_key(key)));
        // The 101 leaves in a write of its own, as Engine.IO servers send
        // it: some clients take the open packet only after the upgrade.
        if c.flush().is_err() {
            return self.drop_peer(id, now);
        }
        let hb = self.heartbeat(eio, now);
        let deadline = hb.deadline();
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        c.heartbeat = Some(hb);
        let leftover = !c.inbuf.is_empty();
        self.table.stats.sessions_open += 1;
        let Server { table, handler, .. } = self;
        let mut io = table.io(now);
        io.send_engine(id, open.as_bytes());
        io.arm_heartbeat(id, deadline);
        handler.opened(&mut io, id, endpoint);
        if leftover {
            // Frames that came in the same packet as the request head.
            self.ingest_ws(id, 0, now);
        }
    }

    fn next_sid(&mut self) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::with_capacity(20);
        for _ in 0..2 {
            let mut v = crate::rand::splitmix64(&mut self.sid_rng);
            for _ in 0..10 {
                out.push(ALPHABET[(v & 63) as usize] as char);
                v >>= 6;
            }
        }
        out
    }

    /// Decodes frames from the conn's held bytes plus `n` new scratch bytes.
    fn ingest_ws(&mut self, id: ConnId, n: usize, now: Instant) {
        let Server {
            table,
            handler,
            scratch,
            settings,
            ..
        } = self;
        let Some(Some(c)) = table.conns.get_mut(id) else {
            return;
        };
        let mut decoder = std::mem::take(&mut c.decoder);
        let mut held = std::mem::take(&mut c.inbuf);
        let from_scratch = held.is_empty();
        if !from_scratch {
            held.extend_from_slice(&scratch[..n]);
        }
        let buf: &mut [u8] = if from_scratch {
            &mut scratch[..n]
        } else {
            &mut held[..]
        };
        let mut io = table.io(now);
        let result = decoder.decode(buf, settings.message_bytes_max, &mut |ev| {
            on_ws_event(&mut io, handler, id, ev)
        });
        let rest: Vec<u8> = match result {
            Ok(used) if from_scratch => buf[used..].to_vec(),
            Ok(used) => {
                held.drain(..used);
                held
            }
            Err(e) => {
                io.close_with(id, e.close_code());
                Vec::new()
            }
        };
        let Some(Some(c)) = table.conns.get_mut(id) else {
            return;
        };
        c.decoder = decoder;
        c.inbuf = if rest.is_empty() && rest.capacity() > BUFFER_KEEP_BYTES_MAX {
            Vec::new()
        } else {
            rest
        };
    }

    fn fire_timers(&mut self, now: Instant) {
        // The poller sleeps in whole milliseconds: a deadline within that
        // granularity counts as due now rather than one wake-up later.
        let due = now + TIMER_GRANULARITY;
        while let Some(Reverse(t)) = self.table.timers.peek().copied() {
            if t.at > due {
                return;
            }
            self.table.timers.pop();
            let Some(Some(c)) = self.table.conns.get_mut(t.conn) else {
                continue;
            };
            if c.serial != t.serial || c.state == State::Closing {
                continue;
            }
            if matches!(c.state, State::Http | State::Probe) {
                // One timer per connection, re-armed here: a held GET waits
                // for its session; an idle connection (no request, or a
                // probe that never upgrades) is dropped once its latest
                // deadline passed.
                let holding = c.state == State::Http && c.link.is_some();
                let next = match c.idle_until {
                    _ if holding => Some(now + self.idle_time()),
                    Some(at) if at > due => Some(at),
                    _ => None,
                };
                let mut io = self.table.io(now);
                match next {
                    Some(at) => io.schedule(t.conn, at),
                    None => io.close(t.conn),
                }
                continue;
            }
            if c.beat_at.is_some_and(|at| at <= due) {
                // The heartbeat timer fired; it is armed again below.
                c.beat_at = None;
            }
            let beat = c.heartbeat.as_mut().map_or(Beat::Idle, |hb| hb.poll(due));
            let next = c.heartbeat.as_ref().map(Heartbeat::deadline);
            let app_due = c.app_deadline.is_some_and(|d| d <= due);
            if app_due {
                c.app_deadline = None;
            }
            let Server { table, handler, .. } = self;
            let mut io = table.io(now);
            match beat {
                Beat::TimedOut => {
                    io.close(t.conn);
                    continue;
                }
                Beat::SendPing => {
                    io.send_engine(t.conn, b"2");
                }
                Beat::Idle => {}
            }
            if let Some(at) = next {
                io.arm_heartbeat(t.conn, at);
            }
            if app_due {
                handler.timer(&mut io, t.conn);
            }
        }
    }

    /// Writes what dirty connections queued (a polling session's queue
    /// answers its held GET) and settles their outbound counts.
    fn flush_dirty(&mut self, now: Instant) {
        let dirty = std::mem::take(&mut self.table.dirty);
        for &id in &dirty {
            self.flush_one(id, now);
            self.table.settle_out(id);
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.table.dirty.is_empty() {
            self.table.dirty = dirty;
        }
    }

    fn flush_one(&mut self, id: ConnId, now: Instant) {
        let Some(Some(c)) = self.table.conns.get_mut(id) else {
            return;
        };
        c.dirty = false;
        if c.state == State::Polling {
            // A polling session's queue leaves with its held GET.
            let held = c.polling.as_ref().is_some_and(|p| p.get.is_some());
            if held && c.pending_out() > 0 {
                self.answer_get(id, false, now);
            }
            return;
        }
        match c.flush() {
            Ok(written) => {
                self.table.kept.note(id, c, now);
                self.table.stats.bytes_out += written as u64;
                if c.lag_since.is_some() && c.pending_out() <= self.table.stall_bytes / 2 {
                    c.lag_since = None;
                }
            }
            Err(_) => {
                if c.abort() {
                    self.table.closing.push(id);
                }
            }
        }
    }

    /// Past the outbound budget: settles every connection's count, then
    /// cuts the connections with the largest queues as slow consumers
    /// (their queued bytes dropped, counted like a per-connection cut)
    /// until the total is back under three quarters of the budget, so the
    /// next cut is a quarter of the budget away.
    ///
    /// Only a connection holding at least half its fair share, budget /
    /// (2 × connections with queued bytes), can be cut: a client whose
    /// queue is small is never the victim of others' backlog. This does
    /// not stop the cut short: while the queues hold more than three
    /// quarters of the budget, the largest holds more than their average,
    /// which is more than that share (bytes of connections already closing
    /// are not cut again; they leave this turn). The choice is
    /// [`shed_order`]'s; the scan runs only when over budget.
    fn shed(&mut self) {
        let table = &mut self.table;
        let mut total = 0;
        let mut queues = Vec::new();
        for (id, slot) in table.conns.iter_mut().enumerate() {
            let Some(c) = slot else {
                continue;
            };
            c.held_out = c.pending_out();
            total += c.held_out;
            // A connection already closing goes this turn anyway.
            if c.held_out > 0 && c.state != State::Closing {
                queues.push((c.held_out, id));
            }
        }
        table.out_bytes = total;
        let budget = self.settings.out_total_max;
        if total <= budget {
            return;
        }
        for (held, id) in shed_order(queues, total, budget) {
            let Some(Some(c)) = table.conns.get_mut(id) else {
                continue;
            };
            if c.abort() {
                table.closing.push(id);
            }
            debug_assert_eq!(c.held_out, held);
            table.out_bytes -= c.held_out;
            c.held_out = 0;
            table.stats.slow_consumers += 1;
        }
    }

    /// Drops connections that are closing, after a last flush attempt.
    fn finish_closing(&mut self, now: Instant) {
        while let Some(id) = self.table.closing.pop() {
            let Some(Some(c)) = self.table.conns.get_mut(id) else {
                continue;
            };
            let _ = c.flush();
            let Some(mut c) = self.table.conns[id].take() else {
                continue;
            };
            self.table.in_bytes = self.table.in_bytes.saturating_sub(c.held_in);
            self.table.out_bytes = self.table.out_bytes.saturating_sub(c.held_out);
            if let Some(stream) = c.stream.as_mut() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                let _ = self.poll.registry().deregister(stream);
                self.table.stats.connections_open -= 1;
            }
            self.table.free.push(id);
            self.trimmer.arm();
            self.unlink(id, &mut c, now);
            if c.session {
                self.table.stats.sessions_open -= 1;
                let Server { table, handler, .. } = self;
                handler.closed(&mut table.io(now), id);
            }
        }
    }
}

/// Which queues (bytes, connection) to cut when `total` queued bytes are
/// past `budget`: the largest first, until the total is under three
/// quarters of the budget, and none holding less than half the fair share
/// (budget / (2 × queues)). See `Server::shed`.
fn shed_order(
    mut queues: Vec<(usize, ConnId)>,
    mut total: usize,
    budget: usize,
) -> Vec<(usize, ConnId)> {
    let share = budget / (2 * queues.len().max(1));
    let target = budget / 4 * 3;
    queues.sort_unstable_by(|a, b| b.cmp(a));
    let mut cut = 0;
    for &(held, _) in &queues {
        if total <= target || held < share {
            break;
        }
        total -= held;
        cut += 1;
    }
    queues.truncate(cut);
    queues
}

/// Handles one WebSocket event of a session: Engine.IO packets go to the
/// heartbeat or the handler.
fn on_ws_event<H: Handler>(io: &mut Io<'_>, handler: &mut H, id: ConnId, ev: WsEvent<'_>) -> Flow {
    match ev {
        WsEvent::Text(text) => on_engine_text(io, handler, id, text),
        WsEvent::Binary(bytes) => {
            // Engine.IO v3 puts the packet type before a binary message.
            let bytes = if io.eio(id) == 3 {
                bytes.get(1..).unwrap_or_default()
            } else {
                bytes
            };
            handler.message(io, id, Payload::Binary(bytes))
        }
        WsEvent::Ping(data) => {
            let mut frame = Vec::with_capacity(2 + data.len());
            ws::write_header(&mut frame, ws::PONG, data.len());
            frame.extend_from_slice(data);
            io.send_reply(id, &frame);
        }
        WsEvent::Pong => {}
        WsEvent::Close => io.close(id),
    }
    if io.is_open(id) {
        Flow::Continue
    } else {
        Flow::Stop
    }
}

/// Handles one Engine.IO text packet of a session, whatever its transport:
/// messages go to the handler, pings and pongs to the heartbeat.
fn on_engine_text<H: Handler>(io: &mut Io<'_>, handler: &mut H, id: ConnId, text: &str) {
    match engineio::decode(text) {
        Ok(engineio::Packet::Message(m)) => handler.message(io, id, Payload::Text(m)),
        Ok(engineio::Packet::Pong(_)) => {
            let now = io.now();
            if let Some(c) = io.conn_mut(id) {
                if let Some(hb) = c.heartbeat.as_mut() {
                    hb.on_pong(now);
                    let at = hb.deadline();
                    io.arm_heartbeat(id, at);
                }
            }
        }
        Ok(engineio::Packet::Ping(data)) => {
            // Engine.IO v3 clients ping; the answer also resets their
            // heartbeat.
            let now = io.now();
            if let Some(c) = io.conn_mut(id) {
                if let Some(hb) = c.heartbeat.as_mut() {
                    hb.on_ping(now);
                    let at = hb.deadline();
                    io.arm_heartbeat(id, at);
                }
            }
            let mut pong = Vec::with_capacity(1 + data.len());
            pong.push(b'3');
            pong.extend_from_slice(data.as_bytes());
            io.send_engine(id, &pong);
        }
        Ok(engineio::Packet::Close) => io.close(id),
        Ok(engineio::Packet::Noop | engineio::Packet::Upgrade) => {}
        Ok(engineio::Packet::Open(_)) | Err(_) => io.close_with(id, 1002),
    }
}

#[cfg(test)]
mod tests {
    use super::shed_order;

    fn ids(cut: &[(usize, usize)]) -> Vec<usize> {
        cut.iter().map(|&(_, id)| id).collect()
    }

    #[test]
    fn the_largest_queues_go_first_until_three_quarters_of_the_budget() {
        // Budget 100: past it at 130, down to at most 75.
        let queues = vec![(10, 0), (40, 1), (5, 2), (30, 3), (45, 4)];
        let cut = shed_order(queues, 130, 100);
        assert_eq!(ids(&cut), [4, 1]);
        // 130 - 45 = 85 is still past 75; 85 - 40 = 45 is not.
    }

    #[test]
    fn a_queue_under_half_its_fair_share_is_never_cut() {
        // Budget 1000, four queues: the share is 125. The total counts 300
        // bytes of connections already closing, so it stays past 750
        // after both large queues go; the small ones stay all the same.
        let queues = vec![(400, 0), (120, 1), (124, 2), (500, 3)];
        let cut = shed_order(queues, 1444, 1000);
        assert_eq!(ids(&cut), [3, 0]);
        // Three queues: the share is 166.
        let queues = vec![(120, 1), (165, 2), (200, 3)];
        let cut = shed_order(queues, 2000, 1000);
        assert_eq!(ids(&cut), [3]);
    }

    #[test]
    fn over_budget_there_is_always_a_queue_to_cut() {
        // Many equal queues just past the budget: the average is past the
        // share, so enough go to reach three quarters.
        let queues: Vec<(usize, usize)> = (0..1000).map(|id| (11, id)).collect();
        let cut = shed_order(queues, 11_000, 10_000);
        assert_eq!(cut.len(), 319);
        assert!(11_000 - 11 * cut.len() <= 7500);
    }
}
