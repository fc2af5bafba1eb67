//! The state machine of a replicated stream (`replicas` > 1): the entries
//! its Raft group's log carries, their encoding, and a deterministic
//! apply against an in-memory model of one stream, with snapshots.
//!
//! An entry is a batch of [`Op`]s, made by the stream's leader from what
//! one loop turn brought in: publishes, consumer creation and deletion,
//! deliveries (cursor moves), batches of `ack`/`nak`/`term`/`wip`, and
//! deliveries that used up `max_deliver` ([`Op::Exhausted`]).
//! Every replica applies the same entries in the same order with
//! [`Replica::apply`], which is a function of the state and the entry
//! alone (time comes from the entry, never from the replica's clock):
//! the same [`Outcome`]s and the same state everywhere. Sequences follow
//! from the log's order: the leader orders publishes by putting them in
//! its log, apply numbers them, and a publisher is acked with the seq of
//! the outcome once its entry is committed (held by a majority) and
//! applied.
//!
//! The rules are R1's (`stream.rs`), over an in-memory index instead of
//! segment files: `max_msg_size`, the `Msg-Id` window (bounded by [`DEDUP_IDS_MAX`](super::stream::DEDUP_IDS_MAX)),
//! `max_msgs`/`max_bytes` with discard old or new, `max_age_ms` (through
//! an [`Op::Expire`] made by the leader, carrying its clock), and the
//! limits, work-queue and interest retention. Bytes count the segment
//! record a message takes ([`msg_record_bytes`]), as R1's do. Consumers
//! are R1's [`Consumer`] driven by its durable [`Event`]s; their
//! redelivery timers are set by each replica from the entries it applies
//! (a `nak`'s delay travels in its entry) and are not in snapshots.
//!
//! Memory holds one small [`MsgMeta`] per message (seq, subject, time,
//! size and where its record is); the payloads are in [`Payloads`]
//! (`payloads.rs`): segment files on the broker, a map in the simulation.
//! Apply decides from the index alone, so the backend never changes an
//! outcome; the files are a local cache rebuilt from the group's snapshot
//! and log when a member starts.
//!
//! [`Replica::snapshot_to`] encodes the whole state canonically (equal
//! states give equal bytes), for a replica that falls behind the log's
//! start and for comparing replicas. The snapshot holds every payload;
//! it is written to a stream as they are read back, one message at a
//! time, and [`Replica::restore_from`] reads it back from a stream the
//! same way, so neither side needs the whole stream in memory.
//! [`Replica::snapshot`] and [`Replica::restore_with`] are the same over
//! one buffer.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use super::consumer::{Consumer, Event, Source};
use super::dedup::IdWindow;
use super::limits;
use super::payloads::{Detached, Loc, Payload, Payloads};
use super::segment::{msg_record_bytes, MsgRef, SUBJECT_BYTES_MAX};
use super::stream::{msg_id_of, tap_msg, Member, Stored, Tap, CONSUMERS_PER_STREAM_MAX};
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::stream_messages::{
    patterns_overlap, ConsumerConfig, DeliverPolicy, Retention, StreamConfig,
};
use crate::protocol::subject;

/// A publish captured by the stream, as the leader received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub subject: String,
    /// Raw JSON object text.
    pub headers: Option<String>,
    /// Raw JSON text, or an attachment's bytes when `binary`.
    pub data: Vec<u8>,
    pub binary: bool,
    /// The leader's clock when it took the publish (ms since the epoch).
    pub time_ms: u64,
}

/// What a client said about a delivered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    Ack,
    /// A `nak` due again at once.
    Nak,
    /// A `nak` with `delay_ms`: due again that many ms after it applies
    /// (at most [`NAK_DELAY_MS_MAX`]).
    NakDelay(u64),
    Term,
    Wip,
}

/// Largest `nak` delay (one day).
pub const NAK_DELAY_MS_MAX: u64 = 86_400_000;

/// One operation of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Publish(Publish),
    /// Drop messages past `max_age_ms` and forget `Msg-Id`s past the
    /// window, as of the leader's clock.
    Expire {
        now_ms: u64,
    },
    /// `stream.purge`: every message, or those whose subject matches.
    Purge {
        filter: Option<String>,
    },
    /// One message removed (`stream.msg.delete`).
    Remove {
        seq: u64,
    },
    /// A consumer made from its config (JSON text, as the client sent it).
    ConsumerCreate {
        config: String,
    },
    ConsumerDelete {
        name: String,
    },
    /// The leader is about to hand these sequences to the consumer (first
    /// deliveries move its cursor; the others are redeliveries).
    Deliver {
        consumer: String,
        seqs: Vec<u64>,
    },
    /// A turn's acks, naks, terms and wips on one consumer.
    Acks {
        consumer: String,
        acks: Vec<(AckKind, u64)>,
    },
    /// The leader saw these deliveries' last `ack_wait` run out with
    /// `max_deliver` used up: the consumer is done with them, as R1's
    /// is when its redelivery timer fires.
    Exhausted {
        consumer: String,
        seqs: Vec<u64>,
    },
}

/// What applying one [`Op`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Published(Result<Stored, ApiError>),
    /// Expire, purge, remove: how many messages went.
    Removed(Result<u64, ApiError>),
    /// Consumer create and delete.
    Consumer(Result<(), ApiError>),
    /// The deliveries accepted, each with its delivery count; the leader
    /// hands out exactly these.
    Delivered(Vec<(u64, u64)>),
    /// One answer per ack, in order.
    Acked(Vec<Result<(), ApiError>>),
    /// The sequences an [`Op::Exhausted`] finished.
    Finished(Vec<u64>),
}

/// A stored message, read back whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMsg {
    pub subject: Box<str>,
    pub headers: Option<Box<str>>,
    pub data: Box<[u8]>,
    pub binary: bool,
    pub time_ms: u64,
    /// What it counts for in `bytes`: its segment record.
    pub bytes: u64,
}

/// What memory keeps of a stored message: what the rules look at, and
/// where its payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgMeta {
    pub subject: Box<str>,
    pub time_ms: u64,
    /// What it counts for in `bytes`: its segment record.
    pub bytes: u64,
    /// A bucket's delete or purge marker (from its headers).
    pub marker: bool,
    loc: Loc,
}

impl limits::Held for Replica {
    fn config(&self) -> &StreamConfig {
        &self.cfg
    }
    fn messages(&self) -> u64 {
        self.msgs.len() as u64
    }
    fn bytes(&self) -> u64 {
        self.bytes
    }
    fn first_seq(&self) -> u64 {
        Replica::first_seq(self)
    }
    fn subject_count(&self, subject: &str) -> u64 {
        self.subjects.get(subject).map_or(0, |q| q.len() as u64)
    }
    fn oldest_of(&self, subject: &str) -> Option<u64> {
        self.subjects.get(subject)?.front().copied()
    }
    fn remove_seq(&mut self, seq: u64) -> Result<(), ApiError> {
        self.remove(seq);
        Ok(())
    }
}

/// Why bytes are not an entry or a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed stream entry: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// One replica of a stream: messages, `Msg-Id` window and consumers.
pub struct Replica {
    cfg: StreamConfig,
    msgs: BTreeMap<u64, MsgMeta>,
    payloads: Payloads,
    last_seq: u64,
    bytes: u64,
    /// The sum of every stored message's [`msg_hash`]: equal on replicas
    /// holding the same messages, whatever order they came in.
    digest: u64,
    ids: IdWindow,
    consumers: BTreeMap<String, Member>,
    /// The live seqs of each subject, oldest first (`max_msgs_per_subject`,
    /// a bucket's keys and latest values). Derived from `msgs`, so never
    /// in a snapshot.
    subjects: BTreeMap<Box<str>, VecDeque<u64>>,
    /// Copies of the messages stored while a bucket watch reads this
    /// replica (see [`Tap`]); not replica state.
    pub tap: Tap,
    /// Where the log stored the data of the publish being applied (file
    /// number and offset), while it applies.
    data_at: Option<(u64, u64)>,
}

/// What a stored message adds to a replica's digest: its seq, time,
/// size and record crc, mixed.
fn msg_hash(seq: u64, m: &MsgMeta) -> u64 {
    let mut x =
        seq ^ m.time_ms.rotate_left(17) ^ m.bytes.rotate_left(41) ^ u64::from(m.loc.crc) << 32;
    // splitmix64's finaliser.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Msgs<'a>(&'a BTreeMap<u64, MsgMeta>, u64);

impl Source for Msgs<'_> {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        self.0
            .range(from..)
            .find(|(_, m)| filter.is_none_or(|f| subject::matches(f, &m.subject)))
            .map(|(&s, _)| s)
    }
    fn contains(&self, seq: u64) -> bool {
        self.0.contains_key(&seq)
    }
    fn last_seq(&self) -> u64 {
        self.1
    }
}

/// The stored messages, as a consumer reads them (a bucket's watch).
impl Source for Replica {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        Msgs(&self.msgs, self.last_seq).next_matching(from, filter)
    }
    fn contains(&self, seq: u64) -> bool {
        self.msgs.contains_key(&seq)
    }
    fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

fn internal(what: &str) -> ApiError {
    ApiError::new(Code::Internal, what)
}

impl Replica {
    /// An empty stream with a validated config, its payloads in memory.
    pub fn new(cfg: StreamConfig) -> Replica {
        Replica::with_payloads(cfg, Payloads::memory())
    }

