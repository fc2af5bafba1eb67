//! The classic cases from the Raft paper and thesis, each set up by hand
//! (init), driven message by message (act) and checked (check): a stale
//! leader, votes refused to shorter logs, Figure 8, conflicting entries
//! overwritten, fast backtracking, PreVote and CheckQuorum, snapshot
//! install, ReadIndex, forwarding, and the non-voting catch-up of a node
//! that lost its log.

use std::collections::{BTreeMap, BTreeSet};

use gombus::cluster::raft::{self, Config, ProposeError, Proposed, Raft, ReadState, Role};
use gombus::cluster::raft_msg::{Body, Entry, EntryKind, HardState, Message, NodeId, Snapshot};

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        term,
        index,
        kind: EntryKind::Command,
        data: format!("{index}@{term}").into_bytes(),
    }
}

fn config(id: NodeId, n: u64) -> Config {
    let mut c = Config::new(id, (1..=n).collect());
    c.seed = id * 7919;
    c
}

/// A hand-driven cluster: nothing moves unless a test says so.
struct Net {
    nodes: BTreeMap<NodeId, Raft>,
    cfgs: BTreeMap<NodeId, Config>,
    queue: Vec<Message>,
    cut: BTreeSet<(NodeId, NodeId)>,
    applied: BTreeMap<NodeId, Vec<Entry>>,
    reads: BTreeMap<NodeId, Vec<ReadState>>,
    restored: BTreeMap<NodeId, Snapshot>,
    /// Messages for which this returns false are dropped; it may also
    /// shorten a message (as if the leader had sent less).
    filter: Box<dyn FnMut(&mut Message) -> bool>,
}

impl Net {
    fn new(n: u64) -> Net {
        let logs = (1..=n)
            .map(|id| (id, HardState::default(), vec![]))
            .collect();
        Net::with_logs(n, logs, |_| {})
    }

    fn with_logs(
        n: u64,
        logs: Vec<(NodeId, HardState, Vec<Entry>)>,
        tune: impl Fn(&mut Config),
    ) -> Net {
        let mut net = Net {
            nodes: BTreeMap::new(),
            cfgs: BTreeMap::new(),
            queue: Vec::new(),
            cut: BTreeSet::new(),
            applied: BTreeMap::new(),
            reads: BTreeMap::new(),
            restored: BTreeMap::new(),
            filter: Box::new(|_| true),
        };
        for (id, hs, entries) in logs {
            let mut cfg = config(id, n);
            tune(&mut cfg);
            net.cfgs.insert(id, cfg.clone());
            net.nodes
                .insert(id, Raft::new(cfg, hs, Snapshot::default(), entries));
        }
        net.settle();
        net
    }

    fn node(&self, id: NodeId) -> &Raft {
        &self.nodes[&id]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Raft {
        self.nodes.get_mut(&id).unwrap()
    }

    /// Collects every node's Ready (as if persisted) into the queue.
    fn collect(&mut self) {
        for (id, r) in self.nodes.iter_mut() {
            let ready = r.ready();
            let after = ready.persisted();
            self.queue.extend(after.messages);
            if let Some(s) = after.restore {
                self.restored.insert(*id, s);
            }
            self.applied.entry(*id).or_default().extend(after.committed);
            self.reads.entry(*id).or_default().extend(after.reads);
        }
    }

    /// Delivers messages (and what they cause) until the network is quiet.
    fn settle(&mut self) {
        for _ in 0..1000 {
            self.collect();
            if self.queue.is_empty() {
                return;
            }
            for mut m in std::mem::take(&mut self.queue) {
                if self.cut.contains(&(m.from, m.to)) || !(self.filter)(&mut m) {
                    continue;
                }
                if let Some(r) = self.nodes.get_mut(&m.to) {
                    r.step(m);
                }
            }
        }
        panic!("the network never went quiet");
    }

    fn tick(&mut self, id: NodeId, n: u32) {
        for _ in 0..n {
            self.node_mut(id).tick();
            self.settle();
        }
    }

    /// Ticks `id` alone until it leads (others stay put).
    fn elect(&mut self, id: NodeId) {
        for _ in 0..100 {
            if self.node(id).role() == Role::Leader {
                return;
            }
            self.tick(id, 1);
        }
        panic!("{} did not become leader: {}", id, self.node(id).describe());
    }

    /// Ticks `ids` in turn until one of them leads; returns it.
    fn elect_any(&mut self, ids: &[NodeId]) -> NodeId {
        for _ in 0..100 {
            for &id in ids {
                if self.node(id).role() == Role::Leader {
                    return id;
                }
                self.tick(id, 1);
            }
        }
        panic!("none of {ids:?} became leader");
    }

    fn isolate(&mut self, id: NodeId) {
        for &o in self.cfgs.keys() {
            if o != id {
                self.cut.insert((id, o));
                self.cut.insert((o, id));
            }
        }
    }

    fn heal(&mut self) {
        self.cut.clear();
    }

    /// Restarts `id` from its (durable) state: it forgets who leads.
    fn restart(&mut self, id: NodeId) {
        let r = self.node(id);
        let (hs, snap, entries) = (r.hard_state(), r.snapshot().clone(), r.entries().to_vec());
        let cfg = self.cfgs[&id].clone();
        self.nodes.insert(id, Raft::new(cfg, hs, snap, entries));
    }

    /// Starts `id` again from its state file (`hs`) with an empty log, as
    /// a node that lost its log does: a non-voter in a new epoch.
    fn restart_without_log(&mut self, id: NodeId, hs: HardState) {
        let mut cfg = self.cfgs[&id].clone();
        cfg.voter = false;
        self.cfgs.insert(id, cfg.clone());
        self.nodes
            .insert(id, Raft::new(cfg, hs, Snapshot::default(), vec![]));
        self.applied.remove(&id);
    }

    /// Ticks every node, one tick each in turn, until `id` votes or
    /// `ticks` rounds went by.
    fn tick_until_voter(&mut self, id: NodeId, ticks: u32) {
        let ids: Vec<NodeId> = self.cfgs.keys().copied().collect();
        for _ in 0..ticks {
            if self.node(id).is_voter() {
                return;
            }
            for &n in &ids {
                self.tick(n, 1);
            }
        }
    }

    fn propose(&mut self, id: NodeId, data: &str) -> Result<Proposed, ProposeError> {
        let r = self.node_mut(id).propose(data.as_bytes().to_vec());
        self.settle();
        r
    }

    fn applied_data(&self, id: NodeId) -> Vec<String> {
        self.applied[&id]
            .iter()
            .filter(|e| e.kind == EntryKind::Command)
            .map(|e| String::from_utf8_lossy(&e.data).into_owned())
            .collect()
    }
}

fn hs(term: u64) -> HardState {
    HardState {
        term,
        vote: None,
        epoch: 0,
    }
}

/// Raft §5.1/§5.3: a leader cut off from the rest is replaced; when it
/// comes back it steps down at the first message of the newer term, and
/// what it appended alone is overwritten.
#[test]
fn stale_leader_steps_down_and_loses_its_uncommitted_entries() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    net.tick(1, raft::HEARTBEAT_TICKS);
    assert_eq!(net.applied_data(2), ["a"]);

