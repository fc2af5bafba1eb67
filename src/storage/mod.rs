//! Durable-file building blocks shared by streams and the Raft log. They
//! know nothing of messages, consumers or Raft entries: a body is bytes
//! whose meaning the owner of the file chooses.
//!
//! - [`record`]: length + crc32 record framing of every append-only file
//!   (stream segments and their index files, the meta event logs, the Raft
//!   log) and of the Raft transport's frames.
//! - [`statefile`]: small state files replaced atomically (a stream's meta
//!   snapshot, Raft's hard state and snapshot).
//! - [`sync`]: the broker's fsync thread for stream files (group commit,
//!   tickets, `-sync` policies).
pub mod record;
pub mod statefile;
pub mod sync;
