//! A deterministic simulation of a Raft cluster: seeded randomness,
//! simulated time, a network that drops, delays, reorders, duplicates and
//! partitions, nodes that crash and restart from what they persisted, and
//! clients proposing and reading throughout, and (with spare nodes)
//! membership changes: adds, removes, removing the leader, a change cut
//! short by a crash or a partition. Appends are split (a follower gets
//! only a prefix of an Append's entries, so an older term's entries can
//! reach a majority without the new leader's no-op) and leaders crash
//! right after they append, the schedule that Raft's Figure 8 rule (a
//! leader commits only entries of its own term by counting) is there for.
//! Every step is followed by the safety checks; a run ends with a
//! liveness check after healing.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use gombus::cluster::raft::{self, ChangeState, Config, Proposed, Raft, Role};
use gombus::cluster::raft_log::{LogStore, MemoryLog};
use gombus::cluster::raft_msg::{
    Body, Entry, EntryKind, HardState, Membership, Message, NodeId, Snapshot,
};

/// SplitMix64 ([`gombus::rand`]): tiny, seeded, reproducible.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        gombus::rand::splitmix64(&mut self.0)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// How hostile a run is.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub drop_per_mille: u64,
    pub dup_per_mille: u64,
    /// Most extra delay of a slow message, in ms.
    pub slow_ms: u64,
    pub slow_per_mille: u64,
    /// Chaos actions (partitions, crashes) at all.
    pub chaos: bool,
    /// An Append with entries arrives with only a prefix of them (maybe
    /// none), as if the leader had sent fewer.
    pub split_per_mille: u64,
    /// A node that becomes leader, a leader that appends a proposal, or
    /// one whose commit index moves, crashes: half the time once its
    /// round is on disk and applied but before any of its messages leave,
    /// else within 40 ms (some of its Appends out, some not). It restarts
    /// 1 ms to 2 s later.
    pub doom_per_mille: u64,
}

impl Faults {
    pub fn calm() -> Faults {
        Faults {
            drop_per_mille: 0,
            dup_per_mille: 0,
            slow_ms: 0,
            slow_per_mille: 0,
            chaos: false,
            split_per_mille: 0,
            doom_per_mille: 0,
        }
    }
}

/// One node: its Raft (none while crashed), its "disk" and its state
/// machine, a list of applied commands.
pub struct Node {
    pub id: NodeId,
    pub raft: Option<Raft>,
    /// A spare that was never added has no life at all.
    pub exists: bool,
    /// One of the members the cluster was seeded with (a spare joins).
    seed_member: bool,
    state_file: HardState,
    /// The configuration stored with the snapshot.
    snap_conf: Option<Membership>,
    log: MemoryLog,
    /// Applied commands: (index, term, command id).
    pub history: Vec<(u64, u64, u64)>,
    pub applied: u64,
    next_tick: u64,
    awaiting: BTreeMap<u64, (u64, u64)>,
    forwarded: BTreeMap<u64, u64>,
    reads: BTreeMap<u64, u64>,
}

