//! The Raft consensus core: a value driven by `tick`, `step`, `propose`
//! and `read_index`, which answers with a [`Ready`]: hard state and
//! entries to persist, then (only once they are persisted) messages to
//! send, committed entries to apply, finished reads and role changes.
//!
//! Pure: no sockets, files, threads or clocks. Given the same inputs and
//! the same seed it makes the same decisions.
//!
//! Membership is replicated state: a configuration entry in the log says
//! which nodes are members and which of them vote, and a node uses the
//! latest one in its log, committed or not (thesis §4.1). Changes add or
//! remove one node at a time, with the rule from the Raft errata: a leader
//! starts a change only once an entry of its own term is committed and no
//! other change is in flight. A node joins as a non-voter and is promoted
//! once it is current and has said that it may vote (so a promotion never
//! counts a vote the node would refuse); a leader that removes itself
//! hands leadership over
//! (TimeoutNow, thesis §3.10) when the removal commits.
//!
//! Beyond the paper's basic algorithm it implements PreVote and
//! CheckQuorum (thesis §9.6: a partitioned or rejoining node cannot depose
//! a healthy leader), fast backtracking by term, the Figure 8 commit rule
//! with a no-op entry per term, leader step-down on lost quorum, proposal
//! forwarding, ReadIndex (thesis §6.4), snapshots with InstallSnapshot,
//! and non-voting catch-up for a node that restarted without its log.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use super::raft_msg::{
    decode_membership, encode_membership, Body, Entry, EntryKind, GroupId, HardState, Member,
    Membership, Message, NodeId, Snapshot, CONTROL_GROUP,
};

/// The tick the shells use, in milliseconds.
pub const TICK_MS: u64 = 50;
/// A follower campaigns after hearing nothing for a random number of
/// ticks in `[ELECTION_TICKS, 2 * ELECTION_TICKS)`: 400..800 ms.
pub const ELECTION_TICKS: u32 = 8;
/// A leader sends heartbeats this often: 100 ms.
pub const HEARTBEAT_TICKS: u32 = 2;
const _: () = assert!(HEARTBEAT_TICKS * 3 <= ELECTION_TICKS);
// Worst case from losing a leader to a new one: the slowest timer plus one
// PreVote and one Vote round trip must fit in a second.
const _: () = assert!(2 * ELECTION_TICKS as u64 * TICK_MS <= 800);

/// Tunables of one node; [`Config::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// The group this core replicates: its messages carry it, and it takes
    /// only messages of its own group.
    pub group: GroupId,
    pub id: NodeId,
    /// Every voting member, this node included: the configuration a group
    /// starts from while neither `membership` nor its log says otherwise.
    pub members: Vec<NodeId>,
    /// The configuration stored with the snapshot the node starts from
    /// ([`Raft::snapshot_config`] when it was stored); `None`: `members`.
    pub membership: Option<Membership>,
    /// A leader promotes a non-voter once its log is within this many
    /// entries of the leader's last index.
    pub catch_up_entries: u64,
    pub election_ticks: u32,
    pub heartbeat_ticks: u32,
    /// Most entries in one Append.
    pub append_entries_max: usize,
    /// Most entry bytes in one Append (at least one entry is always sent).
    pub append_bytes_max: usize,
    /// Most Appends in flight to one follower.
    pub inflight_max: usize,
    /// Ask the state machine for a snapshot once this many applied entries
    /// sit in the log after the last one.
    pub snapshot_entries: u64,
    /// Or once the applied entries after the last snapshot hold this many
    /// bytes of data: what bounds the memory the log takes.
    pub snapshot_bytes: u64,
    /// Most entries a leader holds beyond its commit index; proposals past
    /// it are refused with [`ProposeError::Busy`].
    pub uncommitted_max: u64,
    /// Most ReadIndex requests waiting at a leader.
    pub pending_reads_max: usize,
    /// Followers forward proposals to the leader instead of refusing them.
    pub forward_proposals: bool,
    /// Whether this node may vote and campaign from the start; see
    /// [`starts_as_voter`].
    pub voter: bool,
    /// Seed of the election-timeout randomness.
    pub seed: u64,
}

impl Config {
    /// The defaults for node `id` of `members`.
    pub fn new(id: NodeId, members: Vec<NodeId>) -> Config {
        Config {
            group: CONTROL_GROUP,
            id,
            members,
            membership: None,
            catch_up_entries: 16,
            election_ticks: ELECTION_TICKS,
            heartbeat_ticks: HEARTBEAT_TICKS,
            append_entries_max: 256,
            append_bytes_max: 1 << 20,
            inflight_max: 64,
            snapshot_entries: 10_000,
            snapshot_bytes: 32 << 20,
            uncommitted_max: 4_096,
            pending_reads_max: 1_024,
            forward_proposals: true,
            voter: true,
            seed: id,
        }
    }
}

/// Whether a node starting with hard state `hs` and a log that is empty
/// or not may vote at once. A node that ran before under a memory log has
/// lost entries it may have acknowledged: letting it vote could elect a
/// leader that lacks committed entries, so it waits, as a non-voter, until
/// it holds the leader's commit index. A fresh node votes only if it
/// bootstraps (`-bootstrap`); otherwise it waits to be caught up.
pub fn starts_as_voter(bootstrap: bool, memory_log: bool, hs: &HardState, log_empty: bool) -> bool {
    if memory_log && hs.term > 0 {
        return false;
    }
    !log_empty || bootstrap || hs.term > 0
}

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// What the outside may want to know about the role, reported on change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub voter: bool,
}

/// Why a proposal or a read was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposeError {
    /// This node is not the leader; the leader, if known.
    NotLeader(Option<NodeId>),
    /// Too much is waiting already; try again later.
    Busy,
}

impl fmt::Display for ProposeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProposeError::NotLeader(Some(id)) => write!(f, "not leader, leader is {id}"),
            ProposeError::NotLeader(None) => write!(f, "not leader, no leader known"),
            ProposeError::Busy => write!(f, "too many requests pending"),
        }
    }
}

impl std::error::Error for ProposeError {}

/// Why a membership change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeError {
    /// Changes are proposed to the leader; the leader, if known.
    NotLeader(Option<NodeId>),
    /// Another change is in flight, the leader has not committed an entry
    /// of its term yet, or it is handing leadership over: try again later.
    UnderWay,
    /// The id is a member already.
    Duplicate(NodeId),
    /// The id is not a member.
    Unknown(NodeId),
    /// The change would leave the group without a voter.
    LastVoter,
}

impl ChangeError {
    /// The contract's error code for it (docs/PROTOCOL.md, "Errors").
    pub fn code(&self) -> &'static str {
        match self {
            ChangeError::NotLeader(_) | ChangeError::UnderWay => "unavailable",
            _ => "bad_request",
        }
    }
}

impl fmt::Display for ChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeError::NotLeader(l) => write!(f, "not leader (leader {l:?})"),
            ChangeError::UnderWay => write!(f, "a membership change is under way"),
            ChangeError::Duplicate(id) => write!(f, "node {id} is a member already"),
            ChangeError::Unknown(id) => write!(f, "node {id} is not a member"),
            ChangeError::LastVoter => write!(f, "the change would leave no voter"),
        }
    }
}

impl std::error::Error for ChangeError {}

/// Where the membership change in flight is, as this node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeState {
    /// No change: a new one may start (at the leader, once it has
    /// committed an entry of its term).
    Idle,
    /// The configuration entry at `index` is not committed yet.
    Committing { index: u64 },
    /// The non-voter is catching up; the leader promotes it when current.
    CatchingUp(NodeId),
    /// This leader removed itself and hands leadership to this node.
    Transferring(NodeId),
}

/// Where a proposal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposed {
    /// Appended to this leader's log: it is done when the entry applied at
    /// `index` has term `term`.
    Appended { index: u64, term: u64 },
    /// Forwarded to the leader as proposal `seq`; its [`ForwardOutcome`]
    /// comes in a later [`Ready`].
    Forwarded { seq: u64 },
}

/// The outcome of a forwarded proposal: appended at (index, term), or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOutcome {
    pub seq: u64,
    pub at: Option<(u64, u64)>,
}

/// A linearizable read may be served once the state machine has applied
/// `index` (thesis §6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadState {
    pub ctx: u64,
    pub index: u64,
}

