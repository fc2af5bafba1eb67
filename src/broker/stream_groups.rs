//! The data path of replicated streams (`replicas` > 1): every member
//! keeps a [`Replica`] of the stream (its state machine, `stream/replica.rs`)
//! fed by the committed entries of the stream's Raft group, and the
//! group's leader serves the stream's events.
//!
//! - On the leader, what one loop turn brings in for a stream (captured
//!   publishes, consumer creation and deletion, deliveries for fetches,
//!   `ack`/`nak`/`term`/`wip`, purges) becomes ONE entry proposed to the
//!   group (`Broker::flush_stream_groups` at the end of the turn). Each request
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
//! the stream simulation drives too. This module routes events to it,
//! feeds it the group's Raft events and renders its answers: this file
//! holds `StreamGroups`, the state of all of that, below the `Broker`
//! that holds it; the `Broker`'s side is in `stream_groups/held.rs` (the
//! groups held here, where an event is served), `stream_groups/serve.rs`
//! (events relayed or served as ops), `stream_groups/apply.rs` (the turn's
//! entries, the groups' Raft events) and `stream_groups/views.rs` (a
//! stream's `cluster` field, `stream.list` entries).
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
use super::cluster::actions::Action;
use super::events::StreamOp;
use super::session::NSP_ROOT;
use super::stream_out::{has_targets, push_accepted, push_message, push_stored, Push, RemotePush};
use super::streams::{epoch_ms, FETCH_BYTES_MAX, NAK_DELAY_MS_MAX, PUSH_PER_TURN_MAX};
use crate::cluster::api::snapshot_file::{self, FileRef};
use crate::cluster::api::{Cmd, GroupEvent, GroupId, MetaCommand, Role, ToRaft};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code, OK_BODY};
use crate::protocol::stream_messages::{
    self as sm, AckReq, ConsumerConfig, ConsumerCreate, ConsumerReq, FetchReq, GetReq, PurgeReq,
    StreamConfig, FETCH_BATCH_MAX,
};
use crate::routing::subs::SubTable;
use crate::stream::group::{Done, Group};
use crate::stream::payloads::Payloads;
use crate::stream::replica::{AckKind, Malformed, Op, Outcome, Publish, Replica};
use crate::stream::stream::{Msg, Stored};

mod apply;
mod held;
mod serve;
mod views;

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
    /// and the segment size, with a data directory, and where the group's
    /// log is when it is durable (messages are kept where it wrote them).
    pub(super) store: Option<(std::path::PathBuf, u64, Option<std::path::PathBuf>)>,
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
    /// Which replicated stream captures a subject, as the control state
    /// said at one index ([`Captures`]).
    pub(super) captures: Captures,
}

/// The replicated stream (its group and members) that captures each
/// subject published lately, or `None`: the answers of a scan over
/// every stream's subject filters, kept while the control state stays
/// at the index they were found at. Bounded: it starts again empty past
/// [`Captures::SUBJECTS_MAX`] subjects.
#[derive(Default)]
pub(crate) struct Captures {
    applied: u64,
    by_subject: HashMap<Box<str>, Option<Captured>>,
}

/// A replicated stream's group and members.
pub(crate) type Captured = (GroupId, std::rc::Rc<[u64]>);

impl Captures {
    const SUBJECTS_MAX: usize = 4096;

    /// What `subject` maps to while the control state is at `applied`,
    /// from `find` the first time.
    pub(super) fn get(
        &mut self,
        applied: u64,
        subject: &str,
        find: impl FnOnce() -> Option<(GroupId, Vec<u64>)>,
    ) -> Option<Captured> {
        if self.applied != applied || self.by_subject.len() >= Self::SUBJECTS_MAX {
            self.applied = applied;
            self.by_subject.clear();
        }
        if let Some(found) = self.by_subject.get(subject) {
            return found.clone();
        }
        let found = find().map(|(g, members)| (g, members.into()));
        self.by_subject.insert(subject.into(), found.clone());
        found
    }
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

/// The ack body of a publish stored at `seq` ([`push_stored`]).
fn stored_body(stream: &str, seq: u64, duplicate: bool) -> String {
    let mut body = Vec::with_capacity(48 + stream.len());
    push_stored(&mut body, stream, seq, duplicate);
    String::from_utf8(body).unwrap_or_default()
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
                Ok(Stored::New { seq, .. }) => stored_body(&h.name, seq, false),
                Ok(Stored::Duplicate(seq)) => stored_body(&h.name, seq, true),
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
        (Some(r), Some(f), Some((dir, segment_bytes, log))) => {
            let mut read =
                snapshot_file::Checked::new(std::io::BufReader::with_capacity(1 << 20, f), &r);
            Replica::restore_files(&mut read, r.size, now, dir, *segment_bytes, log.as_deref())
                .map(|(rep, target)| (rep.is_whole(&target), rep))
        }
        (Some(_), None, _) => Err(Malformed("its snapshot file is missing")),
        (Some(_), Some(_), None) => Err(Malformed("a snapshot file needs a data directory")),
        (None, _, store) => {
            let payloads = match store {
                Some((dir, segment_bytes, log)) => {
                    Payloads::open_in(dir, *segment_bytes, log.as_deref()).unwrap_or_else(|e| {
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
            crate::log_error!("stream {:?}: loading its snapshot at {index}: {e}", h.name);
            None
        }
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
    fn captures_are_found_once_per_control_index_and_stay_bounded() {
        let mut c = Captures::default();
        let scans = std::cell::Cell::new(0);
        let find = |g: Option<GroupId>| {
            scans.set(scans.get() + 1);
            g.map(|g| (g, vec![1, 2, 3]))
        };
        let got = c.get(5, "s.a", || find(Some(7)));
        assert_eq!(got.map(|(g, m)| (g, m.to_vec())), Some((7, vec![1, 2, 3])));
        // Kept while the control state stays at index 5, a miss too.
        assert_eq!(c.get(5, "s.a", || find(Some(9))).map(|r| r.0), Some(7));
        assert_eq!(c.get(5, "t", || find(None)), None);
        assert_eq!(c.get(5, "t", || find(Some(9))), None);
        // A later index (a stream made, moved or deleted) scans again.
        assert_eq!(c.get(6, "s.a", || find(Some(9))).map(|r| r.0), Some(9));
        assert_eq!(c.get(6, "t", || find(Some(9))).map(|r| r.0), Some(9));
        assert_eq!(scans.get(), 4);
        for k in 0..Captures::SUBJECTS_MAX * 2 {
            c.get(6, &format!("s.{k}"), || None);
            assert!(c.by_subject.len() <= Captures::SUBJECTS_MAX);
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
