//! The event loop and transports: everything that touches sockets and
//! clocks.
//!
//! - [`server`]: the mio event loop (accept, read, write, timers) and the
//!   Engine.IO session over WebSocket or HTTP long-polling, with the
//!   upgrade from polling to WebSocket.
//! - [`http`]: request-head parsing, body length, keep-alive, responses.
//! - [`polling`]: long-polling payloads and a polling session's state.
//! - [`ws`]: WebSocket framing over tungstenite's frame codec.
//! - [`conn`]: one connection's buffers and state, and [`Io`], the loop's
//!   [`Sink`]: what a [`Handler`] writes into lands in connection buffers.
//! - [`trim`]: handing memory a burst freed back to the system.
//!
//! A [`Handler`] (the broker, or the conformance fixture) sees Engine.IO
//! messages and HTTP requests, never bytes of framing; the interface is
//! `crate::port`'s, re-exported here.
pub mod conn;
pub mod http;
pub mod polling;
pub mod server;
pub mod signal;
pub mod trim;
pub mod ws;

pub use crate::port::{ConnId, Handler, NetStats, Payload, Request, Response, Shared, Sink};
pub use conn::Io;
