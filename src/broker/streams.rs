//! The broker's streams: the set of streams under `<data>/streams/`, the
//! stream and consumer events of the contract (section 5), captured
//! publishes, pull fetches that wait, push delivery to `deliver_subject`,
//! and acks held until the write (and, under `-sync=always`, the fsync)
//! that makes them true.
//!
//! Writes are batched per loop turn: events of one turn queue records,
//! [`Streams::tick`] writes every touched file once and only then lets
//! the turn's acks go (at once after write(2), or when the fsync round
//! covering them reports through the loop's waker, [`Streams::woken`]:
//! under `-sync=always` that event is the only one that releases them).
//!
//! Bounds: [`STREAMS_MAX`] streams, [`CONSUMERS_PER_STREAM_MAX`] consumers
//! per stream, [`WAITS_PER_CONN_MAX`] waiting fetches per connection,
//! `batch` up to [`FETCH_BATCH_MAX`] messages and about
//! [`FETCH_BYTES_MAX`] bytes per fetch answer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::events::StreamOp;
use super::stream_out::{
    consumer_json, fetch_body, message_body, push_slot, push_str, send_ack, stream_json, take_batch,
};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code, OK_BODY};
use crate::protocol::socketio::{self, PacketType};
use crate::protocol::stream_messages::{
    self as sm, AckReq, ConsumerConfig, ConsumerCreate, ConsumerReq, DeliverPolicy, FetchReq,
    GetReq, NameReq, PurgeReq, Retention, StreamConfig, StreamReq,
};
use crate::routing::sublist::Sublist;
use crate::routing::subs::SubTable;
use crate::storage::sync::{FileKey, SyncPolicy, Syncer, Ticket};
use crate::stream::consumer::{Consumer, Event};
use crate::stream::meta::{ConsumerSnap, MetaLog, Snapshot};
use crate::stream::store::Options;
use crate::stream::stream::{Member, State, Stored, Stream, CONSUMERS_PER_STREAM_MAX};

pub use crate::protocol::stream_messages::FETCH_BATCH_MAX;

/// Most streams one broker holds.
pub const STREAMS_MAX: usize = 1_000;
/// Most fetches one connection may have waiting.
pub const WAITS_PER_CONN_MAX: usize = 64;
/// A fetch answer stops adding messages past this many bytes.
pub const FETCH_BYTES_MAX: usize = 8 << 20;
/// Push deliveries per consumer per loop turn (fairness between them).
pub const PUSH_PER_TURN_MAX: usize = 256;
/// Acks waiting for their write or fsync, over all sockets; past it,
/// captured publishes are refused with `limit` until the disk catches up.
pub const HELD_ACKS_MAX: usize = 1_000_000;

/// An ack to send once what it confirms is written (and synced).
#[derive(Debug)]
struct Held {
    conn: ConnId,
    ack_id: u64,
    stream: Rc<str>,
    reply: AckBody,
}

impl Held {
    /// An empty value to move a real one out of a queue with.
    fn placeholder() -> Held {
        Held {
            conn: 0,
            ack_id: 0,
            stream: Rc::from(""),
            reply: AckBody::Ok,
        }
    }
}

#[derive(Debug)]
enum AckBody {
    /// `{ok, stream, seq, duplicate?}` for a captured publish.
    Stored { seq: u64, duplicate: bool },
    /// `{ok:true}`.
    Ok,
    /// Any other body, ready.
    Body(String),
}

/// One stream as the dashboard and `/metrics` show it: a read-only copy
/// of its name, subjects and state, and of each consumer's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    pub name: String,
    pub subjects: Vec<String>,
    pub state: State,
    /// In name order.
    pub consumers: Vec<ConsumerSummary>,
}

/// A stream's name and config, and its consumers' names and configs, as
/// JSON.
pub type StreamConfigs = (String, Value, Vec<(String, Value)>);

/// A consumer's counts, as `consumer.info` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSummary {
    pub name: String,
    /// Messages of the stream (matching its filter) not given to it yet.
    pub num_pending: u64,
    /// Messages given to it and not acked yet.
    pub num_ack_pending: u64,
    /// Of those, the ones given more than once.
    pub num_redelivered: u64,
}

impl ConsumerSummary {
    /// The counts of consumer `name` (`c`) of `stream`.
    pub(super) fn of(stream: &Stream, name: &str, c: &Consumer) -> ConsumerSummary {
        ConsumerSummary {
            name: name.to_string(),
            num_pending: stream.count_from(c.next_seq(), c.cfg.filter_subject.as_deref()),
            num_ack_pending: c.num_ack_pending() as u64,
            num_redelivered: c.num_redelivered() as u64,
        }
    }
}

/// A `consumer.fetch` waiting for messages.
#[derive(Debug)]
struct Wait {
    conn: ConnId,
    ack_id: u64,
    stream: Rc<str>,
    consumer: String,
    batch: usize,
    deadline: Instant,
}

pub(super) struct OpenStream {
    /// Its key in the capture index.
    id: u64,
    pub(super) name: Rc<str>,
    pub(super) stream: Stream,
    meta: MetaLog,
    meta_key: Option<FileKey>,
    /// Something changed this turn: files to write, consumers to serve.
    pub(super) touched: bool,
    /// When this stream next needs the loop (a redelivery, an age limit).
    due: Option<Instant>,
    /// A push consumer has something to deliver but nobody took it yet.
    push_waiting: bool,
}

pub struct Streams {
    root: Option<PathBuf>,
    /// Why streams are refused (`unavailable`), if they are.
    down: Option<String>,
    syncer: Option<Arc<Syncer>>,
    policy: SyncPolicy,
    set: BTreeMap<String, OpenStream>,
    /// Subjects -> the id of the stream capturing them (streams never
    /// overlap, so a subject matches at most one).
    capture: Sublist<u64>,
    by_id: HashMap<u64, String>,
    next_id: u64,
    /// Streams whose files could not be recovered, with why: their names
    /// stay taken, so that nothing overwrites what is on disk.
    broken: BTreeMap<String, String>,
    /// Acks of this turn, waiting for its write(2).
    unflushed: Vec<Held>,
    /// Acks written, waiting for their fsync ticket.
    held: VecDeque<(Ticket, Held)>,
    /// The highest ticket handed out so far.
    ticket: Ticket,
    /// The last fsync round the loop has heard of ([`Streams::woken`]):
    /// held acks are released only up to it, so an ack goes out on the
    /// event that reports its fsync, never on a read of the thread's
    /// progress in between.
    synced: Ticket,
    waits: Vec<Wait>,
    head: Vec<u8>,
    body: Vec<u8>,
    /// Round-robin position for push deliveries to a queue group.
    pick: usize,
    /// When the loop must call `tick` again (computed by `tick`).
    next_at: Option<Instant>,
    /// `-segment-size`.
    segment_bytes: u64,
    /// The wall clock read once per loop turn (message times).
    wall: WallClock,
    /// Subscriptions seen at the last sweep, and when the next is due: a
    /// stream nothing happened to is looked at only when it is due, when
    /// subscriptions changed (a push consumer may have a subscriber now),
    /// or at the periodic sweep.
    last_subs: usize,
    next_sweep: Instant,
}

