//! One stream: its validated config, its messages in a segment
//! [`Store`], its limits (`max_msgs`, `max_bytes`, `max_age_ms`,
//! `max_msg_size`, `max_msgs_per_subject`, discard old or new, and the
//! bucket write rules of `limits.rs`), the `Msg-Id` duplicate window, its
//! consumers, and the retention rule that says when an acked message goes.
//! Time comes in as milliseconds since the Unix epoch; the only I/O is the
//! store's (buffered appends, reads of older messages).
//!
//! `bytes` (state and `max_bytes`) counts messages as stored, record
//! framing included; a stream configured without `max_bytes` is held to
//! [`STREAM_BYTES_DEFAULT_MAX`] so that no client can fill the disk.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use super::consumer::{Consumer, Source};
use super::dedup::IdWindow;
use super::limits;
use super::store::{Options, Store};
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::stream_messages::{Retention, StreamConfig};
use crate::protocol::subject;
use crate::storage::sync::Ticket;

/// The byte limit of a stream configured without `max_bytes` (16 GiB).
pub const STREAM_BYTES_DEFAULT_MAX: u64 = 16 << 30;
/// Most `Msg-Id`s remembered per stream; the oldest go first.
pub const DEDUP_IDS_MAX: usize = 100_000;
/// Most consumers per stream.
pub const CONSUMERS_PER_STREAM_MAX: usize = 1_000;
/// The header naming a message for duplicate detection.
pub const MSG_ID_HEADER: &str = "Msg-Id";

/// A message. `headers` is raw JSON text; `data` is raw JSON text, or the
/// bytes of a binary attachment when `binary` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub subject: Box<str>,
    pub data: Box<[u8]>,
    pub binary: bool,
    pub headers: Option<Box<str>>,
    pub time_ms: u64,
}

impl Msg {
    /// What counts against `max_msg_size`: the payload as the contract
    /// measures it (section 3), `data` (its JSON text, or its bytes when
    /// binary) plus `headers`.
    pub fn size(&self) -> u64 {
        payload_size(&self.data, self.headers.as_deref())
    }
}

/// The outcome of a publish captured by the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Stored as `seq`; `removed` lists what the limits (or interest
    /// retention without consumers, then `seq` itself) took out.
    New { seq: u64, removed: Vec<u64> },
    /// A duplicate `Msg-Id` inside the window: the first one's seq.
    Duplicate(u64),
}

/// A consumer and the last stream sequence that existed when it was made
/// (interest retention waits only for consumers older than a message).
#[derive(Debug)]
pub struct Member {
    pub consumer: Consumer,
    pub since: u64,
}

pub struct Stream {
    pub cfg: StreamConfig,
    store: Store,
    ids: IdWindow,
    pub consumers: BTreeMap<String, Member>,
    /// While a bucket watch reads this stream: a copy of each message
    /// stored since the watches were last served ([`Tap`]).
    pub tap: Tap,
}

/// Copies of the messages a stream stored, kept while something (a
/// bucket watch) must see every one of them even when a limit removes it
/// before it is read: `None` when nothing is tapping. Not stream state:
/// never written, never in a snapshot.
pub type Tap = Option<Vec<(u64, Msg)>>;

/// Adds message `seq` to a tap that is on.
pub fn tap_msg(
    tap: &mut Tap,
    seq: u64,
    subject: &str,
    data: &[u8],
    binary: bool,
    headers: Option<&str>,
    time_ms: u64,
) {
    if let Some(t) = tap.as_mut() {
        t.push((
            seq,
            Msg {
                subject: subject.into(),
                data: data.into(),
                binary,
                headers: headers.map(Into::into),
                time_ms,
            },
        ));
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("cfg", &self.cfg).finish()
    }
}

/// `stream.info`'s state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub messages: u64,
    pub bytes: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub consumer_count: usize,
}

fn store_err(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(Code::Internal, format!("stream store: {e}"))
}

