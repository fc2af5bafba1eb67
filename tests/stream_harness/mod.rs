//! A deterministic simulation of replicated streams: 3 or 5 nodes, each
//! running a [`Multi`] that holds the control group (every node) and the
//! Raft groups of two or three R3 streams, placed on different node
//! triples, over one simulated network per node pair with heartbeats
//! coalesced as the real transport gets them. The network drops, delays,
//! reorders, duplicates and partitions; nodes crash and restart.
//!
//! Disks are modelled with fsync: what a node's [`Ready`]s ask to persist
//! is written at once but synced a little later, in order; only then are
//! the Ready's messages sent and its entries applied (so nothing is acked
//! or answered on the strength of an unsynced write). A crash loses every
//! write not yet synced.
//!
//! Each replica keeps its payloads in real segment files (in a directory
//! of the run's own, on tmpfs where there is one), and its snapshots are
//! the small ones: the stream's state, naming messages those files hold.
//! The syncs the replica makes are heard through `storage::fsync`'s
//! observer and kept as the node's disk image (each file's synced length,
//! each directory's synced entries); a crash cuts every file back to that
//! image. A restarted replica must find every message its snapshot names.
//! A member sent a leader's snapshot rebases onto it and fetches what it
//! lacks from the sender's frozen state at that index (`Frozen::
//! records_after`, `Replica::take_records`: the code `cluster.catchup`
//! runs, without its network hop), as `node.rs` and `stream_catchup.rs`
//! do: the core takes the snapshot only once the replica is whole, and a
//! snapshot no newer than what the core has committed goes to it as is.
//!
//! Clients publish (with a `Msg-Id`, retried under the same id when no
//! answer comes), fetch from and ack a consumer, at whichever node leads
//! each stream. Each node holds each of its streams as the broker does:
//! a [`Group`] (`stream/group.rs`), the very component that batches what
//! a leader is given into one entry of [`replica::Op`]s, answers a request
//! only when the entry this node proposed applies, and proposes the
//! leader's own entries (its first empty one, expiry, deliveries out of
//! `max_deliver`).
//!
//! Checked at every step: one leader per group and term; every replica
//! applies the same entry and gets the same outcomes at each index; no
//! message is handed to the consumer after an ack or term of it was
//! answered `{ok}`; a publish is never acked with two different seqs.
//! After healing: every group elects, takes a new publish, every replica
//! catches up, every acked publish is stored exactly once at the seq it
//! was acked with, and all replicas of a stream hold identical state.

#![allow(dead_code)]

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use gombus::cluster::raft::{self, Config, Proposed, Raft, Ready, Role};
use gombus::cluster::raft_log::{LogStore, MemoryLog};
use gombus::cluster::raft_msg::{Body, Entry, EntryKind, GroupId, HardState, Message, NodeId};
use gombus::cluster::raft_multi::{self, Multi};
use gombus::protocol::stream_messages::StreamConfig;
use gombus::storage::fsync::{self, Synced};
use gombus::stream::group::{Done, Group};
use gombus::stream::payloads::Payloads;
use gombus::stream::replica::{self, AckKind, Frozen, Op, Outcome, Publish, Replica};
use gombus::stream::stream::Stored;

/// SplitMix64, seeded: the run replays from its seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        gombus::rand::splitmix64(&mut self.0)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// How hostile the network is.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub drop_per_mille: u64,
    pub dup_per_mille: u64,
    pub slow_ms: u64,
    pub slow_per_mille: u64,
    /// Most extra ms an fsync takes.
    pub sync_ms: u64,
}

impl Faults {
    pub fn calm() -> Faults {
        Faults {
            drop_per_mille: 0,
            dup_per_mille: 0,
            slow_ms: 0,
            slow_per_mille: 0,
            sync_ms: 1,
        }
    }
}

/// The consumer every stream has.
const CONSUMER: &str = "c";
/// Small payload files, so that they roll and die often.
const SEGMENT_BYTES: u64 = 2048;
/// What one catch-up batch carries at most.
const CATCHUP_BYTES: usize = 1024;

/// What the run's syncs made durable: each file's synced length, each
/// directory's entries when it was last synced.
#[derive(Default)]
struct Image {
    files: BTreeMap<PathBuf, u64>,
    dirs: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

impl Image {
    fn heard(&mut self, path: &Path, what: Synced) {
        match what {
            Synced::File { len } => {
                self.files.insert(path.to_path_buf(), len);
            }
            Synced::Dir => {
                let entries = std::fs::read_dir(path)
                    .map(|rd| rd.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                self.dirs.insert(path.to_path_buf(), entries);
            }
        }
    }

    /// Cuts the files under `root` back to what is durable: a file the
    /// last sync of its directory did not see is gone, and one it did is
    /// cut to its synced length.
    fn crash(&self, root: &Path) {
        let Ok(dirs) = std::fs::read_dir(root) else {
            return;
        };
        for dir in dirs.flatten().map(|e| e.path()) {
            let linked = self.dirs.get(&dir);
            for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = f.path();
                if !linked.is_some_and(|l| l.contains(&path)) {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                let len = self.files.get(&path).copied().unwrap_or(0);
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                if file.metadata().unwrap().len() > len {
                    file.set_len(len).unwrap();
                }
            }
        }
    }
}

/// Where a run keeps its nodes' files: on tmpfs when there is one.
fn run_dir(seed: u64) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let t = std::thread::current().id();
    base.join(format!("gombus-sim-{}-{t:?}-{seed}", std::process::id()))
}

/// A stream group: its id and the nodes holding it.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    pub id: GroupId,
    pub members: Vec<NodeId>,
}