/// How often every stream is looked at even when nothing happened to it.
const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// A publish a stream captured: raw JSON `data` and `headers`, or, when
/// `data` is a binary attachment, its bytes in `attachment`.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub subject: &'a str,
    pub data: &'a str,
    pub headers: Option<&'a str>,
    pub attachment: Option<&'a [u8]>,
}

/// The bytes of a captured publish's binary `data`: `None` without
/// attachments; `bad_request` unless `data` is exactly one placeholder
/// (`{"_placeholder":true,"num":0}`) and it is the only attachment.
pub fn stream_attachment<'a>(
    data: &str,
    attachments: &'a [Vec<u8>],
) -> Result<Option<&'a [u8]>, ApiError> {
    if attachments.is_empty() {
        return Ok(None);
    }
    let whole = serde_json::from_str::<Value>(data).ok().is_some_and(|v| {
        v.as_object().is_some_and(|m| {
            m.len() == 2
                && m.get("_placeholder") == Some(&Value::Bool(true))
                && m.get("num").and_then(Value::as_u64) == Some(0)
        })
    });
    if !whole || attachments.len() != 1 {
        return Err(ApiError::new(
            Code::BadRequest,
            "a stream stores binary data only as the whole of `data` (one attachment)",
        ));
    }
    Ok(Some(&attachments[0]))
}

/// The wall clock at one `Instant`: message times are taken from the
/// loop's clock without a system call per message.
#[derive(Debug, Clone, Copy)]
struct WallClock {
    at: Instant,
    ms: u64,
}

impl WallClock {
    fn read(at: Instant) -> WallClock {
        WallClock { at, ms: epoch_ms() }
    }

    /// Milliseconds since the Unix epoch at `now`.
    fn ms_at(&self, now: Instant) -> u64 {
        self.ms + now.saturating_duration_since(self.at).as_millis() as u64
    }
}

fn slot_by_id<'a>(
    by_id: &HashMap<u64, String>,
    set: &'a mut BTreeMap<String, OpenStream>,
    id: u64,
) -> Option<&'a mut OpenStream> {
    set.get_mut(by_id.get(&id)?)
}

/// Milliseconds since the Unix epoch (message times).
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn not_found(what: &str, name: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no {what} named {name:?}"))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(Code::Internal, e.to_string())
}

impl Default for Streams {
    fn default() -> Streams {
        Streams::disabled("streams are not set up")
    }
}

impl Streams {
    /// Streams refused with `unavailable` (no usable data directory).
    pub fn disabled(why: &str) -> Streams {
        Streams {
            root: None,
            down: Some(why.to_string()),
            syncer: None,
            policy: SyncPolicy::Never,
            set: BTreeMap::new(),
            capture: Sublist::new(),
            by_id: HashMap::new(),
            next_id: 1,
            broken: BTreeMap::new(),
            unflushed: Vec::new(),
            held: VecDeque::new(),
            ticket: 0,
            synced: 0,
            waits: Vec::new(),
            head: Vec::with_capacity(32),
            body: Vec::with_capacity(256),
            pick: 0,
            next_at: None,
            segment_bytes: Options::default().segment_bytes,
            wall: WallClock::read(Instant::now()),
            last_subs: 0,
            next_sweep: Instant::now(),
        }
    }

    /// Opens (or creates) `<data>/streams` and recovers every stream in it.
    pub fn open(data: &Path, policy: SyncPolicy, segment_bytes: u64) -> Result<Streams, String> {
        let root = data.join("streams");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let syncer = Syncer::start(policy).map_err(|e| format!("fsync thread: {e}"))?;
        let mut s = Streams::disabled("");
        s.down = None;
        s.policy = policy;
        s.syncer = Some(Arc::new(syncer));
        s.root = Some(root.clone());
        s.segment_bytes = segment_bytes;
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .map_err(|e| format!("{}: {e}", root.display()))?
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| sm::check_name("stream", n).is_ok())
            .collect();
        names.sort();
        for name in names {
            let dir = root.join(&name);
            if abandoned(&dir) {
                // A create that died before its first snapshot: nothing
                // was ever acknowledged in it.
                eprintln!(
                    "[warn] removing {}: a stream create that never completed",
                    dir.display()
                );
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            match s.recover(&dir) {
                Ok(slot) => s.add(slot),
                Err(e) => {
                    crate::log_error!("stream {name:?} is not served: {e}");
                    s.broken.insert(name, e);
                }
            }
        }
        Ok(s)
    }

    fn recover(&self, dir: &Path) -> Result<OpenStream, String> {
        let (snap, events, meta) = MetaLog::open(dir).map_err(|e| e.to_string())?;
        if dir.file_name().and_then(|n| n.to_str()) != Some(snap.config.name.as_str()) {
            return Err(format!(
                "{} holds stream {:?}",
                dir.display(),
                snap.config.name
            ));
        }
        let mut stream = Stream::open(snap.config.clone(), dir, self.store_opts(), epoch_ms())?;
        let now = Instant::now();
        for c in &snap.consumers {
            let mut consumer = Consumer::new(c.config.clone(), c.next_seq);
            consumer.restore(c.next_seq, c.consumer_seq, &c.pending, now);
            stream.consumers.insert(
                c.config.name.clone(),
                Member {
                    consumer,
                    since: c.since,
                },
            );
        }
        for (name, e) in events {
            if let Some(m) = stream.consumers.get_mut(&name) {
                m.consumer.replay(e, now);
            }
        }
        let last_seq = stream.last_seq();
        for m in stream.consumers.values_mut() {
            m.consumer.clamp(last_seq);
            m.consumer.resume();
        }
        let meta_key = self.register(meta.file());
        Ok(OpenStream {
            id: 0,
            name: Rc::from(snap.config.name.as_str()),
            stream,
            meta,
            meta_key,
            touched: true,
            due: None,
            push_waiting: false,
        })
    }