fn encode_history(h: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(h.len() * 24);
    for (i, t, c) in h {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&t.to_le_bytes());
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

fn decode_history(b: &[u8]) -> Vec<(u64, u64, u64)> {
    b.chunks_exact(24)
        .map(|c| {
            let u = |k: usize| u64::from_le_bytes(c[k..k + 8].try_into().unwrap());
            (u(0), u(8), u(16))
        })
        .collect()
}

fn cmd_of(e: &Entry) -> Option<u64> {
    match e.kind {
        EntryKind::Noop | EntryKind::Config => None,
        EntryKind::Command => Some(u64::from_le_bytes(e.data[..8].try_into().unwrap())),
    }
}

pub struct Sim {
    pub seed: u64,
    pub rng: Rng,
    pub now: u64,
    pub nodes: Vec<Node>,
    pub memory_log: bool,
    pub faults: Faults,
    pub tick_ms: u64,
    pub snapshot_entries: u64,
    net: BinaryHeap<Reverse<(u64, u64)>>,
    in_flight: BTreeMap<u64, Message>,
    msg_seq: u64,
    /// Blocked directed links (from, to).
    pub cut: BTreeSet<(NodeId, NodeId)>,
    /// Draws for splitting Appends and dooming leaders, apart from `rng`
    /// so that a run without those faults is the run it was before them.
    shake: Rng,
    /// Leaders to crash: (when, node, the term it leads).
    doomed: Vec<(u64, usize, u64)>,
    /// A leader to crash at the end of its current round, its messages
    /// unsent.
    doomed_now: Option<(usize, u64)>,
    /// Doomed leaders to restart: (when, node).
    revive: Vec<(u64, usize)>,
    /// Appends split, and leaders crashed right after appending.
    pub splits: u64,
    pub dooms: u64,
    /// Of `dooms`, leaders crashed after sending a round's Appends and
    /// before storing it.
    pub early_dooms: u64,
    // What the checks remember.
    leaders: BTreeMap<u64, NodeId>,
    pub committed: BTreeMap<u64, (u64, Option<u64>)>,
    /// For each committed index, a bound on the term it was committed in:
    /// the highest term any leader had when it was first applied.
    commit_term: BTreeMap<u64, u64>,
    cmd_index: BTreeMap<u64, u64>,
    pub acked: BTreeSet<u64>,
    next_cmd: u64,
    next_ctx: u64,
    pub reads_done: u64,
    /// (time, node, term) of every change to leader.
    pub leader_changes: Vec<(u64, NodeId, u64)>,
    pub steps: u64,
    /// Print every event (`SIM_TRACE=1` with the replay command).
    pub trace: bool,
    /// Membership changes proposed and taken, and refused.
    pub changes_taken: u64,
    pub changes_refused: u64,
}

pub type Check = Result<(), String>;

impl Sim {
    pub fn new(seed: u64, n: usize, memory_log: bool, faults: Faults) -> Sim {
        Sim::with_snapshots_every(seed, n, memory_log, faults, 40)
    }

    /// [`Sim::new`], asking for a snapshot every `entries` applied entries.
    pub fn with_snapshots_every(
        seed: u64,
        n: usize,
        memory_log: bool,
        faults: Faults,
        entries: u64,
    ) -> Sim {
        let mut rng = Rng::new(seed);
        let members: Vec<NodeId> = (1..=n as u64).collect();
        let mut nodes = Vec::new();
        for &id in &members {
            nodes.push(Node {
                id,
                raft: None,
                exists: true,
                seed_member: true,
                state_file: HardState::default(),
                snap_conf: None,
                log: MemoryLog::new(),
                history: Vec::new(),
                applied: 0,
                next_tick: rng.below(raft::TICK_MS),
                awaiting: BTreeMap::new(),
                forwarded: BTreeMap::new(),
                reads: BTreeMap::new(),
            });
        }
        let mut sim = Sim {
            seed,
            rng,
            now: 0,
            nodes,
            memory_log,
            faults,
            tick_ms: raft::TICK_MS,
            snapshot_entries: entries,
            net: BinaryHeap::new(),
            in_flight: BTreeMap::new(),
            msg_seq: 0,
            cut: BTreeSet::new(),
            shake: Rng::new(seed ^ 0xf188),
            doomed: Vec::new(),
            doomed_now: None,
            revive: Vec::new(),
            splits: 0,
            dooms: 0,
            early_dooms: 0,
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            commit_term: BTreeMap::new(),
            cmd_index: BTreeMap::new(),
            acked: BTreeSet::new(),
            next_cmd: 1,
            next_ctx: 1,
            reads_done: 0,
            leader_changes: Vec::new(),
            steps: 0,
            trace: std::env::var_os("SIM_TRACE").is_some(),
            changes_taken: 0,
            changes_refused: 0,
        };
        for i in 0..n {
            sim.start(i);
        }
        sim
    }

    /// [`Sim::new`] with `spares` more nodes that do not exist until a
    /// membership change adds them.
    pub fn with_spares(seed: u64, n: usize, spares: usize, faults: Faults) -> Sim {
        let mut sim = Sim::new(seed, n, false, faults);
        for k in 0..spares {
            sim.nodes.push(Node {
                id: (n + k + 1) as u64,
                raft: None,
                exists: false,
                seed_member: false,
                state_file: HardState::default(),
                snap_conf: None,
                log: MemoryLog::new(),
                history: Vec::new(),
                applied: 0,
                next_tick: 0,
                awaiting: BTreeMap::new(),
                forwarded: BTreeMap::new(),
                reads: BTreeMap::new(),
            });
        }
        sim
    }

    /// Every node's state, one line each.
    pub fn describe(&self) -> String {
        let lines: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match &n.raft {
                Some(r) => format!("  {}", r.describe()),
                None => format!("  node {} crashed", n.id),
            })
            .collect();
        lines.join("\n")
    }

    fn members(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The members in the current leader's configuration (every node that
    /// exists while no node leads).
    pub fn members_now(&self) -> Vec<NodeId> {
        match self.leader() {
            Some(l) => self.nodes[l].raft.as_ref().unwrap().configuration().ids(),
            None => self
                .nodes
                .iter()
                .filter(|n| n.exists)
                .map(|n| n.id)
                .collect(),
        }
    }

    /// Starts node `i` from what its disk holds.
    pub fn start(&mut self, i: usize) {
        if self.trace {
            println!(
                "{} start node {} from {:?}",
                self.now, self.nodes[i].id, self.nodes[i].state_file
            );
        }
        let members: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.seed_member)
            .map(|n| n.id)
            .collect();
        let memory = self.memory_log;
        let node = &mut self.nodes[i];
        if memory {
            node.log = MemoryLog::new();
        }
        let loaded = node.log.load().unwrap();
        let log_empty = loaded.snapshot.index == 0 && loaded.entries.is_empty();
        // A joining node knows no members: it learns them from the leader.
        let bootstrap = node.seed_member;
        let mut cfg = Config::new(node.id, if bootstrap { members } else { vec![] });
        cfg.membership = node.snap_conf.clone();
        // Every node and every life draws its own timeouts.
        let life = node.id.rotate_left(32) ^ node.state_file.epoch.rotate_left(48);
        cfg.seed = Rng::new(self.seed ^ life).next();
        cfg.snapshot_entries = self.snapshot_entries;
        cfg.inflight_max = 8;
        cfg.append_entries_max = 16;
        cfg.voter = raft::starts_as_voter(bootstrap, memory, &node.state_file, log_empty);
        node.history = decode_history(&loaded.snapshot.data);
        node.applied = loaded.snapshot.index;
        node.awaiting.clear();
        node.forwarded.clear();
        node.reads.clear();
        node.raft = Some(Raft::new(
            cfg,
            node.state_file,
            loaded.snapshot,
            loaded.entries,
        ));
        node.next_tick = self.now + 1 + self.rng.below(self.tick_ms);
    }

    pub fn crash(&mut self, i: usize) {
        if self.trace {
            println!("{} crash node {}", self.now, self.nodes[i].id);
        }
        self.nodes[i].raft = None;
    }

    pub fn alive(&self, i: usize) -> bool {
        self.nodes[i].raft.is_some()
    }

    pub fn leader(&self) -> Option<usize> {
        // The leader of the highest term among live leaders.
        (0..self.nodes.len())
            .filter_map(|i| {
                let r = self.nodes[i].raft.as_ref()?;
                (r.role() == Role::Leader).then_some((r.term(), i))
            })
            .max()
            .map(|(_, i)| i)
    }

    // ---- driving ----

    fn send(&mut self, m: Message) {
        if self.rng.chance(self.faults.drop_per_mille) {
            return;
        }
        let copies = if self.rng.chance(self.faults.dup_per_mille) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = self.rng.range(1, 8);
            if self.rng.chance(self.faults.slow_per_mille) {
                delay += self.rng.below(self.faults.slow_ms + 1);
            }
            self.msg_seq += 1;
            self.net.push(Reverse((self.now + delay, self.msg_seq)));
            let m = self.maybe_split(m.clone());
            self.in_flight.insert(self.msg_seq, m);
        }
    }

    /// With `split_per_mille`, keeps only a prefix of an Append's entries.
    fn maybe_split(&mut self, mut m: Message) -> Message {
        if let Body::Append { entries, .. } = &mut m.body {
            if !entries.is_empty() && self.shake.chance(self.faults.split_per_mille) {
                let keep = self.shake.below(entries.len() as u64) as usize;
                entries.truncate(keep);
                self.splits += 1;
            }
        }
        m
    }

    /// With `doom_per_mille`, crashes leader `i` of `term`: half the
    /// time at the end of its current round with nothing sent, else
    /// within 40 ms, among the deliveries of what it sent.
    fn maybe_doom(&mut self, i: usize, term: u64) {
        if self.shake.chance(self.faults.doom_per_mille) {
            if self.shake.chance(500) {
                self.doomed_now = Some((i, term));
            } else {
                let at = self.now + self.shake.range(1, 40);
                self.doomed.push((at, i, term));
            }
        }
    }

    /// Crashes node `i` if it still leads `term`, and restarts it 1 ms to
    /// 2 s later. Whether it crashed.
    fn doom(&mut self, i: usize, term: u64) -> bool {
        let leads = self.nodes[i]
            .raft
            .as_ref()
            .is_some_and(|r| r.role() == Role::Leader && r.term() == term);
        // A memory log forgets what it acked: as in `chaos`, only one node
        // may be catching up at a time.
        if leads && (!self.memory_log || !self.non_voter_exists()) {
            self.crash(i);
            self.dooms += 1;
            let back = self.now + self.shake.range(1, 2000);
            self.revive.push((back, i));
            return true;
        }
        false
    }

    /// Runs Ready rounds at node `i` until it is quiet, checking as it goes.
    fn process(&mut self, i: usize) -> Check {
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > 100 {
                return Err(format!("node {} never quiets down", self.nodes[i].id));
            }
            let Some(r) = self.nodes[i].raft.as_mut() else {
                return Ok(());
            };
            let mut ready = r.ready();
            if ready.is_empty() {
                return Ok(());
            }
            let snap_conf = r.snapshot_config().cloned();
            // As the Raft thread does, entries committed and stored in an
            // earlier round are applied before this round is stored; each
            // must be in this node's stored log already.
            for e in ready.take_stored_committed() {
                if !self.nodes[i].log.holds(e.index, e.term) {
                    return Err(format!(
                        "node {} applies entry {} (term {}) before storing it",
                        self.nodes[i].id, e.index, e.term
                    ));
                }
                self.apply(i, e)?;
            }
            // A leader's Appends go out before its round is stored, as
            // the Raft thread sends them. A leader doomed now sends
            // nothing, or (half the time) crashes between sending them
            // and storing them.
            let appends = ready.take_appends();
            if let Some((_, term)) = self.doomed_now.filter(|d| d.0 == i) {
                if !appends.is_empty() && self.shake.chance(500) {
                    for m in appends {
                        self.send(m);
                    }
                    self.doomed_now = None;
                    if self.doom(i, term) {
                        self.early_dooms += 1;
                        return Ok(());
                    }
                }
            } else {
                for m in appends {
                    self.send(m);
                }
            }
            let node = &mut self.nodes[i];
            // Persist first: the hard state to the state file, the rest to
            // the log (a memory log forgets it at a crash).
            if let Some(hs) = ready.hard_state {
                node.state_file = hs;
                if self.trace {
                    println!("{} node {} persist {:?}", self.now, node.id, hs);
                }
            }
            if let Some(s) = &ready.snapshot {
                node.log.save_snapshot(s).unwrap();
                node.snap_conf = snap_conf;
            }
            if let Some((first, es)) = &ready.entries {
                node.log.append(*first, es).unwrap();
            }
            let after = ready.persisted();
            if let Some(st) = after.status {
                if self.trace {
                    println!("{} node {} status {:?}", self.now, self.nodes[i].id, st);
                }
                if st.role == Role::Leader {
                    self.on_new_leader(i, st.term)?;
                }
            }
            // A leader doomed now applies this round but sends nothing.
            let doomed_now = self.doomed_now.filter(|d| d.0 == i);
            if doomed_now.is_none() {
                for m in after.messages {
                    self.send(m);
                }
            }
            if let Some(snap) = after.restore {
                self.restore(i, snap)?;
            }
            for e in after.committed {
                self.apply(i, e)?;
            }
            for f in after.forwarded {
                self.on_forwarded(i, f.seq, f.at)?;
            }
            for rs in after.reads {
                let floor = self.nodes[i].reads.remove(&rs.ctx);
                if let Some(floor) = floor {
                    if rs.index < floor {
                        return Err(format!(
                            "stale read at node {}: index {} but {floor} was applied before the read began",
                            self.nodes[i].id, rs.index
                        ));
                    }
                    self.reads_done += 1;
                }
            }
            if after.want_snapshot {
                let node = &mut self.nodes[i];
                let data = encode_history(&node.history);
                let applied = node.applied;
                if let Some(r) = node.raft.as_mut() {
                    r.compact(applied, data);
                }
            }
            self.check_log_matching(i)?;
            if let Some((_, term)) = doomed_now {
                self.doomed_now = None;
                if self.doom(i, term) {
                    return Ok(());
                }
            }
        }
    }

    fn on_new_leader(&mut self, i: usize, term: u64) -> Check {
        let id = self.nodes[i].id;
        if let Some(&other) = self.leaders.get(&term) {
            if other != id {
                return Err(format!("two leaders in term {term}: {other} and {id}"));
            }
        }
        self.leaders.insert(term, id);
        self.leader_changes.push((self.now, id, term));
        self.maybe_doom(i, term);
        let r = self.nodes[i].raft.as_ref().unwrap();
        if !r.configuration().is_voter(id) && r.configuration_index() <= r.commit() {
            return Err(format!(
                "node {id} leads term {term} though its removal committed"
            ));
        }
        // Leader completeness (§5.4): an entry committed in a term is in
        // the log of every leader of a later term. (A leader of an older
        // term can still be elected late, by delayed votes, and need not
        // hold it: it cannot commit anything.)
        let r = self.nodes[i].raft.as_ref().unwrap();
        let snap = r.snapshot().index;
        for (&index, &(t, _)) in self.committed.range(snap + 1..) {
            if self.commit_term[&index] >= term {
                continue;
            }
            if r.term_at(index) != Some(t) {
                return Err(format!(
                    "leader {id} of term {term} lacks committed entry {index} (term {t}), has {:?}",
                    r.term_at(index)
                ));
            }
        }
        Ok(())
    }

    fn restore(&mut self, i: usize, snap: Snapshot) -> Check {
        let history = decode_history(&snap.data);
        for &(index, term, cmd) in &history {
            if self.committed.get(&index) != Some(&(term, Some(cmd))) {
                return Err(format!(
                    "snapshot at {} holds an uncommitted entry {index}",
                    snap.index
                ));
            }
        }
        let node = &mut self.nodes[i];
        node.history = history;
        node.applied = snap.index;
        Ok(())
    }

    fn apply(&mut self, i: usize, e: Entry) -> Check {
        let id = self.nodes[i].id;
        if e.index != self.nodes[i].applied + 1 {
            return Err(format!(
                "node {id} applied {} after {}",
                e.index, self.nodes[i].applied
            ));
        }
        let cmd = cmd_of(&e);
        // State-machine safety: one command per index, everywhere.
        match self.committed.get(&e.index) {
            Some(&had) if had != (e.term, cmd) => {
                return Err(format!(
                    "node {id} applied {:?} at {} where {had:?} was applied",
                    (e.term, cmd),
                    e.index
                ));
            }
            Some(_) => {}
            None => {
                if let Some(c) = cmd {
                    if let Some(at) = self.cmd_index.insert(c, e.index) {
                        return Err(format!(
                            "command {c} applied twice, at {at} and {}",
                            e.index
                        ));
                    }
                }
                self.committed.insert(e.index, (e.term, cmd));
                let bound = self.leaders.keys().next_back().copied().unwrap_or(0);
                self.commit_term.insert(e.index, bound);
            }
        }
        let node = &mut self.nodes[i];
        node.applied = e.index;
        if let Some(c) = cmd {
            node.history.push((e.index, e.term, c));
        }
        if let Some((term, want)) = node.awaiting.remove(&e.index) {
            if term == e.term {
                if cmd != Some(want) {
                    return Err(format!(
                        "proposal {want} acked at {} holds {cmd:?}",
                        e.index
                    ));
                }
                self.acked.insert(want);
            }
        }
        Ok(())
    }

    fn on_forwarded(&mut self, i: usize, seq: u64, at: Option<(u64, u64)>) -> Check {
        let node = &mut self.nodes[i];
        let Some(cmd) = node.forwarded.remove(&seq) else {
            return Ok(()); // a duplicate answer
        };
        let Some((index, term)) = at else {
            return Ok(());
        };
        if index > node.applied {
            node.awaiting.insert(index, (term, cmd));
            return Ok(());
        }
        if let Some(&(_, t, c)) = node.history.iter().find(|h| h.0 == index) {
            if t == term {
                if c != cmd {
                    return Err(format!(
                        "forwarded proposal {cmd} acked at {index} holds {c}"
                    ));
                }
                self.acked.insert(cmd);
            }
        }
        Ok(())
    }

    /// Log matching (§5.3): where two logs hold an entry with the same
    /// index and term, they are identical up to it.
    fn check_log_matching(&self, i: usize) -> Check {
        let Some(a) = self.nodes[i].raft.as_ref() else {
            return Ok(());
        };
        for (j, n) in self.nodes.iter().enumerate() {
            let Some(b) = n.raft.as_ref() else { continue };
            if j == i {
                continue;
            }
            let lo = a.snapshot().index.max(b.snapshot().index) + 1;
            let hi = a.last_index().min(b.last_index());
            let mut k = hi;
            while k >= lo && a.term_at(k) != b.term_at(k) {
                k -= 1;
            }
            let (fa, fb) = (a.snapshot().index + 1, b.snapshot().index + 1);
            for x in lo..=k {
                let ea = &a.entries()[(x - fa) as usize];
                let eb = &b.entries()[(x - fb) as usize];
                if ea != eb {
                    return Err(format!(
                        "logs of {} and {} differ at {x} below matching index {k}",
                        a.id(),
                        b.id()
                    ));
                }
            }
        }
        Ok(())
    }

    /// A client proposes a new command at node `i`.
    pub fn propose(&mut self, i: usize) -> Check {
        let cmd = self.next_cmd;
        self.next_cmd += 1;
        let Some(r) = self.nodes[i].raft.as_mut() else {
            return Ok(());
        };
        let mut data = cmd.to_le_bytes().to_vec();
        data.extend_from_slice(&[0xab; 24]);
        match r.propose(data) {
            Ok(Proposed::Appended { index, term }) => {
                self.nodes[i].awaiting.insert(index, (term, cmd));
                self.maybe_doom(i, term);
            }
            Ok(Proposed::Forwarded { seq }) => {
                self.nodes[i].forwarded.insert(seq, cmd);
            }
            Err(_) => {}
        }
        self.process(i)
    }

    /// A client asks node `i` for a linearizable read point.
    pub fn read(&mut self, i: usize) -> Check {
        let floor = self.nodes.iter().map(|n| n.applied).max().unwrap_or(0);
        let ctx = self.next_ctx;
        self.next_ctx += 1;
        let Some(r) = self.nodes[i].raft.as_mut() else {
            return Ok(());
        };
        if r.read_index(ctx).is_ok() {
            self.nodes[i].reads.insert(ctx, floor);
        }
        self.process(i)
    }

    /// Advances to the next tick or delivery, whichever is first, but not
    /// past `until`. Returns false when nothing is due before `until`.
    pub fn step_until(&mut self, until: u64) -> Result<bool, String> {
        let tick = (0..self.nodes.len())
            .filter(|&i| self.alive(i))
            .map(|i| (self.nodes[i].next_tick, i))
            .min();
        let msg = self.net.peek().map(|Reverse(x)| *x);
        let tick_at = tick.map_or(u64::MAX, |t| t.0);
        let msg_at = msg.map_or(u64::MAX, |m| m.0);
        // A doomed leader's crash or its restart goes before a tick or a
        // delivery due at the same time.
        let doom = (0..self.doomed.len()).min_by_key(|&k| self.doomed[k].0);
        let doom_at = doom.map_or(u64::MAX, |k| self.doomed[k].0);
        let back = (0..self.revive.len()).min_by_key(|&k| self.revive[k].0);
        let back_at = back.map_or(u64::MAX, |k| self.revive[k].0);
        if tick_at.min(msg_at).min(doom_at).min(back_at) > until {
            self.now = until;
            return Ok(false);
        }
        self.steps += 1;
        if doom_at <= tick_at.min(msg_at).min(back_at) {
            self.now = doom_at;
            let (_, i, term) = self.doomed.swap_remove(doom.unwrap());
            self.doom(i, term);
            return Ok(true);
        }
        if back_at <= tick_at.min(msg_at) {
            self.now = back_at;
            let (_, i) = self.revive.swap_remove(back.unwrap());
            if !self.alive(i) && self.nodes[i].exists {
                self.start(i);
                self.process(i)?;
            }
            return Ok(true);
        }
        if msg_at < tick_at {
            self.now = msg_at;
            self.net.pop();
            let m = self.in_flight.remove(&msg.unwrap().1).unwrap();
            let to = (m.to - 1) as usize;
            if self.cut.contains(&(m.from, m.to)) || !self.alive(to) {
                return Ok(true);
            }
            if self.trace {
                println!("{} deliver {:?}", self.now, m);
            }
            let r = self.nodes[to].raft.as_mut().unwrap();
            let (role, term, commit) = (r.role(), r.term(), r.commit());
            r.step(m);
            if role == Role::Leader && r.role() == role && r.term() == term && r.commit() > commit {
                self.maybe_doom(to, term);
            }
            self.process(to)?;
        } else {
            let (at, i) = tick.unwrap();
            self.now = at;
            self.nodes[i].next_tick = at + self.tick_ms;
            self.nodes[i].raft.as_mut().unwrap().tick();
            self.process(i)?;
        }
        Ok(true)
    }

    pub fn run_until(&mut self, until: u64) -> Check {
        while self.step_until(until)? {}
        Ok(())
    }

    // ---- chaos ----

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    fn isolate(&mut self, i: usize, one_way: Option<bool>) {
        let id = self.nodes[i].id;
        for other in self.members() {
            if other == id {
                continue;
            }
            match one_way {
                None => {
                    self.cut.insert((id, other));
                    self.cut.insert((other, id));
                }
                Some(true) => {
                    self.cut.insert((id, other));
                }
                Some(false) => {
                    self.cut.insert((other, id));
                }
            }
        }
    }

    fn split(&mut self) {
        let ids = self.members();
        let side: Vec<bool> = ids.iter().map(|_| self.rng.chance(500)).collect();
        for (a, &sa) in ids.iter().zip(&side) {
            for (b, &sb) in ids.iter().zip(&side) {
                if sa != sb {
                    self.cut.insert((*a, *b));
                }
            }
        }
    }

    fn non_voter_exists(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.exists && n.raft.as_ref().is_none_or(|r| !r.is_voter()))
    }

    /// One random fault or repair.
    pub fn chaos(&mut self) -> Check {
        let n = self.nodes.len();
        let i = self.rng.below(n as u64) as usize;
        match self.rng.below(13) {
            0 | 1 => self.heal(),
            10 | 11 => {
                // Crash (or cut off) whoever leads now.
                if let Some(l) = self.leader() {
                    if self.rng.chance(500) {
                        self.isolate(l, None);
                    } else if !self.memory_log || !self.non_voter_exists() {
                        self.crash(l);
                    }
                }
            }
            2 => self.isolate(i, None),
            3 => {
                let dir = self.rng.chance(500);
                self.isolate(i, Some(dir));
            }
            4 => self.split(),
            5 => {
                let (a, b) = (self.rng.range(1, n as u64), self.rng.range(1, n as u64));
                if a != b {
                    self.cut.insert((a, b));
                }
            }
            6 | 7 => {
                // Crash. A memory log loses what it acked, so there only one
                // node may be catching up at a time (more cannot be survived
                // without operator help; see docs/DESIGN.md).
                if self.alive(i) && (!self.memory_log || !self.non_voter_exists()) {
                    self.crash(i);
                }
            }
            9 => {
                // A quick bounce: crash and restart at once, so a node can
                // come back inside the election it took part in.
                if self.alive(i) && (!self.memory_log || !self.non_voter_exists()) {
                    self.crash(i);
                    self.start(i);
                    self.process(i)?;
                }
            }
            _ => {
                if !self.alive(i) && self.nodes[i].exists {
                    self.start(i);
                    self.process(i)?;
                }
            }
        }
        Ok(())
    }

    /// One random membership change at whoever leads: add a spare (which
    /// may stay down for a while, so its catch-up is cut short), remove a
    /// member, or remove the leader itself.
    pub fn change_membership(&mut self) -> Check {
        let Some(l) = self.leader() else {
            return Ok(());
        };
        let r = self.nodes[l].raft.as_ref().unwrap();
        let conf = r.configuration().ids();
        let leader_id = r.id();
        let result = match self.rng.below(3) {
            0 => {
                let Some(j) = (0..self.nodes.len()).find(|&j| !self.nodes[j].exists) else {
                    return Ok(());
                };
                let id = self.nodes[j].id;
                let data = format!("127.0.0.1:{}", 7000 + id).into_bytes();
                let r = self.nodes[l].raft.as_mut().unwrap().propose_add(id, data);
                if r.is_ok() {
                    self.nodes[j].exists = true;
                    if self.rng.chance(700) {
                        self.start(j);
                        self.process(j)?;
                    }
                }
                r
            }
            1 => {
                let others: Vec<NodeId> = conf.into_iter().filter(|&p| p != leader_id).collect();
                if others.is_empty() {
                    return Ok(());
                }
                let id = others[self.rng.below(others.len() as u64) as usize];
                self.nodes[l].raft.as_mut().unwrap().propose_remove(id)
            }
            _ => self.nodes[l]
                .raft
                .as_mut()
                .unwrap()
                .propose_remove(leader_id),
        };
        if self.trace {
            println!("{} membership change at {leader_id}: {result:?}", self.now);
        }
        match result {
            Ok(_) => self.changes_taken += 1,
            Err(_) => self.changes_refused += 1,
        }
        self.process(l)
    }
}