    net.isolate(1);
    net.propose(1, "lost").unwrap();
    let l = net.elect_any(&[2, 3]);
    assert_eq!(net.node(1).role(), Role::Leader, "1 has not noticed yet");
    assert!(net.node(l).term() > net.node(1).term());
    net.propose(l, "b").unwrap();

    net.heal();
    net.tick(1, raft::HEARTBEAT_TICKS);
    net.tick(l, raft::HEARTBEAT_TICKS);
    assert_eq!(net.node(1).role(), Role::Follower);
    assert_eq!(net.node(1).leader(), Some(l));
    net.tick(l, raft::HEARTBEAT_TICKS);
    assert_eq!(net.applied_data(1), ["a", "b"]);
    assert!(!net.node(1).entries().iter().any(|e| e.data == b"lost"));
}

/// Raft §5.4.1: a vote is refused to a candidate whose log is less up to
/// date (older last term, or same last term and shorter); a granted vote
/// is in the Ready's hard state, ahead of the answer that depends on it.
#[test]
fn votes_for_shorter_or_older_logs_are_refused() {
    let log = vec![entry(1, 1), entry(2, 2), entry(3, 2)];
    let ask = |last_index: u64, last_term: u64| {
        let mut r = Raft::new(config(1, 3), hs(2), Snapshot::default(), log.clone());
        let _ = r.ready();
        r.step(Message {
            group: 0,
            from: 2,
            to: 1,
            term: 3,
            body: Body::Vote {
                last_index,
                last_term,
            },
        });
        let ready = r.ready();
        let vote = ready.hard_state.and_then(|h| h.vote);
        let after = ready.persisted();
        let granted = after
            .messages
            .iter()
            .any(|m| m.body == Body::VoteResp { granted: true });
        assert_eq!(
            vote.is_some(),
            granted,
            "the vote is persisted with the grant"
        );
        granted
    };
    assert!(!ask(2, 2), "same last term, shorter log");
    assert!(!ask(9, 1), "longer log, older last term");
    assert!(ask(3, 2), "same log");
    assert!(ask(4, 2), "longer log, same last term");
    assert!(ask(1, 3), "newer last term");

    // One vote per term: a second candidate of the same term is refused.
    // (The node already is in that term: only the vote makes it dirty.)
    let mut r = Raft::new(config(1, 3), hs(3), Snapshot::default(), log);
    let _ = r.ready();
    for from in [2, 3] {
        r.step(Message {
            group: 0,
            from,
            to: 1,
            term: 3,
            body: Body::Vote {
                last_index: 5,
                last_term: 3,
            },
        });
    }
    let ready = r.ready();
    assert_eq!(ready.hard_state.map(|h| h.vote), Some(Some(2)));
    let answers: Vec<bool> = ready
        .persisted()
        .messages
        .iter()
        .filter_map(|m| match m.body {
            Body::VoteResp { granted } => Some(granted),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [true, false]);
    assert_eq!(r.vote(), Some(2));
}

/// Raft Figure 8: an entry of an older term stored on a majority is not
/// committed by counting replicas, because a node with a newer last term
/// can still be elected and overwrite it.
#[test]
fn figure_8_old_term_entries_commit_only_under_the_current_term() {
    // (b)→(c): S1 led term 2 and stored index 2 on S1, S2; S5 led term 3
    // and stored a different index 2 on itself only.
    let logs = vec![
        (1, hs(3), vec![entry(1, 1), entry(2, 2)]),
        (2, hs(3), vec![entry(1, 1), entry(2, 2)]),
        (3, hs(3), vec![entry(1, 1)]),
        (4, hs(3), vec![entry(1, 1)]),
        (5, hs(3), vec![entry(1, 1), entry(2, 3)]),
    ];
    let mut net = Net::with_logs(5, logs, |c| c.append_entries_max = 1);
    net.isolate(5);
    net.cut.insert((1, 2));
    // S1 becomes leader of term 4 and copies index 2 (term 2) to S3 and S4,
    // but its own term's no-op (index 3) never gets through.
    net.filter = Box::new(|m| {
        if let Body::Append { entries, .. } = &mut m.body {
            entries.retain(|e| e.index < 3);
        }
        true
    });
    net.elect(1);
    assert_eq!(net.node(1).term(), 4);
    net.tick(1, 2 * raft::HEARTBEAT_TICKS);
    assert_eq!(net.node(3).term_at(2), Some(2));
    assert_eq!(net.node(4).term_at(2), Some(2));
    assert!(
        net.node(1).commit() < 2,
        "index 2 (term 2) is on S1, S3, S4, a majority, but must not commit"
    );

    // (d): S1 crashes; S5 (last term 3) can win and overwrite index 2.
    net.nodes.remove(&1);
    net.cfgs.remove(&1);
    net.filter = Box::new(|_| true);
    net.heal();
    for id in [2, 3, 4] {
        net.restart(id);
    }
    net.restart(5);
    net.elect(5);
    net.tick(5, 3 * raft::HEARTBEAT_TICKS);
    for id in [2, 3, 4] {
        assert_eq!(net.node(id).term_at(2), Some(3), "S{id} took S5's index 2");
    }
    assert_eq!(
        net.applied[&3].iter().map(|e| e.term).collect::<Vec<_>>()[..2],
        [1, 3]
    );
}

/// Raft §5.3: a follower's conflicting uncommitted entries are dropped,
/// with everything after them, and the leader's take their place.
#[test]
fn conflicting_uncommitted_entries_are_overwritten() {
    let log = vec![entry(1, 1), entry(2, 1), entry(3, 2), entry(4, 2)];
    let mut r = Raft::new(config(2, 3), hs(2), Snapshot::default(), log);
    let _ = r.ready();
    r.step(Message {
        group: 0,
        from: 1,
        to: 2,
        term: 3,
        body: Body::Append {
            prev_index: 2,
            prev_term: 1,
            entries: vec![entry(3, 3)],
            commit: 2,
            epoch: 0,
        },
    });
    let ready = r.ready();
    assert_eq!(
        ready.entries,
        Some((3, vec![entry(3, 3)])),
        "truncate at 3, store the new 3"
    );
    let after = ready.persisted();
    assert_eq!(after.committed, vec![entry(1, 1), entry(2, 1)]);
    assert_eq!(r.last_index(), 3);
    assert_eq!(r.term_at(3), Some(3));
    let ok = after.messages.iter().any(|m| {
        matches!(
            m.body,
            Body::AppendResp {
                ok: true,
                index: 3,
                ..
            }
        )
    });
    assert!(ok);

    // A stale, shorter Append does not cut what already matches.
    r.step(Message {
        group: 0,
        from: 1,
        to: 2,
        term: 3,
        body: Body::Append {
            prev_index: 1,
            prev_term: 1,
            entries: vec![entry(2, 1)],
            commit: 2,
            epoch: 0,
        },
    });
    assert_eq!(r.ready().entries, None);
    assert_eq!(r.last_index(), 3);
}

/// Fast backtracking by term: a follower with a long run of conflicting
/// entries is repaired in a few round trips, not one per entry.
#[test]
fn backtracking_skips_a_whole_conflicting_term_at_once() {
    let mut leader_log: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    leader_log.extend((11..=60).map(|i| entry(i, 3)));
    let mut follower_log: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    follower_log.extend((11..=80).map(|i| entry(i, 2)));
    let logs = vec![
        (1, hs(3), leader_log),
        (2, hs(3), follower_log),
        (3, hs(3), (1..=10).map(|i| entry(i, 1)).collect()),
    ];
    let mut net = Net::with_logs(3, logs, |_| {});
    net.isolate(2);
    net.elect(1);
    net.heal();
    let refusals = std::rc::Rc::new(std::cell::Cell::new(0));
    let count = refusals.clone();
    net.filter = Box::new(move |m| {
        if matches!(m.body, Body::AppendResp { ok: false, .. }) {
            count.set(count.get() + 1);
        }
        true
    });
    net.tick(1, 2 * raft::HEARTBEAT_TICKS);
    assert_eq!(net.node(2).last_index(), 61);
    assert_eq!(net.node(2).term_at(61), Some(4));
    assert_eq!(net.node(2).term_at(11), Some(3));
    assert!(refusals.get() <= 2, "{} refusals", refusals.get());
}

/// Thesis §9.6: a node cut off from a healthy cluster keeps timing out,
/// but PreVote keeps its term down and the lease keeps it from deposing
/// the leader when it rejoins.
#[test]
fn a_rejoining_partitioned_node_does_not_disrupt_the_leader() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    let term = net.node(1).term();
    net.isolate(3);
    net.tick(3, 10 * raft::ELECTION_TICKS);
    assert_eq!(net.node(3).term(), term, "PreVote keeps the term");
    assert_ne!(net.node(3).role(), Role::Leader);
    net.heal();
    for _ in 0..raft::ELECTION_TICKS {
        net.tick(1, 1);
        net.tick(2, 1);
        net.tick(3, 1);
    }
    assert_eq!(net.node(1).role(), Role::Leader);
    assert_eq!(net.node(1).term(), term);
    assert_eq!(net.node(3).leader(), Some(1));
    assert_eq!(net.applied_data(3), ["a"]);
}

