//! The broker proper, above the transport: subjects and the subscription
//! index, the subscription table with its one `apply` path, queue groups,
//! request/reply inboxes, the control namespace and metrics.
//!
//! - [`sublist`]: the token trie with a bounded match cache.
//! - [`subs`]: subscriptions and [`subs::Command`], applied in one place.
//! - [`groups`]: queue-group rules (loadbalance / broadcast).
//! - [`session`]: one client's Socket.IO state (namespaces, attachments).
//! - [`dispatch`]: the [`Broker`], a `net::Handler`: events in, deliveries
//!   and acks out.
//! - [`requests`]: request/reply inboxes and their timeouts.
//! - [`control`]: `/control` events.
//! - [`cluster`]: cluster mode: changes through Raft, forwarding to peer
//!   nodes, relayed requests, node loss.
//! - [`stream_cluster`]: streams in a cluster: relayed to their owner,
//!   metadata and cursors replicated.
//! - [`streams`]: the stream and consumer events, captured publishes, fetch
//!   waits and acks held for their write.
//! - [`stream_out`]: push deliveries, fetch answers and the JSON views of
//!   streams, consumers and messages.
//! - [`access`]: users and rights on `/`: admission, `forbidden`, the
//!   delivery gate, reload on SIGHUP.
//! - [`metrics`]: counters and `/metrics`, `/healthz`.
//! - [`lifecycle`]: goodbyes to clients at shutdown.
//! - [`history`]: per-second traffic samples (rates, the chart).
//! - [`dashboard`]: the page at `/` and the JSON at `/api/info`.
pub mod access;
pub mod cluster;
pub mod control;
pub mod dashboard;
pub mod dispatch;
pub mod groups;
pub mod history;
pub mod lifecycle;
pub mod metrics;
pub mod requests;
pub mod session;
pub mod stream_cluster;
pub mod stream_out;
pub mod streams;
pub mod sublist;
pub mod subs;

pub use dispatch::{Broker, BrokerConfig};
