//! The data path of replicated streams (`replicas` > 1): every member
//! keeps a [`Replica`] of the stream (its state machine, `stream/replica.rs`)
//! fed by the committed entries of the stream's Raft group, and the
//! group's leader serves the stream's events.
//!
//! - On the leader, what one loop turn brings in for a stream (captured
//!   publishes, consumer creation and deletion, deliveries for fetches,
//!   `ack`/`nak`/`term`/`wip`, purges) becomes ONE entry proposed to the
//!   group ([`StreamGroups::flush`] at the end of the turn). Each request
//!   is answered only once its entry is committed (held by a majority,
//!   each member's log fsynced before it counts) and applied here: the
//!   seq of a publish, the messages of a fetch and the `{ok}` of an ack
//!   are the outcomes of that apply, identical on every member.
//! - A member that does not lead the group, or a node that is not a
//!   member, relays the event to the leader over the peer link; while no
//!   leader is known the event is answered `unavailable` at once.
//! - Reads (`stream.info`, `stream.get`, `consumer.info`/`list`) are
//!   answered by the leader only once it has applied an entry of its own
//!   term, so it never answers from a state older than what it acked.
//! - A fetch's deliveries are an entry too: apply refuses a delivery of a
//!   message the consumer is done with, so an acked message is never
//!   handed out again, whoever leads. At most one delivery entry per
//!   consumer is in flight, so two fetches never get the same message.
//! - A push consumer's deliveries are delivery entries the leader makes
//!   on its own while a subscriber listens on the `deliver_subject`; it
//!   sends what their apply accepted, so a new leader goes on where the
//!   old one stopped.
//!
//! The replica keeps an index of its messages in memory and their
//! payloads in segment files under `<data>/replicas/g<group>.<n>` (see
//! `stream/payloads.rs`; in memory when the broker has no data
//! directory). Those files are a cache: the group's log (and its
//! snapshots, taken from [`Replica::snapshot`] when the log grows long) is
//! what keeps the stream across restarts. The directory is emptied when
//! the broker starts, and a restarted member applies its snapshot and the
//! log again; a snapshot restored while running goes to a fresh
//! directory, and the old one is removed with the replica it replaces.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::events::StreamOp;
use super::session::NSP_ROOT;
use super::stream_out::{has_targets, push_accepted, push_message, Push, RemotePush};
use super::streams::{epoch_ms, FETCH_BYTES_MAX, NAK_DELAY_MS_MAX, PUSH_PER_TURN_MAX};
use super::Broker;
use crate::cluster::fsm::{Cmd, MetaCommand};
use crate::cluster::node::{GroupEvent, RaftSender, ToRaft};
use crate::cluster::raft::Role;
use crate::cluster::raft_msg::GroupId;
use crate::cluster::snapshot_file::{self, FileRef};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code, OK_BODY};
use crate::protocol::stream_messages::{
    self as sm, AckReq, ConsumerConfig, ConsumerCreate, ConsumerReq, FetchReq, GetReq, PurgeReq,
    StreamConfig, FETCH_BATCH_MAX,
};
use crate::routing::subs::SubTable;
use crate::stream::payloads::Payloads;
use crate::stream::replica::{AckKind, Frozen, Malformed, Op, Outcome, Publish, Replica};
use crate::stream::stream::{Msg, Stored};

/// How long a request may wait for its entry to be committed and
/// applied before it is answered `unavailable` (the contract's bound is
/// 5 s).
pub const ENTRY_WAIT: Duration = Duration::from_millis(4_500);
/// How often a leader proposes an [`Op::Expire`] for a stream with
/// `max_age_ms` or a `Msg-Id` window.
const EXPIRE_EVERY: Duration = Duration::from_secs(1);
/// How often a leader looks for deliveries that used up `max_deliver`
/// (an [`Op::Exhausted`] proposed twice finds nothing the second time).
const EXHAUST_EVERY: Duration = Duration::from_millis(100);
/// Most requests waiting on one stream's entries.
const WAITING_MAX: usize = 100_000;
/// Most fetches waiting for messages on one stream.
const FETCH_WAITS_MAX: usize = 10_000;

/// Who answers once an op's outcome is known.
#[derive(Debug, Clone)]
enum Reply {
    None,
    Publish {
        conn: ConnId,
        ack_id: u64,
    },
    Ok {
        conn: ConnId,
        ack_id: u64,
    },
    Purge {
        conn: ConnId,
        ack_id: u64,
    },
    Consumer {
        conn: ConnId,
        ack_id: u64,
        name: String,
    },
    Fetch(FetchWait),
    /// A push consumer's deliveries: sent to its `deliver_subject` once
    /// the entry applied.
    Push {
        consumer: String,
    },
    /// A read, answered from the replica once its (no-op) entry applied:
    /// the leader that proposed it still led when it was committed.
    Read {
        conn: ConnId,
        ack_id: u64,
        op: StreamOp,
        arg: String,
        /// The index applied when the read came: a replica's `lag` counts
        /// the entries up to it that the replica lacks, not the read's
        /// own no-op.
        as_of: u64,
    },
}

/// A `consumer.fetch` waiting for messages or for its delivery entry.
#[derive(Debug, Clone)]
struct FetchWait {
    conn: ConnId,
    ack_id: u64,
    consumer: String,
    batch: usize,
    deadline: Instant,
}

/// An entry proposed and not applied yet: its bytes (to tell it from
/// another leader's entry at the same index) and one reply per op.
struct InFlight {
    data: Vec<u8>,
    replies: Vec<Reply>,
    since: Instant,
}

/// One replicated stream held here.
pub(super) struct Held {
    pub(super) name: String,
    pub(super) replica: Replica,
    pub(super) applied: u64,
    role: Role,
    term: u64,
    pub(super) leader: Option<u64>,
    /// The leader has applied an entry of its own term: its state holds
    /// everything it acked.
    serving: bool,
    /// An empty entry was proposed in this term so that one of its
    /// entries applies (and the leader starts serving) even when no
    /// request comes.
    barrier: bool,
    /// This turn's ops and their replies.
    ops: Vec<Op>,
    replies: Vec<Reply>,
    /// Proposed, index not known yet (by tag).
    proposed: HashMap<u64, InFlight>,
    /// Appended at an index, not applied yet.
    at: BTreeMap<u64, InFlight>,
    /// Fetches waiting for messages.
    waits: VecDeque<FetchWait>,
    /// Consumers with a delivery entry in flight.
    delivering: HashSet<String>,
    next_expire: Option<Instant>,
    next_exhaust: Option<Instant>,
    /// Where the replica's payload files are (`<data>/replicas/g<group>`)
    /// and the segment size, with a data directory.
    pub(super) store: Option<(std::path::PathBuf, u64)>,
    /// The replica's payloads have their store: a snapshot was restored
    /// from it, or it was emptied for a log applied from its start.
    pub(super) opened: bool,
    /// Fetching what a snapshot names from the group's leader (see
    /// `stream_catchup.rs`); no entry is applied meanwhile.
    pub(super) catchup: Option<super::stream_catchup::CatchUp>,
    /// The snapshot index the Raft core takes next, already held here.
    pub(super) installed: Option<u64>,
    /// The replica lacks messages its log needs: no entry is applied
    /// until the leader's snapshot arrives.
    pub(super) lost: bool,
    /// This node's latest snapshots, to serve members catching up from
    /// them (at most [`FROZEN_KEPT`]), and whether one is being written.
    pub(super) frozen: VecDeque<(u64, std::sync::Arc<Frozen>)>,
    /// When a snapshot was last taken unasked (for a member catching up).
    pub(super) forced_at: Option<Instant>,
}