    fn store_opts(&self) -> Options {
        Options {
            segment_bytes: self.segment_bytes,
            syncer: self.syncer.clone(),
            ..Options::default()
        }
    }

    fn register(&self, file: &std::fs::File) -> Option<FileKey> {
        self.syncer.as_ref().and_then(|s| s.register(file).ok())
    }

    pub fn attach(&mut self, waker: Arc<mio::Waker>) {
        if let Some(s) = &self.syncer {
            s.set_waker(waker);
        }
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Appends the per-stream gauges to a `/metrics` body (Prometheus
    /// text): `gombus_stream_messages{stream="…"}` and
    /// `gombus_stream_bytes{stream="…"}`, plus `gombus_streams`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP gombus_streams Streams held by this node.\n# TYPE gombus_streams gauge\ngombus_streams {}",
            self.set.len()
        );
        let gauges = [
            ("gombus_stream_messages", "Messages stored in a stream."),
            (
                "gombus_stream_bytes",
                "Bytes stored in a stream (record framing included).",
            ),
        ];
        for (i, (name, help)) in gauges.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (stream, messages, bytes) in self.sizes() {
                let v = if i == 0 { messages } else { bytes };
                // Stream names are [A-Za-z0-9_-]: nothing to escape.
                let _ = writeln!(out, "{name}{{stream=\"{stream}\"}} {v}");
            }
        }
    }

    /// `(name, messages, bytes)` of every stream, for `/metrics`.
    pub fn sizes(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.set.values().map(|s| {
            let st = s.stream.state();
            (&*s.name, st.messages, st.bytes)
        })
    }

    /// Every stream held, in name order, with its state and its consumers'
    /// counts: the figures `stream.list` and `consumer.list` report, read
    /// directly (nothing is written or changed). Streams that could not be
    /// recovered are not in it.
    pub fn overview(&self) -> Vec<StreamSummary> {
        self.set
            .values()
            .map(|slot| {
                let s = &slot.stream;
                StreamSummary {
                    name: slot.name.to_string(),
                    subjects: s.cfg.subjects.clone(),
                    state: s.state(),
                    consumers: s
                        .consumers
                        .iter()
                        .map(|(name, m)| ConsumerSummary::of(s, name, &m.consumer))
                        .collect(),
                }
            })
            .collect()
    }

    /// Every stream's config and its consumers' configs, as their JSON
    /// (what the cluster records about streams this node holds).
    pub fn configs(&self) -> Vec<StreamConfigs> {
        self.set
            .values()
            .map(|slot| {
                let s = &slot.stream;
                let consumers = s
                    .consumers
                    .iter()
                    .map(|(n, m)| {
                        let cfg = serde_json::to_value(&m.consumer.cfg).unwrap_or(Value::Null);
                        (n.clone(), cfg)
                    })
                    .collect();
                let cfg = serde_json::to_value(&s.cfg).unwrap_or(Value::Null);
                (slot.name.to_string(), cfg, consumers)
            })
            .collect()
    }

    /// Every consumer's cursor: (stream, consumer, ack floor, last
    /// delivered), as stream sequences.
    pub fn cursors(&self) -> Vec<(String, String, u64, u64)> {
        let mut out = Vec::new();
        for slot in self.set.values() {
            for (name, m) in &slot.stream.consumers {
                let c = &m.consumer;
                out.push((
                    slot.name.to_string(),
                    name.to_string(),
                    c.ack_floor().stream_seq,
                    c.delivered().stream_seq,
                ));
            }
        }
        out
    }

    /// Adds a stream to the set and its subjects to the capture index.
    fn add(&mut self, mut slot: OpenStream) {
        slot.id = self.next_id;
        self.next_id += 1;
        for p in &slot.stream.cfg.subjects {
            self.capture.insert(p, None, slot.id);
        }
        self.by_id.insert(slot.id, slot.name.to_string());
        self.set.insert(slot.name.to_string(), slot);
    }

    /// The id of the stream capturing `subject`, if any (for
    /// [`Streams::publish`]).
    pub fn captures(&mut self, subject: &str) -> Option<u64> {
        if self.set.is_empty() {
            return None;
        }
        self.capture.matches(subject).plain.first().copied()
    }

    /// Stores a publish captured by stream `id`; its ack (if `ack_id`) is
    /// held until the message is written.
    pub fn publish(
        &mut self,
        id: u64,
        conn: ConnId,
        ack_id: Option<u64>,
        msg: Incoming<'_>,
        now: Instant,
    ) -> Result<(), ApiError> {
        let Incoming {
            subject,
            data,
            headers,
            attachment,
        } = msg;
        if let Some(why) = &self.down {
            return Err(ApiError::new(
                Code::Unavailable,
                format!("streams are unavailable: {why}"),
            ));
        }
        if self.held.len() + self.unflushed.len() >= HELD_ACKS_MAX {
            return Err(ApiError::new(
                Code::Limit,
                "too many stream acks are waiting for the disk",
            ));
        }
        let now_ms = self.wall.ms_at(now);
        let slot = slot_by_id(&self.by_id, &mut self.set, id)
            .ok_or_else(|| not_found("stream capturing", subject))?;
        let stored = match attachment {
            Some(bytes) => slot.stream.store(subject, bytes, true, headers, now_ms)?,
            None => slot
                .stream
                .store(subject, data.as_bytes(), false, headers, now_ms)?,
        };
        slot.touched = true;
        let reply = match stored {
            Stored::New { seq, removed } => {
                forget_removed(slot, &removed);
                AckBody::Stored {
                    seq,
                    duplicate: false,
                }
            }
            Stored::Duplicate(seq) => AckBody::Stored {
                seq,
                duplicate: true,
            },
        };
        if let Some(ack_id) = ack_id {
            let stream = Rc::clone(&slot.name);
            self.unflushed.push(Held {
                conn,
                ack_id,
                stream,
                reply,
            });
        }
        Ok(())
    }

    /// A stream event (`op`, named `name`; see `events.rs`). `Ok(None)`
    /// means the ack goes out later (held for a write, or a waiting
    /// fetch).
    pub fn event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        name: &str,
        arg: Option<&serde_json::value::RawValue>,
        ack_id: Option<u64>,
    ) -> Result<Option<String>, ApiError> {
        if let Some(why) = &self.down {
            return Err(ApiError::new(
                Code::Unavailable,
                format!("streams are unavailable: {why}"),
            ));
        }
        let now = sink.now();
        let v = |r: Result<Option<Value>, ApiError>| r.map(|b| b.map(ok_with));
        match op {
            StreamOp::StreamCreate => v(self.stream_create(parse_obj(arg)).map(Some)),
            StreamOp::StreamInfo => {
                v(parse_arg::<NameReq>(arg).and_then(|r| self.stream_info(&r.name)))
            }
            StreamOp::StreamList => v(self.stream_list()),
            StreamOp::StreamDelete => {
                v(parse_arg::<NameReq>(arg).and_then(|r| self.stream_delete(sink, &r.name)))
            }
            StreamOp::StreamPurge => parse_arg::<PurgeReq>(arg)
                .and_then(|r| self.stream_purge(conn, ack_id, r, now))
                .map(|()| None),
            StreamOp::StreamGet => {
                parse_arg::<GetReq>(arg).and_then(|r| self.stream_get(sink, conn, ack_id, r))
            }
            StreamOp::ConsumerCreate => {
                v(parse_arg::<ConsumerCreate>(arg).and_then(|r| self.consumer_create(r)))
            }
            StreamOp::ConsumerInfo => {
                v(parse_arg::<ConsumerReq>(arg)
                    .and_then(|r| self.consumer_info(&r.stream, &r.name)))
            }
            StreamOp::ConsumerList => {
                v(parse_arg::<StreamReq>(arg).and_then(|r| self.consumer_list(&r.stream)))
            }
            StreamOp::ConsumerDelete => v(parse_arg::<ConsumerReq>(arg)
                .and_then(|r| self.consumer_delete(sink, &r.stream, &r.name))),
            StreamOp::ConsumerFetch => {
                parse_arg::<FetchReq>(arg).and_then(|r| self.fetch(sink, conn, ack_id, r, now))
            }
            StreamOp::Ack | StreamOp::Nak | StreamOp::Term | StreamOp::Wip => {
                parse_arg::<AckReq>(arg)
                    .and_then(|r| self.ack_event(conn, ack_id, name, r, now))
                    .map(|()| None)
            }
        }
    }

    // ---- streams ---------------------------------------------------------

    fn slot(&mut self, name: &str) -> Result<&mut OpenStream, ApiError> {
        if let Some(why) = self.broken.get(name) {
            return Err(ApiError::new(
                Code::Internal,
                format!("stream {name:?} could not be recovered: {why}"),
            ));
        }
        self.set
            .get_mut(name)
            .ok_or_else(|| not_found("stream", name))
    }

    fn stream_create(
        &mut self,
        fields: Result<serde_json::Map<String, Value>, ApiError>,
    ) -> Result<Value, ApiError> {
        // In a cluster `replicas` was taken out already (`replicated.rs`).
        let mut fields = fields?;
        crate::cluster::placement::take_replicas(&mut fields, 1, false)?;
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        if let Some(why) = self.broken.get(&cfg.name) {
            return Err(ApiError::new(
                Code::Internal,
                format!("stream {:?} could not be recovered: {why}", cfg.name),
            ));
        }
        if let Some(slot) = self.set.get(&cfg.name) {
            if slot.stream.cfg == cfg {
                return Ok(stream_json(&slot.stream));
            }
            return Err(ApiError::new(
                Code::Exists,
                format!("stream {:?} exists with another config", cfg.name),
            ));
        }
        for other in self.set.values() {
            for a in &cfg.subjects {
                if let Some(b) = other
                    .stream
                    .cfg
                    .subjects
                    .iter()
                    .find(|b| sm::patterns_overlap(a, b))
                {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!(
                            "subject {a:?} overlaps {b:?} of stream {:?}",
                            other.stream.cfg.name
                        ),
                    ));
                }
            }
        }
        if self.set.len() >= STREAMS_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {STREAMS_MAX} streams"),
            ));
        }
        let root = self
            .root
            .as_ref()
            .ok_or_else(|| internal("no data directory"))?;
        let dir = root.join(&cfg.name);
        // A leftover directory of a deleted stream must not come back.
        let _ = std::fs::remove_dir_all(&dir);
        let mut snap = Snapshot {
            gen: 0,
            config: cfg.clone(),
            last_seq: 0,
            consumers: Vec::new(),
        };
        let meta = MetaLog::create(&dir, &mut snap).map_err(internal)?;
        let stream =
            Stream::open(cfg.clone(), &dir, self.store_opts(), epoch_ms()).map_err(internal)?;
        let meta_key = self.register(meta.file());
        let slot = OpenStream {
            id: 0,
            name: Rc::from(cfg.name.as_str()),
            stream,
            meta,
            meta_key,
            touched: false,
            due: None,
            push_waiting: false,
        };
        let v = stream_json(&slot.stream);
        self.add(slot);
        Ok(v)
    }

    fn stream_info(&mut self, name: &str) -> Result<Option<Value>, ApiError> {
        Ok(Some(stream_json(&self.slot(name)?.stream)))
    }

    fn stream_list(&self) -> Result<Option<Value>, ApiError> {
        let list: Vec<Value> = self
            .set
            .values()
            .map(|s| stream_json(&s.stream)["stream"].take())
            .collect();
        Ok(Some(json!({ "streams": list })))
    }

    fn stream_delete(
        &mut self,
        sink: &mut dyn Sink,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        if self.broken.contains_key(name) {
            return Err(self
                .slot(name)
                .err()
                .unwrap_or_else(|| not_found("stream", name)));
        }
        let slot = self
            .set
            .remove(name)
            .ok_or_else(|| not_found("stream", name))?;
        for p in &slot.stream.cfg.subjects {
            self.capture.remove(p, None, slot.id);
        }
        self.by_id.remove(&slot.id);
        if let (Some(s), Some(k)) = (&self.syncer, slot.meta_key) {
            // Retired, not forgotten: a round already counting on it still
            // runs (and so completes) before its descriptor is dropped.
            s.retire(k);
        }
        let dir = self.root.as_ref().map(|r| r.join(name));
        drop(slot);
        if let Some(dir) = dir {
            std::fs::remove_dir_all(&dir).map_err(internal)?;
        }
        // Acks waiting on the deleted stream's files have nothing left to
        // wait for: they are answered now, and so are fetches waiting on it.
        self.end_waits(sink, |w| &*w.stream == name);
        let mut now = Vec::new();
        self.held.retain_mut(|(_, h)| {
            let gone = &*h.stream == name;
            if gone {
                now.push(std::mem::replace(h, Held::placeholder()));
            }
            !gone
        });
        self.unflushed.retain_mut(|h| {
            let gone = &*h.stream == name;
            if gone {
                now.push(std::mem::replace(h, Held::placeholder()));
            }
            !gone
        });
        for h in now {
            self.answer(sink, &h, None);
        }
        Ok(Some(json!({})))
    }

    fn stream_purge(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        r: PurgeReq,
        _now: Instant,
    ) -> Result<(), ApiError> {
        if let Some(f) = &r.subject {
            crate::protocol::subject::validate_pattern(f)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {f:?}")))?;
        }
        let slot = self.slot(&r.name)?;
        let purged = slot.stream.purge(r.subject.as_deref())?;
        forget_missing(slot);
        slot.touched = true;
        if let Some(ack_id) = ack_id {
            let stream = Rc::clone(&slot.name);
            let body = ok_with(json!({ "purged": purged }));
            self.unflushed.push(Held {
                conn,
                ack_id,
                stream,
                reply: AckBody::Body(body),
            });
        }
        Ok(())
    }

    /// The ack body, the message's `data` and `headers` as published; a
    /// binary `data` is answered here, as a BINARY_ACK (then `None`).
    fn stream_get(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        r: GetReq,
    ) -> Result<Option<String>, ApiError> {
        let slot = self.slot(&r.name)?;
        let found = match (r.seq, &r.last_by_subject) {
            (Some(seq), None) => slot.stream.get(seq)?.map(|m| (seq, m)),
            (None, Some(subj)) => slot.stream.last_by_subject(subj)?,
            _ => {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "stream.get takes seq or last_by_subject",
                ))
            }
        };
        let (seq, m) = found.ok_or_else(|| ApiError::new(Code::NotFound, "no such message"))?;
        let (body, attachments) = message_body(seq, &m);
        if attachments.is_empty() {
            return Ok(Some(body));
        }
        if let Some(ack_id) = ack_id {
            send_ack(
                sink,
                &mut self.head,
                conn,
                ack_id,
                body.as_bytes(),
                &attachments,
            );
        }
        Ok(None)
    }

    // ---- consumers -------------------------------------------------------

    fn consumer_create(&mut self, r: ConsumerCreate) -> Result<Option<Value>, ApiError> {
        let mut cfg: ConsumerConfig = sm::read_config(r.config)?;
        cfg.validate()?;
        let syncer = self.syncer.clone();
        let slot = self.slot(&r.stream)?;
        let stream = &mut slot.stream;
        if let Some(m) = stream.consumers.get(&cfg.name) {
            if m.consumer.cfg == cfg {
                return Ok(Some(consumer_json(stream, &cfg.name)));
            }
            return Err(ApiError::new(
                Code::Exists,
                format!("consumer {:?} exists with another config", cfg.name),
            ));
        }
        if stream.consumers.len() >= CONSUMERS_PER_STREAM_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {CONSUMERS_PER_STREAM_MAX} consumers per stream"),
            ));
        }
        if stream.cfg.retention == Retention::Workqueue {
            let mine = cfg.filter_subject.as_deref().unwrap_or(">");
            let clash = stream.consumers.values().any(|m| {
                let theirs = m.consumer.cfg.filter_subject.as_deref().unwrap_or(">");
                sm::patterns_overlap(mine, theirs)
            });
            if clash {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "a workqueue stream takes one consumer per subject (filters overlap)",
                ));
            }
        }
        let start = start_seq(stream, &cfg);
        let name = cfg.name.clone();
        let since = stream.last_seq();
        stream.consumers.insert(
            name.clone(),
            Member {
                consumer: Consumer::new(cfg, start),
                since,
            },
        );
        if let Err(e) = save(slot, syncer.as_deref()) {
            slot.stream.consumers.remove(&name);
            return Err(e);
        }
        slot.touched = true;
        Ok(Some(consumer_json(&slot.stream, &name)))
    }

    fn consumer_info(&mut self, stream: &str, name: &str) -> Result<Option<Value>, ApiError> {
        let slot = self.slot(stream)?;
        if !slot.stream.consumers.contains_key(name) {
            return Err(not_found("consumer", name));
        }
        let mut v = consumer_json(&slot.stream, name);
        let stream_name = Rc::clone(&slot.name);
        let waiting = self
            .waits
            .iter()
            .filter(|w| w.stream == stream_name && w.consumer == name)
            .count();
        v["consumer"]["num_waiting"] = waiting.into();
        Ok(Some(v))
    }

    fn consumer_list(&mut self, stream: &str) -> Result<Option<Value>, ApiError> {
        let slot = self.slot(stream)?;
        let list: Vec<Value> = slot
            .stream
            .consumers
            .keys()
            .map(|n| consumer_json(&slot.stream, n)["consumer"].take())
            .collect();
        Ok(Some(json!({ "consumers": list })))
    }

    fn consumer_delete(
        &mut self,
        sink: &mut dyn Sink,
        stream: &str,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let syncer = self.syncer.clone();
        let slot = self.slot(stream)?;
        let gone = slot
            .stream
            .consumers
            .remove(name)
            .ok_or_else(|| not_found("consumer", name))?;
        if let Err(e) = save(slot, syncer.as_deref()) {
            slot.stream.consumers.insert(name.to_string(), gone);
            return Err(e);
        }
        if slot.stream.cfg.retention == Retention::Interest {
            let done: Vec<u64> = slot
                .stream
                .seqs()
                .into_iter()
                .filter(|&s| slot.stream.done_with(s))
                .collect();
            remove_seqs(slot, &done);
        }
        slot.touched = true;
        let stream_name = Rc::clone(&slot.name);
        self.end_waits(sink, |w| w.stream == stream_name && w.consumer == name);
        Ok(Some(json!({})))
    }

    /// Answers the waiting fetches that `gone` picks with `not_found`:
    /// their consumer or stream was deleted.
    fn end_waits(&mut self, sink: &mut dyn Sink, gone: impl Fn(&Wait) -> bool) {
        let mut i = 0;
        while i < self.waits.len() {
            if !gone(&self.waits[i]) {
                i += 1;
                continue;
            }
            let w = self.waits.remove(i);
            let e = not_found("consumer", &w.consumer);
            let e = ApiError::new(
                e.code,
                format!("{}: deleted while the fetch waited", e.message),
            );
            self.head.clear();
            socketio::write_header(&mut self.head, PacketType::Ack, 0, "/", Some(w.ack_id));
            sink.send_text(w.conn, &[&self.head, e.ack_body().as_bytes()]);
        }
    }

    fn fetch(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        r: FetchReq,
        now: Instant,
    ) -> Result<Option<String>, ApiError> {
        let batch = r.batch.unwrap_or(1);
        if batch == 0 || batch > FETCH_BATCH_MAX {
            return Err(ApiError::new(
                Code::BadRequest,
                format!("batch must be 1 to {FETCH_BATCH_MAX}"),
            ));
        }
        let expires = r.expires_ms.unwrap_or(sm::FETCH_EXPIRES_MS_DEFAULT);
        if expires > sm::FETCH_EXPIRES_MS_MAX {
            return Err(ApiError::new(
                Code::BadRequest,
                format!("expires_ms is at most {}", sm::FETCH_EXPIRES_MS_MAX),
            ));
        }
        if self.broken.contains_key(&r.stream) {
            // `internal`, as every other event naming it gets.
            return Err(self
                .slot(&r.stream)
                .err()
                .unwrap_or_else(|| not_found("stream", &r.stream)));
        }
        let slot = self
            .set
            .get_mut(&r.stream)
            .ok_or_else(|| not_found("stream", &r.stream))?;
        let Some(member) = slot.stream.consumers.get(&r.consumer) else {
            return Err(not_found("consumer", &r.consumer));
        };
        if member.consumer.cfg.deliver_subject.is_some() {
            return Err(ApiError::new(
                Code::BadRequest,
                "a push consumer (deliver_subject set) cannot be fetched from",
            ));
        }
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let mut body = std::mem::take(&mut self.body);
        let mut attachments = Vec::new();
        let n = take_batch(
            slot,
            &r.consumer,
            batch as usize,
            now,
            &mut body,
            &mut attachments,
        );
        if n > 0 || r.no_wait == Some(true) {
            let out = fetch_body(&body);
            self.body = body;
            if attachments.is_empty() {
                return Ok(Some(out));
            }
            // Binary messages: a BINARY_ACK, sent here.
            send_ack(
                sink,
                &mut self.head,
                conn,
                ack_id,
                out.as_bytes(),
                &attachments,
            );
            return Ok(None);
        }
        self.body = body;
        if self.waits.iter().filter(|w| w.conn == conn).count() >= WAITS_PER_CONN_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {WAITS_PER_CONN_MAX} fetches may wait per socket"),
            ));
        }
        let stream = Rc::clone(&slot.name);
        self.waits.push(Wait {
            conn,
            ack_id,
            stream,
            consumer: r.consumer,
            batch: batch as usize,
            deadline: now + Duration::from_millis(expires),
        });
        Ok(None)
    }
}

