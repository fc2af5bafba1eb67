//! Many Raft groups on one node: the control group and one group per
//! replicated stream, each a [`Raft`] core of its own, sharing one
//! transport, one tick and one heartbeat per node pair.
//!
//! - One tick: [`Multi::tick`] ticks every core once. A node runs one
//!   timer however many groups it holds; each core keeps its own election
//!   and heartbeat counters, so groups still time out independently.
//! - Coalesced heartbeats: after a round's messages are released (the
//!   cores' [`AfterPersist`]), [`coalesce`] gathers every `Heartbeat` that
//!   goes to one peer into a single [`Body::Beats`], and every
//!   `HeartbeatResp` into a single [`Body::BeatsResp`]; [`split`] (inside
//!   [`Multi::step`]) turns them back into per-group messages at the
//!   receiver. A thousand idle groups led here cost one message per peer
//!   per heartbeat round, each group a few varint bytes inside it
//!   ([`IDLE_BEAT_BYTES`]). A lone heartbeat stays as it is, so a node
//!   with only the control group sends exactly what it sent before groups.
//! - Routing: a message goes to the core of its group; one for a group
//!   this node does not hold is dropped (the sender retries, and the
//!   placement in the control state says who should hold what).
//!
//! Pure like the core: no sockets, files or clocks. Persisting each
//! group's [`Ready`] is the caller's, as for a single core.

use std::collections::{BTreeMap, BTreeSet};

use super::raft::{AfterPersist, Raft, Ready, HEARTBEAT_TICKS, TICK_MS};
use super::raft_msg::{Beat, BeatAck, Body, GroupId, Message, NodeId, CONTROL_GROUP};

/// The bytes one group adds to a [`Body::Beats`] while it is idle with
/// small numbers (group id, term, commit index below 128): five one-byte
/// varints. A group with a commit index in the millions takes two more.
pub const IDLE_BEAT_BYTES: u64 = 5;
/// Likewise for its answer in a [`Body::BeatsResp`]: group, term,
/// ReadIndex round and the answering core's epoch.
pub const IDLE_BEAT_ACK_BYTES: u64 = 4;

/// Heartbeat rounds per second at the default timing.
pub const BEATS_PER_SEC: u64 = 1_000 / (HEARTBEAT_TICKS as u64 * TICK_MS);

/// What one idle group costs per follower and per second at the default
/// timing, in bytes on the wire: (leader to follower, follower to leader).
/// The fixed cost of the carrying messages is shared by every group.
pub const fn idle_group_bytes_per_sec() -> (u64, u64) {
    (
        IDLE_BEAT_BYTES * BEATS_PER_SEC,
        IDLE_BEAT_ACK_BYTES * BEATS_PER_SEC,
    )
}

/// The Raft groups of one node.
pub struct Multi {
    id: NodeId,
    groups: BTreeMap<GroupId, Raft>,
}

