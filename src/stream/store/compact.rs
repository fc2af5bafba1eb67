//! Compaction of sealed segments: a run of them is rewritten as one file
//! holding only their live messages (seqs kept) and the removal records
//! still needed, so that messages which outlive newer ones no longer pin
//! every segment written since. The rules are in [`Store::compact_step`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};

use super::{Seg, Store};
use crate::storage::record;
use crate::storage::sync::SyncPolicy;
use crate::stream::segment::{self, Rec};

/// A sealed segment is worth rewriting when its live messages fill less
/// than 1/`LIVE_SHARE` of it: each rewrite then frees at least three times
/// what it copies.
const LIVE_SHARE: u64 = 4;

/// Segments one step rewrites at most (bounds the work of one step).
const RUN_MAX: usize = 8;

/// Where a compaction step is; a test copies the directory at each one to
/// check what recovery makes of a crash there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The new file is written and fsynced beside the old ones.
    Written,
    /// It replaced the run's first segment and the directory is fsynced;
    /// the run's other segments are still there.
    Renamed,
    /// The run's other segments are deleted.
    Done,
}

impl Store {
    /// One bounded step of compaction, run by the stream after a flush
    /// (a no-op unless a segment rolled or the store opened since the
    /// last step that found nothing to do). True when it rewrote a run.
    ///
    /// - A sealed segment is worth it when its live messages fill less
    ///   than a quarter of it (and, if it was compacted before, some of
    ///   them were removed since). The oldest such segment starts the run,
    ///   preceded by the segment before it when that one is small (under
    ///   a quarter of the segment size), so small compacted files merge
    ///   instead of adding up; the run goes on over the following sealed
    ///   segments that are worth it or small, up to [`RUN_MAX`] of them and
    ///   half a segment of live bytes.
    /// - The new file, named after the run's first seq, holds a head, a
    ///   span (up to the first seq of the segment after the run: every seq
    ///   in between that it does not hold is gone), a `Synced` mark over
    ///   the whole file, the removal records of the run that remove
    ///   messages still held by an earlier file, and the run's live
    ///   messages. Removal records are needed only while an earlier file
    ///   holds a removed message; when none does, none is kept.
    /// - Order: every buffered removal is written (and, unless the policy
    ///   is `none`, fsynced) first, so no file drops a message whose
    ///   removal could still be lost; the new file is written and fsynced
    ///   as `.seg.tmp`; the directory is fsynced (earlier deletions are
    ///   durable before a file that relies on them); the file is renamed
    ///   over the run's first segment and the directory fsynced again;
    ///   then the run's other segments are deleted. Recovery deletes a
    ///   `.seg.tmp`, and a segment inside an earlier file's span (the
    ///   run's other segments after a crash).
    pub fn compact_step(&mut self) -> io::Result<bool> {
        self.compact_step_seen(&mut |_| {})
    }

    /// [`Store::compact_step`], calling `seen` at each [`Phase`].
    #[doc(hidden)]
    pub fn compact_step_seen(&mut self, seen: &mut dyn FnMut(Phase)) -> io::Result<bool> {
        let done = self.compact_run(seen);
        if done.is_err() {
            // Not again at every flush: at the next roll.
            self.compact_due = false;
        }
        done
    }

