//! Key-value reads on the stream of a bucket held here as an R1 stream
//! (docs/PROTOCOL.md §14): a key's latest write, found through the
//! store's per-subject index (one read), a key's kept writes, the latest
//! write of every key matching a filter (`kv.keys`, a watch's start) and
//! a bucket's state. Writes are publishes ([`Streams::publish`]), decided
//! by the stream's write rules (`stream/limits.rs`).

use super::*;
use crate::stream::consumer::Source;
use crate::stream::limits::{self, KvOp};
use crate::stream::replica::Replica;
use crate::stream::stream::{Msg, Tap};
use std::collections::BTreeSet;

/// One write of a key, read back.
#[derive(Debug, Clone)]
pub struct KvEntry {
    pub seq: u64,
    pub op: KvOp,
    pub msg: Msg,
}

/// A bucket's stream config and `state`.
#[derive(Debug, Clone)]
pub struct KvState {
    pub config: StreamConfig,
    pub values: u64,
    pub bytes: u64,
    pub revision: u64,
}

/// What the bucket reads need of a stream, from either engine: an R1
/// [`Stream`] or a replicated stream's [`Replica`] (on its leader).
pub trait KvSource: Source {
    fn config(&self) -> &StreamConfig;
    /// Bytes held and the last seq.
    fn totals(&self) -> (u64, u64);
    /// Message `seq`, if kept.
    fn msg(&self, seq: u64) -> Result<Option<Msg>, ApiError>;
    /// The last seq of each subject matching `filter`, in seq order.
    fn last_per_subject(&self, filter: &str) -> Vec<u64>;
    /// Every kept seq of exactly `subject`, oldest first.
    fn seqs_of(&self, subject: &str) -> Vec<u64>;
    /// Every kept seq whose subject matches `filter`, in order.
    fn matching(&self, filter: &str) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(seq) = self.next_matching(at, Some(filter)) {
            out.push(seq);
            at = seq + 1;
        }
        out
    }
}

/// The writes a stream's tap caught, as a watch's consumer reads them.
struct Tapped<'a>(&'a [(u64, Msg)]);

impl Tapped<'_> {
    fn find(&self, seq: u64) -> Option<&Msg> {
        let i = self.0.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        Some(&self.0[i].1)
    }

    fn entry(&self, seq: u64) -> Option<KvEntry> {
        let msg = self.find(seq)?.clone();
        Some(KvEntry {
            seq,
            op: limits::asks_of(msg.headers.as_deref()).op,
            msg,
        })
    }
}

impl Source for Tapped<'_> {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        let at = self.0.partition_point(|(s, _)| *s < from);
        self.0[at..]
            .iter()
            .find(|(_, m)| filter.is_none_or(|f| crate::protocol::subject::matches(f, &m.subject)))
            .map(|(s, _)| *s)
    }
    fn contains(&self, seq: u64) -> bool {
        self.find(seq).is_some()
    }
    fn last_seq(&self) -> u64 {
        self.0.last().map_or(0, |(s, _)| *s)
    }
}

impl KvSource for Stream {
    fn config(&self) -> &StreamConfig {
        &self.cfg
    }
    fn totals(&self) -> (u64, u64) {
        let st = self.state();
        (st.bytes, st.last_seq)
    }
    fn msg(&self, seq: u64) -> Result<Option<Msg>, ApiError> {
        self.get(seq)
    }
    fn last_per_subject(&self, filter: &str) -> Vec<u64> {
        Stream::last_per_subject(self, filter)
    }
    fn seqs_of(&self, subject: &str) -> Vec<u64> {
        Stream::seqs_of(self, subject)
    }
}

impl KvSource for Replica {
    fn config(&self) -> &StreamConfig {
        Replica::config(self)
    }
    fn totals(&self) -> (u64, u64) {
        (self.bytes(), self.last_seq())
    }
    fn msg(&self, seq: u64) -> Result<Option<Msg>, ApiError> {
        let m = self.get(seq).map_err(internal)?;
        Ok(m.map(|m| Msg {
            subject: m.subject,
            data: m.data,
            binary: m.binary,
            headers: m.headers,
            time_ms: m.time_ms,
        }))
    }
    fn last_per_subject(&self, filter: &str) -> Vec<u64> {
        Replica::last_per_subject(self, filter)
    }
    fn seqs_of(&self, subject: &str) -> Vec<u64> {
        Replica::seqs_of(self, subject)
    }
}

fn entry(s: &dyn KvSource, seq: u64) -> Result<Option<KvEntry>, ApiError> {
    Ok(s.msg(seq)?.map(|msg| KvEntry {
        seq,
        op: limits::asks_of(msg.headers.as_deref()).op,
        msg,
    }))
}

fn entries(s: &dyn KvSource, seqs: Vec<u64>) -> Result<Vec<KvEntry>, ApiError> {
    seqs.into_iter()
        .filter_map(|q| entry(s, q).transpose())
        .collect()
}

