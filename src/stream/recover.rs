//! Opening a store: reads every segment from its start, rebuilds the
//! in-memory index, and decides for the first bad record of a segment
//! whether it is a torn tail (cut, reported) or corruption of fsynced data
//! (open fails, naming file and offset). The rule is in the docs of
//! [`super::store`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::index::{self, IdxMsg, Op, PlacedOp, Summary};
use super::segment::{self, Rec};
use super::store::{Cut, Recovery, Store, StoreError};
use crate::storage::record::{self, Bad};

/// Collects a sealed segment's index while it is scanned.
#[derive(Default)]
struct Builder {
    sum: Summary,
    ids: HashMap<String, u32>,
    last_at: usize,
}

/// Where a segment's valid prefix ends and what the scan learnt.
struct Scan {
    /// End of the valid prefix.
    end: usize,
    /// Why it ends before the end of the file.
    bad: Option<Bad>,
    /// The largest `Synced` offset seen (also past the bad record when its
    /// length field let the scan step over it).
    synced: u64,
    /// The end of its span: a compacted segment.
    span: Option<u64>,
}

/// How far a message's seq may skip past the last one indexed: at most
/// `max` seqs that no span explains.
struct Gaps {
    max: u64,
    /// The spans of the compacted segments read so far, in order.
    spans: Vec<(u64, u64)>,
}

impl Gaps {
    /// The skip allowed for a message at `seq` when the last seq indexed
    /// is below `from`: `max` plus the seqs of `from..seq` that spans
    /// cover.
    fn allow(&self, from: u64, seq: u64) -> u64 {
        let mut covered = 0u64;
        for &(a, b) in self.spans.iter().rev() {
            if b <= from {
                break;
            }
            let (lo, hi) = (a.max(from), b.min(seq));
            covered += hi.saturating_sub(lo);
        }
        self.max.saturating_add(covered)
    }

    /// Notes a compacted segment's span; false when it does not follow
    /// the ones before it.
    fn add(&mut self, first: u64, end: u64) -> bool {
        let ordered = self.spans.last().is_none_or(|&(_, b)| b <= first);
        if !ordered || end <= first {
            return false;
        }
        self.spans.push((first, end));
        true
    }
}

/// A bad record in a segment that is not the last: cut unless a later
/// segment proves it was fsynced.
struct Pending {
    path: PathBuf,
    offset: u64,
    len: u64,
    why: Bad,
    /// Index of the segment in the load order.
    index: usize,
}

/// The smallest framed message record: head, fixed fields, a 1-byte
/// subject.
const MSG_RECORD_BYTES_MIN: u64 = (record::HEAD_BYTES + segment::MSG_FIXED_BYTES + 1) as u64;

/// Why a message whose seq skips too far (or reaches u64::MAX) is refused.
const SKIP_TOO_LONG: &str = "sequence beyond what the segments could have held";