/// Snapshots a node keeps to serve members catching up from them.
pub(super) const FROZEN_KEPT: usize = 2;

impl Held {
    fn waiting(&self) -> usize {
        self.replies.len()
            + self
                .proposed
                .values()
                .map(|f| f.replies.len())
                .sum::<usize>()
            + self.at.values().map(|f| f.replies.len()).sum::<usize>()
    }
}

/// The replicated streams held on this node, by group.
#[derive(Default)]
pub(crate) struct StreamGroups {
    pub(super) held: HashMap<GroupId, Held>,
    next_tag: u64,
    /// Reused buffer for ack headers.
    pub(super) head: Vec<u8>,
    /// Round robin over a deliver group's members.
    pick: usize,
    /// The voters each held group was last told to have (see
    /// `stream_moves.rs`).
    pub(super) wanted: HashMap<GroupId, Vec<u64>>,
    /// What an older broker left under `<data>/replicas` (payload caches
    /// named `g<group>.<n>`) has been removed.
    old_payload_dirs_gone: bool,
    /// Publishes relayed to stream leaders, and those relayed here, in
    /// batches (`stream_batches.rs`).
    pub(super) batches: super::stream_batches::Batches,
    /// While a read is answered: the index applied when it came, which
    /// replicas' `lag` is counted against.
    lag_as_of: Option<u64>,
}

impl StreamGroups {
    /// A publish this node takes into the turn's entry of its stream
    /// group, which it leads; answered on `conn` under `ack_id` once
    /// applied.
    pub(super) fn take_publish(
        &mut self,
        p: &super::stream_batches::Item<'_>,
        conn: ConnId,
        ack_id: Option<u64>,
    ) -> Result<(), ApiError> {
        let Some(h) = self
            .held
            .get_mut(&p.group)
            .filter(|h| h.role == Role::Leader)
        else {
            return Err(unavailable(
                "this node does not lead the stream (its leader changed)",
            ));
        };
        if h.waiting() >= WAITING_MAX {
            return Err(ApiError::new(
                Code::Limit,
                "too many publishes are waiting for the stream's replicas",
            ));
        }
        h.ops.push(Op::Publish(Publish {
            subject: p.subject.to_string(),
            headers: p.headers.map(str::to_string),
            data: p.data.to_vec(),
            binary: p.binary,
            time_ms: epoch_ms(),
        }));
        h.replies.push(match ack_id {
            Some(ack_id) => Reply::Publish { conn, ack_id },
            None => Reply::None,
        });
        Ok(())
    }

    /// Socket `conn` closed: nothing waiting is answered on it any more
    /// (its slot may be reused by another socket). Its requests' ops
    /// still go through.
    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        self.batches.forget_conn(conn);
        let gone = |r: &Reply| match r {
            Reply::None | Reply::Push { .. } => false,
            Reply::Publish { conn: c, .. }
            | Reply::Ok { conn: c, .. }
            | Reply::Purge { conn: c, .. }
            | Reply::Consumer { conn: c, .. } => *c == conn,
            Reply::Fetch(w) => w.conn == conn,
            Reply::Read { conn: c, .. } => *c == conn,
        };
        let forget = |rs: &mut Vec<Reply>| {
            for r in rs.iter_mut().filter(|r| gone(r)) {
                *r = Reply::None;
            }
        };
        for h in self.held.values_mut() {
            h.waits.retain(|w| w.conn != conn);
            forget(&mut h.replies);
            for f in h.proposed.values_mut().chain(h.at.values_mut()) {
                forget(&mut f.replies);
            }
        }
    }

    /// Where a replica of group `group` keeps its payload files, with a
    /// data directory: `<data>/replicas/g<group>`, kept across restarts.
    /// The first call removes what an older broker left there (payload
    /// caches named `g<group>.<n>`).
    fn store_of(
        &mut self,
        group: GroupId,
        data: Option<(&std::path::Path, u64)>,
    ) -> Option<(std::path::PathBuf, u64)> {
        let (data, segment_bytes) = data?;
        let root = data.join("replicas");
        if !self.old_payload_dirs_gone {
            if let Ok(entries) = std::fs::read_dir(&root) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().contains('.') {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
            self.old_payload_dirs_gone = true;
        }
        Some((root.join(format!("g{group}")), segment_bytes))
    }

    /// The leader of group `group` as this member knows it.
    pub(crate) fn leader(&self, group: GroupId) -> Option<u64> {
        self.held.get(&group).and_then(|h| h.leader)
    }

    /// The term of group `group` as this member knows it (0: not held).
    pub(crate) fn term(&self, group: GroupId) -> u64 {
        self.held.get(&group).map_or(0, |h| h.term)
    }

    /// Whether this node leads group `group` in term `term`.
    pub(crate) fn leads_in(&self, group: GroupId, term: u64) -> bool {
        self.held
            .get(&group)
            .is_some_and(|h| h.role == Role::Leader && h.term == term)
    }

    /// `(messages, bytes, first_seq, last_seq, consumers)` of group
    /// `group`'s replica here.
    pub(crate) fn state(&self, group: GroupId) -> Option<Value> {
        self.held.get(&group).map(|h| state_json(&h.replica))
    }
}

fn unavailable(why: &str) -> ApiError {
    ApiError::new(Code::Unavailable, why.to_string())
}

fn state_json(r: &Replica) -> Value {
    json!({
        "messages": r.messages(),
        "bytes": r.bytes(),
        "first_seq": r.first_seq(),
        "last_seq": r.last_seq(),
        "consumer_count": r.consumer_names().len(),
    })
}

/// Message `seq` read back from the replica's files; one that cannot be
/// read is logged and answered as missing.
fn msg_of(r: &Replica, seq: u64) -> Option<Msg> {
    match r.get(seq) {
        Ok(m) => m.map(|m| Msg {
            subject: m.subject,
            data: m.data,
            binary: m.binary,
            headers: m.headers,
            time_ms: m.time_ms,
        }),
        Err(e) => {
            crate::log_error!("stream {:?}: reading message {seq}: {e}", r.config().name);
            None
        }
    }
}

fn consumer_json(r: &Replica, name: &str) -> Option<Value> {
    let c = r.consumer(name)?;
    let d = c.delivered();
    let f = c.ack_floor();
    let num_pending = r
        .iter()
        .filter(|(s, m)| {
            *s >= c.next_seq()
                && c.cfg
                    .filter_subject
                    .as_deref()
                    .is_none_or(|f| crate::protocol::subject::matches(f, &m.subject))
        })
        .count();
    Some(json!({
        "stream": r.config().name,
        "name": name,
        "config": c.cfg,
        "delivered": {"stream_seq": d.stream_seq, "consumer_seq": d.consumer_seq},
        "ack_floor": {"stream_seq": f.stream_seq, "consumer_seq": f.consumer_seq},
        "num_pending": num_pending,
        "num_ack_pending": c.num_ack_pending(),
        "num_redelivered": c.num_redelivered(),
    }))
}

