//! Streams: durable, per-subject message storage and the consumers that
//! read it.
//!
//! - [`record`]: length + crc32 record framing shared by every append-only
//!   file (segments, the durable Raft log, state files).
pub mod record;
