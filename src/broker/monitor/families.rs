//! The `/metrics` families the monitor builds from a view of the other
//! parts: node info, the Raft state, streams and consumers, replicated
//! stream groups and the users' refusals.

use super::{Monitor, View};
use crate::broker::metrics::Family;
use crate::broker::streams::StreamSummary;
use crate::cluster::api::TransportStats;

impl Monitor {
    /// The labelled and part-owned families: node info, the Raft state (a
    /// single node is a cluster of one that leads itself, as
    /// `cluster.status` reports) and one sample per stream and consumer.
    pub(crate) fn families(&self, view: &View<'_>) -> Vec<Family> {
        let mut families = node_families(view);
        families.push(
            Family::counter(
                "gombus_stale_subscriptions_dropped_total",
                "Subscriptions dropped at delivery because their socket no longer held its connection slot.",
            )
            .with(vec![], view.fsm.subs.stale_dropped as f64),
        );
        families.extend(stream_families(&view.streams.overview()));
        families.extend(crate::broker::replicated::stream_group_families(
            view.fsm,
            view.cluster,
        ));
        families.extend(view.access.families());
        families
    }
}

fn node_families(view: &View<'_>) -> Vec<Family> {
    let raft = raft_figures(view);
    let t = raft.transport;
    let mut reachable = Family::gauge(
        "gombus_raft_peer_reachable",
        "1 if the peer answered recently (this node counts itself).",
    );
    for (peer, up) in &raft.peers {
        reachable = reachable.with(vec![("peer", peer.clone())], f64::from(u8::from(*up)));
    }
    vec![
        Family::gauge("gombus_info", "Always 1; labels name the node and version.").with(
            vec![
                ("node_id", view.node_id.to_string()),
                ("version", env!("CARGO_PKG_VERSION").to_string()),
            ],
            1.0,
        ),
        Family::gauge(
            "gombus_raft_term",
            "Current Raft term (0 on a single node).",
        )
        .with(vec![], raft.term as f64),
        Family::gauge(
            "gombus_raft_commit_index",
            "Highest committed Raft log index.",
        )
        .with(vec![], raft.commit as f64),
        Family::gauge(
            "gombus_raft_applied_index",
            "Highest applied Raft log index.",
        )
        .with(vec![], view.fsm.applied as f64),
        Family::gauge("gombus_raft_leader", "1 if this node is the Raft leader.")
            .with(vec![], f64::from(u8::from(raft.leader))),
        Family::gauge(
            "gombus_raft_leader_known",
            "1 if this node knows a Raft leader (a single node leads itself).",
        )
        .with(vec![], f64::from(u8::from(raft.leader_known))),
        reachable,
        Family::counter(
            "gombus_cluster_forwarded_total",
            "Messages sent to other nodes for delivery.",
        )
        .with(vec![], raft.forwarded as f64),
        Family::counter(
            "gombus_cluster_forward_batches_dropped_total",
            "Forward batches dropped: the peer was unreachable or its link full.",
        )
        .with(vec![], raft.dropped as f64),
        Family::counter(
            "gombus_raft_messages_dropped_total",
            "Raft messages dropped because a peer's send queue was full.",
        )
        .with(vec![], raft.raft_dropped as f64),
        Family::counter(
            "gombus_raft_messages_rejected_total",
            "Raft messages dropped on arrival: naming another sender than the member \
                 their connection proved to be (sender), or a stranger or another node (address).",
        )
        .with(vec![("reason", "sender".into())], t.rejected_sender as f64)
        .with(vec![("reason", "address".into())], t.misaddressed as f64),
        Family::counter(
            "gombus_raft_handshakes_refused_total",
            "Raft connections closed before proving themselves: a proof that did not verify \
                 (proof), no valid hello (hello), too slow (timeout), or closed to make room for \
                 newer ones (evicted).",
        )
        .with(vec![("reason", "proof".into())], t.refused_proof as f64)
        .with(vec![("reason", "hello".into())], t.refused_hello as f64)
        .with(vec![("reason", "timeout".into())], t.refused_timeout as f64)
        .with(vec![("reason", "evicted".into())], t.evicted as f64),
    ]
}