/// The latest write of exactly `subject` (a put or a marker).
pub fn kv_latest(s: &dyn KvSource, subject: &str) -> Result<Option<KvEntry>, ApiError> {
    match s.seqs_of(subject).last() {
        Some(&seq) => entry(s, seq),
        None => Ok(None),
    }
}

/// Write `seq`, if it is still kept.
pub fn kv_at(s: &dyn KvSource, seq: u64) -> Result<Option<KvEntry>, ApiError> {
    entry(s, seq)
}

/// Every kept write of exactly `subject`, oldest first.
pub fn kv_history(s: &dyn KvSource, subject: &str) -> Result<Vec<KvEntry>, ApiError> {
    entries(s, s.seqs_of(subject))
}

/// The latest write of every subject matching `filter`, in seq order.
pub fn kv_latest_all(s: &dyn KvSource, filter: &str) -> Result<Vec<KvEntry>, ApiError> {
    entries(s, s.last_per_subject(filter))
}

/// Every kept write of the subjects matching `filter`, in seq order.
pub fn kv_all(s: &dyn KvSource, filter: &str) -> Result<Vec<KvEntry>, ApiError> {
    entries(s, s.matching(filter))
}

/// A bucket's config and `state`.
pub fn kv_state(s: &dyn KvSource) -> Result<KvState, ApiError> {
    let latest = kv_latest_all(s, ">")?;
    let (bytes, revision) = s.totals();
    Ok(KvState {
        config: s.config().clone(),
        values: latest.iter().filter(|e| e.op == KvOp::Put).count() as u64,
        bytes,
        revision,
    })
}

impl Streams {
    /// Whether stream `name` is held here.
    pub fn holds(&self, name: &str) -> bool {
        self.set.contains_key(name)
    }

    /// The names of the streams held here.
    pub fn names(&self) -> Vec<String> {
        self.set.keys().cloned().collect()
    }

    /// Stream `name`, for the bucket reads.
    pub fn kv_source(&mut self, name: &str) -> Result<&dyn KvSource, ApiError> {
        Ok(&self.slot(name)?.stream)
    }
}

/// Most watches one connection may hold.
pub const WATCHES_PER_CONN_MAX: usize = 256;

/// Appends a `msg` event's entry `{sid?, bucket, key, value?, revision,
/// op, time}` to `out` (for `kv.get`, `kv.history` and watches); binary
/// values go to `attachments`.
pub fn push_entry(
    out: &mut Vec<u8>,
    attachments: &mut Vec<Vec<u8>>,
    bucket: Option<&str>,
    key: &str,
    e: &KvEntry,
) {
    out.push(b'{');
    if let Some(b) = bucket {
        out.extend_from_slice(b"\"bucket\":");
        push_str(out, b);
        out.push(b',');
    }
    out.extend_from_slice(b"\"key\":");
    push_str(out, key);
    if e.op == KvOp::Put {
        out.extend_from_slice(b",\"value\":");
        super::super::stream_out::push_data(out, &e.msg, attachments.len());
        if e.msg.binary {
            attachments.push(e.msg.data.to_vec());
        }
    }
    out.extend_from_slice(
        format!(
            ",\"revision\":{},\"time\":{},\"op\":\"{}\"}}",
            e.seq,
            e.msg.time_ms,
            e.op.as_str()
        )
        .as_bytes(),
    );
}

/// Sends one watch `msg` (its `sid` and `entry`, or `caught_up`).
fn send_watch_msg(
    sink: &mut dyn Sink,
    head: &mut Vec<u8>,
    body: &mut Vec<u8>,
    conn: ConnId,
    sid: &str,
    bucket: &str,
    e: Option<&KvEntry>,
) {
    body.clear();
    body.extend_from_slice(b"[\"msg\",{\"sid\":");
    push_str(body, sid);
    body.extend_from_slice(b",\"bucket\":");
    push_str(body, bucket);
    let mut attachments = Vec::new();
    match e {
        Some(e) => {
            let key = crate::protocol::kv_messages::key_of(bucket, &e.msg.subject).unwrap_or("");
            body.push(b',');
            let mut one = Vec::new();
            push_entry(&mut one, &mut attachments, None, key, e);
            // The entry's fields, inside the msg's object.
            body.extend_from_slice(&one[1..one.len() - 1]);
        }
        None => body.extend_from_slice(b",\"caught_up\":true"),
    }
    body.extend_from_slice(b"}]");
    let kind = if attachments.is_empty() {
        PacketType::Event
    } else {
        PacketType::BinaryEvent
    };
    head.clear();
    socketio::write_header(head, kind, attachments.len(), "/", None);
    if sink.send_text(conn, &[head, body]) {
        for a in &attachments {
            sink.send_binary(conn, a);
        }
    }
}

/// What a new watch is to send before it is caught up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// The latest write of each matching key.
    Latest,
    /// Every kept write of the matching keys.
    History,
    /// Nothing: new writes only.
    UpdatesOnly,
}

