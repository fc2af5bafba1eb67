//! `replicas` on a clustered `stream.create`, and where a stream lives as
//! `stream.info` reports it. The node taking the create checks `replicas`
//! (see `cluster/placement.rs`), picks the stream's R nodes and records
//! them through the control group (`MetaCommand::StreamPlace`), so every
//! node learns the placement. Each placed node keeps a replica of the
//! stream and runs its Raft group (see `stream_groups.rs` and
//! `cluster/node.rs`) from the moment it applies the placement; the
//! `cluster` field of an R>1 stream comes from that group.
//!
//! This file holds what the other parts read (the stream groups'
//! `/metrics` families, a node as `stream.info` names it); the `Broker`'s
//! side of the create and of `stream.info` is in `replicated/create.rs`.

use serde_json::value::RawValue;
use serde_json::Value;

use super::cluster::Cluster;
use super::metrics::Family;
use crate::cluster::api::Fsm;

mod create;

/// What a clustered `stream.create` asks for once `replicas` is taken out.
pub(crate) struct CreateReplicas {
    /// The request without `replicas`: a stream config.
    pub arg: Box<RawValue>,
    pub replicas: usize,
}

/// `/metrics` for the stream groups held here, by stream: the group's
/// leader as this node knows it (0: none), its term, and on the
/// group's leader how many entries each other member is behind.
pub(crate) fn stream_group_families(fsm: &Fsm, cluster: Option<&Cluster>) -> Vec<Family> {
    let Some(c) = cluster else {
        return Vec::new();
    };
    let Some(view) = c.fresh_view() else {
        return Vec::new();
    };
    let mut leader = Family::gauge(
        "gombus_stream_group_leader",
        "The node leading a replicated stream's Raft group (0 while none is known).",
    );
    let mut term = Family::gauge(
        "gombus_stream_group_term",
        "The term of a replicated stream's Raft group.",
    );
    let mut lag = Family::gauge(
        "gombus_stream_group_lag",
        "On a stream group's leader: entries a member's log is behind.",
    );
    for (name, s) in &fsm.streams {
        let Some(g) = s.placement.as_ref().and_then(|p| view.groups.get(&p.group)) else {
            continue;
        };
        let stream = || vec![("stream", name.clone())];
        leader = leader.with(stream(), g.leader.unwrap_or(0) as f64);
        term = term.with(stream(), g.term as f64);
        for (node, m) in g.progress.iter().filter(|(n, _)| **n != c.me()) {
            let behind = g.last_index.saturating_sub(*m);
            lag = lag.with(
                vec![("stream", name.clone()), ("node", node.to_string())],
                behind as f64,
            );
        }
    }
    vec![leader, term, lag]
}

/// A node as `stream.info`'s `cluster` field names it: its node id (the
/// `-node-id` it runs with, as `cluster.status` shows it), or its Raft
/// number as text when the configuration carries no name for it.
pub(crate) fn node_id(c: &Cluster, node: u64) -> Value {
    match c.name_of(node) {
        Some(name) => Value::String(name.to_string()),
        None => Value::String(node.to_string()),
    }
}
