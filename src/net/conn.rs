//! One connection's state and buffers, and [`Io`]: the loop's
//! [`Sink`], through which a handler queues Engine.IO packets onto
//! connections. Every connection
//! writes through a bounded outbound buffer; past the bound it is closed as
//! a slow consumer, so a client that stops reading cannot grow memory.
//!
//! A slot is a TCP connection (HTTP, WebSocket, or a WebSocket probing an
//! upgrade) or a long-polling session, which has no socket of its own: its
//! outbound buffer holds the queued payload until a GET takes it. A handler
//! sees one [`ConnId`] per Engine.IO session whatever its transport; an
//! upgrade moves the probe's socket into the session's slot.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;

use super::polling::{self, Polling};
use super::ws;
use crate::protocol::engineio::Heartbeat;
use tungstenite::protocol::frame::coding::OpCode;

use crate::port::Sink;
pub use crate::port::{ConnId, NetStats, Shared};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Reading an HTTP request head.
    Http,
    /// An Engine.IO session over WebSocket.
    WebSocket,
    /// An Engine.IO session over HTTP long-polling (no socket).
    Polling,
    /// A WebSocket probing the upgrade of the polling session it links to.
    Probe,
    /// Done: flush what is queued, then drop.
    Closing,
}

/// An outbound buffer this large is released once it empties and the
/// connection is no longer busy (see [`KeptBuffers`]), so idle
/// connections hold no memory.
pub const BUFFER_KEEP_BYTES_MAX: usize = 64 * 1024;

/// How long an emptied outbound buffer over [`BUFFER_KEEP_BYTES_MAX`] is
/// kept after the connection last wrote much from it.
pub const BUSY_KEEP: std::time::Duration = std::time::Duration::from_millis(250);

/// A full write of more than this many owned bytes marks the connection
/// busy: its large buffer is kept for the next burst.
const BUSY_BYTES_MIN: usize = BUFFER_KEEP_BYTES_MAX / 4;

/// Slices handed to one `writev` at most (Linux's `IOV_MAX` is 1024).
const IOVECS_MAX: usize = 512;

/// A shared piece queued at byte `at` of a connection's owned bytes
/// (before whatever was queued after it); `pos` bytes of it are written.
pub struct Splice {
    at: usize,
    pos: usize,
    bytes: Shared,
}

/// The shared pieces of one connection's queue, in order, and their bytes
/// not yet written.
#[derive(Default)]
pub struct Splices {
    list: Vec<Splice>,
    bytes: usize,
}