/// Even when the isolated node's term has grown (it had no PreVote
/// partner to stop it), a follower in its leader's lease ignores its
/// vote requests.
#[test]
fn a_vote_request_inside_the_lease_is_ignored() {
    let mut net = Net::new(3);
    net.elect(1);
    let term = net.node(1).term();
    net.node_mut(2).step(Message {
        group: 0,
        from: 3,
        to: 2,
        term: term + 5,
        body: Body::Vote {
            last_index: 100,
            last_term: term + 4,
        },
    });
    assert_eq!(net.node(2).term(), term);
    assert_eq!(net.node(2).vote(), Some(1));
    assert!(net.node_mut(2).ready().persisted().messages.is_empty());
}

/// Thesis §6.2 (CheckQuorum): a leader that hears from no majority for an
/// election timeout steps down, and stops taking proposals.
#[test]
fn a_leader_without_quorum_steps_down() {
    let mut net = Net::new(5);
    net.elect(1);
    net.isolate(1);
    net.tick(1, 2 * raft::ELECTION_TICKS);
    assert_eq!(net.node(1).role(), Role::Follower);
    assert_eq!(net.node(1).leader(), None);
    assert_eq!(net.propose(1, "x"), Err(ProposeError::NotLeader(None)));
}

/// Raft §7: a follower too far behind receives the leader's snapshot,
/// restores it, and then follows the log from there.
#[test]
fn a_lagging_follower_is_sent_a_snapshot() {
    let mut net = Net::with_logs(3, (1..=3).map(|id| (id, hs(0), vec![])).collect(), |c| {
        c.snapshot_entries = 10
    });
    net.elect(1);
    net.isolate(3);
    for i in 0..30 {
        net.propose(1, &format!("c{i}")).unwrap();
    }
    net.tick(1, raft::HEARTBEAT_TICKS);
    let applied = net.node(1).applied();
    net.node_mut(1).compact(applied, b"state at 31".to_vec());
    assert_eq!(net.node(1).snapshot().index, applied);
    assert!(net.node(1).entries().is_empty());

    net.heal();
    net.tick(1, 2 * raft::HEARTBEAT_TICKS);
    let restored = &net.restored[&3];
    assert_eq!(restored.index, applied);
    assert_eq!(restored.data, b"state at 31");
    assert_eq!(net.node(3).snapshot().index, applied);

    net.propose(1, "after").unwrap();
    net.tick(1, raft::HEARTBEAT_TICKS);
    assert_eq!(net.applied_data(3), ["after"]);
    assert_eq!(net.node(3).commit(), net.node(1).commit());
}