/// What a step produced. Persist `hard_state`, `snapshot` and `entries`
/// (in that order) durably, then call [`Ready::persisted`] for what may
/// only happen afterwards.
#[derive(Debug, Default)]
pub struct Ready {
    pub hard_state: Option<HardState>,
    /// Store this snapshot and drop the entries it covers (all entries, if
    /// the log holds no entry at its index with its term).
    pub snapshot: Option<Snapshot>,
    /// Drop every stored entry at or after `.0`, then store these (which
    /// start at `.0`).
    pub entries: Option<(u64, Vec<Entry>)>,
    after: AfterPersist,
}

/// The part of a [`Ready`] that must wait until it is persisted.
#[derive(Debug, Default)]
pub struct AfterPersist {
    pub messages: Vec<Message>,
    /// Load this snapshot into the state machine before applying `committed`.
    pub restore: Option<Snapshot>,
    pub committed: Vec<Entry>,
    pub reads: Vec<ReadState>,
    pub forwarded: Vec<ForwardOutcome>,
    pub status: Option<Status>,
    /// The log is long: hand the state machine's snapshot at the applied
    /// index to [`Raft::compact`].
    pub want_snapshot: bool,
}

impl Ready {
    /// Whether there is anything to do at all.
    pub fn is_empty(&self) -> bool {
        let a = &self.after;
        self.hard_state.is_none()
            && self.snapshot.is_none()
            && self.entries.is_none()
            && a.messages.is_empty()
            && a.restore.is_none()
            && a.committed.is_empty()
            && a.reads.is_empty()
            && a.forwarded.is_empty()
            && a.status.is_none()
            && !a.want_snapshot
    }

    /// Call once the hard state, snapshot and entries are durable.
    pub fn persisted(self) -> AfterPersist {
        self.after
    }

    /// Takes the Appends of this round, which a leader may send before
    /// it stores the round (Raft thesis §10.2.1): followers then write
    /// while it writes. A leader counts its own log towards a commit
    /// before storing it, so this is only for a shell that stores each
    /// round before it steps the next message (the Raft thread): an
    /// answer to these Appends is read after the round is on disk. A
    /// round that changes the hard state or stores a snapshot keeps its
    /// messages for [`Ready::persisted`], and so does an Append whose
    /// commit index reaches an entry this round stores: in a group of
    /// one voter that entry is committed before it is on disk, and a
    /// learner told so would apply what a crash may still take back
    /// (the Raft simulation found this).
    pub fn take_appends(&mut self) -> Vec<Message> {
        if self.hard_state.is_some() || self.snapshot.is_some() {
            return Vec::new();
        }
        let from = self.entries.as_ref().map_or(u64::MAX, |(from, _)| *from);
        let (appends, rest) = std::mem::take(&mut self.after.messages)
            .into_iter()
            .partition(|m| matches!(m.body, Body::Append { commit, .. } if commit < from));
        self.after.messages = rest;
        appends
    }

    /// Takes the committed entries this node stored in an earlier round
    /// (those before the first entry this round stores), which may be
    /// applied before this round is persisted: committed means stored on
    /// a majority, and this node's copy is on disk already, for a shell
    /// that stores each round before it takes the next (the Raft
    /// thread; not a shell that lets rounds wait for their fsync). A leader
    /// counts its own log towards a commit before storing it, so an entry
    /// committed in the round that stores it (a group of one) waits for
    /// [`Ready::persisted`], as does everything after a snapshot.
    ///
    /// This keeps a leader's answers off its next fsync: acks that
    /// commit entries arrive in the same round as new proposals.
    pub fn take_stored_committed(&mut self) -> Vec<Entry> {
        if self.snapshot.is_some() || self.after.restore.is_some() {
            return Vec::new();
        }
        let from = self.entries.as_ref().map_or(u64::MAX, |(from, _)| *from);
        let n = self.after.committed.partition_point(|e| e.index < from);
        self.after.committed.drain(..n).collect()
    }
}

/// The log as the core sees it: the last snapshot, then entries.
#[derive(Debug, Clone, Default)]
struct Log {
    snap: Snapshot,
    entries: Vec<Entry>,
    /// The data bytes of `entries`.
    bytes: u64,
}

fn data_bytes(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| e.data.len() as u64).sum()
}

impl Log {
    fn first_index(&self) -> u64 {
        self.snap.index + 1
    }

    fn last_index(&self) -> u64 {
        self.snap.index + self.entries.len() as u64
    }

    fn last_term(&self) -> u64 {
        self.entries.last().map_or(self.snap.term, |e| e.term)
    }

    /// The term at `i`, if the log still holds (or covers) it.
    fn term(&self, i: u64) -> Option<u64> {
        if i == self.snap.index {
            return Some(self.snap.term);
        }
        if i < self.snap.index {
            return None;
        }
        self.get(i).map(|e| e.term)
    }

    fn get(&self, i: u64) -> Option<&Entry> {
        let off = i.checked_sub(self.first_index())?;
        self.entries.get(usize::try_from(off).ok()?)
    }

    /// Entries from `lo` on, within the count and byte bounds (at least
    /// one when any exists).
    fn slice(&self, lo: u64, count_max: usize, bytes_max: usize) -> Vec<Entry> {
        let Some(off) = lo.checked_sub(self.first_index()) else {
            return Vec::new();
        };
        let off = usize::try_from(off).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut bytes = 0;
        for e in self.entries.iter().skip(off).take(count_max) {
            bytes += e.data.len() + 32;
            if !out.is_empty() && bytes > bytes_max {
                break;
            }
            out.push(e.clone());
        }
        out
    }

    /// Drops every entry at or after `i`.
    fn truncate_from(&mut self, i: u64) {
        let keep = usize::try_from(i.saturating_sub(self.first_index())).unwrap_or(usize::MAX);
        if keep < self.entries.len() {
            self.bytes -= data_bytes(&self.entries[keep..]);
            self.entries.truncate(keep);
        }
    }

    fn push(&mut self, e: Entry) {
        assert_eq!(e.index, self.last_index() + 1, "log must stay contiguous");
        self.bytes += e.data.len() as u64;
        self.entries.push(e);
    }

    /// The data bytes of the entries after `i`.
    fn bytes_after(&self, i: u64) -> u64 {
        let skip = usize::try_from(i.saturating_sub(self.snap.index)).unwrap_or(usize::MAX);
        data_bytes(self.entries.get(skip..).unwrap_or(&[]))
    }

    /// Replaces the prefix up to `snap.index` by `snap`; entries after it
    /// stay only if the log agrees with the snapshot at its index.
    fn install(&mut self, snap: Snapshot) {
        if self.term(snap.index) == Some(snap.term) {
            let drop = snap.index + 1 - self.first_index();
            let drop = usize::try_from(drop).unwrap_or(usize::MAX);
            self.bytes -= data_bytes(&self.entries[..drop]);
            self.entries.drain(..drop);
        } else {
            self.entries.clear();
            self.bytes = 0;
        }
        self.snap = snap;
    }

