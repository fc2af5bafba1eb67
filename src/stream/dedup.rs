//! The `Msg-Id` duplicate window of one stream: which ids were stored
//! under which sequence, oldest first, bounded by [`DEDUP_IDS_MAX`]. Shared
//! by the on-disk stream and the replicated stream's state machine, so both
//! apply the same rule.

use std::collections::{HashMap, VecDeque};

use super::stream::DEDUP_IDS_MAX;

#[derive(Debug, Clone, Default)]
pub struct IdWindow {
    seqs: HashMap<Box<str>, u64>,
    /// (time stored in ms, id), oldest first.
    order: VecDeque<(u64, Box<str>)>,
}

impl IdWindow {
    /// The sequence `id` was stored under, if it is still in the window.
    pub fn get(&self, id: &str) -> Option<u64> {
        self.seqs.get(id).copied()
    }

    /// Forgets the ids stored `window_ms` or longer before `now_ms`.
    pub fn forget(&mut self, now_ms: u64, window_ms: u64) {
        while let Some((t, _)) = self.order.front() {
            if t + window_ms > now_ms {
                break;
            }
            if let Some((_, id)) = self.order.pop_front() {
                self.seqs.remove(&id);
            }
        }
    }

    /// Records `id` as stored under `seq` at `time_ms`; the oldest id goes
    /// when the window is full.
    pub fn remember(&mut self, id: Box<str>, seq: u64, time_ms: u64) {
        if self.order.len() >= DEDUP_IDS_MAX {
            if let Some((_, old)) = self.order.pop_front() {
                self.seqs.remove(&old);
            }
        }
        self.seqs.insert(id.clone(), seq);
        self.order.push_back((time_ms, id));
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Every remembered id, oldest first: (time stored, sequence, id).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, &str)> {
        self.order
            .iter()
            .map(|(t, id)| (*t, self.seqs.get(id).copied().unwrap_or(0), &**id))
    }
}
