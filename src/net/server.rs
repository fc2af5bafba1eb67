//! The mio event loop: accepts TCP, reads HTTP heads, upgrades Engine.IO
//! WebSocket requests, decodes frames, runs the Engine.IO heartbeat and the
//! handler's timers, and flushes each connection's queued bytes once per
//! loop turn (so many deliveries leave in one write).
//!
//! Readiness is a hint (edge-triggered): sockets are read until WouldBlock or
//! a per-turn budget, and a connection that hit the budget is read again next
//! turn before the loop sleeps.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use super::conn::{
    Conn, ConnId, Io, NetStats, State, TimerEntry, BUFFER_KEEP_BYTES_MAX, LAG_GRACE,
};
use super::http::{self, Request, Response};
use super::ws::{self, Flow, WsEvent};
use super::{Handler, Payload};
use crate::protocol::engineio::{self, Beat, HandshakeError, Heartbeat, OpenInfo, Transport};

const LISTENER: Token = Token(usize::MAX);
/// The loop's waker: other threads (the fsync thread) report through it.
const WAKER: Token = Token(usize::MAX - 1);
/// Bytes read from one socket per loop turn before others get a turn.
const READ_TURN_BYTES_MAX: usize = 1 << 20;
/// The shared read buffer; partial frames are copied out of it.
const SCRATCH_BYTES: usize = 64 * 1024;
const _: () = assert!(READ_TURN_BYTES_MAX >= SCRATCH_BYTES);
/// Longest a shutdown waits for queued bytes (goodbyes) to leave.
const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(2);
/// Longest one wait for writable sockets during the drain.
const SHUTDOWN_POLL_MAX: Duration = Duration::from_millis(50);

/// Engine.IO settings the loop applies to every session.
#[derive(Debug, Clone)]
pub struct Settings {
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// Largest WebSocket message accepted (the open packet's `maxPayload`).
    pub message_bytes_max: usize,
    /// Per-connection outbound bound (`-max-pending`).
    pub out_bytes_max: usize,
    /// `Access-Control-Allow-Origin` for Engine.IO's HTTP answers.
    pub cors_origin: Option<String>,
}

pub struct Server<H: Handler> {
    poll: Poll,
    listener: TcpListener,
    handler: H,
    settings: Settings,
    shell: Shell,
    scratch: Vec<u8>,
    sid_rng: u64,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
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
}

/// The loop's own state, apart from the handler so both can be borrowed.
struct Shell {
    conns: Vec<Option<Conn>>,
    free: Vec<ConnId>,
    dirty: Vec<ConnId>,
    closing: Vec<ConnId>,
    again: Vec<ConnId>,
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
}