    /// An empty stream keeping its payloads in `payloads` (empty).
    pub fn with_payloads(cfg: StreamConfig, payloads: Payloads) -> Replica {
        Replica {
            cfg,
            msgs: BTreeMap::new(),
            payloads,
            last_seq: 0,
            bytes: 0,
            digest: 0,
            ids: IdWindow::default(),
            consumers: BTreeMap::new(),
            subjects: BTreeMap::new(),
            tap: None,
            data_at: None,
        }
    }

    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The first stored sequence (`last_seq + 1` when empty, as R1's).
    pub fn first_seq(&self) -> u64 {
        self.msgs
            .keys()
            .next()
            .copied()
            .unwrap_or(self.last_seq + 1)
    }

    pub fn messages(&self) -> u64 {
        self.msgs.len() as u64
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Message `seq`, its payload read back (`Ok(None)`: not stored).
    pub fn get(&self, seq: u64) -> io::Result<Option<StoredMsg>> {
        let Some(m) = self.msgs.get(&seq) else {
            return Ok(None);
        };
        let p = self.payloads.read(seq, m.loc)?;
        Ok(Some(StoredMsg {
            subject: p.subject,
            headers: p.headers,
            data: p.data,
            binary: p.binary,
            time_ms: p.time_ms,
            bytes: m.bytes,
        }))
    }

    /// Every stored message's index entry, in seq order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &MsgMeta)> {
        self.msgs.iter().map(|(&s, m)| (s, m))
    }

    /// Where the payloads are.
    pub fn payloads(&self) -> &Payloads {
        &self.payloads
    }

    pub fn consumer(&self, name: &str) -> Option<&Consumer> {
        self.consumers.get(name).map(|m| &m.consumer)
    }

    /// The consumers' names, in order.
    pub fn consumer_names(&self) -> Vec<String> {
        self.consumers.keys().cloned().collect()
    }

    pub fn consumer_mut(&mut self, name: &str) -> Option<&mut Consumer> {
        self.consumers.get_mut(name).map(|m| &mut m.consumer)
    }

    /// What a leader would deliver next to `consumer`, without recording
    /// it: redeliveries due first (nak'd, or past `ack_wait` or a nak's
    /// delay as of `now`), then new messages, at most `max`. The leader
    /// proposes them as an [`Op::Deliver`].
    pub fn next_deliveries(&self, consumer: &str, max: usize, now: Instant) -> Vec<u64> {
        let Some(m) = self.consumers.get(consumer) else {
            return Vec::new();
        };
        let mut c = m.consumer.clone();
        let src = Msgs(&self.msgs, self.last_seq);
        let mut out = Vec::new();
        let mut events = Vec::new();
        c.expire(now, &mut events);
        while out.len() < max {
            match c.next(now, &src, &mut events) {
                Some(d) => out.push(d.seq),
                None => break,
            }
        }
        out
    }

    /// The deliveries of `consumer` whose `ack_wait` (or delay) ran out
    /// by `now` with `max_deliver` used up: what the leader proposes as an
    /// [`Op::Exhausted`]. Empty unless a redelivery timer is due.
    pub fn exhausted_deliveries(&self, consumer: &str, now: Instant) -> Vec<u64> {
        let Some(m) = self.consumers.get(consumer) else {
            return Vec::new();
        };
        let c = &m.consumer;
        if c.cfg.max_deliver == 0 || c.next_deadline().is_none_or(|t| t > now) {
            return Vec::new();
        }
        let mut c = c.clone();
        let mut events = Vec::new();
        c.expire(now, &mut events);
        events
            .into_iter()
            .filter_map(|e| match e {
                Event::Done(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Applies one entry's operations; `now` only sets the consumers'
    /// local redelivery timers (which are not part of the replicated
    /// state).
    pub fn apply(&mut self, ops: &[Op], now: Instant) -> Vec<Outcome> {
        let out = self.apply_at(ops, &[], None, now);
        self.flush();
        out
    }

    /// [`Replica::apply`] of an entry whose data the log stored at `at`
    /// (file number and offset); `places` holds each op's data offset in
    /// that data ([`decode_entry_at`]). A message published there may be
    /// kept where the log wrote it ([`Payloads::append_at`]). Its messages
    /// go to their files with the next [`Replica::flush`].
    pub fn apply_at(
        &mut self,
        ops: &[Op],
        places: &[usize],
        at: Option<(u64, u64)>,
        now: Instant,
    ) -> Vec<Outcome> {
        if let Some((file, _)) = at {
            self.payloads.entry_in(file);
        }
        let out = ops
            .iter()
            .enumerate()
            .map(|(k, op)| {
                self.data_at = at.zip(places.get(k)).map(|((f, o), p)| (f, o + *p as u64));
                let out = self.apply_op(op, now);
                self.data_at = None;
                out
            })
            .collect();
        out
    }

    /// Writes the messages applied since the last call to their files
    /// ([`Replica::apply_at`] keeps them in memory, where reads find
    /// them, up to a bound): the caller does it once its answers are out.
    pub fn flush(&mut self) {
        if let Err(e) = self.payloads.flush() {
            crate::log_error!("stream {:?}: writing messages: {e}", self.cfg.name);
        }
    }

    fn apply_op(&mut self, op: &Op, now: Instant) -> Outcome {
        match op {
            Op::Publish(p) => Outcome::Published(self.store(p)),
            Op::Expire { now_ms } => Outcome::Removed(Ok(self.expire(*now_ms))),
            Op::Purge { filter } => {
                let gone: Vec<u64> = self
                    .msgs
                    .iter()
                    .filter(|(_, m)| {
                        filter
                            .as_deref()
                            .is_none_or(|f| subject::matches(f, &m.subject))
                    })
                    .map(|(&s, _)| s)
                    .collect();
                for &s in &gone {
                    self.remove(s);
                }
                Outcome::Removed(Ok(gone.len() as u64))
            }
            Op::Remove { seq } => Outcome::Removed(Ok(u64::from(self.remove(*seq)))),
            Op::ConsumerCreate { config } => Outcome::Consumer(self.create_consumer(config)),
            Op::ConsumerDelete { name } => Outcome::Consumer(self.delete_consumer(name)),
            Op::Deliver { consumer, seqs } => Outcome::Delivered(self.deliver(consumer, seqs, now)),
            Op::Acks { consumer, acks } => Outcome::Acked(self.acks(consumer, acks, now)),
            Op::Exhausted { consumer, seqs } => Outcome::Finished(self.exhausted(consumer, seqs)),
        }
    }

    /// R1's `Stream::store`, rule for rule.
    fn store(&mut self, p: &Publish) -> Result<Stored, ApiError> {
        let headers = p.headers.as_deref();
        let size = limits::check_size(&self.cfg, &p.subject, &p.data, headers)?;
        let id = (self.cfg.duplicate_window_ms > 0)
            .then(|| msg_id_of(headers))
            .flatten();
        if let Some(id) = &id {
            self.ids.forget(p.time_ms, self.cfg.duplicate_window_ms);
            if let Some(seq) = self.ids.get(id.as_str()) {
                return Ok(Stored::Duplicate(seq));
            }
        }
        let asks = limits::asks_of(headers);
        if asks.expected.is_some() {
            let latest = self.latest_of(&p.subject);
            limits::check_revision(&p.subject, asks.expected, latest)?;
        }
        limits::check_room(&self.cfg, self.messages(), self.bytes, size)?;
        if p.subject.is_empty() || p.subject.len() > SUBJECT_BYTES_MAX {
            return Err(internal("subject must be 1..=65535 bytes"));
        }
        let seq = self.last_seq + 1;
        let bytes = msg_record_bytes(&p.subject, headers, &p.data);
        self.put(
            seq, &p.subject, headers, &p.data, p.binary, p.time_ms, bytes,
        );
        self.last_seq = seq;
        self.bytes += bytes;
        if let Some(id) = id {
            self.ids.remember(id.into_boxed_str(), seq, p.time_ms);
        }
        tap_msg(
            &mut self.tap,
            seq,
            &p.subject,
            &p.data,
            p.binary,
            headers,
            p.time_ms,
        );
        let mut removed = Vec::new();
        if self.cfg.retention == Retention::Interest
            && !limits::has_interest(&self.consumers, &p.subject)
        {
            self.remove(seq);
            removed.push(seq);
            return Ok(Stored::New { seq, removed });
        }
        limits::trim(self, &p.subject, seq, asks.op, &mut removed)?;
        Ok(Stored::New { seq, removed })
    }

    /// The newest message of exactly `subject`: its seq, and whether it
    /// is a delete or purge marker.
    pub fn latest_of(&self, subject: &str) -> Option<(u64, bool)> {
        let &seq = self.subjects.get(subject)?.back()?;
        Some((seq, self.msgs.get(&seq).is_some_and(|m| m.marker)))
    }

    /// The last live seq of each subject matching `filter` (a subject or
    /// a pattern), in seq order.
    pub fn last_per_subject(&self, filter: &str) -> Vec<u64> {
        let mut seqs: Vec<u64> = self
            .subjects
            .iter()
            .filter(|(n, _)| subject::matches(filter, n))
            .filter_map(|(_, q)| q.back().copied())
            .collect();
        seqs.sort_unstable();
        seqs
    }

    /// Every live seq of exactly `subject`, oldest first.
    pub fn seqs_of(&self, subject: &str) -> Vec<u64> {
        self.subjects
            .get(subject)
            .map_or(Vec::new(), |q| q.iter().copied().collect())
    }

    /// Indexes a message's meta (the payload is stored already).
    fn index(&mut self, seq: u64, m: MsgMeta) {
        self.digest = self.digest.wrapping_add(msg_hash(seq, &m));
        let seqs = match self.subjects.get_mut(&m.subject) {
            Some(q) => q,
            None => self.subjects.entry(m.subject.clone()).or_default(),
        };
        match seqs.back() {
            Some(&last) if last > seq => {
                let at = seqs.partition_point(|&s| s < seq);
                seqs.insert(at, seq);
            }
            _ => seqs.push_back(seq),
        }
        self.msgs.insert(seq, m);
    }

    /// Takes message `seq` out of the index; its meta if it was there.
    fn unindex(&mut self, seq: u64) -> Option<MsgMeta> {
        let m = self.msgs.remove(&seq)?;
        self.bytes -= m.bytes;
        self.digest = self.digest.wrapping_sub(msg_hash(seq, &m));
        if let Some(q) = self.subjects.get_mut(&m.subject) {
            if q.front() == Some(&seq) {
                q.pop_front();
            } else if let Ok(at) = q.binary_search(&seq) {
                q.remove(at);
            }
            if q.is_empty() {
                self.subjects.remove(&m.subject);
            }
        }
        Some(m)
    }

    /// Indexes message `seq` and hands its payload to the store. A
    /// failed write is logged and leaves the index as on every other
    /// replica (apply's outcome never depends on the disk); reading that
    /// message is then an error.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        seq: u64,
        subject: &str,
        headers: Option<&str>,
        data: &[u8],
        binary: bool,
        time_ms: u64,
        bytes: u64,
    ) {
        let m = MsgRef {
            seq,
            time_ms,
            subject,
            headers,
            data,
            binary,
        };
        let loc = self
            .payloads
            .append_at(&m, self.data_at.take())
            .unwrap_or_else(|e| {
                crate::log_error!("stream {:?}: writing message {seq}: {e}", self.cfg.name);
                Loc::default()
            });
        let m = MsgMeta {
            subject: subject.into(),
            time_ms,
            bytes,
            marker: limits::asks_of(headers).op != limits::KvOp::Put,
            loc,
        };
        self.index(seq, m);
    }

    /// Removes `seq` and every consumer's pending delivery of it.
    fn remove(&mut self, seq: u64) -> bool {
        if self.unindex(seq).is_none() {
            return false;
        }
        self.payloads.remove(seq);
        for member in self.consumers.values_mut() {
            member.consumer.forget(seq);
        }
        true
    }

    fn expire(&mut self, now_ms: u64) -> u64 {
        self.ids.forget(now_ms, self.cfg.duplicate_window_ms);
        let mut n = 0;
        if self.cfg.max_age_ms == 0 {
            return 0;
        }
        while let Some((&first, m)) = self.msgs.iter().next() {
            if m.time_ms + self.cfg.max_age_ms > now_ms {
                break;
            }
            self.remove(first);
            n += 1;
        }
        n
    }

    /// Whether an acked `seq` may go (see [`limits::done_with`]).
    fn done_with(&self, seq: u64) -> bool {
        let subj = self.msgs.get(&seq).map(|m| &*m.subject);
        limits::done_with(&self.cfg, &self.consumers, seq, subj)
    }

    fn start_seq(&self, cfg: &ConsumerConfig) -> u64 {
        match cfg.deliver_policy {
            DeliverPolicy::All => 1,
            DeliverPolicy::New => self.last_seq + 1,
            DeliverPolicy::ByStartSeq => cfg.opt_start_seq.unwrap_or(1),
            DeliverPolicy::Last => {
                let filter = cfg.filter_subject.as_deref().unwrap_or(">");
                self.msgs
                    .iter()
                    .rev()
                    .find(|(_, m)| subject::matches(filter, &m.subject))
                    .map_or(self.last_seq + 1, |(&s, _)| s)
            }
        }
    }

    fn create_consumer(&mut self, config: &str) -> Result<(), ApiError> {
        let mut cfg: ConsumerConfig = serde_json::from_str(config)
            .map_err(|e| ApiError::new(Code::BadRequest, format!("consumer config: {e}")))?;
        cfg.validate()?;
        if self.consumers.contains_key(&cfg.name) {
            return Err(ApiError::new(
                Code::Exists,
                format!("consumer {:?} exists", cfg.name),
            ));
        }
        if self.consumers.len() >= CONSUMERS_PER_STREAM_MAX {
            return Err(ApiError::new(Code::Limit, "too many consumers"));
        }
        if self.cfg.retention == Retention::Workqueue {
            let mine = cfg.filter_subject.as_deref().unwrap_or(">");
            let clash = self.consumers.values().any(|m| {
                let theirs = m.consumer.cfg.filter_subject.as_deref().unwrap_or(">");
                patterns_overlap(mine, theirs)
            });
            if clash {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "a workqueue stream takes one consumer per subject (filters overlap)",
                ));
            }
        }
        let start = self.start_seq(&cfg);
        let name = cfg.name.clone();
        let since = self.last_seq;
        self.consumers.insert(
            name,
            Member {
                consumer: Consumer::new(cfg, start),
                since,
            },
        );
        Ok(())
    }

    fn delete_consumer(&mut self, name: &str) -> Result<(), ApiError> {
        if self.consumers.remove(name).is_none() {
            return Err(ApiError::new(
                Code::NotFound,
                format!("no consumer {name:?}"),
            ));
        }
        if self.cfg.retention == Retention::Interest {
            // A message only it was holding is done with now.
            let done: Vec<u64> = self
                .msgs
                .keys()
                .copied()
                .filter(|&s| self.done_with(s))
                .collect();
            for s in done {
                self.remove(s);
            }
        }
        Ok(())
    }

    fn deliver(&mut self, consumer: &str, seqs: &[u64], now: Instant) -> Vec<(u64, u64)> {
        let Some(member) = self.consumers.get_mut(consumer) else {
            return Vec::new();
        };
        let c = &mut member.consumer;
        let mut out = Vec::new();
        for &seq in seqs {
            let Some(m) = self.msgs.get(&seq) else {
                continue;
            };
            let first = seq >= c.next_seq()
                && c.cfg
                    .filter_subject
                    .as_deref()
                    .is_none_or(|f| subject::matches(f, &m.subject));
            if !first && !c.is_pending(seq) {
                continue; // done with, or never this consumer's
            }
            c.replay(Event::Delivered(seq), now);
            out.push((seq, c.deliveries(seq).max(1)));
        }
        out
    }

    fn acks(
        &mut self,
        consumer: &str,
        acks: &[(AckKind, u64)],
        now: Instant,
    ) -> Vec<Result<(), ApiError>> {
        let mut out = Vec::with_capacity(acks.len());
        for &(kind, seq) in acks {
            let Some(member) = self.consumers.get_mut(consumer) else {
                out.push(Err(ApiError::new(
                    Code::NotFound,
                    format!("no consumer {consumer:?}"),
                )));
                continue;
            };
            let c = &mut member.consumer;
            let mut events = Vec::new();
            let r = match kind {
                AckKind::Ack => c.ack(seq, &mut events),
                AckKind::Term => c.term(seq, &mut events).map(|_| Vec::new()),
                AckKind::Nak => c.nak(seq, Duration::ZERO, now).map(|_| Vec::new()),
                AckKind::NakDelay(ms) => c
                    .nak(seq, Duration::from_millis(ms.min(NAK_DELAY_MS_MAX)), now)
                    .map(|_| Vec::new()),
                AckKind::Wip => c.wip(seq, now).map(|_| Vec::new()),
            };
            match r {
                Ok(done) => {
                    for s in done {
                        if self.done_with(s) {
                            self.remove(s);
                        }
                    }
                    out.push(Ok(()));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    /// [`Op::Exhausted`]: each seq still pending with `max_deliver` used
    /// up is done with (and goes under work-queue or interest retention).
    /// The check is on replicated state alone; the leader's timer only
    /// chose when to ask, so an ack applied first wins.
    fn exhausted(&mut self, consumer: &str, seqs: &[u64]) -> Vec<u64> {
        let Some(member) = self.consumers.get_mut(consumer) else {
            return Vec::new();
        };
        let c = &mut member.consumer;
        let max = c.cfg.max_deliver;
        let done: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|&s| max > 0 && c.deliveries(s) >= max && c.forget(s))
            .collect();
        for &s in &done {
            if self.done_with(s) {
                self.remove(s);
            }
        }
        done
    }

    // ---- snapshots ----

    /// The whole state, canonically encoded: equal states, equal bytes.
    /// Every payload is read back into it; a payload that cannot be read
    /// fails the snapshot. The bytes of [`Replica::snapshot_to`], in one
    /// buffer.
    pub fn snapshot(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.snapshot_to(&mut out)?;
        Ok(out)
    }

    /// Writes [`Replica::snapshot`]'s bytes to `w` as it reads the
    /// payloads back, one at a time, and returns how many it wrote (see
    /// [`Frozen::write_to`]). On an error `w` has an unfinished snapshot
    /// in it.
    pub fn snapshot_to(&self, w: &mut dyn Write) -> io::Result<u64> {
        self.state()
            .write_with(&|seq, loc| self.payloads.read(seq, loc), w)
    }

    /// The state as it is now, detached from the replica, for a snapshot
    /// in a file written on another thread while the replica goes on: the
    /// stream's state without its payloads ([`Frozen::write_to`], small:
    /// config, counts, the ranges of live seqs, the digest, the `Msg-Id`
    /// window, the consumers), and, to serve a member catching up from
    /// it, the payload files held open and where some records are in
    /// them ([`Frozen::records_after`]). The files written since the
    /// last freeze and those that died go with it (see [`Detached`]).
    /// It runs on the loop, so it walks neither the messages nor their
    /// seqs when no message inside the stream was removed.
    pub fn freeze(&mut self) -> io::Result<Frozen> {
        let payloads = self.payloads.detach()?;
        let ranges = self.live_ranges();
        // Every MARK_EVERY-th seq's record is named, not every one's: the
        // loop does O(messages / MARK_EVERY) here, and a catch-up reads
        // the records between two marks from the file.
        let mut marks = Vec::new();
        let mut from = 0;
        while let Some((&seq, m)) = self.msgs.range(from..).next() {
            marks.push((seq, m.loc));
            let Some(n) = seq.checked_add(MARK_EVERY) else {
                break;
            };
            from = n;
        }
        Ok(Frozen {
            small: self.small_with(&ranges),
            payloads,
            ranges,
            marks,
            last_seq: self.last_seq,
        })
    }

    /// The ranges of live seqs: one when no message inside was removed,
    /// told without walking them.
    fn live_ranges(&self) -> Vec<(u64, u64)> {
        match (self.msgs.first_key_value(), self.msgs.last_key_value()) {
            (Some((&lo, _)), Some((&hi, _))) if hi - lo + 1 == self.msgs.len() as u64 => {
                vec![(lo, hi)]
            }
            _ => live_ranges(self.msgs.keys().copied()),
        }
    }

    /// The small snapshot's bytes: everything but the messages, which
    /// are named by ranges of live seqs and checked by the digest.
    #[cfg(test)]
    fn small_state(&self) -> Vec<u8> {
        self.small_with(&self.live_ranges())
    }

    /// [`Replica::small_state`] with its live ranges told.
    fn small_with(&self, ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut out = vec![SMALL_VERSION];
        put_str(&mut out, &config_json(&self.cfg));
        put_u64(&mut out, self.last_seq);
        put_u64(&mut out, self.msgs.len() as u64);
        put_u64(&mut out, self.bytes);
        put_u64(&mut out, self.digest);
        put_u64(&mut out, ranges.len() as u64);
        for &(lo, hi) in ranges {
            put_u64(&mut out, lo);
            put_u64(&mut out, hi);
        }
        out.extend_from_slice(&self.tail());
        out
    }

    /// The Msg-Id window and the consumers, encoded.
    fn tail(&self) -> Vec<u8> {
        let mut tail = Vec::new();
        put_u64(&mut tail, self.ids.len() as u64);
        for (t, seq, id) in self.ids.iter() {
            put_u64(&mut tail, t);
            put_u64(&mut tail, seq);
            put_str(&mut tail, id);
        }
        put_u64(&mut tail, self.consumers.len() as u64);
        for m in self.consumers.values() {
            put_str(&mut tail, &consumer_json(&m.consumer.cfg));
            put_u64(&mut tail, m.since);
            let (next, cseq, pending) = m.consumer.snapshot();
            put_u64(&mut tail, next);
            put_u64(&mut tail, cseq);
            put_u64(&mut tail, pending.len() as u64);
            for (s, d) in pending {
                put_u64(&mut tail, s);
                put_u64(&mut tail, d);
            }
        }
        tail
    }

    /// Everything of the snapshot but the payloads.
    fn state(&self) -> State {
        let mut head = vec![SNAPSHOT_VERSION];
        put_str(&mut head, &config_json(&self.cfg));
        put_u64(&mut head, self.last_seq);
        put_u64(&mut head, self.msgs.len() as u64);
        let msgs = self
            .msgs
            .iter()
            .map(|(&seq, m)| (seq, m.time_ms, m.subject.clone(), m.loc))
            .collect();
        let tail = self.tail();
        State { head, msgs, tail }
    }

    /// A replica from [`Replica::snapshot`]'s bytes, its payloads in
    /// memory; every pending delivery is due for redelivery at `now`.
    pub fn restore(bytes: &[u8], now: Instant) -> Result<Replica, Malformed> {
        Replica::restore_with(bytes, now, Payloads::memory())
    }

    /// [`Replica::restore`] with the payloads written to `payloads` (empty).
    pub fn restore_with(
        bytes: &[u8],
        now: Instant,
        payloads: Payloads,
    ) -> Result<Replica, Malformed> {
        Replica::restore_from(&mut &bytes[..], bytes.len() as u64, now, payloads)
    }

    /// [`Replica::restore_with`] reading the snapshot from `r`, which
    /// must hold exactly `len` bytes of it. Each message's payload goes
    /// to `payloads` as soon as it is read, so memory holds one message
    /// at a time besides the index. Every count is checked against the
    /// bytes left of `len` before anything is reserved; a snapshot that
    /// ends before `len` is refused, as is a reader that ends before it
    /// or fails.
    pub fn restore_from(
        r: &mut dyn Read,
        len: u64,
        now: Instant,
        payloads: Payloads,
    ) -> Result<Replica, Malformed> {
        let mut r = SnapshotReader { r, remaining: len };
        if r.u8()? != SNAPSHOT_VERSION {
            return Err(Malformed("snapshot version"));
        }
        Replica::restore_v1(&mut r, now, payloads)
    }

    /// [`Replica::restore_from`] after the version byte.
    fn restore_v1(
        r: &mut SnapshotReader<'_>,
        now: Instant,
        payloads: Payloads,
    ) -> Result<Replica, Malformed> {
        let cfg: StreamConfig =
            serde_json::from_str(&r.string()?).map_err(|_| Malformed("stream config"))?;
        let mut rep = Replica::with_payloads(cfg, payloads);
        rep.last_seq = r.u64()?;
        let n = r.count(26)?;
        for _ in 0..n {
            let seq = r.u64()?;
            let time_ms = r.u64()?;
            let binary = r.bool()?;
            let subject = r.string()?;
            let headers = r.opt_string()?;
            let data = r.bytes()?;
            if seq > rep.last_seq || rep.msgs.keys().next_back().is_some_and(|&l| l >= seq) {
                return Err(Malformed("message sequence out of order"));
            }
            if subject.is_empty() || subject.len() > SUBJECT_BYTES_MAX {
                return Err(Malformed("subject length"));
            }
            let headers = headers.as_deref();
            let bytes = msg_record_bytes(&subject, headers, &data);
            rep.bytes += bytes;
            rep.put(seq, &subject, headers, &data, binary, time_ms, bytes);
        }
        if let Err(e) = rep.payloads.flush() {
            crate::log_error!("stream {:?}: writing messages: {e}", rep.cfg.name);
        }
        (rep.ids, rep.consumers) = read_tail(r, now)?;
        Ok(rep)
    }

    /// A replica from a snapshot in a file (`r`, `len` bytes) and the
    /// payload files in `dir`. A small snapshot ([`Replica::freeze`])
    /// keeps the files that hold its messages ([`Payloads::reopen`]) and
    /// says, as a [`Target`], what the replica must hold to be whole: the
    /// messages it lacks are after every message it kept, to be fetched
    /// from the group's leader ([`Replica::take_records`]). A full one
    /// (written before snapshots were small) is restored with its
    /// payloads into the emptied directory.
    pub fn restore_files(
        r: &mut dyn Read,
        len: u64,
        now: Instant,
        dir: &std::path::Path,
        segment_bytes: u64,
        log: Option<&std::path::Path>,
    ) -> Result<(Replica, Target), Malformed> {
        let mut r = SnapshotReader { r, remaining: len };
        let files_failed = |e: io::Error| {
            crate::log_error!("{}: {e}", dir.display());
            Malformed("its payload files could not be opened")
        };
        match r.u8()? {
            SNAPSHOT_VERSION => {
                let payloads = Payloads::open_in(dir, segment_bytes, log).map_err(files_failed)?;
                let rep = Replica::restore_v1(&mut r, now, payloads)?;
                let target = rep.target();
                Ok((rep, target))
            }
            SMALL_VERSION => {
                let (cfg, target) = read_small_head(&mut r)?;
                let (payloads, found) =
                    Payloads::reopen_in(dir, segment_bytes, &target.ranges, log)
                        .map_err(files_failed)?;
                let mut rep = Replica::with_payloads(cfg, payloads);
                rep.last_seq = target.last_seq;
                for (seq, f) in found {
                    let m = MsgMeta {
                        subject: f.subject,
                        time_ms: f.time_ms,
                        bytes: f.bytes,
                        marker: f.marker,
                        loc: f.loc,
                    };
                    rep.bytes += m.bytes;
                    rep.index(seq, m);
                }
                (rep.ids, rep.consumers) = read_tail(&mut r, now)?;
                Ok((rep, target))
            }
            _ => Err(Malformed("snapshot version")),
        }
    }

    /// Takes the state of a small snapshot (`r`, `len` bytes) of the same
    /// stream at a later index, keeping the messages held here that it
    /// names and dropping the others; what it names beyond them is to be
    /// fetched ([`Replica::take_records`]) until [`Replica::is_whole`].
    /// Messages the snapshot names that are missing below the last one
    /// held (a replica that lost files) make it start over empty.
    pub fn rebase(
        &mut self,
        r: &mut dyn Read,
        len: u64,
        now: Instant,
    ) -> Result<Target, Malformed> {
        let mut r = SnapshotReader { r, remaining: len };
        if r.u8()? != SMALL_VERSION {
            return Err(Malformed("snapshot version"));
        }
        let (cfg, target) = read_small_head(&mut r)?;
        let (ids, consumers) = read_tail(&mut r, now)?;
        let gone: Vec<u64> = self
            .msgs
            .keys()
            .copied()
            .filter(|&s| !target.wants(s))
            .collect();
        for s in gone {
            self.drop_msg(s);
        }
        let held = self.msgs.len() as u64;
        let below = target.count_through(self.held_through());
        if held != below {
            self.start_over();
        }
        self.cfg = cfg;
        self.last_seq = target.last_seq;
        self.ids = ids;
        self.consumers = consumers;
        Ok(target)
    }

    /// Gives an empty replica its payload store.
    pub fn set_payloads(&mut self, payloads: Payloads) {
        debug_assert!(
            self.msgs.is_empty(),
            "a replica holding messages keeps its store"
        );
        self.payloads = payloads;
    }

    /// Deletes the payload files (the replica is gone for good).
    pub fn destroy(self) {
        self.payloads.destroy();
    }

    /// Deletes the payload files whose messages are all gone, at once:
    /// for a replica whose snapshots are not kept in files (no restart
    /// reads them).
    pub fn delete_dead(&mut self) {
        if let Ok(mut d) = self.payloads.detach() {
            for (path, e) in crate::storage::delete_files(&d.take_dead()) {
                crate::log_error!("{}: {e}", path.display());
            }
        }
    }

    /// Forgets every message and empties the payload store.
    pub fn start_over(&mut self) {
        if let Err(e) = self.payloads.clear() {
            crate::log_error!("stream {:?}: emptying its files: {e}", self.cfg.name);
        }
        self.msgs.clear();
        self.subjects.clear();
        self.bytes = 0;
        self.digest = 0;
    }

    /// Removes message `seq` from the index and the store only.
    fn drop_msg(&mut self, seq: u64) {
        if self.unindex(seq).is_some() {
            self.payloads.remove(seq);
        }
    }

    /// The highest seq held (0: none).
    pub fn held_through(&self) -> u64 {
        self.msgs.keys().next_back().copied().unwrap_or(0)
    }

    /// Whether the replica holds exactly the messages `target` names.
    pub fn is_whole(&self, target: &Target) -> bool {
        self.msgs.len() as u64 == target.count
            && self.bytes == target.bytes
            && self.digest == target.digest
    }

    /// What this replica is, as a [`Target`] (whole by definition).
    fn target(&self) -> Target {
        Target {
            last_seq: self.last_seq,
            count: self.msgs.len() as u64,
            bytes: self.bytes,
            digest: self.digest,
            ranges: live_ranges(self.msgs.keys().copied()),
        }
    }

    /// Stores the framed message records in `recs` (as
    /// [`Frozen::records_after`] gives them), each one `target` names and
    /// above every seq held; returns how many it stored. Anything else
    /// is refused, and nothing after it is stored.
    pub fn take_records(&mut self, recs: &[u8], target: &Target) -> Result<u64, Malformed> {
        let mut at = 0;
        let mut n = 0;
        let result = loop {
            let (body, next) = match crate::storage::record::read(recs, at) {
                Ok(Some(r)) => r,
                Ok(None) => break Ok(n),
                Err(_) => break Err(Malformed("a record of the catch-up is damaged")),
            };
            let m = match super::segment::decode(body) {
                Ok(super::segment::Rec::Msg(m)) => m,
                _ => break Err(Malformed("a record of the catch-up is not a message")),
            };
            if m.seq <= self.held_through() || !target.wants(m.seq) {
                break Err(Malformed("a message of the catch-up is not the one wanted"));
            }
            let bytes = msg_record_bytes(m.subject, m.headers, m.data);
            self.put(
                m.seq, m.subject, m.headers, m.data, m.binary, m.time_ms, bytes,
            );
            self.bytes += bytes;
            n += 1;
            at = next;
        };
        if let Err(e) = self.payloads.flush() {
            crate::log_error!("stream {:?}: writing messages: {e}", self.cfg.name);
        }
        result
    }

    /// Writes the buffered appends and fsyncs the payload files.
    pub fn sync(&mut self) -> io::Result<()> {
        self.payloads.sync()
    }
}

/// What a replica restored from a small snapshot must hold to be whole:
/// the snapshot's counts, digest and live seqs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub last_seq: u64,
    pub count: u64,
    pub bytes: u64,
    pub digest: u64,
    /// Live seqs: sorted, disjoint, inclusive ranges.
    ranges: Vec<(u64, u64)>,
}

impl Target {
    /// Whether the snapshot names message `seq`.
    pub fn wants(&self, seq: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, hi)| hi < seq);
        self.ranges.get(i).is_some_and(|&(lo, _)| lo <= seq)
    }

    /// Whether it names a message after `seq`.
    pub fn wants_after(&self, seq: u64) -> bool {
        self.ranges.last().is_some_and(|&(_, hi)| hi > seq)
    }

    /// How many messages it names at or below `seq`.
    fn count_through(&self, seq: u64) -> u64 {
        self.ranges
            .iter()
            .take_while(|&&(lo, _)| lo <= seq)
            .map(|&(lo, hi)| hi.min(seq) - lo + 1)
            .sum()
    }
}

/// Sorted seqs as inclusive runs.
fn live_ranges(seqs: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for s in seqs {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == s => *hi = s,
            _ => out.push((s, s)),
        }
    }
    out
}

/// A small snapshot's config and target (after its version byte).
fn read_small_head(r: &mut SnapshotReader<'_>) -> Result<(StreamConfig, Target), Malformed> {
    let cfg: StreamConfig =
        serde_json::from_str(&r.string()?).map_err(|_| Malformed("stream config"))?;
    let last_seq = r.u64()?;
    let count = r.u64()?;
    let bytes = r.u64()?;
    let digest = r.u64()?;
    let n = r.count(16)?;
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(n.min(RESERVE_MAX / 16));
    for _ in 0..n {
        let (lo, hi) = (r.u64()?, r.u64()?);
        if lo > hi
            || hi > last_seq
            || ranges
                .last()
                .is_some_and(|&(_, h)| h.saturating_add(1) >= lo)
        {
            return Err(Malformed("live ranges out of order"));
        }
        ranges.push((lo, hi));
    }
    let target = Target {
        last_seq,
        count,
        bytes,
        digest,
        ranges,
    };
    if target.count_through(u64::MAX) != count {
        return Err(Malformed("live ranges do not add up to the count"));
    }
    Ok((cfg, target))
}

/// The Msg-Id window and the consumers, the end of every snapshot; the
/// snapshot must end with them.
#[allow(clippy::type_complexity)]
fn read_tail(
    r: &mut SnapshotReader<'_>,
    now: Instant,
) -> Result<(IdWindow, BTreeMap<String, Member>), Malformed> {
    let mut ids = IdWindow::default();
    let n = r.count(20)?;
    for _ in 0..n {
        let t = r.u64()?;
        let seq = r.u64()?;
        let id: Box<str> = r.string()?.into();
        ids.remember(id, seq, t);
    }
    let mut consumers = BTreeMap::new();
    let n = r.count(36)?;
    for _ in 0..n {
        let cfg: ConsumerConfig =
            serde_json::from_str(&r.string()?).map_err(|_| Malformed("consumer config"))?;
        let since = r.u64()?;
        let next = r.u64()?;
        let cseq = r.u64()?;
        let k = r.count(16)?;
        let mut pending = Vec::with_capacity(k.min(RESERVE_MAX / 16));
        for _ in 0..k {
            pending.push((r.u64()?, r.u64()?));
        }
        let name = cfg.name.clone();
        let mut consumer = Consumer::new(cfg, next);
        consumer.restore(next, cseq, &pending, now);
        consumers.insert(name, Member { consumer, since });
    }
    if r.remaining != 0 {
        return Err(Malformed("bytes after the snapshot"));
    }
    Ok((ids, consumers))
}

const SNAPSHOT_VERSION: u8 = 1;

/// The version byte of a small snapshot ([`Replica::freeze`]).
pub const SMALL_VERSION: u8 = 2;

/// [`Replica::snapshot_to`] hands its writer this many bytes or more at
/// a time (a message larger than this, whole).
pub const SNAPSHOT_WRITE_CHUNK: usize = 64 * 1024;

/// The most a snapshot reader reserves ahead of the bytes it has read:
/// a length or count the snapshot's `len` allows may still be a lie when
/// the reader ends early, so buffers grow with what actually arrives.
const RESERVE_MAX: usize = 64 * 1024;

/// A frozen state names one message's record per this many seqs
/// ([`Frozen::marks`]).
const MARK_EVERY: u64 = 256;

/// A replica's state at one applied index, detached from it
/// ([`Replica::freeze`]): its small snapshot, and what a member catching
/// up from that snapshot is sent.
pub struct Frozen {
    small: Vec<u8>,
    payloads: Detached,
    /// The ranges of live seqs.
    ranges: Vec<(u64, u64)>,
    /// Where the records of some live messages are, in seq order: the
    /// first one's and then the first at or after each one's seq plus
    /// [`MARK_EVERY`].
    marks: Vec<(u64, Loc)>,
    last_seq: u64,
}

impl Frozen {
    /// The small snapshot's bytes.
    pub fn small(&self) -> &[u8] {
        &self.small
    }

