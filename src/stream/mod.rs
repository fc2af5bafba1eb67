//! Streams: durable, per-subject message storage and the consumers that
//! read it.
//!
//! - [`record`]: length + crc32 record framing shared by every append-only
//!   file (segments, the durable Raft log, state files).
//! - [`segment`]: the record kinds of a stream segment file and its name.
//! - [`index`]: the index file of a sealed segment (seq -> offset, subject,
//!   time; its removals), rebuilt when missing or stale.
//! - [`store`]: one stream's segment store (append, read, remove, limits,
//!   the in-memory index) and its API contract.
//! - [`recover`]: opening a store: torn tails cut, corruption refused.
//! - [`statefile`]: small state files replaced atomically (configs, hard
//!   state).
//! - [`sync`]: the broker's fsync thread (group commit, tickets, policies).
//! - [`consumer`]: one consumer's pure state machine (cursor, pending acks,
//!   redelivery schedule).
//! - [`meta`]: stream and consumer configs and cursors on disk (snapshot +
//!   event log).
//! - [`stream`]: one stream's config, limits, dedup window and retention
//!   over its segment store.
pub mod consumer;
pub mod index;
pub mod meta;
pub mod record;
pub mod recover;
pub mod segment;
pub mod statefile;
pub mod store;
#[allow(clippy::module_inception)] // stream::stream is one stream, as the layout asks.
pub mod stream;
pub mod sync;