impl Shell {
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
        let mut handler = handler;
        handler.attach(Arc::clone(&waker));
        let shell = Shell {
            conns: Vec::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            closing: Vec::new(),
            again: Vec::new(),
            stalled: Vec::new(),
            stall_until: None,
            lagging: Vec::new(),
            pressure: false,
            stall_bytes: settings.out_bytes_max / 4,
            timers: BinaryHeap::new(),
            stats: NetStats::default(),
            serial: 0,
            out_bytes_max: settings.out_bytes_max,
        };
        Ok(Server {
            poll,
            listener,
            handler,
            settings,
            shell,
            scratch: vec![0; SCRATCH_BYTES],
            sid_rng: random_seed(),
            waker,
            stop: Arc::new(AtomicBool::new(false)),
        })
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
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(now),
                    WAKER => {
                        let Server { shell, handler, .. } = self;
                        handler.woken(&mut shell.io(now));
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
            let again = std::mem::take(&mut self.shell.again);
            for id in again {
                if !self.is_stalled(id) {
                    self.read(id, now);
                }
            }
            self.fire_timers(now);
            let Server { shell, handler, .. } = self;
            handler.tick(&mut shell.io(now));
            self.flush_dirty();
            self.finish_closing(now);
            self.resume_stalled(now);
            if self.stop.load(Ordering::Acquire) {
                return self.shutdown();
            }
        }
    }

    /// Stops accepting, lets the handler say goodbye and persist
    /// ([`Handler::shutdown`]), closes every connection and waits a bounded
    /// time for the queued bytes to leave.
    fn shutdown(&mut self) -> io::Result<()> {
        let _ = self.poll.registry().deregister(&mut self.listener);
        let now = Instant::now();
        {
            let Server { shell, handler, .. } = self;
            let mut io = shell.io(now);
            handler.shutdown(&mut io);
            for id in 0..io.conns.len() {
                io.close(id);
            }
        }
        let deadline = now + SHUTDOWN_DRAIN_MAX;
        let mut events = Events::with_capacity(256);
        loop {
            self.flush_dirty();
            let waiting: Vec<ConnId> = (0..self.shell.conns.len())
                .filter(|&id| matches!(&self.shell.conns[id], Some(c) if c.pending_out() > 0))
                .collect();
            if waiting.is_empty() {
                break;
            }
            for id in waiting {
                self.mark_dirty(id);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
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
        self.finish_closing(Instant::now());
        Ok(())
    }

    fn is_stalled(&self, id: ConnId) -> bool {
        matches!(self.shell.conns.get(id), Some(Some(c)) if c.stalled)
    }

    /// Pauses reading `id`: what it sent went to receivers that lag.
    fn stall(&mut self, id: ConnId) {
        let Some(Some(c)) = self.shell.conns.get_mut(id) else {
            return;
        };
        if !c.stalled {
            c.stalled = true;
            self.shell.stalled.push(id);
        }
    }

    /// Reads paused connections again once no receiver lags within its
    /// grace (a receiver stops lagging when its queue is back under half
    /// the stall mark, see `flush_dirty`).
    fn resume_stalled(&mut self, now: Instant) {
        let conns = &self.shell.conns;
        let mut grace_end: Option<Instant> = None;
        self.shell.lagging.retain(|&id| {
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
        self.shell.stall_until = grace_end;
        if self.shell.stalled.is_empty() || !self.shell.lagging.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.shell.stalled) {
            if let Some(Some(c)) = self.shell.conns.get_mut(id) {
                c.stalled = false;
                self.shell.again.push(id);
            }
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.shell.again.is_empty() || !self.shell.dirty.is_empty() {
            return Some(Duration::ZERO);
        }
        let stall_end = if self.shell.stalled.is_empty() {
            None
        } else {
            self.shell.stall_until
        };
        let next_timer = self.shell.timers.peek().map(|Reverse(t)| t.at);
        let next_timer = match (next_timer, stall_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next = match (next_timer, self.handler.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| at.saturating_duration_since(Instant::now()))
    }

    fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let id = self.shell.free.pop().unwrap_or_else(|| {
                        self.shell.conns.push(None);
                        self.shell.conns.len() - 1
                    });
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(id), interest)
                        .is_err()
                    {
                        self.shell.free.push(id);
                        continue;
                    }
                    self.shell.serial += 1;
                    self.shell.conns[id] = Some(Conn::new(stream, self.shell.serial));
                    self.shell.stats.connections_open += 1;
                    self.shell.stats.connections_total += 1;
                    // A connection that never sends a request head is dropped.
                    let at = now + self.settings.ping_interval + self.settings.ping_timeout;
                    self.shell.io(now).schedule(id, at);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors and the like: try again on the next event.
                Err(_) => return,
            }
        }
    }

    fn mark_dirty(&mut self, id: ConnId) {
        if let Some(Some(c)) = self.shell.conns.get_mut(id) {
            if !c.dirty {
                c.dirty = true;
                self.shell.dirty.push(id);
            }
        }
    }

    /// Reads what the socket has (up to the turn budget) and processes it.
    fn read(&mut self, id: ConnId, now: Instant) {
        self.shell.pressure = false;
        self.read_some(id, now);
        if std::mem::take(&mut self.shell.pressure) {
            self.stall(id);
        }
    }

    fn read_some(&mut self, id: ConnId, now: Instant) {
        let mut budget = READ_TURN_BYTES_MAX;
        loop {
            let Some(Some(c)) = self.shell.conns.get_mut(id) else {
                return;
            };
            if c.state == State::Closing {
                return;
            }
            match c.stream.read(&mut self.scratch) {
                Ok(0) => return self.drop_peer(id, now),
                Ok(n) => {
                    self.shell.stats.bytes_in += n as u64;
                    self.ingest(id, n, now);
                    if self.shell.pressure {
                        // Its messages went to a lagging receiver.
                        return;
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        self.shell.again.push(id);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.drop_peer(id, now),
            }
        }
    }

    /// The peer went away: its session ends without a goodbye.
    fn drop_peer(&mut self, id: ConnId, now: Instant) {
        if let Some(Some(c)) = self.shell.conns.get_mut(id) {
            if c.abort() {
                self.shell.closing.push(id);
            }
        }
        self.finish_closing(now);
    }

    fn ingest(&mut self, id: ConnId, n: usize, now: Instant) {
        let state = match self.shell.conns.get(id) {
            Some(Some(c)) => c.state,
            _ => return,
        };
        match state {
            State::Http => self.ingest_http(id, n, now),
            State::WebSocket => self.ingest_ws(id, n, now),
            State::Closing => {}
        }
    }

    fn ingest_http(&mut self, id: ConnId, n: usize, now: Instant) {
        let Some(Some(c)) = self.shell.conns.get_mut(id) else {
            return;
        };
        let room = (http::HEAD_BYTES_MAX + 1).saturating_sub(c.inbuf.len());
        c.inbuf.extend_from_slice(&self.scratch[..n.min(room)]);
        match http::parse_request(&c.inbuf) {
            Ok(None) => {}
            Ok(Some((req, used))) => {
                c.inbuf.drain(..used);
                self.shell.stats.http_requests += 1;
                self.route(id, &req, now);
            }
            Err(e) => {
                let resp = Response::text(e.status(), format!("{}\n", http::reason(e.status())));
                self.respond(id, &resp, now);
            }
        }
    }

    fn respond(&mut self, id: ConnId, resp: &Response, now: Instant) {
        self.respond_to(id, resp, false, now);
    }

    /// Queues the answer and closes after it; `head_only` leaves the body
    /// out (a HEAD request) while keeping its Content-Length.
    fn respond_to(&mut self, id: ConnId, resp: &Response, head_only: bool, now: Instant) {
        let mut bytes = resp.encode();
        if head_only {
            bytes.truncate(bytes.len() - resp.body.len());
        }
        let mut io = self.shell.io(now);
        io.send_raw(id, &bytes);
        io.close(id);
    }

    fn route(&mut self, id: ConnId, req: &Request, now: Instant) {
        let Some(endpoint) = self.handler.endpoint(&req.path) else {
            let Server { shell, handler, .. } = self;
            let resp = handler.http(&mut shell.io(now), req);
            return self.respond_to(id, &resp, req.method == "HEAD", now);
        };
        let key = self.check_engine_request(req);
        let key = match key {
            Ok(k) => k,
            Err(e) => {
                let mut resp = Response::json(400, e.body());
                if let Some(origin) = &self.settings.cors_origin {
                    resp.headers
                        .push(("Access-Control-Allow-Origin".into(), origin.clone()));
                }
                return self.respond(id, &resp, now);
            }
        };
        self.upgrade(id, endpoint, &key, now);
    }

    /// Engine.IO's checks on a request to its endpoint (WebSocket only
    /// here); the client's WebSocket key when all pass.
    fn check_engine_request(&self, req: &Request) -> Result<String, HandshakeError> {
        let hs = engineio::parse_query(&req.query, &[4])?;
        if hs.transport != Transport::WebSocket {
            return Err(HandshakeError::UnknownTransport);
        }
        if hs.sid.is_some() {
            return Err(HandshakeError::UnknownSid);
        }
        if req.method != "GET" {
            return Err(HandshakeError::BadHandshakeMethod);
        }
        let upgrade = req
            .header("Upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !upgrade
            || !req.header_has_token("Connection", "upgrade")
            || req.header("Sec-WebSocket-Version") != Some("13")
        {
            return Err(HandshakeError::BadRequest);
        }
        req.header("Sec-WebSocket-Key")
            .map(str::to_string)
            .ok_or(HandshakeError::BadRequest)
    }

    fn upgrade(&mut self, id: ConnId, endpoint: u8, key: &str, now: Instant) {
        let sid = self.next_sid();
        let open = OpenInfo {
            sid: &sid,
            upgrades: &[],
            ping_interval: self.settings.ping_interval,
            ping_timeout: self.settings.ping_timeout,
            max_payload: self.settings.message_bytes_max,
        }
        .encode();
        let Some(Some(c)) = self.shell.conns.get_mut(id) else {
            return;
        };
        c.state = State::WebSocket;
        c.endpoint = endpoint;
        c.session = true;
        c.out
            .extend_from_slice(&http::upgrade_response(&ws::accept_key(key)));
        // The 101 leaves in a write of its own, as Engine.IO servers send
        // it: some clients take the open packet only after the upgrade.
        if c.flush().is_err() {
            return self.drop_peer(id, now);
        }
        let hb = Heartbeat::new(now, self.settings.ping_interval, self.settings.ping_timeout);
        let deadline = hb.deadline();
        c.heartbeat = Some(hb);
        let leftover = !c.inbuf.is_empty();
        self.shell.stats.sessions_open += 1;
        let Server { shell, handler, .. } = self;
        let mut io = shell.io(now);
        io.send_engine(id, open.as_bytes());
        io.schedule(id, deadline);
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
            let mut v = splitmix(&mut self.sid_rng);
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
            shell,
            handler,
            scratch,
            settings,
            ..
        } = self;
        let Some(Some(c)) = shell.conns.get_mut(id) else {
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
        let mut io = shell.io(now);
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
        let Some(Some(c)) = shell.conns.get_mut(id) else {
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
        while let Some(Reverse(t)) = self.shell.timers.peek().copied() {
            if t.at > now {
                return;
            }
            self.shell.timers.pop();
            let Some(Some(c)) = self.shell.conns.get_mut(t.conn) else {
                continue;
            };
            if c.serial != t.serial || c.state == State::Closing {
                continue;
            }
            if c.state == State::Http {
                // No request head in time.
                self.shell.io(now).close(t.conn);
                continue;
            }
            let beat = c.heartbeat.as_mut().map_or(Beat::Idle, |hb| hb.poll(now));
            let next = c.heartbeat.as_ref().map(Heartbeat::deadline);
            let app_due = c.app_deadline.is_some_and(|d| d <= now);
            if app_due {
                c.app_deadline = None;
            }
            let Server { shell, handler, .. } = self;
            let mut io = shell.io(now);
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
            if beat == Beat::SendPing {
                if let Some(at) = next {
                    io.schedule(t.conn, at);
                }
            }
            if app_due {
                handler.timer(&mut io, t.conn);
            }
        }
    }

    fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.shell.dirty);
        for &id in &dirty {
            let Some(Some(c)) = self.shell.conns.get_mut(id) else {
                continue;
            };
            c.dirty = false;
            match c.flush() {
                Ok(written) => {
                    self.shell.stats.bytes_out += written as u64;
                    if c.lag_since.is_some() && c.pending_out() <= self.shell.stall_bytes / 2 {
                        c.lag_since = None;
                    }
                }
                Err(_) => {
                    if c.abort() {
                        self.shell.closing.push(id);
                    }
                }
            }
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.shell.dirty.is_empty() {
            self.shell.dirty = dirty;
        }
    }

    /// Drops connections that are closing, after a last flush attempt.
    fn finish_closing(&mut self, now: Instant) {
        while let Some(id) = self.shell.closing.pop() {
            let Some(Some(c)) = self.shell.conns.get_mut(id) else {
                continue;
            };
            let _ = c.flush();
            let Some(mut c) = self.shell.conns[id].take() else {
                continue;
            };
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.shell.free.push(id);
            self.shell.stats.connections_open -= 1;
            if c.session {
                self.shell.stats.sessions_open -= 1;
                let Server { shell, handler, .. } = self;
                handler.closed(&mut shell.io(now), id);
            }
        }
    }
}

/// Handles one WebSocket event of a session: Engine.IO packets go to the
/// heartbeat or the handler.
fn on_ws_event<H: Handler>(io: &mut Io<'_>, handler: &mut H, id: ConnId, ev: WsEvent<'_>) -> Flow {
    match ev {
        WsEvent::Text(text) => match engineio::decode(text) {
            Ok(engineio::Packet::Message(m)) => handler.message(io, id, Payload::Text(m)),
            Ok(engineio::Packet::Pong(_)) => {
                let now = io.now();
                if let Some(c) = io.conn_mut(id) {
                    if let Some(hb) = c.heartbeat.as_mut() {
                        hb.on_pong(now);
                        let at = hb.deadline();
                        io.schedule(id, at);
                    }
                }
            }
            Ok(engineio::Packet::Ping(data)) => {
                let mut pong = Vec::with_capacity(1 + data.len());
                pong.push(b'3');
                pong.extend_from_slice(data.as_bytes());
                io.send_engine(id, &pong);
            }
            Ok(engineio::Packet::Close) => io.close(id),
            Ok(engineio::Packet::Noop | engineio::Packet::Upgrade) => {}
            Ok(engineio::Packet::Open(_)) | Err(_) => io.close_with(id, 1002),
        },
        WsEvent::Binary(bytes) => handler.message(io, id, Payload::Binary(bytes)),
        WsEvent::Ping(data) => {
            let mut frame = Vec::with_capacity(2 + data.len());
            ws::write_header(&mut frame, ws::PONG, data.len());
            frame.extend_from_slice(data);
            io.send_raw(id, &frame);
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

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed from the kernel's random source, else from the clock and pid.
pub fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ ((std::process::id() as u64) << 32)
}