/// One full randomized run: chaos with clients throughout, then healing
/// and the liveness check.
pub fn run_seed(seed: u64, n: usize, memory_log: bool) -> Check {
    run(seed, n, memory_log).1
}

/// [`run_seed`] without split Appends or doomed leaders: the run a seed
/// made before those faults existed, for seeds that failed then.
pub fn run_seed_unsplit(seed: u64, n: usize, memory_log: bool) -> Check {
    run_with(seed, n, memory_log, false).1
}

/// [`run_seed`], also handing back the simulation for its figures.
pub fn run(seed: u64, n: usize, memory_log: bool) -> (Sim, Check) {
    run_with(seed, n, memory_log, true)
}

fn run_with(seed: u64, n: usize, memory_log: bool, split: bool) -> (Sim, Check) {
    let mut pick = Rng::new(seed ^ 0x5eed);
    let mut faults = Faults {
        drop_per_mille: pick.below(150),
        dup_per_mille: pick.below(50),
        slow_ms: 300,
        slow_per_mille: pick.below(100),
        chaos: true,
        split_per_mille: 0,
        doom_per_mille: 0,
    };
    let chaos_per_mille = pick.range(20, 300);
    // Split Appends and doomed leaders are drawn from their own generator,
    // so the draws above stay what they were before these faults existed.
    // Half the runs are leader storms: many Appends split and most
    // leaders crashing right after they append, and after 7 s of that
    // with the other faults, 8 s of it alone on a network that neither
    // drops nor delays (clients then at the leader). Logs left ragged by
    // the first part are settled there by split Appends and short-lived
    // leaders: an entry of an older term reaches a majority without its
    // leader's no-op while a node that never saw it holds a newer one,
    // the case of Raft's Figure 8.
    let mut storm = None;
    if split {
        let mut pick_more = Rng::new(seed ^ 0xf188eed);
        if pick_more.chance(500) {
            faults.split_per_mille = pick_more.range(200, 600);
            faults.doom_per_mille = pick_more.range(500, 1000);
            storm = Some(Faults {
                split_per_mille: faults.split_per_mille,
                doom_per_mille: faults.doom_per_mille,
                ..Faults::calm()
            });
        } else {
            faults.split_per_mille = pick_more.below(300);
            faults.doom_per_mille = pick_more.below(200);
        }
    }
    // Durable-log runs change membership too; memory-log runs keep theirs
    // (a node that forgets its log cannot safely be counted on to hold a
    // configuration change either; see docs/DESIGN.md).
    let (mut sim, changes) = if memory_log {
        (Sim::new(seed, n, memory_log, faults), 0)
    } else {
        (Sim::with_spares(seed, n, 2, faults), pick.range(20, 120))
    };
    let r = chaos_then_heal(&mut sim, chaos_per_mille, changes, storm);
    (sim, r)
}

