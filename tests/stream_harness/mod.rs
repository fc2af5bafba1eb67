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
//! image. A killed process (the host running on) keeps its files as they
//! are, with records past its snapshot that the log's replay takes again.
//! A restarted replica must find every message its snapshot names.
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
use gombus::cluster::raft_log::{self, DurableLog, LogStore, MemoryLog};
use gombus::cluster::raft_msg::{
    Body, Entry, EntryKind, GroupId, HardState, Message, NodeId, Snapshot,
};
use gombus::cluster::raft_multi::{self, Multi};
use gombus::protocol::stream_messages::StreamConfig;
use gombus::storage::fsync::{self, Synced};
use gombus::stream::catchup::{Answer, CatchUp, Next, Pace, Served, Sources};
use gombus::stream::group::{Done, Group};
use gombus::stream::payloads::Payloads;
use gombus::stream::replica::{self, AckKind, Op, Outcome, Publish, Replica};
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
    /// Chance, every 20 ms of chaos, that a member's payload files are
    /// damaged while it is down (see [`Sim::damage`]).
    pub damage_per_mille: u64,
}

impl Faults {
    pub fn calm() -> Faults {
        Faults {
            drop_per_mille: 0,
            dup_per_mille: 0,
            slow_ms: 0,
            slow_per_mille: 0,
            sync_ms: 1,
            damage_per_mille: 0,
        }
    }
}

/// The consumer every stream has.
const CONSUMER: &str = "c";
/// Small payload files, so that they roll and die often.
const SEGMENT_BYTES: u64 = 2048;
/// What one catch-up batch carries at most.
const CATCHUP_BYTES: usize = 1024;
/// The catch-up's waits, on the simulation's clock: a request asked
/// again after 250 ms (its network takes up to about 300 ms), 100 ms after
/// a refusal, a snapshot forced for a member at most every 300 ms.
const PACE: Pace = Pace {
    call_wait: Duration::from_millis(250),
    retry: Duration::from_millis(100),
    forced_every: Duration::from_millis(300),
};

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

/// What crosses the simulated network: Raft's messages, and a catch-up's
/// requests and answers (`cluster.catchup` in the broker).
#[derive(Debug, Clone)]
enum Wire {
    Raft(Message),
    /// Member `from` asks `to` for the records after `after` of its state
    /// frozen for the snapshot of `group` at `index`.
    Ask {
        from: NodeId,
        to: NodeId,
        group: GroupId,
        index: u64,
        after: u64,
        tag: u64,
    },
    /// The answer: the records of the state at `index`, or refused.
    Answer {
        from: NodeId,
        to: NodeId,
        tag: u64,
        index: u64,
        recs: Option<Vec<u8>>,
        /// Refused with a later state's index and small snapshot.
        newer: Option<(u64, Vec<u8>)>,
    },
}

impl Wire {
    fn ends(&self) -> (NodeId, NodeId) {
        match self {
            Wire::Raft(m) => (m.from, m.to),
            Wire::Ask { from, to, .. } | Wire::Answer { from, to, .. } => (*from, *to),
        }
    }
}

/// What one node has on disk, per group.
struct Disk {
    hs: HardState,
    /// The control group's log in memory; a stream group's a real
    /// [`DurableLog`] in [`Node::logs`] (whose files its replica keeps
    /// messages in), written only when the sim's fsync of it is due, so
    /// that everything in it is durable.
    log: Box<dyn LogStore>,
    /// `node.rs`'s mark of a group whose log was lost: it starts as a
    /// non-voter until its core votes again.
    lost_mark: bool,
}