/// What a client asked for inside an entry, to answer once it applies.
#[derive(Debug, Clone)]
enum Asked {
    Publish(u64),
    Deliver,
    Ack(AckKind, u64),
    Other,
}

/// One stream replica's state at a node, as the broker holds it.
type StreamState = Group<Asked>;

/// What one node has on disk, per group.
#[derive(Default)]
struct Disk {
    hs: HardState,
    log: MemoryLog,
}

pub struct Node {
    pub id: NodeId,
    pub multi: Option<Multi>,
    disk: BTreeMap<GroupId, Disk>,
    /// Where its replicas' payload files are (`g<group>` under it).
    root: PathBuf,
    /// Each group's last two frozen states (by snapshot index), to serve
    /// members catching up; gone with a crash, as the broker's are.
    frozen: BTreeMap<GroupId, VecDeque<(u64, Frozen)>>,
    /// Payload files to delete once a snapshot at the index is stored.
    dead: Vec<(GroupId, u64, Vec<PathBuf>)>,
    /// The snapshot index each group's core takes next, its replica
    /// already made whole for it.
    installed: BTreeMap<GroupId, u64>,
    /// Written, not yet synced: (sync done at, group, Ready), in order.
    unsynced: VecDeque<(u64, GroupId, Ready)>,
    streams: BTreeMap<GroupId, StreamState>,
    /// The control group's applied index.
    control_applied: u64,
    next_tick: u64,
}

pub type Check = Result<(), String>;

pub struct Sim {
    pub seed: u64,
    /// The run's files, removed when it ends.
    dir: PathBuf,
    image: Rc<RefCell<Image>>,
    pub rng: Rng,
    pub now: u64,
    base: Instant,
    pub nodes: Vec<Node>,
    pub groups: Vec<GroupSpec>,
    pub faults: Faults,
    stream_cfg: StreamConfig,
    net: BinaryHeap<Reverse<(u64, u64)>>,
    in_flight: BTreeMap<u64, Message>,
    msg_seq: u64,
    pub cut: BTreeSet<(NodeId, NodeId)>,
    // What the checks remember.
    leaders: BTreeMap<(GroupId, u64), NodeId>,
    /// (group, index) -> (term, data) of what applied there.
    committed: BTreeMap<(GroupId, u64), (u64, Vec<u8>)>,
    outcomes: BTreeMap<(GroupId, u64), Vec<Outcome>>,
    /// Per stream: publish id -> seq it was acked with.
    pub acked: BTreeMap<GroupId, BTreeMap<u64, u64>>,
    /// Per stream: seqs whose ack or term was answered {ok}.
    pub done: BTreeMap<GroupId, BTreeSet<u64>>,
    /// Per stream: publishes not answered yet: id -> last try.
    unanswered: BTreeMap<GroupId, BTreeMap<u64, u64>>,
    /// Per stream: seqs handed to the consumer client and not acked.
    held: BTreeMap<GroupId, Vec<u64>>,
    next_pub: u64,
    pub handed_out: u64,
    pub leader_changes: u64,
    pub snapshots_installed: u64,
    /// Sequences proposed as finished by `max_deliver`.
    pub exhausted: u64,
    pub steps: u64,
    pub trace: bool,
}

impl Drop for Sim {
    fn drop(&mut self) {
        fsync::observe(None);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stream_config() -> StreamConfig {
    let v = serde_json::json!({
        "name": "S",
        "subjects": ["s.>"],
        "duplicate_window_ms": 3_600_000u64,
    });
    let serde_json::Value::Object(m) = v else {
        unreachable!()
    };
    let mut c: StreamConfig = gombus::protocol::stream_messages::read_config(m).unwrap();
    c.validate().unwrap();
    c
}

fn pub_id_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data).unwrap().parse().unwrap()
}

impl Sim {
    pub fn new(seed: u64, n: usize, faults: Faults) -> Sim {
        let mut rng = Rng(seed);
        let n64 = n as u64;
        // Stream groups on node triples, as a placement would spread them.
        let streams = if n == 3 { 2 } else { 3 };
        let groups: Vec<GroupSpec> = (0..streams)
            .map(|k| GroupSpec {
                id: 10 + k,
                members: (0..3).map(|j| (k * 2 + j) % n64 + 1).collect(),
            })
            .collect();
        let dir = run_dir(seed);
        let _ = std::fs::remove_dir_all(&dir);
        let image = Rc::new(RefCell::new(Image::default()));
        let heard = image.clone();
        fsync::observe(Some(Box::new(move |p: &Path, w| {
            heard.borrow_mut().heard(p, w)
        })));
        let nodes = (1..=n64)
            .map(|id| Node {
                id,
                multi: None,
                disk: BTreeMap::new(),
                root: dir.join(format!("n{id}")),
                frozen: BTreeMap::new(),
                dead: Vec::new(),
                installed: BTreeMap::new(),
                unsynced: VecDeque::new(),
                streams: BTreeMap::new(),
                control_applied: 0,
                next_tick: rng.below(raft::TICK_MS),
            })
            .collect();
        let mut sim = Sim {
            seed,
            dir,
            image,
            rng,
            now: 0,
            base: Instant::now(),
            nodes,
            groups,
            faults,
            stream_cfg: stream_config(),
            net: BinaryHeap::new(),
            in_flight: BTreeMap::new(),
            msg_seq: 0,
            cut: BTreeSet::new(),
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            acked: BTreeMap::new(),
            done: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            held: BTreeMap::new(),
            next_pub: 1,
            handed_out: 0,
            leader_changes: 0,
            snapshots_installed: 0,
            exhausted: 0,
            steps: 0,
            trace: std::env::var_os("SIM_TRACE").is_some(),
        };
        for i in 0..n {
            sim.start(i);
        }
        sim
    }

