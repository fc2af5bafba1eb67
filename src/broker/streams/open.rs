//! One stream the broker holds open and what is done to it after its
//! consumers' events: the events logged, and messages no consumer needs
//! any more removed under the stream's retention. Also a consumer's
//! counts and the bounds of one push turn and one fetch answer. It names
//! nothing else of the broker, so that the push and fetch paths
//! (`stream_out.rs`) and `Streams` both build on it.

use std::rc::Rc;
use std::time::Instant;

use crate::protocol::stream_messages::Retention;
use crate::storage::sync::FileKey;
use crate::stream::consumer::{Consumer, Event};
use crate::stream::meta::MetaLog;
use crate::stream::stream::Stream;

/// A fetch answer stops adding messages past this many bytes.
pub const FETCH_BYTES_MAX: usize = 8 << 20;
/// Push deliveries per consumer per loop turn (fairness between them).
pub const PUSH_PER_TURN_MAX: usize = 256;

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
    pub(in crate::broker) fn of(stream: &Stream, name: &str, c: &Consumer) -> ConsumerSummary {
        ConsumerSummary {
            name: name.to_string(),
            num_pending: stream.count_from(c.next_seq(), c.cfg.filter_subject.as_deref()),
            num_ack_pending: c.num_ack_pending() as u64,
            num_redelivered: c.num_redelivered() as u64,
        }
    }
}

/// One stream the broker holds open: the stream over its store, its
/// configs and cursors log, and what the loop keeps about it.
pub(in crate::broker) struct OpenStream {
    /// Its key in the capture index.
    pub(super) id: u64,
    pub(in crate::broker) name: Rc<str>,
    pub(in crate::broker) stream: Stream,
    pub(super) meta: MetaLog,
    pub(super) meta_key: Option<FileKey>,
    /// Something changed this turn: files to write, consumers to serve.
    pub(in crate::broker) touched: bool,
    /// When this stream next needs the loop (a redelivery, an age limit).
    pub(super) due: Option<Instant>,
    /// A push consumer has something to deliver but nobody took it yet.
    pub(super) push_waiting: bool,
}

/// Logs a consumer's events and applies the stream's retention to the
/// sequences it is done with.
pub(in crate::broker) fn after_events(
    slot: &mut OpenStream,
    consumer: &str,
    events: &[Event],
    done: &[u64],
) {
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
pub(super) fn remove_seqs(slot: &mut OpenStream, seqs: &[u64]) {
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

/// Consumers stop waiting for acks of messages that are gone.
pub(super) fn forget_removed(slot: &mut OpenStream, removed: &[u64]) {
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