    /// Writes the small snapshot's bytes to `w`; how many it wrote.
    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<u64> {
        w.write_all(&self.small)?;
        w.flush()?;
        Ok(self.small.len() as u64)
    }

    /// Fsyncs the payload files written since the replica's last freeze
    /// (see [`Detached::sync`]): before its snapshot is stored.
    pub fn sync(&self) -> io::Result<()> {
        self.payloads.sync()
    }

    /// Stores the snapshot: fsyncs the payload files it names, THEN writes
    /// its bytes to `w` (a snapshot stored before the messages it names
    /// are durable would, after a crash, name messages no file holds, and
    /// the log entries that held them are compacted away). How many bytes
    /// it wrote.
    pub fn store(&self, w: &mut dyn Write) -> io::Result<u64> {
        self.sync()?;
        self.write_to(w)
    }

    /// The payload files that died before it, to delete once its
    /// snapshot is stored.
    pub fn take_dead(&mut self) -> Vec<std::path::PathBuf> {
        self.payloads.take_dead()
    }

    /// The framed records of the live messages after seq `after`, in
    /// order, about `max_bytes` of them (at least one), and the seq they
    /// cover through: the last one's, or the snapshot's last seq when no
    /// live message is left after them.
    pub fn records_after(&self, after: u64, max_bytes: usize) -> io::Result<(Vec<u8>, u64)> {
        // The first live seq after `after`, and the last mark at or
        // before it, where the walk through the files starts.
        let at = self.ranges.partition_point(|&(_, hi)| hi <= after);
        let Some(&(lo, _)) = self.ranges.get(at) else {
            return Ok((Vec::new(), self.last_seq.max(after)));
        };
        let next = lo.max(after + 1);
        let mark = self.marks.partition_point(|&(s, _)| s <= next);
        let Some(&start) = mark.checked_sub(1).and_then(|m| self.marks.get(m)) else {
            return Err(io::Error::other(format!(
                "no record named at or before {next}"
            )));
        };
        let live = |seq: u64| {
            let i = self.ranges.partition_point(|&(_, hi)| hi < seq);
            self.ranges.get(i).is_some_and(|&(lo, _)| lo <= seq)
        };
        self.payloads
            .records_from(start, after, self.last_seq, &live, max_bytes)
    }
}

/// A snapshot but its payloads: where they are, to be read as it is
/// written.
struct State {
    /// Version, config, last seq and the message count, encoded.
    head: Vec<u8>,
    /// Each message's seq, time, subject and where its payload is.
    msgs: Vec<(u64, u64, Box<str>, Loc)>,
    /// The Msg-Id window and the consumers, encoded.
    tail: Vec<u8>,
}

impl State {
    /// Writes the snapshot's bytes to `w`, reading each payload with
    /// `read` as it goes and holding about [`SNAPSHOT_WRITE_CHUNK`] bytes
    /// besides one message; how many bytes it wrote.
    fn write_with(
        &self,
        read: &dyn Fn(u64, Loc) -> io::Result<Payload>,
        w: &mut dyn Write,
    ) -> io::Result<u64> {
        let mut out = ChunkWriter {
            w,
            buf: Vec::new(),
            written: 0,
        };
        out.buf.extend_from_slice(&self.head);
        for (seq, time_ms, subject, loc) in &self.msgs {
            let p = read(*seq, *loc)?;
            let b = &mut out.buf;
            put_u64(b, *seq);
            put_u64(b, *time_ms);
            b.push(u8::from(p.binary));
            put_str(b, subject);
            put_opt_str(b, p.headers.as_deref());
            put_bytes(b, &p.data);
            out.spill_if_full()?;
        }
        out.spill()?;
        for piece in self.tail.chunks(SNAPSHOT_WRITE_CHUNK) {
            out.buf.extend_from_slice(piece);
            out.spill()?;
        }
        out.w.flush()?;
        Ok(out.written)
    }
}

/// Collects a snapshot's bytes and hands them to a writer in chunks.
struct ChunkWriter<'w> {
    w: &'w mut dyn Write,
    buf: Vec<u8>,
    written: u64,
}