    fn compact_run(&mut self, seen: &mut dyn FnMut(Phase)) -> io::Result<bool> {
        self.check()?;
        if !self.compact_due || self.truncated {
            return Ok(false);
        }
        let Some((s, m)) = self.pick_run() else {
            self.compact_due = false;
            return Ok(false);
        };
        self.write_pending()?;
        if let Some(sy) = &self.opts.syncer {
            if sy.policy() != SyncPolicy::Never {
                self.active().file.sync_data()?;
            }
        }
        let first = self.segs[s].first_seq;
        let end = self.segs[m + 1].first_seq;
        let (floor, removes) = self.needed_removals(s, m)?;
        let mut body = Vec::new();
        if let Some(f) = floor {
            segment::put_floor(&mut body, f);
        }
        segment::put_remove(&mut body, &removes);
        let prefix = 3 * segment::FIXED_RECORD_BYTES;
        let live: Vec<_> = self
            .rows
            .live_from(first)
            .take_while(|&(q, _)| q < end)
            .collect();
        let mut offs = Vec::with_capacity(live.len());
        let mut owned = Vec::new();
        let mut live_bytes = 0;
        for &(q, e) in &live {
            let (bytes, seg) = self.record_bytes(q, e, &mut owned)?;
            if !holds_msg(bytes, q) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} offset {}: not the message the index points at",
                        seg.path.display(),
                        e.off
                    ),
                ));
            }
            offs.push(prefix + body.len());
            body.extend_from_slice(bytes);
            live_bytes += u64::from(e.len);
        }
        let total = prefix + body.len();
        if total as u64 > u64::from(u32::MAX) {
            self.compact_due = false;
            return Ok(false);
        }
        let mut out = Vec::with_capacity(total);
        segment::put_head(&mut out, first);
        segment::put_span(&mut out, end);
        segment::put_synced(&mut out, total as u64);
        debug_assert_eq!(out.len(), prefix);
        out.extend_from_slice(&body);
        drop(body);

        let path = self.segs[s].path.clone();
        let tmp = self.dir.join(format!("{}.tmp", segment::file_name(first)));
        if let Err(e) = write_synced(&tmp, &out) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        seen(Phase::Written);
        let prepared = (|| {
            for j in s..=m {
                // Stale once the run is rewritten.
                self.remove_index(self.segs[j].first_seq)?;
            }
            let dir = File::open(&self.dir)?;
            dir.sync_all()?;
            Ok::<File, io::Error>(dir)
        })();
        let dir = match prepared.and_then(|d| fs::rename(&tmp, &path).map(|()| d)) {
            Ok(d) => d,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        // The new file is in place: from here a failure leaves memory
        // describing files that are gone, so the store stops.
        let file = dir.sync_all().and_then(|()| File::open(&path));
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                self.failed = Some(format!("compaction of {}: {e}", path.display()));
                return Err(e);
            }
        };
        seen(Phase::Renamed);
        let gone: Vec<Seg> = self.segs.drain(s + 1..=m).collect();
        let seg = &mut self.segs[s];
        seg.file = file;
        seg.live = live.len() as u64;
        seg.live_bytes = live_bytes;
        seg.held = live.len() as u64;
        seg.len = total as u64;
        seg.compacted = true;
        for (&(q, _), off) in live.iter().zip(offs) {
            self.rows.set_off(q, off as u32);
        }
        for g in &gone {
            fs::remove_file(&g.path)?;
            self.dir_dirty = true;
        }
        seen(Phase::Done);
        self.settle()?;
        Ok(true)
    }

    /// The oldest run worth rewriting: (first, last) segment indexes, the
    /// last before the active segment.
    fn pick_run(&self) -> Option<(usize, usize)> {
        let sealed = self.segs.len().checked_sub(1)?;
        let small = self.opts.segment_bytes / 4;
        let worth = |j: usize| {
            let g = &self.segs[j];
            g.live_bytes * LIVE_SHARE < g.len && (!g.compacted || g.held > g.live)
        };
        let i = (0..sealed).find(|&j| worth(j))?;
        let s = if i > 0 && self.segs[i - 1].len < small {
            i - 1
        } else {
            i
        };
        let budget = self.opts.segment_bytes / 2;
        let mut live: u64 = self.segs.range(s..=i).map(|g| g.live_bytes).sum();
        let mut m = i;
        while m + 1 < sealed && m + 1 - s < RUN_MAX {
            let g = &self.segs[m + 1];
            if !(worth(m + 1) || g.len < small) || live + g.live_bytes > budget {
                break;
            }
            live += g.live_bytes;
            m += 1;
        }
        Some((s, m))
    }

    /// The removal records of segments `s..=m` that a rewrite must keep:
    /// the largest Floor and the removed seqs still held by an earlier
    /// file (none at all when no earlier file holds a removed message).
    fn needed_removals(&self, s: usize, m: usize) -> io::Result<(Option<u64>, Vec<u64>)> {
        if self.segs.range(..s).all(|g| g.held == g.live) {
            return Ok((None, Vec::new()));
        }
        let lowest = self.segs[0].first_seq;
        let first = self.segs[s].first_seq;
        let held = |q: u64| {
            let g = &self.segs[self.seg_of(q)];
            (lowest..first).contains(&q) && self.entry(q).is_none() && g.held > g.live
        };
        let mut floor: Option<u64> = None;
        let mut seqs = Vec::new();
        for g in self.segs.range(s..=m) {
            let buf = fs::read(&g.path)?;
            let mut at = 0;
            while at < buf.len() {
                let bad = |why: String| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} offset {at}: {why}", g.path.display()),
                    )
                };
                let (body, next) = match record::read(&buf, at) {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(b) => return Err(bad(b.to_string())),
                };
                match segment::decode(body).map_err(|e| bad(e.to_string()))? {
                    Rec::Remove(r) => seqs.extend(r.iter().filter(|&q| held(q))),
                    Rec::Floor { seq } => floor = Some(floor.map_or(seq, |f| f.max(seq))),
                    _ => {}
                }
                at = next;
            }
        }
        seqs.sort_unstable();
        seqs.dedup();
        Ok((floor, seqs))
    }
}

/// Whether `bytes` is one whole valid Msg record of `seq`.
fn holds_msg(bytes: &[u8], seq: u64) -> bool {
    match record::read(bytes, 0) {
        Ok(Some((body, end))) if end == bytes.len() => {
            matches!(segment::decode(body), Ok(Rec::Msg(m)) if m.seq == seq)
        }
        _ => false,
    }
}

/// Writes `bytes` as a new file at `path` and fsyncs it.
fn write_synced(path: &std::path::Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