pub struct Node {
    pub id: NodeId,
    pub multi: Option<Multi>,
    disk: BTreeMap<GroupId, Disk>,
    /// Where its replicas' payload files are (`g<group>` under it).
    root: PathBuf,
    /// Where its stream groups' logs are (`g<group>` under it).
    logs: PathBuf,
    /// Each group's last frozen states, to serve members catching up;
    /// gone with a crash, as the broker's are.
    sources: BTreeMap<GroupId, Sources>,
    /// A leader's snapshot held back from the group's core until the
    /// replica is whole for it (as `node.rs` holds it).
    install: BTreeMap<GroupId, Message>,
    /// Replicas fetching what a held snapshot names.
    catchups: BTreeMap<GroupId, CatchUp>,
    /// Replicas that lack messages their log needs: nothing is applied
    /// until the leader's snapshot arrives.
    lost: BTreeSet<GroupId>,
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
    in_flight: BTreeMap<u64, Wire>,
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
    /// Members whose files were damaged and that are not whole and voting
    /// again yet: at most one per group, so a majority stays intact.
    damaged: BTreeSet<(NodeId, GroupId)>,
    /// Tags of catch-up requests.
    next_tag: u64,
    /// Catch-ups begun, and ended whole.
    pub catchups: u64,
    pub caught_up: u64,
    /// Catch-up requests sent, and refused (the state was gone).
    pub catchup_asks: u64,
    pub catchup_refused: u64,
    /// Groups started again without their log (`GroupLost`): files found
    /// damaged at a restart, or entries past the snapshot during a
    /// catch-up.
    pub groups_lost: u64,
    /// Members whose files were damaged, and those of them a restart
    /// found lacking messages.
    pub damaged_members: u64,
    pub damage_found: u64,
    /// Log data files deleted once their stream let them go.
    pub data_files_gone: u64,
    /// Elections won by a member catching up.
    pub leaders_catching_up: u64,
    /// Catch-ups that ended whole with entries past their snapshot
    /// applied again from the core's log.
    pub replays: u64,
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

/// The index of the snapshot a message carries.
fn snapshot_index(m: &Message) -> Option<u64> {
    match &m.body {
        Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } => Some(snapshot.index),
        _ => None,
    }
}

fn pub_id_of(data: &[u8]) -> u64 {
    let text = std::str::from_utf8(data).unwrap();
    text.split(' ').next().unwrap().parse().unwrap()
}

