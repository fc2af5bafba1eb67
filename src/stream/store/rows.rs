//! The rows of a store's in-memory index: for each live seq, where its
//! record is (offset, length), its interned subject and its time.
//!
//! Recent seqs sit in a dense window, one slot per seq with the removed
//! ones in between, so an append, a read of a recent seq and a removal
//! are one array index. A live row that the window could keep only by
//! holding many removed slots around it (a key-value bucket's cold key, a
//! message nobody acked while thousands after it were) moves out to a
//! sorted list of live rows, found by binary search. Memory thus follows
//! the live messages, not the range of seqs from the oldest live one to
//! the newest:
//!
//! - right after any push, the window holds at most the larger of its
//!   minimum length ([`WINDOW_SLOTS_DEFAULT`] unless the store's options
//!   say otherwise) and [`SPARSE_SHARE`] slots per live row in it
//!   (24 bytes a slot);
//! - the list holds its live rows and at most as many removed ones
//!   (32 bytes an entry);
//! - both give memory back once their capacity is four times what they
//!   hold (the window keeps room for its minimum).
//!
//! Moving rows out costs one step per slot dropped, each slot having come
//! from one push: constant time per push, amortised.

use std::collections::VecDeque;
use std::mem::size_of;

/// Marks a removed seq in [`IndexRow::subj`].
const DEAD: u32 = u32::MAX;

/// Where a seq's record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexRow {
    pub(super) off: u32,
    pub(super) len: u32,
    /// The interned subject.
    pub(super) subj: u32,
    pub(super) time_ms: u64,
}

impl IndexRow {
    const DEAD: IndexRow = IndexRow {
        off: 0,
        len: 0,
        subj: DEAD,
        time_ms: 0,
    };

    fn live(&self) -> bool {
        self.subj != DEAD
    }
}

/// The window keeps every slot while it is this short, however few of
/// them are live (the default of `Options::index_window_slots`).
pub const WINDOW_SLOTS_DEFAULT: usize = 1024;

/// Past its minimum length, a push that leaves fewer than one live row in
/// this many slots moves rows out of the window, from its front, until
/// half of it is live (or it is half the minimum long).
const SPARSE_SHARE: usize = 4;

/// A deque's capacity is given back once it is this many times its length
/// (and its floor).
const SHRINK_SHARE: usize = 4;

/// The live rows of a store, by seq. See the module docs.
pub(super) struct Rows {
    /// Rows below `base`, in seq order: live ones and removed ones not yet
    /// swept (never first, never more than half of them).
    old: VecDeque<(u64, IndexRow)>,
    old_dead: usize,
    /// One slot per seq from `base` on; the first one is live.
    window: VecDeque<IndexRow>,
    base: u64,
    window_live: usize,
    /// The window keeps every slot while it is this short.
    window_min: usize,
}

impl Rows {
    /// No rows; the first push may take any seq. The window keeps every
    /// slot while it is at most `window_min` long.
    pub(super) fn new(next: u64, window_min: usize) -> Rows {
        Rows {
            old: VecDeque::new(),
            old_dead: 0,
            window: VecDeque::new(),
            base: next,
            window_live: 0,
            window_min,
        }
    }

    /// Drops every row (and the memory they took); the next push may take
    /// any seq.
    pub(super) fn clear(&mut self, next: u64) {
        *self = Rows::new(next, self.window_min);
    }

    /// No live row.
    pub(super) fn is_empty(&self) -> bool {
        // The first entry of each part is live.
        self.old.is_empty() && self.window.is_empty()
    }

    /// One past the last slot: the last seq pushed plus one (while a row
    /// is live; see [`Rows::skip_to`]).
    pub(super) fn end(&self) -> u64 {
        self.base + self.window.len() as u64
    }

    /// The first live seq.
    pub(super) fn first(&self) -> Option<u64> {
        match self.old.front() {
            Some(&(seq, _)) => Some(seq),
            None => (!self.window.is_empty()).then_some(self.base),
        }
    }

    /// The row of `seq`, if it is live.
    pub(super) fn get(&self, seq: u64) -> Option<IndexRow> {
        let row = match seq.checked_sub(self.base) {
            Some(i) => *self.window.get(usize::try_from(i).ok()?)?,
            None => self.old[self.old_at(seq)?].1,
        };
        row.live().then_some(row)
    }

