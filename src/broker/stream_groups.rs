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
//! Each held stream's group is a [`Group`] (`stream/group.rs`): the
//! replica and the leader's bookkeeping of its proposals, a pure component
//! the stream simulation drives too. This file routes events to it,
//! feeds it the group's Raft events and renders its answers.
//!
//! The replica keeps an index of its messages in memory and their
//! payloads in segment files under `<data>/replicas/g<group>` (see
//! `stream/payloads.rs`; in memory when the broker has no data
//! directory), kept across restarts: they are fsynced before a snapshot
//! that names them is stored, and a snapshot holds only the stream's
//! state (see `stream_catchup.rs` for a member that lacks what one
//! names).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::ack::send_ack_with;
use super::events::StreamOp;
use super::session::NSP_ROOT;
use super::stream_out::{has_targets, push_accepted, push_message, Push, RemotePush};
use super::streams::{epoch_ms, FETCH_BYTES_MAX, NAK_DELAY_MS_MAX, PUSH_PER_TURN_MAX};
use super::Broker;
use crate::cluster::api::snapshot_file::{self, FileRef};
use crate::cluster::api::{Cmd, GroupEvent, GroupId, MetaCommand, RaftSender, Role, ToRaft};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code, OK_BODY};
use crate::protocol::stream_messages::{
    self as sm, AckReq, ConsumerConfig, ConsumerCreate, ConsumerReq, FetchReq, GetReq, PurgeReq,
    StreamConfig, FETCH_BATCH_MAX,
};
use crate::routing::subs::SubTable;
use crate::stream::group::{Done, Group};
use crate::stream::payloads::Payloads;
use crate::stream::replica::{AckKind, Frozen, Malformed, Op, Outcome, Publish, Replica};
use crate::stream::stream::{Msg, Stored};

pub use crate::stream::group::ENTRY_WAIT;
/// Most fetches waiting for messages on one stream.
const FETCH_WAITS_MAX: usize = 10_000;

/// Who answers once an op's outcome is known.
#[derive(Debug, Clone)]
pub(super) enum Reply {
    /// With `revision`, a bucket write: `{ok, revision}`.
    Publish {
        conn: ConnId,
        ack_id: u64,
        revision: bool,
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
    /// A bucket read (`kv.get`, `kv.info`, ...), made again once its
    /// no-op entry applied, as a stream read is.
    KvRead {
        conn: ConnId,
        ack_id: u64,
        op: super::events::KvOp,
        event: String,
        arg: String,
    },
}

/// A `consumer.fetch` waiting for messages or for its delivery entry.
#[derive(Debug, Clone)]
pub(super) struct FetchWait {
    conn: ConnId,
    ack_id: u64,
    consumer: String,
    batch: usize,
    deadline: Instant,
}

/// One replicated stream held here.
pub(super) struct Held {
    pub(super) name: String,
    /// The replica and the leader's proposals.
    pub(super) core: Group<Reply>,
    /// Fetches waiting for messages.
    waits: VecDeque<FetchWait>,
    /// Where the replica's payload files are (`<data>/replicas/g<group>`)
    /// and the segment size, with a data directory.
    pub(super) store: Option<(std::path::PathBuf, u64)>,
    /// The replica's payloads have their store: a snapshot was restored
    /// from it, or it was emptied for a log applied from its start.
    pub(super) opened: bool,
    /// Fetching what a snapshot names from the group's leader (see
    /// `stream_catchup.rs`); no entry is applied meanwhile.
    pub(super) catchup: Option<crate::stream::catchup::CatchUp>,
    /// The snapshot index the Raft core takes next, already held here.
    pub(super) installed: Option<u64>,
    /// The replica lacks messages its log needs: no entry is applied
    /// until the leader's snapshot arrives.
    pub(super) lost: bool,
    /// The states frozen for this node's latest snapshots, to serve
    /// members catching up from them.
    pub(super) sources: crate::stream::catchup::Sources,
}

/// The replicated streams held on this node, by group.
#[derive(Default)]
pub(crate) struct StreamGroups {
    pub(super) held: HashMap<GroupId, Held>,
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
    /// While a bucket read whose no-op entry applied is made again: it is
    /// answered from the replica now.
    pub(super) kv_read_applied: bool,
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
        revision: bool,
    ) -> Result<(), ApiError> {
        let Some(h) = self.held.get_mut(&p.group).filter(|h| h.core.leads()) else {
            return Err(unavailable(
                "this node does not lead the stream (its leader changed)",
            ));
        };
        if h.core.full() {
            return Err(ApiError::new(
                Code::Limit,
                "too many publishes are waiting for the stream's replicas",
            ));
        }
        let op = Op::Publish(Publish {
            subject: p.subject.to_string(),
            headers: p.headers.map(str::to_string),
            data: p.data.to_vec(),
            binary: p.binary,
            time_ms: epoch_ms(),
        });
        let reply = ack_id.map(|ack_id| Reply::Publish {
            conn,
            ack_id,
            revision,
        });
        h.core.take(op, reply);
        Ok(())
    }