impl ChunkWriter<'_> {
    fn spill_if_full(&mut self) -> io::Result<()> {
        if self.buf.len() >= SNAPSHOT_WRITE_CHUNK {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> io::Result<()> {
        self.w.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Reads a snapshot's fields from a stream that holds `remaining` more
/// bytes of it; any read past them is "cut short".
struct SnapshotReader<'r> {
    r: &'r mut dyn Read,
    remaining: u64,
}

fn read_failed(e: io::Error) -> Malformed {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Malformed("cut short")
    } else {
        Malformed("snapshot could not be read")
    }
}

impl SnapshotReader<'_> {
    fn fill(&mut self, out: &mut [u8]) -> Result<(), Malformed> {
        if out.len() as u64 > self.remaining {
            return Err(Malformed("cut short"));
        }
        self.r.read_exact(out).map_err(read_failed)?;
        self.remaining -= out.len() as u64;
        Ok(())
    }
    fn u8(&mut self) -> Result<u8, Malformed> {
        let mut a = [0; 1];
        self.fill(&mut a)?;
        Ok(a[0])
    }
    fn bool(&mut self) -> Result<bool, Malformed> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Malformed("flag")),
        }
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        let mut a = [0; 4];
        self.fill(&mut a)?;
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        let mut a = [0; 8];
        self.fill(&mut a)?;
        Ok(u64::from_le_bytes(a))
    }
    /// A u64 list length the remaining bytes can hold at `min_each` bytes
    /// an item.
    fn count(&mut self, min_each: u64) -> Result<usize, Malformed> {
        let n = self.u64()?;
        if n > self.remaining / min_each {
            return Err(Malformed("count beyond the bytes"));
        }
        usize::try_from(n).map_err(|_| Malformed("count beyond the bytes"))
    }
    /// A byte string (u32 length, then the bytes), read as it arrives.
    fn bytes(&mut self) -> Result<Vec<u8>, Malformed> {
        let n = u64::from(self.u32()?);
        if n > self.remaining {
            return Err(Malformed("cut short"));
        }
        let mut out = Vec::with_capacity((n as usize).min(RESERVE_MAX));
        let got = (&mut *self.r)
            .take(n)
            .read_to_end(&mut out)
            .map_err(read_failed)?;
        if got as u64 != n {
            return Err(Malformed("cut short"));
        }
        self.remaining -= n;
        Ok(out)
    }
    fn string(&mut self) -> Result<String, Malformed> {
        String::from_utf8(self.bytes()?).map_err(|_| Malformed("text is not UTF-8"))
    }
    fn opt_string(&mut self) -> Result<Option<String>, Malformed> {
        Ok(if self.bool()? {
            Some(self.string()?)
        } else {
            None
        })
    }
}