impl Streams {
    // ---- acks ------------------------------------------------------------

    fn ack_event(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        event: &str,
        r: AckReq,
        now: Instant,
    ) -> Result<(), ApiError> {
        let slot = self.slot(&r.stream)?;
        let member = slot
            .stream
            .consumers
            .get_mut(&r.consumer)
            .ok_or_else(|| not_found("consumer", &r.consumer))?;
        let c = &mut member.consumer;
        let mut events = Vec::new();
        let mut done = Vec::new();
        match event {
            "ack" => done = c.ack(r.seq, &mut events)?,
            "nak" => {
                let delay = r.delay_ms.unwrap_or(0).min(NAK_DELAY_MS_MAX);
                c.nak(r.seq, Duration::from_millis(delay), now)?;
            }
            "term" => {
                if c.term(r.seq, &mut events)? {
                    done.push(r.seq);
                }
            }
            _ => c.wip(r.seq, now)?,
        }
        after_events(slot, &r.consumer, &events, &done);
        slot.touched = true;
        if let Some(ack_id) = ack_id {
            let stream = Rc::clone(&slot.name);
            self.unflushed.push(Held {
                conn,
                ack_id,
                stream,
                reply: AckBody::Ok,
            });
        }
        Ok(())
    }

    // ---- the loop --------------------------------------------------------