    /// Socket `conn` closed: nothing waiting is answered on it any more
    /// (its slot may be reused by another socket). Its requests' ops
    /// still go through.
    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        self.batches.forget_conn(conn);
        let gone = |r: &Reply| match r {
            Reply::Push { .. } => false,
            Reply::Publish { conn: c, .. }
            | Reply::Ok { conn: c, .. }
            | Reply::Purge { conn: c, .. }
            | Reply::Consumer { conn: c, .. } => *c == conn,
            Reply::Fetch(w) => w.conn == conn,
            Reply::Read { conn: c, .. } | Reply::KvRead { conn: c, .. } => *c == conn,
        };
        for h in self.held.values_mut() {
            h.waits.retain(|w| w.conn != conn);
            h.core.forget(gone);
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

    /// A bucket read on the leader of its group `group`, made through the
    /// log as a stream read is (a no-op entry; the read is made again
    /// once it applied), so that a leader cut off from its group never
    /// answers from a state it lost.
    pub(super) fn kv_read_through_log(
        &mut self,
        group: GroupId,
        conn: ConnId,
        ack_id: Option<u64>,
        op: super::events::KvOp,
        event: &str,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let h = (self.held.get_mut(&group))
            .filter(|h| h.core.serving())
            .ok_or_else(|| unavailable("the bucket's leader is not serving yet"))?;
        if h.core.full() {
            return Err(ApiError::new(
                Code::Limit,
                "too many requests are waiting for the bucket's replicas",
            ));
        }
        let read = Reply::KvRead {
            conn,
            ack_id,
            op,
            event: event.to_string(),
            arg: arg.map_or("{}", RawValue::get).to_string(),
        };
        h.core.take(Op::Expire { now_ms: 0 }, Some(read));
        Ok(None)
    }

    /// The leader of group `group` as this member knows it.
    pub(crate) fn leader(&self, group: GroupId) -> Option<u64> {
        self.held.get(&group).and_then(|h| h.core.leader())
    }

    /// The term of group `group` as this member knows it (0: not held).
    pub(crate) fn term(&self, group: GroupId) -> u64 {
        self.held.get(&group).map_or(0, |h| h.core.term())
    }

    /// Whether this node leads group `group` in term `term`.
    pub(crate) fn leads_in(&self, group: GroupId, term: u64) -> bool {
        self.held
            .get(&group)
            .is_some_and(|h| h.core.leads() && h.core.term() == term)
    }

    /// `(messages, bytes, first_seq, last_seq, consumers)` of group
    /// `group`'s replica here.
    pub(crate) fn state(&self, group: GroupId) -> Option<Value> {
        self.held.get(&group).map(|h| state_json(&h.core.replica))
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
pub(super) enum Route {
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
                    core: Group::new(Replica::new(cfg)),
                    waits: VecDeque::new(),
                    opened: store.is_none(),
                    store,
                    catchup: None,
                    installed: None,
                    lost: false,
                    sources: Default::default(),
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
                h.core.replica.destroy();
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
                if h.core.leads() {
                    h.core.take(Op::Expire { now_ms: 0 }, None);
                }
            }
        }
    }