    fn instant(&self) -> Instant {
        self.base + Duration::from_millis(self.now)
    }

    pub fn alive(&self, i: usize) -> bool {
        self.nodes[i].multi.is_some()
    }

    fn members_of(&self, g: GroupId) -> Vec<NodeId> {
        if g == 0 {
            return self.nodes.iter().map(|n| n.id).collect();
        }
        self.groups
            .iter()
            .find(|s| s.id == g)
            .map(|s| s.members.clone())
            .unwrap_or_default()
    }

    /// Starts node `i` from what its disk holds (synced writes only).
    pub fn start(&mut self, i: usize) {
        let id = self.nodes[i].id;
        let mut ids = vec![0];
        ids.extend(
            self.groups
                .iter()
                .filter(|g| g.members.contains(&id))
                .map(|g| g.id),
        );
        let mut multi = Multi::new(id);
        let now = self.instant();
        for g in ids {
            let members = self.members_of(g);
            let disk = self.nodes[i].disk.entry(g).or_default();
            let loaded = disk.log.load().unwrap();
            let mut cfg = Config::new(id, members);
            cfg.group = g;
            let life = (g << 40) ^ (id << 20) ^ disk.hs.epoch;
            cfg.seed = Rng(self.seed ^ life.rotate_left(17)).next();
            cfg.snapshot_entries = 25;
            cfg.inflight_max = 8;
            cfg.append_entries_max = 16;
            cfg.forward_proposals = false;
            let hs = disk.hs;
            let snap = loaded.snapshot.clone();
            multi.insert(g, Raft::new(cfg, hs, loaded.snapshot, loaded.entries));
            if g != 0 {
                let dir = self.nodes[i].root.join(format!("g{g}"));
                let replica = if snap.index > 0 {
                    // Its files as the crash left them, and its snapshot:
                    // every message the snapshot names must be there.
                    let len = snap.data.len() as u64;
                    let (rep, target) =
                        Replica::restore_files(&mut &snap.data[..], len, now, &dir, SEGMENT_BYTES)
                            .expect("a snapshot this sim wrote");
                    if !rep.is_whole(&target) {
                        panic!(
                            "node {id} restarted with group {g}'s snapshot at {} naming {} \
                             messages, its synced files holding {}",
                            snap.index,
                            target.count,
                            rep.messages()
                        );
                    }
                    rep
                } else {
                    let mut rep = Replica::new(self.stream_cfg.clone());
                    rep.set_payloads(Payloads::open(&dir, SEGMENT_BYTES).unwrap());
                    rep
                };
                let mut group = Group::new(replica);
                group.applied = snap.index;
                self.nodes[i].streams.insert(g, group);
            } else {
                self.nodes[i].control_applied = snap.index;
            }
        }
        self.nodes[i].multi = Some(multi);
        self.nodes[i].next_tick = self.now + 1 + self.rng.below(raft::TICK_MS);
        if self.trace {
            println!("{} start node {id}", self.now);
        }
    }

    pub fn crash(&mut self, i: usize) {
        if self.trace {
            println!(
                "{} crash node {} ({} unsynced writes lost)",
                self.now,
                self.nodes[i].id,
                self.nodes[i].unsynced.len()
            );
        }
        let node = &mut self.nodes[i];
        node.multi = None;
        node.unsynced.clear();
        node.streams.clear();
        node.frozen.clear();
        node.installed.clear();
        node.dead.clear();
        self.image.borrow().crash(&node.root);
    }