/// Thesis §6.4: a read point is handed out only after a majority has
/// confirmed the leader is still the leader; a deposed leader never gives
/// one.
#[test]
fn read_index_needs_a_majority_heartbeat() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    let commit = net.node(1).commit();
    net.node_mut(1).read_index(7).unwrap();
    net.settle();
    assert_eq!(
        net.reads[&1],
        [ReadState {
            ctx: 7,
            index: commit
        }]
    );

    net.isolate(1);
    net.node_mut(1).read_index(8).unwrap();
    net.settle();
    net.tick(1, 2 * raft::ELECTION_TICKS);
    assert_eq!(net.reads[&1].len(), 1, "no read without a majority");
    assert_eq!(
        net.node_mut(2).read_index(9),
        Err(ProposeError::NotLeader(Some(1)))
    );
}

/// A follower forwards a proposal to the leader and learns where it
/// landed; with forwarding off, it answers "not leader, leader is X".
#[test]
fn proposals_at_a_follower_are_forwarded_or_refused_with_the_leader() {
    let mut net = Net::new(3);
    net.elect(1);
    let r = net.propose(2, "fwd").unwrap();
    assert!(matches!(r, Proposed::Forwarded { .. }));
    net.tick(1, raft::HEARTBEAT_TICKS);
    assert_eq!(net.applied_data(1), ["fwd"]);
    assert_eq!(net.applied_data(2), ["fwd"]);

    let mut net = Net::with_logs(3, (1..=3).map(|id| (id, hs(0), vec![])).collect(), |c| {
        c.forward_proposals = false
    });
    net.elect(1);
    let e = net.propose(3, "x").unwrap_err();
    assert_eq!(e, ProposeError::NotLeader(Some(1)));
    assert_eq!(e.to_string(), "not leader, leader is 1");
}