pub(super) fn load(store: &mut Store, names: &[u64]) -> Result<Recovery, StoreError> {
    let dir = store.dir().to_path_buf();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| StoreError::Io { path, err }
    };
    let mut report = Recovery::default();
    if names.is_empty() {
        return create(store, &dir);
    }
    // Seqs skip only over messages whose records were cut, each of which
    // took at least `MSG_RECORD_BYTES_MIN` bytes of some segment file.
    // Compacted segments explain the seqs of their spans.
    let mut gaps = Gaps {
        max: names
            .iter()
            .map(|&f| fs::metadata(dir.join(segment::file_name(f))).map_or(0, |m| m.len()))
            .sum::<u64>()
            / MSG_RECORD_BYTES_MIN,
        spans: Vec::new(),
    };
    let mut pending: Vec<Pending> = Vec::new();
    let mut marked: Vec<bool> = Vec::new();
    let mut last_tail = Vec::new();
    for (i, &first) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let path = dir.join(segment::file_name(first));
        if gaps.spans.last().is_some_and(|&(_, end)| first < end) {
            // A segment a compaction merged into the one before it; the
            // crash came before it was deleted.
            if last {
                return Err(corrupt(&path, 0, "last segment inside a compacted span"));
            }
            let idx_path = dir.join(index::file_name(first));
            for p in [&idx_path, &path] {
                match fs::remove_file(p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(p)(e)),
                    _ => {}
                }
            }
            report.deleted += 1;
            marked.push(false);
            continue;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(last)
            .open(&path)
            .map_err(io(&path))?;
        let idx_path = dir.join(index::file_name(first));
        let trusted = if last {
            None
        } else {
            trusted_index(&idx_path, &file, first, store.next_seq())
        };
        store.push_segment(first, path.clone(), file);
        if let Some(sum) = trusted {
            apply_index(store, &sum, &mut gaps)
                .map_err(|off| corrupt(&path, off, SKIP_TOO_LONG))?;
            // A compacted file's mark speaks for itself alone.
            marked.push(sum.synced > 0 && sum.span == 0);
            report.from_index += 1;
            continue;
        }
        let buf = fs::read(&path).map_err(io(&path))?;
        let mut builder = (!last).then(Builder::default);
        let scan = scan(store, first, &buf, &path, builder.as_mut(), &mut gaps)?;
        marked.push(scan.synced > 0 && scan.span.is_none());
        let Some(bad) = scan.bad else {
            if last {
                last_tail = buf;
            } else if let Some(b) = builder {
                if write_index(&idx_path, b, &buf) {
                    report.rebuilt_indexes.push(idx_path);
                }
            }
            continue;
        };
        let offset = scan.end as u64;
        if scan.synced > offset {
            return Err(corrupt(&path, offset, bad));
        }
        let p = Pending {
            path,
            offset,
            len: buf.len() as u64,
            why: bad,
            index: i,
        };
        if last {
            report.cuts.push(cut(&p, first)?);
            last_tail = buf;
            last_tail.truncate(scan.end);
        } else {
            pending.push(p);
        }
    }
    for p in &pending {
        if marked[p.index + 1..].iter().any(|&m| m) {
            return Err(corrupt(&p.path, p.offset, p.why));
        }
        report.cuts.push(cut(p, names[p.index])?);
    }
    finish(store, &last_tail, report)
}