/// How long a lagging receiver may pause the connections that write to it.
pub const LAG_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Conn {
    /// `None` for a long-polling session.
    pub stream: Option<TcpStream>,
    pub state: State,
    /// Bytes of an incomplete HTTP head or WebSocket frame.
    pub inbuf: Vec<u8>,
    /// Queued outbound bytes; `out[out_pos..]` is not yet written.
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// Shared pieces queued between the owned bytes (WebSocket sessions
    /// only: a polling payload is one owned body); boxed, and dropped once
    /// written, so a connection that holds none pays one pointer.
    shared: Option<Box<Splices>>,
    pub dirty: bool,
    pub decoder: ws::Decoder,
    pub heartbeat: Option<Heartbeat>,
    /// When the earliest heartbeat timer in the heap fires: a deadline that
    /// moves later is not pushed again (a flood of pongs would fill the heap
    /// with one entry each) but re-armed when that timer fires.
    pub beat_at: Option<Instant>,
    pub app_deadline: Option<Instant>,
    /// Unique per connection ever accepted, so stale timers are ignored.
    pub serial: u64,
    pub endpoint: u8,
    /// Whether `Handler::opened` was called (so `closed` is owed).
    pub session: bool,
    /// Since when its outbound bytes are past the stall mark (it is then
    /// listed in `Io::lagging`); cleared once it drains to half the mark.
    pub lag_since: Option<Instant>,
    /// Reading from it is paused until lagging receivers catch up.
    pub stalled: bool,
    /// Engine.IO version of the session (4, or 3 for legacy clients).
    pub eio: u8,
    /// The handshake query's `token` (still percent-encoded), kept for an
    /// Engine.IO v3 session only: such a client joins `/` without a
    /// CONNECT payload, so this is its only way to name its user.
    pub legacy_token: Option<Box<str>>,
    /// A long-polling session's transport state.
    pub polling: Option<Box<Polling>>,
    /// The Engine.IO sid of a session that began on polling (the key an
    /// upgrade and later requests find it by).
    pub sid: Option<Box<str>>,
    /// HTTP: the polling session whose GET this connection holds; probe:
    /// the session it would upgrade. With that slot's serial.
    pub link: Option<(ConnId, u64)>,
    /// HTTP: a request whose body is still arriving, and the body's length.
    pub body_wait: Option<Box<(super::http::Request, usize)>>,
    /// HTTP: whether the request being answered keeps the connection.
    pub keep_alive: bool,
    /// HTTP: the request's `Origin`, for CORS answers.
    pub origin: Option<Box<str>>,
    /// HTTP: when an idle connection (no request under way) is dropped.
    pub idle_until: Option<Instant>,
    /// Input bytes held (partial request or frame, fragments) as last
    /// counted in the loop's total.
    pub held_in: usize,
    /// Outbound bytes as counted in the loop's total: raised with each
    /// frame queued, set to `pending_out()` when the loop settles the
    /// count (after a flush, when over budget), taken off when it goes.
    pub held_out: usize,
    /// A write emptied a large `out` of many bytes since [`KeptBuffers`]
    /// last looked: the buffer is kept.
    out_busy: bool,
    /// Listed in [`KeptBuffers`].
    out_listed: bool,
}

impl Conn {
    pub fn new(stream: TcpStream, serial: u64) -> Conn {
        Conn {
            stream: Some(stream),
            ..Conn::slot(serial)
        }
    }

    /// A fresh HTTP-state slot with no socket: what both constructors
    /// start from.
    fn slot(serial: u64) -> Conn {
        Conn {
            stream: None,
            state: State::Http,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            shared: None,
            dirty: false,
            decoder: ws::Decoder::default(),
            heartbeat: None,
            beat_at: None,
            app_deadline: None,
            serial,
            endpoint: 0,
            session: false,
            lag_since: None,
            stalled: false,
            eio: 4,
            legacy_token: None,
            polling: None,
            sid: None,
            link: None,
            body_wait: None,
            keep_alive: false,
            origin: None,
            idle_until: None,
            held_in: 0,
            held_out: 0,
            out_busy: false,
            out_listed: false,
        }
    }