fn parse<T: serde::de::DeserializeOwned>(arg: Option<&RawValue>) -> Result<T, ApiError> {
    let text = arg.map_or("null", RawValue::get);
    serde_json::from_str(text).map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))
}

/// Where a replicated stream's event is served.
enum Route {
    Here,
    Relay(u64),
}

impl Broker {
    /// Makes the held replicated streams match the control state: a
    /// stream placed on this node gets its replica and its group held by
    /// the Raft thread; a deleted one is dropped.
    pub(crate) fn sync_stream_groups(&mut self) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        let me = c.me();
        let mut placed = HashSet::new();
        for (name, s) in &self.fsm.streams {
            let Some(p) = s.placement.as_ref().filter(|p| p.holds(me)) else {
                continue;
            };
            placed.insert(p.group);
            if self.stream_groups.held.contains_key(&p.group) {
                continue;
            }
            let mut fields = match s.config.as_object() {
                Some(f) => f.clone(),
                None => continue,
            };
            fields.remove("replicas");
            let cfg: StreamConfig = match sm::read_config(fields) {
                Ok(cfg) => cfg,
                Err(e) => {
                    crate::log_error!("replicated stream {name:?}: {e}");
                    continue;
                }
            };
            let store = self
                .stream_groups
                .store_of(p.group, self.streams.data_dir());
            self.stream_groups.held.insert(
                p.group,
                Held {
                    name: name.clone(),
                    replica: Replica::new(cfg),
                    applied: 0,
                    role: Role::Follower,
                    term: 0,
                    leader: None,
                    serving: false,
                    barrier: false,
                    ops: Vec::new(),
                    replies: Vec::new(),
                    proposed: HashMap::new(),
                    at: BTreeMap::new(),
                    waits: VecDeque::new(),
                    delivering: HashSet::new(),
                    next_expire: None,
                    next_exhaust: None,
                    opened: store.is_none(),
                    store,
                    catchup: None,
                    installed: None,
                    lost: false,
                    frozen: VecDeque::new(),
                    forced_at: None,
                },
            );
            if let Some(raft) = c.raft_node() {
                raft.send(super::stream_moves::hold_group(p, me));
            }
        }
        let gone: Vec<GroupId> = (self.stream_groups.held.keys())
            .filter(|g| !placed.contains(g))
            .copied()
            .collect();
        for g in gone {
            if let Some(h) = self.stream_groups.held.remove(&g) {
                h.replica.destroy();
            }
        }
        self.want_group_members();
    }

    /// The peer link to `node` came up (it may have restarted, perhaps
    /// without its files): each stream group this node leads that `node`
    /// is a member of gets an empty entry this turn. Heartbeats do not
    /// tell a leader that a follower's log is shorter than it was; an
    /// Append does, and a follower that lost its log is then sent the
    /// snapshot it needs at once rather than at the stream's next write.
    pub(super) fn nudge_stream_groups(&mut self, node: u64) {
        let groups: Vec<GroupId> = (self.fsm.streams.values())
            .filter_map(|s| s.placement.as_ref())
            .filter(|p| p.replicas.len() > 1 && p.replicas.contains(&node))
            .map(|p| p.group)
            .collect();
        for g in groups {
            if let Some(h) = self.stream_groups.held.get_mut(&g) {
                if h.role == Role::Leader {
                    h.ops.push(Op::Expire { now_ms: 0 });
                    h.replies.push(Reply::None);
                }
            }
        }
    }

    /// The group and members of replicated stream `name`, if it is one.
    fn placed(&self, name: &str) -> Option<(GroupId, Vec<u64>)> {
        let p = self.fsm.streams.get(name)?.placement.as_ref()?;
        (p.replicas.len() > 1).then(|| (p.group, p.replicas.clone()))
    }

    fn route(&self, group: GroupId, members: &[u64]) -> Result<Route, ApiError> {
        let c = self
            .cluster
            .as_ref()
            .ok_or_else(|| unavailable("not in a cluster"))?;
        let me = c.me();
        if let Some(h) = self.stream_groups.held.get(&group) {
            if h.role == Role::Leader {
                return Ok(Route::Here);
            }
            return match h.leader {
                Some(l) if l != me => Ok(Route::Relay(l)),
                _ => Err(unavailable(
                    "the stream has no leader (its replicas are electing one)",
                )),
            };
        }
        // Not a member: one of the members relays on to the leader.
        members
            .iter()
            .copied()
            .find(|&n| c.reachable(n))
            .map(Route::Relay)
            .ok_or_else(|| unavailable("no replica of the stream is reachable"))
    }

    /// `Some(group)` when a fetch relayed to `node` is to be answered
    /// `unavailable` as soon as this member sees group `group` lose that
    /// leader: `node` leads the group as this member knows it (a
    /// non-member relays to any member, whose own relay watches the
    /// leader). A fetch's relay waits its `expires_ms` plus
    /// [`ENTRY_WAIT`], past the contract's 5 s; every other relay is
    /// answered within [`ENTRY_WAIT`] anyway, and keeps waiting for the
    /// old leader's answer, which tells whether its entry was applied
    /// (an early `unavailable` would leave a publisher retrying one that
    /// was stored).
    fn watched_fetch(&self, op: StreamOp, group: GroupId, node: u64) -> Option<GroupId> {
        let leads = self.stream_groups.leader(group) == Some(node);
        (op == StreamOp::ConsumerFetch && leads).then_some(group)
    }

    /// A publish captured by a replicated stream: `Some(true)` when this
    /// node leads it and the publish joins the turn's entry (its ack
    /// waits for the apply), `Some(false)` when it was relayed to the
    /// leader (which also delivers it), `None` when no replicated stream
    /// captures `subject`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn replicated_publish(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<bool, ApiError>> {
        let c = self.cluster.as_ref()?;
        let me = c.me();
        let name = self.fsm.streams.iter().find_map(|(n, s)| {
            let p = s.placement.as_ref().filter(|p| p.replicas.len() > 1)?;
            let _ = p;
            let subjects = s.config.get("subjects")?.as_array()?;
            subjects
                .iter()
                .filter_map(Value::as_str)
                .any(|f| crate::protocol::subject::matches(f, subject))
                .then(|| n.clone())
        })?;
        let (group, members) = self.placed(&name)?;
        let route = match self.route(group, &members) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let bytes = match super::streams::stream_attachment(data, attachments) {
            Ok(Some(b)) => (b, true),
            Ok(None) => (data.as_bytes(), false),
            Err(e) => return Some(Err(e)),
        };
        if let Route::Relay(node) = route {
            if node == me {
                return Some(Err(unavailable("the stream has no leader")));
            }
            if self.stream_groups.held.contains_key(&group) {
                // A member: the turn's publishes go to the leader in one
                // batch; this node delivers the message to subscribers.
                let waiter = ack_id.map(|a| (conn, a));
                let (b, binary) = bytes;
                let term = self.stream_groups.term(group);
                self.stream_groups
                    .batches
                    .add(node, group, term, waiter, subject, headers, b, binary);
                return Some(Ok(true));
            }
            let arg = super::dispatch::pub_arg(subject, data, reply, headers);
            return Some(
                self.relay(
                    node,
                    None,
                    conn,
                    ack_id,
                    "pub",
                    arg,
                    attachments.to_vec(),
                    ENTRY_WAIT,
                )
                .map(|_| false),
            );
        }
        let item = super::stream_batches::Item {
            group,
            subject,
            headers,
            data: bytes.0,
            binary: bytes.1,
        };
        Some(
            self.stream_groups
                .take_publish(&item, conn, ack_id)
                .map(|()| true),
        )
    }

    /// A stream event naming a replicated stream (`None`: `name` is not
    /// one). Served here on the group's leader, relayed otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn replicated_stream_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        event: &str,
        name: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<Option<String>, ApiError>> {
        let (group, members) = self.placed(name)?;
        if op == StreamOp::StreamCreate {
            // Another replica count is `exists` (`create_replicas`).
            return Some(
                self.create_replicas(arg)
                    .and_then(|_| self.replicated_create_again(name, arg)),
            );
        }
        if op == StreamOp::StreamDelete {
            let cmd = MetaCommand::StreamDelete {
                name: name.to_string(),
            };
            let reply = ack_id.map(|ack_id| super::cluster::ChangeAck {
                conn,
                nsp: NSP_ROOT,
                ack_id,
                ok_body: OK_BODY.to_string(),
            });
            return Some(self.submit(sink, Cmd::Meta(cmd), reply));
        }
        let route = match self.route(group, &members) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        if let Route::Relay(node) = route {
            // Only a fetch's argument bears on the wait.
            let argv = match op {
                StreamOp::ConsumerFetch => parse::<Value>(arg).unwrap_or(Value::Null),
                _ => Value::Null,
            };
            let timeout = super::stream_cluster::relay_wait(op, &argv, ENTRY_WAIT);
            let text = arg.map_or("{}", RawValue::get).to_string();
            return Some(self.relay(
                node,
                self.watched_fetch(op, group, node),
                conn,
                ack_id,
                event,
                text,
                attachments.to_vec(),
                timeout,
            ));
        }
        let now = sink.now();
        Some(self.serve(sink, group, op, arg, conn, ack_id, now, false))
    }

    /// `stream.create` of a replicated stream the cluster knows: the same
    /// config again is answered with the stream, another is `exists`.
    fn replicated_create_again(
        &self,
        name: &str,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let known = &self.fsm.streams[name].config;
        let mut fields: Map<String, Value> = parse(arg)?;
        fields.remove("replicas");
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        let mut kf = known.as_object().cloned().unwrap_or_default();
        kf.remove("replicas");
        let known_cfg: StreamConfig = sm::read_config(kf)?;
        if cfg != known_cfg {
            return Err(ApiError::new(
                Code::Exists,
                format!("stream {name:?} exists with another config"),
            ));
        }
        let state = self
            .placed(name)
            .and_then(|(g, _)| self.stream_groups.state(g))
            .unwrap_or_else(|| state_json(&Replica::new(cfg.clone())));
        let body = ok_with(json!({"stream": {"config": cfg, "state": state}}));
        Ok(Some(self.with_cluster_field(name, body)))
    }

    /// The answer to the `stream.create` of a new replicated stream (its
    /// config checked; `replicas` taken out already): an empty stream.
    pub(crate) fn replicated_create_body(
        &self,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let fields: Map<String, Value> = parse(arg)?;
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        for (other, s) in &self.fsm.streams {
            let subjects = s.config.get("subjects").and_then(Value::as_array);
            for b in subjects.into_iter().flatten().filter_map(Value::as_str) {
                if let Some(a) = cfg.subjects.iter().find(|a| sm::patterns_overlap(a, b)) {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("subject {a:?} overlaps {b:?} of stream {other:?}"),
                    ));
                }
            }
        }
        let state = state_json(&Replica::new(cfg.clone()));
        Ok(Some(ok_with(
            json!({"stream": {"config": cfg, "state": state}}),
        )))
    }

    /// A replicated stream's event on its leader.
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &mut self,
        sink: &mut dyn Sink,
        group: GroupId,
        op: StreamOp,
        arg: Option<&RawValue>,
        conn: ConnId,
        ack_id: Option<u64>,
        now: Instant,
        applied: bool,
    ) -> Result<Option<String>, ApiError> {
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return Err(unavailable("the stream is not held here"));
        };
        let reads = matches!(
            op,
            StreamOp::StreamInfo
                | StreamOp::StreamGet
                | StreamOp::ConsumerInfo
                | StreamOp::ConsumerList
                | StreamOp::ConsumerCreate
        );
        if reads && !h.serving {
            return Err(unavailable(
                "the stream's new leader is catching up; try again",
            ));
        }
        let pure_read = reads && op != StreamOp::ConsumerCreate;
        if pure_read && !applied {
            // Through the log (a no-op entry), so that a leader cut off
            // from its group never answers from a state it lost.
            let Some(ack_id) = ack_id else {
                return Ok(None);
            };
            h.ops.push(Op::Expire { now_ms: 0 });
            h.replies.push(Reply::Read {
                conn,
                ack_id,
                op,
                arg: arg.map_or("{}", RawValue::get).to_string(),
                as_of: h.applied,
            });
            return Ok(None);
        }
        if h.waiting() >= WAITING_MAX {
            return Err(ApiError::new(
                Code::Limit,
                "too many requests are waiting for the stream's replicas",
            ));
        }
        let r = &h.replica;
        let reply_ok = |ack_id: Option<u64>| match ack_id {
            Some(ack_id) => Reply::Ok { conn, ack_id },
            None => Reply::None,
        };
        match op {
            StreamOp::StreamInfo => {
                let body =
                    ok_with(json!({"stream": {"config": r.config(), "state": state_json(r)}}));
                let name = h.name.clone();
                Ok(Some(self.with_cluster_field(&name, body)))
            }
            StreamOp::StreamGet => {
                let req: GetReq = parse(arg)?;
                let seq = match (req.seq, req.last_by_subject.as_deref()) {
                    (Some(seq), _) => seq,
                    (None, Some(subj)) => r
                        .iter()
                        .filter(|(_, m)| &*m.subject == subj)
                        .map(|(s, _)| s)
                        .last()
                        .unwrap_or(0),
                    (None, None) => {
                        return Err(ApiError::new(
                            Code::BadRequest,
                            "stream.get takes seq or last_by_subject",
                        ))
                    }
                };
                let m = msg_of(r, seq).ok_or_else(|| {
                    ApiError::new(Code::NotFound, format!("no message {seq} in the stream"))
                })?;
                let (body, attachments) = super::stream_out::message_body(seq, &m);
                if attachments.is_empty() {
                    return Ok(Some(body));
                }
                if let Some(ack_id) = ack_id {
                    let head = &mut self.stream_groups.head;
                    super::stream_out::send_ack(
                        sink,
                        head,
                        conn,
                        ack_id,
                        body.as_bytes(),
                        &attachments,
                    );
                }
                Ok(None)
            }
            StreamOp::ConsumerInfo => {
                let req: ConsumerReq = parse(arg)?;
                consumer_json(r, &req.name)
                    .map(|c| Some(ok_with(json!({ "consumer": c }))))
                    .ok_or_else(|| {
                        ApiError::new(Code::NotFound, format!("no consumer {:?}", req.name))
                    })
            }
            StreamOp::ConsumerList => {
                let list: Vec<Value> = r
                    .consumer_names()
                    .iter()
                    .filter_map(|n| consumer_json(r, n))
                    .collect();
                Ok(Some(ok_with(json!({ "consumers": list }))))
            }
            StreamOp::ConsumerCreate => {
                let req: ConsumerCreate = parse(arg)?;
                let mut cfg: ConsumerConfig = sm::read_config(req.config)?;
                cfg.validate()?;
                if let Some(c) = r.consumer(&cfg.name) {
                    if c.cfg == cfg {
                        let info = consumer_json(r, &cfg.name).unwrap_or(Value::Null);
                        return Ok(Some(ok_with(json!({ "consumer": info }))));
                    }
                    return Err(ApiError::new(
                        Code::Exists,
                        format!("consumer {:?} exists with another config", cfg.name),
                    ));
                }
                let config = serde_json::to_string(&cfg)
                    .map_err(|e| ApiError::new(Code::Internal, e.to_string()))?;
                h.ops.push(Op::ConsumerCreate { config });
                h.replies.push(match ack_id {
                    Some(ack_id) => Reply::Consumer {
                        conn,
                        ack_id,
                        name: cfg.name,
                    },
                    None => Reply::None,
                });
                Ok(None)
            }
            StreamOp::ConsumerDelete => {
                let req: ConsumerReq = parse(arg)?;
                h.ops.push(Op::ConsumerDelete { name: req.name });
                h.replies.push(reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::StreamPurge => {
                let req: PurgeReq = parse(arg)?;
                h.ops.push(Op::Purge {
                    filter: req.subject,
                });
                h.replies.push(match ack_id {
                    Some(ack_id) => Reply::Purge { conn, ack_id },
                    None => Reply::None,
                });
                Ok(None)
            }
            StreamOp::Ack | StreamOp::Nak | StreamOp::Term | StreamOp::Wip => {
                let req: AckReq = parse(arg)?;
                let kind = match op {
                    StreamOp::Ack => AckKind::Ack,
                    StreamOp::Nak => match req.delay_ms.unwrap_or(0) {
                        0 => AckKind::Nak,
                        ms => AckKind::NakDelay(ms.min(NAK_DELAY_MS_MAX)),
                    },
                    StreamOp::Term => AckKind::Term,
                    _ => AckKind::Wip,
                };
                h.ops.push(Op::Acks {
                    consumer: req.consumer,
                    acks: vec![(kind, req.seq)],
                });
                h.replies.push(reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::ConsumerFetch => {
                let req: FetchReq = parse(arg)?;
                if r.consumer(&req.consumer).is_none() && h.serving {
                    return Err(ApiError::new(
                        Code::NotFound,
                        format!("no consumer {:?}", req.consumer),
                    ));
                }
                if r.consumer(&req.consumer)
                    .is_some_and(|c| c.cfg.deliver_subject.is_some())
                {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        "a push consumer (deliver_subject set) cannot be fetched from",
                    ));
                }
                let Some(ack_id) = ack_id else {
                    return Ok(None);
                };
                let batch = req.batch.unwrap_or(1);
                if batch == 0 || batch > FETCH_BATCH_MAX {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("batch must be 1 to {FETCH_BATCH_MAX}"),
                    ));
                }
                let expires_ms = req.expires_ms.unwrap_or(sm::FETCH_EXPIRES_MS_DEFAULT);
                if expires_ms > sm::FETCH_EXPIRES_MS_MAX {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("expires_ms is at most {}", sm::FETCH_EXPIRES_MS_MAX),
                    ));
                }
                let batch = batch as usize;
                let expires = if req.no_wait == Some(true) {
                    Duration::ZERO
                } else {
                    Duration::from_millis(expires_ms)
                };
                if h.waits.len() >= FETCH_WAITS_MAX {
                    return Err(ApiError::new(Code::Limit, "too many fetches waiting"));
                }
                h.waits.push_back(FetchWait {
                    conn,
                    ack_id,
                    consumer: req.consumer,
                    batch,
                    deadline: now + expires,
                });
                Ok(None)
            }
            StreamOp::StreamCreate | StreamOp::StreamDelete | StreamOp::StreamList => Ok(None),
        }
    }

    /// At the end of a loop turn: on each group this node leads, the
    /// waiting fetches take their deliveries, expiry is due, and the
    /// turn's ops go out as one entry; requests waiting too long are
    /// answered `unavailable`.
    pub(crate) fn flush_stream_groups(&mut self, sink: &mut dyn Sink) {
        if self.stream_groups.held.is_empty() {
            return;
        }
        let now = sink.now();
        self.catch_up_all(now);
        self.send_batches(sink);
        let Some(raft) = self.cluster.as_ref().and_then(|c| c.raft_node()) else {
            return;
        };
        let mut answers: Vec<(ConnId, u64, String)> = Vec::new();
        let groups = &mut self.stream_groups;
        for (&group, h) in groups.held.iter_mut() {
            if h.role == Role::Leader && !h.serving && !h.barrier {
                h.barrier = true;
                let data = crate::stream::replica::encode_entry(&[]);
                groups.next_tag += 1;
                raft.send(ToRaft::GroupPropose {
                    group,
                    tag: groups.next_tag,
                    data,
                });
            }
            if h.role == Role::Leader {
                plan_fetches(h, now, &mut answers);
                plan_pushes(h, &mut self.fsm.subs, &self.remote_push, now);
                if h.serving && h.next_exhaust.is_none_or(|t| t <= now) {
                    h.next_exhaust = Some(now + EXHAUST_EVERY);
                    for consumer in h.replica.consumer_names() {
                        let seqs = h.replica.exhausted_deliveries(&consumer, now);
                        if !seqs.is_empty() {
                            h.ops.push(Op::Exhausted { consumer, seqs });
                            h.replies.push(Reply::None);
                        }
                    }
                }
                let cfg = h.replica.config();
                if cfg.max_age_ms > 0 || cfg.duplicate_window_ms > 0 {
                    let due = h.next_expire.is_none_or(|t| t <= now);
                    if due && h.serving {
                        h.next_expire = Some(now + EXPIRE_EVERY);
                        h.ops.push(Op::Expire { now_ms: epoch_ms() });
                        h.replies.push(Reply::None);
                    }
                }
            }
            if !h.ops.is_empty() {
                let ops = std::mem::take(&mut h.ops);
                let replies = std::mem::take(&mut h.replies);
                if h.role != Role::Leader {
                    for r in &replies {
                        refuse(r, &mut answers, "the stream's leader changed; try again");
                    }
                    continue;
                }
                let data = crate::stream::replica::encode_entry(&ops);
                groups.next_tag += 1;
                let tag = groups.next_tag;
                h.proposed.insert(
                    tag,
                    InFlight {
                        data: data.clone(),
                        replies,
                        since: now,
                    },
                );
                raft.send(ToRaft::GroupPropose { group, tag, data });
            }
            // Whatever waited past the bound: answered, never left hanging.
            let old = |f: &InFlight| now.duration_since(f.since) >= ENTRY_WAIT;
            let stale: Vec<u64> =
                h.at.iter()
                    .filter(|(_, f)| old(f))
                    .map(|(i, _)| *i)
                    .collect();
            for i in stale {
                if let Some(f) = h.at.remove(&i) {
                    give_up(h, &f, &mut answers);
                }
            }
            let stale: Vec<u64> = h
                .proposed
                .iter()
                .filter(|(_, f)| old(f))
                .map(|(t, _)| *t)
                .collect();
            for t in stale {
                if let Some(f) = h.proposed.remove(&t) {
                    give_up(h, &f, &mut answers);
                }
            }
        }
        for (conn, ack_id, body) in answers {
            self.stream_groups.answer(sink, conn, ack_id, body);
        }
    }

    /// What the Raft thread says about stream group `group`.
    pub(crate) fn on_group(&mut self, sink: &mut dyn Sink, group: GroupId, event: GroupEvent) {
        if let GroupEvent::Settled { members } = event {
            self.group_settled(sink, group, &members);
            return;
        }
        let now = sink.now();
        let me = self.cluster.as_ref().map_or(0, |c| c.me());
        if !self.stream_groups.held.contains_key(&group) {
            return;
        }
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let mut answers: Vec<(ConnId, u64, String)> = Vec::new();
        let mut binary: Vec<(ConnId, u64, String, Vec<Vec<u8>>)> = Vec::new();
        let mut reads = Vec::new();
        let mut pushes: Vec<(String, Vec<(u64, u64)>)> = Vec::new();
        match event {
            GroupEvent::Restore { index, data, file } => {
                if h.installed.take() == Some(index) {
                    // Held already: the catch-up built it.
                } else if let Some(lost) = restore(h, index, &data, file, now) {
                    if lost {
                        h.lost = true;
                        if let Some(raft) = self.cluster.as_ref().and_then(|c| c.raft_node()) {
                            raft.send(ToRaft::GroupLost { group });
                        }
                    }
                }
            }
            GroupEvent::Arrived { index, data, file } => {
                self.snapshot_arrived(group, index, &data, file, now);
                return;
            }
            GroupEvent::Apply { .. } if h.lost || h.catchup.is_some() => {
                // The replica is not whole: the group's core is started
                // again without its log, or waits for it to be.
            }
            GroupEvent::Apply { index, term, data } => {
                if !h.opened {
                    // A log applied from its start: the files of an
                    // earlier run go.
                    h.opened = true;
                    if let Some((dir, segment_bytes)) = &h.store {
                        match Payloads::open(dir, *segment_bytes) {
                            Ok(p) => h.replica.set_payloads(p),
                            Err(e) => crate::log_error!("{}: {e}", dir.display()),
                        }
                    }
                }
                h.applied = index;
                if h.role == Role::Leader && term == h.term {
                    h.serving = true;
                }
                let flight = match h.at.remove(&index) {
                    Some(f) if f.data == data => Some(f),
                    // Another leader's entry took the index this node's
                    // proposal had: that proposal is not in the log, and
                    // its requests are answered now, not left waiting.
                    Some(f) => {
                        give_up(h, &f, &mut answers);
                        None
                    }
                    None => None,
                };
                if data.is_empty() {
                    if let Some(f) = flight {
                        give_up(h, &f, &mut answers);
                    }
                } else {
                    let ops = match crate::stream::replica::decode_entry(&data) {
                        Ok(ops) => ops,
                        Err(e) => {
                            crate::log_error!("stream {:?}: entry {index}: {e}", h.name);
                            Vec::new()
                        }
                    };
                    let outcomes = h.replica.apply(&ops, now);
                    for (op, out) in ops.iter().zip(&outcomes) {
                        if let (Op::Deliver { consumer, .. }, Outcome::Delivered(_)) = (op, out) {
                            h.delivering.remove(consumer);
                        }
                    }
                    if let Some(f) = flight {
                        for (reply, out) in f.replies.into_iter().zip(outcomes) {
                            match reply {
                                Reply::Read {
                                    conn,
                                    ack_id,
                                    op,
                                    arg,
                                    as_of,
                                } => reads.push((conn, ack_id, op, arg, as_of)),
                                Reply::Push { consumer } => {
                                    if let Outcome::Delivered(list) = out {
                                        pushes.push((consumer, list));
                                    }
                                }
                                reply => answer(h, &reply, out, now, &mut answers, &mut binary),
                            }
                        }
                    }
                }
            }
            GroupEvent::Proposed { tag, result } => {
                if let Some(f) = h.proposed.remove(&tag) {
                    match result {
                        Ok(index) => {
                            h.at.insert(index, f);
                        }
                        Err(_) => give_up(h, &f, &mut answers),
                    }
                }
            }
            GroupEvent::Status(s) => {
                let was_leader = h.role == Role::Leader;
                if s.term != h.term || s.role != Role::Leader {
                    h.barrier = false;
                }
                h.role = s.role;
                h.term = s.term;
                h.leader = s.leader;
                if s.role != Role::Leader {
                    h.serving = false;
                    h.next_expire = None;
                    h.next_exhaust = None;
                    if was_leader {
                        for w in std::mem::take(&mut h.waits) {
                            answers.push((
                                w.conn,
                                w.ack_id,
                                unavailable("the stream's leader changed").ack_body(),
                            ));
                        }
                        h.delivering.clear();
                    }
                }
                if s.leader == Some(me) {
                    crate::log_info!("stream {:?}: leading its group in term {}", h.name, s.term);
                }
            }
            GroupEvent::WantSnapshot => {
                self.snapshot_now(group);
            }
            // Taken above.
            GroupEvent::Settled { .. } => {}
        }
        if !pushes.is_empty() {
            self.push_delivered(sink, group, pushes);
        }
        for (conn, ack_id, op, arg, as_of) in reads {
            self.stream_groups.lag_as_of = Some(as_of);
            let raw = RawValue::from_string(arg).ok();
            let r = self.serve(
                sink,
                group,
                op,
                raw.as_deref(),
                conn,
                Some(ack_id),
                now,
                true,
            );
            match r {
                Ok(Some(body)) => answers.push((conn, ack_id, body)),
                Ok(None) => {}
                Err(e) => answers.push((conn, ack_id, e.ack_body())),
            }
            self.stream_groups.lag_as_of = None;
        }
        for (conn, ack_id, body) in answers {
            self.stream_groups.answer(sink, conn, ack_id, body);
        }
        for (conn, ack_id, body, attachments) in binary {
            let head = &mut self.stream_groups.head;
            super::stream_out::send_ack(sink, head, conn, ack_id, body.as_bytes(), &attachments);
        }
    }

    /// Sends the deliveries a push consumer's entry accepted to its
    /// `deliver_subject`. A delivery no subscriber takes any more (it
    /// left since) is due again after `ack_wait`, as on one node.
    fn push_delivered(
        &mut self,
        sink: &mut dyn Sink,
        group: GroupId,
        pushes: Vec<(String, Vec<(u64, u64)>)>,
    ) {
        let Some(h) = self.stream_groups.held.get(&group) else {
            return;
        };
        for (name, list) in pushes {
            let Some(c) = h.replica.consumer(&name) else {
                continue;
            };
            let Some(subject) = c.cfg.deliver_subject.as_deref() else {
                continue;
            };
            let deliver_group = c.cfg.deliver_group.as_deref();
            for (seq, delivered) in list {
                let Some(m) = msg_of(&h.replica, seq) else {
                    continue;
                };
                let to = Push {
                    stream: &h.name,
                    consumer: &name,
                    seq,
                    delivered,
                };
                push_accepted(
                    sink,
                    &mut self.fsm.subs,
                    &mut self.remote_push,
                    subject,
                    deliver_group,
                    &to,
                    &m,
                    &mut self.stream_groups.pick,
                );
            }
        }
        self.forward_pushes();
    }

    /// The `cluster` field of replicated stream `name`, from its group as
    /// this node sees it: on the leader, each other member's lag.
    pub(crate) fn group_cluster_field(&self, name: &str) -> Option<Value> {
        let (group, members) = self.placed(name)?;
        let c = self.cluster.as_ref()?;
        let leader = self.stream_groups.leader(group);
        let view = c.fresh_view();
        let g = view.as_ref().and_then(|v| v.groups.get(&group));
        let replicas: Vec<Value> = members
            .iter()
            .filter(|&&n| Some(n) != leader)
            .map(|&n| {
                let upto = |g: &crate::cluster::node::GroupView| {
                    self.stream_groups.lag_as_of.unwrap_or(g.last_index)
                };
                let lag = g
                    .filter(|g| g.role == Role::Leader)
                    .and_then(|g| g.progress.get(&n).map(|m| upto(g).saturating_sub(*m)));
                // Current: holds everything, answers, and may vote (a
                // replica restarted without its files may not until its
                // catch-up is done).
                let votes = g.is_some_and(|g| g.voting.contains(&n));
                let current = lag.is_some_and(|l| l == 0) && c.reachable(n) && votes;
                json!({"node": super::replicated::node_id(c, n), "current": current, "lag": lag})
            })
            .collect();
        // Only the group's leader knows each member's lag; elsewhere this
        // is what this node knows, and says so (`from_leader: false`).
        let from_leader = g.is_some_and(|g| g.role == Role::Leader);
        let leader = leader.map(|l| super::replicated::node_id(c, l));
        Some(json!({"leader": leader, "replicas": replicas, "from_leader": from_leader}))
    }

    /// `stream.list` entries of the replicated streams, from the replicas
    /// held here (zero state where this node holds none); with `led_only`,
    /// only those of the groups this node leads (what a peer gathering
    /// the list takes over its own view, see `cluster/relays.rs`).
    pub(crate) fn replicated_list_entries(&self, led_only: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for (name, s) in &self.fsm.streams {
            let Some((group, _)) = self.placed(name) else {
                continue;
            };
            let leads = self
                .stream_groups
                .held
                .get(&group)
                .is_some_and(|h| h.role == Role::Leader);
            if led_only && !leads {
                continue;
            }
            let mut config = s.config.clone();
            if let Some(o) = config.as_object_mut() {
                o.remove("replicas");
            }
            let state = self.stream_groups.state(group).unwrap_or_else(|| {
                json!({"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0, "consumer_count": 0})
            });
            let mut entry = json!({"config": config, "state": state});
            if let Some(cl) = self.group_cluster_field(name) {
                entry["cluster"] = cl;
            }
            out.push(entry);
        }
        out
    }
}

fn refuse(r: &Reply, answers: &mut Vec<(ConnId, u64, String)>, why: &str) {
    let body = unavailable(why).ack_body();
    match r {
        Reply::None => {}
        Reply::Publish { conn, ack_id }
        | Reply::Ok { conn, ack_id }
        | Reply::Purge { conn, ack_id }
        | Reply::Consumer { conn, ack_id, .. } => answers.push((*conn, *ack_id, body)),
        Reply::Fetch(w) => answers.push((w.conn, w.ack_id, body)),
        Reply::Push { .. } => {}
        Reply::Read { conn, ack_id, .. } => answers.push((*conn, *ack_id, body)),
    }
}

/// An entry that will not be applied as proposed (refused, overwritten,
/// or not applied within [`ENTRY_WAIT`]): its requests are answered
/// `unavailable`; a fetch may have been delivered, so it is not retried.
fn give_up(h: &mut Held, f: &InFlight, answers: &mut Vec<(ConnId, u64, String)>) {
    for r in &f.replies {
        match r {
            Reply::Fetch(w) => {
                h.delivering.remove(&w.consumer);
            }
            Reply::Push { consumer } => {
                h.delivering.remove(consumer);
            }
            _ => {}
        }
        refuse(
            r,
            answers,
            "the stream's replicas did not confirm in time; try again",
        );
    }
}

/// On the leader: every waiting fetch whose consumer has no delivery in
/// flight and has messages due gets an [`Op::Deliver`]; an expired or
/// `no_wait` fetch with nothing due is answered with no messages.
fn plan_fetches(h: &mut Held, now: Instant, answers: &mut Vec<(ConnId, u64, String)>) {
    let mut keep = VecDeque::new();
    while let Some(w) = h.waits.pop_front() {
        if h.replica.consumer(&w.consumer).is_none() && h.serving {
            let e = ApiError::new(Code::NotFound, format!("no consumer {:?}", w.consumer));
            answers.push((w.conn, w.ack_id, e.ack_body()));
            continue;
        }
        if !h.delivering.contains(&w.consumer) && h.serving {
            let seqs = h.replica.next_deliveries(&w.consumer, w.batch, now);
            if !seqs.is_empty() {
                h.delivering.insert(w.consumer.clone());
                h.ops.push(Op::Deliver {
                    consumer: w.consumer.clone(),
                    seqs,
                });
                h.replies.push(Reply::Fetch(w));
                continue;
            }
        }
        if w.deadline <= now {
            answers.push((w.conn, w.ack_id, "[{\"ok\":true,\"messages\":[]}]".into()));
            continue;
        }
        keep.push_back(w);
    }
    h.waits = keep;
}

/// On the leader: every push consumer with no delivery in flight, a
/// subscriber on its `deliver_subject` and messages due gets an
/// [`Op::Deliver`] of at most [`PUSH_PER_TURN_MAX`] of them (R1's flow
/// control: nothing goes out while no one listens, and `max_ack_pending`
/// bounds what is unacked).
fn plan_pushes(h: &mut Held, subs: &mut SubTable, remote: &RemotePush, now: Instant) {
    if !h.serving {
        return;
    }
    let last_seq = h.replica.last_seq();
    for name in h.replica.consumer_names() {
        let Some(c) = h.replica.consumer(&name) else {
            continue;
        };
        let Some(subject) = c.cfg.deliver_subject.as_deref() else {
            continue;
        };
        let due = c.next_deadline().is_some_and(|t| t <= now);
        if h.delivering.contains(&name) || !(due || c.may_have_work(last_seq)) {
            continue;
        }
        if !has_targets(subs, remote, subject, c.cfg.deliver_group.as_deref()) {
            continue;
        }
        let seqs = h.replica.next_deliveries(&name, PUSH_PER_TURN_MAX, now);
        if seqs.is_empty() {
            continue;
        }
        h.delivering.insert(name.clone());
        h.ops.push(Op::Deliver {
            consumer: name.clone(),
            seqs,
        });
        h.replies.push(Reply::Push { consumer: name });
    }
}

/// Answers one request with its op's outcome.
fn answer(
    h: &mut Held,
    reply: &Reply,
    out: Outcome,
    now: Instant,
    answers: &mut Vec<(ConnId, u64, String)>,
    binary: &mut Vec<(ConnId, u64, String, Vec<Vec<u8>>)>,
) {
    let err = |e: ApiError| e.ack_body();
    match (reply, out) {
        (Reply::None, _) => {}
        (Reply::Publish { conn, ack_id }, Outcome::Published(r)) => {
            let body = match r {
                Ok(Stored::New { seq, .. }) => {
                    json!([{"ok": true, "stream": h.name, "seq": seq}]).to_string()
                }
                Ok(Stored::Duplicate(seq)) => {
                    json!([{"ok": true, "stream": h.name, "seq": seq, "duplicate": true}])
                        .to_string()
                }
                Err(e) => err(e),
            };
            answers.push((*conn, *ack_id, body));
        }
        (Reply::Ok { conn, ack_id }, Outcome::Consumer(r)) => {
            answers.push((*conn, *ack_id, r.map_or_else(err, |()| OK_BODY.into())));
        }
        (Reply::Ok { conn, ack_id }, Outcome::Acked(rs)) => {
            let r = rs.into_iter().next().unwrap_or(Ok(()));
            answers.push((*conn, *ack_id, r.map_or_else(err, |()| OK_BODY.into())));
        }
        (Reply::Purge { conn, ack_id }, Outcome::Removed(r)) => {
            let body = r.map_or_else(err, |n| json!([{"ok": true, "purged": n}]).to_string());
            answers.push((*conn, *ack_id, body));
        }
        (Reply::Consumer { conn, ack_id, name }, Outcome::Consumer(r)) => {
            let body = match r {
                Ok(()) => {
                    let info = consumer_json(&h.replica, name).unwrap_or(Value::Null);
                    ok_with(json!({ "consumer": info }))
                }
                Err(e) => err(e),
            };
            answers.push((*conn, *ack_id, body));
        }
        (Reply::Fetch(w), Outcome::Delivered(list)) => {
            h.delivering.remove(&w.consumer);
            if list.is_empty() && w.deadline > now {
                // Raced with an ack or a removal: wait on.
                h.waits.push_back(w.clone());
                return;
            }
            let mut body = Vec::new();
            let mut attachments = Vec::new();
            body.extend_from_slice(b"[{\"ok\":true,\"messages\":[");
            let mut first = true;
            for (seq, delivered) in list {
                let Some(m) = msg_of(&h.replica, seq) else {
                    continue;
                };
                if body.len() > FETCH_BYTES_MAX {
                    break;
                }
                if !first {
                    body.push(b',');
                }
                first = false;
                push_message(&mut body, &mut attachments, seq, &m, Some(delivered));
            }
            body.extend_from_slice(b"]}]");
            let text = String::from_utf8(body).unwrap_or_default();
            if attachments.is_empty() {
                answers.push((w.conn, w.ack_id, text));
            } else {
                binary.push((w.conn, w.ack_id, text, attachments));
            }
        }
        (r, _) => refuse(r, answers, "unexpected outcome"),
    }
}

/// Loads the snapshot at `index` (`data`, and the file it names) into
/// `h`'s replica: a small one with the payload files kept here, an older
/// full one or one in memory whole. Returns whether the replica lacks
/// messages the snapshot names (files lost or damaged here); `None` when
/// it could not be loaded (logged).
fn restore(
    h: &mut Held,
    index: u64,
    data: &[u8],
    file: Option<File>,
    now: Instant,
) -> Option<bool> {
    let restored = match (FileRef::decode(data), file, &h.store) {
        (Some(r), Some(f), Some((dir, segment_bytes))) => {
            let mut read =
                snapshot_file::Checked::new(std::io::BufReader::with_capacity(1 << 20, f), &r);
            Replica::restore_files(&mut read, r.size, now, dir, *segment_bytes)
                .map(|(rep, target)| (rep.is_whole(&target), rep))
        }
        (Some(_), None, _) => Err(Malformed("its snapshot file is missing")),
        (Some(_), Some(_), None) => Err(Malformed("a snapshot file needs a data directory")),
        (None, _, store) => {
            let payloads = match store {
                Some((dir, segment_bytes)) => {
                    Payloads::open(dir, *segment_bytes).unwrap_or_else(|e| {
                        crate::log_error!("{}: {e}; keeping the messages in memory", dir.display());
                        Payloads::memory()
                    })
                }
                None => Payloads::memory(),
            };
            Replica::restore_with(data, now, payloads).map(|rep| (true, rep))
        }
    };
    match restored {
        Ok((whole, rep)) => {
            h.replica = rep;
            h.opened = true;
            h.applied = index;
            if !whole {
                crate::log_warn!(
                    "stream {:?}: its files here lack messages of its snapshot at {index}",
                    h.name
                );
            }
            Some(!whole)
        }
        Err(e) => {
            crate::log_error!("stream {:?}: snapshot at {index}: {e}", h.name);
            None
        }
    }
}

/// Writes stream `name`'s small snapshot at `index` from `frozen` into
/// `dir` on a thread of its own, after fsyncing the payload files it
/// names, then hands the group's Raft thread the file's reference (empty
/// if it could not be written: it asks again later) and the payload
/// files to delete once it is stored.
pub(super) fn write_snapshot(
    raft: RaftSender,
    group: GroupId,
    index: u64,
    dir: std::path::PathBuf,
    frozen: std::sync::Arc<Frozen>,
    dead: Vec<std::path::PathBuf>,
    name: &str,
) {
    let name = name.to_string();
    let again = raft.clone();
    let dead_again = dead.clone();
    let job = move || {
        let written = frozen.sync().and_then(|()| {
            let mut w = snapshot_file::Writer::create(&dir, index)?;
            frozen.write_to(&mut w)?;
            w.finish()
        });
        let data = match written {
            Ok(r) => r.encode(),
            Err(e) => {
                crate::log_error!("stream {name:?}: snapshot at {index}: {e}");
                Vec::new()
            }
        };
        raft.send(ToRaft::GroupCompact {
            group,
            index,
            data,
            dead,
        });
    };
    let spawned = std::thread::Builder::new()
        .name(format!("snapshot-g{group}"))
        .spawn(job);
    if let Err(e) = spawned {
        crate::log_error!("snapshot of stream group {group}: {e}");
        again.send(ToRaft::GroupCompact {
            group,
            index,
            data: Vec::new(),
            dead: dead_again,
        });
    }
}
