//! One stream, pure (no I/O; time comes in as milliseconds since the Unix
//! epoch): its validated config, the messages it holds, its limits
//! (`max_msgs`, `max_bytes`, `max_age_ms`, `max_msg_size`, discard old or
//! new), the `Msg-Id` duplicate window, its consumers, and the retention
//! rule that says when an acked message goes.
//!
//! Messages are kept in memory as well as on disk (the store is the
//! durable copy, read back at start-up), so a stream without `max_bytes`
//! is held to [`STREAM_BYTES_DEFAULT_MAX`].

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::consumer::{Consumer, Source};
use crate::broker::subject;
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::stream_messages::{Discard, Retention, StreamConfig};

/// The byte limit of a stream configured without `max_bytes` (1 GiB):
/// memory stays bounded whatever clients publish.
pub const STREAM_BYTES_DEFAULT_MAX: u64 = 1 << 30;
/// Most `Msg-Id`s remembered per stream; the oldest go first.
pub const DEDUP_IDS_MAX: usize = 100_000;
/// Most consumers per stream.
pub const CONSUMERS_PER_STREAM_MAX: usize = 1_000;
/// The header naming a message for duplicate detection.
pub const MSG_ID_HEADER: &str = "Msg-Id";

/// A stored message. `data` and `headers` are raw JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub subject: Box<str>,
    pub data: Box<str>,
    pub headers: Option<Box<str>>,
    pub time_ms: u64,
}