    /// Sets the record offset of live `seq` (its record moved).
    pub(super) fn set_off(&mut self, seq: u64, off: u32) {
        let slot = match seq.checked_sub(self.base) {
            Some(i) => usize::try_from(i).ok().and_then(|i| self.window.get_mut(i)),
            None => match self.old_at(seq) {
                Some(i) => Some(&mut self.old[i].1),
                None => None,
            },
        };
        if let Some(r) = slot.filter(|r| r.live()) {
            r.off = off;
        }
    }

    /// Adds the row of `seq`, which lies past every slot held
    /// (`seq >= end()`), or anywhere when no row is live. Seqs skipped
    /// in between are removed ones.
    pub(super) fn push(&mut self, seq: u64, row: IndexRow) {
        debug_assert!(row.live());
        debug_assert!(self.old.back().is_none_or(|&(s, _)| s < seq));
        if self.window.is_empty() {
            self.base = seq;
        } else if seq > self.end() {
            let gap = usize::try_from(seq - self.end()).unwrap_or(usize::MAX);
            let len = self.window.len().saturating_add(gap).saturating_add(1);
            if len > self.window_min.max(SPARSE_SHARE * (self.window_live + 1)) {
                // Filling the gap would make the window sparse.
                while !self.window.is_empty() {
                    self.retire_front();
                }
                self.base = seq;
            } else {
                self.window.extend(std::iter::repeat_n(IndexRow::DEAD, gap));
            }
        }
        debug_assert_eq!(seq, self.end());
        self.window.push_back(row);
        self.window_live += 1;
        if self.window.len() > self.window_min
            && self.window.len() > SPARSE_SHARE * self.window_live
        {
            self.thin();
        }
    }

    /// Marks `seq` removed; its row if it was live.
    pub(super) fn remove(&mut self, seq: u64) -> Option<IndexRow> {
        if let Some(i) = seq.checked_sub(self.base) {
            let i = usize::try_from(i).ok()?;
            let slot = self.window.get_mut(i).filter(|r| r.live())?;
            let row = std::mem::replace(slot, IndexRow::DEAD);
            self.window_live -= 1;
            if i == 0 {
                self.drop_dead_front();
                shrink(&mut self.window, self.window_min);
            }
            return Some(row);
        }
        let i = self.old_at(seq)?;
        let slot = Some(&mut self.old[i].1).filter(|r| r.live())?;
        let row = std::mem::replace(slot, IndexRow::DEAD);
        self.old_dead += 1;
        if i == 0 {
            while self.old.front().is_some_and(|(_, r)| !r.live()) {
                self.old.pop_front();
                self.old_dead -= 1;
            }
        }
        self.sweep_old();
        Some(row)
    }

    /// The first live row from `from` on that passes `pred`. The same as
    /// `live_from(from).find(..)`, in a tighter loop for the searches a
    /// read or a delivery makes.
    pub(super) fn find_from(
        &self,
        from: u64,
        mut pred: impl FnMut(&IndexRow) -> bool,
    ) -> Option<(u64, IndexRow)> {
        self.find_any(from, |r| r.live() && pred(r))
    }

    /// The first live row of subject `subj` from `from` on.
    pub(super) fn find_subject_from(&self, from: u64, subj: u32) -> Option<u64> {
        // A removed row's subject is DEAD, never a subject's id: one
        // compare per row.
        debug_assert_ne!(subj, DEAD);
        self.find_any(from, |r| r.subj == subj).map(|(seq, _)| seq)
    }

    /// The first row, removed ones included, from `from` on that passes
    /// `pred`.
    fn find_any(
        &self,
        from: u64,
        mut pred: impl FnMut(&IndexRow) -> bool,
    ) -> Option<(u64, IndexRow)> {
        if from < self.base {
            let i = self.old.partition_point(|&(s, _)| s < from);
            if let Some(&(seq, row)) = self.old.range(i..).find(|(_, r)| pred(r)) {
                return Some((seq, row));
            }
        }
        let skip = usize::try_from(from.saturating_sub(self.base)).ok()?;
        let k = self
            .window
            .range(skip.min(self.window.len())..)
            .position(&mut pred)?;
        let at = skip + k;
        Some((self.base + at as u64, self.window[at]))
    }

