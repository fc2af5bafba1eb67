//! One connection's state and buffers, and [`Io`]: the handle through which
//! a handler queues Engine.IO packets onto connections. Every connection
//! writes through a bounded outbound buffer; past the bound it is closed as
//! a slow consumer, so a client that stops reading cannot grow memory.

use std::io::Write as _;
use std::time::Instant;

use mio::net::TcpStream;

use super::ws;
use crate::protocol::engineio::Heartbeat;
use tungstenite::protocol::frame::coding::OpCode;

/// Index of a connection in the loop's slab.
pub type ConnId = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Reading an HTTP request head.
    Http,
    /// An Engine.IO session over WebSocket.
    WebSocket,
    /// Done: flush what is queued, then drop.
    Closing,
}

/// A buffer this large is released when it empties, so idle connections
/// hold no memory.
pub const BUFFER_KEEP_BYTES_MAX: usize = 64 * 1024;

/// How long a lagging receiver may pause the connections that write to it.
pub const LAG_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Counters the loop keeps; the handler reports them in metrics.
#[derive(Debug, Default, Clone)]
pub struct NetStats {
    pub connections_open: u64,
    pub connections_total: u64,
    pub sessions_open: u64,
    pub slow_consumers: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub http_requests: u64,
}

pub struct Conn {
    pub stream: TcpStream,
    pub state: State,
    /// Bytes of an incomplete HTTP head or WebSocket frame.
    pub inbuf: Vec<u8>,
    /// Queued outbound bytes; `out[out_pos..]` is not yet written.
    pub out: Vec<u8>,
    pub out_pos: usize,
    pub dirty: bool,
    pub decoder: ws::Decoder,
    pub heartbeat: Option<Heartbeat>,
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
}

impl Conn {
    pub fn new(stream: TcpStream, serial: u64) -> Conn {
        Conn {
            stream,
            state: State::Http,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            dirty: false,
            decoder: ws::Decoder::default(),
            heartbeat: None,
            app_deadline: None,
            serial,
            endpoint: 0,
            session: false,
            lag_since: None,
            stalled: false,
        }
    }

    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Drops what is queued and marks the connection closing; true if it
    /// was not closing already (the caller then lists it for closing).
    pub fn abort(&mut self) -> bool {
        self.out = Vec::new();
        self.out_pos = 0;
        let was_open = self.state != State::Closing;
        self.state = State::Closing;
        was_open
    }

    /// Writes queued bytes until done or WouldBlock; returns bytes written.
    pub fn flush(&mut self) -> std::io::Result<usize> {
        let mut written = 0;
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.out_pos += n;
                    written += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if self.out_pos == self.out.len() {
            self.out_pos = 0;
            if self.out.capacity() > BUFFER_KEEP_BYTES_MAX {
                self.out = Vec::new();
            } else {
                self.out.clear();
            }
        } else if self.out_pos > self.out.len() / 2 {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        Ok(written)
    }
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
        matches!(self.conns.get(conn), Some(Some(c)) if c.state == State::WebSocket)
    }

    /// Queues an Engine.IO message packet (`4` + the parts) as one text frame.
    pub fn send_text(&mut self, conn: ConnId, parts: &[&[u8]]) -> bool {
        self.queue_frame(conn, ws::TEXT, b"4", parts)
    }

    /// Queues a binary Engine.IO message (a Socket.IO attachment).
    pub fn send_binary(&mut self, conn: ConnId, bytes: &[u8]) -> bool {
        self.queue_frame(conn, ws::BINARY, b"", &[bytes])
    }

    /// Queues a raw Engine.IO packet (e.g. `2` ping) as a text frame.
    pub(crate) fn send_engine(&mut self, conn: ConnId, packet: &[u8]) -> bool {
        self.queue_frame(conn, ws::TEXT, b"", &[packet])
    }

    /// One WebSocket frame of `prefix` and `parts`, within the bound.
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
        c.out.reserve(len + 10);
        ws::write_header(&mut c.out, opcode, len);
        c.out.extend_from_slice(prefix);
        for p in parts {
            c.out.extend_from_slice(p);
        }
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

    /// The connection if it can take `extra` more bytes; past the bound it
    /// is closed as a slow consumer and its queued bytes are dropped.
    fn writable(&mut self, conn: ConnId, extra: usize) -> Option<&mut Conn> {
        let bound = self.out_bytes_max;
        let c = self.conns.get_mut(conn)?.as_mut()?;
        if c.state != State::WebSocket {
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