/// A node that restarts without its log (memory log, term already > 0)
/// neither votes nor campaigns until it holds the leader's commit index.
#[test]
fn a_node_that_lost_its_log_votes_only_after_catching_up() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    net.tick(1, raft::HEARTBEAT_TICKS);
    let old = net.node(3).hard_state();
    assert!(!raft::starts_as_voter(true, true, &old, true));
    assert!(
        raft::starts_as_voter(true, false, &old, true),
        "durable: nothing lost"
    );
    assert!(
        raft::starts_as_voter(true, true, &HardState::default(), true),
        "fresh bootstrap"
    );
    assert!(!raft::starts_as_voter(
        false,
        false,
        &HardState::default(),
        true
    ));

    net.restart_without_log(3, old);
    net.isolate(3);
    net.tick(3, 10 * raft::ELECTION_TICKS);
    assert_eq!(
        net.node(3).role(),
        Role::Follower,
        "a non-voter never campaigns"
    );
    let vote_ask = Message {
        group: 0,
        from: 2,
        to: 3,
        term: old.term + 1,
        body: Body::Vote {
            last_index: 0,
            last_term: 0,
        },
    };
    net.node_mut(3).step(vote_ask);
    assert_eq!(net.node(3).vote(), None, "a non-voter never votes");
    let _ = net.node_mut(3).ready();

    // Its answer to that request raised its term, so the old leader steps
    // down when they meet again; the cluster re-elects among 1 and 2 and
    // catches 3 up, after which it votes again.
    net.heal();
    net.tick_until_voter(3, 20 * raft::ELECTION_TICKS);
    assert!(
        net.node(3).is_voter(),
        "caught up: {}",
        net.node(3).describe()
    );
    let leader = net.node(3).leader().unwrap();
    assert_ne!(leader, 3);
    assert_eq!(net.node(3).commit(), net.node(leader).commit());
    assert_eq!(net.applied_data(3), ["a"]);
}

/// A node that loses its log after the leader last heard it match (its
/// store found damaged once it had answered the leader's first Append of
/// this life) is caught up with nothing proposed: its heartbeat answers
/// carry its new life's epoch, and the leader, learning of the new life,
/// probes it again rather than trusting what the old life acked.
#[test]
fn a_node_that_loses_its_log_between_heartbeats_is_caught_up_without_a_proposal() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    net.tick(1, raft::HEARTBEAT_TICKS);
    assert_eq!(net.applied_data(3), ["a"]);
    let old = net.node(3).hard_state();
    net.restart_without_log(3, old);
    net.tick_until_voter(3, 4 * raft::ELECTION_TICKS);
    assert!(
        net.node(3).is_voter(),
        "caught up and voting again: {}",
        net.node(3).describe()
    );
    assert_eq!(net.node(3).leader(), Some(1), "the leader did not change");
    assert_eq!(net.applied_data(3), ["a"]);
}

/// An Append whose entries do not follow its `prev_index` one by one is
/// dropped whole, not half applied (and does not bring the node down).
#[test]
fn a_malformed_append_is_dropped() {
    let mut r = Raft::new(config(2, 3), hs(2), Snapshot::default(), vec![entry(1, 1)]);
    let _ = r.ready();
    for entries in [
        vec![entry(3, 2)],
        vec![entry(2, 2), entry(4, 2)],
        vec![entry(u64::MAX, 2)],
    ] {
        r.step(Message {
            group: 0,
            from: 1,
            to: 2,
            term: 2,
            body: Body::Append {
                prev_index: 1,
                prev_term: 1,
                entries,
                commit: 1,
                epoch: 0,
            },
        });
        assert_eq!(r.last_index(), 1);
        assert!(r.ready().entries.is_none());
    }
}

/// Every follower learns of a commit within a round trip, without waiting
/// for the next heartbeat: also the one whose ack comes after the entry
/// was committed with another follower's.
#[test]
fn every_follower_learns_a_commit_without_a_tick() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "x").unwrap();
    // No tick since the proposal: only the messages it caused have run.
    for id in 1..=3 {
        assert_eq!(net.applied_data(id), ["x"], "node {id}");
    }
}

// ---- membership changes ----

use gombus::cluster::raft::{ChangeError, ChangeState};

/// Adds a node that starts empty and knows no members, as a joining node
/// does: it learns the configuration from the leader.
fn join(net: &mut Net, id: NodeId) {
    let mut cfg = Config::new(id, vec![]);
    cfg.voter = false;
    cfg.seed = id * 7919;
    net.cfgs.insert(id, cfg.clone());
    net.nodes.insert(
        id,
        Raft::new(cfg, HardState::default(), Snapshot::default(), vec![]),
    );
}

fn voters(net: &Net, id: NodeId) -> Vec<NodeId> {
    net.node(id).configuration().voter_ids()
}

#[test]
fn a_learner_catches_up_without_stalling_commits_then_is_promoted() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    let at = net.node_mut(1).propose_add(4, b"addr-4".to_vec()).unwrap();
    net.settle();
    assert!(net.node(1).commit() >= at, "the add commits without node 4");
    assert_eq!(net.node(1).change_state(), ChangeState::CatchingUp(4));
    let m = net.node(1).configuration().get(4).unwrap().clone();
    assert!(!m.voter);
    assert_eq!(m.data, b"addr-4");
    // Node 4 is not there yet: commits go on with the three voters.
    net.propose(1, "b").unwrap();
    assert_eq!(net.applied_data(2), vec!["a", "b"]);
    // One change at a time.
    assert_eq!(
        net.node_mut(1).propose_add(5, vec![]),
        Err(ChangeError::UnderWay)
    );
    assert_eq!(
        net.node_mut(1).propose_remove(2),
        Err(ChangeError::UnderWay)
    );
    join(&mut net, 4);
    net.tick(1, 2);
    assert_eq!(voters(&net, 1), vec![1, 2, 3, 4]);
    assert_eq!(net.node(1).change_state(), ChangeState::Idle);
    assert_eq!(voters(&net, 4), vec![1, 2, 3, 4]);
    assert_eq!(net.applied_data(4), vec!["a", "b"]);
    // Node 4 now counts: with 2 and 3 cut off, 1 and 4 are not a quorum
    // of four.
    net.isolate(2);
    net.isolate(3);
    let before = net.node(1).commit();
    net.propose(1, "c").unwrap();
    assert_eq!(net.node(1).commit(), before);
}