impl Multi {
    pub fn new(id: NodeId) -> Multi {
        Multi {
            id,
            groups: BTreeMap::new(),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Takes a core for `group`, replacing the one held before (if any).
    pub fn insert(&mut self, group: GroupId, raft: Raft) -> Option<Raft> {
        assert_eq!(raft.id(), self.id, "a core of this node");
        self.groups.insert(group, raft)
    }

    pub fn remove(&mut self, group: GroupId) -> Option<Raft> {
        self.groups.remove(&group)
    }

    pub fn get(&self, group: GroupId) -> Option<&Raft> {
        self.groups.get(&group)
    }

    pub fn get_mut(&mut self, group: GroupId) -> Option<&mut Raft> {
        self.groups.get_mut(&group)
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups held, in id order.
    pub fn groups(&self) -> impl Iterator<Item = (GroupId, &Raft)> {
        self.groups.iter().map(|(g, r)| (*g, r))
    }

    /// One tick of the logical clock, for every group.
    pub fn tick(&mut self) {
        for r in self.groups.values_mut() {
            r.tick();
        }
    }

    /// Takes one message from the transport: a coalesced one is split
    /// and each part goes to its group's core.
    pub fn step(&mut self, m: Message) {
        for part in split(m) {
            if let Some(r) = self.groups.get_mut(&part.group) {
                r.step(part);
            }
        }
    }

    /// Every group's [`Ready`] that has anything in it.
    pub fn ready(&mut self) -> Vec<(GroupId, Ready)> {
        let mut out = Vec::new();
        for (&g, r) in &mut self.groups {
            let ready = r.ready();
            if !ready.is_empty() {
                out.push((g, ready));
            }
        }
        out
    }
}

/// The messages of many groups' [`AfterPersist`]s, heartbeats and their
/// answers gathered per destination (see [`coalesce`]).
pub fn outgoing(after: &mut [(GroupId, AfterPersist)]) -> Vec<Message> {
    let mut all = Vec::new();
    for (_, a) in after.iter_mut() {
        all.append(&mut a.messages);
    }
    coalesce(all)
}

/// Gathers the `Heartbeat`s going to one node into one [`Body::Beats`],
/// and the `HeartbeatResp`s into one [`Body::BeatsResp`], at the place of
/// the first of them; every other message keeps its order. Where only
/// one heartbeat (or answer) goes to a node it is left alone.
pub fn coalesce(msgs: Vec<Message>) -> Vec<Message> {
    let mut beats: BTreeMap<NodeId, Vec<Beat>> = BTreeMap::new();
    let mut acks: BTreeMap<NodeId, Vec<BeatAck>> = BTreeMap::new();
    for m in &msgs {
        match m.body {
            Body::Heartbeat {
                commit,
                commit_term,
                read_seq,
            } => beats.entry(m.to).or_default().push(Beat {
                group: m.group,
                term: m.term,
                commit,
                commit_term,
                read_seq,
            }),
            Body::HeartbeatResp { read_seq, epoch } => {
                acks.entry(m.to).or_default().push(BeatAck {
                    group: m.group,
                    term: m.term,
                    read_seq,
                    epoch,
                })
            }
            _ => {}
        }
    }
    beats.retain(|_, v| v.len() > 1);
    acks.retain(|_, v| v.len() > 1);
    if beats.is_empty() && acks.is_empty() {
        return msgs;
    }
    // Where heartbeats (answers) to a node are merged: the first of them
    // becomes the merged message, the others go.
    let merged_beats: BTreeSet<NodeId> = crate::maps::set_of(beats.keys().copied());
    let merged_acks: BTreeSet<NodeId> = crate::maps::set_of(acks.keys().copied());
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let body = match m.body {
            Body::Heartbeat { .. } if merged_beats.contains(&m.to) => {
                beats.remove(&m.to).map(|beats| Body::Beats { beats })
            }
            Body::HeartbeatResp { .. } if merged_acks.contains(&m.to) => {
                acks.remove(&m.to).map(|acks| Body::BeatsResp { acks })
            }
            _ => {
                out.push(m);
                continue;
            }
        };
        if let Some(body) = body {
            out.push(Message {
                group: CONTROL_GROUP,
                from: m.from,
                to: m.to,
                term: 0,
                body,
            });
        }
    }
    out
}

/// A coalesced message back into the per-group messages it carries;
/// any other message as it is.
pub fn split(m: Message) -> Vec<Message> {
    match m.body {
        Body::Beats { beats } => beats
            .into_iter()
            .map(|b| Message {
                group: b.group,
                from: m.from,
                to: m.to,
                term: b.term,
                body: Body::Heartbeat {
                    commit: b.commit,
                    commit_term: b.commit_term,
                    read_seq: b.read_seq,
                },
            })
            .collect(),
        Body::BeatsResp { acks } => acks
            .into_iter()
            .map(|a| Message {
                group: a.group,
                from: m.from,
                to: m.to,
                term: a.term,
                body: Body::HeartbeatResp {
                    read_seq: a.read_seq,
                    epoch: a.epoch,
                },
            })
            .collect(),
        _ => vec![m],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::raft::{Config, Role};
    use crate::cluster::raft_msg::{self, HardState, Snapshot};
    use crate::storage::record;

    /// Three nodes holding `groups` groups each (ids 1..=groups), on a
    /// network that delivers everything at the next tick. Counts what
    /// crosses it.
    struct Net {
        nodes: Vec<Multi>,
        wire: Vec<Message>,
        /// Per tick: (from, to, kind) -> messages, and bytes of every
        /// message.
        sent: Vec<BTreeMap<(NodeId, NodeId, &'static str), u64>>,
        bytes: Vec<u64>,
        beat_bytes: Vec<u64>,
    }

    impl Net {
        fn new(groups: u64) -> Net {
            let members = vec![1, 2, 3];
            let nodes = members
                .iter()
                .map(|&id| {
                    let mut m = Multi::new(id);
                    for g in 1..=groups {
                        let mut cfg = Config::new(id, members.clone());
                        cfg.group = g;
                        cfg.seed = crate::rand::splitmix64(&mut (g << 8 | id));
                        let r = Raft::new(cfg, HardState::default(), Snapshot::default(), vec![]);
                        m.insert(g, r);
                    }
                    m
                })
                .collect();
            Net {
                nodes,
                wire: Vec::new(),
                sent: Vec::new(),
                bytes: Vec::new(),
                beat_bytes: Vec::new(),
            }
        }

        /// Runs every node's Ready rounds until all are quiet, putting
        /// what they send on the wire.
        fn drain(&mut self) {
            loop {
                let mut any = false;
                for n in &mut self.nodes {
                    let mut after: Vec<(GroupId, AfterPersist)> = n
                        .ready()
                        .into_iter()
                        .map(|(g, r)| (g, r.persisted()))
                        .collect();
                    any |= !after.is_empty();
                    self.wire.extend(outgoing(&mut after));
                }
                if !any {
                    return;
                }
            }
        }

        /// One tick everywhere, then delivery of everything sent (and of
        /// everything sent in answer) within the tick.
        fn tick(&mut self) {
            let mut sent = BTreeMap::new();
            let (mut bytes, mut beat_bytes) = (0, 0);
            for n in &mut self.nodes {
                n.tick();
            }
            self.drain();
            while !self.wire.is_empty() {
                for m in std::mem::take(&mut self.wire) {
                    let mut frame = Vec::new();
                    let start = record::begin(&mut frame);
                    raft_msg::encode(&mut frame, &m);
                    record::finish(&mut frame, start);
                    bytes += frame.len() as u64;
                    if let Body::Beats { beats } = &m.body {
                        // The frame head, the message head, tag and count.
                        let mut count = Vec::new();
                        raft_msg::put_varint(&mut count, beats.len() as u64);
                        beat_bytes += frame.len() as u64
                            - record::HEAD_BYTES as u64
                            - 25
                            - count.len() as u64;
                    }
                    *sent.entry((m.from, m.to, m.body.name())).or_insert(0) += 1;
                    let back = raft_msg::decode(&frame[record::HEAD_BYTES..]).unwrap();
                    assert_eq!(back, m);
                    self.nodes[(m.to - 1) as usize].step(back);
                }
                self.drain();
            }
            self.sent.push(sent);
            self.bytes.push(bytes);
            self.beat_bytes.push(beat_bytes);
        }

        fn leaders(&self) -> BTreeMap<GroupId, Vec<NodeId>> {
            let mut out: BTreeMap<GroupId, Vec<NodeId>> = BTreeMap::new();
            for n in &self.nodes {
                for (g, r) in n.groups() {
                    if r.role() == Role::Leader {
                        out.entry(g).or_default().push(n.id());
                    }
                }
            }
            out
        }

        fn settle(&mut self, groups: u64) {
            for _ in 0..200 {
                self.tick();
                if self.leaders().len() as u64 == groups {
                    break;
                }
            }
            let leaders = self.leaders();
            assert_eq!(leaders.len() as u64, groups, "every group elects");
            assert!(leaders.values().all(|l| l.len() == 1));
            // The rounds that follow elections (commits of the no-ops).
            for _ in 0..4 {
                self.tick();
            }
            self.sent.clear();
            self.bytes.clear();
            self.beat_bytes.clear();
        }
    }

    #[test]
    fn every_group_elects_and_commits_under_one_tick() {
        let mut net = Net::new(40);
        net.settle(40);
        for (g, l) in net.leaders() {
            let n = &mut net.nodes[(l[0] - 1) as usize];
            n.get_mut(g)
                .unwrap()
                .propose(g.to_le_bytes().to_vec())
                .unwrap();
        }
        for _ in 0..4 {
            net.tick();
        }
        for n in &net.nodes {
            for (g, r) in n.groups() {
                let last = r.entries().last().unwrap();
                assert_eq!(last.data, g.to_le_bytes(), "group {g} at node {}", n.id());
                assert_eq!(r.commit(), last.index, "group {g} at node {}", n.id());
            }
        }
    }

    #[test]
    fn idle_groups_cost_one_message_per_node_pair_per_tick() {
        let groups = 300;
        let mut net = Net::new(groups);
        net.settle(groups);
        let ticks = 40;
        for _ in 0..ticks {
            net.tick();
        }
        for (t, sent) in net.sent.iter().enumerate() {
            for (&(from, to, kind), &n) in sent {
                assert!(
                    matches!(kind, "Beats" | "BeatsResp"),
                    "tick {t}: {kind} from {from} to {to}"
                );
                assert!(n <= 1, "tick {t}: {n} {kind} from {from} to {to}");
            }
        }
        // Without coalescing: a heartbeat and its answer per group and
        // follower every heartbeat round.
        let plain = groups * 2 * 2 * ticks / HEARTBEAT_TICKS as u64;
        let messages: u64 = net.sent.iter().flat_map(|s| s.values()).sum();
        assert!(
            messages * 50 <= plain,
            "{messages} messages, {plain} uncoalesced"
        );
    }

    #[test]
    fn an_idle_group_costs_what_the_constants_say() {
        // Group ids, terms and commit indexes below 128: one byte each.
        let groups = 100;
        let mut net = Net::new(groups);
        net.settle(groups);
        let secs = 5;
        let ticks = secs * 1_000 / TICK_MS;
        for _ in 0..ticks {
            net.tick();
        }
        let beat_bytes: u64 = net.beat_bytes.iter().sum();
        let all: u64 = net.bytes.iter().sum();
        // Two followers per group.
        let per_group_follower = beat_bytes / (groups * 2 * secs);
        assert_eq!(beat_bytes % (groups * 2 * secs), 0);
        assert_eq!(per_group_follower, idle_group_bytes_per_sec().0);
        let (down, up) = idle_group_bytes_per_sec();
        assert_eq!((down, up), (50, 40));
        // Everything on the wire, frames included, stays within the two
        // directions' cost plus the fixed cost of the carrying messages:
        // at most a Beats and a BeatsResp a tick per ordered node pair.
        let carriers = 6 * 2 * ticks * (record::HEAD_BYTES as u64 + 25 + 2);
        let payload = (down + up) * groups * 2 * secs;
        assert!(all <= payload + carriers, "{all} > {payload} + {carriers}");
        assert!(all >= payload, "{all} < {payload}");
        println!(
            "{groups} idle groups on 3 nodes: {} bytes/s per ordered node pair on the wire, \
             {:.1} per group (beats {down} B/s down, answers {up} B/s up per follower)",
            all / secs / 6,
            all as f64 / secs as f64 / 6.0 / groups as f64
        );
    }

    #[test]
    fn a_lone_heartbeat_is_left_as_it_is() {
        let hb = |group: GroupId, to: NodeId| Message {
            group,
            from: 1,
            to,
            term: 4,
            body: Body::Heartbeat {
                commit: 9,
                commit_term: 4,
                read_seq: 1,
            },
        };
        let append = Message {
            group: 3,
            from: 1,
            to: 2,
            term: 4,
            body: Body::AppendResp {
                ok: true,
                index: 1,
                hint_index: 0,
                hint_term: 0,
                epoch: 1,
                voter: true,
            },
        };
        let msgs = vec![hb(0, 2), append.clone(), hb(0, 3), hb(5, 3)];
        let out = coalesce(msgs.clone());
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], hb(0, 2));
        assert_eq!(out[1], append);
        let Body::Beats { beats } = &out[2].body else {
            panic!("{:?}", out[2]);
        };
        assert_eq!(beats.len(), 2);
        // Split gives back exactly the heartbeats merged.
        assert_eq!(split(out[2].clone()), vec![hb(0, 3), hb(5, 3)]);
    }
}