impl Stream {
    /// Opens (or creates) the stream's store in `dir`, recovering what is
    /// there; the duplicate window is re-learned from recent messages.
    pub fn open(
        cfg: StreamConfig,
        dir: &Path,
        opts: Options,
        now_ms: u64,
    ) -> Result<Stream, String> {
        let (store, report) = Store::open(dir, opts).map_err(|e| e.to_string())?;
        for cut in &report.cuts {
            crate::log_warn!("stream {:?}: {cut}", cfg.name);
        }
        let mut s = Stream {
            cfg,
            store,
            ids: IdWindow::default(),
            consumers: BTreeMap::new(),
            tap: None,
        };
        s.relearn_ids(now_ms);
        Ok(s)
    }

    pub fn state(&self) -> State {
        let st = self.store.state();
        State {
            messages: st.messages,
            bytes: st.bytes,
            first_seq: st.first_seq,
            last_seq: st.last_seq,
            consumer_count: self.consumers.len(),
        }
    }

    pub fn last_seq(&self) -> u64 {
        self.store.state().last_seq
    }

    /// Whether a subject published belongs to this stream.
    pub fn captures(&self, subj: &str) -> bool {
        self.cfg.subjects.iter().any(|p| subject::matches(p, subj))
    }

    pub fn get(&self, seq: u64) -> Result<Option<Msg>, ApiError> {
        read_msg(&self.store, seq)
    }

    /// The newest message whose subject matches `subj` (a subject or a
    /// pattern).
    pub fn last_by_subject(&self, subj: &str) -> Result<Option<(u64, Msg)>, ApiError> {
        let seq = if subject::has_wildcard(subj) {
            let names: Vec<String> = self
                .store
                .subjects()
                .filter(|(n, _)| subject::matches(subj, n))
                .map(|(n, _)| n.to_string())
                .collect();
            names
                .iter()
                .filter_map(|n| self.store.last_seq_for_subject(n))
                .max()
        } else {
            self.store.last_seq_for_subject(subj)
        };
        let Some(seq) = seq else { return Ok(None) };
        Ok(self.get(seq)?.map(|m| (seq, m)))
    }

    /// Stores a captured publish made at `now_ms` (buffered;
    /// [`Stream::flush`] writes it). `headers` is raw JSON; `data` is raw
    /// JSON, or an attachment's bytes when `binary`.
    pub fn store(
        &mut self,
        subject: &str,
        data: &[u8],
        binary: bool,
        headers: Option<&str>,
        now_ms: u64,
    ) -> Result<Stored, ApiError> {
        let size = limits::check_size(&self.cfg, subject, data, headers)?;
        let id = self.msg_id(headers);
        if let Some(id) = &id {
            self.ids.forget(now_ms, self.cfg.duplicate_window_ms);
            if let Some(seq) = self.ids.get(id.as_str()) {
                return Ok(Stored::Duplicate(seq));
            }
        }
        let asks = limits::asks_of(headers);
        if asks.expected.is_some() {
            let latest = self.latest_of(subject)?;
            limits::check_revision(subject, asks.expected, latest)?;
        }
        let st = self.store.state();
        limits::check_room(&self.cfg, st.messages, st.bytes, size)?;
        let seq = self
            .store
            .append(subject, headers, data, binary, now_ms)
            .map_err(store_err)?;
        if let Some(id) = id {
            self.ids.remember(id.into_boxed_str(), seq, now_ms);
        }
        tap_msg(&mut self.tap, seq, subject, data, binary, headers, now_ms);
        let mut removed = Vec::new();
        if self.cfg.retention == Retention::Interest
            && !limits::has_interest(&self.consumers, subject)
        {
            self.store.remove(seq).map_err(store_err)?;
            removed.push(seq);
            return Ok(Stored::New { seq, removed });
        }
        let mut held = Trimmed {
            cfg: &self.cfg,
            store: &mut self.store,
        };
        limits::trim(&mut held, subject, seq, asks.op, &mut removed)?;
        Ok(Stored::New { seq, removed })
    }