/// The data of publish `pid`: its id, and for every other one enough
/// padding that its replicas keep it in their log's files
/// ([`gombus::stream::payloads::IN_LOG_MIN`]).
fn pub_data(pid: u64) -> Vec<u8> {
    let mut data = pid.to_string().into_bytes();
    if pid.is_multiple_of(2) {
        data.push(b' ');
        data.resize(
            gombus::stream::payloads::IN_LOG_MIN + (pid % 7) as usize,
            b'x',
        );
    }
    data
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
                logs: dir.join(format!("logs{id}")),
                sources: BTreeMap::new(),
                install: BTreeMap::new(),
                catchups: BTreeMap::new(),
                lost: BTreeSet::new(),
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
            damaged: BTreeSet::new(),
            next_tag: 0,
            catchups: 0,
            caught_up: 0,
            catchup_asks: 0,
            catchup_refused: 0,
            groups_lost: 0,
            damaged_members: 0,
            damage_found: 0,
            data_files_gone: 0,
            leaders_catching_up: 0,
            replays: 0,
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

    /// Node `i`'s disk for group `g`, made empty on first use.
    fn disk(&mut self, i: usize, g: GroupId) -> &mut Disk {
        let logs = self.nodes[i].logs.clone();
        self.nodes[i].disk.entry(g).or_insert_with(|| Disk {
            hs: HardState::default(),
            log: open_log(&logs, g),
            lost_mark: false,
        })
    }

    /// Group `g`'s core at node `i` from what its disk holds, as
    /// `node.rs`'s `hold_group` makes it (`lost`: its log was just
    /// emptied), and the snapshot it starts from.
    fn core(&mut self, i: usize, g: GroupId, lost: bool) -> (Raft, Snapshot) {
        let id = self.nodes[i].id;
        let members = self.members_of(g);
        let seed = self.seed;
        let disk = self.disk(i, g);
        let loaded = disk.log.load().unwrap();
        let mut cfg = Config::new(id, members);
        cfg.group = g;
        let life = (g << 40) ^ (id << 20) ^ disk.hs.epoch;
        cfg.seed = Rng(seed ^ life.rotate_left(17)).next();
        cfg.snapshot_entries = 25;
        cfg.inflight_max = 8;
        cfg.append_entries_max = 16;
        cfg.forward_proposals = false;
        let empty = loaded.snapshot.index == 0 && loaded.entries.is_empty();
        cfg.voter = raft::starts_as_voter(true, lost || disk.lost_mark, &disk.hs, empty);
        let snap = loaded.snapshot.clone();
        (
            Raft::new(cfg, disk.hs, loaded.snapshot, loaded.entries),
            snap,
        )
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
            let (raft, snap) = self.core(i, g, false);
            multi.insert(g, raft);
            if g != 0 {
                let dir = self.nodes[i].root.join(format!("g{g}"));
                let log = self.nodes[i].logs.join(format!("g{g}"));
                let replica = if snap.index > 0 {
                    // Its files as the crash left them, and its snapshot:
                    // every message the snapshot names must be there,
                    // unless its files were damaged.
                    let len = snap.data.len() as u64;
                    let (rep, target) = Replica::restore_files(
                        &mut &snap.data[..],
                        len,
                        now,
                        &dir,
                        SEGMENT_BYTES,
                        Some(&log),
                    )
                    .expect("a snapshot this sim wrote");
                    if !rep.is_whole(&target) {
                        if !self.damaged.contains(&(id, g)) {
                            panic!(
                                "node {id} restarted with group {g}'s snapshot at {} naming {} \
                                 messages, its synced files holding {}",
                                snap.index,
                                target.count,
                                rep.messages()
                            );
                        }
                        // As the broker does: the group starts again
                        // without its log, and is caught up.
                        self.damage_found += 1;
                        self.nodes[i].lost.insert(g);
                    }
                    rep
                } else {
                    let mut rep = Replica::new(self.stream_cfg.clone());
                    rep.set_payloads(Payloads::open_in(&dir, SEGMENT_BYTES, Some(&log)).unwrap());
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
        let lost: Vec<GroupId> = self.nodes[i].lost.iter().copied().collect();
        for g in lost {
            self.lose_group(i, g);
        }
    }

    /// Node `i` loses its power: what it had not fsynced is gone.
    pub fn crash(&mut self, i: usize) {
        self.stop(i, true);
    }

    /// Node `i`'s process is killed (kill -9) while its host runs on:
    /// its files keep what it wrote, fsynced or not, so a restart finds
    /// payload records past its snapshot (the store's tail, which the
    /// log's replay takes again). What it had not yet handed to its
    /// writers (the Readys not yet persisted) is gone.
    pub fn kill(&mut self, i: usize) {
        self.stop(i, false);
    }

    fn stop(&mut self, i: usize, power_lost: bool) {
        if self.trace {
            println!(
                "{} {} node {} ({} unsynced writes lost)",
                self.now,
                if power_lost { "crash" } else { "kill" },
                self.nodes[i].id,
                self.nodes[i].unsynced.len()
            );
        }
        let node = &mut self.nodes[i];
        node.multi = None;
        node.unsynced.clear();
        node.streams.clear();
        node.sources.clear();
        node.install.clear();
        node.catchups.clear();
        node.lost.clear();
        node.installed.clear();
        node.dead.clear();
        // Its logs are read again at start, as a restarted process does.
        for (&g, disk) in node.disk.iter_mut().filter(|(&g, _)| g != 0) {
            disk.log = Box::new(MemoryLog::default());
            disk.log = open_log(&node.logs, g);
        }
        if power_lost {
            self.image.borrow().crash(&node.root);
        }
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
        self.post(Wire::Raft(m));
    }

    /// Puts `w` on the network, which may drop, repeat or delay it.
    fn post(&mut self, w: Wire) {
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
            self.in_flight.insert(self.msg_seq, w.clone());
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
    /// applies what waited on them. Returns whether any of it was more
    /// than a core's wish for a snapshot (which a replica that is not
    /// whole does not grant, so the wish comes in every round).
    fn sync_due(&mut self, i: usize) -> Result<bool, String> {
        let mut after = Vec::new();
        let mut stored = false;
        while self.nodes[i]
            .unsynced
            .front()
            .is_some_and(|u| u.0 <= self.now)
        {
            let (_, g, ready) = self.nodes[i].unsynced.pop_front().unwrap();
            stored |=
                ready.hard_state.is_some() || ready.snapshot.is_some() || ready.entries.is_some();
            let disk = self.disk(i, g);
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
                        let data = f
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("data."));
                        if std::fs::remove_file(f).is_ok() && data {
                            self.data_files_gone += 1;
                        }
                    }
                }
            }
            after.push((g, ready.persisted()));
        }
        let busy = stored
            || after.iter().any(|(_, a)| {
                !a.messages.is_empty()
                    || a.restore.is_some()
                    || !a.committed.is_empty()
                    || !a.reads.is_empty()
                    || !a.forwarded.is_empty()
                    || a.status.is_some()
            });
        for (g, a) in &mut after {
            if let Some(st) = a.status {
                if st.role == Role::Leader {
                    self.on_new_leader(i, *g, st.term)?;
                }
                if let Some(group) = self.nodes[i].streams.get_mut(g) {
                    group.status(st.role == Role::Leader, st.term, st.leader);
                }
                if st.voter {
                    if let Some(disk) = self.nodes[i].disk.get_mut(g) {
                        disk.lost_mark = false;
                    }
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
        Ok(busy)
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
            if !due || !self.sync_due(i)? {
                return Ok(());
            }
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
        // A member catching up may still win an election (its log can be
        // as up to date as any, holding a suffix the leader's snapshot
        // replaced); it applies nothing, and the first entry it commits
        // past the snapshot ends in `GroupLost`. A member whose log was
        // lost never does: it is not a voter.
        if self.nodes[i].lost.contains(&g) {
            return Err(format!(
                "node {id} leads group {g} in term {term} having lost its log"
            ));
        }
        if self.nodes[i].catchups.contains_key(&g) {
            self.leaders_catching_up += 1;
        }
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
    /// group that the core would install (`Raft::takes_snapshot`) is held
    /// back from it, as `node.rs` holds it: the replica rebases onto it
    /// and fetches what it lacks over the network ([`Sim::catch_up`]),
    /// and the core takes it only once the replica is whole. One the core
    /// would not install goes to it as it is. Returns whether the message
    /// goes on to the core.
    fn arrive(&mut self, i: usize, m: &Message) -> Result<bool, String> {
        let snapshot = match &m.body {
            Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } if m.group != 0 => {
                snapshot
            }
            _ => return Ok(true),
        };
        let (g, index) = (m.group, snapshot.index);
        let Some(core) = self.nodes[i].multi.as_ref().and_then(|mm| mm.get(g)) else {
            return Ok(true);
        };
        if !core.takes_snapshot(m.term, index, snapshot.term) {
            return Ok(true);
        }
        let node = &mut self.nodes[i];
        let again = node.install.get(&g).and_then(snapshot_index) == Some(index);
        node.install.insert(g, m.clone());
        if !again {
            self.snapshot_arrived(i, g, index, &snapshot.data)?;
        }
        Ok(false)
    }

    /// The leader's snapshot of `g` at `index` arrived at node `i`: its
    /// replica takes the snapshot's state and starts fetching what it
    /// lacks (`stream_catchup.rs`'s `snapshot_arrived`).
    fn snapshot_arrived(&mut self, i: usize, g: GroupId, index: u64, data: &[u8]) -> Check {
        let now = self.instant();
        let node = &mut self.nodes[i];
        let id = node.id;
        let Some(st) = node.streams.get_mut(&g) else {
            return Ok(());
        };
        let target = st
            .replica
            .rebase(&mut &data[..], data.len() as u64, now)
            .map_err(|e| format!("node {id} rebasing {g} onto {index}: {e}"))?;
        if self.trace {
            println!(
                "{} node {id} catching up group {g} to {index}: holds {} of {} messages",
                self.now,
                st.replica.messages(),
                target.count
            );
        }
        node.lost.remove(&g);
        // As the broker: an install handed to the core before this
        // snapshot arrived may still come back as a restore.
        node.catchups.insert(g, CatchUp::new(index, target, now));
        self.catchups += 1;
        self.catch_up(i, g)
    }

    /// A turn of node `i`'s catch-up of stream `g`, as the broker takes
    /// it (`stream/catchup.rs` decides): the next request to the leader
    /// the member knows, or, once whole, the held snapshot to the core.
    fn catch_up(&mut self, i: usize, g: GroupId) -> Check {
        let now = self.instant();
        let node = &mut self.nodes[i];
        let id = node.id;
        let (Some(cu), Some(st)) = (node.catchups.get_mut(&g), node.streams.get_mut(&g)) else {
            return Ok(());
        };
        let leads = st.leads();
        let next = cu
            .next(&mut st.replica, leads, now, &PACE)
            .map_err(|e| format!("node {id} syncing {g}'s files: {e}"))?;
        let leader = st.leader().filter(|&l| l != id);
        if self.trace && !matches!(next, Next::Wait | Next::Ask { .. }) {
            println!("{} node {id} catching up group {g}: {next:?}", self.now);
        }
        match next {
            Next::Lost => {
                node.catchups.remove(&g);
                node.lost.insert(g);
                self.lose_group(i, g);
                self.process(i)?;
            }
            Next::Whole { index, replay } => {
                st.made_whole(index, replay);
                node.catchups.remove(&g);
                node.installed.insert(g, index);
                self.caught_up += 1;
                // `ToRaft::GroupInstall`: the held snapshot, if it is
                // still that one, goes to the core; then, as `node.rs`'s
                // `replay`, what the core applied past `index` comes again.
                let held = node.install.remove(&g);
                let multi = node.multi.as_mut().unwrap();
                match held {
                    Some(m) if snapshot_index(&m) == Some(index) => multi.step(m),
                    Some(m) if snapshot_index(&m) < Some(index) => {}
                    Some(m) => {
                        node.install.insert(g, m);
                    }
                    None => {}
                }
                let again = multi
                    .get(g)
                    .and_then(|c| c.applied_after(index).map(<[_]>::to_vec));
                match again {
                    Some(entries) => {
                        if !entries.is_empty() {
                            self.replays += 1;
                            if self.trace {
                                println!(
                                    "{} node {id} applies {} entries of group {g} after {index} again",
                                    self.now,
                                    entries.len()
                                );
                            }
                        }
                        for e in entries {
                            self.apply(i, g, e)?;
                        }
                    }
                    None => {
                        let node = &mut self.nodes[i];
                        node.lost.insert(g);
                        self.lose_group(i, g);
                    }
                }
                self.process(i)?;
            }
            Next::Ask { index, after } => {
                let Some(to) = leader else {
                    return Ok(());
                };
                self.next_tag += 1;
                let tag = self.next_tag;
                cu.asked(Some(tag), now, &PACE);
                self.catchup_asks += 1;
                self.post(Wire::Ask {
                    from: id,
                    to,
                    group: g,
                    index,
                    after,
                    tag,
                });
            }
            Next::StartedOver => {
                // Every member's state at an index is the same, and what
                // a replica holds below what it fetches is what the
                // snapshot names: fetched records never disagree.
                return Err(format!(
                    "node {id}'s replica of {g} disagrees with the snapshot it fetched"
                ));
            }
            Next::Wait => {}
        }
        Ok(())
    }

    /// Node `j` answers member `from`'s request for the records after
    /// `after` of its state of `g` frozen at `index` (`cluster.catchup`).
    /// Without that state it refuses, and takes a new snapshot if due.
    fn serve_catchup(
        &mut self,
        j: usize,
        from: NodeId,
        g: GroupId,
        index: u64,
        after: u64,
        tag: u64,
    ) -> Check {
        let now = self.instant();
        let node = &mut self.nodes[j];
        let id = node.id;
        let Some(applied) = node.streams.get(&g).map(|s| s.applied) else {
            return Ok(());
        };
        let served = node
            .sources
            .entry(g)
            .or_default()
            .serve(index, after, CATCHUP_BYTES, applied, now, &PACE)
            .map_err(|e| format!("node {id} reading {g}'s records at {index}: {e}"))?;
        let (recs, newer) = match served {
            Served::Records(recs, _) => (Some(recs), None),
            Served::Gone {
                snapshot_now,
                newer,
            } => {
                if snapshot_now {
                    self.compact(j, g);
                    self.process(j)?;
                }
                (None, newer)
            }
        };
        self.post(Wire::Answer {
            from: id,
            to: from,
            tag,
            index,
            recs,
            newer,
        });
        Ok(())
    }

    /// An answer to a catch-up request of node `i` arrives: taken if it
    /// answers the request in flight.
    fn catchup_answered(
        &mut self,
        i: usize,
        tag: u64,
        index: u64,
        recs: Option<Vec<u8>>,
        newer: Option<(u64, Vec<u8>)>,
    ) -> Check {
        let now = self.instant();
        let node = &mut self.nodes[i];
        let id = node.id;
        let Some((&g, cu)) = node.catchups.iter_mut().find(|(_, c)| c.waits_on(tag)) else {
            return Ok(());
        };
        let st = node.streams.get_mut(&g).unwrap();
        let answer = match (&recs, &newer) {
            (Some(recs), _) => Answer::Records { index, recs },
            (None, Some((index, small))) => {
                self.catchup_refused += 1;
                Answer::Newer {
                    index: *index,
                    small,
                }
            }
            (None, None) => {
                self.catchup_refused += 1;
                Answer::Refused
            }
        };
        // Every member's state at one index is the same, so the records
        // of the leader's state at the index always fit.
        cu.answered(&mut st.replica, tag, answer, now, &PACE)
            .map_err(|e| format!("node {id} catching up {g} to {}: {e}", cu.index))?;
        self.catch_up(i, g)
    }

    /// Node `i` starts stream group `g` again without its log, as
    /// `node.rs`'s `lose_group` does: its hard state kept (a new core,
    /// in a new epoch), its log emptied, what it had not synced gone.
    fn lose_group(&mut self, i: usize, g: GroupId) {
        self.groups_lost += 1;
        if self.trace {
            println!(
                "{} node {} starts group {g} again without its log",
                self.now, self.nodes[i].id
            );
        }
        let node = &mut self.nodes[i];
        let Some(core) = node.multi.as_mut().and_then(|m| m.remove(g)) else {
            return;
        };
        let logs = node.logs.clone();
        let disk = node.disk.entry(g).or_insert_with(|| Disk {
            hs: HardState::default(),
            log: open_log(&logs, g),
            lost_mark: false,
        });
        disk.hs = core.hard_state();
        // As `node.rs` empties it: its files become data files.
        disk.log = Box::new(MemoryLog::default());
        raft_log::remove_log(&logs.join(format!("g{g}"))).unwrap();
        disk.log = open_log(&logs, g);
        disk.lost_mark = true;
        node.unsynced.retain(|u| u.1 != g);
        node.install.remove(&g);
        let (raft, _) = self.core(i, g, true);
        self.nodes[i].multi.as_mut().unwrap().insert(g, raft);
    }

    fn compact(&mut self, i: usize, g: GroupId) {
        let node = &mut self.nodes[i];
        if node.lost.contains(&g) || node.catchups.contains_key(&g) {
            // Not whole: the broker answers with an empty snapshot, which
            // the Raft thread does not take.
            return;
        }
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
            let kept = node.sources.entry(g).or_default();
            kept.keep(index, std::sync::Arc::new(frozen));
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
        let node = &mut self.nodes[i];
        if node.lost.contains(&g) && e.index == 1 {
            // A core that lost its log fed the leader's log from its start
            // (no snapshot taken there yet): as the broker does, the
            // replica is built again from that log.
            let dir = node.root.join(format!("g{g}"));
            let log = node.logs.join(format!("g{g}"));
            let mut rep = Replica::new(self.stream_cfg.clone());
            rep.set_payloads(Payloads::open_in(&dir, SEGMENT_BYTES, Some(&log)).unwrap());
            let st = node.streams.get_mut(&g).unwrap();
            st.replica = rep;
            st.applied = 0;
            node.lost.remove(&g);
        }
        if node.lost.contains(&g) || node.catchups.contains_key(&g) {
            // Not whole: nothing is applied, and an entry past the
            // snapshot being fetched is noted (the catch-up cannot end
            // in an install that skips it).
            if let Some(cu) = node.catchups.get_mut(&g) {
                cu.skipped(e.index, e.data.len());
            }
            return Ok(());
        }
        let now = self.instant();
        let st = self.nodes[i].streams.get_mut(&g).unwrap();
        // Handed over before a replay that brings it again: passed over.
        let passed = st.replaying() && e.index > st.applied + 1;
        if e.index > st.applied + 1 && !passed {
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
        let skipped = e.index <= st.applied || passed;
        let mut done = Vec::new();
        let mut outcomes = Vec::new();
        // Where the log stored it, as the Raft thread says with each entry.
        let at = self.nodes[i]
            .disk
            .get(&g)
            .and_then(|d| d.log.data_at(e.index));
        let st = self.nodes[i].streams.get_mut(&g).unwrap();
        st.apply_at(
            e.index,
            e.term,
            data,
            at,
            now,
            &mut done,
            Some(&mut outcomes),
        )
        .map_err(|e| e.to_string())?;
        // As the broker does once the turn's answers are out.
        st.replica.flush();
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
                data: pub_data(pid),
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
            let w = self.in_flight.remove(&msg.unwrap().1).unwrap();
            let (from, to_id) = w.ends();
            let to = (to_id - 1) as usize;
            if self.cut.contains(&(from, to_id)) || !self.alive(to) {
                return Ok(true);
            }
            match w {
                Wire::Raft(m) => {
                    if !self.arrive(to, &m)? {
                        return Ok(true);
                    }
                    self.nodes[to].multi.as_mut().unwrap().step(m);
                    self.process(to)?;
                }
                Wire::Ask {
                    from,
                    group,
                    index,
                    after,
                    tag,
                    ..
                } => self.serve_catchup(to, from, group, index, after, tag)?,
                Wire::Answer {
                    tag,
                    index,
                    recs,
                    newer,
                    ..
                } => self.catchup_answered(to, tag, index, recs, newer)?,
            }
        } else {
            let i = tick.unwrap().1;
            self.nodes[i].next_tick = first + raft::TICK_MS;
            self.nodes[i].multi.as_mut().unwrap().tick();
            self.process(i)?;
            // A turn of the broker's loop ends on every tick too.
            let groups: Vec<GroupId> = self.nodes[i].streams.keys().copied().collect();
            for g in groups {
                self.flush(i, g)?;
                self.catch_up(i, g)?;
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
                // A quick bounce of the process, the host running on:
                // back before anyone notices.
                if self.alive(i) {
                    self.kill(i);
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

    /// A member's payload files are damaged while it is down: it stops
    /// (as in a crash), one of its stream's segment files is deleted, has
    /// a byte flipped, or its last one (the one being written) is cut
    /// short, and it starts again. The variants of the process test
    /// `damaged_replica_heals`. Only a member whose stream has no other
    /// member damaged and not yet whole and voting again: a majority of
    /// each group keeps its files.
    pub fn damage(&mut self) -> Check {
        self.settle_damaged();
        // (node, group) pairs that may be damaged: a running member, with
        // payload files on its disk, of a group whose other members are
        // intact (none damaged, lost or catching up).
        let mut can = Vec::new();
        for s in &self.groups {
            let intact = |id: NodeId| {
                let node = &self.nodes[(id - 1) as usize];
                !self.damaged.contains(&(id, s.id))
                    && !node.lost.contains(&s.id)
                    && !node.catchups.contains_key(&s.id)
                    && !node.disk.get(&s.id).is_some_and(|d| d.lost_mark)
            };
            if !s.members.iter().all(|&id| intact(id)) {
                continue;
            }
            for &id in &s.members {
                let node = &self.nodes[(id - 1) as usize];
                let dir = node.root.join(format!("g{}", s.id));
                let durable = (self.image.borrow().dirs.get(&dir)).is_some_and(|f| !f.is_empty());
                if node.multi.is_some() && durable {
                    can.push((id, s.id));
                }
            }
        }
        if can.is_empty() {
            return Ok(());
        }
        let (id, g) = can[self.rng.below(can.len() as u64) as usize];
        let i = (id - 1) as usize;
        self.crash(i);
        let dir = self.nodes[i].root.join(format!("g{g}"));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        // The log's data files hold the data of its messages.
        let log = self.nodes[i].logs.join(format!("g{g}"));
        let data = gombus::storage::log_files::data_files(&log).unwrap_or_default();
        files.extend(
            data.into_iter()
                .map(|n| gombus::storage::log_files::data_path(&log, n)),
        );
        if !files.is_empty() {
            let k = self.rng.below(files.len() as u64) as usize;
            let what = match self.rng.below(3) {
                0 => {
                    std::fs::remove_file(&files[k]).unwrap();
                    "deleted"
                }
                1 => {
                    let mut bytes = std::fs::read(&files[k]).unwrap();
                    if !bytes.is_empty() {
                        let at = self.rng.below(bytes.len() as u64) as usize;
                        bytes[at] ^= 1 << self.rng.below(8);
                        std::fs::write(&files[k], &bytes).unwrap();
                    }
                    "a bit flipped"
                }
                _ => {
                    let last = files.last().unwrap();
                    let f = std::fs::OpenOptions::new().write(true).open(last).unwrap();
                    let len = f.metadata().unwrap().len();
                    f.set_len(self.rng.below(len)).unwrap();
                    "the last file cut"
                }
            };
            if self.trace {
                println!("{} node {id}'s files of group {g}: {what}", self.now);
            }
            self.damaged.insert((id, g));
            self.damaged_members += 1;
        }
        self.start(i);
        self.process(i)
    }

    /// Forgets the damaged members that are whole and voting again.
    fn settle_damaged(&mut self) {
        let healed: Vec<(NodeId, GroupId)> = (self.damaged.iter().copied())
            .filter(|&(id, g)| {
                let node = &self.nodes[(id - 1) as usize];
                let voter = (node.multi.as_ref())
                    .and_then(|m| m.get(g))
                    .is_some_and(|r| r.is_voter());
                voter && !node.lost.contains(&g) && !node.catchups.contains_key(&g)
            })
            .collect();
        for h in healed {
            self.damaged.remove(&h);
        }
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
        damage_per_mille: 0,
    };
    let chaos_per_mille = pick.range(20, 200);
    // From 0 to 2.9% every 20 ms (none in a fifth of the runs): about two
    // tries a run, each made on a member with payload files on its disk.
    let damage_per_mille = pick.below(36).saturating_sub(6);
    let mut sim = Sim::new(seed, n, faults);
    sim.faults.damage_per_mille = damage_per_mille;
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
        if sim.rng.chance(sim.faults.damage_per_mille) {
            sim.damage()?;
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
                        data: pub_data(pid),
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
    // Every replica is whole and applies everything committed.
    let caught_up = |sim: &Sim, g: GroupId| {
        let members = sim.members_of(g);
        let whole = members.iter().all(|&id| {
            let node = &sim.nodes[(id - 1) as usize];
            !node.lost.contains(&g) && !node.catchups.contains_key(&g)
        });
        if !whole {
            return false;
        }
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

/// Group `g`'s log on a node whose logs are in `logs`: the control
/// group's in memory, a stream group's durable.
fn open_log(logs: &Path, g: GroupId) -> Box<dyn LogStore> {
    if g == 0 {
        return Box::new(MemoryLog::default());
    }
    Box::new(DurableLog::open_keeping(&logs.join(format!("g{g}"))).expect("a log this sim wrote"))
}