/// A new store: one segment, starting at seq 1.
fn create(store: &mut Store, dir: &Path) -> Result<Recovery, StoreError> {
    let path = dir.join(segment::file_name(1));
    let io = |err| StoreError::Io {
        path: path.clone(),
        err,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(io)?;
    store.push_segment(1, path.clone(), file);
    store.activate(&[]).map_err(io)?;
    store.register_dir().map_err(io)?;
    Ok(Recovery {
        segments: 1,
        ..Recovery::default()
    })
}

/// Makes the last segment active (`tail`: its valid bytes) and deletes the
/// segments every message of which is gone.
fn finish(store: &mut Store, tail: &[u8], mut report: Recovery) -> Result<Recovery, StoreError> {
    let dir = store.dir().to_path_buf();
    let io = |err| StoreError::Io {
        path: dir.clone(),
        err,
    };
    store.activate(tail).map_err(io)?;
    store.register_dir().map_err(io)?;
    let before = store.segment_count();
    store.settle().map_err(io)?;
    report.deleted = before - store.segment_count();
    report.segments = store.segment_count();
    report.messages = store.state().messages;
    Ok(report)
}

fn corrupt(path: &Path, offset: u64, why: impl ToString) -> StoreError {
    StoreError::Corrupt {
        file: path.to_path_buf(),
        offset,
        why: why.to_string(),
    }
}

/// Truncates a segment at a torn record (writing a fresh head when nothing
/// valid is left, so the file still says which seqs it starts at).
fn cut(p: &Pending, first_seq: u64) -> Result<Cut, StoreError> {
    let io = |err| StoreError::Io {
        path: p.path.clone(),
        err,
    };
    let file = OpenOptions::new().write(true).open(&p.path).map_err(io)?;
    file.set_len(p.offset).map_err(io)?;
    if p.offset == 0 {
        let mut head = Vec::new();
        segment::put_head(&mut head, first_seq);
        std::os::unix::fs::FileExt::write_all_at(&file, &head, 0).map_err(io)?;
    }
    file.sync_all().map_err(io)?;
    Ok(Cut {
        file: p.path.clone(),
        offset: p.offset,
        bytes: p.len - p.offset,
        why: p.why.to_string(),
    })
}

/// Applies the valid prefix of one segment to `store`.
fn scan(
    store: &mut Store,
    first: u64,
    buf: &[u8],
    path: &Path,
    mut idx: Option<&mut Builder>,
    gaps: &mut Gaps,
) -> Result<Scan, StoreError> {
    let mut at = 0;
    let mut synced = 0;
    let mut span = None;
    let mut second = false;
    loop {
        let (body, next) = match record::read(buf, at) {
            Ok(None) => {
                if let Some(end) = span {
                    store.set_next_seq(end);
                }
                return Ok(Scan {
                    end: at,
                    bad: None,
                    synced,
                    span,
                });
            }
            Ok(Some(r)) => r,
            Err(bad) => {
                return Ok(Scan {
                    end: at,
                    bad: Some(bad),
                    synced: synced.max(synced_past(buf, at, bad)),
                    span,
                })
            }
        };
        let is_second = std::mem::replace(&mut second, at == 0);
        let rec = segment::decode(body).map_err(|m| corrupt(path, at as u64, m))?;
        let offset = at as u64;
        if let Some(b) = idx.as_deref_mut() {
            b.note(&rec, at, next);
        }
        match rec {
            Rec::Head { first_seq } if at == 0 => {
                if first_seq != first {
                    return Err(corrupt(path, 0, "head does not match the file name"));
                }
                if first_seq < store.next_seq() {
                    return Err(corrupt(path, 0, "segment starts inside the previous one"));
                }
                store.set_next_seq(first_seq);
            }
            _ if at == 0 => return Err(corrupt(path, 0, "segment does not start with a head")),
            Rec::Head { .. } => return Err(corrupt(path, offset, "second head record")),
            Rec::InLog(_) => return Err(corrupt(path, offset, "a replica's record")),
            Rec::Span { end } => {
                if !is_second || !gaps.add(first, end) {
                    return Err(corrupt(path, offset, "span out of place"));
                }
                store.mark_compacted();
                span = Some(end);
            }
            Rec::Msg(m) => {
                if m.seq < store.next_seq() {
                    return Err(corrupt(path, offset, "sequence goes back"));
                }
                if span.is_some_and(|end| m.seq >= end) {
                    return Err(corrupt(path, offset, "message past the segment's span"));
                }
                let len = (next - at) as u64;
                let allow = gaps.allow(store.entries_end(), m.seq);
                if !store.index_msg(m.seq, offset, len, m.subject, m.time_ms, allow) {
                    return Err(corrupt(path, offset, SKIP_TOO_LONG));
                }
            }
            Rec::Remove(seqs) => {
                for s in seqs.iter() {
                    store.unindex(s);
                }
            }
            Rec::Floor { seq } => store.floor(seq),
            Rec::Truncate { seq } => store.truncate_mem(seq),
            Rec::Synced { offset: o } => synced = synced.max(o),
        }
        at = next;
    }
}

/// The largest `Synced` offset in the valid records right after a bad one
/// whose length field is intact (a flipped byte in a body).
fn synced_past(buf: &[u8], at: usize, bad: Bad) -> u64 {
    if bad != Bad::Crc {
        return 0;
    }
    let Some(head) = buf.get(at..at + record::HEAD_BYTES) else {
        return 0;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let mut next = at + record::HEAD_BYTES + len;
    let mut synced = 0;
    while let Ok(Some((body, n))) = record::read(buf, next) {
        if let Ok(Rec::Synced { offset }) = segment::decode(body) {
            synced = synced.max(offset);
        }
        next = n;
    }
    synced
}

impl Builder {
    fn note(&mut self, rec: &Rec<'_>, at: usize, next: usize) {
        self.last_at = at;
        let sum = &mut self.sum;
        match rec {
            Rec::Head { first_seq } => sum.first_seq = *first_seq,
            Rec::Msg(m) => {
                let subj = sum.subject_id(&mut self.ids, m.subject);
                sum.msgs.push(IdxMsg {
                    seq: m.seq,
                    off: at as u32,
                    len: (next - at) as u32,
                    subj,
                    time_ms: m.time_ms,
                });
            }
            Rec::Remove(seqs) => {
                let after = sum.msgs.len() as u32;
                sum.ops.extend(seqs.iter().map(|q| PlacedOp {
                    after,
                    op: Op::Remove(q),
                }));
            }
            Rec::Floor { seq } => sum.ops.push(PlacedOp {
                after: sum.msgs.len() as u32,
                op: Op::Floor(*seq),
            }),
            Rec::Truncate { seq } => sum.ops.push(PlacedOp {
                after: sum.msgs.len() as u32,
                op: Op::Truncate(*seq),
            }),
            Rec::Synced { offset } => sum.synced = sum.synced.max(*offset),
            Rec::Span { end } => sum.span = *end,
            // Never in a stream segment (recovery refuses it).
            Rec::InLog(_) => {}
        }
    }
}

/// Writes the index of a cleanly scanned sealed segment (temp file and
/// rename, no fsync: a lost or torn index is rebuilt). False when it could
/// not be written; the store works without it.
fn write_index(path: &Path, b: Builder, seg: &[u8]) -> bool {
    let mut sum = b.sum;
    sum.seg_len = seg.len() as u64;
    sum.last_off = b.last_at as u64;
    sum.last_crc = match seg.get(b.last_at + 4..b.last_at + 8) {
        Some(c) => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        None => return false,
    };
    let Some(bytes) = index::encode(&sum) else {
        return false;
    };
    let tmp = path.with_extension("idx.tmp");
    fs::write(&tmp, bytes).is_ok() && fs::rename(&tmp, path).is_ok()
}

/// The index of a sealed segment, if it is there, valid, and still
/// describes the segment (same length, same crc in its last record).
fn trusted_index(path: &Path, seg: &File, first: u64, next_seq: u64) -> Option<Summary> {
    let sum = index::decode(&fs::read(path).ok()?)?;
    if sum.first_seq != first || first < next_seq {
        return None;
    }
    if seg.metadata().ok()?.len() != sum.seg_len {
        return None;
    }
    let mut head = [0; record::HEAD_BYTES];
    seg.read_exact_at(&mut head, sum.last_off).ok()?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let end = sum.last_off + record::HEAD_BYTES as u64 + u64::from(len);
    (crc == sum.last_crc && end == sum.seg_len).then_some(sum)
}

/// Loads a sealed segment from its index, in the segment's own order
/// ([`index::decode`] checked that the seqs follow the store's rules);
/// `Err` with the segment offset of a message whose seq skips further
/// than `gap_max`.
fn apply_index(store: &mut Store, sum: &Summary, gaps: &mut Gaps) -> Result<(), u64> {
    store.set_next_seq(sum.first_seq);
    if sum.span != 0 {
        if !gaps.add(sum.first_seq, sum.span) {
            return Err(0);
        }
        store.mark_compacted();
    }
    let mut ops = sum.ops.iter().peekable();
    for (i, m) in sum.msgs.iter().enumerate() {
        while let Some(p) = ops.next_if(|p| p.after as usize <= i) {
            apply_op(store, p.op);
        }
        let subject = &sum.subjects[m.subj as usize];
        let off = u64::from(m.off);
        let allow = gaps.allow(store.entries_end(), m.seq);
        if !store.index_msg(m.seq, off, u64::from(m.len), subject, m.time_ms, allow) {
            return Err(off);
        }
    }
    for p in ops {
        apply_op(store, p.op);
    }
    if sum.span != 0 {
        store.set_next_seq(sum.span);
    }
    Ok(())
}

fn apply_op(store: &mut Store, op: Op) {
    match op {
        Op::Remove(seq) => {
            store.unindex(seq);
        }
        Op::Floor(seq) => store.floor(seq),
        Op::Truncate(seq) => store.truncate_mem(seq),
    }
}

#[cfg(test)]
mod tests {
    use super::Gaps;

    #[test]
    fn spans_explain_only_the_seqs_they_cover() {
        let mut g = Gaps {
            max: 3,
            spans: Vec::new(),
        };
        assert_eq!(g.allow(10, 100), 3);
        assert!(g.add(10, 50));
        assert!(g.add(60, 80));
        assert!(!g.add(70, 90), "overlaps the one before");
        assert!(!g.add(90, 90), "empty");
        assert_eq!(g.allow(5, 100), 3 + 40 + 20);
        assert_eq!(g.allow(20, 30), 3 + 10);
        assert_eq!(g.allow(50, 60), 3);
        assert_eq!(g.allow(75, 100), 3 + 5);
        assert_eq!(g.allow(80, 100), 3);
    }
}