    /// The newest message of exactly `subject`: its seq, and whether it
    /// is a delete or purge marker (read back to see its headers).
    fn latest_of(&self, subject: &str) -> Result<Option<(u64, bool)>, ApiError> {
        let Some(seq) = self.store.last_seq_for_subject(subject) else {
            return Ok(None);
        };
        let m = self.store.get(seq).map_err(store_err)?;
        let op = limits::asks_of(m.and_then(|m| m.headers).as_deref()).op;
        Ok(Some((seq, op != limits::KvOp::Put)))
    }

    /// The last live seq of each subject matching `filter` (a subject or
    /// a pattern), in seq order: a bucket's keys and a watch's start.
    pub fn last_per_subject(&self, filter: &str) -> Vec<u64> {
        let mut seqs: Vec<u64> = self
            .store
            .subjects()
            .filter(|(n, _)| subject::matches(filter, n))
            .filter_map(|(n, _)| self.store.last_seq_for_subject(n))
            .collect();
        seqs.sort_unstable();
        seqs
    }

    /// Every live seq of exactly `subject`, oldest first.
    pub fn seqs_of(&self, subj: &str) -> Vec<u64> {
        let mut out = Vec::new();
        let Some(mut at) = self.store.first_seq_for_subject(subj) else {
            return out;
        };
        let n = self.store.subject_count(subj);
        while out.len() < n as usize {
            match self.store.next_matching(at, |s| s == subj) {
                Some(seq) => {
                    out.push(seq);
                    at = seq + 1;
                }
                None => break,
            }
        }
        out
    }

    /// Writes what was buffered (one write(2)); the ticket of the fsync
    /// round that covers it. Then one bounded compaction step of the
    /// store's sealed segments, when one is due (a failure there is
    /// logged: what was written stays written).
    pub fn flush(&mut self) -> io::Result<Ticket> {
        let t = self.store.flush()?;
        if let Err(e) = self.store.compact_step() {
            crate::log_warn!("stream {:?}: compaction: {e}", self.cfg.name);
        }
        Ok(t)
    }

    fn relearn_ids(&mut self, now_ms: u64) {
        let window = self.cfg.duplicate_window_ms;
        if window == 0 {
            return;
        }
        let st = self.store.state();
        let mut seq = st.last_seq;
        let mut found = Vec::new();
        while seq >= st.first_seq && seq > 0 && found.len() < DEDUP_IDS_MAX {
            match self.store.meta(seq) {
                Some((_, t)) if t + window <= now_ms => break,
                Some((_, t)) => {
                    let headers = self.store.get(seq).ok().flatten().and_then(|m| m.headers);
                    if let Some(id) = self.msg_id(headers.as_deref()) {
                        found.push((id, seq, t));
                    }
                }
                None => {}
            }
            seq -= 1;
        }
        for (id, seq, t) in found.into_iter().rev() {
            self.ids.remember(id.into_boxed_str(), seq, t);
        }
    }

    fn msg_id(&self, headers: Option<&str>) -> Option<String> {
        if self.cfg.duplicate_window_ms == 0 {
            return None;
        }
        msg_id_of(headers)
    }

    /// Drops messages older than `max_age_ms` and forgets `Msg-Id`s past
    /// the duplicate window; returns the seqs dropped.
    pub fn expire(&mut self, now_ms: u64) -> Result<Vec<u64>, ApiError> {
        self.ids.forget(now_ms, self.cfg.duplicate_window_ms);
        let mut removed = Vec::new();
        if self.cfg.max_age_ms == 0 {
            return Ok(removed);
        }
        loop {
            let first = self.store.state().first_seq;
            match self.store.meta(first) {
                Some((_, t)) if t + self.cfg.max_age_ms <= now_ms => {
                    self.store.remove(first).map_err(store_err)?;
                    removed.push(first);
                }
                _ => return Ok(removed),
            }
        }
    }

