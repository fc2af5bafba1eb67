//! Pure protocol codecs: no sockets, files or clocks.
//!
//! - [`engineio`]: Engine.IO v4 packets, handshake query, heartbeat timer logic.
//! - [`socketio`]: Socket.IO v5 packets, namespaces, ack ids, binary attachments.
//! - [`errors`]: the contract's error codes and ack bodies.
//! - [`messages`]: typed requests for every event of the contract.
//! - [`pub_scan`]: the `pub` argument read by hand, off serde, on the
//!   publish hot path.
//! - [`kv_messages`]: key-value bucket requests, names, and how a bucket
//!   maps onto its stream.
//! - [`stream_messages`]: stream and consumer requests and configs.
//! - [`subject`]: subject and pattern rules (part of the wire contract), a
//!   reference matcher.
pub mod engineio;
pub mod errors;
pub mod kv_messages;
pub mod messages;
pub mod pub_scan;
pub mod socketio;
pub mod stream_messages;
pub mod subject;