    fn last_index_of_term(&self, term: u64, at_most: u64) -> Option<u64> {
        let mut i = at_most.min(self.last_index());
        while i >= self.first_index() {
            match self.term(i) {
                Some(t) if t == term => return Some(i),
                Some(t) if t < term => return None,
                _ => {}
            }
            i -= 1;
        }
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// One Append at a time until the follower's position is known.
    Probe { paused: bool },
    /// Appends pipelined up to `inflight_max`.
    Replicate,
    /// A snapshot is on its way; `waited` ticks since it was sent.
    Snapshot { index: u64, waited: u32 },
}

/// A leader's view of one follower.
#[derive(Debug, Clone)]
struct Progress {
    matched: u64,
    next: u64,
    flow: Flow,
    inflight: VecDeque<u64>,
    /// Heard from since the last CheckQuorum.
    active: bool,
    /// Ticks since the leader last heard from this follower.
    quiet: u32,
    epoch: u64,
    /// The follower said, in this epoch, that it may vote (see
    /// [`Body::AppendResp`]): only then is a non-voter promoted.
    may_vote: bool,
    read_acked: u64,
    matched_at_heartbeat: u64,
}

impl Progress {
    /// A follower whose position is unknown: probe from `next`.
    fn new(next: u64) -> Progress {
        Progress {
            matched: 0,
            next,
            flow: Flow::Probe { paused: false },
            inflight: VecDeque::new(),
            active: true,
            quiet: 0,
            epoch: 0,
            may_vote: false,
            read_acked: 0,
            matched_at_heartbeat: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct PendingRead {
    ctx: u64,
    index: u64,
    seq: u64,
}

/// An [`Body::AppendResp`] as the leader reads it.
///
/// `voter`: the follower may vote (its own `voter` flag). A leader
/// promotes a non-voter only once it has said so, in its current epoch.
/// Why: the promotion entry makes every node that holds it count the new
/// node's vote, at once and before the entry commits. The new node itself
/// votes only once it knows it holds everything it might have
/// acknowledged (`maybe_vote_again`); if the leader promoted it before
/// that and died, the others would count a vote that node refuses, and
/// with the old leader gone they could stay short of a majority forever.
/// Since a node never stops being a voter within one life, "may vote"
/// said once in an epoch holds for the whole epoch; a restart starts a
/// new epoch, and with it the leader's belief starts over. What stays
/// uncovered is a node that restarts under a memory log after being
/// promoted: it waits again as a non-voter while counted as a voter,
/// which is why a memory-log cluster survives only one node losing its
/// log at a time (docs/DESIGN.md).
#[derive(Debug, Clone, Copy)]
struct AppendAck {
    ok: bool,
    index: u64,
    hint_index: u64,
    hint_term: u64,
    epoch: u64,
    voter: bool,
}

/// One node's consensus state.
pub struct Raft {
    cfg: Config,
    quorum: usize,
    term: u64,
    vote: Option<NodeId>,
    epoch: u64,
    role: Role,
    leader: Option<NodeId>,
    voter: bool,
    log: Log,
    commit: u64,
    applied: u64,
    elapsed: u32,
    heartbeat_elapsed: u32,
    timeout: u32,
    rng: u64,
    votes: BTreeMap<NodeId, bool>,
    progress: BTreeMap<NodeId, Progress>,
    /// The configuration in effect (the latest in the log) and the index
    /// of its entry (the snapshot's index if it came with the snapshot).
    conf: Membership,
    conf_index: u64,
    /// The voters of `conf`.
    voters: Vec<NodeId>,
    /// The configuration at the snapshot's index, if it differs from the
    /// seed (`Config::members`).
    snap_conf: Option<Membership>,
    /// A leader that removed itself: the node it hands over to, and ticks
    /// spent waiting for it to catch up.
    transfer: Option<(NodeId, u32)>,
    term_start: u64,
    read_seq: u64,
    reads: VecDeque<PendingRead>,
    reads_waiting: Vec<u64>,
    forward_seq: u64,
    proposals_seen: BTreeMap<NodeId, u64>,
    // What the next Ready carries.
    hard_state_dirty: bool,
    unstable_from: Option<u64>,
    snapshot_out: Option<Snapshot>,
    after: AfterPersist,
    reported: Option<Status>,
}

/// Whether a log ending at (`index`, `term`) is at least as up to date as
/// one ending at (`my_index`, `my_term`) (Raft §5.4.1).
fn up_to_date(term: u64, index: u64, my_term: u64, my_index: u64) -> bool {
    term > my_term || (term == my_term && index >= my_index)
}

impl Raft {
    /// A node restored from what its store loaded: hard state, the last
    /// snapshot (default: none) and the entries after it.
    pub fn new(cfg: Config, hs: HardState, snap: Snapshot, entries: Vec<Entry>) -> Raft {
        // A node joining a running group starts with no members at all:
        // it learns the configuration from the leader, and never campaigns
        // before it has.
        assert!(
            cfg.membership.is_some() || cfg.members.is_empty() || cfg.members.contains(&cfg.id),
            "a node is one of the members"
        );
        assert!(cfg.heartbeat_ticks >= 1 && cfg.heartbeat_ticks < cfg.election_ticks);
        let quorum = cfg.members.len() / 2 + 1;
        let mut log = Log {
            snap,
            entries: Vec::new(),
            bytes: 0,
        };
        for e in entries {
            log.push(e);
        }
        let at = log.snap.index;
        let mut r = Raft {
            quorum,
            term: hs.term,
            vote: hs.vote,
            // Every start is a new life: acks of the previous one are void.
            epoch: hs.epoch + 1,
            role: Role::Follower,
            leader: None,
            voter: cfg.voter,
            log,
            commit: at,
            applied: at,
            elapsed: 0,
            heartbeat_elapsed: 0,
            timeout: cfg.election_ticks,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            votes: BTreeMap::new(),
            progress: BTreeMap::new(),
            conf: Membership::default(),
            conf_index: 0,
            voters: Vec::new(),
            snap_conf: cfg.membership.clone(),
            transfer: None,
            term_start: 0,
            read_seq: 0,
            reads: VecDeque::new(),
            reads_waiting: Vec::new(),
            forward_seq: 0,
            proposals_seen: BTreeMap::new(),
            hard_state_dirty: true,
            unstable_from: None,
            snapshot_out: None,
            after: AfterPersist::default(),
            reported: None,
            cfg,
        };
        r.reset_timeout();
        r.reload_conf();
        r
    }

    // ---- accessors ----

    pub fn id(&self) -> NodeId {
        self.cfg.id
    }
    pub fn term(&self) -> u64 {
        self.term
    }
    pub fn vote(&self) -> Option<NodeId> {
        self.vote
    }
    pub fn role(&self) -> Role {
        self.role
    }
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }
    pub fn is_voter(&self) -> bool {
        self.voter
    }
    pub fn commit(&self) -> u64 {
        self.commit
    }
    pub fn applied(&self) -> u64 {
        self.applied
    }
    pub fn last_index(&self) -> u64 {
        self.log.last_index()
    }
    /// Whether a snapshot at `index` of `term`, in a message of term
    /// `msg_term`, would replace this core's state rather than only move
    /// its commit index (its log already holds that entry) or be refused
    /// (a stale sender, or nothing newer than what is committed here): a
    /// shell holding a snapshot back until the state machine has what it
    /// names asks this first.
    pub fn takes_snapshot(&self, msg_term: u64, index: u64, term: u64) -> bool {
        msg_term >= self.term && index > self.commit && self.log.term(index) != Some(term)
    }
    /// The snapshot the log starts after (index 0: none).
    pub fn snapshot(&self) -> &Snapshot {
        &self.log.snap
    }
    /// The entries after the snapshot.
    pub fn entries(&self) -> &[Entry] {
        &self.log.entries
    }
    /// The entries after `index` up to the applied index, if the log
    /// still holds every one of them: a shell hands them to its state
    /// machine again when the state machine was made whole at `index`
    /// (from a snapshot it fetched) after the core had applied past it.
    pub fn applied_after(&self, index: u64) -> Option<&[Entry]> {
        if index >= self.applied {
            return Some(&[]);
        }
        let first = self.log.entries.first()?.index;
        if index + 1 < first {
            return None;
        }
        let from = usize::try_from(index + 1 - first).ok()?;
        let to = usize::try_from(self.applied + 1 - first).ok()?;
        self.log.entries.get(from..to)
    }
    /// The term of the entry at `i`, if the log holds or covers it.
    pub fn term_at(&self, i: u64) -> Option<u64> {
        self.log.term(i)
    }
    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            epoch: self.epoch,
        }
    }
    pub fn status(&self) -> Status {
        Status {
            role: self.role,
            term: self.term,
            leader: self.leader,
            voter: self.voter,
        }
    }

    /// Every voting member, this node included.
    pub fn members(&self) -> &[NodeId] {
        &self.voters
    }

    /// The configuration in effect: the latest in the log, committed or not.
    pub fn configuration(&self) -> &Membership {
        &self.conf
    }

    /// The index of the entry that set the configuration in effect.
    pub fn configuration_index(&self) -> u64 {
        self.conf_index
    }

    /// The configuration at the snapshot's index, to store with the
    /// snapshot and hand back as [`Config::membership`] on restart
    /// (`None`: the seed configuration).
    pub fn snapshot_config(&self) -> Option<&Membership> {
        self.snap_conf.as_ref()
    }