    /// When the oldest message will be past `max_age_ms` (ms since epoch).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        if self.cfg.max_age_ms == 0 {
            return None;
        }
        let (_, t) = self.store.meta(self.store.state().first_seq)?;
        Some(t + self.cfg.max_age_ms)
    }

    pub fn remove(&mut self, seq: u64) -> Result<bool, ApiError> {
        self.store.remove(seq).map_err(store_err)
    }

    /// `stream.purge`: every message, or those whose subject matches.
    pub fn purge(&mut self, filter: Option<&str>) -> Result<u64, ApiError> {
        match filter {
            None => self.store.purge(),
            Some(f) => self.store.purge_subjects(|s| subject::matches(f, s)),
        }
        .map_err(store_err)
    }

    /// Whether an acked `seq` may go under the stream's retention.
    pub fn done_with(&self, seq: u64) -> bool {
        let subj = self.store.meta(seq).map(|(s, _)| s);
        limits::done_with(&self.cfg, &self.consumers, seq, subj)
    }

    /// Messages matching `filter` with a seq `>= from` (for `num_pending`).
    pub fn count_from(&self, from: u64, filter: Option<&str>) -> u64 {
        let st = self.store.state();
        if filter.is_none() && from <= st.first_seq {
            return st.messages;
        }
        let mut n = 0;
        let mut at = from;
        while let Some(seq) = self.next_matching(at, filter) {
            n += 1;
            at = seq + 1;
        }
        n
    }

    /// Every stored seq (interest retention re-checks them when a consumer
    /// goes away).
    pub fn seqs(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(seq) = self.store.next_matching(at, |_| true) {
            out.push(seq);
            at = seq + 1;
        }
        out
    }

    /// The messages and one consumer, borrowed apart.
    pub fn split(&mut self, consumer: &str) -> Option<(Msgs<'_>, &mut Member)> {
        let member = self.consumers.get_mut(consumer)?;
        Some((Msgs { store: &self.store }, member))
    }
}

/// A stream's store under its config, as [`limits::trim`] sees it.
struct Trimmed<'a> {
    cfg: &'a StreamConfig,
    store: &'a mut Store,
}

impl limits::Held for Trimmed<'_> {
    fn config(&self) -> &StreamConfig {
        self.cfg
    }
    fn messages(&self) -> u64 {
        self.store.state().messages
    }
    fn bytes(&self) -> u64 {
        self.store.state().bytes
    }
    fn first_seq(&self) -> u64 {
        self.store.state().first_seq
    }
    fn subject_count(&self, subject: &str) -> u64 {
        self.store.subject_count(subject)
    }
    fn oldest_of(&self, subject: &str) -> Option<u64> {
        self.store.first_seq_for_subject(subject)
    }
    fn remove_seq(&mut self, seq: u64) -> Result<(), ApiError> {
        self.store.remove(seq).map(|_| ()).map_err(store_err)
    }
}

/// The `Msg-Id` header of a message's raw JSON headers, if any.
pub fn msg_id_of(headers: Option<&str>) -> Option<String> {
    let map: HashMap<String, String> = serde_json::from_str(headers?).ok()?;
    map.get(MSG_ID_HEADER).cloned()
}

/// The JSON text of `data` plus `headers`, in bytes.
pub fn payload_size(data: &[u8], headers: Option<&str>) -> u64 {
    (data.len() + headers.map_or(0, str::len)) as u64
}

fn read_msg(store: &Store, seq: u64) -> Result<Option<Msg>, ApiError> {
    let Some(m) = store.get(seq).map_err(store_err)? else {
        return Ok(None);
    };
    if !m.binary {
        // JSON text goes out inline in text frames: it must be UTF-8.
        std::str::from_utf8(&m.data).map_err(store_err)?;
    }
    Ok(Some(Msg {
        subject: m.subject.into(),
        data: m.data.into(),
        binary: m.binary,
        headers: m.headers.map(Into::into),
        time_ms: m.time_ms,
    }))
}

fn next_in(store: &Store, from: u64, filter: Option<&str>) -> Option<u64> {
    match filter {
        None => store.next_matching(from, |_| true),
        Some(f) => store.next_matching(from, |s| subject::matches(f, s)),
    }
}

