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
//! [`Streams`] owns all of it in private fields. This file holds the
//! registry (opening and recovering the streams, captures, publishes, the
//! read-only views) and routes the events; the rest is split by concern:
//! `admin.rs` (stream and consumer events), `fetch.rs` (pull fetches and
//! their waits), `acks.rs` (consumer acks, held publish acks and their
//! release), `upkeep.rs` (the per-turn work), `kv.rs` (key-value reads),
//! and `open.rs` (one open stream and its retention after consumer
//! events, which the push and fetch paths of `stream_out.rs` share).
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

use super::ack::send_ack_with;
use super::events::StreamOp;
use super::stream_out::{
    consumer_json, fetch_body, message_body, push_slot, push_stored, push_str, stream_json,
    take_batch,
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
use crate::stream::consumer::Consumer;
use crate::stream::meta::{ConsumerSnap, MetaLog, Snapshot};
use crate::stream::store::Options;
use crate::stream::stream::{Member, State, Stored, Stream, CONSUMERS_PER_STREAM_MAX};

pub use crate::protocol::stream_messages::FETCH_BATCH_MAX;

mod acks;
mod admin;
mod fetch;
pub(crate) mod kv;
pub(super) mod open;
mod upkeep;

use open::{after_events, forget_removed, remove_seqs, OpenStream};
pub use open::{ConsumerSummary, FETCH_BYTES_MAX, PUSH_PER_TURN_MAX};

/// Most streams one broker holds.
pub const STREAMS_MAX: usize = 1_000;
/// Most fetches one connection may have waiting.
pub const WAITS_PER_CONN_MAX: usize = 64;
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

/// A `kv.watch`: an in-memory consumer (filtered to the watched keys, no
/// acks) of the writes its bucket's stream stores, read from the stream's
/// tap so that none is missed even when a limit removes it at once (a
/// second write of a key with `history` 1 in the same turn); each goes to
/// one socket as a `msg`. Nothing of it is written; it ends with its
/// socket.
pub struct Watch {
    conn: ConnId,
    sid: String,
    stream: Rc<str>,
    bucket: String,
    consumer: Consumer,
    /// The user's `subscribe` rules, when not every key may be read.
    readable: Option<crate::auth::rights::Rules>,
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
    /// `kv.watch`es of the buckets held here (`kv.rs`).
    watches: Vec<Watch>,
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
            watches: Vec::new(),
        }
    }

    /// Opens (or creates) `<data>/streams` and recovers every stream in it.
    /// The data directory and the segment size streams were opened with
    /// (`None` without one).
    pub(crate) fn data_dir(&self) -> Option<(&Path, u64)> {
        let data = self.root.as_deref()?.parent()?;
        Some((data, self.segment_bytes))
    }

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
        names.sort_unstable();
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
    /// With `revision`, the ack is a bucket write's `{ok, revision}`.
    pub fn publish(
        &mut self,
        id: u64,
        conn: ConnId,
        ack_id: Option<u64>,
        msg: Incoming<'_>,
        now: Instant,
        revision: bool,
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
        let (seq, duplicate) = match stored {
            Stored::New { seq, removed } => {
                forget_removed(slot, &removed);
                (seq, false)
            }
            Stored::Duplicate(seq) => (seq, true),
        };
        let reply = match revision {
            true => AckBody::Body(format!("[{{\"ok\":true,\"revision\":{seq}}}]")),
            false => AckBody::Stored { seq, duplicate },
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

/// Largest `nak` delay (one day), the same for replicated streams.
pub use crate::stream::replica::NAK_DELAY_MS_MAX;

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
