//! The rules of a stream's limits and retention, written once for both
//! kinds of stream: an R1 stream over its segment store (`stream.rs`) and
//! a replica of a replicated stream over its index (`replica.rs`). Each
//! asks these functions with its own counts, or lets [`trim`] remove
//! through its [`Held`], so the two give the same outcome for the same
//! publishes (a unit test in `replica.rs` runs the same publishes through
//! both and compares every outcome). Pure.
//!
//! The write rules of key-value buckets are here too, since they are
//! decided where the sequence is: a publish may carry the revision it
//! expects its subject to be at ([`EXPECTED_REVISION_HEADER`]), refused
//! with `wrong_revision` otherwise, and a purge marker
//! ([`KV_OP_HEADER`] `PURGE`) removes every earlier message of its
//! subject once stored.

use std::collections::BTreeMap;

use super::stream::{payload_size, Member, STREAM_BYTES_DEFAULT_MAX};
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::stream_messages::{Discard, Retention, StreamConfig};
use crate::protocol::subject;

/// The bytes a stream may hold: its `max_bytes`, or the default cap.
pub fn bytes_max(cfg: &StreamConfig) -> u64 {
    match cfg.max_bytes {
        0 => STREAM_BYTES_DEFAULT_MAX,
        n => n.min(STREAM_BYTES_DEFAULT_MAX),
    }
}

/// `max_msg_size`, checked first: the size a publish counts for against
/// `max_bytes` (its subject and payload), or `payload_too_large`.
pub fn check_size(
    cfg: &StreamConfig,
    subject: &str,
    data: &[u8],
    headers: Option<&str>,
) -> Result<u64, ApiError> {
    let payload = payload_size(data, headers);
    if cfg.max_msg_size > 0 && payload > cfg.max_msg_size {
        return Err(ApiError::new(
            Code::PayloadTooLarge,
            format!(
                "message payload is {payload} bytes, stream {:?} takes at most {}",
                cfg.name, cfg.max_msg_size
            ),
        ));
    }
    Ok(subject.len() as u64 + payload)
}

/// Whether a publish of `size` fits a stream holding `messages` messages
/// and `bytes` bytes (checked after the `Msg-Id` window, so a duplicate
/// is answered as one even when the stream is full): a full stream that
/// discards new refuses it, and so does any stream for a message larger
/// than `max_bytes`.
#[inline]
pub fn check_room(
    cfg: &StreamConfig,
    messages: u64,
    bytes: u64,
    size: u64,
) -> Result<(), ApiError> {
    let full = (cfg.max_msgs > 0 && messages >= cfg.max_msgs) || bytes + size > bytes_max(cfg);
    if full && cfg.discard == Discard::New {
        return Err(ApiError::new(
            Code::Limit,
            format!("stream {:?} is full (discard new)", cfg.name),
        ));
    }
    if size > bytes_max(cfg) {
        return Err(ApiError::new(
            Code::Limit,
            format!("message is larger than stream {:?}'s max_bytes", cfg.name),
        ));
    }
    Ok(())
}

/// After a store: whether the oldest message must go (discard old). The
/// message just stored stays even if it alone is over.
pub fn over(cfg: &StreamConfig, messages: u64, bytes: u64) -> bool {
    let over = (cfg.max_msgs > 0 && messages > cfg.max_msgs) || bytes > bytes_max(cfg);
    over && messages > 1
}

pub use crate::protocol::kv_messages::{EXPECTED_REVISION_HEADER, KV_OP_HEADER};

/// What a bucket write is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOp {
    Put,
    Delete,
    Purge,
}

impl KvOp {
    pub fn as_str(self) -> &'static str {
        match self {
            KvOp::Put => "put",
            KvOp::Delete => "delete",
            KvOp::Purge => "purge",
        }
    }
}

/// What a publish's headers ask of the write rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asks {
    pub op: KvOp,
    /// The revision the subject must be at.
    pub expected: Option<u64>,
}