    /// The membership change in flight, as this node knows it.
    pub fn change_state(&self) -> ChangeState {
        if let Some((to, _)) = self.transfer {
            return ChangeState::Transferring(to);
        }
        if self.conf_index > self.commit {
            return ChangeState::Committing {
                index: self.conf_index,
            };
        }
        match self.conf.members.iter().find(|m| !m.voter) {
            Some(m) => ChangeState::CatchingUp(m.id),
            None => ChangeState::Idle,
        }
    }

    /// A leader's view of how far each follower's log matches its own
    /// (empty on other roles).
    pub fn progress(&self) -> BTreeMap<NodeId, u64> {
        if self.role != Role::Leader {
            return BTreeMap::new();
        }
        crate::maps::map_of(self.progress.iter().map(|(p, pr)| (*p, pr.matched)))
    }

    /// On a leader, the followers that said in this life that they may
    /// vote (a node restarted without its log says so once caught up);
    /// empty on other roles.
    pub fn may_vote(&self) -> std::collections::BTreeSet<NodeId> {
        if self.role != Role::Leader {
            return std::collections::BTreeSet::new();
        }
        crate::maps::set_of(
            (self.progress.iter())
                .filter(|(_, pr)| pr.may_vote)
                .map(|(p, _)| *p),
        )
    }

    /// A leader's count of ticks since it last heard from each follower
    /// (empty on other roles): how long a peer has been silent, whatever
    /// its TCP connection says.
    pub fn quiet_ticks(&self) -> BTreeMap<NodeId, u32> {
        if self.role != Role::Leader {
            return BTreeMap::new();
        }
        crate::maps::map_of(self.progress.iter().map(|(p, pr)| (*p, pr.quiet)))
    }

