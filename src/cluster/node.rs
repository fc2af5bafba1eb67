//! The Raft thread of a cluster node: it owns the pure core, the log and
//! state file, and the TCP transport, ticks the core every
//! [`raft::TICK_MS`], and keeps Raft's order (persist, then send, then
//! apply). The broker's event loop talks to it through channels: proposals
//! and snapshots in ([`ToRaft`]), committed entries, proposal outcomes and
//! role changes out ([`FromRaft`]), each batch followed by a wake of the
//! broker's loop. A [`View`] of the node (role, term, commit, peers) is
//! kept behind a mutex for status pages and metrics.
//!
//! The thread drives a [`Multi`]: the control group (group 0, whose
//! entries reach the broker) and one group per replicated stream this
//! node holds a replica of ([`ToRaft::Group`]), each with its state file
//! and log in a directory of its own (`raft/g<group>`). All groups share
//! one tick and the transport; their heartbeats to one node go out as one
//! message (`raft_multi::outgoing`). A stream group's proposals, committed
//! entries, snapshots and role changes travel as [`GroupEvent`]s (the
//! broker keeps the stream's state machine); its role, leader and log
//! positions are also in the [`View`]. Every group's log is written and
//! fsynced like the control group's before its entries count.
//!
//! The control group's configuration is replicated state (see
//! [`super::members`]): membership changes come in as [`ToRaft::Add`] and
//! [`ToRaft::Remove`], the configuration at the snapshot's index is
//! stored beside the snapshot (`raft/membership`), and the transport's
//! peers follow the configuration in effect ([`Worker::follow_members`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Waker;

use super::members::{self, MemberInfo};
use super::raft::{
    self, ChangeError, ChangeState, Config, ProposeError, Proposed, Raft, Ready, Role, Status,
};
use super::raft_auth::ClusterKey;
use super::raft_log::{self, DurableLog, LogStore, MembershipFile, MemoryLog, StateFile};
use super::raft_msg::{
    Body, Entry, EntryKind, GroupId, Membership, Message, NodeId, CONTROL_GROUP,
};
use super::raft_multi::{self, Multi};
use super::raft_transport::{Transport, TransportConfig, TransportStats};
use super::snapshot_file::{self, FileRef, Receiving};

/// What the broker asks of the Raft thread.
pub enum ToRaft {
    /// Propose `data`; the outcome comes back as [`FromRaft::Proposed`].
    Propose { tag: u64, data: Vec<u8> },
    /// The state machine's snapshot at `index`, asked for by
    /// [`FromRaft::WantSnapshot`].
    Compact { index: u64, data: Vec<u8> },
    /// Hold a replica of stream group `group`, whose voters are
    /// `members` (this node among them unless it `join`s). A node that
    /// joins a group formed without it starts as a non-voter, to be
    /// added by the group's leader (see [`ToRaft::GroupWant`]). A group
    /// held already is left as it is.
    Group {
        group: GroupId,
        members: Vec<NodeId>,
        join: bool,
    },
    /// The voters stream group `group` should have: while this node
    /// leads it, it adds the missing ones (one at a time, each promoted
    /// once current) and, once they all vote, removes the others; then
    /// it reports [`GroupEvent::Settled`] when `report` asks for it.
    GroupWant {
        group: GroupId,
        members: Vec<NodeId>,
        report: bool,
    },
    /// Stop holding stream group `group` and delete its log.
    GroupDrop { group: GroupId },
    /// Propose `data` to stream group `group`; the outcome comes back as
    /// [`GroupEvent::Proposed`].
    GroupPropose {
        group: GroupId,
        tag: u64,
        data: Vec<u8>,
    },
    /// Stream group `group`'s state at `index`, asked for by
    /// [`GroupEvent::WantSnapshot`]: the state machine's bytes, or (with
    /// a durable log) a [`FileRef`] to the file written into
    /// [`RaftNode::group_dir`]. Empty data: the snapshot could not be
    /// taken; it is asked for again a while later.
    GroupCompact {
        group: GroupId,
        index: u64,
        data: Vec<u8>,
        /// Payload files that died before `index`: deleted once the
        /// snapshot is stored.
        dead: Vec<PathBuf>,
    },
    /// The broker holds what the snapshot at `index` that arrived for
    /// stream group `group` ([`GroupEvent::Arrived`]) names: the core
    /// takes it now. Entries the core applied past `index` meanwhile are
    /// handed over again.
    GroupInstall { group: GroupId, index: u64 },
    /// Stream group `group`'s replica here lacks messages its log needs:
    /// the group starts again here without its log, as a non-voter, to
    /// be caught up by its leader (by snapshot).
    GroupLost { group: GroupId },
    /// Add `id` to the control group as a non-voter carrying `info`; the
    /// outcome comes back as [`FromRaft::Changed`].
    Add {
        tag: u64,
        id: NodeId,
        info: MemberInfo,
    },
    /// Remove `id` from the control group; answered by [`FromRaft::Changed`].
    Remove { tag: u64, id: NodeId },
    /// Members' Raft addresses as a member told them to this node while
    /// it waits to be added: the leader must hear its answers before the
    /// log has told it who the members are.
    Hint {
        members: BTreeMap<NodeId, MemberInfo>,
    },
}

/// What the Raft thread tells the broker about one stream group, in
/// order within the group.
#[derive(Debug)]
pub enum GroupEvent {
    /// Load this snapshot (taken at `index`) before what follows. When
    /// `data` is a [`FileRef`], `file` is that file, opened.
    Restore {
        index: u64,
        data: Vec<u8>,
        file: Option<File>,
    },
    /// A committed entry of term `term` (empty data: Raft's own). `at`:
    /// where the log stored `data` (file number and offset, see
    /// [`LogStore::data_at`]), so that the stream can keep its messages
    /// there instead of writing them again.
    Apply {
        index: u64,
        term: u64,
        data: Vec<u8>,
        at: Option<(u64, u64)>,
    },
    /// A proposal was appended to this leader's log at `(index, term)`,
    /// or refused.
    Proposed {
        tag: u64,
        result: Result<(u64, u64), ProposeError>,
    },
    /// The role, term or leader changed.
    Status(Status),
    /// The log is long: send [`ToRaft::GroupCompact`].
    WantSnapshot,
    /// A snapshot in a file came whole from the leader; the core takes it
    /// once the broker holds what it names ([`ToRaft::GroupInstall`]).
    Arrived {
        index: u64,
        data: Vec<u8>,
        file: Option<File>,
    },
    /// The replica was made whole at `index`, but the entries the core
    /// committed past it meanwhile are no longer in its log
    /// ([`ToRaft::GroupInstall`]): the replica lacks them, and the group
    /// must start again here without its log ([`ToRaft::GroupLost`]).
    ReplayFailed { index: u64 },
    /// This leader's group has exactly the voters last asked for with
    /// [`ToRaft::GroupWant`], and no change in flight.
    Settled { members: Vec<NodeId> },
}

