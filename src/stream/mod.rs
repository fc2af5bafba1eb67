//! Streams: durable, per-subject message storage and the consumers that
//! read it.
//!
//! - [`record`]: length + crc32 record framing shared by every append-only
//!   file (segments, the durable Raft log, state files).
//! - [`consumer`]: one consumer's pure state machine (cursor, pending acks,
//!   redelivery schedule).
//! - [`meta`]: stream and consumer configs and cursors on disk (snapshot +
//!   event log).
//! - [`stream`]: one stream's messages, limits, dedup window and retention.
pub mod consumer;
pub mod meta;
pub mod record;
#[allow(clippy::module_inception)] // stream::stream is one stream, as the layout asks.
pub mod stream;
pub mod sync;