    /// Once per loop turn: limits by age, redelivery timers, push
    /// deliveries, waiting fetches, then one write per touched file and the
    /// release of every ack that write made true.
    pub fn tick(
        &mut self,
        sink: &mut dyn Sink,
        subs: &mut SubTable,
        remote: &mut super::stream_out::RemotePush,
    ) {
        if self.down.is_some() {
            return;
        }
        let now = sink.now();
        self.wall = WallClock::read(now);
        let now_ms = self.wall.ms_at(now);
        let sweep = subs.len() != self.last_subs || now >= self.next_sweep;
        if sweep {
            self.last_subs = subs.len();
            self.next_sweep = now + SWEEP_EVERY;
        }
        let mut more = false;
        for slot in self.set.values_mut() {
            let due = slot.due.is_some_and(|d| d <= now);
            if !(slot.touched || due || sweep) {
                continue;
            }
            maintain(slot, now, now_ms);
            more |= push_slot(sink, subs, remote, slot, now, &mut self.pick);
            plan_slot(slot, now, now_ms);
        }
        self.serve_waits(sink, now);
        self.flush_all(now, now_ms);
        self.release(sink);
        self.plan(now, more);
    }

    /// The handler-wide deadline for the loop (computed by `tick`).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_at
    }

    fn plan(&mut self, now: Instant, more: bool) {
        if more {
            self.next_at = Some(now);
            return;
        }
        let mut at: Option<Instant> = None;
        let mut fold = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        for w in &self.waits {
            fold(Some(w.deadline));
        }
        let mut push_waiting = false;
        for slot in self.set.values() {
            fold(slot.due);
            push_waiting |= slot.push_waiting;
        }
        if push_waiting {
            fold(Some(self.next_sweep));
        }
        self.next_at = at;
    }

    /// The fsync thread finished a round (it calls the loop's waker after
    /// each): release what it covered.
    pub fn woken(&mut self, sink: &mut dyn Sink) {
        self.hear_syncer();
        self.release(sink);
    }

    /// Takes in the fsync rounds completed so far.
    fn hear_syncer(&mut self) {
        if let Some(s) = &self.syncer {
            self.synced = self.synced.max(s.done());
        }
    }

    /// The broker is stopping (before any client is told): writes what
    /// the last turn left (messages before the cursor logs naming them),
    /// runs a final fsync round over every stream file whatever `-sync`
    /// says (none under `-sync=none`), waiting at most `within` for it, and
    /// then sends every held ack that round covers, so a publisher whose
    /// message is now durable hears so before its DISCONNECT. Acks still
    /// held after `within` are not sent: their messages were written and
    /// the round goes on (the fsync thread finishes it when the syncer is
    /// dropped), but their publishers are never told.
    /// An fsync failure answers them with `internal` instead.
    pub fn shutdown(&mut self, sink: &mut dyn Sink, within: Duration) {
        if self.root.is_none() {
            return;
        }
        let t0 = Instant::now();
        if self.down.is_none() {
            let now = sink.now();
            self.flush_all(now, self.wall.ms_at(now));
        }
        let synced = self
            .syncer
            .as_ref()
            .map_or(Ok(true), |s| s.sync_now(within));
        let held = self.held.len();
        self.hear_syncer();
        self.release(sink);
        let sent = held - self.held.len();
        let ms = t0.elapsed().as_millis();
        match synced {
            Ok(true) if self.policy == SyncPolicy::Never => crate::log_info!(
                "shutting down: streams written (not fsynced: -sync=none), {sent} held acks sent"
            ),
            Ok(true) => crate::log_info!(
                "shutting down: streams written and synced in {ms} ms, {sent} held acks sent"
            ),
            Ok(false) => crate::log_warn!(
                "shutting down: the final fsync did not finish within {} ms; {} held acks are not sent",
                within.as_millis(),
                self.held.len()
            ),
            Err(e) => crate::log_error!(
                "shutting down: streams could not be synced ({e}); {sent} held acks answered"
            ),
        }
    }

    /// A connection went away: its held acks and waiting fetches go too.
    pub fn closed(&mut self, conn: ConnId) {
        self.unflushed.retain(|h| h.conn != conn);
        self.held.retain(|(_, h)| h.conn != conn);
        self.waits.retain(|w| w.conn != conn);
    }

    fn flush_all(&mut self, now: Instant, now_ms: u64) {
        let mut failed = None;
        for slot in self.set.values_mut() {
            if !slot.touched {
                continue;
            }
            slot.touched = false;
            plan_slot(slot, now, now_ms);
            // Messages are written before the cursors that refer to them.
            if let Err(e) = slot
                .stream
                .flush()
                .map(|t| self.ticket = self.ticket.max(t))
            {
                failed = Some(e.to_string());
            }
            if slot.meta.wants_compaction() {
                if let Err(e) = save(slot, self.syncer.as_deref()) {
                    failed = Some(e.message);
                }
            }
            match slot.meta.flush() {
                Ok(true) => {
                    if let (Some(s), Some(k)) = (&self.syncer, slot.meta_key) {
                        self.ticket = self.ticket.max(s.dirty(k));
                    }
                }
                Ok(false) => {}
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if let Some(f) = failed {
            crate::log_error!("streams: write failed: {f}");
            self.down = Some(format!("write failed: {f}"));
        }
        let t = self.ticket;
        self.held.extend(self.unflushed.drain(..).map(|h| (t, h)));
    }

    fn release(&mut self, sink: &mut dyn Sink) {
        let failure = self.syncer.as_ref().and_then(|s| s.failure());
        let failure = failure.or_else(|| self.down.clone());
        while let Some((t, _)) = self.held.front() {
            let covered = !self.policy.acks_wait() || self.syncer.is_none() || *t <= self.synced;
            if !covered && failure.is_none() {
                break;
            }
            let Some((_, h)) = self.held.pop_front() else {
                break;
            };
            let error = if covered { None } else { failure.as_deref() };
            self.answer(sink, &h, error);
        }
    }

    /// Sends one held ack: its reply, or `internal` when what it confirms
    /// could not be made durable.
    fn answer(&mut self, sink: &mut dyn Sink, h: &Held, error: Option<&str>) {
        self.body.clear();
        match (error, &h.reply) {
            (Some(f), _) => {
                let e = ApiError::new(Code::Internal, format!("not stored: {f}"));
                self.body.extend_from_slice(e.ack_body().as_bytes());
            }
            (None, AckBody::Ok) => self.body.extend_from_slice(OK_BODY.as_bytes()),
            (None, AckBody::Body(b)) => self.body.extend_from_slice(b.as_bytes()),
            (None, AckBody::Stored { seq, duplicate }) => {
                self.body.extend_from_slice(b"[{\"ok\":true,\"stream\":");
                push_str(&mut self.body, &h.stream);
                self.body.extend_from_slice(b",\"seq\":");
                self.body.extend_from_slice(seq.to_string().as_bytes());
                if *duplicate {
                    self.body.extend_from_slice(b",\"duplicate\":true");
                }
                self.body.extend_from_slice(b"}]");
            }
        }
        self.head.clear();
        socketio::write_header(&mut self.head, PacketType::Ack, 0, "/", Some(h.ack_id));
        sink.send_text(h.conn, &[&self.head, &self.body]);
    }

    fn serve_waits(&mut self, sink: &mut dyn Sink, now: Instant) {
        if self.waits.is_empty() {
            return;
        }
        let mut body = std::mem::take(&mut self.body);
        let mut attachments = Vec::new();
        let mut i = 0;
        while i < self.waits.len() {
            let w = &self.waits[i];
            let slot = self.set.get_mut(&*w.stream);
            let n = match slot {
                Some(slot) => {
                    let ready = slot
                        .stream
                        .consumers
                        .get(&w.consumer)
                        .is_some_and(|m| m.consumer.may_have_work(slot.stream.last_seq()));
                    if ready {
                        take_batch(slot, &w.consumer, w.batch, now, &mut body, &mut attachments)
                    } else {
                        0
                    }
                }
                None => 0,
            };
            if n == 0 && w.deadline > now {
                i += 1;
                continue;
            }
            if n == 0 {
                body.clear();
                attachments.clear();
            }
            let w = self.waits.remove(i);
            let text = fetch_body(&body);
            send_ack(
                sink,
                &mut self.head,
                w.conn,
                w.ack_id,
                text.as_bytes(),
                &attachments,
            );
        }
        self.body = body;
    }
}

/// Whether a stream directory is what a create left when it died before
/// writing its first snapshot: no `meta.snap` and no segment file.
fn abandoned(dir: &Path) -> bool {
    if dir.join("meta.snap").exists() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    !entries
        .flatten()
        .any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".seg")))
}