#[test]
fn a_learner_far_behind_gets_the_snapshot_with_the_configuration() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node_mut(1).propose_add(4, b"four".to_vec()).unwrap();
    for k in 0..5 {
        net.propose(1, &format!("x{k}")).unwrap();
    }
    let applied = net.node(1).applied();
    net.node_mut(1).compact(applied, b"state".to_vec());
    net.settle();
    assert!(net.node(1).snapshot_config().is_some_and(|c| c.contains(4)));
    join(&mut net, 4);
    net.tick(1, 2);
    assert_eq!(net.restored[&4].data, b"state");
    assert_eq!(voters(&net, 4), vec![1, 2, 3, 4]);
    assert_eq!(net.node(4).configuration().get(4).unwrap().data, b"four");
}

#[test]
fn a_removed_follower_stops_campaigning() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node_mut(1).propose_remove(3).unwrap();
    net.settle();
    assert_eq!(voters(&net, 1), vec![1, 2]);
    assert_eq!(voters(&net, 3), vec![1, 2], "node 3 heard of its removal");
    let term = net.node(3).term();
    // Whatever node 3 does, it neither leads nor disturbs the leader.
    net.tick(3, 50);
    assert_ne!(net.node(3).role(), Role::Leader);
    assert_eq!(net.node(1).role(), Role::Leader);
    assert_eq!(net.node(1).term(), term);
    // Two voters commit on their own.
    net.isolate(3);
    net.propose(1, "after").unwrap();
    assert_eq!(net.applied_data(2), vec!["after"]);
}

#[test]
fn a_leader_that_removes_itself_hands_over_and_steps_down() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    net.node_mut(1).propose_remove(1).unwrap();
    net.settle();
    // TimeoutNow: the successor campaigns at once, no timeout needed.
    assert_ne!(net.node(1).role(), Role::Leader);
    let new = [2, 3]
        .into_iter()
        .find(|&id| net.node(id).role() == Role::Leader)
        .expect("a successor leads without any tick");
    assert!(net.node(new).term() > net.node(1).term() - 1);
    assert_eq!(voters(&net, new), vec![2, 3]);
    net.propose(new, "b").unwrap();
    let other = 5 - new;
    assert_eq!(net.applied_data(other), vec!["a", "b"]);
    // The removed node never campaigns.
    net.tick(1, 50);
    assert_eq!(net.node(1).role(), Role::Follower);
}

#[test]
fn a_new_leader_changes_nothing_before_an_entry_of_its_term_commits() {
    let mut net = Net::new(3);
    // No append is acknowledged: the leader's no-op stays uncommitted.
    net.filter = Box::new(|m| !matches!(m.body, Body::AppendResp { .. }));
    net.elect(1);
    assert!(net.node(1).commit() < net.node(1).last_index());
    assert_eq!(
        net.node_mut(1).propose_add(4, vec![]),
        Err(ChangeError::UnderWay)
    );
    assert_eq!(
        net.node_mut(1).propose_remove(3),
        Err(ChangeError::UnderWay)
    );
    net.filter = Box::new(|_| true);
    net.tick(1, 2);
    assert_eq!(net.node(1).commit(), net.node(1).last_index());
    assert!(net.node_mut(1).propose_remove(3).is_ok());
}

#[test]
fn bad_membership_requests_are_refused_with_their_codes() {
    let mut net = Net::new(3);
    net.elect(1);
    let dup = net.node_mut(1).propose_add(2, vec![]).unwrap_err();
    assert_eq!(
        (dup, dup.code()),
        (ChangeError::Duplicate(2), "bad_request")
    );
    let unknown = net.node_mut(1).propose_remove(9).unwrap_err();
    assert_eq!(
        (unknown, unknown.code()),
        (ChangeError::Unknown(9), "bad_request")
    );
    let follower = net.node_mut(2).propose_remove(3).unwrap_err();
    assert_eq!(
        (follower, follower.code()),
        (ChangeError::NotLeader(Some(1)), "unavailable")
    );
    assert_eq!(ChangeError::UnderWay.code(), "unavailable");
    let mut one = Net::new(1);
    one.elect(1);
    let last = one.node_mut(1).propose_remove(1).unwrap_err();
    assert_eq!((last, last.code()), (ChangeError::LastVoter, "bad_request"));
}