    /// The live rows from `from` on, in seq order (either way).
    pub(super) fn live_from(
        &self,
        from: u64,
    ) -> impl DoubleEndedIterator<Item = (u64, IndexRow)> + '_ {
        let i = if from >= self.base {
            self.old.len()
        } else {
            self.old.partition_point(|&(s, _)| s < from)
        };
        let skip = usize::try_from(from.saturating_sub(self.base))
            .unwrap_or(usize::MAX)
            .min(self.window.len());
        let base = self.base + skip as u64;
        let recent = self.window.range(skip..).enumerate();
        self.old
            .range(i..)
            .copied()
            .chain(recent.map(move |(k, &r)| (base + k as u64, r)))
            .filter(|(_, r)| r.live())
    }

    /// Drops every slot at or after `seq` (their rows need not be
    /// removed first).
    pub(super) fn truncate(&mut self, seq: u64) {
        if seq <= self.base {
            self.window.clear();
            self.window_live = 0;
            let keep = self.old.partition_point(|&(s, _)| s < seq);
            let dead = self.old.range(keep..).filter(|(_, r)| !r.live()).count();
            self.old_dead -= dead;
            self.old.truncate(keep);
            self.base = seq;
            self.sweep_old();
        } else if let Ok(keep) = usize::try_from(seq - self.base) {
            if keep < self.window.len() {
                let live = self.window.range(keep..).filter(|r| r.live()).count();
                self.window_live -= live;
                self.window.truncate(keep);
            }
        }
        shrink(&mut self.window, self.window_min);
        self.skip_to(seq);
    }

    /// When no row is live, the next one is pushed at `seq` or later:
    /// [`Rows::end`] moves there.
    pub(super) fn skip_to(&mut self, seq: u64) {
        if self.is_empty() {
            self.base = seq;
        }
    }

    /// Bytes allocated for the rows.
    pub(super) fn bytes(&self) -> usize {
        self.old.capacity() * size_of::<(u64, IndexRow)>()
            + self.window.capacity() * size_of::<IndexRow>()
    }

    fn old_at(&self, seq: u64) -> Option<usize> {
        self.old.binary_search_by_key(&seq, |&(s, _)| s).ok()
    }

    /// Moves rows out of the window's front until half of it is live or
    /// it is short.
    fn thin(&mut self) {
        while self.window.len() > self.window_min / 2 && self.window.len() > 2 * self.window_live {
            self.retire_front();
        }
        shrink(&mut self.window, self.window_min);
    }

    /// Moves the window's first row (live) to `old` and drops the removed
    /// slots after it.
    fn retire_front(&mut self) {
        if let Some(row) = self.window.pop_front() {
            self.old.push_back((self.base, row));
            self.base += 1;
            self.window_live -= 1;
            self.drop_dead_front();
        }
    }

    fn drop_dead_front(&mut self) {
        while self.window.front().is_some_and(|r| !r.live()) {
            self.window.pop_front();
            self.base += 1;
        }
    }

    /// Sweeps the removed rows out of `old` once they are half of it.
    fn sweep_old(&mut self) {
        if 2 * self.old_dead > self.old.len() {
            self.old.retain(|(_, r)| r.live());
            self.old_dead = 0;
        }
        shrink(&mut self.old, 0);
    }
}