    /// A one-line summary of the node's state, for logs and test failures.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "node {} {:?} term {} vote {:?} leader {:?} voter {} commit {} applied {} log {}..={} epoch {}",
            self.cfg.id,
            self.role,
            self.term,
            self.vote,
            self.leader,
            self.voter,
            self.commit,
            self.applied,
            self.log.snap.index,
            self.log.last_index(),
            self.epoch
        );
        for (p, pr) in &self.progress {
            s += &format!(
                " [{p}: match {} next {} {:?} inflight {} epoch {}]",
                pr.matched,
                pr.next,
                pr.flow,
                pr.inflight.len(),
                pr.epoch
            );
        }
        s
    }

    // ---- inputs ----

    /// One tick of the logical clock.
    pub fn tick(&mut self) {
        self.elapsed += 1;
        if self.role == Role::Leader {
            self.tick_leader();
        } else if self.can_campaign() && self.elapsed >= self.timeout {
            self.campaign();
        }
    }

    /// Only a node that holds what it may have acknowledged campaigns, and
    /// only as a voter of its configuration or while the configuration
    /// that removed it is not known to be committed: a node with the
    /// longest log may be one whose removal the old leader could not
    /// commit, and the others may need it to lead (it counts the votes of
    /// the new configuration, not its own, and hands over once the removal
    /// commits). A non-voter, or a node whose removal committed, never
    /// campaigns.
    fn can_campaign(&self) -> bool {
        self.voter
            && (self.conf.is_voter(self.cfg.id)
                || (!self.conf.contains(self.cfg.id)
                    && self.conf_index > self.commit
                    && !self.voters.is_empty()))
    }

    /// 1 if this node counts for its own quorums, else 0.
    fn self_votes(&self) -> usize {
        usize::from(self.conf.is_voter(self.cfg.id))
    }

    /// How many voters other than this node satisfy `f`.
    fn voters_where(&self, f: impl Fn(&Progress) -> bool) -> usize {
        self.progress
            .iter()
            .filter(|(p, pr)| self.conf.is_voter(**p) && f(pr))
            .count()
    }

    fn tick_leader(&mut self) {
        self.heartbeat_elapsed += 1;
        for pr in self.progress.values_mut() {
            pr.quiet = pr.quiet.saturating_add(1);
            if let Flow::Snapshot { waited, .. } = &mut pr.flow {
                *waited += 1;
            }
        }
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks {
            self.heartbeat_elapsed = 0;
            self.broadcast_heartbeat();
        }
        if let Some((to, waited)) = self.transfer {
            // The successor did not catch up in time: step down anyway and
            // let the remaining voters elect one.
            if waited + 1 >= self.cfg.election_ticks {
                let term = self.term;
                self.become_follower(term, None);
                return;
            }
            self.transfer = Some((to, waited + 1));
        }
        if self.elapsed >= self.cfg.election_ticks {
            self.elapsed = 0;
            // CheckQuorum (thesis §6.2): a leader that has not heard from
            // a majority of voters within an election timeout steps down.
            let active = self.self_votes() + self.voters_where(|p| p.active);
            for pr in self.progress.values_mut() {
                pr.active = false;
            }
            if active < self.quorum {
                let term = self.term;
                self.become_follower(term, None);
                return;
            }
        }
        self.after_commit();
    }

    /// Proposes a command.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<Proposed, ProposeError> {
        if self.role != Role::Leader {
            let leader = self.leader.filter(|&l| l != self.cfg.id);
            return match leader {
                Some(to) if self.cfg.forward_proposals => {
                    // Numbers of an earlier life (epoch) are never reused:
                    // the leader drops numbers it has seen, and a late
                    // answer must not match a new proposal.
                    self.forward_seq += 1;
                    let seq = (self.epoch << 32) | (self.forward_seq & 0xffff_ffff);
                    self.send(to, Body::Propose { seq, data });
                    Ok(Proposed::Forwarded { seq })
                }
                _ => Err(ProposeError::NotLeader(leader)),
            };
        }
        if self.log.last_index() - self.commit >= self.cfg.uncommitted_max
            || self.transfer.is_some()
        {
            return Err(ProposeError::Busy);
        }
        let index = self.append_local(EntryKind::Command, data);
        self.broadcast_append();
        Ok(Proposed::Appended {
            index,
            term: self.term,
        })
    }

    /// Proposes adding `id` as a non-voter carrying `data` (the runtime's
    /// addresses, opaque here). The leader replicates its log to it and
    /// promotes it to voter, with a second configuration entry, once it is
    /// current. Returns the index of the configuration entry.
    pub fn propose_add(&mut self, id: NodeId, data: Vec<u8>) -> Result<u64, ChangeError> {
        self.check_leader()?;
        if self.conf.contains(id) {
            return Err(ChangeError::Duplicate(id));
        }
        if !self.change_ready() || self.conf.members.iter().any(|m| !m.voter) {
            return Err(ChangeError::UnderWay);
        }
        let mut conf = self.conf.clone();
        conf.members.push(Member {
            id,
            voter: false,
            data,
        });
        Membership::sort(&mut conf.members);
        Ok(self.append_conf(&conf))
    }

    /// Proposes removing `id` (a voter, or a non-voter still catching up).
    /// A leader that removes itself keeps leading, without counting
    /// itself, until the removal commits, then hands over and steps down.
    /// Returns the index of the configuration entry.
    pub fn propose_remove(&mut self, id: NodeId) -> Result<u64, ChangeError> {
        self.check_leader()?;
        let Some(m) = self.conf.get(id) else {
            return Err(ChangeError::Unknown(id));
        };
        if m.voter && self.voters.len() == 1 {
            return Err(ChangeError::LastVoter);
        }
        let other_learner = self.conf.members.iter().any(|m| !m.voter && m.id != id);
        if !self.change_ready() || other_learner {
            return Err(ChangeError::UnderWay);
        }
        let mut conf = self.conf.clone();
        conf.members.retain(|m| m.id != id);
        Ok(self.append_conf(&conf))
    }

    fn check_leader(&self) -> Result<(), ChangeError> {
        if self.role != Role::Leader {
            let leader = self.leader.filter(|&l| l != self.cfg.id);
            return Err(ChangeError::NotLeader(leader));
        }
        Ok(())
    }

    /// The errata rule: a leader starts a change only once an entry of its
    /// own term is committed (so no change of an earlier leader can still
    /// be pending in some log) and its last change is committed.
    fn change_ready(&self) -> bool {
        self.role == Role::Leader
            && self.transfer.is_none()
            && self.commit >= self.term_start
            && self.conf_index <= self.commit
            && self.conf.contains(self.cfg.id)
    }

    fn append_conf(&mut self, conf: &Membership) -> u64 {
        let mut data = Vec::new();
        encode_membership(&mut data, conf);
        let index = self.append_local(EntryKind::Config, data);
        self.broadcast_append();
        self.after_commit();
        index
    }

    /// Makes `conf` (set by the entry at `index`) the configuration in
    /// effect; a leader starts replicating to new members at once.
    fn set_conf(&mut self, conf: Membership, index: u64) {
        self.voters = conf.voter_ids();
        self.quorum = self.voters.len() / 2 + 1;
        self.conf = conf;
        self.conf_index = index;
        if self.role == Role::Leader {
            let next = self.log.last_index() + 1;
            for id in self.conf.ids() {
                if id != self.cfg.id && !self.progress.contains_key(&id) {
                    self.progress.insert(id, Progress::new(next));
                }
            }
        }
    }

    /// The configuration at or before `index` in the log (None: none of
    /// the entries sets one, so it is the snapshot's).
    fn conf_at(&self, index: u64) -> Option<Membership> {
        let upto = usize::try_from(index.saturating_sub(self.log.snap.index)).unwrap_or(usize::MAX);
        self.log
            .entries
            .iter()
            .take(upto)
            .rev()
            .filter(|e| e.kind == EntryKind::Config)
            .find_map(|e| decode_membership(&e.data).ok())
    }

    /// Sets the configuration from the log: its latest configuration
    /// entry, else the snapshot's, else the seed.
    fn reload_conf(&mut self) {
        let found = self
            .log
            .entries
            .iter()
            .rev()
            .filter(|e| e.kind == EntryKind::Config)
            .find_map(|e| decode_membership(&e.data).ok().map(|c| (c, e.index)));
        let (conf, index) = found.unwrap_or_else(|| {
            let c = self
                .snap_conf
                .clone()
                .unwrap_or_else(|| Membership::voters(&self.cfg.members));
            (c, self.log.snap.index)
        });
        self.set_conf(conf, index);
    }

    /// What a leader does once its commit index moved: once the change in
    /// flight is committed, stop replicating to removed nodes, hand over if
    /// it removed itself, and promote a non-voter that caught up.
    fn after_commit(&mut self) {
        if self.role != Role::Leader || self.commit < self.conf_index {
            return;
        }
        // A removed node learns that its removal committed, and so stops
        // campaigning, from one last heartbeat.
        let removed: Vec<NodeId> = self
            .progress
            .keys()
            .copied()
            .filter(|p| !self.conf.contains(*p))
            .collect();
        for p in removed {
            self.send_heartbeat(p);
            self.progress.remove(&p);
        }
        if !self.conf.contains(self.cfg.id) {
            self.hand_over();
            return;
        }
        if !self.change_ready() {
            return;
        }
        let last = self.log.last_index();
        let lag = self.cfg.catch_up_entries;
        // Only a node that said it may vote is promoted: the promotion
        // makes the configuration count its vote, and a node counted but
        // refusing to vote could leave the others short of a quorum for
        // good if this leader dies (see `AppendAck::voter`).
        let ready = self.conf.members.iter().find(|m| {
            !m.voter
                && self
                    .progress
                    .get(&m.id)
                    .is_some_and(|pr| pr.may_vote && pr.matched > 0 && pr.matched + lag >= last)
        });
        if let Some(m) = ready {
            let id = m.id;
            let mut conf = self.conf.clone();
            for m in &mut conf.members {
                if m.id == id {
                    m.voter = true;
                }
            }
            self.append_conf(&conf);
        }
    }

    /// A leader no longer in the configuration picks the voter with the
    /// longest log, brings it up to date, then tells it to campaign at
    /// once and steps down (thesis §3.10).
    fn hand_over(&mut self) {
        let to = match self.transfer {
            Some((to, _)) => to,
            None => {
                let best = self
                    .progress
                    .iter()
                    .filter(|(p, _)| self.conf.is_voter(**p))
                    .max_by_key(|(p, pr)| (pr.matched, std::cmp::Reverse(**p)))
                    .map(|(p, _)| *p);
                let Some(to) = best else {
                    let term = self.term;
                    self.become_follower(term, None);
                    return;
                };
                self.transfer = Some((to, 0));
                to
            }
        };
        let matched = self.progress.get(&to).map_or(0, |pr| pr.matched);
        if matched >= self.log.last_index() {
            self.send(to, Body::TimeoutNow);
            let term = self.term;
            self.become_follower(term, None);
        } else {
            self.send_append(to, false);
        }
    }

    /// Asks for a linearizable read point; the answer is a [`ReadState`]
    /// with this `ctx` in a later [`Ready`] (or none if leadership is lost
    /// meanwhile: the caller times out and retries).
    pub fn read_index(&mut self, ctx: u64) -> Result<(), ProposeError> {
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader(self.leader));
        }
        if self.reads.len() + self.reads_waiting.len() >= self.cfg.pending_reads_max {
            return Err(ProposeError::Busy);
        }
        if self.commit < self.term_start {
            // The leader does not know the commit index before it has
            // committed an entry of its own term.
            self.reads_waiting.push(ctx);
            return Ok(());
        }
        self.start_read(ctx);
        Ok(())
    }

    fn start_read(&mut self, ctx: u64) {
        if self.quorum == self.self_votes() {
            self.after.reads.push(ReadState {
                ctx,
                index: self.commit,
            });
            return;
        }
        self.read_seq += 1;
        self.reads.push_back(PendingRead {
            ctx,
            index: self.commit,
            seq: self.read_seq,
        });
        self.broadcast_heartbeat();
    }

    /// The state machine's snapshot at `index` (at most the applied index):
    /// the log up to it is dropped.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) {
        assert!(index <= self.applied, "snapshot beyond the applied index");
        if index <= self.log.snap.index {
            return;
        }
        let Some(term) = self.log.term(index) else {
            return;
        };
        if let Some(c) = self.conf_at(index) {
            self.snap_conf = Some(c);
        }
        let snap = Snapshot { index, term, data };
        self.log.install(snap.clone());
        self.snapshot_out = Some(snap);
    }

    /// Hands over what has accumulated since the last call.
    pub fn ready(&mut self) -> Ready {
        let mut r = Ready {
            hard_state: None,
            snapshot: self.snapshot_out.take(),
            entries: None,
            after: std::mem::take(&mut self.after),
        };
        if self.hard_state_dirty {
            self.hard_state_dirty = false;
            r.hard_state = Some(self.hard_state());
        }
        if let Some(from) = self.unstable_from.take() {
            let from = from.max(self.log.first_index());
            let n = usize::MAX;
            r.entries = Some((from, self.log.slice(from, n, usize::MAX)));
        }
        if self.commit > self.applied {
            let n = usize::try_from(self.commit - self.applied).unwrap_or(usize::MAX);
            r.after.committed = self.log.slice(self.applied + 1, n, usize::MAX);
            assert_eq!(
                r.after.committed.len(),
                n,
                "committed entries are in the log"
            );
            self.applied = self.commit;
        }
        let status = self.status();
        if self.reported != Some(status) {
            self.reported = Some(status);
            r.after.status = Some(status);
        }
        r.after.want_snapshot = self.applied > self.log.snap.index
            && (self.applied - self.log.snap.index >= self.cfg.snapshot_entries
                || (self.log.bytes >= self.cfg.snapshot_bytes
                    && self.log.bytes - self.log.bytes_after(self.applied)
                        >= self.cfg.snapshot_bytes));
        r
    }

    /// Takes one message from another node.
    pub fn step(&mut self, m: Message) {
        // A sender outside the configuration is heard too: a leader
        // reaches a node it is adding before that node knows of the
        // change, and a leader answers only nodes it has progress for.
        if m.to != self.cfg.id || m.group != self.cfg.group || m.from == self.cfg.id {
            return;
        }
        if matches!(
            m.body,
            Body::Beats { .. } | Body::BeatsResp { .. } | Body::SnapshotChunk { .. }
        ) {
            // Node-level: the multiplexer splits beats into per-group
            // heartbeats before any core sees them, and the shell writes
            // snapshot pieces to a file.
            return;
        }
        if m.term > self.term {
            match m.body {
                // Inside a leader's lease, a vote request is ignored
                // outright: it cannot disrupt a healthy leader (§9.6).
                Body::PreVote { .. } | Body::Vote { .. } if self.in_lease() => return,
                Body::PreVote { .. } | Body::PreVoteResp { granted: true } => {}
                Body::Append { .. }
                | Body::Heartbeat { .. }
                | Body::Snapshot { .. }
                | Body::ConfSnapshot { .. } => {
                    self.become_follower(m.term, Some(m.from));
                }
                _ => self.become_follower(m.term, None),
            }
        } else if m.term < self.term {
            self.answer_stale(m);
            return;
        }
        self.dispatch(m);
    }

    /// A message from an older term: answered only where the answer
    /// teaches the sender something (a stale leader steps down, a
    /// pre-candidate gives up, a forwarder retries).
    fn answer_stale(&mut self, m: Message) {
        match m.body {
            Body::Append { .. }
            | Body::Heartbeat { .. }
            | Body::Snapshot { .. }
            | Body::ConfSnapshot { .. } => {
                let epoch = self.epoch;
                self.send(m.from, Body::HeartbeatResp { read_seq: 0, epoch });
            }
            Body::PreVote { .. } => self.send(m.from, Body::PreVoteResp { granted: false }),
            Body::Propose { seq, .. } => self.send(m.from, Body::ProposeResp { seq, index: 0 }),
            _ => {}
        }
    }

    fn dispatch(&mut self, m: Message) {
        let from = m.from;
        match m.body {
            Body::PreVote {
                last_index,
                last_term,
            } => self.on_pre_vote(from, m.term, last_index, last_term),
            Body::Vote {
                last_index,
                last_term,
            } => self.on_vote(from, last_index, last_term),
            Body::PreVoteResp { granted } => {
                if self.role == Role::PreCandidate && m.term == self.term + u64::from(granted) {
                    self.count_vote(from, granted);
                }
            }
            Body::VoteResp { granted } => {
                if self.role == Role::Candidate {
                    self.count_vote(from, granted);
                }
            }
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
                epoch,
            } => {
                self.follow(from);
                self.on_append(from, prev_index, prev_term, entries, commit, epoch);
            }
            Body::Heartbeat {
                commit,
                commit_term,
                read_seq,
            } => {
                self.follow(from);
                if commit > self.commit && self.log.term(commit) == Some(commit_term) {
                    self.commit = commit;
                }
                let epoch = self.epoch;
                self.send(from, Body::HeartbeatResp { read_seq, epoch });
            }
            Body::Snapshot { snapshot } => {
                self.follow(from);
                self.on_snapshot(from, snapshot, None);
            }
            Body::AppendResp {
                ok,
                index,
                hint_index,
                hint_term,
                epoch,
                voter,
            } => {
                if self.role == Role::Leader {
                    let ack = AppendAck {
                        ok,
                        index,
                        hint_index,
                        hint_term,
                        epoch,
                        voter,
                    };
                    self.on_append_resp(from, ack);
                }
            }
            Body::HeartbeatResp { read_seq, epoch } => {
                if self.role == Role::Leader {
                    self.on_heartbeat_resp(from, read_seq, epoch);
                }
            }
            Body::Propose { seq, data } => self.on_propose(from, seq, data),
            Body::ProposeResp { seq, index } => {
                let at = (index > 0).then_some((index, m.term));
                self.after.forwarded.push(ForwardOutcome { seq, at });
            }
            Body::Beats { .. } | Body::BeatsResp { .. } | Body::SnapshotChunk { .. } => {}
            Body::TransferVote {
                last_index,
                last_term,
            } => self.on_vote(from, last_index, last_term),
            Body::TimeoutNow => {
                // Only from the leader being followed, and only a voter
                // that holds what it may have acknowledged.
                if self.role == Role::Follower && self.leader == Some(from) && self.can_campaign() {
                    self.become_candidate(true);
                }
            }
            Body::ConfSnapshot { snapshot, config } => {
                self.follow(from);
                self.on_snapshot(from, snapshot, Some(config));
            }
        }
    }

    // ---- elections ----

    fn in_lease(&self) -> bool {
        self.leader.is_some() && self.elapsed < self.cfg.election_ticks
    }

    fn reset_timeout(&mut self) {
        // Seeded, so a simulation replays; good enough for timer jitter.
        let z = crate::rand::splitmix64(&mut self.rng);
        let spread = u64::from(self.cfg.election_ticks);
        self.timeout = self.cfg.election_ticks + (z % spread) as u32;
        self.elapsed = 0;
    }

    /// Opens a round of (pre)votes as `role`, this node voting for itself;
    /// true when that one vote is already a quorum.
    fn open_poll(&mut self, role: Role) -> bool {
        self.role = role;
        self.leader = None;
        self.reset_timeout();
        self.votes.clear();
        if self.conf.is_voter(self.cfg.id) {
            self.votes.insert(self.cfg.id, true);
        }
        self.self_votes() >= self.quorum
    }

    fn campaign(&mut self) {
        if self.open_poll(Role::PreCandidate) {
            self.become_candidate(false);
            return;
        }
        let (last_index, last_term) = (self.log.last_index(), self.log.last_term());
        for p in self.other_voters() {
            let m = Message {
                group: self.cfg.group,
                from: self.cfg.id,
                to: p,
                term: self.term + 1,
                body: Body::PreVote {
                    last_index,
                    last_term,
                },
            };
            self.after.messages.push(m);
        }
    }

    /// The voters of the configuration in effect but this node.
    fn other_voters(&self) -> Vec<NodeId> {
        let me = self.cfg.id;
        self.voters.iter().copied().filter(|&p| p != me).collect()
    }

    /// Stands for election; `transfer`: told to by the leader handing
    /// over, so voters answer though they still hear from a leader.
    fn become_candidate(&mut self, transfer: bool) {
        self.term += 1;
        self.vote = Some(self.cfg.id);
        self.hard_state_dirty = true;
        if self.open_poll(Role::Candidate) {
            self.become_leader();
            return;
        }
        let (last_index, last_term) = (self.log.last_index(), self.log.last_term());
        for p in self.other_voters() {
            let body = if transfer {
                Body::TransferVote {
                    last_index,
                    last_term,
                }
            } else {
                Body::Vote {
                    last_index,
                    last_term,
                }
            };
            self.send(p, body);
        }
    }

    fn count_vote(&mut self, from: NodeId, granted: bool) {
        // Only the voters of this node's configuration count.
        if !self.conf.is_voter(from) {
            return;
        }
        self.votes.entry(from).or_insert(granted);
        let yes = self.votes.values().filter(|&&g| g).count();
        let no = self.votes.len() - yes;
        if yes >= self.quorum {
            match self.role {
                Role::PreCandidate => self.become_candidate(false),
                Role::Candidate => self.become_leader(),
                _ => {}
            }
        } else if no >= self.quorum {
            let term = self.term;
            self.become_follower(term, None);
        }
    }

    fn on_pre_vote(&mut self, from: NodeId, term: u64, last_index: u64, last_term: u64) {
        let my = (self.log.last_term(), self.log.last_index());
        let granted = self.voter
            && term > self.term
            && up_to_date(last_term, last_index, my.0, my.1)
            && !self.in_lease();
        let m = Message {
            group: self.cfg.group,
            from: self.cfg.id,
            to: from,
            // A grant speaks for the term the sender would campaign in.
            term: if granted { term } else { self.term },
            body: Body::PreVoteResp { granted },
        };
        self.after.messages.push(m);
    }

    fn on_vote(&mut self, from: NodeId, last_index: u64, last_term: u64) {
        let free = self.vote == Some(from) || (self.vote.is_none() && self.leader.is_none());
        let my = (self.log.last_term(), self.log.last_index());
        let granted = self.voter && free && up_to_date(last_term, last_index, my.0, my.1);
        if granted {
            // Persisted (the Ready's hard state) before this answer leaves.
            self.vote = Some(from);
            self.hard_state_dirty = true;
            self.elapsed = 0;
        }
        self.send(from, Body::VoteResp { granted });
    }

    fn become_follower(&mut self, term: u64, leader: Option<NodeId>) {
        if term != self.term {
            assert!(term > self.term, "terms only grow");
            self.term = term;
            self.vote = None;
            self.hard_state_dirty = true;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.reset_timeout();
        self.votes.clear();
        self.progress.clear();
        self.transfer = None;
        self.reads.clear();
        self.reads_waiting.clear();
    }

    /// A leader of the current term spoke: follow it.
    fn follow(&mut self, from: NodeId) {
        assert!(
            self.role != Role::Leader,
            "two leaders in term {}: {} and {from}",
            self.term,
            self.cfg.id
        );
        if self.role != Role::Follower || self.leader != Some(from) {
            let term = self.term;
            self.become_follower(term, Some(from));
        }
        self.elapsed = 0;
    }

    fn become_leader(&mut self) {
        self.role = Role::Leader;
        self.leader = Some(self.cfg.id);
        self.elapsed = 0;
        self.heartbeat_elapsed = 0;
        self.votes.clear();
        let next = self.log.last_index() + 1;
        let me = self.cfg.id;
        self.progress = crate::maps::map_of(
            (self.conf.ids().into_iter())
                .filter(|&p| p != me)
                .map(|p| (p, Progress::new(next))),
        );
        self.transfer = None;
        self.read_seq = 0;
        // The no-op of this term: committing it commits every earlier
        // entry (§5.4.2), and lets ReadIndex know the commit index.
        self.term_start = self.append_local(EntryKind::Noop, Vec::new());
        for p in self.followers() {
            self.send_append(p, true);
        }
    }

    // ---- replication (leader) ----

    fn append_local(&mut self, kind: EntryKind, data: Vec<u8>) -> u64 {
        let index = self.log.last_index() + 1;
        self.log.push(Entry {
            term: self.term,
            index,
            kind,
            data,
        });
        self.unstable_from = Some(self.unstable_from.map_or(index, |u| u.min(index)));
        if kind == EntryKind::Config {
            if let Some(e) = self.log.get(index) {
                if let Ok(c) = decode_membership(&e.data) {
                    self.set_conf(c, index);
                }
            }
        }
        self.maybe_commit();
        index
    }

    /// Every node a leader replicates to: the members of the
    /// configuration, and a removed node until its removal commits.
    fn followers(&self) -> Vec<NodeId> {
        self.progress.keys().copied().collect()
    }

    fn broadcast_append(&mut self) {
        for p in self.followers() {
            self.send_append(p, false);
        }
    }

    fn broadcast_heartbeat(&mut self) {
        for p in self.followers() {
            self.send_heartbeat(p);
        }
    }

    fn send_heartbeat(&mut self, p: NodeId) {
        let matched = self.progress.get(&p).map_or(0, |pr| pr.matched);
        let commit = matched.min(self.commit);
        let commit_term = self.log.term(commit).unwrap_or(0);
        let read_seq = self.read_seq;
        self.send(
            p,
            Body::Heartbeat {
                commit,
                commit_term,
                read_seq,
            },
        );
    }

    /// Sends `p` what it is missing; with `empty_ok`, even when that is
    /// nothing (a probe). Returns whether an Append went out.
    fn send_append(&mut self, p: NodeId, empty_ok: bool) -> bool {
        let Some(pr) = self.progress.get(&p) else {
            return false;
        };
        match pr.flow {
            Flow::Snapshot { .. } | Flow::Probe { paused: true } => return false,
            Flow::Replicate if pr.inflight.len() >= self.cfg.inflight_max => return false,
            _ => {}
        }
        let prev_index = pr.next - 1;
        let Some(prev_term) = self.log.term(prev_index) else {
            self.send_snapshot(p);
            return true;
        };
        let entries = self.log.slice(
            pr.next,
            self.cfg.append_entries_max,
            self.cfg.append_bytes_max,
        );
        if entries.is_empty() && !empty_ok {
            return false;
        }
        let last = prev_index + entries.len() as u64;
        if let Some(pr) = self.progress.get_mut(&p) {
            match &mut pr.flow {
                Flow::Replicate if last > prev_index => {
                    pr.next = last + 1;
                    pr.inflight.push_back(last);
                }
                Flow::Probe { paused } => *paused = true,
                _ => {}
            }
        }
        let commit = self.commit;
        let epoch = self.progress.get(&p).map_or(0, |pr| pr.epoch);
        self.send(
            p,
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
                epoch,
            },
        );
        true
    }

    fn send_snapshot(&mut self, p: NodeId) {
        let snapshot = self.log.snap.clone();
        if let Some(pr) = self.progress.get_mut(&p) {
            pr.flow = Flow::Snapshot {
                index: snapshot.index,
                waited: 0,
            };
            pr.inflight.clear();
        }
        match self.snap_conf.clone() {
            Some(config) => self.send(p, Body::ConfSnapshot { snapshot, config }),
            None => self.send(p, Body::Snapshot { snapshot }),
        }
    }

    fn on_append_resp(&mut self, p: NodeId, ack: AppendAck) {
        let AppendAck {
            ok,
            index,
            hint_index: hint,
            hint_term,
            epoch,
            voter,
        } = ack;
        let Some(pr) = self.progress.get_mut(&p) else {
            return;
        };
        pr.active = true;
        pr.quiet = 0;
        if epoch < pr.epoch {
            return; // an answer from the follower's previous life
        }
        if epoch > pr.epoch {
            // The follower restarted: what it acked before may be gone,
            // and whether it may vote is for this life to say.
            pr.epoch = epoch;
            pr.matched = 0;
            pr.may_vote = false;
            pr.flow = Flow::Probe { paused: false };
            pr.inflight.clear();
        }
        // Within one life a node only ever goes from non-voter to voter,
        // so a late answer saying "not yet" changes nothing.
        pr.may_vote |= voter;
        if ok {
            let matched_before = pr.matched;
            pr.matched = pr.matched.max(index);
            pr.next = pr.next.max(index + 1);
            while pr.inflight.front().is_some_and(|&i| i <= index) {
                pr.inflight.pop_front();
            }
            match pr.flow {
                Flow::Probe { .. } => {
                    pr.flow = Flow::Replicate;
                    pr.next = pr.matched + 1;
                    pr.inflight.clear();
                }
                Flow::Snapshot { index: si, .. } if pr.matched >= si => {
                    pr.flow = Flow::Probe { paused: false };
                    pr.next = pr.matched + 1;
                }
                _ => {}
            }
            let before = self.commit;
            self.maybe_commit();
            while self.send_append(p, false) {}
            let learner = !self.conf.is_voter(p);
            if learner || self.transfer.map(|(to, _)| to) == Some(p) || self.commit > before {
                self.after_commit();
                if self.role != Role::Leader {
                    return;
                }
            }
            if self.commit > before {
                // Tell the followers at once, so they apply within a round
                // trip rather than at the next heartbeat.
                self.broadcast_heartbeat();
            } else if index > matched_before && before > matched_before {
                // A slower follower now holds entries committed without it:
                // it learns so at once too.
                self.send_heartbeat(p);
            }
            return;
        }
        if index < pr.matched {
            return; // a refusal older than what is known to match
        }
        let mut next = hint.max(1);
        if hint_term > 0 {
            if let Some(j) = self.log.last_index_of_term(hint_term, index) {
                next = j + 1;
            }
        }
        pr.next = next.min(index).max(pr.matched + 1);
        pr.flow = Flow::Probe { paused: false };
        pr.inflight.clear();
        self.send_append(p, true);
    }

    fn on_heartbeat_resp(&mut self, p: NodeId, read_seq: u64, epoch: u64) {
        let last = self.log.last_index();
        let Some(pr) = self.progress.get_mut(&p) else {
            return;
        };
        pr.active = true;
        pr.quiet = 0;
        pr.read_acked = pr.read_acked.max(read_seq);
        if epoch > pr.epoch {
            // The follower started a new life since its last Append
            // answer (it restarted, or lost its log and started its core
            // again) without an Append between: what it acked before may
            // be gone. Probe it as on_append_resp does on a new epoch;
            // the epoch itself is taken from the probe's answer.
            pr.matched = 0;
            pr.may_vote = false;
            pr.flow = Flow::Probe { paused: false };
            pr.next = last + 1;
            pr.inflight.clear();
            pr.matched_at_heartbeat = 0;
            self.send_append(p, true);
            self.release_reads();
            return;
        }
        let stalled = pr.matched < last && pr.matched == pr.matched_at_heartbeat;
        // A probe whose answer was lost (a node being added that could
        // not answer yet) is sent again even with no entries to carry:
        // its answer is what moves `next` back.
        let probing = matches!(pr.flow, Flow::Probe { .. });
        match pr.flow {
            Flow::Probe { .. } => pr.flow = Flow::Probe { paused: false },
            // An Append was lost: start again from what is known.
            Flow::Replicate if stalled => {
                pr.flow = Flow::Probe { paused: false };
                pr.next = pr.matched + 1;
                pr.inflight.clear();
            }
            Flow::Snapshot { waited, .. } if waited >= self.cfg.election_ticks => {
                pr.flow = Flow::Probe { paused: false };
                pr.next = pr.matched + 1;
            }
            _ => {}
        }
        pr.matched_at_heartbeat = pr.matched;
        // A non-voter that holds the whole log but has not said it may
        // vote gets an empty Append: it carries the commit index and the
        // epoch the node needs to see before it may (`maybe_vote_again`),
        // and its answer says so. Without it, a node caught up by a
        // snapshot, or whose last Append came before the leader's commit
        // index moved, would wait for the next proposal to be promoted.
        let (behind, may_vote) = (pr.matched < last, pr.may_vote);
        let unsure = !may_vote && !self.conf.is_voter(p) && self.conf.contains(p);
        if behind {
            self.send_append(p, probing);
        } else if unsure {
            self.send_append(p, true);
        }
        self.release_reads();
    }

    /// Commits the highest index held by a majority, if it is of the
    /// current term (Figure 8: older entries commit only under it).
    fn maybe_commit(&mut self) {
        if self.role != Role::Leader {
            return;
        }
        // Only voters count, this leader too only while it is one.
        let mut matched: Vec<u64> = self
            .progress
            .iter()
            .filter(|(p, _)| self.conf.is_voter(**p))
            .map(|(_, pr)| pr.matched)
            .collect();
        if self.conf.is_voter(self.cfg.id) {
            matched.push(self.log.last_index());
        }
        if matched.len() < self.quorum {
            return;
        }
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let n = matched[self.quorum - 1];
        if n > self.commit && self.log.term(n) == Some(self.term) {
            self.commit = n;
            if self.commit >= self.term_start && !self.reads_waiting.is_empty() {
                for ctx in std::mem::take(&mut self.reads_waiting) {
                    self.start_read(ctx);
                }
            }
        }
    }

    fn release_reads(&mut self) {
        while let Some(front) = self.reads.front() {
            let seq = front.seq;
            let acks = self.self_votes() + self.voters_where(|p| p.read_acked >= seq);
            if acks < self.quorum {
                break;
            }
            if let Some(r) = self.reads.pop_front() {
                self.after.reads.push(ReadState {
                    ctx: r.ctx,
                    index: r.index,
                });
            }
        }
    }

    fn on_propose(&mut self, from: NodeId, seq: u64, data: Vec<u8>) {
        if self.role != Role::Leader {
            self.send(from, Body::ProposeResp { seq, index: 0 });
            return;
        }
        let seen = self.proposals_seen.entry(from).or_insert(0);
        if seq <= *seen {
            return; // a duplicate (or overtaken) copy
        }
        *seen = seq;
        match self.propose(data) {
            Ok(Proposed::Appended { index, .. }) => {
                self.send(from, Body::ProposeResp { seq, index })
            }
            _ => self.send(from, Body::ProposeResp { seq, index: 0 }),
        }
    }

    // ---- replication (follower) ----

    fn on_append(
        &mut self,
        from: NodeId,
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
        epoch: u64,
    ) {
        // Entries must follow `prev_index` one by one; anything else is
        // not an Append this code sends, and is dropped.
        let contiguous = entries
            .iter()
            .zip(1u64..)
            .all(|(e, k)| prev_index.checked_add(k) == Some(e.index));
        if !contiguous {
            return;
        }
        // What is committed here is known to match: skip it.
        let (prev_index, prev_term, entries) = if prev_index < self.commit {
            let skip = usize::try_from(self.commit - prev_index).unwrap_or(usize::MAX);
            let rest: Vec<Entry> = entries.into_iter().skip(skip).collect();
            (self.commit, self.log.term(self.commit).unwrap_or(0), rest)
        } else {
            (prev_index, prev_term, entries)
        };
        if self.log.term(prev_index) != Some(prev_term) {
            let (hint_index, hint_term) = self.conflict_hint(prev_index);
            self.maybe_vote_again(commit, epoch);
            self.ack(from, false, prev_index, hint_index, hint_term);
            return;
        }
        let last_new = prev_index + entries.len() as u64;
        for e in entries {
            match self.log.term(e.index) {
                Some(t) if t == e.term => continue,
                Some(_) => {
                    // A conflicting entry: it and all after it go (§5.3).
                    assert!(e.index > self.commit, "a committed entry was overwritten");
                    self.log.truncate_from(e.index);
                    if self.conf_index >= e.index {
                        // The configuration came from a dropped entry.
                        self.reload_conf();
                    }
                }
                None => {}
            }
            self.unstable_from = Some(self.unstable_from.map_or(e.index, |u| u.min(e.index)));
            let conf = (e.kind == EntryKind::Config)
                .then(|| decode_membership(&e.data).ok())
                .flatten();
            let index = e.index;
            self.log.push(e);
            if let Some(c) = conf {
                self.set_conf(c, index);
            }
        }
        self.commit = self.commit.max(commit.min(last_new));
        // Before the answer, so that it already says whether this node
        // may vote now.
        self.maybe_vote_again(commit, epoch);
        self.ack(from, true, last_new, 0, 0);
    }

    /// Answers an Append or a snapshot with this life's epoch and whether
    /// this node may vote.
    fn ack(&mut self, to: NodeId, ok: bool, index: u64, hint_index: u64, hint_term: u64) {
        let (epoch, voter) = (self.epoch, self.voter);
        self.send(
            to,
            Body::AppendResp {
                ok,
                index,
                hint_index,
                hint_term,
                epoch,
                voter,
            },
        );
    }

    /// A node that lost its log, or a joining node, votes (again) once it
    /// holds the leader's commit index, that index is of the leader's own
    /// term (so it covers everything committed before), and the leader has
    /// seen this life's epoch (so no ack of an earlier life, whose entries
    /// may be gone, is counted from now on: anything it counted is within
    /// that commit). Called before the Append is answered, so the answer
    /// already tells the leader, which promotes a non-voter only then.
    fn maybe_vote_again(&mut self, leader_commit: u64, epoch: u64) {
        if !self.voter
            && epoch == self.epoch
            && self.commit >= leader_commit
            && self.log.term(leader_commit) == Some(self.term)
        {
            self.voter = true;
        }
    }

    /// Where the leader should back up to after a refused Append: the
    /// first index of the conflicting term, or just past our log.
    fn conflict_hint(&self, prev_index: u64) -> (u64, u64) {
        if prev_index > self.log.last_index() {
            return (self.log.last_index() + 1, 0);
        }
        let t = self.log.term(prev_index).unwrap_or(0);
        let mut i = prev_index;
        while i > self.commit + 1 && self.log.term(i - 1) == Some(t) {
            i -= 1;
        }
        (i, t)
    }

    /// `config`: the configuration at the snapshot's index, if it is not
    /// the seed.
    fn on_snapshot(&mut self, from: NodeId, snap: Snapshot, config: Option<Membership>) {
        let index = snap.index;
        if index > self.commit {
            if self.log.term(index) == Some(snap.term) {
                self.commit = index;
            } else {
                self.log.install(snap.clone());
                self.snap_conf = config;
                self.reload_conf();
                self.commit = index;
                self.applied = index;
                self.unstable_from = None;
                self.snapshot_out = Some(snap.clone());
                self.after.restore = Some(snap);
            }
        }
        let index = self.commit;
        self.ack(from, true, index, 0, 0);
    }

    fn send(&mut self, to: NodeId, body: Body) {
        self.after.messages.push(Message {
            group: self.cfg.group,
            from: self.cfg.id,
            to,
            term: self.term,
            body,
        });
    }
}