/// Largest `nak` delay (one day).
pub const NAK_DELAY_MS_MAX: u64 = 86_400_000;

/// When a stream next needs the loop, and whether a push consumer of it
/// waits for a subscriber.
fn plan_slot(slot: &mut OpenStream, now: Instant, now_ms: u64) {
    let last_seq = slot.stream.last_seq();
    let mut due = slot
        .stream
        .next_expiry_ms()
        .map(|t| now + Duration::from_millis(t.saturating_sub(now_ms)));
    let mut push_waiting = false;
    for m in slot.stream.consumers.values() {
        if let Some(t) = m.consumer.next_deadline() {
            due = Some(due.map_or(t, |d| d.min(t)));
        }
        push_waiting |=
            m.consumer.cfg.deliver_subject.is_some() && m.consumer.may_have_work(last_seq);
    }
    slot.due = due;
    slot.push_waiting = push_waiting;
}

/// Age limits, the duplicate window and redelivery timers of one stream.
fn maintain(slot: &mut OpenStream, now: Instant, now_ms: u64) {
    let removed = slot.stream.expire(now_ms).unwrap_or_default();
    if !removed.is_empty() {
        forget_removed(slot, &removed);
        slot.touched = true;
    }
    let due: Vec<String> = slot
        .stream
        .consumers
        .iter()
        .filter(|(_, m)| m.consumer.next_deadline().is_some_and(|t| t <= now))
        .map(|(n, _)| n.clone())
        .collect();
    for name in due {
        let mut events = Vec::new();
        if let Some(m) = slot.stream.consumers.get_mut(&name) {
            m.consumer.expire(now, &mut events);
        }
        after_events(slot, &name, &events, &[]);
        slot.touched = true;
    }
}