/// A node added while it cannot answer yet (its first probe is lost, and
/// the leader has nothing more to append) is still caught up and
/// promoted: the leader probes again, with no entries, on heartbeats.
#[test]
fn a_learner_whose_first_probe_was_lost_is_probed_again() {
    let mut net = Net::new(3);
    net.elect(1);
    net.propose(1, "a").unwrap();
    let at = net.node_mut(1).propose_add(4, b"four".to_vec()).unwrap();
    // Node 4 does not exist yet: everything sent to it is lost.
    net.settle();
    assert!(net.node(1).commit() >= at);
    join(&mut net, 4);
    // No proposal follows: only heartbeats can restart the probe.
    net.tick(1, 8);
    assert_eq!(voters(&net, 1), vec![1, 2, 3, 4]);
    assert_eq!(net.applied_data(4), vec!["a"]);
}

/// The leader promotes a non-voter only once that node says it may vote.
/// Here node 4's Appends lose their last two entries, so it stays within
/// `catch_up_entries` of the leader but never holds the leader's commit
/// index, and so may not vote yet. A leader that promoted it anyway and
/// then died would leave nodes 2 and 3 needing a vote node 4 refuses to
/// give: three of four voters, forever short of a leader.
#[test]
fn a_leader_dying_at_a_promotion_leaves_a_cluster_that_elects() {
    let mut net = Net::new(3);
    net.elect(1);
    for k in 0..4 {
        net.propose(1, &format!("a{k}")).unwrap();
    }
    net.node_mut(1).propose_add(4, b"four".to_vec()).unwrap();
    net.settle();
    net.filter = Box::new(|m| {
        if let (4, Body::Append { entries, .. }) = (m.to, &mut m.body) {
            let keep = entries.len().saturating_sub(2);
            entries.truncate(keep);
        }
        true
    });
    join(&mut net, 4);
    net.tick(1, 4 * raft::HEARTBEAT_TICKS);
    assert!(
        net.node(4).last_index() > 0 && net.node(4).last_index() < net.node(1).commit(),
        "node 4 is close behind: {}",
        net.node(4).describe()
    );
    assert!(!net.node(4).is_voter(), "{}", net.node(4).describe());
    // Whoever counts node 4 as a voter can rely on its vote.
    for id in 1..=3 {
        assert!(
            !net.node(id).configuration().is_voter(4),
            "node {id} counts node 4 before it may vote: {}",
            net.node(id).describe()
        );
    }
    // The leader dies: the others still elect one of them, which then
    // catches node 4 up and promotes it.
    net.filter = Box::new(|_| true);
    net.isolate(1);
    let new = net.elect_any(&[2, 3, 4]);
    assert_ne!(new, 4);
    net.tick(new, 4 * raft::HEARTBEAT_TICKS);
    assert_eq!(voters(&net, new), vec![1, 2, 3, 4]);
    assert!(net.node(4).is_voter(), "{}", net.node(4).describe());
    net.propose(new, "b").unwrap();
    assert_eq!(net.applied_data(4), vec!["a0", "a1", "a2", "a3", "b"]);
}

/// A non-voter that is fully caught up but has not yet seen a commit of
/// the leader's term in an Append (here it got the log by snapshot, and
/// nothing new is appended) is still promoted: the leader probes it with
/// an empty Append on heartbeats until it answers that it may vote.
#[test]
fn a_caught_up_learner_that_may_not_vote_yet_is_probed_until_it_may() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node_mut(1).propose_add(4, b"four".to_vec()).unwrap();
    for k in 0..3 {
        net.propose(1, &format!("x{k}")).unwrap();
    }
    let applied = net.node(1).applied();
    net.node_mut(1).compact(applied, b"state".to_vec());
    net.settle();
    join(&mut net, 4);
    net.tick(1, 4 * raft::HEARTBEAT_TICKS);
    assert_eq!(net.restored[&4].data, b"state");
    assert!(net.node(4).is_voter(), "{}", net.node(4).describe());
    assert_eq!(voters(&net, 1), vec![1, 2, 3, 4]);
}

/// The log's memory is bounded by bytes as well as by entries: a node
/// asks for a snapshot once the applied entries after the last one hold
/// `snapshot_bytes` of data, and the snapshot takes their bytes away.
#[test]
fn a_log_heavy_in_bytes_asks_for_a_snapshot() {
    let mut c = config(1, 1);
    c.snapshot_entries = 1_000_000;
    c.snapshot_bytes = 10_000;
    let mut node = Raft::new(c, hs(0), Snapshot::default(), vec![]);
    let mut wanted = Vec::new();
    fn step(node: &mut Raft, wanted: &mut Vec<bool>) -> Option<u64> {
        let after = node.ready().persisted();
        wanted.push(after.want_snapshot);
        after.committed.last().map(|e| e.index)
    }
    for _ in 0..4 * raft::ELECTION_TICKS {
        node.tick();
        step(&mut node, &mut wanted);
    }
    assert_eq!(node.role(), Role::Leader);
    wanted.clear();
    let mut applied = 0;
    for i in 0..4 {
        node.propose(vec![b'x'; 3_000 + i]).unwrap();
        applied = step(&mut node, &mut wanted).unwrap_or(applied);
    }
    // 12 006 bytes applied, the limit passed at the fourth entry.
    assert_eq!(wanted, [false, false, false, true]);
    node.compact(applied, b"state".to_vec());
    assert!(node.entries().is_empty());
    node.propose(vec![b'y'; 3_000]).unwrap();
    step(&mut node, &mut wanted);
    assert_eq!(
        wanted.last(),
        Some(&false),
        "the snapshot took the bytes away"
    );
}