    /// A long-polling session's slot.
    pub fn polling_session(serial: u64, eio: u8, sid: &str) -> Conn {
        Conn {
            stream: None,
            state: State::Polling,
            eio,
            polling: Some(Box::new(Polling {
                eio,
                ..Polling::default()
            })),
            sid: Some(sid.into()),
            ..Conn::slot(serial)
        }
    }

    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos + self.shared.as_ref().map_or(0, |q| q.bytes)
    }

    /// Queues `bytes` by reference after what is queued so far.
    fn push_shared(&mut self, bytes: &Shared) {
        let at = self.out.len();
        let q = self.shared.get_or_insert_with(Box::default);
        q.bytes += bytes.len();
        q.list.push(Splice {
            at,
            pos: 0,
            bytes: Arc::clone(bytes),
        });
    }

    /// Drops what is queued and marks the connection closing; true if it
    /// was not closing already (the caller then lists it for closing).
    pub fn abort(&mut self) -> bool {
        self.out = Vec::new();
        self.out_pos = 0;
        self.shared = None;
        let was_open = self.state != State::Closing;
        self.state = State::Closing;
        was_open
    }

    /// Writes queued bytes until done or WouldBlock; returns bytes written.
    pub fn flush(&mut self) -> std::io::Result<usize> {
        let Some(mut stream) = self.stream.take() else {
            return Ok(0);
        };
        let result = self.write_queued(&mut stream);
        self.stream = Some(stream);
        result
    }

    /// [`Conn::flush`] to any writer: owned bytes with `write`, shared
    /// pieces between them gathered into one `write_vectored`.
    fn write_queued(&mut self, stream: &mut impl std::io::Write) -> std::io::Result<usize> {
        let mut none = Splices::default();
        let mut boxed = self.shared.take();
        let result = self.write_with(stream, boxed.as_deref_mut().unwrap_or(&mut none));
        self.shared = boxed.filter(|q| !q.list.is_empty());
        result
    }

    /// The loop of [`Conn::write_queued`], with the splices taken out.
    fn write_with(
        &mut self,
        stream: &mut impl std::io::Write,
        q: &mut Splices,
    ) -> std::io::Result<usize> {
        let mut written = 0;
        // Splices before `next` are written.
        let mut next = 0;
        let mut result = Ok(());
        while self.out_pos < self.out.len() || next < q.list.len() {
            let wrote = if next == q.list.len() {
                stream.write(&self.out[self.out_pos..])
            } else {
                let mut iov = [IoSlice::new(&[]); IOVECS_MAX];
                let n = gather(&self.out, self.out_pos, &q.list[next..], &mut iov);
                stream.write_vectored(&iov[..n])
            };
            match wrote {
                Ok(0) => {
                    result = Err(std::io::ErrorKind::WriteZero.into());
                    break;
                }
                Ok(n) => {
                    next += self.advance(q, next, n);
                    written += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        q.list.drain(..next);
        if self.out_pos == self.out.len() && q.list.is_empty() {
            // A large buffer goes at once unless the connection is busy
            // (this write was large) or was lately: growing it again by
            // doubling for every burst costs a `realloc` and a copy per
            // step. [`KeptBuffers`] releases it once the bursts stop.
            let busy = self.out.len() > BUSY_BYTES_MIN;
            self.out_pos = 0;
            if self.out.capacity() > BUFFER_KEEP_BYTES_MAX && !busy && !self.out_listed {
                self.out = Vec::new();
            } else {
                self.out_busy |= busy && self.out.capacity() > BUFFER_KEEP_BYTES_MAX;
                self.out.clear();
            }
        } else if self.out_pos > self.out.len() / 2 {
            self.out.drain(..self.out_pos);
            for s in &mut q.list {
                s.at -= self.out_pos;
            }
            self.out_pos = 0;
        }
        result.map(|()| written)
    }

    /// Marks `n` more bytes written, from `out_pos` and splice `next` on;
    /// returns how many splices that finished.
    fn advance(&mut self, q: &mut Splices, next: usize, mut n: usize) -> usize {
        let mut done = 0;
        loop {
            let splice = q.list.get_mut(next + done);
            let owned_end = splice.as_ref().map_or(self.out.len(), |s| s.at);
            let owned = owned_end - self.out_pos;
            if n <= owned {
                self.out_pos += n;
                return done;
            }
            n -= owned;
            self.out_pos = owned_end;
            let Some(s) = splice else {
                return done;
            };
            let left = s.bytes.len() - s.pos;
            if n < left {
                s.pos += n;
                q.bytes -= n;
                return done;
            }
            n -= left;
            q.bytes -= left;
            s.pos = s.bytes.len();
            done += 1;
        }
    }
}

/// The connections that keep an emptied outbound buffer over
/// [`BUFFER_KEEP_BYTES_MAX`] because they are busy. Every [`BUSY_KEEP`]
/// the loop looks at them: a buffer whose connection wrote no large batch
/// since the last look is released (or, if bytes are still queued in it,
/// left to go at its next full write). A buffer is thus kept at most
/// [`BUSY_KEEP`] to twice that after the bursts stop, and never more than
/// its connection held queued at once.
#[derive(Default)]
pub struct KeptBuffers {
    /// Slot and serial of each listed connection.
    list: Vec<(ConnId, u64)>,
    next_look: Option<Instant>,
}

impl KeptBuffers {
    /// After connection `id` was written: lists it if it now keeps a large
    /// buffer.
    pub fn note(&mut self, id: ConnId, c: &mut Conn, now: Instant) {
        if c.out_busy && !c.out_listed {
            c.out_listed = true;
            self.list.push((id, c.serial));
            self.next_look.get_or_insert(now + BUSY_KEEP);
        }
    }

    /// When the loop should wake for the next look, if any is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_look
    }

    /// Once per loop turn: the look, when it is due.
    pub fn turn(&mut self, conns: &mut [Option<Conn>], now: Instant) {
        if self.next_look.is_none_or(|at| now < at) {
            return;
        }
        self.list.retain(|&(id, serial)| {
            let Some(Some(c)) = conns.get_mut(id) else {
                return false;
            };
            if c.serial != serial {
                return false;
            }
            if std::mem::take(&mut c.out_busy) {
                return true;
            }
            c.out_listed = false;
            if c.pending_out() == 0 {
                c.out = Vec::new();
                c.out_pos = 0;
            }
            false
        });
        self.next_look = (!self.list.is_empty()).then_some(now + BUSY_KEEP);
    }

    /// How many connections keep a large buffer.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Fills `iov` with what is queued from `out_pos` on, owned bytes and
/// splices in order; returns the slices used.
fn gather<'a>(
    out: &'a [u8],
    mut out_pos: usize,
    shared: &'a [Splice],
    iov: &mut [IoSlice<'a>],
) -> usize {
    let mut n = 0;
    for s in shared {
        if n + 2 > iov.len() {
            return n;
        }
        if s.at > out_pos {
            iov[n] = IoSlice::new(&out[out_pos..s.at]);
            n += 1;
            out_pos = s.at;
        }
        iov[n] = IoSlice::new(&s.bytes[s.pos..]);
        n += 1;
    }
    if out_pos < out.len() && n < iov.len() {
        iov[n] = IoSlice::new(&out[out_pos..]);
        n += 1;
    }
    n
}

/// A deadline in the loop's timer heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerEntry {
    pub at: Instant,
    pub conn: ConnId,
    pub serial: u64,
}

/// The loop's state a handler may touch during a call.
pub struct Io<'a> {
    pub(crate) conns: &'a mut Vec<Option<Conn>>,
    pub(crate) dirty: &'a mut Vec<ConnId>,
    pub(crate) closing: &'a mut Vec<ConnId>,
    pub(crate) timers: &'a mut std::collections::BinaryHeap<std::cmp::Reverse<TimerEntry>>,
    pub(crate) stats: &'a mut NetStats,
    pub(crate) now: Instant,
    pub(crate) out_bytes_max: usize,
    /// Connections whose outbound bytes passed `stall_bytes`.
    pub(crate) lagging: &'a mut Vec<ConnId>,
    /// Set when a write lands in a lagging connection: the connection
    /// being read is then paused (backpressure on the publisher).
    pub(crate) pressure: &'a mut bool,
    pub(crate) stall_bytes: usize,
    /// Outbound bytes queued across connections (the sum of `held_out`).
    pub(crate) out_bytes: &'a mut usize,
}