/// Gives back most of `v`'s capacity once it is [`SHRINK_SHARE`] times
/// its length (or `floor`, if more).
fn shrink<T>(v: &mut VecDeque<T>, floor: usize) {
    let keep = v.len().max(floor);
    if v.capacity() > SHRINK_SHARE * keep.max(1) {
        v.shrink_to(2 * keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rand::SplitMix64;
    use std::collections::BTreeMap;

    const W: usize = WINDOW_SLOTS_DEFAULT;

    fn row(seq: u64) -> IndexRow {
        IndexRow {
            off: seq as u32,
            len: 1 + (seq % 7) as u32,
            subj: (seq % 5) as u32,
            time_ms: seq * 10,
        }
    }

    /// What the rows promise, checked against their insides.
    fn check_shape(r: &Rows) {
        assert!(
            r.old.front().is_none_or(|(_, x)| x.live()),
            "old starts live"
        );
        assert!(
            r.window.front().is_none_or(|x| x.live()),
            "window starts live"
        );
        assert!(
            r.old.back().is_none_or(|&(s, _)| s < r.base),
            "old below base"
        );
        assert!(r
            .old
            .iter()
            .zip(r.old.iter().skip(1))
            .all(|(a, b)| a.0 < b.0));
        let dead = r.old.iter().filter(|(_, x)| !x.live()).count();
        assert_eq!(dead, r.old_dead);
        assert!(2 * r.old_dead <= r.old.len(), "old at most half removed");
        let live = r.window.iter().filter(|x| x.live()).count();
        assert_eq!(live, r.window_live);
    }

    /// Pushes `seq` after the rows and checks the window's bound.
    fn push(r: &mut Rows, seq: u64) {
        r.push(seq, row(seq));
        assert!(
            r.window.len() <= r.window_min.max(SPARSE_SHARE * r.window_live),
            "window of {} slots for {} live rows",
            r.window.len(),
            r.window_live
        );
    }

    /// Rows pushed for seqs 1..=last; after each push the row `lag` seqs
    /// back is removed unless `keep` says it stays.
    fn pushed(last: u64, lag: u64, keep: impl Fn(u64) -> bool) -> Rows {
        let mut r = Rows::new(1, W);
        for seq in 1..=last {
            push(&mut r, seq);
            if let Some(old) = seq.checked_sub(lag).filter(|&s| s > 0 && !keep(s)) {
                assert_eq!(r.remove(old), Some(row(old)));
            }
        }
        check_shape(&r);
        r
    }

    #[test]
    fn a_dense_stream_stays_in_the_window() {
        // A stream with a limit: the oldest goes as each new one comes.
        let r = pushed(20_000, 100, |_| false);
        assert!(r.old.is_empty());
        assert_eq!(r.first(), Some(19_901));
        assert_eq!(r.end(), 20_001);
        assert_eq!(r.get(19_900), None);
        assert_eq!(r.get(20_000), Some(row(20_000)));
        assert!(r.bytes() <= 4 * W * size_of::<IndexRow>());
    }

    #[test]
    fn a_cold_row_leaves_the_window_and_is_still_found() {
        // A cold key, then ten hot keys: each new row removes the one ten
        // before it.
        let mut r = pushed(50_000, 10, |s| s == 1);
        assert_eq!(r.old.len(), 1, "only the cold row moved out");
        assert!(r.window.len() <= W);
        assert!(r.bytes() < 3 * W * size_of::<IndexRow>());
        assert_eq!(r.first(), Some(1));
        assert_eq!(r.get(1), Some(row(1)));
        assert_eq!(r.get(2), None);
        assert_eq!(r.get(49_990), None);
        assert_eq!(r.get(49_991), Some(row(49_991)));
        let live: Vec<u64> = r.live_from(0).map(|(s, _)| s).collect();
        let want: Vec<u64> = std::iter::once(1).chain(49_991..=50_000).collect();
        assert_eq!(live, want);
        let back: Vec<u64> = r.live_from(1).rev().map(|(s, _)| s).collect();
        assert_eq!(back, want.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(r.live_from(2).next().map(|(s, _)| s), Some(49_991));
        assert_eq!(r.live_from(49_995).next().map(|(s, _)| s), Some(49_995));
        assert_eq!(r.live_from(50_001).next(), None);
        r.set_off(1, 77);
        assert_eq!(r.get(1).map(|x| x.off), Some(77));
        // Removing the cold row: the first live one is in the window.
        assert_eq!(r.remove(1), Some(IndexRow { off: 77, ..row(1) }));
        assert_eq!(r.remove(1), None);
        check_shape(&r);
        assert_eq!(r.first(), Some(49_991));
        assert!(r.old.is_empty());
    }

    #[test]
    fn a_long_gap_starts_the_window_again() {
        let mut r = Rows::new(1, W);
        for seq in 1..=10 {
            push(&mut r, seq);
        }
        push(&mut r, 20);
        assert!(r.old.is_empty(), "a short gap is filled");
        assert_eq!(r.get(15), None);
        push(&mut r, 1_000_000);
        check_shape(&r);
        assert_eq!(r.old.len(), 11, "the rows before a long gap moved out");
        assert_eq!(r.window.len(), 1);
        assert_eq!(r.end(), 1_000_001);
        assert_eq!(r.get(20), Some(row(20)));
        assert_eq!(r.get(1_000_000), Some(row(1_000_000)));
        assert_eq!(r.remove(500_000), None);
    }

    #[test]
    fn removed_rows_of_the_list_are_swept() {
        // Every fifth row stays live; the window thins as it grows.
        let mut r = pushed(10_000, 0, |s| s % 5 == 0);
        assert!(r.old.len() > 1000, "{} rows moved out", r.old.len());
        let moved: Vec<u64> = r.old.iter().map(|&(s, _)| s).collect();
        for &s in moved.iter().skip(1) {
            assert_eq!(r.remove(s), Some(row(s)));
            check_shape(&r);
        }
        assert_eq!(r.old.len() - r.old_dead, 1);
        assert_eq!(r.first(), Some(5));
        assert!(r.old.capacity() <= SHRINK_SHARE * 2);
    }

    #[test]
    fn truncate_cuts_either_part() {
        let mut r = pushed(3000, 0, |s| s == 1 || s % 100 == 0);
        assert!(!r.old.is_empty());
        let cut = r.base + 1;
        r.truncate(cut);
        check_shape(&r);
        assert_eq!(r.end(), cut);
        assert!(r.live_from(cut).next().is_none());
        r.truncate(250);
        check_shape(&r);
        let live: Vec<u64> = r.live_from(0).map(|(s, _)| s).collect();
        assert_eq!(live, vec![1, 100, 200]);
        assert_eq!(r.end(), 250);
        push(&mut r, 250);
        assert_eq!(r.get(250), Some(row(250)));
        r.truncate(1);
        assert!(r.is_empty());
        assert_eq!(r.first(), None);
        assert_eq!(r.end(), 1);
    }

    /// Random pushes (with gaps), removals, reads and cuts against a map
    /// of the live rows.
    #[test]
    fn matches_a_map_of_live_rows() {
        for seed in 0..16u64 {
            let mut rng = SplitMix64(0x5eed_0000 + seed);
            let mut r = Rows::new(1, [0, 8, 64, W][seed as usize % 4]);
            let mut model: BTreeMap<u64, IndexRow> = BTreeMap::new();
            let mut next = 1u64;
            for step in 0..4000 {
                let ctx = format!("seed {seed} step {step}");
                match rng.next_u64() % 100 {
                    0..=44 => {
                        let gap = match rng.next_u64() % 50 {
                            0 => rng.next_u64() % 5000,
                            1..=5 => rng.next_u64() % 20,
                            _ => 0,
                        };
                        next += gap;
                        push(&mut r, next);
                        model.insert(next, row(next));
                        next += 1;
                    }
                    45..=84 => {
                        // Mostly recent seqs, which leaves old rows cold.
                        let span = if rng.below(4) == 0 { next } else { 64 };
                        let seq = next.saturating_sub(1 + rng.next_u64() % span.max(1));
                        assert_eq!(r.remove(seq), model.remove(&seq), "{ctx}: remove {seq}");
                    }
                    85..=94 => {
                        let from = rng.next_u64() % (next + 2);
                        let got: Vec<_> = r.live_from(from).take(20).collect();
                        let want: Vec<_> = model
                            .range(from..)
                            .take(20)
                            .map(|(&s, &x)| (s, x))
                            .collect();
                        assert_eq!(got, want, "{ctx}: from {from}");
                        let got: Vec<_> = r.live_from(from).rev().take(5).collect();
                        let want: Vec<_> = model
                            .range(from..)
                            .rev()
                            .take(5)
                            .map(|(&s, &x)| (s, x))
                            .collect();
                        assert_eq!(got, want, "{ctx}: back from {from}");
                        let subj = rng.below(5) as u32;
                        let got = r.find_from(from, |x| x.subj == subj);
                        let want = model.range(from..).find(|(_, x)| x.subj == subj);
                        let want = want.map(|(&s, &x)| (s, x));
                        assert_eq!(got, want, "{ctx}: find subject {subj} from {from}");
                        let got = r.find_subject_from(from, subj);
                        assert_eq!(
                            got,
                            want.map(|(s, _)| s),
                            "{ctx}: subject {subj} from {from}"
                        );
                    }
                    95..=98 => {
                        let seq = rng.next_u64() % (next + 2);
                        assert_eq!(r.get(seq), model.get(&seq).copied(), "{ctx}: get {seq}");
                    }
                    _ => {
                        // A cut keeps most of the rows.
                        let seq = next.saturating_sub(rng.next_u64() % 100).max(1);
                        r.truncate(seq);
                        model.split_off(&seq);
                        next = seq;
                    }
                }
                check_shape(&r);
                assert_eq!(r.first(), model.keys().next().copied(), "{ctx}: first");
                assert_eq!(r.is_empty(), model.is_empty(), "{ctx}");
                if let Some(&last) = model.keys().next_back() {
                    assert!(r.end() > last, "{ctx}: end {} last {last}", r.end());
                }
            }
            let all: Vec<_> = r.live_from(0).collect();
            let want: Vec<_> = model.iter().map(|(&s, &x)| (s, x)).collect();
            assert_eq!(all, want, "seed {seed}: the whole index");
        }
    }
}
