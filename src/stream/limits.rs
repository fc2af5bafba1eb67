//! The rules of a stream's limits and retention, written once for both
//! kinds of stream: an R1 stream over its segment store (`stream.rs`) and
//! a replica of a replicated stream over its index (`replica.rs`). Each
//! asks these functions with its own counts, so the two give the same
//! outcome for the same publishes (a unit test in `replica.rs` runs the
//! same publishes through both and compares every outcome). Pure.

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