impl Io<'_> {
    /// The time of this loop turn.
    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn stats(&self) -> &NetStats {
        self.stats
    }

    /// Whether `conn` is an open Engine.IO session.
    pub fn is_open(&self, conn: ConnId) -> bool {
        matches!(self.conns.get(conn), Some(Some(c)) if matches!(c.state, State::WebSocket | State::Polling))
    }

    /// The Engine.IO version `conn` speaks (3 for legacy clients, else 4).
    pub fn eio(&self, conn: ConnId) -> u8 {
        match self.conns.get(conn) {
            Some(Some(c)) => c.eio,
            _ => 4,
        }
    }

    /// The handshake query's `token` of an Engine.IO v3 session (still
    /// percent-encoded); `None` for v4 sessions.
    pub fn legacy_token(&self, conn: ConnId) -> Option<&str> {
        match self.conns.get(conn) {
            Some(Some(c)) => c.legacy_token.as_deref(),
            _ => None,
        }
    }

    /// Queues an Engine.IO message packet (`4` + the parts) as one text frame.
    pub fn send_text(&mut self, conn: ConnId, parts: &[&[u8]]) -> bool {
        self.queue_frame(conn, ws::TEXT, b"4", parts)
    }

    /// Queues an Engine.IO message packet (`4` + `parts` + `shared`) as one
    /// text frame, holding `shared` by reference on a WebSocket (a polling
    /// payload copies it). Counted and bounded exactly as [`Io::send_text`].
    pub fn send_text_shared(&mut self, conn: ConnId, parts: &[&[u8]], shared: &Shared) -> bool {
        let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>() + shared.len();
        let Some(c) = self.writable(conn, len + 10) else {
            return false;
        };
        let before = c.pending_out();
        if c.state == State::Polling {
            polling::push_text(&mut c.out, c.eio, b"4", &[parts, &[&shared[..]]].concat());
        } else {
            ws::write_header(&mut c.out, ws::TEXT, len);
            c.out.push(b'4');
            for p in parts {
                c.out.extend_from_slice(p);
            }
            c.push_shared(shared);
        }
        let added = c.pending_out() - before;
        c.held_out += added;
        *self.out_bytes += added;
        self.mark_dirty(conn);
        true
    }

    /// Queues a binary Engine.IO message (a Socket.IO attachment).
    pub fn send_binary(&mut self, conn: ConnId, bytes: &[u8]) -> bool {
        self.queue_frame(conn, ws::BINARY, b"", &[bytes])
    }

    /// Queues a raw Engine.IO packet (e.g. `2` ping) as a text frame.
    pub(crate) fn send_engine(&mut self, conn: ConnId, packet: &[u8]) -> bool {
        self.queue_frame(conn, ws::TEXT, b"", &[packet])
    }

    /// One WebSocket frame of `prefix` and `parts`, within the bound. The
    /// bytes it adds are counted into the loop's outbound total (an add;
    /// the loop settles the count after each flush).
    fn queue_frame(
        &mut self,
        conn: ConnId,
        opcode: OpCode,
        prefix: &[u8],
        parts: &[&[u8]],
    ) -> bool {
        let len = prefix.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let Some(c) = self.writable(conn, len + 10) else {
            return false;
        };
        let before = c.out.len();
        if c.state == State::Polling {
            if opcode == ws::BINARY {
                polling::push_binary(&mut c.out, c.eio, parts[0]);
            } else {
                polling::push_text(&mut c.out, c.eio, prefix, parts);
            }
        } else if opcode == ws::BINARY && c.eio == 3 {
            // Engine.IO v3 frames a binary message with its packet type.
            c.out.reserve(len + 11);
            ws::write_header(&mut c.out, opcode, len + 1);
            c.out.push(4);
            c.out.extend_from_slice(parts[0]);
        } else {
            c.out.reserve(len + 10);
            ws::write_header(&mut c.out, opcode, len);
            c.out.extend_from_slice(prefix);
            for p in parts {
                c.out.extend_from_slice(p);
            }
        }
        let added = c.out.len() - before;
        c.held_out += added;
        *self.out_bytes += added;
        self.mark_dirty(conn);
        true
    }

    /// Queues bytes outside the bound (HTTP answers, control frames).
    pub(crate) fn send_raw(&mut self, conn: ConnId, bytes: &[u8]) {
        if let Some(Some(c)) = self.conns.get_mut(conn) {
            c.out.extend_from_slice(bytes);
            self.mark_dirty(conn);
        }
    }

    /// Queues a control frame a client's own frame asks for (a pong, a
    /// probe's answer) within the outbound bound: a client that keeps
    /// asking and never reads is closed as a slow consumer.
    pub(crate) fn send_reply(&mut self, conn: ConnId, bytes: &[u8]) {
        let bound = self.out_bytes_max;
        let Some(Some(c)) = self.conns.get_mut(conn) else {
            return;
        };
        if c.state == State::Closing {
            return;
        }
        if c.pending_out() + bytes.len() > bound {
            if c.abort() {
                self.closing.push(conn);
            }
            self.stats.slow_consumers += 1;
            return;
        }
        c.out.extend_from_slice(bytes);
        self.mark_dirty(conn);
    }

    /// The connection if it can take `extra` more bytes; past the bound it
    /// is closed as a slow consumer and its queued bytes are dropped.
    fn writable(&mut self, conn: ConnId, extra: usize) -> Option<&mut Conn> {
        let bound = self.out_bytes_max;
        let c = self.conns.get_mut(conn)?.as_mut()?;
        if !matches!(c.state, State::WebSocket | State::Polling) {
            return None;
        }
        let pending = c.pending_out() + extra;
        if pending > bound {
            if c.abort() {
                self.closing.push(conn);
            }
            self.stats.slow_consumers += 1;
            return None;
        }
        if pending > self.stall_bytes {
            match c.lag_since {
                None => {
                    c.lag_since = Some(self.now);
                    self.lagging.push(conn);
                    *self.pressure = true;
                }
                // Past the grace a receiver no longer holds publishers
                // back: it catches up or ends as a slow consumer.
                Some(since) if self.now < since + LAG_GRACE => *self.pressure = true,
                Some(_) => {}
            }
        }
        self.conns.get_mut(conn)?.as_mut()
    }

    fn mark_dirty(&mut self, conn: ConnId) {
        if let Some(Some(c)) = self.conns.get_mut(conn) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(conn);
            }
        }
    }

    /// Closes `conn` after what is queued (a WebSocket close frame first).
    pub fn close(&mut self, conn: ConnId) {
        self.close_with(conn, 1000);
    }

    pub(crate) fn close_with(&mut self, conn: ConnId, code: u16) {
        let Some(Some(c)) = self.conns.get_mut(conn) else {
            return;
        };
        if c.state == State::Closing {
            return;
        }
        if c.state == State::WebSocket {
            ws::write_close(&mut c.out, code);
        } else if c.state == State::Polling {
            // The held GET (if any) takes the close packet.
            polling::push_text(&mut c.out, c.eio, b"1", &[]);
        }
        c.state = State::Closing;
        self.closing.push(conn);
        self.mark_dirty(conn);
    }

    /// Sets (or clears) the handler's deadline for `conn`.
    pub fn set_timer(&mut self, conn: ConnId, at: Option<Instant>) {
        let Some(Some(c)) = self.conns.get_mut(conn) else {
            return;
        };
        c.app_deadline = at;
        if let Some(at) = at {
            self.timers.push(std::cmp::Reverse(TimerEntry {
                at,
                conn,
                serial: c.serial,
            }));
        }
    }

    pub(crate) fn conn_mut(&mut self, conn: ConnId) -> Option<&mut Conn> {
        self.conns.get_mut(conn)?.as_mut()
    }

    /// Arms the heartbeat timer of `conn` for `at`, unless one that fires
    /// no later is in the heap already (it re-arms for the later deadline
    /// when it fires).
    pub(crate) fn arm_heartbeat(&mut self, conn: ConnId, at: Instant) {
        let Some(Some(c)) = self.conns.get_mut(conn) else {
            return;
        };
        if c.beat_at.is_some_and(|armed| armed <= at) {
            return;
        }
        c.beat_at = Some(at);
        self.schedule(conn, at);
    }

    pub(crate) fn schedule(&mut self, conn: ConnId, at: Instant) {
        if let Some(Some(c)) = self.conns.get(conn) {
            self.timers.push(std::cmp::Reverse(TimerEntry {
                at,
                conn,
                serial: c.serial,
            }));
        }
    }
}