/// What the Raft thread tells the broker, in order.
#[derive(Debug)]
pub enum FromRaft {
    /// Load this snapshot (taken at `index`) before applying what follows.
    Restore { index: u64, data: Vec<u8> },
    /// A committed command to apply (empty: an entry of Raft's own, which
    /// only moves the applied index).
    Apply { index: u64, data: Vec<u8> },
    /// A proposal was appended to this leader's log, or refused.
    Proposed {
        tag: u64,
        result: Result<u64, ProposeError>,
    },
    /// The role, term or leader changed.
    Status(Status),
    /// The log is long: send [`ToRaft::Compact`] with the current state.
    WantSnapshot,
    /// Something about stream group `group`.
    Group { group: GroupId, event: GroupEvent },
    /// A membership change was appended at `index` (it is done once the
    /// [`View`] shows it), or refused.
    Changed {
        tag: u64,
        result: Result<u64, ChangeError>,
    },
}

/// One member of the control group's configuration as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: NodeId,
    pub voter: bool,
    /// Its name and addresses, if the configuration carries them.
    pub info: Option<MemberInfo>,
}

/// One member as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    pub id: NodeId,
    /// The leader's idea of how far this member's log matches (leader only).
    pub match_index: Option<u64>,
    /// The transport has a connection to it (always true for oneself).
    pub connected: bool,
    /// On a leader: heard from within [`HEARD_WITHIN_MS`] (a frozen peer
    /// keeps its connection but falls silent). Elsewhere: `connected`.
    pub heard: bool,
}

/// A leader counts a follower as answering when it heard from it this
/// recently (heartbeats go out every 100 ms).
pub const HEARD_WITHIN_MS: u64 = 1_000;

/// The node's state for status pages, refreshed every loop of the thread.
#[derive(Debug, Clone)]
pub struct View {
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub commit: u64,
    pub last_index: u64,
    pub peers: Vec<PeerView>,
    /// Raft messages the transport dropped because a peer's queue was full.
    pub dropped: u64,
    /// The transport's counters (handshakes refused, messages rejected).
    pub transport: TransportStats,
    /// The stream groups held here.
    pub groups: BTreeMap<GroupId, GroupView>,
    /// The control group's configuration in effect, by id.
    pub members: Vec<MemberView>,
    /// The index of the entry that set it.
    pub conf_index: u64,
    /// The membership change in flight.
    pub change: ChangeState,
    /// This node is in the configuration.
    pub member: bool,
    /// This node was in the configuration and is no longer (it was
    /// removed); false for a node still waiting to be added.
    pub removed: bool,
}

/// One stream group as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub commit: u64,
    pub last_index: u64,
    /// On the group's leader: how far each other member's log matches.
    pub progress: BTreeMap<NodeId, u64>,
    /// On the group's leader: the other members that may vote (one that
    /// restarted without its log may not until it is caught up).
    pub voting: std::collections::BTreeSet<NodeId>,
}

/// The state file and log of one stream group.
struct GroupStore {
    state: StateFile,
    log: Box<dyn LogStore + Send>,
    /// Where the configuration at the snapshot's index is stored, once
    /// the group's members have changed.
    conf_file: MembershipFile,
    /// A snapshot was asked of the broker and has not come back yet.
    snapshot_asked: bool,
    /// The broker could not take a snapshot: not asked again before then.
    snapshot_retry: Option<Instant>,
    /// A snapshot file coming from a peer.
    receiving: Option<Receiving>,
    /// The voters the broker wants (see [`ToRaft::GroupWant`]).
    want: Option<Vec<NodeId>>,
    /// Report [`GroupEvent::Settled`] when the voters are `want`.
    report: bool,
    /// Ticks until [`GroupEvent::Settled`] is reported again (it repeats
    /// while settled, in case what the broker did with it was lost).
    settled_in: u32,
    /// A snapshot that arrived whole, waiting for the broker.
    install: Option<Message>,
    /// Payload files to delete once a snapshot at that index is stored.
    dead: Vec<(u64, Vec<PathBuf>)>,
    /// Its log was lost ([`LOST_MARK`]): it is not a voter yet.
    lost: bool,
}

/// Stream group `group`'s directory under the Raft directory `raft`.
fn group_dir(raft: &Path, group: GroupId) -> PathBuf {
    raft.join(format!("g{group}"))
}

/// Marks a stream group whose log was emptied (its replica or snapshot
/// file lacked what the log needed) until its core votes again: a log that
/// may have acknowledged entries it no longer holds must not vote, after
/// a restart either (an empty log with a term would vote at once).
const LOST_MARK: &str = "lost";

/// A stream group's durable log in `dir` emptied: its entries and its
/// snapshot record removed (the state and membership files stay), and
/// [`LOST_MARK`] made durable first.
fn empty_log(dir: &Path) -> Result<DurableLog, String> {
    let mark = dir.join(LOST_MARK);
    std::fs::File::create(&mark)
        .and_then(|f| crate::storage::fsync::sync_file(&f, &mark))
        .and_then(|()| crate::storage::fsync::sync_dir(dir))
        .map_err(|e| format!("raft log: marking it lost: {e}"))?;
    raft_log::remove_log(dir).map_err(|e| format!("raft log: removing it: {e}"))?;
    DurableLog::open_keeping(dir).map_err(|e| format!("raft log: {e}"))
}

/// Where a dead file is deleted from: a log's data file (`data.<n>`) is
/// renamed out of the log's names first (`.gone`, which the log deletes
/// when it opens); None if it is gone already.
fn leave_name(path: PathBuf) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    if !name.starts_with("data.") {
        return Some(path);
    }
    let gone = path.with_file_name(format!("{name}.gone"));
    match std::fs::rename(&path, &gone) {
        Ok(()) => Some(gone),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            crate::log_error!("{}: {e}", path.display());
            None
        }
    }
}

/// The index of the snapshot a message carries.
fn snapshot_index(m: &Message) -> Option<u64> {
    match &m.body {
        Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } => Some(snapshot.index),
        _ => None,
    }
}

/// How long a group whose snapshot could not be taken waits to ask again.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(10);

/// How often a stream group leader repeats [`GroupEvent::Settled`]
/// (in ticks of [`raft::TICK_MS`]).
const SETTLED_EVERY_TICKS: u32 = 20;

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    pub listen: SocketAddr,
    /// Every member (this one included) and its Raft address.
    pub members: BTreeMap<NodeId, SocketAddr>,
    /// Holds `raft/` (state file and log).
    pub data: PathBuf,
    pub memory_log: bool,
    pub bootstrap: bool,
    /// The cluster secret every Raft connection proves it holds (none:
    /// no handshake, anyone who reaches the Raft port takes part).
    pub secret: Option<ClusterKey>,
    /// Members' names, for log lines.
    pub names: BTreeMap<NodeId, String>,
    /// The seed members' names and addresses, stored in the configuration
    /// a new cluster starts from (empty: the configuration carries none).
    pub infos: BTreeMap<NodeId, MemberInfo>,
    /// Start with an empty configuration and wait to be added (`-join`).
    pub join: bool,
}

