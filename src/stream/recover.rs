//! Opening a store: reads every segment from its start, rebuilds the
//! in-memory index, and decides for the first bad record of a segment
//! whether it is a torn tail (cut, reported) or corruption of fsynced data
//! (open fails, naming file and offset). The rule is in the docs of
//! [`super::store`].

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use super::record::{self, Bad};
use super::segment::{self, Rec};
use super::store::{Cut, Recovery, Store, StoreError};

/// Where a segment's valid prefix ends and what the scan learnt.
struct Scan {
    /// End of the valid prefix.
    end: usize,
    /// Why it ends before the end of the file.
    bad: Option<Bad>,
    /// The largest `Synced` offset seen (also past the bad record when its
    /// length field let the scan step over it).
    synced: u64,
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

pub(super) fn load(store: &mut Store, names: &[u64]) -> Result<Recovery, StoreError> {
    let dir = store.dir().to_path_buf();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| StoreError::Io { path, err }
    };
    let mut report = Recovery::default();
    if names.is_empty() {
        let path = dir.join(segment::file_name(1));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io(&path))?;
        store.push_segment(1, path.clone(), file);
        store.activate(&[]).map_err(io(&path))?;
        store.register_dir().map_err(io(&dir))?;
        report.segments = 1;
        return Ok(report);
    }
    let mut pending: Vec<Pending> = Vec::new();
    let mut marked: Vec<bool> = Vec::new();
    let mut last_tail = Vec::new();
    for (i, &first) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let path = dir.join(segment::file_name(first));
        let buf = fs::read(&path).map_err(io(&path))?;
        let file = OpenOptions::new()
            .read(true)
            .write(last)
            .open(&path)
            .map_err(io(&path))?;
        store.push_segment(first, path.clone(), file);
        let scan = scan(store, first, &buf, &path)?;
        marked.push(scan.synced > 0);
        let Some(bad) = scan.bad else {
            if last {
                last_tail = buf;
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
    store.activate(&last_tail).map_err(io(&dir))?;
    store.register_dir().map_err(io(&dir))?;
    let before = store.segment_count();
    store.settle().map_err(io(&dir))?;
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
fn scan(store: &mut Store, first: u64, buf: &[u8], path: &Path) -> Result<Scan, StoreError> {
    let mut at = 0;
    let mut synced = 0;
    loop {
        let (body, next) = match record::read(buf, at) {
            Ok(None) => {
                return Ok(Scan {
                    end: at,
                    bad: None,
                    synced,
                })
            }
            Ok(Some(r)) => r,
            Err(bad) => {
                return Ok(Scan {
                    end: at,
                    bad: Some(bad),
                    synced: synced.max(synced_past(buf, at, bad)),
                })
            }
        };
        let rec = segment::decode(body).map_err(|m| corrupt(path, at as u64, m))?;
        let offset = at as u64;
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
            Rec::Msg(m) => {
                if m.seq < store.next_seq() {
                    return Err(corrupt(path, offset, "sequence goes back"));
                }
                let len = (next - at) as u64;
                store.index_msg(m.seq, offset, len, m.subject, m.time_ms);
            }
            Rec::Remove(seqs) => {
                for s in seqs.iter() {
                    store.unindex(s);
                }
            }
            Rec::Floor { seq } => store.floor(seq),
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
