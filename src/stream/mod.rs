//! Streams: durable, per-subject message storage and the consumers that
//! read it. Record framing, state files and the fsync thread are
//! [`crate::storage`]'s.
//!
//! - [`segment`]: the record kinds of a stream segment file and its name.
//! - [`index`]: the index file of a sealed segment (seq -> offset, subject,
//!   time; its removals), rebuilt when missing or stale.
//! - [`store`]: one stream's segment store (append, read, remove, limits,
//!   the in-memory index) and its API contract.
//! - [`recover`]: opening a store: torn tails cut, corruption refused.
//! - [`consumer`]: one consumer's pure state machine (cursor, pending acks,
//!   redelivery schedule).
//! - [`meta`]: stream and consumer configs and cursors on disk (snapshot +
//!   event log).
//! - [`payloads`]: where a replica keeps its message payloads (segment
//!   files kept across restarts, or memory without a data directory).
//! - [`catchup`]: a replica fetching what a leader's small snapshot names,
//!   by ranges: the member's requests and the leader's answers (pure).
//! - [`group`]: one replicated stream as its Raft group sees it: the
//!   replica and the leader's bookkeeping of its proposals (pure).
//! - [`replica`]: the state machine of a replicated stream: the entries
//!   its Raft group carries and their deterministic apply, with snapshots.
//! - [`stream`]: one stream's config, limits, dedup window and retention
//!   over its segment store.
pub mod catchup;
pub mod consumer;
pub mod dedup;
pub mod group;
pub mod index;
pub mod limits;
pub mod meta;
pub mod payloads;
pub mod recover;
pub mod replica;
pub mod segment;
pub mod store;
#[allow(clippy::module_inception)] // stream::stream is one stream, as the layout asks.
pub mod stream;