/// A shell whose state machine was made whole at some index after the
/// core had applied past it reads the entries after that index again
/// (`Raft::applied_after`), up to the applied index, as long as the log
/// holds them.
#[test]
fn applied_entries_are_read_again_until_compacted() {
    let mut node = Raft::new(config(1, 1), hs(0), Snapshot::default(), vec![]);
    for _ in 0..4 * raft::ELECTION_TICKS {
        node.tick();
        node.ready();
    }
    assert_eq!(node.role(), Role::Leader);
    for i in 0..3u8 {
        node.propose(vec![b'a' + i]).unwrap();
    }
    // Proposed, not yet applied: nothing past the applied index.
    let first = node.applied();
    assert_eq!(node.applied_after(first).map(<[Entry]>::len), Some(0));
    let committed = node.ready().persisted().committed;
    assert_eq!(committed.len(), 3);
    let applied = node.applied();
    assert_eq!(applied, first + 3);
    let again = node.applied_after(first + 1).expect("in the log");
    let data: Vec<&[u8]> = again.iter().map(|e| e.data.as_slice()).collect();
    assert_eq!(data, [&b"b"[..], &b"c"[..]]);
    assert_eq!(again.first().map(|e| e.index), Some(first + 2));
    assert_eq!(node.applied_after(applied).map(<[Entry]>::len), Some(0));
    // Compacted past the index: no longer there to read.
    node.compact(first + 2, b"state".to_vec());
    assert!(node.applied_after(first + 1).is_none());
    let left = node.applied_after(first + 2).expect("in the log");
    assert_eq!(left.len(), 1);
}

/// What a round may apply before it is stored: only entries committed
/// and stored in an earlier round. A leader of three whose follower's
/// ack commits entry N while a new proposal N+1 waits to be written
/// hands N out at once; a group of one commits an entry in the round
/// that stores it, so that entry waits for the write.
#[test]
fn only_entries_stored_in_an_earlier_round_are_applied_before_the_write() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node_mut(1).propose(b"a".to_vec()).unwrap();
    let a = net.node(1).last_index();
    // The leader stores "a" and sends it; node 2's ack is held back.
    let sent = net.node_mut(1).ready().persisted().messages;
    let mut acks = Vec::new();
    for m in sent.into_iter().filter(|m| m.to == 2) {
        net.node_mut(2).step(m);
        acks.extend(net.node_mut(2).ready().persisted().messages);
    }
    assert!(!acks.is_empty(), "node 2 answers the append");
    let Proposed::Appended { index: b, .. } = net.node_mut(1).propose(b"b".to_vec()).unwrap()
    else {
        panic!("the leader appends");
    };
    for m in acks {
        net.node_mut(1).step(m);
    }
    let mut ready = net.node_mut(1).ready();
    assert_eq!(
        ready.entries.as_ref().map(|e| e.0),
        Some(b),
        "b is to be stored"
    );
    let early = ready.take_stored_committed();
    assert_eq!(early.iter().map(|e| e.index).collect::<Vec<_>>(), vec![a]);
    assert!(
        ready.persisted().committed.is_empty(),
        "a went out early, once"
    );

    let mut one = Net::new(1);
    one.elect(1);
    let Proposed::Appended { index: c, .. } = one.node_mut(1).propose(b"c".to_vec()).unwrap()
    else {
        panic!("the leader appends");
    };
    let mut ready = one.node_mut(1).ready();
    assert!(
        ready.take_stored_committed().is_empty(),
        "c is not stored yet"
    );
    let after = ready.persisted();
    assert_eq!(after.committed.last().map(|e| e.index), Some(c));
}

/// What a leader may send before it stores a round: its Appends, and
/// only in a round that changes neither its term nor its vote.
#[test]
fn a_leader_sends_its_appends_before_the_write_only_in_a_round_of_its_term() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node_mut(1).propose(b"a".to_vec()).unwrap();
    let mut ready = net.node_mut(1).ready();
    assert!(ready.hard_state.is_none());
    let appends = ready.take_appends();
    let to: BTreeSet<NodeId> = appends.iter().map(|m| m.to).collect();
    assert_eq!(to, BTreeSet::from([2, 3]), "{appends:?}");
    assert!(appends
        .iter()
        .all(|m| matches!(&m.body, Body::Append { entries, .. } if !entries.is_empty())));
    let rest = ready.persisted().messages;
    assert!(!rest.iter().any(|m| matches!(m.body, Body::Append { .. })));

    // A leader that learns of a later term in the round it appended
    // in: its Appends wait for the write of the new term.
    let mut net = Net::new(3);
    net.elect(1);
    let term = net.node(1).term();
    net.node_mut(1).propose(b"b".to_vec()).unwrap();
    net.node_mut(1).step(Message {
        group: 0,
        from: 2,
        to: 1,
        term: term + 1,
        body: Body::Heartbeat {
            commit: 0,
            commit_term: 0,
            read_seq: 0,
        },
    });
    let mut ready = net.node_mut(1).ready();
    assert_eq!(ready.hard_state.map(|h| h.term), Some(term + 1));
    assert!(ready.take_appends().is_empty());
    let kept = ready.persisted().messages;
    assert!(
        kept.iter().any(|m| matches!(m.body, Body::Append { .. })),
        "the old term's Appends are still sent after the write: {kept:?}"
    );
}