/// Starts watch `sid` of socket `conn` on the keys of bucket `bucket`
/// (stream `name`, read through `src`) matching subject pattern `filter`:
/// answers `ack_id` with `{ok, sid}`, sends what `start` asks for and the
/// `caught_up` marker; the watch it returns hands out every later write
/// ([`Streams::add_watch`]).
#[allow(clippy::too_many_arguments)]
pub fn start_watch(
    sink: &mut dyn Sink,
    src: &dyn KvSource,
    conn: ConnId,
    ack_id: Option<u64>,
    sid: &str,
    name: &str,
    bucket: &str,
    filter: &str,
    start: WatchStart,
    readable: Option<crate::auth::rights::Rules>,
) -> Result<Watch, ApiError> {
    let first = match start {
        WatchStart::Latest => kv_latest_all(src, filter)?,
        WatchStart::History => kv_all(src, filter)?,
        WatchStart::UpdatesOnly => Vec::new(),
    };
    let next = Source::last_seq(src) + 1;
    let mut cfg = serde_json::Map::new();
    cfg.insert("name".into(), "watch".into());
    cfg.insert("filter_subject".into(), filter.into());
    cfg.insert("ack_policy".into(), "none".into());
    let cfg: ConsumerConfig = sm::read_config(cfg)?;
    let (mut head, mut body) = (Vec::new(), Vec::new());
    if let Some(ack_id) = ack_id {
        let ack = ok_with(json!({ "sid": sid }));
        send_ack_with(sink, &mut head, "/", conn, ack_id, ack.as_bytes(), &[]);
    }
    let may = |subj: &str| readable.as_ref().is_none_or(|r| r.allows_subject(subj));
    let sends = first.iter().filter(|e| may(&e.msg.subject)).map(Some);
    for e in sends.chain([None]) {
        send_watch_msg(sink, &mut head, &mut body, conn, sid, bucket, e);
    }
    Ok(Watch {
        conn,
        sid: sid.to_string(),
        stream: Rc::from(name),
        bucket: bucket.to_string(),
        consumer: Consumer::new(cfg, next),
        readable,
    })
}

impl Streams {
    /// Whether socket `conn` may start another watch.
    pub fn watch_room(&self, conn: ConnId) -> Result<(), ApiError> {
        if self.watches.iter().filter(|w| w.conn == conn).count() >= WATCHES_PER_CONN_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("a socket holds at most {WATCHES_PER_CONN_MAX} watches"),
            ));
        }
        Ok(())
    }

    /// Keeps a started watch (see [`start_watch`]).
    pub fn add_watch(&mut self, w: Watch) {
        self.watches.push(w);
    }

    /// Whether socket `conn` holds watch `sid`.
    pub fn has_watch(&self, conn: ConnId, sid: &str) -> bool {
        self.watches.iter().any(|w| w.conn == conn && w.sid == sid)
    }

    /// Ends watch `sid` of socket `conn`; false when there is none.
    pub fn unwatch(&mut self, conn: ConnId, sid: &str) -> bool {
        let before = self.watches.len();
        self.watches.retain(|w| !(w.conn == conn && w.sid == sid));
        self.watches.len() != before
    }

    /// The streams some watch reads.
    pub fn watched(&self) -> BTreeSet<Rc<str>> {
        crate::maps::set_of(self.watches.iter().map(|w| Rc::clone(&w.stream)))
    }

    /// The tap of R1 stream `name`: `None` when it is not held here.
    pub fn tap_of(&mut self, name: &str) -> Option<&mut Tap> {
        self.set.get_mut(name).map(|s| &mut s.stream.tap)
    }

    /// Turns off the taps of R1 streams no watch reads.
    pub fn untap(&mut self, watched: &BTreeSet<Rc<str>>) {
        for (name, slot) in self.set.iter_mut() {
            if slot.stream.tap.is_some() && !watched.contains(name.as_str()) {
                slot.stream.tap = None;
            }
        }
    }

    /// Hands the watches of stream `name` the writes `stored` holds (the
    /// stream's tap since they were last served), each to the watches
    /// whose keys it matches, in order; `None` (the stream is no longer
    /// here) ends them.
    pub fn feed_watches(&mut self, sink: &mut dyn Sink, name: &str, stored: Option<&[(u64, Msg)]>) {
        let now = sink.now();
        let (head, body) = (&mut self.head, &mut self.body);
        self.watches.retain_mut(|w| {
            if &*w.stream != name {
                return true;
            }
            let Some(stored) = stored else {
                return false;
            };
            let src = Tapped(stored);
            let mut events = Vec::new();
            while let Some(d) = w.consumer.next(now, &src, &mut events) {
                events.clear();
                let Some(e) = src.entry(d.seq) else {
                    continue;
                };
                if w.readable
                    .as_ref()
                    .is_none_or(|r| r.allows_subject(&e.msg.subject))
                {
                    send_watch_msg(sink, head, body, w.conn, &w.sid, &w.bucket, Some(&e));
                }
            }
            true
        });
    }
}
