//! gombus: a NATS-style message broker that clients reach over Socket.IO.
//!
//! Layout (data flows top to bottom, one concern per file):
//! - [`config`]: command-line flags and their validation.
//! - [`log`]: one line per event on stderr, filtered by `-log-level`.
//! - [`net`]: the mio event loop, the hand-rolled HTTP/1.1 layer, WebSocket
//!   framing over tungstenite's frame codec, bounded outbound buffers, timers.
//! - [`port`]: the interface between the loop and the broker core: the
//!   events a `Handler` gets and the `Sink` its actions go into.
//! - [`protocol`]: pure codecs for Engine.IO v4 and Socket.IO v5 packets, the
//!   contract's request types, error codes and subject rules.
//! - [`broker`]: the broker core, which holds no socket (events in
//!   through `port`, actions out into its sink): deliveries, request/reply,
//!   streams' events, cluster mode's glue, the control namespace, metrics;
//!   every subscription change goes through one `apply` path.
//! - [`routing`]: who receives what: the subscription index and table,
//!   queue-group rules; used by the broker and the control-state machine.
//! - [`storage`]: record framing, atomic state files and the fsync thread,
//!   under streams and the Raft log alike.
//! - [`stream`]: streams and consumers over an append-only segment store.
//! - [`client`]: the Rust client module used by the examples, tests and tools.
//! - [`rand`]: the seed source and the SplitMix64 mixer for ids, jitter,
//!   masks and seeded tests (nothing secret).
//! - [`cli`]: the `gombus` command line, on the client.
//! - [`cluster`]: cluster mode's Raft: a pure consensus core, its log
//!   storage and its node-to-node transport.
//! - [`crypto`]: SHA-256, HMAC-SHA256 and OS randomness, for the proofs
//!   cluster members exchange.
//! - [`auth`]: the users file and each user's rights: which subjects it
//!   may publish and subscribe to, which streams it may use.

pub mod auth;
pub mod broker;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod log;
pub mod maps;
pub mod net;
pub mod port;
pub mod protocol;
pub mod rand;
pub mod routing;
pub mod storage;
pub mod stream;
