//! The I/O shell: everything that touches sockets and clocks.
//!
//! - [`server`]: the mio event loop (accept, read, write, timers) and the
//!   Engine.IO session over WebSocket or HTTP long-polling, with the
//!   upgrade from polling to WebSocket.
//! - [`http`]: request-head parsing, body length, keep-alive, responses.
//! - [`polling`]: long-polling payloads and a polling session's state.
//! - [`ws`]: WebSocket framing over tungstenite's frame codec.
//! - [`conn`]: one connection's buffers and state, and [`Io`], the handle a
//!   [`Handler`] uses to write to connections.
//! - [`trim`]: handing memory a burst freed back to the system.
//!
//! A [`Handler`] (the broker, or the conformance fixture) sees Engine.IO
//! messages and HTTP requests, never bytes of framing.
pub mod conn;
pub mod http;
pub mod polling;
pub mod server;
pub mod signal;
pub mod trim;
pub mod ws;

use std::sync::Arc;
use std::time::Instant;

pub use conn::{ConnId, Io, NetStats, Shared};
pub use http::{Request, Response};

/// An Engine.IO message from a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    Text(&'a str),
    Binary(&'a [u8]),
}

/// What the event loop calls into. Every call gets an [`Io`] for writing.
pub trait Handler {
    /// Which Engine.IO endpoint a path is, if any (an index the handler
    /// chooses; `/socket.io/` for the broker).
    fn endpoint(&self, path: &str) -> Option<u8>;
    /// Any other HTTP request.
    fn http(&mut self, io: &mut Io<'_>, req: &Request) -> Response;
    /// An Engine.IO session opened (the open packet has been queued).
    fn opened(&mut self, io: &mut Io<'_>, conn: ConnId, endpoint: u8);
    /// An Engine.IO message arrived.
    fn message(&mut self, io: &mut Io<'_>, conn: ConnId, payload: Payload<'_>);
    /// The session ended, whoever ended it; called once per opened session.
    fn closed(&mut self, io: &mut Io<'_>, conn: ConnId);
    /// The deadline set with [`Io::set_timer`] for `conn` has passed.
    fn timer(&mut self, io: &mut Io<'_>, conn: ConnId);
    /// Once per loop turn, after the turn's events: handler-wide timers.
    fn tick(&mut self, io: &mut Io<'_>);
    /// The next handler-wide deadline, so the loop wakes for it.
    fn next_deadline(&self) -> Option<Instant>;
    /// Called once, before the loop runs, with the loop's waker: a
    /// handler that starts helper threads (fsync) gives it to them.
    fn attach(&mut self, _waker: Arc<mio::Waker>) {}
    /// Some thread called the waker; the handler collects what it reported.
    fn woken(&mut self, _io: &mut Io<'_>) {}
    /// The server is shutting down (SIGTERM): say goodbye to clients and
    /// make durable state durable (flush and fsync stores) before this
    /// returns. Connections are closed and drained afterwards, bounded.
    fn shutdown(&mut self, _io: &mut Io<'_>) {}
}