/// The broker's handle on the Raft thread.
pub struct RaftNode {
    /// `<data>/raft`, unless the log is kept in memory.
    durable_dir: Option<PathBuf>,
    to_raft: RaftSender,
    rx: Receiver<FromRaft>,
    view: Arc<Mutex<View>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RaftNode {
    /// Opens the state and log under `<data>/raft`, binds the transport
    /// and starts the thread. `notify` is woken whenever [`FromRaft`]
    /// messages are waiting.
    pub fn start(cfg: NodeConfig, notify: Arc<Waker>) -> Result<RaftNode, String> {
        let dir = cfg.data.join("raft");
        let state = StateFile::open(&dir).map_err(|e| format!("raft state: {e}"))?;
        let hs = state.load().map_err(|e| format!("raft state: {e}"))?;
        let mut log: Box<dyn LogStore + Send> = if cfg.memory_log {
            Box::new(MemoryLog::new())
        } else {
            Box::new(DurableLog::open(&dir).map_err(|e| format!("raft log: {e}"))?)
        };
        let loaded = log.load().map_err(|e| format!("raft log: {e}"))?;
        let empty = loaded.snapshot.index == 0 && loaded.entries.is_empty();
        let conf_file = MembershipFile::open(&dir).map_err(|e| format!("raft membership: {e}"))?;
        let stored = if cfg.memory_log {
            None
        } else {
            conf_file
                .load()
                .map_err(|e| format!("raft membership: {e}"))?
        };
        let mut rc = control_config(&cfg, stored);
        rc.voter = raft::starts_as_voter(cfg.bootstrap, cfg.memory_log, &hs, empty);
        rc.forward_proposals = false;
        rc.seed = crate::rand::random_seed() ^ cfg.id;
        let first = (loaded.snapshot.index > 0).then(|| FromRaft::Restore {
            index: loaded.snapshot.index,
            data: loaded.snapshot.data.clone(),
        });
        let core = Raft::new(rc, hs, loaded.snapshot, loaded.entries);
        let (peers, names) = peers_of(cfg.id, core.configuration(), &cfg.members);
        let mut tcfg = TransportConfig::new(cfg.id, cfg.listen, peers);
        tcfg.secret = cfg.secret.clone();
        tcfg.names = cfg.names.clone();
        tcfg.names.extend(names);
        tcfg.open = !core.configuration().contains(cfg.id);
        let conf_index = core.configuration_index();
        let was_member = core.configuration().contains(cfg.id) || (!empty && !cfg.join);
        let net = Transport::bind(tcfg).map_err(|e| format!("raft listen {}: {e}", cfg.listen))?;
        let wake_raft = net.waker();
        let (tx, in_rx) = mpsc::channel();
        let (out_tx, rx) = mpsc::channel();
        if let Some(f) = first {
            let _ = out_tx.send(f);
        }
        let mut multi = Multi::new(cfg.id);
        multi.insert(CONTROL_GROUP, core);
        let view = Arc::new(Mutex::new(view_of(&multi, &net, was_member)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut worker = Worker {
            multi,
            state,
            log,
            groups: BTreeMap::new(),
            dir,
            memory_log: cfg.memory_log,
            net,
            rx: in_rx,
            tx: out_tx,
            notify,
            view: Arc::clone(&view),
            stop: Arc::clone(&stop),
            snapshot_asked: false,
            conf_file,
            seeds: cfg.members.clone(),
            conf_index,
            peers_leader: None,
            was_member,
        };
        let thread = std::thread::Builder::new()
            .name("raft".into())
            .spawn(move || worker.run())
            .map_err(|e| format!("raft thread: {e}"))?;
        Ok(RaftNode {
            durable_dir: (!cfg.memory_log).then(|| cfg.data.join("raft")),
            to_raft: RaftSender {
                tx,
                wake_raft: Some(wake_raft),
            },
            rx,
            view,
            stop,
            thread: Some(thread),
        })
    }

    /// A handle with no thread behind it: what the broker sends to Raft
    /// arrives at the returned [`RaftEnd`], and what is sent from there
    /// reaches the broker as the Raft thread's output (the waker is not
    /// called: whoever plays the thread calls `Handler::woken`). It is how
    /// the broker's in-process tests play Raft, as they play sockets.
    pub fn detached(view: View) -> (RaftNode, RaftEnd) {
        let (tx, rx) = mpsc::channel();
        let (out_tx, out_rx) = mpsc::channel();
        let view = Arc::new(Mutex::new(view));
        let node = RaftNode {
            durable_dir: None,
            to_raft: RaftSender {
                tx,
                wake_raft: None,
            },
            rx: out_rx,
            view: Arc::clone(&view),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            thread: None,
        };
        let end = RaftEnd {
            rx,
            tx: out_tx,
            view,
        };
        (node, end)
    }

    pub fn send(&self, m: ToRaft) {
        self.to_raft.send(m);
    }

    /// A handle that sends to the Raft thread from another thread.
    pub fn sender(&self) -> RaftSender {
        self.to_raft.clone()
    }

    /// Where stream group `group` keeps its snapshot files, when its log
    /// is durable (else its snapshots are bytes in memory).
    pub fn group_dir(&self, group: GroupId) -> Option<PathBuf> {
        self.durable_dir.as_ref().map(|d| group_dir(d, group))
    }

    /// The next message from the Raft thread, if one waits.
    pub fn try_recv(&self) -> Option<FromRaft> {
        self.rx.try_recv().ok()
    }

    pub fn view(&self) -> View {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The far end of a [`RaftNode::detached`] handle, held by whoever plays
/// the Raft thread.
pub struct RaftEnd {
    /// What the broker asked of Raft, in order.
    pub rx: Receiver<ToRaft>,
    /// Raft's output to the broker.
    pub tx: Sender<FromRaft>,
    /// The view the broker reads ([`RaftNode::view`]).
    pub view: Arc<Mutex<View>>,
}

/// Sends to the Raft thread from any thread (see [`RaftNode::sender`]).
#[derive(Clone)]
pub struct RaftSender {
    tx: Sender<ToRaft>,
    /// `None` for a detached handle.
    wake_raft: Option<Arc<Waker>>,
}

impl RaftSender {
    pub fn send(&self, m: ToRaft) {
        if self.tx.send(m).is_ok() {
            if let Some(w) = &self.wake_raft {
                let _ = w.wake();
            }
        }
    }
}

impl Drop for RaftNode {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(w) = &self.to_raft.wake_raft {
            let _ = w.wake();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The control group's core settings: its seed members, and the
/// configuration stored beside the snapshot, else (for a new cluster) the
/// seed members with their addresses. A node that joins starts with no
/// members at all: the leader's entries or snapshot tell it.
fn control_config(cfg: &NodeConfig, stored: Option<Membership>) -> Config {
    if cfg.join {
        let mut rc = Config::new(cfg.id, Vec::new());
        rc.membership = stored;
        return rc;
    }
    let mut rc = Config::new(cfg.id, cfg.members.keys().copied().collect());
    rc.membership = stored.or_else(|| (!cfg.infos.is_empty()).then(|| members::seed(&cfg.infos)));
    rc
}

/// The transport's peers for configuration `conf`: every other member's
/// Raft address, from the configuration, else from the seed list; and the
/// names the configuration gives them.
fn peers_of(
    me: NodeId,
    conf: &Membership,
    seeds: &BTreeMap<NodeId, SocketAddr>,
) -> (BTreeMap<NodeId, SocketAddr>, BTreeMap<NodeId, String>) {
    let dir = members::directory(conf);
    let mut peers = BTreeMap::new();
    let mut names = BTreeMap::new();
    for id in conf.ids() {
        if id == me {
            continue;
        }
        let addr = dir
            .get(&id)
            .map(|i| i.raft)
            .or_else(|| seeds.get(&id).copied());
        if let Some(a) = addr {
            peers.insert(id, a);
        }
        if let Some(i) = dir.get(&id) {
            names.insert(id, i.name.clone());
        }
    }
    (peers, names)
}

fn view_of(multi: &Multi, net: &Transport, was_member: bool) -> View {
    let core = multi.get(CONTROL_GROUP).expect("the control group");
    let me = core.id();
    let progress = core.progress();
    let quiet = core.quiet_ticks();
    let conf = core.configuration();
    let member = conf.contains(me);
    let peers = conf
        .ids()
        .into_iter()
        .map(|id| PeerView {
            id,
            match_index: if id == me && core.role() == Role::Leader {
                Some(core.last_index())
            } else {
                progress.get(&id).copied()
            },
            connected: id == me || net.is_connected(id),
            heard: id == me
                || match quiet.get(&id) {
                    Some(&q) => u64::from(q) * raft::TICK_MS < HEARD_WITHIN_MS,
                    None => net.is_connected(id),
                },
        })
        .collect();
    View {
        role: core.role(),
        term: core.term(),
        leader: core.leader(),
        commit: core.commit(),
        last_index: core.last_index(),
        peers,
        dropped: net.stats().dropped_full,
        transport: net.stats(),
        groups: crate::maps::map_of((multi.groups()).filter(|(g, _)| *g != CONTROL_GROUP).map(
            |(g, r)| {
                let view = GroupView {
                    role: r.role(),
                    term: r.term(),
                    leader: r.leader(),
                    commit: r.commit(),
                    last_index: r.last_index(),
                    progress: r.progress(),
                    voting: r.may_vote(),
                };
                (g, view)
            },
        )),
        members: conf
            .members
            .iter()
            .map(|m| MemberView {
                id: m.id,
                voter: m.voter,
                info: MemberInfo::decode(&m.data),
            })
            .collect(),
        conf_index: core.configuration_index(),
        change: core.change_state(),
        member,
        removed: was_member && !member,
    }
}

struct Worker {
    /// The control group and the stream groups held here.
    multi: Multi,
    /// The control group's state file and log.
    state: StateFile,
    log: Box<dyn LogStore + Send>,
    groups: BTreeMap<GroupId, GroupStore>,
    /// `<data>/raft`: the stream groups' directories are under it.
    dir: PathBuf,
    memory_log: bool,
    net: Transport,
    rx: Receiver<ToRaft>,
    tx: Sender<FromRaft>,
    notify: Arc<Waker>,
    view: Arc<Mutex<View>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// A snapshot was asked of the broker and has not come back yet.
    snapshot_asked: bool,
    /// Where the configuration at the snapshot's index is stored.
    conf_file: MembershipFile,
    /// The seed members' Raft addresses (`-raft-peers`), for members
    /// whose configuration entry carries none.
    seeds: BTreeMap<NodeId, SocketAddr>,
    /// The configuration index and leader the transport's peers follow.
    conf_index: u64,
    peers_leader: Option<NodeId>,
    /// This node has been in the configuration.
    was_member: bool,
}

impl Worker {
    fn run(&mut self) {
        let tick = Duration::from_millis(raft::TICK_MS);
        let mut next_tick = Instant::now() + tick;
        let mut inbox = Vec::new();
        while !self.stop.load(std::sync::atomic::Ordering::Acquire) {
            let wait = next_tick.saturating_duration_since(Instant::now());
            if let Err(e) = self.net.poll(wait, &mut inbox) {
                crate::log_error!("raft transport: {e}");
                std::thread::sleep(tick);
            }
            let mut out = Vec::new();
            for m in std::mem::take(&mut inbox) {
                self.take(m, &mut out);
            }
            loop {
                match self.rx.try_recv() {
                    Ok(ToRaft::Propose { tag, data }) => {
                        let core = self
                            .multi
                            .get_mut(CONTROL_GROUP)
                            .expect("the control group");
                        let result = match core.propose(data) {
                            Ok(Proposed::Appended { index, .. }) => Ok(index),
                            Ok(Proposed::Forwarded { .. }) => Err(ProposeError::NotLeader(None)),
                            Err(e) => Err(e),
                        };
                        out.push(FromRaft::Proposed { tag, result });
                    }
                    Ok(ToRaft::Compact { index, data }) => {
                        self.snapshot_asked = false;
                        if let Some(core) = self.multi.get_mut(CONTROL_GROUP) {
                            core.compact(index, data);
                        }
                    }
                    Ok(ToRaft::Group {
                        group,
                        members,
                        join,
                    }) => {
                        if let Err(e) = self.hold_group(group, members, join, false, &mut out) {
                            crate::log_error!("stream group {group}: {e}");
                        }
                    }
                    Ok(ToRaft::GroupWant {
                        group,
                        members,
                        report,
                    }) => {
                        if let Some(g) = self.groups.get_mut(&group) {
                            g.want = Some(members);
                            g.report = report;
                            g.settled_in = 0;
                        }
                    }
                    Ok(ToRaft::GroupDrop { group }) => self.drop_group(group),
                    Ok(ToRaft::GroupPropose { group, tag, data }) => {
                        let result = match self.multi.get_mut(group) {
                            Some(core) if group != CONTROL_GROUP => match core.propose(data) {
                                Ok(Proposed::Appended { index, term }) => Ok((index, term)),
                                Ok(Proposed::Forwarded { .. }) => {
                                    Err(ProposeError::NotLeader(core.leader()))
                                }
                                Err(e) => Err(e),
                            },
                            _ => Err(ProposeError::NotLeader(None)),
                        };
                        let event = GroupEvent::Proposed { tag, result };
                        out.push(FromRaft::Group { group, event });
                    }
                    Ok(ToRaft::GroupCompact {
                        group,
                        index,
                        data,
                        dead,
                    }) => {
                        if let Some(g) = self.groups.get_mut(&group) {
                            g.snapshot_asked = false;
                            if !dead.is_empty() {
                                // Deleted with the next snapshot stored
                                // at `index` or later, also when this
                                // one could not be taken.
                                g.dead.push((index, dead));
                            }
                            if data.is_empty() {
                                g.snapshot_retry = Some(Instant::now() + SNAPSHOT_RETRY);
                                continue;
                            }
                        }
                        if let Some(core) =
                            self.multi.get_mut(group).filter(|_| group != CONTROL_GROUP)
                        {
                            core.compact(index, data);
                        }
                    }
                    Ok(ToRaft::GroupInstall { group, index }) => {
                        let held = self.groups.get_mut(&group).and_then(|g| g.install.take());
                        match held {
                            Some(m) if snapshot_index(&m) == Some(index) => self.multi.step(m),
                            // Older than the state the replica was made
                            // whole at: no longer wanted.
                            Some(m) if snapshot_index(&m) < Some(index) => {}
                            Some(m) => {
                                if let Some(g) = self.groups.get_mut(&group) {
                                    g.install = Some(m);
                                }
                            }
                            None => {}
                        }
                        self.replay(group, index, &mut out);
                    }
                    Ok(ToRaft::GroupLost { group }) => {
                        if let Err(e) = self.lose_group(group, &mut out) {
                            crate::log_error!("stream group {group}: {e}");
                        }
                    }
                    Ok(ToRaft::Add { tag, id, info }) => {
                        let result = self.propose_add(id, &info);
                        out.push(FromRaft::Changed { tag, result });
                    }
                    Ok(ToRaft::Remove { tag, id }) => {
                        let result = self.propose_remove(id);
                        out.push(FromRaft::Changed { tag, result });
                    }
                    Ok(ToRaft::Hint { members }) => self.hint(members),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            let now = Instant::now();
            if now >= next_tick {
                self.multi.tick();
                self.change_groups(&mut out);
                next_tick += tick;
                if next_tick < now {
                    next_tick = now + tick;
                }
            }
            if let Err(e) = self.drive(&mut out) {
                // A log that cannot be written cannot be trusted: stop
                // taking part rather than acknowledge what is not stored.
                crate::log_error!("raft storage failed, leaving the cluster: {e}");
                return;
            }
            self.follow_members();
            *self.view.lock().unwrap_or_else(|p| p.into_inner()) =
                view_of(&self.multi, &self.net, self.was_member);
            if !out.is_empty() {
                for m in out {
                    if self.tx.send(m).is_err() {
                        return;
                    }
                }
                let _ = self.notify.wake();
            }
        }
    }

    /// One message from a peer: a piece of a snapshot file is written
    /// down, a snapshot naming a file goes to its core only once the file
    /// is here whole, and the rest goes to the cores.
    fn take(&mut self, m: Message, out: &mut Vec<FromRaft>) {
        if m.group == CONTROL_GROUP || self.memory_log {
            self.multi.step(m);
            return;
        }
        let dir = group_dir(&self.dir, m.group);
        let Some(g) = self.groups.get_mut(&m.group) else {
            self.multi.step(m);
            return;
        };
        match &m.body {
            Body::SnapshotChunk {
                index,
                snap_term,
                offset,
                total,
                data,
            } => {
                let (i, t, o, n) = (*index, *snap_term, *offset, *total);
                if let Err(e) = Receiving::piece(&mut g.receiving, &dir, m.from, i, t, o, n, data) {
                    crate::log_error!("stream group {}: receiving a snapshot: {e}", m.group);
                }
            }
            Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } => {
                let taken = (self.multi.get(m.group))
                    .is_some_and(|c| c.takes_snapshot(m.term, snapshot.index, snapshot.term));
                let Some(r) = FileRef::decode(&snapshot.data).filter(|_| taken) else {
                    // A snapshot the core will not install (its log holds
                    // that entry, or it is stale) goes to it as it is: the
                    // replica must not rebase onto it.
                    self.multi.step(m);
                    return;
                };
                let group_of = m.group;
                let (index, term) = (snapshot.index, snapshot.term);
                match Receiving::finish(&mut g.receiving, &dir, m.from, index, term, &r) {
                    Ok(true) => {
                        // The broker first fetches what the snapshot names
                        // and this replica lacks; the core takes it after.
                        let again = g.install.as_ref().and_then(snapshot_index) == Some(index);
                        let data = snapshot.data.clone();
                        g.install = Some(m);
                        if !again {
                            crate::log_info!(
                                "stream group {group_of}: the leader's snapshot at {index} arrived"
                            );
                            let file = self.snapshot_file(group_of, index, &data);
                            let event = GroupEvent::Arrived { index, data, file };
                            out.push(FromRaft::Group {
                                group: group_of,
                                event,
                            });
                        }
                    }
                    // Not all here: the leader sends it again.
                    Ok(false) => {}
                    Err(e) => {
                        crate::log_error!("stream group {}: receiving a snapshot: {e}", m.group)
                    }
                }
            }
            _ => self.multi.step(m),
        }
    }

    /// Sends `m`; a stream group's snapshot kept in a file goes with the
    /// file.
    fn send(&mut self, m: &Message) {
        let file_snapshot = match &m.body {
            Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. }
                if m.group != CONTROL_GROUP && !self.memory_log =>
            {
                FileRef::decode(&snapshot.data).map(|r| (snapshot.index, r))
            }
            _ => None,
        };
        let Some((index, r)) = file_snapshot else {
            self.net.send(m);
            return;
        };
        match snapshot_file::open(&group_dir(&self.dir, m.group), index, &r) {
            Ok(f) => self.net.send_snapshot_file(m, f, r.size),
            Err(e) => crate::log_error!("stream group {}: its snapshot: {e}", m.group),
        }
    }

    /// The file a stream group's snapshot names, opened (so that it is
    /// read whole even if a newer snapshot replaces it meanwhile).
    fn snapshot_file(&self, group: GroupId, index: u64, data: &[u8]) -> Option<File> {
        let r = FileRef::decode(data).filter(|_| !self.memory_log)?;
        match snapshot_file::open(&group_dir(&self.dir, group), index, &r) {
            Ok(f) => Some(f),
            Err(e) => {
                crate::log_error!("stream group {group}: its snapshot at {index}: {e}");
                None
            }
        }
    }

    fn control(&mut self) -> &mut Raft {
        self.multi
            .get_mut(CONTROL_GROUP)
            .expect("the control group")
    }

    /// Proposes adding `id` after checking that no member has its name or
    /// addresses.
    fn propose_add(&mut self, id: NodeId, info: &MemberInfo) -> Result<u64, ChangeError> {
        let core = self.control();
        if core.role() == Role::Leader {
            if let Err(why) = members::check_add(core.configuration(), id, info) {
                crate::log_info!("cluster.add refused: {why}");
                return Err(ChangeError::Duplicate(id));
            }
        }
        core.propose_add(id, info.encode())
    }

    fn propose_remove(&mut self, id: NodeId) -> Result<u64, ChangeError> {
        self.control().propose_remove(id)
    }

    /// The configuration the core keeps with its snapshot, stored before
    /// the snapshot itself (see [`MembershipFile`]).
    fn store_snapshot_config(&mut self) -> Result<(), String> {
        let conf = self
            .multi
            .get(CONTROL_GROUP)
            .and_then(|c| c.snapshot_config().cloned());
        match conf {
            Some(c) => self
                .conf_file
                .save(&c)
                .map_err(|e| format!("raft membership: {e}")),
            None => Ok(()),
        }
    }

    /// A waiting node learns where members are: it dials them (and they,
    /// once they have added it, accept it) so that its answers reach the
    /// leader. The configuration, once it names them, takes over.
    fn hint(&mut self, hinted: BTreeMap<NodeId, MemberInfo>) {
        let me = self.multi.id();
        let mut changed = false;
        for (id, info) in hinted {
            if id != me && self.seeds.insert(id, info.raft) != Some(info.raft) {
                changed = true;
            }
        }
        if changed {
            // Forces follow_members to take the new addresses.
            self.conf_index = u64::MAX;
        }
    }

    /// Once the configuration in effect changed: the transport dials and
    /// accepts its members (a new member at once, a removed one no more),
    /// and takes strangers only while this node is not a member.
    fn follow_members(&mut self) {
        let core = self.multi.get(CONTROL_GROUP).expect("the control group");
        let index = core.configuration_index();
        let me = core.id();
        let conf = core.configuration();
        let member = conf.contains(me);
        if member {
            self.was_member = true;
        }
        let leader = core.leader().filter(|&l| l != me);
        if index == self.conf_index && self.net.is_open() != member && leader == self.peers_leader {
            return;
        }
        let (mut peers, names) = peers_of(me, conf, &self.seeds);
        // The leader stays a peer even once the configuration leaves it
        // out: a leader that removes itself leads until the removal
        // commits, and needs its followers' answers for that.
        if let Some(l) = leader {
            if let Some(a) = self
                .net
                .peer_addr(l)
                .or_else(|| self.seeds.get(&l).copied())
            {
                peers.entry(l).or_insert(a);
            }
        }
        self.peers_leader = leader;
        if !member {
            // Waiting to be added (or removed): dial every member heard of.
            for (&id, &a) in &self.seeds {
                if id != me {
                    peers.entry(id).or_insert(a);
                }
            }
        }
        self.conf_index = index;
        self.net.set_open(!member);
        self.net.set_peers(peers, names);
    }

    /// Opens (or creates) the state and log of stream group `group` under
    /// `raft/g<group>` and starts its core, unless it is held already.
    /// A snapshot in its log goes to the broker first, as a
    /// [`GroupEvent::Restore`].
    fn hold_group(
        &mut self,
        group: GroupId,
        members: Vec<NodeId>,
        join: bool,
        lost_log: bool,
        out: &mut Vec<FromRaft>,
    ) -> Result<(), String> {
        if group == CONTROL_GROUP || self.multi.get(group).is_some() {
            return Ok(());
        }
        let me = self.multi.id();
        if !join && !members.contains(&me) {
            return Err("this node is not among its members".into());
        }
        let dir = group_dir(&self.dir, group);
        let state = StateFile::open(&dir).map_err(|e| format!("raft state: {e}"))?;
        let hs = state.load().map_err(|e| format!("raft state: {e}"))?;
        let mut log: Box<dyn LogStore + Send> = if self.memory_log {
            Box::new(MemoryLog::new())
        } else {
            Box::new(DurableLog::open_keeping(&dir).map_err(|e| format!("raft log: {e}"))?)
        };
        let mut loaded = log.load().map_err(|e| format!("raft log: {e}"))?;
        // A snapshot whose file is gone or cut: the group starts here as a
        // node that lost its log, a non-voter until the leader has caught
        // it up (by snapshot), rather than from a state it does not have.
        let snap_ref = FileRef::decode(&loaded.snapshot.data).filter(|_| !self.memory_log);
        let opened = snap_ref.map(|r| snapshot_file::open(&dir, loaded.snapshot.index, &r));
        let (mut snap_file, mut lost) = (None, lost_log || dir.join(LOST_MARK).exists());
        match opened {
            Some(Ok(f)) => snap_file = Some(f),
            Some(Err(e)) => {
                crate::log_error!(
                    "stream group {group}: its snapshot at {}: {e}; starting without its log, \
                     to be caught up by the group's leader",
                    loaded.snapshot.index
                );
                drop(log);
                log = Box::new(empty_log(&dir)?);
                loaded = log.load().map_err(|e| format!("raft log: {e}"))?;
                lost = true;
            }
            None => {}
        }
        let empty = loaded.snapshot.index == 0 && loaded.entries.is_empty();
        let conf_file = MembershipFile::open(&dir).map_err(|e| format!("raft membership: {e}"))?;
        let stored = if self.memory_log {
            None
        } else {
            conf_file
                .load()
                .map_err(|e| format!("raft membership: {e}"))?
        };
        let mut rc = Config::new(me, members);
        rc.group = group;
        rc.membership = stored;
        // The placement, applied, is the group's bootstrap: every member
        // votes from the start. A node placed later joins: with an empty
        // log it waits, as a non-voter, to be added and caught up.
        rc.voter = raft::starts_as_voter(!join, self.memory_log || lost, &hs, empty);
        rc.forward_proposals = false;
        rc.seed = crate::rand::random_seed() ^ me ^ group.rotate_left(32);
        if !self.memory_log {
            snapshot_file::clean(&dir, &[loaded.snapshot.index], true);
        }
        if loaded.snapshot.index > 0 {
            let index = loaded.snapshot.index;
            let data = loaded.snapshot.data.clone();
            let event = GroupEvent::Restore {
                index,
                data,
                file: snap_file,
            };
            out.push(FromRaft::Group { group, event });
        }
        let core = Raft::new(rc, hs, loaded.snapshot, loaded.entries);
        self.multi.insert(group, core);
        self.groups.insert(
            group,
            GroupStore {
                state,
                log,
                conf_file,
                snapshot_asked: false,
                snapshot_retry: None,
                receiving: None,
                want: None,
                report: false,
                settled_in: 0,
                install: None,
                dead: Vec::new(),
                lost,
            },
        );
        Ok(())
    }

    /// Starts stream group `group` again without its log, as a node that
    /// lost it: a non-voter until its leader has caught it up.
    fn lose_group(&mut self, group: GroupId, out: &mut Vec<FromRaft>) -> Result<(), String> {
        if group == CONTROL_GROUP || self.memory_log {
            return Ok(());
        }
        let Some(core) = self.multi.remove(group) else {
            return Ok(());
        };
        let members = core.members().to_vec();
        // The new core's life must be a new epoch: what the old one told
        // the leader (that it may vote) does not hold for it.
        if let Some(g) = self.groups.get_mut(&group) {
            g.state
                .save(&core.hard_state())
                .map_err(|e| format!("raft state: {e}"))?;
        }
        self.groups.remove(&group);
        empty_log(&group_dir(&self.dir, group))?;
        crate::log_warn!(
            "stream group {group}: its replica here lacks messages; starting without its log, \
             to be caught up by the group's leader"
        );
        self.hold_group(group, members, false, true, out)
    }

    /// Stream group `group`'s replica was made whole at `index` from a
    /// snapshot it fetched, while its core, fed by a leader whose log
    /// covers that snapshot, committed entries past it (they were handed
    /// over and not applied): they go to the broker again, from the
    /// core's log, after everything handed over so far. If the log no
    /// longer holds them, [`GroupEvent::ReplayFailed`] says so.
    fn replay(&mut self, group: GroupId, index: u64, out: &mut Vec<FromRaft>) {
        let Some(core) = self.multi.get(group).filter(|_| group != CONTROL_GROUP) else {
            return;
        };
        let log = self.groups.get(&group).map(|g| g.log.as_ref());
        let event = |e: &Entry| GroupEvent::Apply {
            index: e.index,
            term: e.term,
            at: log.and_then(|l| l.data_at(e.index)),
            data: if e.kind == EntryKind::Command {
                e.data.clone()
            } else {
                Vec::new()
            },
        };
        match core.applied_after(index) {
            Some([]) => {}
            Some(entries) => {
                crate::log_info!(
                    "stream group {group}: {} entries after {index} applied again",
                    entries.len()
                );
                for e in entries {
                    out.push(FromRaft::Group {
                        group,
                        event: event(e),
                    });
                }
            }
            None => out.push(FromRaft::Group {
                group,
                event: GroupEvent::ReplayFailed { index },
            }),
        }
    }

    /// Stops holding stream group `group` (its stream was deleted, or its
    /// replica here moved to another node) and deletes its files.
    fn drop_group(&mut self, group: GroupId) {
        if group == CONTROL_GROUP || self.multi.remove(group).is_none() {
            return;
        }
        self.groups.remove(&group);
        let dir = group_dir(&self.dir, group);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::log_warn!("stream group {group}: removing {}: {e}", dir.display());
            }
        }
    }

    /// On each stream group this node leads, moves its voters one step
    /// towards those the broker wants: adds a missing one (the core
    /// promotes it once it is current), or, once every wanted node votes,
    /// removes one that is not wanted (a leader removing itself hands
    /// over first). One change at a time, and none while one is in flight.
    fn change_groups(&mut self, out: &mut Vec<FromRaft>) {
        for (&group, g) in &mut self.groups {
            let Some(want) = g.want.as_ref() else {
                continue;
            };
            let Some(core) = self.multi.get_mut(group) else {
                continue;
            };
            if core.role() != Role::Leader || core.change_state() != ChangeState::Idle {
                continue;
            }
            let conf = core.configuration();
            let missing = want.iter().copied().find(|&n| !conf.contains(n));
            let all_vote = want.iter().all(|&n| conf.is_voter(n));
            let extra = conf
                .members
                .iter()
                .map(|m| m.id)
                .find(|n| !want.contains(n));
            let result = match (missing, extra) {
                (Some(n), _) => core.propose_add(n, Vec::new()).map(|_| ("adding", n)),
                (None, Some(n)) if all_vote => core.propose_remove(n).map(|_| ("removing", n)),
                (None, None) if all_vote => {
                    if g.settled_in > 0 {
                        g.settled_in -= 1;
                    } else if g.report {
                        g.settled_in = SETTLED_EVERY_TICKS;
                        let members = want.clone();
                        let event = GroupEvent::Settled { members };
                        out.push(FromRaft::Group { group, event });
                    }
                    continue;
                }
                _ => continue,
            };
            // Refused: not ready yet (no entry of this term committed);
            // tried again on the next tick.
            if let Ok((what, n)) = result {
                crate::log_info!("stream group {group}: {what} node {n}");
            }
        }
    }

    /// Persist, then send, then hand over for applying.
    ///
    /// Every group's `Ready` is persisted (each to its own files) before
    /// any of their messages go out, heartbeats to one node coalesced.
    /// The control group's outcomes go to the broker as they are, a
    /// stream group's as [`FromRaft::Group`].
    ///
    /// The core asks for a snapshot in every `Ready` until one is handed
    /// to it, and the broker's answer only comes through `rx`, outside
    /// this loop: the wish is passed on once, and a round whose `Ready`s
    /// hold nothing else ends the loop (else it would spin here for ever,
    /// the node silent to its peers).
    fn drive(&mut self, out: &mut Vec<FromRaft>) -> Result<(), String> {
        loop {
            let mut readies = self.multi.ready();
            if readies.is_empty() {
                return Ok(());
            }
            self.hand_over_stored(&mut readies, out);
            self.send_appends(&mut readies);
            let mut afters = Vec::with_capacity(readies.len());
            let mut only_wishes = true;
            for (group, ready) in readies {
                let stored = ready.hard_state.is_some()
                    || ready.snapshot.is_some()
                    || ready.entries.is_some();
                if group == CONTROL_GROUP {
                    if ready.snapshot.is_some() && !self.memory_log {
                        self.store_snapshot_config()?;
                    }
                    let state = &mut self.state;
                    raft_log::persist(&ready, &mut |hs| state.save(hs), self.log.as_mut())
                        .map_err(|e| e.to_string())?;
                } else if let Some(g) = self.groups.get_mut(&group) {
                    if ready.snapshot.is_some() && !self.memory_log {
                        let conf = self.multi.get(group).and_then(|c| c.snapshot_config());
                        if let Some(c) = conf {
                            g.conf_file
                                .save(c)
                                .map_err(|e| format!("stream group {group}: membership: {e}"))?;
                        }
                    }
                    let state = &mut g.state;
                    raft_log::persist(&ready, &mut |hs| state.save(hs), g.log.as_mut())
                        .map_err(|e| format!("stream group {group}: {e}"))?;
                    if let Some(snap) = ready.snapshot.as_ref().filter(|_| !self.memory_log) {
                        // A leader's snapshot held back while the replica
                        // fetches what it names keeps its file too: this
                        // one may be the replica's own, asked for before
                        // the leader's arrived.
                        let held = g.install.as_ref().and_then(snapshot_index);
                        let keep: Vec<u64> =
                            [Some(snap.index), held].into_iter().flatten().collect();
                        snapshot_file::clean(&group_dir(&self.dir, group), &keep, false);
                        let (done, keep) = std::mem::take(&mut g.dead)
                            .into_iter()
                            .partition(|(i, _)| *i <= snap.index);
                        g.dead = keep;
                        // Payload file names are never used twice; a log's
                        // data file leaves its name first (a log that
                        // starts again without its files may reuse it).
                        let files = done
                            .into_iter()
                            .flat_map(|(_, f)| f)
                            .filter_map(leave_name)
                            .collect();
                        crate::storage::delete_later(files, raft_log::log_failed_delete);
                    }
                }
                let after = ready.persisted();
                let only_wish = !stored
                    && after.messages.is_empty()
                    && after.restore.is_none()
                    && after.committed.is_empty()
                    && after.reads.is_empty()
                    && after.forwarded.is_empty()
                    && after.status.is_none();
                only_wishes &= only_wish;
                afters.push((group, after));
            }
            // A member just added is among the peers before the first
            // message for it goes out.
            self.follow_members();
            for m in &raft_multi::outgoing(&mut afters) {
                self.send(m);
            }
            // A follower's answer to the Appends it just stored goes out
            // before the entries it committed are handed to the broker.
            self.net.flush_all();
            for (group, after) in afters {
                if group != CONTROL_GROUP {
                    self.group_out(group, after, out);
                    continue;
                }
                if let Some(s) = after.restore {
                    out.push(FromRaft::Restore {
                        index: s.index,
                        data: s.data,
                    });
                }
                committed_out(group, after.committed, None, out);
                if let Some(s) = after.status {
                    out.push(FromRaft::Status(s));
                }
                if after.want_snapshot && !self.snapshot_asked {
                    self.snapshot_asked = true;
                    out.push(FromRaft::WantSnapshot);
                }
            }
            if only_wishes {
                return Ok(());
            }
        }
    }

    /// Before a round that writes to disk, hands the broker the committed
    /// entries stored in earlier rounds ([`Ready::take_stored_committed`])
    /// with everything gathered before them, so that their answers do not
    /// wait for this round's fsync. A round that writes nothing goes on
    /// as before, in one hand-over at the end.
    fn hand_over_stored(&mut self, readies: &mut [(GroupId, Ready)], out: &mut Vec<FromRaft>) {
        let writes = readies
            .iter()
            .any(|(_, r)| r.hard_state.is_some() || r.snapshot.is_some() || r.entries.is_some());
        if !writes {
            return;
        }
        let mut any = false;
        for (group, ready) in readies.iter_mut() {
            let stored = ready.take_stored_committed();
            any |= !stored.is_empty();
            let log = self
                .groups
                .get(group)
                .map(|g| g.log.as_ref() as &dyn LogStore);
            committed_out(*group, stored, log, out);
        }
        if any {
            for m in out.drain(..) {
                // A broker gone is seen at the next look at the channel.
                let _ = self.tx.send(m);
            }
            let _ = self.notify.wake();
        }
    }

    /// Sends a leader's Appends before its round is stored
    /// ([`Ready::take_appends`]), so that its followers' writes overlap
    /// its own. Safe because this thread steps no answer to them before
    /// `drive` has stored the round.
    fn send_appends(&mut self, readies: &mut [(GroupId, Ready)]) {
        let appends: Vec<Message> = readies
            .iter_mut()
            .flat_map(|(_, r)| r.take_appends())
            .collect();
        if appends.is_empty() {
            return;
        }
        self.follow_members();
        for m in &appends {
            self.send(m);
        }
        // Out now: queued, they would wait for the next poll, after this
        // round's fsync.
        self.net.flush_all();
    }

    /// What stream group `group`'s persisted round gives the broker.
    fn group_out(&mut self, group: GroupId, after: raft::AfterPersist, out: &mut Vec<FromRaft>) {
        if let Some(s) = after.restore {
            let file = self.snapshot_file(group, s.index, &s.data);
            let event = GroupEvent::Restore {
                index: s.index,
                data: s.data,
                file,
            };
            out.push(FromRaft::Group { group, event });
        }
        let log = self
            .groups
            .get(&group)
            .map(|g| g.log.as_ref() as &dyn LogStore);
        committed_out(group, after.committed, log, out);
        let mut push = |event| out.push(FromRaft::Group { group, event });
        if let Some(s) = after.status {
            push(GroupEvent::Status(s));
        }
        if let Some(g) = self.groups.get_mut(&group) {
            if g.lost && after.status.is_some_and(|s| s.voter) {
                // Caught up in this life: it may vote after a restart too.
                g.lost = false;
                let mark = group_dir(&self.dir, group).join(LOST_MARK);
                if let Err(e) = std::fs::remove_file(&mark) {
                    crate::log_error!("{}: {e}", mark.display());
                }
            }
            let waiting = g.snapshot_retry.is_some_and(|t| Instant::now() < t);
            if after.want_snapshot && !g.snapshot_asked && !waiting {
                g.snapshot_asked = true;
                g.snapshot_retry = None;
                out.push(FromRaft::Group {
                    group,
                    event: GroupEvent::WantSnapshot,
                });
            }
        }
    }
}

/// Committed entries as the broker takes them: Raft's own entries (a
/// leader's no-op) only move the applied index, so they come as empty
/// data. A stream group's entries say where `log` stored their data.
fn committed_out(
    group: GroupId,
    committed: Vec<Entry>,
    log: Option<&dyn LogStore>,
    out: &mut Vec<FromRaft>,
) {
    for e in committed {
        let at = log.and_then(|l| l.data_at(e.index));
        let data = if e.kind == EntryKind::Command {
            e.data
        } else {
            Vec::new()
        };
        out.push(if group == CONTROL_GROUP {
            FromRaft::Apply {
                index: e.index,
                data,
            }
        } else {
            let event = GroupEvent::Apply {
                index: e.index,
                term: e.term,
                data,
                at,
            };
            FromRaft::Group { group, event }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a test saw the Raft thread report.
    #[derive(Default)]
    struct Seen {
        applied: u64,
        wishes: u32,
        leader: bool,
    }

    /// Takes what `node` reports until `done`, failing after 5 s.
    fn drain(node: &RaftNode, seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            while let Some(m) = node.try_recv() {
                match m {
                    FromRaft::Apply { index, .. } => seen.applied = seen.applied.max(index),
                    FromRaft::WantSnapshot => seen.wishes += 1,
                    FromRaft::Status(s) => seen.leader = s.role == Role::Leader,
                    _ => {}
                }
            }
            if done(seen) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stuck at applied {}",
                seen.applied
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A data directory of the test's own.
    fn temp_data(what: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "gombus-node-{what}-{}-{}",
            std::process::id(),
            crate::rand::random_seed()
        ))
    }

    /// A bootstrapped one-node cluster on `data`, and the poll its waker
    /// is registered with.
    fn one_node(data: &Path, memory_log: bool) -> (RaftNode, mio::Poll) {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let cfg = NodeConfig {
            id: 1,
            listen,
            members: [(1, listen)].into(),
            data: data.to_path_buf(),
            memory_log,
            bootstrap: true,
            secret: None,
            names: BTreeMap::new(),
            infos: BTreeMap::new(),
            join: false,
        };
        (RaftNode::start(cfg, waker).unwrap(), poll)
    }

    /// The status stream group `group` reports last within 5 s of
    /// `node` starting to hold it (at least one is reported).
    fn group_status(node: &RaftNode, group: GroupId, until: impl Fn(&Status) -> bool) -> Status {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = None;
        loop {
            while let Some(m) = node.try_recv() {
                if let FromRaft::Group {
                    group: g,
                    event: GroupEvent::Status(s),
                } = m
                {
                    if g == group {
                        last = Some(s);
                    }
                }
            }
            if let Some(s) = last.filter(|s| until(s)) {
                return s;
            }
            assert!(Instant::now() < deadline, "group {group}: {last:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A stream group whose log was lost (`GroupLost`) waits as a
    /// non-voter to be caught up, and still does after a restart: its
    /// empty log may have acknowledged entries it no longer holds, and
    /// voting with it could elect a leader that lacks them.
    #[test]
    fn a_group_that_lost_its_log_does_not_vote_after_a_restart() {
        let data = temp_data("lost");
        let start = || {
            let (node, poll) = one_node(&data, false);
            node.send(ToRaft::Group {
                group: 7,
                members: vec![1],
                join: false,
            });
            (node, poll)
        };
        let (node, _poll) = start();
        let s = group_status(&node, 7, |s| s.role == Role::Leader);
        assert!(s.voter && s.term > 0);
        node.send(ToRaft::GroupLost { group: 7 });
        let s = group_status(&node, 7, |s| s.role != Role::Leader);
        assert!(!s.voter, "{s:?}");
        drop(node);
        let (node, _poll) = start();
        let s = group_status(&node, 7, |_| true);
        assert!(!s.voter, "votes again after a restart: {s:?}");
        drop(node);
        let _ = std::fs::remove_dir_all(&data);
    }

    /// The core asks for a snapshot in every `Ready` once the log is
    /// long; until the broker's snapshot comes back, the thread must go
    /// on committing (not spin on the wish), and ask only once.
    #[test]
    fn a_node_due_for_a_snapshot_keeps_working_until_it_gets_one() {
        let data = temp_data("snapshot");
        let (node, _poll) = one_node(&data, true);
        let mut seen = Seen::default();
        drain(&node, &mut seen, |s| s.leader);
        let target = Config::new(1, vec![1]).snapshot_entries + 500;
        let mut tag = 0;
        while seen.applied < target {
            for _ in 0..200 {
                tag += 1;
                node.send(ToRaft::Propose {
                    tag,
                    data: b"x".to_vec(),
                });
            }
            let want = tag;
            drain(&node, &mut seen, |s| s.applied >= want);
        }
        assert_eq!(
            seen.wishes, 1,
            "asked once while the snapshot is outstanding"
        );
        node.send(ToRaft::Compact {
            index: seen.applied,
            data: Vec::new(),
        });
        let before = seen.applied;
        node.send(ToRaft::Propose {
            tag: tag + 1,
            data: b"x".to_vec(),
        });
        drain(&node, &mut seen, |s| s.applied > before);
        drop(node);
        let _ = std::fs::remove_dir_all(&data);
    }
}
