//! The broker core, above the transport: it sees the event loop only
//! through `crate::port` (events in, actions into a `Sink`) and holds no
//! socket, so it runs in-process in tests. Deliveries by the
//! subscription table (`crate::routing`, changed through the one `apply`
//! path of `cluster/fsm.rs`), request/reply inboxes, streams, cluster
//! mode's glue, the control namespace and metrics.
//!
//! The parts own their state in private fields: `Messaging`, `Streams`,
//! `Cluster`, `Monitor`, `Access`; the [`Broker`] holds them with the
//! sessions and the control state and lends each what it reads of the
//! others for a call (docs/DESIGN.md, "Parts of the core").
//!
//! - [`session`]: one client's Socket.IO state (namespaces, attachments).
//! - [`dispatch`]: the [`Broker`], the port's `Handler`: events in,
//!   deliveries and acks out into the caller's `Sink`.
//! - [`ack`]: the one writer of an answer (ACK or BINARY_ACK).
//! - [`events`]: the one table of events: name, namespace, argument
//!   type, handler; unknown names are answered from it.
//! - [`messaging`]: the [`Messaging`](messaging::Messaging) component:
//!   it owns the request inboxes and the delivery buffers, and delivers
//!   (match, group picks, encode once, queue, forward batches) by the
//!   subscription table the broker lends it.
//! - [`requests`]: request/reply inboxes and their timeouts.
//! - [`control`]: `/control` events.
//! - [`cluster`]: cluster mode: changes through Raft, forwarding to peer
//!   nodes, relayed requests, node loss.
//! - [`stream_cluster`]: streams in a cluster: relayed to their owner,
//!   metadata and cursors replicated.
//! - [`replicated`]: `replicas` on a clustered `stream.create`, the
//!   placement recorded, and the `cluster` field of `stream.info`.
//! - [`stream_groups`]: the data path of replicated streams: entries
//!   through each stream's Raft group, applied into every member's
//!   replica, events served by the group's leader.
//! - [`stream_moves`]: replicas of replicated streams moved off a node
//!   being removed from the cluster, and the groups' voters kept to
//!   their placement.
//! - [`streams`]: the stream and consumer events, captured publishes, fetch
//!   waits and acks held for their write.
//! - [`stream_out`]: push deliveries, fetch answers and the JSON views of
//!   streams, consumers and messages.
//! - [`access`]: users and rights on `/`: admission, `forbidden`, the
//!   delivery gate, reload on SIGHUP.
//! - [`monitor`]: the [`Monitor`](monitor::Monitor) component: it owns
//!   the counters, the traffic history and the start time, and answers
//!   `/healthz`, `/metrics`, the dashboard, `server.info` and
//!   `cluster.status` from a view of the other parts.
//! - [`metrics`]: the counters and the `/metrics` text and families.
//! - [`lifecycle`]: goodbyes to clients at shutdown.
//! - [`history`]: per-second traffic samples (rates, the chart).
//! - [`dashboard`]: the page at `/` and the JSON at `/api/info`.
pub mod access;
pub mod ack;
pub mod cluster;
pub mod control;
pub mod dashboard;
pub mod dispatch;
pub mod events;
pub mod history;
pub mod kv;
pub mod lifecycle;
pub mod messaging;
pub mod metrics;
pub mod monitor;
pub mod replicated;
pub mod requests;
pub mod session;
pub mod stream_batches;
pub mod stream_catchup;
pub mod stream_cluster;
pub mod stream_groups;
pub mod stream_moves;
pub mod stream_out;
pub mod streams;

pub use dispatch::{Broker, BrokerConfig};

#[cfg(test)]
mod tests;