/// Reads [`Asks`] from raw JSON headers (an object of strings); headers
/// without them (or not an object) ask nothing.
#[inline]
pub fn asks_of(headers: Option<&str>) -> Asks {
    let mut asks = Asks {
        op: KvOp::Put,
        expected: None,
    };
    let Some(h) = headers else { return asks };
    if !h.contains("KV-") {
        return asks;
    }
    let Ok(map) = serde_json::from_str::<BTreeMap<String, String>>(h) else {
        return asks;
    };
    asks.op = match map.get(KV_OP_HEADER).map(String::as_str) {
        Some("DEL") => KvOp::Delete,
        Some("PURGE") => KvOp::Purge,
        _ => KvOp::Put,
    };
    asks.expected = map
        .get(EXPECTED_REVISION_HEADER)
        .and_then(|v| v.parse().ok());
    asks
}

/// A refused compare-and-set: `wrong_revision` carrying `latest`.
pub fn wrong_revision(subject: &str, expected: u64, latest: u64) -> ApiError {
    let mut e = ApiError::new(
        Code::WrongRevision,
        format!("{subject:?} is at revision {latest}, not {expected}"),
    );
    e.revision = Some(latest);
    e
}

/// Compare-and-set, checked before a store: `latest` is the subject's
/// newest message (its seq, and whether it is a delete or purge marker).
pub fn check_revision(
    subject: &str,
    expected: Option<u64>,
    latest: Option<(u64, bool)>,
) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let ok = match latest {
        None => expected == 0,
        Some((seq, marker)) => expected == seq || (expected == 0 && marker),
    };
    if ok {
        Ok(())
    } else {
        Err(wrong_revision(
            subject,
            expected,
            latest.map_or(0, |(s, _)| s),
        ))
    }
}

/// What an engine lets [`trim`] look at and remove.
pub trait Held {
    fn config(&self) -> &StreamConfig;
    fn messages(&self) -> u64;
    fn bytes(&self) -> u64;
    fn first_seq(&self) -> u64;
    /// Live messages of exactly `subject`.
    fn subject_count(&self, subject: &str) -> u64;
    /// The oldest live message of exactly `subject`.
    fn oldest_of(&self, subject: &str) -> Option<u64>;
    fn remove_seq(&mut self, seq: u64) -> Result<(), ApiError>;
}

/// After message `seq` on `subject` was stored: a purge marker removes
/// every earlier message of its subject, then `max_msgs_per_subject`
/// removes that subject's oldest, then `max_msgs`/`max_bytes` the
/// stream's oldest (discard old). Every seq removed goes to `removed`.
pub fn trim(
    h: &mut impl Held,
    subject: &str,
    seq: u64,
    op: KvOp,
    removed: &mut Vec<u64>,
) -> Result<(), ApiError> {
    let per_subject = match op {
        KvOp::Purge => 1,
        _ => h.config().max_msgs_per_subject,
    };
    if per_subject > 0 {
        while h.subject_count(subject) > per_subject {
            match h.oldest_of(subject) {
                Some(old) if old != seq => {
                    h.remove_seq(old)?;
                    removed.push(old);
                }
                _ => break,
            }
        }
    }
    while over(h.config(), h.messages(), h.bytes()) {
        let first = h.first_seq();
        h.remove_seq(first)?;
        removed.push(first);
    }
    Ok(())
}

/// Interest retention: whether a consumer wants messages on `subj`; a
/// message nobody wants is not kept.
pub fn has_interest(consumers: &BTreeMap<String, Member>, subj: &str) -> bool {
    consumers.values().any(|m| {
        m.consumer
            .cfg
            .filter_subject
            .as_deref()
            .is_none_or(|f| subject::matches(f, subj))
    })
}

/// Whether acked message `seq` (on `subj`, `None` when it is gone) may
/// go: never under limits retention, at once under a work queue, and
/// under interest once every consumer older than it that wants it has
/// acked it.
pub fn done_with(
    cfg: &StreamConfig,
    consumers: &BTreeMap<String, Member>,
    seq: u64,
    subj: Option<&str>,
) -> bool {
    match cfg.retention {
        Retention::Limits => false,
        Retention::Workqueue => true,
        Retention::Interest => {
            let Some(subj) = subj else {
                return false;
            };
            consumers.values().all(|m| {
                let c = &m.consumer;
                let wants = m.since < seq
                    && c.cfg
                        .filter_subject
                        .as_deref()
                        .is_none_or(|f| subject::matches(f, subj));
                !wants || c.has_acked(seq)
            })
        }
    }
}