    /// The node that leads group `g` in the highest term, if any.
    pub fn leader_of(&self, g: GroupId) -> Option<usize> {
        (0..self.nodes.len())
            .filter_map(|i| {
                let r = self.nodes[i].multi.as_ref()?.get(g)?;
                (r.role() == Role::Leader).then_some((r.term(), i))
            })
            .max()
            .map(|(_, i)| i)
    }

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
            self.in_flight.insert(self.msg_seq, m.clone());
        }
    }

    /// Takes every group's Ready at node `i` and writes it (unsynced).
    fn collect(&mut self, i: usize) {
        let Some(multi) = self.nodes[i].multi.as_mut() else {
            return;
        };
        let readies = multi.ready();
        let mut at = self.nodes[i].unsynced.back().map_or(0, |u| u.0);
        for (g, ready) in readies {
            at = at.max(self.now + self.rng.below(self.faults.sync_ms + 1));
            self.nodes[i].unsynced.push_back((at, g, ready));
        }
    }

    /// Completes the fsyncs due at node `i`: persists, then sends and
    /// applies what waited on them.
    fn sync_due(&mut self, i: usize) -> Check {
        let mut after = Vec::new();
        while self.nodes[i]
            .unsynced
            .front()
            .is_some_and(|u| u.0 <= self.now)
        {
            let (_, g, ready) = self.nodes[i].unsynced.pop_front().unwrap();
            let disk = self.nodes[i].disk.entry(g).or_default();
            if let Some(hs) = ready.hard_state {
                disk.hs = hs;
            }
            if let Some(s) = &ready.snapshot {
                disk.log.save_snapshot(s).unwrap();
            }
            if let Some((first, es)) = &ready.entries {
                disk.log.append(*first, es).unwrap();
            }
            if let Some(s) = &ready.snapshot {
                let node = &mut self.nodes[i];
                let (done, keep) = std::mem::take(&mut node.dead)
                    .into_iter()
                    .partition(|(dg, at, _)| *dg == g && *at <= s.index);
                node.dead = keep;
                for (_, _, files) in done {
                    for f in files {
                        let _ = std::fs::remove_file(f);
                    }
                }
            }
            after.push((g, ready.persisted()));
        }
        if after.is_empty() {
            return Ok(());
        }
        for (g, a) in &mut after {
            if let Some(st) = a.status {
                if st.role == Role::Leader {
                    self.on_new_leader(i, *g, st.term)?;
                }
                if let Some(group) = self.nodes[i].streams.get_mut(g) {
                    group.status(st.role == Role::Leader, st.term, st.leader);
                }
            }
            if let Some(snap) = a.restore.take() {
                self.restore(i, *g, &snap.data, snap.index)?;
            }
            for e in std::mem::take(&mut a.committed) {
                self.apply(i, *g, e)?;
            }
            if a.want_snapshot {
                self.compact(i, *g);
            }
        }
        for m in raft_multi::outgoing(&mut after) {
            self.send(m);
        }
        Ok(())
    }

    /// Runs node `i` until it has nothing more to write or sync now.
    fn process(&mut self, i: usize) -> Check {
        for _ in 0..100 {
            if !self.alive(i) {
                return Ok(());
            }
            self.collect(i);
            let due = self.nodes[i]
                .unsynced
                .front()
                .is_some_and(|u| u.0 <= self.now);
            if !due {
                return Ok(());
            }
            self.sync_due(i)?;
        }
        Err(format!("node {} never quiets down", self.nodes[i].id))
    }

    fn on_new_leader(&mut self, i: usize, g: GroupId, term: u64) -> Check {
        let id = self.nodes[i].id;
        if let Some(&other) = self.leaders.get(&(g, term)) {
            if other != id {
                return Err(format!(
                    "two leaders of group {g} in term {term}: {other} and {id}"
                ));
            }
        }
        self.leaders.insert((g, term), id);
        self.leader_changes += 1;
        Ok(())
    }

    fn restore(&mut self, i: usize, g: GroupId, data: &[u8], index: u64) -> Check {
        if g == 0 {
            self.nodes[i].control_applied = index;
            return Ok(());
        }
        self.snapshots_installed += 1;
        if self.nodes[i].installed.remove(&g) == Some(index) {
            // Made whole for it already (see `arrive`).
            return Ok(());
        }
        Err(format!(
            "node {} restored group {g}'s snapshot at {index} ({} bytes) that it did not fetch",
            self.nodes[i].id,
            data.len()
        ))
    }

    /// A message for node `i` arrives. A leader's snapshot of a stream
    /// group goes to the core only once the replica holds everything it
    /// names: the replica rebases onto it and fetches what it lacks from
    /// the sender's frozen state at its index. Returns whether the message
    /// goes on to the core (not when the sender no longer holds that
    /// state: it sends a newer snapshot later).
    fn arrive(&mut self, i: usize, m: &Message) -> Result<bool, String> {
        let snapshot = match &m.body {
            Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } if m.group != 0 => {
                snapshot
            }
            _ => return Ok(true),
        };
        let (g, index, id) = (m.group, snapshot.index, self.nodes[i].id);
        let Some(core) = self.nodes[i].multi.as_ref().and_then(|mm| mm.get(g)) else {
            return Ok(true);
        };
        let taken = core.takes_snapshot(m.term, index, snapshot.term);
        if !taken || self.nodes[i].installed.get(&g) == Some(&index) {
            // One the core will not install, or made whole for it already.
            return Ok(true);
        }
        let now = self.instant();
        let from = (m.from - 1) as usize;
        let src = std::mem::take(&mut self.nodes[from].frozen);
        let r = self.catch_up(i, g, &snapshot.data, index, now, &src);
        self.nodes[from].frozen = src;
        if self.trace {
            println!(
                "{} node {id} catching up group {g} to {index}: {r:?}",
                self.now
            );
        }
        if r == Ok(false) {
            // The sender no longer holds that state (it restarted): as
            // the broker does for `cluster.catchup`, it takes a snapshot
            // now, which its core sends next.
            let applied = self.nodes[from].streams.get(&g).map_or(0, |s| s.applied);
            if self.alive(from) && applied >= index {
                self.compact(from, g);
            }
        }
        r
    }

    /// Node `i`'s replica of `g` made whole for the snapshot `data` at
    /// `index`, fetching from `src` (the sender's frozen states).
    fn catch_up(
        &mut self,
        i: usize,
        g: GroupId,
        data: &[u8],
        index: u64,
        now: Instant,
        src: &BTreeMap<GroupId, VecDeque<(u64, Frozen)>>,
    ) -> Result<bool, String> {
        let id = self.nodes[i].id;
        // The broker rebases first and then waits, applying nothing, for
        // the leader's batches or a newer snapshot; here the fetch is
        // done at once, so the replica is left as it is when there is
        // nothing to fetch from.
        let Some((_, frozen)) = src
            .get(&g)
            .and_then(|k| k.iter().find(|(at, _)| *at == index))
        else {
            return Ok(false);
        };
        let node = &mut self.nodes[i];
        let st = node.streams.get_mut(&g).unwrap();
        let target = st
            .replica
            .rebase(&mut &data[..], data.len() as u64, now)
            .map_err(|e| format!("node {id} rebasing {g} onto {index}: {e}"))?;
        for _ in 0..2 {
            while target.wants_after(st.replica.held_through()) {
                let (recs, _) = frozen
                    .records_after(st.replica.held_through(), CATCHUP_BYTES)
                    .map_err(|e| format!("leader's records of {g} at {index}: {e}"))?;
                if recs.is_empty() || st.replica.take_records(&recs, &target).is_err() {
                    break;
                }
            }
            if st.replica.is_whole(&target) {
                st.replica.sync().map_err(|e| e.to_string())?;
                st.applied = index;
                node.installed.insert(g, index);
                return Ok(true);
            }
            st.replica.start_over();
        }
        Err(format!(
            "node {id}'s replica of {g} cannot be made whole for the snapshot at {index}"
        ))
    }

    fn compact(&mut self, i: usize, g: GroupId) {
        let node = &mut self.nodes[i];
        let (index, data) = if g == 0 {
            (node.control_applied, Vec::new())
        } else {
            // As the broker does it (`snapshot_now`, `write_snapshot`): the
            // replica frozen at its applied index, its files synced and
            // the small snapshot written, the dead files deleted once it
            // is stored.
            let st = node.streams.get_mut(&g).unwrap();
            let mut frozen = st.replica.freeze().expect("a replica freezes");
            let mut data = Vec::new();
            frozen.store(&mut data).expect("a snapshot is stored");
            let index = st.applied;
            node.dead.push((g, index, frozen.take_dead()));
            let kept = node.frozen.entry(g).or_default();
            kept.retain(|(at, _)| *at != index);
            kept.push_back((index, frozen));
            if kept.len() > 2 {
                kept.pop_front();
            }
            (index, data)
        };
        if let Some(r) = node.multi.as_mut().and_then(|m| m.get_mut(g)) {
            r.compact(index, data);
        }
    }

    fn apply(&mut self, i: usize, g: GroupId, e: Entry) -> Check {
        let id = self.nodes[i].id;
        match self.committed.get(&(g, e.index)) {
            Some((t, d)) if (*t, d) != (e.term, &e.data) => {
                return Err(format!(
                    "node {id} applied a different entry at {g}/{}",
                    e.index
                ));
            }
            Some(_) => {}
            None => {
                self.committed
                    .insert((g, e.index), (e.term, e.data.clone()));
            }
        }
        if g == 0 {
            let node = &mut self.nodes[i];
            if e.index != node.control_applied + 1 {
                return Err(format!(
                    "node {id} applied control {} out of order",
                    e.index
                ));
            }
            node.control_applied = e.index;
            return Ok(());
        }
        let now = self.instant();
        let st = self.nodes[i].streams.get_mut(&g).unwrap();
        if e.index > st.applied + 1 {
            return Err(format!(
                "node {id} applied {g}/{} after {}",
                e.index, st.applied
            ));
        }
        // At or below `applied`: the replica was made whole for a later
        // snapshot while the entry waited on this node's fsync; its
        // group skips it.
        // As the Raft thread hands entries to the broker: Raft's own
        // entries as empty data.
        let data: &[u8] = match e.kind {
            EntryKind::Noop | EntryKind::Config => &[],
            EntryKind::Command => &e.data,
        };
        let skipped = e.index <= st.applied;
        let mut done = Vec::new();
        let mut outcomes = Vec::new();
        st.apply(e.index, e.term, data, now, &mut done, Some(&mut outcomes))
            .map_err(|e| e.to_string())?;
        if skipped {
            return self.answered(i, g, done);
        }
        if !data.is_empty() {
            let ops = replica::decode_entry(data).map_err(|e| e.to_string())?;
            for op in ops {
                if let Op::Exhausted { seqs, .. } = op {
                    self.exhausted += seqs.len() as u64;
                }
            }
        }
        match self.outcomes.get(&(g, e.index)) {
            Some(had) if *had != outcomes => {
                return Err(format!(
                    "node {id} got other outcomes at {g}/{}: {outcomes:?} where {had:?}",
                    e.index
                ));
            }
            Some(_) => {}
            None => {
                self.outcomes.insert((g, e.index), outcomes);
            }
        }
        self.answered(i, g, done)
    }

    /// What node `i`'s stream `g` answered its clients.
    fn answered(&mut self, i: usize, g: GroupId, done: Vec<Done<Asked>>) -> Check {
        let id = self.nodes[i].id;
        for d in done {
            let Done::Applied(a, o) = d else {
                // Refused: a publish stays unanswered (its client retries).
                continue;
            };
            match (a, o) {
                (Asked::Publish(pid), Outcome::Published(Ok(stored))) => {
                    let seq = match stored {
                        Stored::New { seq, .. } | Stored::Duplicate(seq) => seq,
                    };
                    if let Some(had) = self.acked.entry(g).or_default().insert(pid, seq) {
                        if had != seq {
                            return Err(format!(
                                "publish {pid} on {g} acked as seq {had}, then as {seq}"
                            ));
                        }
                    }
                    self.unanswered.entry(g).or_default().remove(&pid);
                }
                (Asked::Deliver, Outcome::Delivered(ds)) => {
                    for (seq, _) in ds {
                        if self.done.get(&g).is_some_and(|d| d.contains(&seq)) {
                            return Err(format!(
                                "node {id} handed out {g} seq {seq} after its ack was answered ok"
                            ));
                        }
                        self.handed_out += 1;
                        self.held.entry(g).or_default().push(seq);
                    }
                }
                (Asked::Ack(AckKind::Ack | AckKind::Term, seq), Outcome::Acked(rs))
                    if rs.first().is_some_and(|r| r.is_ok()) =>
                {
                    self.done.entry(g).or_default().insert(seq);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The end of node `i`'s turn for stream `g`: what its [`Group`] has
    /// to propose goes to the group's Raft core, as the broker sends it.
    fn flush(&mut self, i: usize, g: GroupId) -> Check {
        let now = self.instant();
        let now_ms = self.now;
        let mut done = Vec::new();
        let node = &mut self.nodes[i];
        let (Some(multi), Some(st)) = (node.multi.as_mut(), node.streams.get_mut(&g)) else {
            return Ok(());
        };
        for p in st.flush(now, now_ms, &mut done) {
            let at = match multi.get_mut(g).map(|r| r.propose(p.data)) {
                Some(Ok(Proposed::Appended { index, term })) => Some((index, term)),
                _ => None,
            };
            st.proposed(p.tag, at, &mut done);
        }
        self.answered(i, g, done)?;
        self.process(i)
    }

    /// A node that leads stream `g` (or believes it does) takes `ops`,
    /// each answered to the client that asked, and ends its turn.
    fn propose(&mut self, i: usize, g: GroupId, ops: Vec<(Op, Asked)>) -> Check {
        let Some(st) = self.nodes[i].streams.get_mut(&g) else {
            return Ok(());
        };
        for (op, asked) in ops {
            match op {
                Op::Deliver { consumer, seqs } => st.deliver(&consumer, seqs, asked),
                op => st.take(op, Some(asked)),
            }
        }
        self.flush(i, g)
    }

    /// Where a client of stream `g` goes: mostly the leader, sometimes
    /// any node holding the stream (a stale view).
    fn pick(&mut self, g: GroupId) -> Option<usize> {
        if self.rng.chance(850) {
            return self.leader_of(g);
        }
        let members = self.members_of(g);
        let id = members[self.rng.below(members.len() as u64) as usize];
        Some((id - 1) as usize)
    }

    /// Clients of stream `g` do one thing each, at random.
    pub fn clients(&mut self, g: GroupId) -> Check {
        let Some(i) = self.pick(g) else {
            return Ok(());
        };
        let now_ms = self.now;
        let mut ops = Vec::new();
        // The consumer exists once its creation applied anywhere.
        let has_consumer = self.nodes[i]
            .streams
            .get(&g)
            .is_some_and(|s| s.replica.consumer(CONSUMER).is_some());
        if !has_consumer && self.rng.chance(300) {
            let op = Op::ConsumerCreate {
                config: format!(
                    "{{\"name\":\"{CONSUMER}\",\"ack_wait_ms\":1000,\"max_deliver\":2}}"
                ),
            };
            ops.push((op, Asked::Other));
        }
        // Publishes: new ones, and retries of unanswered ones.
        for _ in 0..self.rng.below(4) {
            let retry = self
                .unanswered
                .entry(g)
                .or_default()
                .iter()
                .find(|(_, &at)| at + 400 < now_ms)
                .map(|(&p, _)| p);
            let pid = match retry {
                Some(p) if self.rng.chance(600) => p,
                _ => {
                    self.next_pub += 1;
                    self.next_pub
                }
            };
            self.unanswered.entry(g).or_default().insert(pid, now_ms);
            let op = Op::Publish(Publish {
                subject: format!("s.{}", pid % 3),
                headers: Some(format!("{{\"Msg-Id\":\"p{pid}\"}}")),
                data: pid.to_string().into_bytes(),
                binary: false,
                time_ms: now_ms,
            });
            ops.push((op, Asked::Publish(pid)));
        }
        // A fetch, planned as a leader plans it: one delivery entry in
        // flight per consumer.
        if has_consumer && self.rng.chance(500) {
            let st = &self.nodes[i].streams[&g];
            let max = self.rng.range(1, 6) as usize;
            let seqs = st.replica.next_deliveries(CONSUMER, max, self.instant());
            if !seqs.is_empty() && !st.delivering(CONSUMER) {
                let op = Op::Deliver {
                    consumer: CONSUMER.into(),
                    seqs,
                };
                ops.push((op, Asked::Deliver));
            }
        }
        // Acks of what the consumer client holds.
        let held = self.held.entry(g).or_default();
        if !held.is_empty() && self.rng.chance(700) {
            let k = self.rng.below(held.len() as u64) as usize;
            let seq = held.swap_remove(k);
            let kind = match self.rng.below(10) {
                0 => AckKind::Nak,
                1 => AckKind::Term,
                2 => AckKind::Wip,
                _ => AckKind::Ack,
            };
            if kind == AckKind::Wip {
                self.held.entry(g).or_default().push(seq);
            }
            let op = Op::Acks {
                consumer: CONSUMER.into(),
                acks: vec![(kind, seq)],
            };
            ops.push((op, Asked::Ack(kind, seq)));
        }
        // Expiry and deliveries out of max_deliver: the leader's own
        // entries, proposed by its group at the end of each turn.
        self.propose(i, g, ops)
    }

    /// Something for the control group now and then.
    pub fn control(&mut self) -> Check {
        let Some(i) = (0..self.nodes.len()).find(|&i| {
            self.nodes[i]
                .multi
                .as_ref()
                .and_then(|m| m.get(0))
                .is_some_and(|r| r.role() == Role::Leader)
        }) else {
            return Ok(());
        };
        let data = self.now.to_le_bytes().to_vec();
        if let Some(r) = self.nodes[i].multi.as_mut().and_then(|m| m.get_mut(0)) {
            let _ = r.propose(data);
        }
        self.process(i)
    }

    /// Advances to the next tick, delivery or fsync, not past `until`.
    pub fn step_until(&mut self, until: u64) -> Result<bool, String> {
        let n = self.nodes.len();
        let tick = (0..n)
            .filter(|&i| self.alive(i))
            .map(|i| (self.nodes[i].next_tick, i))
            .min();
        let sync = (0..n)
            .filter_map(|i| self.nodes[i].unsynced.front().map(|u| (u.0, i)))
            .min();
        let msg = self.net.peek().map(|Reverse(x)| *x);
        let tick_at = tick.map_or(u64::MAX, |t| t.0);
        let sync_at = sync.map_or(u64::MAX, |t| t.0);
        let msg_at = msg.map_or(u64::MAX, |m| m.0);
        let first = tick_at.min(sync_at).min(msg_at);
        if first > until {
            self.now = until;
            return Ok(false);
        }
        self.steps += 1;
        self.now = first;
        if sync_at == first {
            let i = sync.unwrap().1;
            self.sync_due(i)?;
            self.process(i)?;
        } else if msg_at == first {
            self.net.pop();
            let m = self.in_flight.remove(&msg.unwrap().1).unwrap();
            let to = (m.to - 1) as usize;
            if self.cut.contains(&(m.from, m.to)) || !self.alive(to) {
                return Ok(true);
            }
            if !self.arrive(to, &m)? {
                return Ok(true);
            }
            self.nodes[to].multi.as_mut().unwrap().step(m);
            self.process(to)?;
        } else {
            let i = tick.unwrap().1;
            self.nodes[i].next_tick = first + raft::TICK_MS;
            self.nodes[i].multi.as_mut().unwrap().tick();
            self.process(i)?;
            // A turn of the broker's loop ends on every tick too.
            let groups: Vec<GroupId> = self.nodes[i].streams.keys().copied().collect();
            for g in groups {
                self.flush(i, g)?;
            }
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

    fn isolate(&mut self, i: usize) {
        let id = self.nodes[i].id;
        for other in 1..=self.nodes.len() as u64 {
            if other != id {
                self.cut.insert((id, other));
                self.cut.insert((other, id));
            }
        }
    }

    pub fn chaos(&mut self) -> Check {
        let n = self.nodes.len();
        let i = self.rng.below(n as u64) as usize;
        match self.rng.below(10) {
            0 | 1 => self.heal(),
            2 => self.isolate(i),
            3 => {
                let (a, b) = (self.rng.range(1, n as u64), self.rng.range(1, n as u64));
                if a != b {
                    self.cut.insert((a, b));
                }
            }
            4 => {
                // A stream's leader crashes.
                let g = self.groups[self.rng.below(self.groups.len() as u64) as usize].id;
                if let Some(l) = self.leader_of(g) {
                    self.crash(l);
                }
            }
            5 => {
                if self.alive(i) {
                    self.crash(i);
                }
            }
            6 => {
                // A quick bounce: back before anyone notices.
                if self.alive(i) {
                    self.crash(i);
                    self.start(i);
                    self.process(i)?;
                }
            }
            _ => {
                if let Some(j) = (0..n).find(|&j| !self.alive(j)) {
                    self.start(j);
                    self.process(j)?;
                }
            }
        }
        Ok(())
    }

    /// Every node's groups, one line each.
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        for n in &self.nodes {
            match &n.multi {
                None => out.push(format!("  node {} crashed", n.id)),
                Some(m) => {
                    for (g, r) in m.groups() {
                        out.push(format!("  group {g}: {}", r.describe()));
                    }
                }
            }
        }
        out.join("\n")
    }
}

/// One randomized run: chaos with clients throughout, then healing and
/// the final checks.
pub fn run_seed(seed: u64, n: usize) -> Check {
    run(seed, n).1
}

/// [`run_seed`], also handing back the simulation for its figures.
pub fn run(seed: u64, n: usize) -> (Sim, Check) {
    let mut pick = Rng(seed ^ 0x5eed_5eed);
    let faults = Faults {
        drop_per_mille: pick.below(120),
        dup_per_mille: pick.below(50),
        slow_ms: 300,
        slow_per_mille: pick.below(80),
        sync_ms: pick.range(0, 6),
    };
    let chaos_per_mille = pick.range(20, 200);
    let mut sim = Sim::new(seed, n, faults);
    let r = chaos_then_heal(&mut sim, chaos_per_mille);
    (sim, r)
}

fn chaos_then_heal(sim: &mut Sim, chaos_per_mille: u64) -> Check {
    let chaos_end = 3_500;
    let mut t = 0;
    let groups: Vec<GroupId> = sim.groups.iter().map(|g| g.id).collect();
    while t < chaos_end {
        t += 20;
        sim.run_until(t)?;
        for &g in &groups {
            if sim.rng.chance(500) {
                sim.clients(g)?;
            }
        }
        if sim.rng.chance(20) {
            sim.control()?;
        }
        if sim.rng.chance(chaos_per_mille) {
            sim.chaos()?;
        }
    }
    final_checks(sim, chaos_end)
}

/// After healing everything: each stream elects and acks a new publish
/// within 5 s, every replica catches up, and the stored messages are what
/// was acked.
pub fn final_checks(sim: &mut Sim, healed_at: u64) -> Check {
    sim.heal();
    sim.faults = Faults::calm();
    for i in 0..sim.nodes.len() {
        if !sim.alive(i) {
            sim.start(i);
            sim.process(i)?;
        }
    }
    let groups: Vec<GroupId> = sim.groups.iter().map(|g| g.id).collect();
    let mut t = healed_at;
    for &g in &groups {
        // A publish made again every 300 ms at whoever leads, until acked.
        let pid = {
            sim.next_pub += 1;
            sim.next_pub
        };
        let mut last_try = 0;
        loop {
            if t >= last_try + 300 {
                if let Some(l) = sim.leader_of(g) {
                    last_try = t;
                    let op = Op::Publish(Publish {
                        subject: "s.end".into(),
                        headers: Some(format!("{{\"Msg-Id\":\"p{pid}\"}}")),
                        data: pid.to_string().into_bytes(),
                        binary: false,
                        time_ms: t,
                    });
                    sim.propose(l, g, vec![(op, Asked::Publish(pid))])?;
                }
            }
            t += 10;
            sim.run_until(t)?;
            if sim.acked.get(&g).is_some_and(|a| a.contains_key(&pid)) {
                break;
            }
            if t > healed_at + 5_000 {
                return Err(format!(
                    "stream group {g} took no publish within 5 s of healing:\n{}",
                    sim.describe()
                ));
            }
        }
    }
    // Every replica applies everything committed.
    let caught_up = |sim: &Sim, g: GroupId| {
        let members = sim.members_of(g);
        let applied: Vec<u64> = members
            .iter()
            .map(|&id| sim.nodes[(id - 1) as usize].streams[&g].applied)
            .collect();
        let commit = members
            .iter()
            .filter_map(|&id| {
                Some(
                    sim.nodes[(id - 1) as usize]
                        .multi
                        .as_ref()?
                        .get(g)?
                        .commit(),
                )
            })
            .max()
            .unwrap_or(0);
        applied.iter().all(|&a| a == commit)
    };
    while !groups.iter().all(|&g| caught_up(sim, g)) {
        t += 10;
        sim.run_until(t)?;
        if t > healed_at + 8_000 {
            return Err(format!(
                "replicas did not catch up within 8 s of healing:\n{}",
                sim.describe()
            ));
        }
    }
    for &g in &groups {
        let members = sim.members_of(g);
        let mut first_snapshot: Option<(NodeId, Vec<u8>)> = None;
        for id in members {
            let st = &sim.nodes[(id - 1) as usize].streams[&g];
            let rep = &st.replica;
            let mut seen = BTreeSet::new();
            for (seq, _) in rep.iter() {
                let m = rep
                    .get(seq)
                    .map_err(|e| format!("message {seq} of {g} at node {id}: {e}"))?
                    .ok_or_else(|| format!("message {seq} of {g} at node {id} unreadable"))?;
                let pid = pub_id_of(&m.data);
                if !seen.insert(pid) {
                    return Err(format!("publish {pid} stored twice on {g} at node {id}"));
                }
            }
            for (&pid, &seq) in sim.acked.get(&g).into_iter().flatten() {
                match rep.get(seq) {
                    Ok(Some(m)) if pub_id_of(&m.data) == pid => {}
                    other => {
                        return Err(format!(
                            "acked publish {pid} (seq {seq}) of {g} at node {id}: {:?}",
                            other.map(|m| m.map(|m| pub_id_of(&m.data)))
                        ))
                    }
                }
            }
            let snap = rep
                .snapshot()
                .map_err(|e| format!("snapshot of {g} at node {id}: {e}"))?;
            match &first_snapshot {
                None => first_snapshot = Some((id, snap)),
                Some((other, s)) if *s != snap => {
                    return Err(format!(
                        "replicas {other} and {id} of {g} differ at index {}",
                        st.applied
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}