fn chaos_then_heal(
    sim: &mut Sim,
    chaos_per_mille: u64,
    changes_per_mille: u64,
    storm: Option<Faults>,
) -> Check {
    let chaos_end = 15_000;
    let storm_from = 7_000;
    let mut storming = false;
    let mut t = 0;
    while t < chaos_end {
        t += 20;
        sim.run_until(t)?;
        if let Some(f) = storm.filter(|_| !storming && t >= storm_from) {
            sim.heal();
            sim.faults = f;
            storming = true;
            for i in 0..sim.nodes.len() {
                if !sim.alive(i) && sim.nodes[i].exists {
                    sim.start(i);
                    sim.process(i)?;
                }
            }
        }
        if sim.rng.chance(changes_per_mille) {
            sim.change_membership()?;
        }
        let n = sim.nodes.len();
        let i = sim.rng.below(n as u64) as usize;
        if storming {
            if sim.rng.chance(25) {
                if let Some(l) = sim.leader() {
                    sim.propose(l)?;
                }
            }
        } else if sim.rng.chance(600) {
            sim.propose(i)?;
        }
        if sim.rng.chance(100) {
            sim.read(i)?;
        }
        if sim.rng.chance(chaos_per_mille) && !storming {
            sim.chaos()?;
        }
    }
    liveness(sim, chaos_end)
}