    /// The group and members of replicated stream `name`, if it is one.
    pub(super) fn placed(&self, name: &str) -> Option<(GroupId, Vec<u64>)> {
        let p = self.fsm.streams.get(name)?.placement.as_ref()?;
        (p.replicas.len() > 1).then(|| (p.group, p.replicas.clone()))
    }

    pub(super) fn route(&self, group: GroupId, members: &[u64]) -> Result<Route, ApiError> {
        let c = self
            .cluster
            .as_ref()
            .ok_or_else(|| unavailable("not in a cluster"))?;
        let me = c.me();
        if let Some(h) = self.stream_groups.held.get(&group) {
            if h.core.leads() {
                return Ok(Route::Here);
            }
            return match h.core.leader() {
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
                .take_publish(&item, conn, ack_id, false)
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
        if reads && !h.core.serving() {
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
            let read = Reply::Read {
                conn,
                ack_id,
                op,
                arg: arg.map_or("{}", RawValue::get).to_string(),
                as_of: h.core.applied,
            };
            h.core.take(Op::Expire { now_ms: 0 }, Some(read));
            return Ok(None);
        }
        if h.core.full() {
            return Err(ApiError::new(
                Code::Limit,
                "too many requests are waiting for the stream's replicas",
            ));
        }
        let r = &h.core.replica;
        let reply_ok = |ack_id: Option<u64>| ack_id.map(|ack_id| Reply::Ok { conn, ack_id });
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
                    send_ack_with(sink, head, "/", conn, ack_id, body.as_bytes(), &attachments);
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
                let reply = ack_id.map(|ack_id| Reply::Consumer {
                    conn,
                    ack_id,
                    name: cfg.name,
                });
                h.core.take(Op::ConsumerCreate { config }, reply);
                Ok(None)
            }
            StreamOp::ConsumerDelete => {
                let req: ConsumerReq = parse(arg)?;
                let op = Op::ConsumerDelete { name: req.name };
                h.core.take(op, reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::StreamPurge => {
                let req: PurgeReq = parse(arg)?;
                let op = Op::Purge {
                    filter: req.subject,
                };
                h.core
                    .take(op, ack_id.map(|ack_id| Reply::Purge { conn, ack_id }));
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
                let op = Op::Acks {
                    consumer: req.consumer,
                    acks: vec![(kind, req.seq)],
                };
                h.core.take(op, reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::ConsumerFetch => {
                let req: FetchReq = parse(arg)?;
                if r.consumer(&req.consumer).is_none() && h.core.serving() {
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
    /// waiting fetches take their deliveries, and the group's turn ends
    /// (its ops go out as one entry, see [`Group::flush`]); requests
    /// refused meanwhile are answered `unavailable`.
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
        let mut out = Settled::default();
        let now_ms = epoch_ms();
        for (&group, h) in self.stream_groups.held.iter_mut() {
            if h.core.leads() {
                plan_fetches(h, now, &mut out.answers);
                plan_pushes(h, &mut self.fsm.subs, &self.remote_push, now);
            }
            let mut done = Vec::new();
            for p in h.core.flush(now, now_ms, &mut done) {
                raft.send(ToRaft::GroupPropose {
                    group,
                    tag: p.tag,
                    data: p.data,
                });
            }
            for d in done {
                settle(h, d, now, &mut out);
            }
        }
        self.stream_groups.send_settled(sink, out);
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
        let mut done = Vec::new();
        let mut out = Settled::default();
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
            GroupEvent::Apply { index, .. } if (h.lost && index > 1) || h.catchup.is_some() => {
                // The replica is not whole: the group's core is started
                // again without its log, or waits for it to be. An entry
                // past the snapshot being fetched (a new leader fed the
                // core meanwhile) is noted: the catch-up cannot end there.
                if let Some(cu) = h.catchup.as_mut() {
                    cu.skipped(index);
                }
            }
            GroupEvent::Apply { index, term, data } => {
                if h.lost {
                    // The core that lost its log is fed the leader's log
                    // from its start (the leader took no snapshot yet)
                    // rather than a snapshot: the replica is built again
                    // from that log.
                    h.lost = false;
                    h.opened = false;
                    h.core.applied = 0;
                    h.core.replica = Replica::new(h.core.replica.config().clone());
                }
                if !h.opened {
                    // A log applied from its start: the files of an
                    // earlier run go.
                    h.opened = true;
                    if let Some((dir, segment_bytes)) = &h.store {
                        match Payloads::open(dir, *segment_bytes) {
                            Ok(p) => h.core.replica.set_payloads(p),
                            Err(e) => crate::log_error!("{}: {e}", dir.display()),
                        }
                    }
                }
                if let Err(e) = h.core.apply(index, term, &data, now, &mut done, None) {
                    crate::log_error!("stream {:?}: entry {index}: {e}", h.name);
                }
            }
            GroupEvent::Proposed { tag, result } => {
                h.core.proposed(tag, result.ok(), &mut done);
            }
            GroupEvent::Status(s) => {
                if h.core.status(s.role == Role::Leader, s.term, s.leader) {
                    for w in std::mem::take(&mut h.waits) {
                        let body = unavailable("the stream's leader changed").ack_body();
                        out.answers.push((w.conn, w.ack_id, body));
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
        if let Some(h) = self.stream_groups.held.get_mut(&group) {
            for d in done {
                settle(h, d, now, &mut out);
            }
        }
        if !out.pushes.is_empty() {
            self.push_delivered(sink, group, std::mem::take(&mut out.pushes));
        }
        for (conn, ack_id, op, arg, as_of) in std::mem::take(&mut out.reads) {
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
                Ok(Some(body)) => out.answers.push((conn, ack_id, body)),
                Ok(None) => {}
                Err(e) => out.answers.push((conn, ack_id, e.ack_body())),
            }
            self.stream_groups.lag_as_of = None;
        }
        for (conn, ack_id, op, event, arg) in std::mem::take(&mut out.kv_reads) {
            self.stream_groups.kv_read_applied = true;
            let raw = RawValue::from_string(arg).ok();
            let r = self.kv_event(sink, conn, op, &event, raw.as_deref(), Some(ack_id), &[]);
            self.stream_groups.kv_read_applied = false;
            match r {
                Ok(Some(body)) => out.answers.push((conn, ack_id, body)),
                Ok(None) => {}
                Err(e) => out.answers.push((conn, ack_id, e.ack_body())),
            }
        }
        self.stream_groups.send_settled(sink, out);
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
            let Some(c) = h.core.replica.consumer(&name) else {
                continue;
            };
            let Some(subject) = c.cfg.deliver_subject.as_deref() else {
                continue;
            };
            let deliver_group = c.cfg.deliver_group.as_deref();
            for (seq, delivered) in list {
                let Some(m) = msg_of(&h.core.replica, seq) else {
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
                let upto = |g: &crate::cluster::api::GroupView| {
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
                .is_some_and(|h| h.core.leads());
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

/// What a group's events settled: answers to send, and the reads and
/// push deliveries whose entries applied.
#[derive(Default)]
struct Settled {
    answers: Vec<(ConnId, u64, String)>,
    binary: Vec<(ConnId, u64, String, Vec<Vec<u8>>)>,
    reads: Vec<(ConnId, u64, StreamOp, String, u64)>,
    kv_reads: Vec<(ConnId, u64, super::events::KvOp, String, String)>,
    pushes: Vec<(String, Vec<(u64, u64)>)>,
}

impl StreamGroups {
    /// Sends the answers `out` holds.
    fn send_settled(&mut self, sink: &mut dyn Sink, out: Settled) {
        for (conn, ack_id, body) in out.answers {
            self.answer(sink, conn, ack_id, body);
        }
        for (conn, ack_id, body, attachments) in out.binary {
            let head = &mut self.head;
            send_ack_with(sink, head, "/", conn, ack_id, body.as_bytes(), &attachments);
        }
    }
}

/// One request of group `h` done: refused, or answered with its op's
/// outcome (a read is served, a push consumer's deliveries sent, by the
/// caller).
fn settle(h: &mut Held, d: Done<Reply>, now: Instant, out: &mut Settled) {
    match d {
        Done::Refused(r, why) => refuse(&r, &mut out.answers, why),
        Done::Applied(
            Reply::Read {
                conn,
                ack_id,
                op,
                arg,
                as_of,
            },
            _,
        ) => out.reads.push((conn, ack_id, op, arg, as_of)),
        Done::Applied(
            Reply::KvRead {
                conn,
                ack_id,
                op,
                event,
                arg,
            },
            _,
        ) => out.kv_reads.push((conn, ack_id, op, event, arg)),
        Done::Applied(Reply::Push { consumer }, Outcome::Delivered(list)) => {
            out.pushes.push((consumer, list));
        }
        Done::Applied(Reply::Push { .. }, _) => {}
        Done::Applied(reply, outcome) => answer(h, &reply, outcome, now, out),
    }
}

fn refuse(r: &Reply, answers: &mut Vec<(ConnId, u64, String)>, why: &str) {
    let body = unavailable(why).ack_body();
    match r {
        Reply::Publish { conn, ack_id, .. }
        | Reply::Ok { conn, ack_id }
        | Reply::Purge { conn, ack_id }
        | Reply::Consumer { conn, ack_id, .. } => answers.push((*conn, *ack_id, body)),
        Reply::Fetch(w) => answers.push((w.conn, w.ack_id, body)),
        Reply::Push { .. } => {}
        Reply::Read { conn, ack_id, .. } | Reply::KvRead { conn, ack_id, .. } => {
            answers.push((*conn, *ack_id, body))
        }
    }
}

/// On the leader: every waiting fetch whose consumer has no delivery in
/// flight and has messages due gets an [`Op::Deliver`]; an expired or
/// `no_wait` fetch with nothing due is answered with no messages. A
/// leader not serving yet (its own first entry not applied) cannot tell
/// what is due: such a fetch is refused `unavailable`, to be asked again,
/// rather than answered with an empty batch a reader takes for the end.
fn plan_fetches(h: &mut Held, now: Instant, answers: &mut Vec<(ConnId, u64, String)>) {
    let mut keep = VecDeque::new();
    while let Some(w) = h.waits.pop_front() {
        let serving = h.core.serving();
        if h.core.replica.consumer(&w.consumer).is_none() && serving {
            let e = ApiError::new(Code::NotFound, format!("no consumer {:?}", w.consumer));
            answers.push((w.conn, w.ack_id, e.ack_body()));
            continue;
        }
        if !h.core.delivering(&w.consumer) && serving {
            let seqs = h.core.replica.next_deliveries(&w.consumer, w.batch, now);
            if !seqs.is_empty() {
                let consumer = w.consumer.clone();
                h.core.deliver(&consumer, seqs, Reply::Fetch(w));
                continue;
            }
        }
        if w.deadline <= now {
            let body = if serving {
                "[{\"ok\":true,\"messages\":[]}]".to_string()
            } else {
                unavailable("the stream's leader is not serving yet").ack_body()
            };
            answers.push((w.conn, w.ack_id, body));
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
    if !h.core.serving() {
        return;
    }
    let last_seq = h.core.replica.last_seq();
    for name in h.core.replica.consumer_names() {
        let Some(c) = h.core.replica.consumer(&name) else {
            continue;
        };
        let Some(subject) = c.cfg.deliver_subject.as_deref() else {
            continue;
        };
        let due = c.next_deadline().is_some_and(|t| t <= now);
        if h.core.delivering(&name) || !(due || c.may_have_work(last_seq)) {
            continue;
        }
        if !has_targets(subs, remote, subject, c.cfg.deliver_group.as_deref()) {
            continue;
        }
        let seqs = h
            .core
            .replica
            .next_deliveries(&name, PUSH_PER_TURN_MAX, now);
        if seqs.is_empty() {
            continue;
        }
        h.core.deliver(
            &name,
            seqs,
            Reply::Push {
                consumer: name.clone(),
            },
        );
    }
}

/// Answers one request with its op's outcome.
fn answer(h: &mut Held, reply: &Reply, out: Outcome, now: Instant, settled: &mut Settled) {
    let err = |e: ApiError| e.ack_body();
    let Settled {
        answers, binary, ..
    } = settled;
    match (reply, out) {
        (Reply::Publish { conn, ack_id, .. }, Outcome::Published(r))
            if matches!(reply, Reply::Publish { revision: true, .. }) =>
        {
            let body = match r {
                Ok(Stored::New { seq, .. } | Stored::Duplicate(seq)) => {
                    json!([{"ok": true, "revision": seq}]).to_string()
                }
                Err(e) => err(e),
            };
            answers.push((*conn, *ack_id, body));
        }
        (Reply::Publish { conn, ack_id, .. }, Outcome::Published(r)) => {
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
                    let info = consumer_json(&h.core.replica, name).unwrap_or(Value::Null);
                    ok_with(json!({ "consumer": info }))
                }
                Err(e) => err(e),
            };
            answers.push((*conn, *ack_id, body));
        }
        (Reply::Fetch(w), Outcome::Delivered(list)) => {
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
                let Some(m) = msg_of(&h.core.replica, seq) else {
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
            h.core.replica = rep;
            h.opened = true;
            h.core.applied = index;
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
        let written = snapshot_file::Writer::create(&dir, index).and_then(|mut w| {
            frozen.store(&mut w)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::read_config;

    fn held_with_one_message() -> Held {
        let Value::Object(m) = json!({"name": "S", "subjects": ["s.>"]}) else {
            unreachable!()
        };
        let mut replica = Replica::new(read_config(m).unwrap());
        let now = Instant::now();
        replica.apply(
            &[
                Op::Publish(crate::stream::replica::Publish {
                    subject: "s.a".into(),
                    headers: None,
                    data: b"1".to_vec(),
                    binary: false,
                    time_ms: 1,
                }),
                Op::ConsumerCreate {
                    config: r#"{"name":"c","ack_policy":"none"}"#.into(),
                },
            ],
            now,
        );
        Held {
            name: "S".into(),
            core: Group::new(replica),
            waits: VecDeque::new(),
            store: None,
            opened: true,
            catchup: None,
            installed: None,
            lost: false,
            sources: Default::default(),
        }
    }

    #[test]
    fn a_no_wait_fetch_at_a_leader_not_serving_yet_is_refused_not_answered_empty() {
        let mut h = held_with_one_message();
        assert!(!h.core.serving());
        let now = Instant::now();
        h.waits.push_back(FetchWait {
            conn: 1,
            ack_id: 7,
            consumer: "c".into(),
            batch: 10,
            deadline: now,
        });
        let mut answers = Vec::new();
        plan_fetches(&mut h, now, &mut answers);
        assert_eq!(answers.len(), 1);
        let (conn, ack_id, body) = &answers[0];
        assert_eq!((*conn, *ack_id), (1, 7));
        assert!(body.contains("\"unavailable\""), "{body}");
        assert!(h.waits.is_empty());
    }
}