impl Msg {
    /// What counts against `max_bytes` and `max_msg_size`.
    pub fn size(&self) -> u64 {
        (self.subject.len() + self.data.len() + self.headers.as_ref().map_or(0, |h| h.len())) as u64
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

#[derive(Debug)]
pub struct Stream {
    pub cfg: StreamConfig,
    msgs: BTreeMap<u64, Msg>,
    bytes: u64,
    last_seq: u64,
    dedup: HashMap<Box<str>, (u64, u64)>,
    dedup_order: VecDeque<(u64, Box<str>)>,
    pub consumers: BTreeMap<String, Member>,
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

impl Stream {
    pub fn new(cfg: StreamConfig) -> Stream {
        Stream {
            cfg,
            msgs: BTreeMap::new(),
            bytes: 0,
            last_seq: 0,
            dedup: HashMap::new(),
            dedup_order: VecDeque::new(),
            consumers: BTreeMap::new(),
        }
    }

    pub fn state(&self) -> State {
        State {
            messages: self.msgs.len() as u64,
            bytes: self.bytes,
            first_seq: self.first_seq(),
            last_seq: self.last_seq,
            consumer_count: self.consumers.len(),
        }
    }

    /// The first stored seq; `last_seq + 1` when empty (0 when new).
    pub fn first_seq(&self) -> u64 {
        match self.msgs.keys().next() {
            Some(&s) => s,
            None if self.last_seq == 0 => 0,
            None => self.last_seq + 1,
        }
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Whether a subject published belongs to this stream.
    pub fn captures(&self, subj: &str) -> bool {
        self.cfg.subjects.iter().any(|p| subject::matches(p, subj))
    }

    pub fn get(&self, seq: u64) -> Option<Msg> {
        self.msgs.get(&seq).cloned()
    }

    /// The newest message on exactly `subj` (or matching it, if a pattern).
    pub fn last_by_subject(&self, subj: &str) -> Option<(u64, Msg)> {
        self.msgs
            .iter()
            .rev()
            .find(|(_, m)| subject::matches(subj, &m.subject))
            .map(|(&s, m)| (s, m.clone()))
    }

    fn bytes_max(&self) -> u64 {
        match self.cfg.max_bytes {
            0 => STREAM_BYTES_DEFAULT_MAX,
            n => n.min(STREAM_BYTES_DEFAULT_MAX),
        }
    }

    /// Stores a captured publish.
    pub fn store(&mut self, msg: Msg, now_ms: u64) -> Result<Stored, ApiError> {
        let size = msg.size();
        if self.cfg.max_msg_size > 0 && size > self.cfg.max_msg_size {
            return Err(ApiError::new(
                Code::PayloadTooLarge,
                format!(
                    "message is {size} bytes, stream {:?} takes at most {}",
                    self.cfg.name, self.cfg.max_msg_size
                ),
            ));
        }
        let id = self.msg_id(&msg);
        if let Some(id) = &id {
            self.forget_ids(now_ms);
            if let Some(&(seq, _)) = self.dedup.get(id.as_str()) {
                return Ok(Stored::Duplicate(seq));
            }
        }
        let full = (self.cfg.max_msgs > 0 && self.msgs.len() as u64 >= self.cfg.max_msgs)
            || self.bytes + size > self.bytes_max();
        if full && self.cfg.discard == Discard::New {
            return Err(ApiError::new(
                Code::Limit,
                format!("stream {:?} is full (discard new)", self.cfg.name),
            ));
        }
        if size > self.bytes_max() {
            return Err(ApiError::new(
                Code::Limit,
                format!(
                    "message is larger than stream {:?}'s max_bytes",
                    self.cfg.name
                ),
            ));
        }
        self.last_seq += 1;
        let seq = self.last_seq;
        if let Some(id) = id {
            self.remember(id.into_boxed_str(), seq, now_ms);
        }
        let mut removed = Vec::new();
        if self.cfg.retention == Retention::Interest && !self.has_interest(&msg.subject) {
            removed.push(seq);
            return Ok(Stored::New { seq, removed });
        }
        self.insert(seq, msg);
        self.enforce_limits(&mut removed);
        Ok(Stored::New { seq, removed })
    }

    /// Puts a message back at start-up (no limits, no dedup window: the
    /// store holds what was accepted).
    pub fn insert(&mut self, seq: u64, msg: Msg) {
        self.bytes += msg.size();
        if let Some(old) = self.msgs.insert(seq, msg) {
            self.bytes -= old.size();
        }
        self.last_seq = self.last_seq.max(seq);
    }

    /// Raises `last_seq` (a recovered stream whose tail was removed).
    pub fn set_last_seq(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// Re-learns the `Msg-Id` of a recovered message.
    pub fn recover_msg_id(&mut self, seq: u64, now_ms: u64) {
        let Some(msg) = self.msgs.get(&seq) else {
            return;
        };
        if let Some(id) = self.msg_id(msg) {
            if msg.time_ms + self.cfg.duplicate_window_ms > now_ms {
                let t = msg.time_ms;
                self.remember(id.into_boxed_str(), seq, t);
            }
        }
    }

    fn msg_id(&self, msg: &Msg) -> Option<String> {
        if self.cfg.duplicate_window_ms == 0 {
            return None;
        }
        let h = msg.headers.as_deref()?;
        let map: HashMap<String, String> = serde_json::from_str(h).ok()?;
        map.get(MSG_ID_HEADER).cloned()
    }

    fn forget_ids(&mut self, now_ms: u64) {
        let window = self.cfg.duplicate_window_ms;
        while let Some((t, _)) = self.dedup_order.front() {
            if t + window > now_ms {
                break;
            }
            if let Some((_, id)) = self.dedup_order.pop_front() {
                self.dedup.remove(&id);
            }
        }
    }

    fn remember(&mut self, id: Box<str>, seq: u64, time_ms: u64) {
        if self.dedup_order.len() >= DEDUP_IDS_MAX {
            if let Some((_, old)) = self.dedup_order.pop_front() {
                self.dedup.remove(&old);
            }
        }
        self.dedup.insert(id.clone(), (seq, time_ms));
        self.dedup_order.push_back((time_ms, id));
    }

    fn has_interest(&self, subj: &str) -> bool {
        self.consumers.values().any(|m| {
            m.consumer
                .cfg
                .filter_subject
                .as_deref()
                .is_none_or(|f| subject::matches(f, subj))
        })
    }

    fn enforce_limits(&mut self, removed: &mut Vec<u64>) {
        while (self.cfg.max_msgs > 0 && self.msgs.len() as u64 > self.cfg.max_msgs)
            || self.bytes > self.bytes_max()
        {
            let Some((seq, m)) = self.msgs.pop_first() else {
                break;
            };
            self.bytes -= m.size();
            removed.push(seq);
        }
    }

    /// Drops messages older than `max_age_ms` and forgets `Msg-Id`s past
    /// the duplicate window.
    pub fn expire(&mut self, now_ms: u64) -> Vec<u64> {
        self.forget_ids(now_ms);
        let mut removed = Vec::new();
        if self.cfg.max_age_ms == 0 {
            return removed;
        }
        while let Some((&seq, m)) = self.msgs.first_key_value() {
            if m.time_ms + self.cfg.max_age_ms > now_ms {
                break;
            }
            self.remove(seq);
            removed.push(seq);
        }
        removed
    }

    /// When the oldest message will be past `max_age_ms` (ms since epoch).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        if self.cfg.max_age_ms == 0 {
            return None;
        }
        let (_, m) = self.msgs.first_key_value()?;
        Some(m.time_ms + self.cfg.max_age_ms)
    }

    pub fn remove(&mut self, seq: u64) -> bool {
        match self.msgs.remove(&seq) {
            Some(m) => {
                self.bytes -= m.size();
                true
            }
            None => false,
        }
    }

    /// `stream.purge`: every message, or those whose subject matches.
    pub fn purge(&mut self, filter: Option<&str>) -> Vec<u64> {
        let seqs: Vec<u64> = match filter {
            None => self.msgs.keys().copied().collect(),
            Some(f) => self
                .msgs
                .iter()
                .filter(|(_, m)| subject::matches(f, &m.subject))
                .map(|(&s, _)| s)
                .collect(),
        };
        for &s in &seqs {
            self.remove(s);
        }
        seqs
    }

    /// Whether an acked `seq` may go under the stream's retention.
    pub fn done_with(&self, seq: u64) -> bool {
        match self.cfg.retention {
            Retention::Limits => false,
            Retention::Workqueue => true,
            Retention::Interest => {
                let Some(msg) = self.msgs.get(&seq) else {
                    return false;
                };
                self.consumers.values().all(|m| {
                    let c = &m.consumer;
                    let wants = m.since < seq
                        && c.cfg
                            .filter_subject
                            .as_deref()
                            .is_none_or(|f| subject::matches(f, &msg.subject));
                    !wants || c.has_acked(seq)
                })
            }
        }
    }

    /// Messages matching `filter` with a seq `>= from` (for `num_pending`).
    pub fn count_from(&self, from: u64, filter: Option<&str>) -> u64 {
        let range = self.msgs.range(from..);
        match filter {
            None => range.count() as u64,
            Some(f) => range
                .filter(|(_, m)| subject::matches(f, &m.subject))
                .count() as u64,
        }
    }

    /// Every stored seq (interest retention re-checks them when a consumer
    /// goes away).
    pub fn seqs(&self) -> Vec<u64> {
        self.msgs.keys().copied().collect()
    }
}

impl Source for Stream {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        let mut range = self.msgs.range(from..);
        match filter {
            None => range.next().map(|(&s, _)| s),
            Some(f) => range
                .find(|(_, m)| subject::matches(f, &m.subject))
                .map(|(&s, _)| s),
        }
    }

    fn contains(&self, seq: u64) -> bool {
        self.msgs.contains_key(&seq)
    }

    fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

/// A read-only view of a stream's messages for consumers: it lets the
/// caller borrow one consumer mutably while the messages are read.
pub struct Msgs<'a> {
    msgs: &'a BTreeMap<u64, Msg>,
    last_seq: u64,
}

impl Stream {
    /// The messages and one consumer, borrowed apart.
    pub fn split(&mut self, consumer: &str) -> Option<(Msgs<'_>, &mut Member)> {
        let member = self.consumers.get_mut(consumer)?;
        Some((
            Msgs {
                msgs: &self.msgs,
                last_seq: self.last_seq,
            },
            member,
        ))
    }
}

impl Msgs<'_> {
    pub fn get(&self, seq: u64) -> Option<Msg> {
        self.msgs.get(&seq).cloned()
    }
}

impl Source for Msgs<'_> {
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
        let mut range = self.msgs.range(from..);
        match filter {
            None => range.next().map(|(&s, _)| s),
            Some(f) => range
                .find(|(_, m)| subject::matches(f, &m.subject))
                .map(|(&s, _)| s),
        }
    }

    fn contains(&self, seq: u64) -> bool {
        self.msgs.contains_key(&seq)
    }

    fn last_seq(&self) -> u64 {
        self.last_seq
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
        Stream::new(c)
    }

    fn msg(subj: &str, data: &str, headers: Option<&str>, t: u64) -> Msg {
        Msg {
            subject: subj.into(),
            data: data.into(),
            headers: headers.map(Into::into),
            time_ms: t,
        }
    }

    #[test]
    fn sequences_and_state() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a.>"]}));
        assert_eq!((s.state().first_seq, s.state().last_seq), (0, 0));
        assert!(s.captures("a.b") && !s.captures("b"));
        assert_eq!(
            s.store(msg("a.b", "1", None, 0), 0).unwrap(),
            Stored::New {
                seq: 1,
                removed: vec![]
            }
        );
        s.store(msg("a.c", "2", None, 0), 0).unwrap();
        assert_eq!(s.last_by_subject("a.b").map(|(q, _)| q), Some(1));
        assert_eq!(s.purge(Some("a.c")), vec![2]);
        assert_eq!(s.purge(None), vec![1]);
        let st = s.state();
        assert_eq!((st.messages, st.first_seq, st.last_seq), (0, 3, 2));
    }

    #[test]
    fn limits_discard_old_and_new() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a"],"max_msgs":2}));
        for i in 0..3 {
            s.store(msg("a", &i.to_string(), None, 0), 0).unwrap();
        }
        assert_eq!(s.state().first_seq, 2);
        let mut n =
            stream(serde_json::json!({"name":"N","subjects":["a"],"max_bytes":4,"discard":"new"}));
        n.store(msg("a", "12", None, 0), 0).unwrap();
        assert_eq!(
            n.store(msg("a", "34", None, 0), 0).unwrap_err().code,
            Code::Limit
        );
        let mut z = stream(serde_json::json!({"name":"Z","subjects":["a"],"max_msg_size":3}));
        assert_eq!(
            z.store(msg("a", "123", None, 0), 0).unwrap_err().code,
            Code::PayloadTooLarge
        );
    }

    #[test]
    fn age_and_dedup_window() {
        let mut s = stream(
            serde_json::json!({"name":"S","subjects":["a"],"max_age_ms":100,"duplicate_window_ms":50}),
        );
        let h = Some(r#"{"Msg-Id":"x"}"#);
        s.store(msg("a", "1", h, 1000), 1000).unwrap();
        assert_eq!(
            s.store(msg("a", "1", h, 1010), 1010).unwrap(),
            Stored::Duplicate(1)
        );
        assert!(s.expire(1049).is_empty());
        assert_eq!(
            s.store(msg("a", "1", h, 1050), 1050).unwrap(),
            Stored::New {
                seq: 2,
                removed: vec![]
            }
        );
        assert_eq!(s.expire(1100), vec![1]);
        assert_eq!(s.next_expiry_ms(), Some(1150));
    }

    #[test]
    fn interest_without_consumers_keeps_nothing() {
        let mut s = stream(serde_json::json!({"name":"S","subjects":["a"],"retention":"interest"}));
        assert_eq!(
            s.store(msg("a", "1", None, 0), 0).unwrap(),
            Stored::New {
                seq: 1,
                removed: vec![1]
            }
        );
        assert_eq!(s.state().messages, 0);
    }
}
