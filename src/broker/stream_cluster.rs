//! Streams in a cluster. A replicated stream (`replicas` > 1) is served
//! by its Raft group's leader (`stream_groups.rs`, which takes its events
//! first). An R1 stream's data lives on the node that created it; the cluster knows its owner, config, consumers and their cursors
//! (replicated through [`crate::cluster::fsm`]). A stream request made on
//! another node is relayed to the owner over the peer link and its answer
//! relayed back, so clients may use any node; `stream.list` gathers every
//! node's streams. The owner replicates its consumers' cursors in batches
//! (every [`CURSOR_EVERY`]), not one consensus round per ack.
//!
//! This file holds `CursorLog` and the relay's wait, below the `Broker`;
//! the `Broker`'s side is in `stream_cluster/route.rs` (a stream event
//! relayed, gathered or handled here) and `stream_cluster/records.rs`
//! (streams announced, cursors replicated).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;

use super::cluster::{ChangeAck, Listing, PROPOSE_WAIT};
use super::events::StreamOp;
use super::session::NSP_ROOT;
use crate::cluster::api::{Cmd, Cursor, CursorPos, MetaCommand};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::ApiError;

mod records;
mod route;

/// How often an owner replicates the cursors that moved.
pub const CURSOR_EVERY: Duration = Duration::from_millis(100);

/// Cursors last replicated, per (stream, consumer).
#[derive(Debug, Default)]
pub(crate) struct CursorLog {
    sent: HashMap<(String, String), (u64, u64)>,
    next: Option<Instant>,
}

/// How long a node waits for the answer to stream event `op` (argument
/// `argv`) it relayed to another node: `base`, plus a fetch's own wait
/// (`expires_ms`, 5 s unless given, at most 10 minutes).
pub(super) fn relay_wait(op: StreamOp, argv: &Value, base: Duration) -> Duration {
    if op != StreamOp::ConsumerFetch {
        return base;
    }
    let expires = argv
        .get("expires_ms")
        .and_then(Value::as_u64)
        .unwrap_or(5_000)
        .min(600_000);
    Duration::from_millis(expires) + base
}