/// Logs a consumer's events and applies the stream's retention to the
/// sequences it is done with.
pub(super) fn after_events(slot: &mut OpenStream, consumer: &str, events: &[Event], done: &[u64]) {
    for &e in events {
        slot.meta.push(consumer, e);
    }
    if slot.stream.cfg.retention == Retention::Limits {
        return;
    }
    let finished = events.iter().filter_map(|e| match e {
        Event::Done(s) => Some(*s),
        _ => None,
    });
    let gone: Vec<u64> = finished
        .chain(done.iter().copied())
        .filter(|&s| slot.stream.done_with(s))
        .collect();
    remove_seqs(slot, &gone);
}

/// Removes messages under retention (acked in a workqueue, or by every
/// interested consumer).
fn remove_seqs(slot: &mut OpenStream, seqs: &[u64]) {
    let mut removed = Vec::with_capacity(seqs.len());
    for &s in seqs {
        if slot.stream.remove(s).unwrap_or(false) {
            removed.push(s);
        }
    }
    if !removed.is_empty() {
        forget_removed(slot, &removed);
        slot.touched = true;
    }
}

/// Consumers stop waiting for acks of messages that are gone (after a
/// purge).
fn forget_missing(slot: &mut OpenStream) {
    let names: Vec<String> = slot.stream.consumers.keys().cloned().collect();
    for name in names {
        let mut events = Vec::new();
        if let Some((msgs, m)) = slot.stream.split(&name) {
            m.consumer.forget_missing(&msgs, &mut events);
        }
        for e in events {
            slot.meta.push(&name, e);
        }
    }
}