/// The loop's sink: a handler's actions go straight into the connections'
/// outbound buffers.
impl Sink for Io<'_> {
    fn now(&self) -> Instant {
        Io::now(self)
    }

    fn stats(&self) -> &NetStats {
        Io::stats(self)
    }

    fn is_open(&self, conn: ConnId) -> bool {
        Io::is_open(self, conn)
    }

    fn eio(&self, conn: ConnId) -> u8 {
        Io::eio(self, conn)
    }

    fn legacy_token(&self, conn: ConnId) -> Option<&str> {
        Io::legacy_token(self, conn)
    }

    #[inline]
    fn send_text(&mut self, conn: ConnId, parts: &[&[u8]]) -> bool {
        Io::send_text(self, conn, parts)
    }

    #[inline]
    fn send_text_shared(&mut self, conn: ConnId, parts: &[&[u8]], shared: &Shared) -> bool {
        Io::send_text_shared(self, conn, parts, shared)
    }

    fn send_binary(&mut self, conn: ConnId, bytes: &[u8]) -> bool {
        Io::send_binary(self, conn, bytes)
    }

    fn close(&mut self, conn: ConnId) {
        Io::close(self, conn)
    }

    fn set_timer(&mut self, conn: ConnId, at: Option<Instant>) {
        Io::set_timer(self, conn, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that takes at most `chunk` bytes per call and refuses
    /// every third call with WouldBlock.
    struct Trickle {
        got: Vec<u8>,
        chunk: usize,
        calls: usize,
    }

    impl std::io::Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let mut left = self.chunk;
            for b in bufs {
                let n = b.len().min(left);
                self.got.extend_from_slice(&b[..n]);
                left -= n;
            }
            Ok(self.chunk - left)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Queues owned and shared pieces as `plan` says (`true`: the shared
    /// piece); returns the bytes expected on the wire.
    fn queue(c: &mut Conn, plan: &[bool], shared: &Shared) -> Vec<u8> {
        let mut expect = Vec::new();
        for (i, &is_shared) in plan.iter().enumerate() {
            if is_shared {
                c.push_shared(shared);
                expect.extend_from_slice(shared);
            } else {
                let owned = format!("<{i}>");
                c.out.extend_from_slice(owned.as_bytes());
                expect.extend_from_slice(owned.as_bytes());
            }
        }
        expect
    }

    #[test]
    fn shared_pieces_go_out_in_order_whatever_the_partial_writes() {
        let shared: Shared = Arc::from(&b"SHARED-PIECE"[..]);
        let plans: [&[bool]; 5] = [
            &[false, true, true, false, true],
            &[true, true, true],
            &[true, false],
            &[false, false, true, false],
            &[true, false, true, false, true, false],
        ];
        for plan in plans {
            for chunk in 1..=20 {
                let mut c = Conn::slot(1);
                let expect = queue(&mut c, plan, &shared);
                assert_eq!(c.pending_out(), expect.len());
                let mut w = Trickle {
                    got: Vec::new(),
                    chunk,
                    calls: 0,
                };
                let mut rounds = 0;
                while c.pending_out() > 0 {
                    let before = c.pending_out();
                    let n = c.write_queued(&mut w).unwrap();
                    assert_eq!(before - c.pending_out(), n);
                    rounds += 1;
                    assert!(rounds < 1000, "no progress: {plan:?} chunk {chunk}");
                }
                assert_eq!(w.got, expect, "{plan:?} chunk {chunk}");
                assert!(c.shared.is_none() && c.out.is_empty() && c.out_pos == 0);
            }
        }
    }

    #[test]
    fn queueing_after_a_partial_write_keeps_the_order() {
        let shared: Shared = Arc::from(&b"0123456789"[..]);
        let mut c = Conn::slot(1);
        let mut expect = queue(&mut c, &[false, true, false, true], &shared);
        let mut w = Trickle {
            got: Vec::new(),
            chunk: 7,
            calls: 0,
        };
        c.write_queued(&mut w).unwrap();
        assert!(c.pending_out() > 0);
        // More bytes arrive while the rest waits (after a compaction).
        expect.extend(queue(&mut c, &[true, false, true], &shared));
        while c.pending_out() > 0 {
            c.write_queued(&mut w).unwrap();
        }
        assert_eq!(w.got, expect);
    }

    #[test]
    fn abort_drops_shared_pieces_too() {
        let shared: Shared = Arc::from(&b"abc"[..]);
        let mut c = Conn::slot(1);
        queue(&mut c, &[false, true], &shared);
        assert_eq!(Arc::strong_count(&shared), 2);
        c.abort();
        assert_eq!(c.pending_out(), 0);
        assert_eq!(Arc::strong_count(&shared), 1);
    }

    /// Writes everything queued on `c` (all of it is taken at once).
    fn write_all(c: &mut Conn) {
        let mut w = Trickle {
            got: Vec::new(),
            chunk: usize::MAX,
            calls: 1,
        };
        while c.pending_out() > 0 {
            c.write_queued(&mut w).unwrap();
        }
    }

    #[test]
    fn a_busy_connection_keeps_its_large_buffer_until_it_goes_quiet() {
        let t0 = Instant::now();
        let mut conns = vec![Some(Conn::slot(7))];
        let mut kept = KeptBuffers::default();
        let c = conns[0].as_mut().unwrap();
        // One large batch written: the buffer stays for the next.
        c.out.extend_from_slice(&[1; 200_000]);
        let cap = c.out.capacity();
        write_all(c);
        kept.note(0, c, t0);
        assert_eq!((c.out.capacity(), kept.len()), (cap, 1));
        // Busy since the last look: kept through it.
        c.out.extend_from_slice(&[2; 100_000]);
        write_all(c);
        kept.note(0, c, t0);
        assert_eq!(kept.len(), 1, "listed once");
        kept.turn(&mut conns, t0 + BUSY_KEEP / 2);
        assert_eq!(
            conns[0].as_ref().unwrap().out.capacity(),
            cap,
            "not due yet"
        );
        kept.turn(&mut conns, t0 + BUSY_KEEP);
        assert_eq!(conns[0].as_ref().unwrap().out.capacity(), cap);
        // A small write since: the next look releases it.
        let c = conns[0].as_mut().unwrap();
        c.out.extend_from_slice(b"2");
        write_all(c);
        kept.note(0, c, t0 + BUSY_KEEP);
        assert_eq!(c.out.capacity(), cap, "kept until the look");
        let next = kept.next_deadline().unwrap();
        assert_eq!(next, t0 + 2 * BUSY_KEEP);
        kept.turn(&mut conns, next);
        assert_eq!(conns[0].as_ref().unwrap().out.capacity(), 0);
        assert!(kept.is_empty() && kept.next_deadline().is_none());
        // Not listed any more: a small write empties a large buffer at once.
        let c = conns[0].as_mut().unwrap();
        c.out.reserve(200_000);
        c.out.extend_from_slice(b"3");
        write_all(c);
        assert_eq!(c.out.capacity(), 0);
    }

    #[test]
    fn a_kept_buffer_of_a_closed_or_replaced_connection_is_forgotten() {
        let t0 = Instant::now();
        let mut conns = vec![Some(Conn::slot(7)), Some(Conn::slot(8))];
        let mut kept = KeptBuffers::default();
        for (id, slot) in conns.iter_mut().enumerate() {
            let c = slot.as_mut().unwrap();
            c.out.extend_from_slice(&[1; 200_000]);
            write_all(c);
            kept.note(id, c, t0);
        }
        assert_eq!(kept.len(), 2);
        conns[0] = None;
        conns[1] = Some(Conn::slot(9));
        kept.turn(&mut conns, t0 + BUSY_KEEP);
        assert!(kept.is_empty());
    }

    #[test]
    fn a_kept_buffer_with_bytes_still_queued_is_left_to_its_next_write() {
        let t0 = Instant::now();
        let mut conns = vec![Some(Conn::slot(7))];
        let mut kept = KeptBuffers::default();
        let c = conns[0].as_mut().unwrap();
        c.out.extend_from_slice(&[1; 200_000]);
        write_all(c);
        kept.note(0, c, t0);
        kept.turn(&mut conns, t0 + BUSY_KEEP);
        // Bytes queued, not written, when the quiet look comes.
        let c = conns[0].as_mut().unwrap();
        c.out.extend_from_slice(b"abc");
        kept.turn(&mut conns, t0 + 2 * BUSY_KEEP);
        let c = conns[0].as_mut().unwrap();
        assert_eq!(c.pending_out(), 3, "queued bytes stay");
        assert!(kept.is_empty());
        write_all(c);
        assert_eq!(c.out.capacity(), 0, "released by the write that empties it");
    }
}