/// After healing everything: a leader within 3 s, a fresh proposal applied
/// everywhere within 6 s, and every acknowledged proposal applied exactly
/// once on every node.
pub fn liveness(sim: &mut Sim, healed_at: u64) -> Check {
    sim.heal();
    sim.faults = Faults::calm();
    sim.doomed.clear();
    sim.doomed_now = None;
    for i in 0..sim.nodes.len() {
        if !sim.alive(i) && sim.nodes[i].exists {
            sim.start(i);
            sim.process(i)?;
        }
    }
    let mut t = healed_at;
    let leader = loop {
        t += 10;
        sim.run_until(t)?;
        if let Some(l) = sim.leader() {
            break l;
        }
        if t > healed_at + 3_000 {
            return Err(format!(
                "no leader within 3 s of healing:\n{}",
                sim.describe()
            ));
        }
    };
    // A fresh proposal, made again every 500 ms at whoever leads then
    // (an earlier one may be lost with a leader that steps down).
    let mut markers = BTreeSet::new();
    let mut last_try = 0;
    let _ = leader;
    loop {
        if t >= last_try + 500 {
            if let Some(l) = sim.leader() {
                last_try = t;
                markers.insert(sim.next_cmd);
                sim.propose(l)?;
            }
        }
        t += 10;
        sim.run_until(t)?;
        let members = sim.members_now();
        let done = markers.iter().any(|m| {
            sim.nodes
                .iter()
                .filter(|n| members.contains(&n.id))
                .all(|n| n.history.iter().any(|h| h.2 == *m))
        });
        if done {
            break;
        }
        if t > healed_at + 6_000 {
            return Err(format!(
                "a proposal made after healing was not applied everywhere within 6 s:\n{}",
                sim.describe()
            ));
        }
    }
    // Let every node apply up to the leader's commit index.
    // (Recomputed as it goes: an earlier marker may commit meanwhile.)
    let target = |sim: &Sim| sim.committed.keys().next_back().copied().unwrap_or(0);
    let behind = |sim: &Sim| {
        let members = sim.members_now();
        sim.nodes
            .iter()
            .any(|n| members.contains(&n.id) && n.applied < target(sim))
    };
    while behind(sim) {
        t += 10;
        sim.run_until(t)?;
        if t > healed_at + 8_000 {
            return Err("nodes did not all apply the committed log".into());
        }
    }
    // Every membership change completed (a non-voter caught up and was
    // promoted, a removal committed) or was dropped with the leader that
    // took it, and every member agrees on the configuration.
    loop {
        if let Some(l) = sim.leader() {
            let r = sim.nodes[l].raft.as_ref().unwrap();
            let conf = r.configuration().clone();
            let settled = r.change_state() == ChangeState::Idle
                && conf.ids().iter().all(|&id| {
                    sim.nodes[(id - 1) as usize].raft.as_ref().is_some_and(|m| {
                        *m.configuration() == conf && m.commit() >= r.configuration_index()
                    })
                });
            if settled {
                break;
            }
        }
        t += 10;
        sim.run_until(t)?;
        if t > healed_at + 10_000 {
            return Err(format!(
                "the membership did not settle within 10 s of healing:\n{}",
                sim.describe()
            ));
        }
    }
    // The settling above ran the cluster on: a proposal forwarded during
    // the chaos and delivered late may have committed (and been
    // acknowledged) meanwhile, so every member first applies up to the
    // commit index as it stands now.
    while behind(sim) {
        t += 10;
        sim.run_until(t)?;
        if t > healed_at + 12_000 {
            return Err(format!(
                "nodes did not all apply the committed log after the membership settled:\n{}",
                sim.describe()
            ));
        }
    }
    let members = sim.members_now();
    for n in sim.nodes.iter().filter(|n| members.contains(&n.id)) {
        let have: BTreeSet<u64> = n.history.iter().map(|h| h.2).collect();
        if have.len() != n.history.len() {
            return Err(format!("node {} applied a command twice", n.id));
        }
        if let Some(missing) = sim.acked.iter().find(|c| !have.contains(c)) {
            return Err(format!(
                "acknowledged command {missing} is missing at node {}",
                n.id
            ));
        }
    }
    Ok(())
}