fn config_json(cfg: &StreamConfig) -> String {
    serde_json::to_string(cfg).unwrap_or_default()
}

fn consumer_json(cfg: &ConsumerConfig) -> String {
    serde_json::to_string(cfg).unwrap_or_default()
}

// ---- entry encoding ----
//
// An entry: a version byte, then each op as a tag byte and its fields
// (u64 little-endian, strings and byte strings with a u32 length, an
// optional string as a 0/1 byte and the string), to the end. An ack in an
// acks op is a kind byte (0 ack, 1 nak, 2 term, 3 wip, 4 nak with a
// delay, followed by the delay's ms) and the seq; kind 4 came later, so
// entries written before it decode unchanged, as did op 9 (exhausted
// deliveries).

const ENTRY_VERSION: u8 = 1;

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
    }
}

/// The bytes of an entry holding `ops`.
pub fn encode_entry(ops: &[Op]) -> Vec<u8> {
    // Sized for its publishes up front: an entry of a turn's publishes
    // would otherwise grow by doubling, copying itself each time.
    let publishes: usize = ops
        .iter()
        .map(|op| match op {
            Op::Publish(p) => {
                1 + 4
                    + p.subject.len()
                    + 1
                    + p.headers.as_ref().map_or(0, |h| 4 + h.len())
                    + 4
                    + p.data.len()
                    + 1
                    + 8
            }
            _ => 0,
        })
        .sum();
    let mut out = Vec::with_capacity(1 + publishes);
    out.push(ENTRY_VERSION);
    for op in ops {
        match op {
            Op::Publish(p) => {
                out.push(1);
                put_str(&mut out, &p.subject);
                put_opt_str(&mut out, p.headers.as_deref());
                put_bytes(&mut out, &p.data);
                out.push(u8::from(p.binary));
                put_u64(&mut out, p.time_ms);
            }
            Op::Expire { now_ms } => {
                out.push(2);
                put_u64(&mut out, *now_ms);
            }
            Op::Purge { filter } => {
                out.push(3);
                put_opt_str(&mut out, filter.as_deref());
            }
            Op::Remove { seq } => {
                out.push(4);
                put_u64(&mut out, *seq);
            }
            Op::ConsumerCreate { config } => {
                out.push(5);
                put_str(&mut out, config);
            }
            Op::ConsumerDelete { name } => {
                out.push(6);
                put_str(&mut out, name);
            }
            Op::Deliver { consumer, seqs } => {
                out.push(7);
                put_str(&mut out, consumer);
                out.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
                for s in seqs {
                    put_u64(&mut out, *s);
                }
            }
            Op::Acks { consumer, acks } => {
                out.push(8);
                put_str(&mut out, consumer);
                out.extend_from_slice(&(acks.len() as u32).to_le_bytes());
                for (k, s) in acks {
                    match k {
                        AckKind::Ack => out.push(0),
                        AckKind::Nak => out.push(1),
                        AckKind::Term => out.push(2),
                        AckKind::Wip => out.push(3),
                        AckKind::NakDelay(ms) => {
                            out.push(4);
                            put_u64(&mut out, *ms);
                        }
                    }
                    put_u64(&mut out, *s);
                }
            }
            Op::Exhausted { consumer, seqs } => {
                out.push(9);
                put_str(&mut out, consumer);
                out.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
                for s in seqs {
                    put_u64(&mut out, *s);
                }
            }
        }
    }
    out
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).ok_or(Malformed("cut short"))?;
        let s = self.buf.get(self.at..end).ok_or(Malformed("cut short"))?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> Result<bool, Malformed> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Malformed("flag")),
        }
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn count32(&mut self, min_each: usize) -> Result<usize, Malformed> {
        let n = self.u32()? as usize;
        if n > (self.buf.len() - self.at) / min_each {
            return Err(Malformed("count beyond the bytes"));
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, Malformed> {
        Ok(self.slice()?.to_vec())
    }
    fn slice(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, Malformed> {
        String::from_utf8(self.bytes()?).map_err(|_| Malformed("text is not UTF-8"))
    }
    fn opt_string(&mut self) -> Result<Option<String>, Malformed> {
        Ok(if self.bool()? {
            Some(self.string()?)
        } else {
            None
        })
    }
}

/// The ops of an entry's bytes.
pub fn decode_entry(buf: &[u8]) -> Result<Vec<Op>, Malformed> {
    decode_entry_at(buf).map(|(ops, _)| ops)
}

/// The ops of an entry's bytes, and where each op's data is in them: a
/// publish's message data starts there (0 for the other ops).
pub fn decode_entry_at(buf: &[u8]) -> Result<(Vec<Op>, Vec<usize>), Malformed> {
    let mut r = Reader { buf, at: 0 };
    if r.u8()? != ENTRY_VERSION {
        return Err(Malformed("entry version"));
    }
    let mut ops = Vec::new();
    let mut places = Vec::new();
    while r.at < buf.len() {
        let mut place = 0;
        ops.push(match r.u8()? {
            1 => {
                let subject = r.string()?;
                let headers = r.opt_string()?;
                place = r.at + 4;
                Op::Publish(Publish {
                    subject,
                    headers,
                    data: r.bytes()?,
                    binary: r.bool()?,
                    time_ms: r.u64()?,
                })
            }
            2 => Op::Expire { now_ms: r.u64()? },
            3 => Op::Purge {
                filter: r.opt_string()?,
            },
            4 => Op::Remove { seq: r.u64()? },
            5 => Op::ConsumerCreate {
                config: r.string()?,
            },
            6 => Op::ConsumerDelete { name: r.string()? },
            7 => {
                let consumer = r.string()?;
                let n = r.count32(8)?;
                let mut seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    seqs.push(r.u64()?);
                }
                Op::Deliver { consumer, seqs }
            }
            8 => {
                let consumer = r.string()?;
                let n = r.count32(9)?;
                let mut acks = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = match r.u8()? {
                        0 => AckKind::Ack,
                        1 => AckKind::Nak,
                        2 => AckKind::Term,
                        3 => AckKind::Wip,
                        4 => AckKind::NakDelay(r.u64()?),
                        _ => return Err(Malformed("ack kind")),
                    };
                    acks.push((kind, r.u64()?));
                }
                Op::Acks { consumer, acks }
            }
            9 => {
                let consumer = r.string()?;
                let n = r.count32(8)?;
                let mut seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    seqs.push(r.u64()?);
                }
                Op::Exhausted { consumer, seqs }
            }
            _ => return Err(Malformed("op tag")),
        });
        places.push(place);
    }
    Ok((ops, places))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::read_config;
    use crate::stream::store::Options;
    use crate::stream::stream::Stream;

    fn config(v: serde_json::Value) -> StreamConfig {
        let serde_json::Value::Object(m) = v else {
            panic!("object")
        };
        let mut c: StreamConfig = read_config(m).unwrap();
        c.validate().unwrap();
        c
    }

    fn temp_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "gombus-replica-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn publish(subject: &str, data: &str, id: Option<&str>, time_ms: u64) -> Op {
        Op::Publish(Publish {
            subject: subject.into(),
            headers: id.map(|i| format!("{{\"Msg-Id\":\"{i}\"}}")),
            data: data.as_bytes().to_vec(),
            binary: false,
            time_ms,
        })
    }

    fn every_op() -> Vec<Op> {
        vec![
            publish("a.b", "{\"x\":1}", Some("m1"), 5),
            Op::Publish(Publish {
                subject: "a.c".into(),
                headers: None,
                data: vec![0, 159, 255],
                binary: true,
                time_ms: 6,
            }),
            Op::Expire { now_ms: 77 },
            Op::Purge {
                filter: Some("a.*".into()),
            },
            Op::Purge { filter: None },
            Op::Remove { seq: 3 },
            Op::ConsumerCreate {
                config: r#"{"name":"c"}"#.into(),
            },
            Op::ConsumerDelete { name: "c".into() },
            Op::Deliver {
                consumer: "c".into(),
                seqs: vec![1, 2, 9],
            },
            Op::Acks {
                consumer: "c".into(),
                acks: vec![
                    (AckKind::Ack, 1),
                    (AckKind::Nak, 2),
                    (AckKind::Term, 3),
                    (AckKind::Wip, 4),
                    (AckKind::NakDelay(1_500), 5),
                ],
            },
            Op::Exhausted {
                consumer: "c".into(),
                seqs: vec![4, 6],
            },
        ]
    }

    #[test]
    fn entries_round_trip_and_a_cut_op_is_an_error() {
        let ops = every_op();
        let bytes = encode_entry(&ops);
        assert_eq!(decode_entry(&bytes), Ok(ops.clone()));
        // Each op alone, cut anywhere inside it.
        for op in &ops {
            let one = encode_entry(std::slice::from_ref(op));
            for cut in 0..one.len() {
                let r = decode_entry(&one[..cut]);
                if cut == 1 {
                    assert_eq!(r, Ok(vec![]), "{op:?}");
                } else {
                    assert!(r.is_err(), "{op:?} cut at {cut}: {r:?}");
                }
            }
        }
        assert!(decode_entry(&[2]).is_err());
        assert!(decode_entry(&[1, 99]).is_err());
        // A count the bytes cannot hold is refused before allocating.
        let mut huge = vec![1, 7];
        put_str(&mut huge, "c");
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_entry(&huge).is_err());
    }

    /// Runs the same publishes through R1's stream (on disk) and through
    /// the replica, comparing every outcome and the stored messages.
    fn same_as_r1(cfg: serde_json::Value, seed: u64) {
        let kv = cfg.get("max_msgs_per_subject").is_some();
        let cfg = config(cfg);
        let dir = temp_dir();
        let mut r1 = Stream::open(cfg.clone(), &dir, Options::default(), 0).unwrap();
        let mut rep = Replica::new(cfg.clone());
        let mut rng = seed;
        let mut now = 1_000;
        for i in 0..300u64 {
            let z = crate::rand::splitmix64(&mut rng);
            now += z % 7;
            if z.is_multiple_of(23) {
                let a = r1.expire(now).unwrap();
                let b = rep.apply(&[Op::Expire { now_ms: now }], Instant::now());
                assert_eq!(
                    b,
                    vec![Outcome::Removed(Ok(a.len() as u64))],
                    "expire at {i}"
                );
                continue;
            }
            let subject = ["a.b", "a.c", "a.long.subject.name"][(z >> 8) as usize % 3];
            let len = (z >> 16) as usize % 40;
            let data = format!("\"{}\"", "x".repeat(len));
            let id = (z >> 24)
                .is_multiple_of(3)
                .then(|| format!("id{}", (z >> 32) % 20));
            let mut fields = Vec::new();
            if let Some(i) = &id {
                fields.push(format!("\"Msg-Id\":\"{i}\""));
            }
            if kv {
                // Bucket writes: markers, and compare-and-set against the
                // subject's latest seq (right about half the time).
                match (z >> 40) % 5 {
                    0 => fields.push("\"KV-Operation\":\"DEL\"".into()),
                    1 => fields.push("\"KV-Operation\":\"PURGE\"".into()),
                    _ => {}
                }
                if (z >> 44).is_multiple_of(2) {
                    let latest = rep.latest_of(subject).map_or(0, |(s, _)| s);
                    let expected = if (z >> 45).is_multiple_of(2) {
                        latest
                    } else {
                        0
                    };
                    fields.push(format!("\"KV-Expected-Revision\":\"{expected}\""));
                }
            }
            let headers = (!fields.is_empty()).then(|| format!("{{{}}}", fields.join(",")));
            let want = r1.store(subject, data.as_bytes(), false, headers.as_deref(), now);
            let got = rep.apply(
                &[Op::Publish(Publish {
                    subject: subject.into(),
                    headers,
                    data: data.as_bytes().to_vec(),
                    binary: false,
                    time_ms: now,
                })],
                Instant::now(),
            );
            assert_eq!(got, vec![Outcome::Published(want)], "publish {i}");
            for subj in ["a.b", "a.c", "a.long.subject.name"] {
                assert_eq!(r1.seqs_of(subj), rep.seqs_of(subj), "{subj} after {i}");
            }
            assert_eq!(r1.last_per_subject(">"), rep.last_per_subject(">"));
            let st = r1.state();
            assert_eq!(
                (st.messages, st.bytes, st.last_seq),
                (rep.messages(), rep.bytes(), rep.last_seq()),
                "state after publish {i}"
            );
        }
        let seqs: Vec<u64> = rep.iter().map(|(s, _)| s).collect();
        assert_eq!(r1.seqs(), seqs);
        for (seq, _) in rep.iter() {
            let m = rep.get(seq).unwrap().unwrap();
            let theirs = r1.get(seq).unwrap().unwrap();
            assert_eq!(
                (&*theirs.subject, &*theirs.data, theirs.time_ms),
                (&*m.subject, &*m.data, m.time_ms)
            );
        }
        drop(r1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn publishes_follow_r1_rule_for_rule() {
        let cases = [
            serde_json::json!({"name":"S","subjects":["a.>"]}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs":5}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs":5,"discard":"new"}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_bytes":700}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_bytes":700,"discard":"new"}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msg_size":30}),
            serde_json::json!({"name":"S","subjects":["a.>"],"duplicate_window_ms":200}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_age_ms":100,
                               "duplicate_window_ms":50}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs_per_subject":1}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs_per_subject":3,
                               "max_msgs":7}),
            serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs_per_subject":2,
                               "max_bytes":700,"duplicate_window_ms":200}),
        ];
        for (k, c) in cases.into_iter().enumerate() {
            for seed in 0..3 {
                same_as_r1(c.clone(), seed * 31 + k as u64);
            }
        }
    }

    fn deliver(rep: &mut Replica, seqs: &[u64]) -> Vec<(u64, u64)> {
        let op = Op::Deliver {
            consumer: "c".into(),
            seqs: seqs.to_vec(),
        };
        match rep.apply(&[op], Instant::now()).pop() {
            Some(Outcome::Delivered(d)) => d,
            other => panic!("{other:?}"),
        }
    }

    fn ack(rep: &mut Replica, kind: AckKind, seq: u64) -> Result<(), ApiError> {
        let op = Op::Acks {
            consumer: "c".into(),
            acks: vec![(kind, seq)],
        };
        match rep.apply(&[op], Instant::now()).pop() {
            Some(Outcome::Acked(mut v)) => v.pop().unwrap(),
            other => panic!("{other:?}"),
        }
    }

    fn with_messages(cfg: serde_json::Value, n: u64) -> Replica {
        let mut rep = Replica::new(config(cfg));
        let create = Op::ConsumerCreate {
            config: r#"{"name":"c"}"#.into(),
        };
        assert_eq!(
            rep.apply(&[create], Instant::now()),
            vec![Outcome::Consumer(Ok(()))]
        );
        let ops: Vec<Op> = (0..n)
            .map(|i| publish("a.b", &i.to_string(), None, i))
            .collect();
        rep.apply(&ops, Instant::now());
        rep
    }

    #[test]
    fn an_acked_or_termed_message_is_never_delivered_again() {
        let mut rep = with_messages(serde_json::json!({"name":"S","subjects":["a.>"]}), 4);
        let now = Instant::now();
        assert_eq!(rep.next_deliveries("c", 2, now), vec![1, 2]);
        assert_eq!(deliver(&mut rep, &[1, 2]), vec![(1, 1), (2, 1)]);
        assert_eq!(rep.next_deliveries("c", 2, now), vec![3, 4]);
        assert_eq!(ack(&mut rep, AckKind::Ack, 1), Ok(()));
        assert_eq!(ack(&mut rep, AckKind::Term, 2), Ok(()));
        // A stale leader's delivery of them is refused by apply.
        assert_eq!(deliver(&mut rep, &[1, 2]), vec![]);
        // An ack of a sequence never delivered is not_found; again, ok.
        assert_eq!(
            ack(&mut rep, AckKind::Ack, 4).unwrap_err().code,
            Code::NotFound
        );
        assert_eq!(ack(&mut rep, AckKind::Ack, 1), Ok(()));
        // A nak'd one comes again, counted.
        assert_eq!(deliver(&mut rep, &[3]), vec![(3, 1)]);
        assert_eq!(ack(&mut rep, AckKind::Nak, 3), Ok(()));
        assert_eq!(ack(&mut rep, AckKind::Wip, 3), Ok(()));
        assert_eq!(rep.next_deliveries("c", 1, now), vec![3]);
        assert_eq!(deliver(&mut rep, &[3]), vec![(3, 2)]);
        // Limits retention keeps acked messages.
        assert_eq!(rep.messages(), 4);
    }

    #[test]
    fn a_nak_delay_is_carried_by_the_entry_and_kept_by_every_replica() {
        let cfg = serde_json::json!({"name":"S","subjects":["a.>"]});
        let mut a = with_messages(cfg.clone(), 2);
        let mut b = with_messages(cfg, 2);
        let now = Instant::now();
        let ops = vec![
            Op::Deliver {
                consumer: "c".into(),
                seqs: vec![1, 2],
            },
            Op::Acks {
                consumer: "c".into(),
                acks: vec![(AckKind::NakDelay(60_000), 1), (AckKind::Nak, 2)],
            },
        ];
        // Through the bytes, as a follower gets it.
        let bytes = encode_entry(&ops);
        assert_eq!(bytes[bytes.len() - 9 - 17], 4, "kind 4 then the delay");
        let decoded = decode_entry(&bytes).unwrap();
        assert_eq!(decoded, ops);
        for rep in [&mut a, &mut b] {
            rep.apply(&decoded, now);
            // The delayed one is not due; the plain nak is.
            assert_eq!(rep.next_deliveries("c", 5, now), vec![2]);
            assert_eq!(
                rep.next_deliveries("c", 5, now + Duration::from_millis(59_000)),
                vec![2]
            );
            let mut due = rep.next_deliveries("c", 5, now + Duration::from_millis(60_000));
            due.sort_unstable();
            assert_eq!(due, vec![1, 2]);
        }
        // An entry written before kind 4 existed still decodes.
        let old = [
            vec![1u8, 8, 1, 0, 0, 0, b'c', 1, 0, 0, 0, 1],
            1u64.to_le_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(
            decode_entry(&old),
            Ok(vec![Op::Acks {
                consumer: "c".into(),
                acks: vec![(AckKind::Nak, 1)]
            }])
        );
        // A delay past the bound is held to it, not overflowed.
        let mut c = with_messages(serde_json::json!({"name":"S","subjects":["a.>"]}), 1);
        deliver(&mut c, &[1]);
        assert_eq!(ack(&mut c, AckKind::NakDelay(u64::MAX), 1), Ok(()));
        let day = Duration::from_millis(NAK_DELAY_MS_MAX);
        assert!(c.next_deliveries("c", 1, Instant::now() + day).contains(&1));
    }

    #[test]
    fn work_queue_and_interest_retention_drop_what_is_done_with() {
        let mut wq = with_messages(
            serde_json::json!({"name":"S","subjects":["a.>"],"retention":"workqueue"}),
            3,
        );
        deliver(&mut wq, &[1, 2]);
        ack(&mut wq, AckKind::Ack, 1).unwrap();
        assert_eq!(wq.iter().map(|(s, _)| s).collect::<Vec<_>>(), vec![2, 3]);
        let mut interest = Replica::new(config(
            serde_json::json!({"name":"S","subjects":["a.>"],"retention":"interest"}),
        ));
        let out = interest.apply(&[publish("a.b", "1", None, 0)], Instant::now());
        assert_eq!(
            out,
            vec![Outcome::Published(Ok(Stored::New {
                seq: 1,
                removed: vec![1]
            }))]
        );
    }

    #[test]
    fn a_snapshot_restores_the_same_state_and_apply_goes_on_alike() {
        let cfg = serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs":50,
                                     "duplicate_window_ms":100000});
        let mut a = with_messages(cfg, 30);
        deliver(&mut a, &[1, 2, 3, 4]);
        ack(&mut a, AckKind::Ack, 2).unwrap();
        a.apply(&[publish("a.c", "\"x\"", Some("k"), 40)], Instant::now());
        let snap = a.snapshot().unwrap();
        let mut b = Replica::restore(&snap, Instant::now()).unwrap();
        assert_eq!(b.snapshot().unwrap(), snap);
        assert_eq!((b.bytes(), b.messages()), (a.bytes(), a.messages()));
        // The per-subject index is rebuilt, not carried.
        assert_eq!(b.subjects, a.subjects);
        assert!(!a.subjects.is_empty());
        let more = vec![
            publish("a.c", "\"x\"", Some("k"), 41),
            publish("a.b", "\"y\"", None, 42),
            Op::Deliver {
                consumer: "c".into(),
                seqs: vec![1, 2, 5],
            },
            Op::Acks {
                consumer: "c".into(),
                acks: vec![(AckKind::Ack, 1), (AckKind::Ack, 5)],
            },
        ];
        let now = Instant::now();
        assert_eq!(a.apply(&more, now), b.apply(&more, now));
        assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
        // Cut or padded snapshots are refused.
        for cut in [0, 1, snap.len() / 2, snap.len() - 1] {
            assert!(Replica::restore(&snap[..cut], now).is_err(), "cut at {cut}");
        }
        let mut padded = snap.clone();
        padded.push(0);
        assert!(Replica::restore(&padded, now).is_err());
    }

    fn dir_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |d| d.count())
    }

    /// Dead files are deleted once a snapshot is stored: what the Raft
    /// thread does after storing a frozen state's snapshot.
    fn compact(r: &mut Replica) -> Frozen {
        let mut f = r.freeze().unwrap();
        f.sync().unwrap();
        let _ = crate::storage::delete_files(&f.take_dead());
        f
    }

    /// An applied entry's messages stay in the replica's buffer, read from
    /// there, until [`Replica::flush`] writes them to the segment file (the
    /// broker does once the turn's answers are out); `apply` does both.
    #[test]
    fn applied_messages_reach_their_file_with_the_flush_and_read_back_before() {
        let now = Instant::now();
        let dir = temp_dir();
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"]}));
        let mut r = Replica::with_payloads(cfg, Payloads::open(&dir, 1 << 20).unwrap());
        let on_disk = |dir: &std::path::Path| -> u64 {
            (std::fs::read_dir(dir).unwrap().flatten())
                .map(|e| e.metadata().unwrap().len())
                .sum()
        };
        r.apply(&[publish("a.b", "\"one\"", None, 1)], now);
        let after_one = on_disk(&dir);
        assert!(after_one > 0);
        r.apply_at(&[publish("a.b", "\"two\"", None, 2)], &[], None, now);
        assert_eq!(on_disk(&dir), after_one, "written before the flush");
        assert_eq!(&*r.get(2).unwrap().unwrap().data, b"\"two\"");
        r.flush();
        assert!(on_disk(&dir) > after_one, "not written by the flush");
        assert_eq!(&*r.get(2).unwrap().unwrap().data, b"\"two\"");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A frozen state names only every MARK_EVERY-th record and reads the
    /// rest from its files: whatever the batch size and wherever a member
    /// stands, it serves exactly the records of the live messages after
    /// that point, across files, holes wider than a mark's step, and a
    /// record larger than one read.
    #[test]
    fn a_frozen_state_serves_every_live_record_from_its_files() {
        let now = Instant::now();
        let dir = temp_dir();
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"]}));
        let mut r = Replica::with_payloads(cfg, Payloads::open(&dir, 16_384).unwrap());
        let big = format!(
            "\"{}\"",
            "b".repeat(super::super::payloads::SCAN_CHUNK + 1000)
        );
        for i in 0..3_000u64 {
            let data = if i == 1_800 {
                big.clone()
            } else {
                format!("\"{}\"", "z".repeat(20 + (i as usize * 7) % 90))
            };
            r.apply(&[publish("a.b", &data, None, i)], now);
        }
        let removes: Vec<Op> = (700..=1_500)
            .chain((1..3_000).step_by(13))
            .chain([1, 3_000])
            .map(|seq| Op::Remove { seq })
            .collect();
        r.apply(&removes, now);
        let want: Vec<(u64, Vec<u8>)> = (r.msgs.iter())
            .map(|(&s, m)| (s, r.payloads.record(s, m.loc).unwrap()))
            .collect();
        assert!(want.len() > 2_000, "{}", want.len());
        let frozen = compact(&mut r);
        assert!(
            frozen.marks.len() < want.len() / 100,
            "{}",
            frozen.marks.len()
        );
        // Messages after the freeze are not served.
        r.apply(&[publish("a.b", "\"later\"", None, 9_000)], now);
        for max in [1, 5_000, 1 << 20] {
            for start in [0, 1, 2, 699, 700, 1_501, 1_799, 1_800, 2_500, 2_999] {
                let mut after = start;
                let mut got = Vec::new();
                loop {
                    let (recs, through) = frozen.records_after(after, max).unwrap();
                    got.extend_from_slice(&recs);
                    assert!(through > after || through == 3_000, "{after} -> {through}");
                    after = through;
                    if recs.is_empty() || after >= 3_000 {
                        break;
                    }
                }
                let expected: Vec<u8> = (want.iter())
                    .filter(|(s, _)| *s > start)
                    .flat_map(|(_, rec)| rec.iter().copied())
                    .collect();
                assert!(got == expected, "from {start} in batches of {max}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A frozen state's snapshot is small (no payloads), and the frozen
    /// state serves the records of its moment to a member catching up,
    /// even once the replica purged them and their files were deleted.
    #[test]
    fn a_frozen_state_serves_its_moment_after_the_files_go() {
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs":20}));
        let dir = temp_dir();
        let mut disk = Replica::with_payloads(cfg, Payloads::open(&dir, 4_096).unwrap());
        let now = Instant::now();
        let publish_n = |r: &mut Replica, from: u64, n: u64| {
            for i in from..from + n {
                let data = format!("\"{}\"", "z".repeat(150 + (i as usize % 40)));
                r.apply(&[publish("a.b", &data, None, i)], now);
            }
        };
        publish_n(&mut disk, 0, 60);
        let then: Vec<StoredMsg> = (41..=60).map(|s| disk.get(s).unwrap().unwrap()).collect();
        let frozen = compact(&mut disk);
        let mut small = Vec::new();
        let n = frozen.write_to(&mut small).unwrap();
        assert_eq!(n, small.len() as u64);
        assert!(small.len() < 600, "{} bytes", small.len());
        publish_n(&mut disk, 60, 100);
        disk.apply(&[Op::Purge { filter: None }], now);
        drop(compact(&mut disk));
        assert_eq!(
            dir_files(&dir),
            0,
            "every file of the frozen moment is gone"
        );
        // A member with no files takes the snapshot and fetches it all.
        let dir2 = temp_dir();
        let (mut member, target) =
            Replica::restore_files(&mut &small[..], n, now, &dir2, 4_096, None).unwrap();
        assert_eq!((member.messages(), target.count), (0, 20));
        assert!(!member.is_whole(&target));
        let mut after = 0;
        loop {
            let (recs, through) = frozen.records_after(after, 1_000).unwrap();
            assert!(!recs.is_empty());
            member.take_records(&recs, &target).unwrap();
            after = through;
            if !target.wants_after(after) {
                break;
            }
        }
        assert_eq!(after, 60);
        assert!(member.is_whole(&target));
        let got: Vec<StoredMsg> = (41..=60).map(|s| member.get(s).unwrap().unwrap()).collect();
        assert_eq!(got, then);
        // Records it does not want are refused.
        let (recs, _) = frozen.records_after(0, 1).unwrap();
        assert!(member.take_records(&recs, &target).is_err());
    }

    #[test]
    fn payloads_on_disk_give_the_same_outcomes_and_follow_the_limits() {
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"],"max_msgs":20}));
        let dir = temp_dir();
        let mut mem = Replica::new(cfg.clone());
        let mut disk = Replica::with_payloads(cfg, Payloads::open(&dir, 4_096).unwrap());
        let now = Instant::now();
        for i in 0..200u64 {
            let data = format!("\"{}\"", "y".repeat(200 + (i as usize % 50)));
            let op = [publish(["a.b", "a.c"][i as usize % 2], &data, None, i)];
            assert_eq!(mem.apply(&op, now), disk.apply(&op, now), "publish {i}");
        }
        assert_eq!(mem.snapshot().unwrap(), disk.snapshot().unwrap());
        assert_eq!(mem.small_state(), disk.small_state(), "the same digest");
        for (seq, _) in mem.iter() {
            assert_eq!(
                mem.get(seq).unwrap(),
                disk.get(seq).unwrap(),
                "message {seq}"
            );
        }
        assert_eq!(disk.get(1).unwrap(), None);
        // 20 messages of about 300 bytes: at most three 4 KiB files left
        // once a snapshot is stored.
        drop(compact(&mut disk));
        assert!(disk.payloads().files() <= 3, "{}", disk.payloads().files());
        assert_eq!(dir_files(&dir), disk.payloads().files());
        // Rebuilt from a full snapshot into a directory of its own.
        let dir2 = temp_dir();
        let snap = disk.snapshot().unwrap();
        let again =
            Replica::restore_with(&snap, now, Payloads::open(&dir2, 4_096).unwrap()).unwrap();
        assert_eq!(again.snapshot().unwrap(), snap);
        assert_eq!(dir_files(&dir2), again.payloads().files());
        for (seq, _) in mem.iter() {
            assert_eq!(
                mem.get(seq).unwrap(),
                again.get(seq).unwrap(),
                "message {seq}"
            );
        }
        // A purge takes every file with it.
        let purge = [Op::Purge { filter: None }];
        assert_eq!(mem.apply(&purge, now), disk.apply(&purge, now));
        drop(compact(&mut disk));
        assert_eq!((disk.payloads().files(), dir_files(&dir)), (0, 0));
        disk.destroy();
        again.destroy();
        assert!(!dir.exists() && !dir2.exists());
    }

    #[test]
    fn acks_of_a_work_queue_on_disk_delete_its_files() {
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"],
                                            "retention":"workqueue"}));
        let dir = temp_dir();
        let mut rep = Replica::with_payloads(cfg, Payloads::open(&dir, 2_048).unwrap());
        let now = Instant::now();
        let create = Op::ConsumerCreate {
            config: r#"{"name":"c"}"#.into(),
        };
        rep.apply(&[create], now);
        let data = format!("\"{}\"", "z".repeat(500));
        let ops: Vec<Op> = (0..30).map(|i| publish("a.b", &data, None, i)).collect();
        rep.apply(&ops, now);
        let files = dir_files(&dir);
        assert!(files >= 8, "{files}");
        let seqs: Vec<u64> = (1..=30).collect();
        assert_eq!(deliver(&mut rep, &seqs).len(), 30);
        for s in 1..=29 {
            ack(&mut rep, AckKind::Ack, s).unwrap();
        }
        // One file holds the last message; every other one goes once a
        // snapshot is stored.
        assert_eq!(dir_files(&dir), files);
        drop(compact(&mut rep));
        assert_eq!((rep.messages(), dir_files(&dir)), (1, 1));
        let m = rep.get(30).unwrap().unwrap();
        assert_eq!(&*m.data, data.as_bytes());
        ack(&mut rep, AckKind::Ack, 30).unwrap();
        drop(compact(&mut rep));
        assert_eq!((rep.messages(), dir_files(&dir)), (0, 0));
    }

    #[test]
    fn a_delivery_out_of_max_deliver_is_finished_by_its_entry() {
        let cfg = serde_json::json!({"name":"S","subjects":["a.>"],"retention":"workqueue"});
        let mut rep = Replica::new(config(cfg));
        let t0 = Instant::now();
        let create = Op::ConsumerCreate {
            config: r#"{"name":"c","ack_wait_ms":100,"max_deliver":2}"#.into(),
        };
        rep.apply(&[create], t0);
        let ops: Vec<Op> = (0..3).map(|i| publish("a.b", "1", None, i)).collect();
        rep.apply(&ops, t0);
        assert_eq!(deliver(&mut rep, &[1, 2, 3]), vec![(1, 1), (2, 1), (3, 1)]);
        let later = t0 + Duration::from_millis(150);
        // Once: ack_wait ran out, but deliveries are left.
        assert!(rep.exhausted_deliveries("c", later).is_empty());
        assert_eq!(deliver(&mut rep, &[1, 2]), vec![(1, 2), (2, 2)]);
        ack(&mut rep, AckKind::Ack, 3).unwrap();
        // Not due yet, then due for 1 and 2.
        assert!(rep.exhausted_deliveries("c", t0).is_empty());
        let mut due = rep.exhausted_deliveries("c", Instant::now() + Duration::from_millis(150));
        due.sort_unstable();
        assert_eq!(due, vec![1, 2]);
        // An ack that applies first wins; the other one is finished, and
        // a work queue drops it, as R1 does.
        ack(&mut rep, AckKind::Ack, 2).unwrap();
        let op = Op::Exhausted {
            consumer: "c".into(),
            seqs: vec![1, 2, 9],
        };
        let bytes = encode_entry(std::slice::from_ref(&op));
        let out = rep.apply(&decode_entry(&bytes).unwrap(), Instant::now());
        assert_eq!(out, vec![Outcome::Finished(vec![1])]);
        let c = rep.consumer("c").unwrap();
        assert_eq!(c.num_ack_pending(), 0);
        assert_eq!(rep.messages(), 0);
        // Without max_deliver nothing is ever exhausted.
        let mut free = with_messages(serde_json::json!({"name":"S","subjects":["a.>"]}), 1);
        deliver(&mut free, &[1]);
        let far = Instant::now() + Duration::from_secs(3_600);
        assert!(free.exhausted_deliveries("c", far).is_empty());
        let op = Op::Exhausted {
            consumer: "c".into(),
            seqs: vec![1],
        };
        assert_eq!(free.apply(&[op], far), vec![Outcome::Finished(vec![])]);
    }

    /// Hands out at most `step` bytes a call, and an `Interrupted` error
    /// every fourth call (which `read_exact` and `read_to_end` retry); an
    /// `fail_at` offset turns into a hard error there.
    struct Dribble<'a> {
        data: &'a [u8],
        at: usize,
        step: usize,
        calls: u64,
        fail_at: Option<usize>,
    }

    impl<'a> Dribble<'a> {
        fn new(data: &'a [u8], step: usize) -> Dribble<'a> {
            Dribble {
                data,
                at: 0,
                step,
                calls: 0,
                fail_at: None,
            }
        }
    }

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(4) {
                return Err(io::ErrorKind::Interrupted.into());
            }
            if self.fail_at.is_some_and(|f| self.at >= f) {
                return Err(io::Error::other("device gone"));
            }
            let n = buf.len().min(self.step).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Records the size of every write it takes.
    #[derive(Default)]
    struct Writes {
        bytes: Vec<u8>,
        sizes: Vec<usize>,
    }

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.bytes.extend_from_slice(buf);
            self.sizes.push(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A replica with `n` messages of about 1 KiB (text and binary, some
    /// with a `Msg-Id`), two consumers with pending deliveries (one nak'd,
    /// one redelivered) and an ack behind them.
    fn rich_replica(payloads: Payloads, n: u64) -> Replica {
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"],
                                            "duplicate_window_ms":1_000_000}));
        let mut rep = Replica::with_payloads(cfg, payloads);
        let now = Instant::now();
        for c in [r#"{"name":"c"}"#, r#"{"name":"d","filter_subject":"a.c"}"#] {
            let op = Op::ConsumerCreate { config: c.into() };
            assert_eq!(rep.apply(&[op], now), vec![Outcome::Consumer(Ok(()))]);
        }
        let ops: Vec<Op> = (0..n)
            .map(|i| {
                if i % 3 == 2 {
                    Op::Publish(Publish {
                        subject: "a.c".into(),
                        headers: None,
                        data: (0..1_000 + i as usize)
                            .map(|k| (k * 7 + i as usize) as u8)
                            .collect(),
                        binary: true,
                        time_ms: i,
                    })
                } else {
                    let data = format!("\"{}\"", "v".repeat(900 + i as usize));
                    let id = (i % 2 == 0).then(|| format!("id{i}"));
                    publish("a.b", &data, id.as_deref(), i)
                }
            })
            .collect();
        rep.apply(&ops, now);
        let ops = [
            Op::Deliver {
                consumer: "c".into(),
                seqs: vec![1, 2, 3, 4],
            },
            Op::Deliver {
                consumer: "d".into(),
                seqs: vec![3, 6],
            },
            Op::Acks {
                consumer: "c".into(),
                acks: vec![(AckKind::Ack, 2), (AckKind::Nak, 3)],
            },
            Op::Deliver {
                consumer: "c".into(),
                seqs: vec![3],
            },
        ];
        rep.apply(&ops, now);
        assert_eq!(rep.consumer("c").unwrap().num_ack_pending(), 3);
        assert_eq!(rep.consumer("d").unwrap().num_ack_pending(), 2);
        rep
    }

    #[test]
    fn a_snapshot_keeps_its_byte_format() {
        let cfg = config(serde_json::json!({"name":"S","subjects":["a.>"],
                                            "duplicate_window_ms":1000}));
        let mut rep = Replica::new(cfg.clone());
        let now = Instant::now();
        let create = Op::ConsumerCreate {
            config: r#"{"name":"c"}"#.into(),
        };
        rep.apply(&[create], now);
        rep.apply(&[publish("a.b", "1", Some("k"), 5)], now);
        assert_eq!(deliver(&mut rep, &[1]), vec![(1, 1)]);
        let ccfg = rep.consumer("c").unwrap().cfg.clone();
        let mut want = vec![1u8];
        put_str(&mut want, &config_json(&cfg));
        for v in [1u64, 1, 1, 5] {
            put_u64(&mut want, v); // last seq, one message: seq, time
        }
        want.push(0);
        put_str(&mut want, "a.b");
        put_opt_str(&mut want, Some(r#"{"Msg-Id":"k"}"#));
        put_bytes(&mut want, b"1");
        for v in [1u64, 5, 1] {
            put_u64(&mut want, v); // one id: time, seq
        }
        put_str(&mut want, "k");
        put_u64(&mut want, 1);
        put_str(&mut want, &consumer_json(&ccfg));
        for v in [0u64, 2, 1, 1, 1, 1] {
            put_u64(&mut want, v); // since, next, cseq, one pending (seq, count)
        }
        let mut w = Vec::new();
        assert_eq!(rep.snapshot_to(&mut w).unwrap(), want.len() as u64);
        assert_eq!(w, want);
        assert_eq!(rep.snapshot().unwrap(), want);
    }

    #[test]
    fn snapshot_to_writes_the_snapshot_in_chunks() {
        let rep = rich_replica(Payloads::memory(), 250);
        let snap = rep.snapshot().unwrap();
        let mut w = Writes::default();
        assert_eq!(rep.snapshot_to(&mut w).unwrap(), snap.len() as u64);
        assert_eq!(w.bytes, snap);
        // About 250 KiB in writes of one chunk and at most one message
        // over it: never the whole snapshot at once.
        assert!(snap.len() > 3 * SNAPSHOT_WRITE_CHUNK, "{}", snap.len());
        assert!(w.sizes.len() >= 3, "{:?}", w.sizes);
        let biggest = *w.sizes.iter().max().unwrap();
        assert!(biggest < SNAPSHOT_WRITE_CHUNK + 2_000, "{biggest}");
        // An empty replica too.
        let empty = Replica::new(rep.config().clone());
        let mut w = Vec::new();
        let n = empty.snapshot_to(&mut w).unwrap();
        assert_eq!(w, empty.snapshot().unwrap());
        assert_eq!(n, w.len() as u64);
    }

    #[test]
    fn restore_from_reads_a_snapshot_handed_out_in_small_pieces() {
        let rep = rich_replica(Payloads::memory(), 60);
        let snap = rep.snapshot().unwrap();
        let now = Instant::now();
        for step in [1, 7, 4_096] {
            let mut r = Dribble::new(&snap, step);
            let again =
                Replica::restore_from(&mut r, snap.len() as u64, now, Payloads::memory()).unwrap();
            assert_eq!(r.at, snap.len(), "step {step}");
            assert_eq!(again.snapshot().unwrap(), snap, "step {step}");
            assert_eq!(
                (again.bytes(), again.messages(), again.last_seq()),
                (rep.bytes(), rep.messages(), rep.last_seq())
            );
            for (seq, _) in rep.iter() {
                assert_eq!(rep.get(seq).unwrap(), again.get(seq).unwrap(), "{seq}");
            }
        }
        // The wrapper over a slice is the same path.
        let again = Replica::restore_with(&snap, now, Payloads::memory()).unwrap();
        assert_eq!(again.snapshot().unwrap(), snap);
    }

    #[test]
    fn restore_from_refuses_a_short_reader_a_wrong_len_and_a_failed_read() {
        let rep = rich_replica(Payloads::memory(), 7);
        let snap = rep.snapshot().unwrap();
        let len = snap.len() as u64;
        let now = Instant::now();
        let restore = |r: &mut dyn Read, len: u64| {
            Replica::restore_from(r, len, now, Payloads::memory()).map(|_| ())
        };
        for cut in 0..snap.len() {
            // The reader ends before the len it was given.
            let mut r = Dribble::new(&snap[..cut], 7);
            assert_eq!(
                restore(&mut r, len),
                Err(Malformed("cut short")),
                "cut at {cut}"
            );
            // The len ends before the snapshot does.
            let mut r = Dribble::new(&snap, 7);
            assert!(restore(&mut r, cut as u64).is_err(), "len {cut}");
        }
        // A len past the snapshot: it parses, then the bytes are left over.
        for extra in [1, 1_000, u64::MAX - len] {
            let mut r = Dribble::new(&snap, 7);
            assert_eq!(
                restore(&mut r, len + extra),
                Err(Malformed("bytes after the snapshot"))
            );
        }
        // A failing reader, wherever it fails.
        for at in [0, 1, snap.len() / 2, snap.len() - 1] {
            let mut r = Dribble::new(&snap, 7);
            r.fail_at = Some(at);
            assert_eq!(
                restore(&mut r, len),
                Err(Malformed("snapshot could not be read")),
                "fail at {at}"
            );
        }
        // A message count the len cannot hold is refused up front.
        let head = |count: u64| {
            let mut b = vec![SNAPSHOT_VERSION];
            put_str(&mut b, &config_json(rep.config()));
            put_u64(&mut b, 10);
            put_u64(&mut b, count);
            b
        };
        let lie = head(1_000);
        assert_eq!(
            restore(&mut &lie[..], lie.len() as u64 + 26 * 999),
            Err(Malformed("count beyond the bytes"))
        );
        // A payload length far past what the reader holds, under a len
        // that allows it, is cut short once the reader ends.
        let mut lie = head(1);
        put_u64(&mut lie, 1);
        put_u64(&mut lie, 0);
        lie.push(0);
        put_str(&mut lie, "a.b");
        lie.push(0);
        lie.extend_from_slice(&u32::MAX.to_le_bytes());
        lie.extend_from_slice(b"only this");
        assert_eq!(
            restore(&mut &lie[..], u64::MAX),
            Err(Malformed("cut short"))
        );
    }

    #[test]
    fn a_snapshot_of_payloads_on_disk_streams_through_a_file_into_a_fresh_directory() {
        let dir = temp_dir();
        let disk = rich_replica(Payloads::open(&dir, 16_384).unwrap(), 90);
        assert!(disk.payloads().files() > 3, "{}", disk.payloads().files());
        let snap = disk.snapshot().unwrap();
        let file_dir = temp_dir();
        std::fs::create_dir_all(&file_dir).unwrap();
        let path = file_dir.join("snapshot");
        let mut f = std::fs::File::create(&path).unwrap();
        let n = disk.snapshot_to(&mut f).unwrap();
        drop(f);
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        assert_eq!(std::fs::read(&path).unwrap(), snap);
        let dir2 = temp_dir();
        let mut f = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        let again = Replica::restore_from(
            &mut f,
            n,
            Instant::now(),
            Payloads::open(&dir2, 16_384).unwrap(),
        )
        .unwrap();
        assert_eq!(again.payloads().dir(), Some(dir2.as_path()));
        assert_eq!(dir_files(&dir2), again.payloads().files());
        assert!(again.payloads().files() > 3);
        assert_eq!(again.snapshot().unwrap(), snap);
        for (seq, _) in disk.iter() {
            let want = disk.get(seq).unwrap().unwrap();
            assert_eq!(again.get(seq).unwrap(), Some(want), "message {seq}");
        }
        disk.destroy();
        again.destroy();
        std::fs::remove_dir_all(&file_dir).unwrap();
        assert!(!dir.exists() && !dir2.exists());
    }

    /// A member restarted keeps its files: its small snapshot and the
    /// files give back the replica of the snapshot's moment (what came
    /// after it is cut, to be applied again from the log), with nothing
    /// rewritten, and applying the same entries again gives the same
    /// outcomes.
    #[test]
    fn a_restart_keeps_the_files_and_cuts_what_came_after_the_snapshot() {
        let dir = temp_dir();
        let mut disk = rich_replica(Payloads::open(&dir, 16_384).unwrap(), 90);
        let now = Instant::now();
        let frozen = compact(&mut disk);
        let mut small = Vec::new();
        frozen.write_to(&mut small).unwrap();
        let at_snapshot = disk.small_state();
        let files_then = dir_files(&dir);
        let later: Vec<Op> = (0..40)
            .map(|i| publish("a.b", &format!("\"later {i}\""), None, 1_000 + i))
            .chain([Op::Remove { seq: 5 }])
            .collect();
        let outcomes = disk.apply(&later, now);
        let state_after = disk.small_state();
        let subjects_after = disk.subjects.clone();
        drop(disk);
        let modified = |d: &std::path::Path| -> Vec<std::time::SystemTime> {
            let mut v: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
                .collect();
            v.sort();
            v
        };
        let (mut again, target) =
            Replica::restore_files(&mut &small[..], small.len() as u64, now, &dir, 16_384, None)
                .unwrap();
        assert!(again.is_whole(&target));
        assert_eq!(again.small_state(), at_snapshot);
        assert_eq!(dir_files(&dir), files_then);
        let before = modified(&dir);
        assert_eq!(again.apply(&later, now), outcomes);
        assert_eq!(again.small_state(), state_after);
        assert_eq!(again.subjects, subjects_after);
        let after = modified(&dir);
        assert_eq!(
            after[..before.len() - 1],
            before[..before.len() - 1],
            "kept files untouched"
        );
    }

    /// A member with a damaged file, or one that fell behind, rebases on
    /// the leader's snapshot and fetches only what it lacks from the
    /// leader's frozen state: the two hold the same messages after.
    #[test]
    fn a_member_behind_or_damaged_fetches_what_it_lacks() {
        let now = Instant::now();
        let (dir_a, dir_b) = (temp_dir(), temp_dir());
        let mut a = rich_replica(Payloads::open(&dir_a, 16_384).unwrap(), 90);
        let mut b = rich_replica(Payloads::open(&dir_b, 16_384).unwrap(), 30);
        let more: Vec<Op> = (0..60)
            .map(|i| publish("a.b", &format!("\"more {i}\""), None, 2_000 + i))
            .chain([Op::Remove { seq: 3 }, Op::Remove { seq: 95 }])
            .collect();
        a.apply(&more, now);
        let frozen = compact(&mut a);
        let mut small = Vec::new();
        frozen.write_to(&mut small).unwrap();
        let fetch = |r: &mut Replica, target: &Target| -> u64 {
            let mut fetched = 0;
            while target.wants_after(r.held_through()) {
                let (recs, _) = frozen.records_after(r.held_through(), 8_192).unwrap();
                fetched += recs.len() as u64;
                r.take_records(&recs, target).unwrap();
            }
            fetched
        };
        // Behind: it keeps what it has and fetches the rest.
        let target = b.rebase(&mut &small[..], small.len() as u64, now).unwrap();
        let held = b.messages();
        assert!(held >= 29, "{held}");
        let fetched = fetch(&mut b, &target);
        assert!(b.is_whole(&target));
        assert_eq!(b.small_state(), a.small_state());
        let lacked: u64 = a
            .iter()
            .filter(|(s, _)| *s > 30)
            .map(|(_, m)| m.bytes)
            .sum();
        assert_eq!(fetched, lacked, "only what it lacked");
        // Damaged: one bit of a sealed file flipped while it was down.
        let target_b = b.target();
        let small_b = compact(&mut b);
        let mut small_b_bytes = Vec::new();
        small_b.write_to(&mut small_b_bytes).unwrap();
        drop(b);
        let mut names: Vec<_> = std::fs::read_dir(&dir_b)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        let mut bytes = std::fs::read(&names[1]).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        std::fs::write(&names[1], &bytes).unwrap();
        let (mut b, target) = Replica::restore_files(
            &mut &small_b_bytes[..],
            small_b_bytes.len() as u64,
            now,
            &dir_b,
            16_384,
            None,
        )
        .unwrap();
        assert_eq!(target, target_b);
        assert!(!b.is_whole(&target));
        assert!(b.messages() < target.count);
        fetch(&mut b, &target);
        assert!(b.is_whole(&target));
        assert_eq!(b.small_state(), a.small_state());
        for (seq, _) in a.iter() {
            assert_eq!(b.get(seq).unwrap(), a.get(seq).unwrap(), "message {seq}");
        }
    }
}