/// Consumers stop waiting for acks of messages that are gone.
fn forget_removed(slot: &mut OpenStream, removed: &[u64]) {
    if removed.is_empty() {
        return;
    }
    for (name, m) in slot.stream.consumers.iter_mut() {
        for &s in removed {
            if m.consumer.forget(s) {
                slot.meta.push(name, Event::Done(s));
            }
        }
    }
}

/// The first sequence a new consumer delivers, from its deliver policy.
fn start_seq(stream: &Stream, cfg: &ConsumerConfig) -> u64 {
    let last = stream.last_seq();
    match cfg.deliver_policy {
        DeliverPolicy::All => 1,
        DeliverPolicy::New => last + 1,
        DeliverPolicy::ByStartSeq => cfg.opt_start_seq.unwrap_or(1),
        DeliverPolicy::Last => {
            let filter = cfg.filter_subject.as_deref().unwrap_or(">");
            match stream.last_by_subject(filter) {
                Ok(Some((s, _))) => s,
                _ => last + 1,
            }
        }
    }
}

/// Writes a stream's snapshot now (consumer created or deleted, or the log
/// grown past its bound).
/// The new log replaces the old one in the fsync thread's registry.
fn save(slot: &mut OpenStream, syncer: Option<&Syncer>) -> Result<(), ApiError> {
    // The snapshot may name deliveries of messages appended this turn:
    // they are written first.
    slot.stream.flush().map_err(internal)?;
    let mut snap = Snapshot {
        gen: 0,
        config: slot.stream.cfg.clone(),
        last_seq: slot.stream.last_seq(),
        consumers: slot
            .stream
            .consumers
            .values()
            .map(|m| {
                let (next_seq, consumer_seq, pending) = m.consumer.snapshot();
                ConsumerSnap {
                    config: m.consumer.cfg.clone(),
                    since: m.since,
                    next_seq,
                    consumer_seq,
                    pending,
                }
            })
            .collect(),
    };
    let old = slot.meta.compact(&mut snap).map_err(internal)?;
    drop(old);
    if let Some(s) = syncer {
        if let Some(k) = slot.meta_key.take() {
            s.retire(k);
        }
        slot.meta_key = s.register(slot.meta.file()).ok();
    }
    Ok(())
}

fn parse_obj(
    arg: Option<&serde_json::value::RawValue>,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    parse_arg(arg)
}

fn parse_arg<T: serde::de::DeserializeOwned>(
    arg: Option<&serde_json::value::RawValue>,
) -> Result<T, ApiError> {
    let arg =
        arg.ok_or_else(|| ApiError::new(Code::BadRequest, "the event needs an object argument"))?;
    serde_json::from_str(arg.get())
        .map_err(|e| ApiError::new(Code::BadRequest, format!("bad arguments: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_takes_binary_data_only_as_the_whole_of_data() {
        let one = vec![vec![1u8, 2]];
        let whole = r#"{"_placeholder":true,"num":0}"#;
        assert_eq!(stream_attachment("\"x\"", &[]).unwrap(), None);
        assert_eq!(stream_attachment(whole, &one).unwrap(), Some(&[1u8, 2][..]));
        let two = vec![vec![1u8], vec![2u8]];
        for (data, atts) in [
            (r#"{"a":{"_placeholder":true,"num":0}}"#, &one),
            (r#"[{"_placeholder":true,"num":0}]"#, &one),
            (r#"{"_placeholder":true,"num":0,"x":1}"#, &one),
            (r#"{"_placeholder":true,"num":1}"#, &two),
            (whole, &two),
        ] {
            let e = stream_attachment(data, atts).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{data}");
        }
    }
}
