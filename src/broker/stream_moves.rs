//! Replicas of replicated streams moved off a node that is being removed
//! from the cluster (docs/PROTOCOL.md, "Membership changes"), and each
//! stream group's voters kept to the stream's placement.
//!
//! The control state's [`Placement`] says where a stream's replicas are:
//! `replicas`, plus, while a move is under way, `leaving` (a node whose
//! replica is on its way out) and `joining` (the node taking it over).
//! `cluster.remove` of a node that holds replicas first records, for each
//! such stream, a placement with the node leaving and another one joining
//! (among the nodes without a replica of that stream, the one holding the
//! fewest; with none, the stream keeps one replica fewer), and removes the
//! node only once no placement names it.
//!
//! Every holder tells its Raft thread the voters the group should have
//! (`ToRaft::GroupWant`). The group's leader adds the joining node as a
//! non-voter, which the core promotes once it has caught up (from the
//! log, or a snapshot when the log has moved on), then removes the
//! leaving node (a leader removing itself hands over first) and reports
//! the group settled. The node leading it then records the placement
//! without `leaving` and `joining`; the old holder drops its replica and
//! its log. Until the new replica votes, the old one stays a voter, so
//! the group never has fewer voters holding what was acked than before:
//! nothing acked is lost, and the stream stays writable throughout.

use std::collections::HashMap;

use super::cluster::actions::Action;
use super::cluster::Cluster;
use super::Broker;
use crate::cluster::api::placement::{self, Placement};
use crate::cluster::api::{Cmd, GroupId, MetaCommand, ToRaft};
use crate::port::Sink;

/// What the Raft thread needs to hold the group of placement `p` on node
/// `me`: the voters it started with, or, for a node joining it, none (it
/// learns them from the group's leader, and never campaigns before).
pub(crate) fn hold_group(p: &Placement, me: u64) -> ToRaft {
    let join = p.joining.contains(&me);
    ToRaft::Group {
        group: p.group,
        members: if join { Vec::new() } else { p.seed() },
        join,
    }
}

/// The nodes a replica on `node` may move to: the other voters.
fn move_targets(c: &Cluster, node: u64) -> Vec<u64> {
    c.node_ids()
        .filter(|&n| n != node && c.is_voter(n))
        .collect()
}

impl Broker {
    /// Tells the Raft thread the voters each group held here should have
    /// (when that changed), and to drop the groups no longer held.
    pub(crate) fn want_group_members(&mut self) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        if !c.running() {
            return;
        }
        let me = c.me();
        let mut wanted: HashMap<GroupId, Vec<u64>> = HashMap::new();
        for s in self.fsm.streams.values() {
            let Some(p) = s.placement.as_ref().filter(|p| p.holds(me)) else {
                continue;
            };
            if self.stream_groups.wanted.get(&p.group) != Some(&p.replicas) {
                c.act(Action::Raft(ToRaft::GroupWant {
                    group: p.group,
                    members: p.replicas.clone(),
                    report: p.moving(),
                }));
            }
            wanted.insert(p.group, p.replicas.clone());
        }
        for &group in self.stream_groups.wanted.keys() {
            if !wanted.contains_key(&group) {
                c.act(Action::Raft(ToRaft::GroupDrop { group }));
            }
        }
        self.stream_groups.wanted = wanted;
    }

    /// The group this node leads has exactly `members` as voters: if that
    /// ends a move, the placement is recorded without it.
    pub(crate) fn group_settled(&mut self, sink: &mut dyn Sink, group: GroupId, members: &[u64]) {
        let found = self.fsm.streams.iter().find_map(|(name, s)| {
            s.placement
                .as_ref()
                .filter(|p| p.group == group && p.moving())
                .map(|p| (name.clone(), p.clone()))
        });
        let Some((name, p)) = found else {
            return;
        };
        let mut have = members.to_vec();
        have.sort_unstable();
        let mut want = p.replicas.clone();
        want.sort_unstable();
        if have != want {
            return;
        }
        crate::log_info!(
            "stream {name:?}: replicas moved off node(s) {:?}, now on {:?}",
            p.leaving,
            p.replicas
        );
        let placement = Placement {
            group,
            replicas: p.replicas,
            leaving: Vec::new(),
            joining: Vec::new(),
        };
        self.submit_internal(
            sink,
            Cmd::Meta(MetaCommand::StreamPlace { name, placement }),
        );
    }

    /// Whether any stream's replica is on `node`, a member of its group
    /// or leaving it.
    pub(crate) fn holds_replicas(&self, node: u64) -> bool {
        self.fsm
            .streams
            .values()
            .any(|s| s.placement.as_ref().is_some_and(|p| p.holds(node)))
    }

    /// The first stream whose replica on `node` has nowhere to go (it
    /// would be left with a single replica), if any.
    pub(crate) fn replica_stuck_on(&self, node: u64) -> Option<String> {
        let c = self.cluster.as_ref()?;
        let nodes = move_targets(c, node);
        let held = std::collections::BTreeMap::new();
        self.fsm.streams.iter().find_map(|(name, s)| {
            let p = s.placement.as_ref()?;
            let stuck = p.replicas.contains(&node)
                && !p.moving()
                && placement::move_off(p, node, &nodes, &held).is_none();
            stuck.then(|| name.clone())
        })
    }

    /// Records, for every stream with a replica on `node` (which is being
    /// removed), the placement that moves it to another node. Streams
    /// whose move is under way already are left to it. Returns the names
    /// of the streams whose move was asked for.
    pub(crate) fn move_replicas_off(&mut self, sink: &mut dyn Sink, node: u64) -> Vec<String> {
        let Some(c) = self.cluster.as_ref() else {
            return Vec::new();
        };
        let nodes = move_targets(c, node);
        let mut held = placement::replica_counts(
            self.fsm
                .streams
                .values()
                .map(|s| (s.owner, s.placement.as_ref())),
        );
        let mut moves = Vec::new();
        for (name, s) in &self.fsm.streams {
            let Some(p) = s.placement.as_ref().filter(|p| !p.moving()) else {
                continue;
            };
            let Some(next) = placement::move_off(p, node, &nodes, &held) else {
                continue;
            };
            for &n in &next.joining {
                *held.entry(n).or_insert(0) += 1;
            }
            moves.push((name.clone(), next));
        }
        let mut names = Vec::new();
        for (name, placement) in moves {
            crate::log_info!(
                "stream {name:?}: moving its replica off node {node} to {:?}",
                placement.joining
            );
            names.push(name.clone());
            self.submit_internal(
                sink,
                Cmd::Meta(MetaCommand::StreamPlace { name, placement }),
            );
        }
        names
    }
}