impl Source for Stream {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        next_in(&self.store, from, filter)
    }

    fn contains(&self, seq: u64) -> bool {
        self.store.meta(seq).is_some()
    }

    fn last_seq(&self) -> u64 {
        self.store.state().last_seq
    }
}

/// A read-only view of a stream's messages, borrowed apart from its
/// consumers.
pub struct Msgs<'a> {
    store: &'a Store,
}

impl Msgs<'_> {
    pub fn get(&self, seq: u64) -> Result<Option<Msg>, ApiError> {
        read_msg(self.store, seq)
    }
}

impl Source for Msgs<'_> {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        next_in(self.store, from, filter)
    }

    fn contains(&self, seq: u64) -> bool {
        self.store.meta(seq).is_some()
    }

    fn last_seq(&self) -> u64 {
        self.store.state().last_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::read_config;

    fn stream(v: serde_json::Value) -> Stream {
        let serde_json::Value::Object(m) = v else {
            panic!("object")
        };
        let mut c: StreamConfig = read_config(m).unwrap();
        c.validate().unwrap();
        Stream::open(c, &temp_dir(), Options::default(), 0).unwrap()
    }

    fn temp_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "gombus-stream-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    #[test]
    fn sequences_and_state() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a.>"]}));
        assert_eq!((s.state().first_seq, s.state().last_seq), (0, 0));
        assert!(s.captures("a.b") && !s.captures("b"));
        assert_eq!(
            s.store("a.b", b"1", false, None, 0).unwrap(),
            Stored::New {
                seq: 1,
                removed: vec![]
            }
        );
        s.store("a.c", b"2", false, None, 0).unwrap();
        assert_eq!(s.last_by_subject("a.b").unwrap().map(|(q, _)| q), Some(1));
        assert_eq!(s.last_by_subject("a.*").unwrap().map(|(q, _)| q), Some(2));
        assert_eq!(s.get(2).unwrap().map(|m| m.data), Some(b"2"[..].into()));
        assert_eq!(s.purge(Some("a.c")).unwrap(), 1);
        assert_eq!(s.purge(None).unwrap(), 1);
        let st = s.state();
        assert_eq!((st.messages, st.first_seq, st.last_seq), (0, 3, 2));
    }

    #[test]
    fn limits_discard_old_and_new() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a"],"max_msgs":2}));
        for i in 0..3 {
            s.store("a", i.to_string().as_bytes(), false, None, 0)
                .unwrap();
        }
        assert_eq!(s.state().first_seq, 2);
        let mut n =
            stream(serde_json::json!({"name":"N","subjects":["a"],"max_bytes":4,"discard":"new"}));
        n.store("a", b"12", false, None, 0).unwrap();
        assert_eq!(
            n.store("a", b"34", false, None, 0).unwrap_err().code,
            Code::Limit
        );
        // max_msg_size counts the payload (data and headers), not the
        // subject.
        let mut z = stream(serde_json::json!({"name":"Z","subjects":["a.>"],"max_msg_size":10}));
        z.store("a.long.subject", b"1234567890", false, None, 0)
            .unwrap();
        z.store("a.b", b"1", false, Some(r#"{"h":""}"#), 0).unwrap();
        assert_eq!(
            z.store("a.b", b"12345678901", false, None, 0)
                .unwrap_err()
                .code,
            Code::PayloadTooLarge
        );
        assert_eq!(
            z.store("a.b", b"123", false, Some(r#"{"h":""}"#), 0)
                .unwrap_err()
                .code,
            Code::PayloadTooLarge
        );
    }

    #[test]
    fn binary_data_is_stored_as_bytes_and_measured_by_them() {
        let mut s = stream(serde_json::json!({"name":"B","subjects":["b"],"max_msg_size":4}));
        // Not UTF-8, and longer as JSON text than the limit would allow.
        let bytes = [0xff, 0x00, 0xfe, 0x80];
        assert_eq!(
            s.store("b", &bytes, true, None, 7).unwrap(),
            Stored::New {
                seq: 1,
                removed: vec![]
            }
        );
        assert_eq!(
            s.store("b", &[0; 5], true, None, 7).unwrap_err().code,
            Code::PayloadTooLarge
        );
        s.store("b", b"12", false, None, 8).unwrap();
        let m = s.get(1).unwrap().unwrap();
        assert!(m.binary);
        assert_eq!(&*m.data, &bytes);
        assert_eq!(m.size(), 4);
        let j = s.get(2).unwrap().unwrap();
        assert!(!j.binary);
        assert_eq!(&*j.data, b"12");
    }

    #[test]
    fn age_and_dedup_window() {
        let mut s = stream(
            serde_json::json!({"name":"S","subjects":["a"],"max_age_ms":100,"duplicate_window_ms":50}),
        );
        let h = Some(r#"{"Msg-Id":"x"}"#);
        s.store("a", b"1", false, h, 1000).unwrap();
        assert_eq!(
            s.store("a", b"1", false, h, 1010).unwrap(),
            Stored::Duplicate(1)
        );
        assert!(s.expire(1049).unwrap().is_empty());
        assert_eq!(
            s.store("a", b"1", false, h, 1050).unwrap(),
            Stored::New {
                seq: 2,
                removed: vec![]
            }
        );
        assert_eq!(s.expire(1100).unwrap(), vec![1]);
        assert_eq!(s.next_expiry_ms(), Some(1150));
    }

    #[test]
    fn per_subject_limit_compare_and_set_and_purge_markers() {
        let mut s = stream(
            serde_json::json!({"name":"KV_b","subjects":["$KV.b.>"],"max_msgs_per_subject":2}),
        );
        let put = |s: &mut Stream, k: &str, h: Option<&str>| s.store(k, b"1", false, h, 0);
        for _ in 0..3 {
            put(&mut s, "$KV.b.x", None).unwrap();
        }
        put(&mut s, "$KV.b.y", None).unwrap();
        // x keeps its two newest; y is untouched.
        assert_eq!(s.seqs_of("$KV.b.x"), vec![2, 3]);
        assert_eq!(s.seqs_of("$KV.b.y"), vec![4]);
        assert_eq!(s.last_per_subject("$KV.b.>"), vec![3, 4]);
        // Compare-and-set: only the latest revision (or 0 for a new key).
        let cas = |n: u64| format!(r#"{{"KV-Expected-Revision":"{n}"}}"#);
        let e = put(&mut s, "$KV.b.x", Some(&cas(2))).unwrap_err();
        assert_eq!((e.code, e.revision), (Code::WrongRevision, Some(3)));
        let e = put(&mut s, "$KV.b.z", Some(&cas(3))).unwrap_err();
        assert_eq!((e.code, e.revision), (Code::WrongRevision, Some(0)));
        assert_eq!(s.state().last_seq, 4, "a refused write stores nothing");
        put(&mut s, "$KV.b.x", Some(&cas(3))).unwrap();
        put(&mut s, "$KV.b.z", Some(&cas(0))).unwrap();
        // A delete marker lets 0 stand for "no value" again.
        put(&mut s, "$KV.b.z", Some(r#"{"KV-Operation":"DEL"}"#)).unwrap();
        assert_eq!(s.seqs_of("$KV.b.z"), vec![6, 7]);
        put(&mut s, "$KV.b.z", Some(&cas(0))).unwrap();
        // A purge marker takes every earlier write of its key.
        let purged = put(&mut s, "$KV.b.x", Some(r#"{"KV-Operation":"PURGE"}"#)).unwrap();
        assert_eq!(
            purged,
            Stored::New {
                seq: 9,
                removed: vec![3, 5]
            }
        );
        assert_eq!(s.seqs_of("$KV.b.x"), vec![9]);
        put(&mut s, "$KV.b.x", Some(&cas(0))).unwrap();
    }

    #[test]
    fn interest_without_consumers_keeps_nothing() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a"],"retention":"interest"}));
        assert_eq!(
            s.store("a", b"1", false, None, 0).unwrap(),
            Stored::New {
                seq: 1,
                removed: vec![1]
            }
        );
        assert_eq!(s.state().messages, 0);
    }
}
