//! Cluster mode's building blocks: a home-grown Raft, kept small enough to
//! audit and tested by deterministic simulation.
//!
//! - [`raft_msg`]: entries, messages, hard state and snapshots, and their
//!   compact binary encoding (the wire and the disk share it).
//! - [`raft`]: the pure consensus core: `tick`, `step`, `propose`,
//!   `read_index` in; a [`raft::Ready`] of things to persist, send and
//!   apply out. No sockets, files, threads or clocks.
//! - [`raft_multi`]: many Raft groups (the control group and one per
//!   replicated stream) on one node: one tick, routing by group id, and
//!   heartbeats coalesced per node pair.
//! - [`raft_log`]: where the log and the term/vote state live: the
//!   [`raft_log::LogStore`] trait, an in-memory and a durable (record
//!   framed, fsynced) implementation, and the crc-framed state file.
//! - [`raft_transport`]: node-to-node TCP on its own mio `Poll`, length +
//!   crc32 framed, with reconnect backoff and bounded send queues.
//! - [`raft_auth`]: the handshake by which every Raft connection proves
//!   its ends hold the cluster secret.
//! - [`placement`]: `replicas` on `stream.create`, the choice of a
//!   replicated stream's nodes, and the placement the control state
//!   records.
//! - [`fsm`]: the control-state machine every replicated change goes
//!   through, with its snapshots.
//! - [`entry_json`]: the reader of the control group's entries.
//! - [`members`]: members' names and addresses in the replicated
//!   configuration, and how members get their ids.
//! - [`node`]: the Raft thread of a broker in cluster mode.
//! - [`link`]: Socket.IO links to the other nodes' `/control` namespace.
//! - [`forward`]: the batch format of messages forwarded between nodes.
//!
//! The broker sees all of this through [`api`], the one module it may
//! import (`tests/module_rules.rs` checks it).
pub mod api;
pub mod entry_json;
pub mod forward;
pub mod fsm;
pub mod link;
pub mod members;
pub mod node;
pub mod placement;
pub mod raft;
pub mod raft_auth;
pub mod raft_log;
pub mod raft_msg;
pub mod raft_multi;
pub mod raft_transport;
pub mod snapshot_file;