/// The Raft figures `/metrics` shows.
struct RaftFigures {
    term: u64,
    commit: u64,
    leader: bool,
    leader_known: bool,
    peers: Vec<(String, bool)>,
    forwarded: u64,
    dropped: u64,
    raft_dropped: u64,
    transport: TransportStats,
}

fn raft_figures(view: &View<'_>) -> RaftFigures {
    let Some(c) = view.cluster else {
        return RaftFigures {
            term: 0,
            commit: 0,
            leader: true,
            leader_known: true,
            peers: vec![(view.node_id.to_string(), true)],
            forwarded: 0,
            dropped: 0,
            raft_dropped: 0,
            transport: TransportStats::default(),
        };
    };
    let view = c.view();
    RaftFigures {
        term: view.map_or(c.term(), |v| v.term),
        commit: view.map_or(0, |v| v.commit),
        leader: c.is_leader(),
        leader_known: c.leader().is_some(),
        peers: c
            .node_ids()
            .map(|id| {
                let up = id == c.me()
                    || (c.reachable(id)
                        && view.is_some_and(|v| v.peers.iter().any(|p| p.id == id && p.heard)));
                (c.name_of(id).unwrap_or("?").to_string(), up)
            })
            .collect(),
        forwarded: c.forward_counts().0,
        dropped: c.forward_counts().1,
        raft_dropped: view.map_or(0, |v| v.dropped),
        transport: view.map_or_else(TransportStats::default, |v| v.transport),
    }
}

/// Per-stream and per-consumer families from the streams overview. The
/// stream count and each stream's messages and bytes are rendered by
/// `Streams::render_metrics`; these add what the consumers hold.
fn stream_families(streams: &[StreamSummary]) -> Vec<Family> {
    let mut last = Family::gauge(
        "gombus_stream_last_seq",
        "Last sequence stored in the stream.",
    );
    let mut consumers = Family::gauge("gombus_stream_consumers", "Consumers of the stream.");
    let mut pending = Family::gauge(
        "gombus_consumer_pending",
        "Messages of the stream the consumer has not been given yet.",
    );
    let mut ack_pending = Family::gauge(
        "gombus_consumer_ack_pending",
        "Messages given to the consumer and not acked yet.",
    );
    let mut redelivered = Family::gauge(
        "gombus_consumer_redelivered",
        "Messages the consumer is being given again.",
    );
    for s in streams {
        let l = || vec![("stream", s.name.clone())];
        last.samples.push((l(), s.state.last_seq as f64));
        consumers.samples.push((l(), s.consumers.len() as f64));
        for c in &s.consumers {
            let cl = || vec![("stream", s.name.clone()), ("consumer", c.name.clone())];
            pending.samples.push((cl(), c.num_pending as f64));
            ack_pending.samples.push((cl(), c.num_ack_pending as f64));
            redelivered.samples.push((cl(), c.num_redelivered as f64));
        }
    }
    vec![last, consumers, pending, ack_pending, redelivered]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::streams::ConsumerSummary;
    use crate::stream::stream::State;

    #[test]
    fn stream_and_consumer_samples() {
        let streams = [StreamSummary {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            state: State {
                messages: 3,
                bytes: 90,
                first_seq: 1,
                last_seq: 3,
                consumer_count: 1,
            },
            consumers: vec![ConsumerSummary {
                name: "w".into(),
                num_pending: 2,
                num_ack_pending: 1,
                num_redelivered: 0,
            }],
        }];
        let mut text = String::new();
        for f in stream_families(&streams) {
            f.render(&mut text);
        }
        assert!(
            text.contains("gombus_stream_last_seq{stream=\"ORDERS\"} 3\n"),
            "{text}"
        );
        // Streams::render_metrics owns these.
        assert!(!text.contains("gombus_streams "), "{text}");
        assert!(!text.contains("gombus_stream_messages"), "{text}");
        assert!(
            text.contains("gombus_stream_consumers{stream=\"ORDERS\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("gombus_consumer_pending{stream=\"ORDERS\",consumer=\"w\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("gombus_consumer_ack_pending{stream=\"ORDERS\",consumer=\"w\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("gombus_consumer_redelivered{stream=\"ORDERS\",consumer=\"w\"} 0\n"),
            "{text}"
        );
        // No stream: no empty families.
        let mut empty = String::new();
        for f in stream_families(&[]) {
            f.render(&mut empty);
        }
        assert_eq!(empty, "");
    }
}
