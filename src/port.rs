//! The port between the event loop and the broker core: what the loop
//! hands a [`Handler`] (connection events, messages, HTTP requests,
//! ticks, wake-ups) and the [`Sink`] the handler writes its actions into
//! (send these bytes to this connection, close it, arm its timer).
//!
//! Both sides depend on this module and on nothing of each other: `net`
//! implements [`Sink`] over its connection buffers and drives any
//! [`Handler`]; the broker implements [`Handler`], never sees a socket
//! and takes the time of the turn from [`Sink::now`]. A test drives the
//! same handler with a sink that records the actions.

use std::sync::Arc;
use std::time::Instant;

/// One Engine.IO session as the loop names it (an index the loop reuses
/// once the session is closed and [`Handler::closed`] was called).
pub type ConnId = usize;

/// Bytes several connections queue by reference (the shared part of one
/// delivery), written from where they are with `writev`. An `Arc`, so the
/// event loop stays `Send` (a fixture runs it on a thread of its own).
pub type Shared = Arc<[u8]>;

/// An Engine.IO message from a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    Text(&'a str),
    Binary(&'a [u8]),
}

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
    /// Sessions currently on the long-polling transport.
    pub polling_sessions: u64,
}

/// An HTTP request as the handler sees it (the head; the loop reads and
/// bounds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    /// The minor version of `HTTP/1.x`.
    pub minor: u8,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated header holds `token` (case-insensitive).
    pub fn header_has_token(&self, name: &str, token: &str) -> bool {
        self.header(name)
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    }

    /// A query parameter's raw value.
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k == key).then_some(v)
        })
    }
}

/// A complete HTTP answer; the loop encodes it (and closes the connection
/// after it unless it is kept alive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response::new(status, "application/json", body)
    }

    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response::new(status, "text/plain; charset=utf-8", body)
    }
}

/// Where a handler puts its actions during one call. The loop's sink
/// writes straight into the connections' outbound buffers (bounded: a
/// connection whose queue would pass its limit is closed as a slow
/// consumer, and the send reports `false`); a test's sink records them.
pub trait Sink {
    /// The time of this loop turn: the only clock the handler reads.
    fn now(&self) -> Instant;
    /// The loop's counters.
    fn stats(&self) -> &NetStats;
    /// Whether `conn` is an open Engine.IO session.
    fn is_open(&self, conn: ConnId) -> bool;
    /// The Engine.IO version `conn` speaks (3 for legacy clients, else 4).
    fn eio(&self, conn: ConnId) -> u8;
    /// The handshake query's `token` of an Engine.IO v3 session (still
    /// percent-encoded): how socket.io-client 2.x names its user. `None`
    /// for v4 sessions and sessions without one.
    fn legacy_token(&self, _conn: ConnId) -> Option<&str> {
        None
    }
    /// Queues one Engine.IO message packet (`4` + the parts) to `conn`;
    /// false if it was not queued (closed, or closed now as a slow
    /// consumer).
    fn send_text(&mut self, conn: ConnId, parts: &[&[u8]]) -> bool;
    /// As [`Sink::send_text`] with `shared` appended, held by reference
    /// where the transport allows (the same bytes go to many connections).
    fn send_text_shared(&mut self, conn: ConnId, parts: &[&[u8]], shared: &Shared) -> bool;
    /// Queues a binary Engine.IO message (a Socket.IO attachment).
    fn send_binary(&mut self, conn: ConnId, bytes: &[u8]) -> bool;
    /// Closes `conn` after what is queued.
    fn close(&mut self, conn: ConnId);
    /// Sets (or clears) the handler's one deadline for `conn`; when it
    /// passes the loop calls [`Handler::timer`].
    fn set_timer(&mut self, conn: ConnId, at: Option<Instant>);
}

/// What the event loop calls into. Every call that may act gets a
/// [`Sink`].
pub trait Handler {
    /// Which Engine.IO endpoint a path is, if any (an index the handler
    /// chooses; `/socket.io/` for the broker).
    fn endpoint(&self, path: &str) -> Option<u8>;
    /// Any other HTTP request.
    fn http(&mut self, sink: &mut dyn Sink, req: &Request) -> Response;
    /// An Engine.IO session opened (the open packet has been queued).
    fn opened(&mut self, sink: &mut dyn Sink, conn: ConnId, endpoint: u8);
    /// An Engine.IO message arrived.
    fn message(&mut self, sink: &mut dyn Sink, conn: ConnId, payload: Payload<'_>);
    /// The session ended, whoever ended it; called once per opened session.
    fn closed(&mut self, sink: &mut dyn Sink, conn: ConnId);
    /// The deadline set with [`Sink::set_timer`] for `conn` has passed.
    fn timer(&mut self, sink: &mut dyn Sink, conn: ConnId);
    /// Once per loop turn, after the turn's events: handler-wide timers.
    fn tick(&mut self, sink: &mut dyn Sink);
    /// The next handler-wide deadline, so the loop wakes for it.
    fn next_deadline(&self) -> Option<Instant>;
    /// Called once, before the loop runs, with the loop's waker: a
    /// handler gives it to its helper threads (the fsync thread). Threads
    /// started outside the handler (a cluster node's Raft thread and peer
    /// links, started by `bin/broker.rs`) take it from `Server::waker`.
    /// An error means the handler cannot serve; the caller stops.
    fn attach(&mut self, _waker: Arc<mio::Waker>) -> Result<(), String> {
        Ok(())
    }
    /// Some thread called the waker; the handler collects what it reported
    /// (an fsync round done, Raft output).
    fn woken(&mut self, _sink: &mut dyn Sink) {}
    /// Once per loop turn, after the turn's output was written to the
    /// sockets: work the answers should not wait for (writing replicas'
    /// messages to their files, which reads serve from memory until then).
    fn after_output(&mut self) {}
    /// The server is shutting down (SIGTERM): say goodbye to clients and
    /// make durable state durable (flush and fsync stores) before this
    /// returns. Connections are closed and drained afterwards, bounded.
    fn shutdown(&mut self, _sink: &mut dyn Sink) {}
}
