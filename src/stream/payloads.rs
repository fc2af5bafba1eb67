//! Where a replica of a replicated stream keeps its message payloads: in
//! segment files on disk (the broker's choice), or in memory (the
//! deterministic simulation's). The replica itself keeps only a compact
//! index in memory (seq → subject, time, size and [`Loc`]); apply never
//! reads a payload, so what a backend holds never changes an outcome.
//!
//! On disk a store is a directory of segment files in the stream's own
//! format ([`super::segment`]: a Head record, then Msg records, each
//! framed by [`crate::storage::record`]), named after their first seq.
//! The active file takes appends until it holds `segment_bytes` (the
//! broker's `-segment-size`, as for R1 streams); a file is deleted as
//! soon as every message in it is gone (limits, acks of a work queue,
//! purge, removal), so the disk a stream takes follows its limits.
//!
//! The files are a local cache, not the replica's durable state: the
//! group's Raft log and its snapshots are. Nothing is fsynced, and
//! opening a store empties its directory; a restarted member rebuilds the
//! files from its snapshot and the log's entries after it. Appends are
//! buffered and written at the end of each applied entry ([`Payloads::flush`]);
//! a read of a message still in the buffer is served from it.
//!
//! Why a cache: the Raft log already keeps every acked entry durable on a
//! majority, and its snapshots already reach a follower that fell
//! behind; making these files the snapshot would need a second way of
//! syncing and shipping them. The price: a snapshot
//! ([`super::replica::Replica::snapshot_to`]) copies every payload into
//! the group's snapshot file (`cluster/snapshot_file.rs`).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::segment::{self, MsgRef, Rec};
use crate::storage::record;

/// Where a message's record is: its offset in the file that holds its
/// seq, and its framed length (0: the write failed; it cannot be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loc {
    pub offset: u64,
    pub len: u32,
}

/// A message read back from a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub subject: Box<str>,
    pub headers: Option<Box<str>>,
    pub data: Box<[u8]>,
    pub binary: bool,
    pub time_ms: u64,
}

/// Buffered appends past this many bytes are written at once.
const PENDING_BYTES_MAX: usize = 1 << 20;

/// A replica's payloads.
pub enum Payloads {
    /// Each message's framed record, by seq.
    Memory(BTreeMap<u64, Vec<u8>>),
    Disk(Disk),
}

/// One file of a disk store.
struct Seg {
    /// Messages in it not removed yet.
    live: u64,
    /// Bytes written to it (the buffer not included).
    len: u64,
}

/// The files of a disk store.
pub struct Disk {
    dir: PathBuf,
    segment_bytes: u64,
    /// By first seq.
    segs: BTreeMap<u64, Seg>,
    /// The file appends go to (the last of `segs`) and its handle.
    active: Option<(u64, File)>,
    /// Appends not written yet (all to the active file, after its `len`).
    pending: Vec<u8>,
    /// The last seq appended.
    last: u64,
}

impl Payloads {
    pub fn memory() -> Payloads {
        Payloads::Memory(BTreeMap::new())
    }

    /// A disk store in `dir`, emptied of what an earlier run left.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<Payloads> {
        match fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        fs::create_dir_all(dir)?;
        Ok(Payloads::Disk(Disk {
            dir: dir.to_path_buf(),
            segment_bytes: segment_bytes.max(1),
            segs: BTreeMap::new(),
            active: None,
            pending: Vec::new(),
            last: 0,
        }))
    }

    /// Stores message `m` (its seq above every seq stored before).
    pub fn append(&mut self, m: &MsgRef<'_>) -> io::Result<Loc> {
        match self {
            Payloads::Memory(map) => {
                let mut rec = Vec::new();
                let len = segment::put_msg(&mut rec, m);
                map.insert(m.seq, rec);
                Ok(Loc {
                    offset: 0,
                    len: len as u32,
                })
            }
            Payloads::Disk(d) => d.append(m),
        }
    }

    /// Reads back the message `seq` stored at `loc`.
    pub fn read(&self, seq: u64, loc: Loc) -> io::Result<Payload> {
        if loc.len == 0 {
            return Err(io::Error::other(format!("message {seq} was not written")));
        }
        match self {
            Payloads::Memory(map) => {
                let rec = map
                    .get(&seq)
                    .filter(|r| r.len() == loc.len as usize)
                    .ok_or_else(|| io::Error::other(format!("no message {seq} at {loc:?}")))?;
                decode(seq, rec)
            }
            Payloads::Disk(d) => d.read(seq, loc),
        }
    }

    /// Message `seq` is gone; its file goes with the last of its messages.
    /// Each stored seq is removed at most once (the replica's index says
    /// which are stored); a seq above every stored one is ignored.
    pub fn remove(&mut self, seq: u64) {
        match self {
            Payloads::Memory(map) => {
                map.remove(&seq);
            }
            Payloads::Disk(d) => d.remove(seq),
        }
    }

    /// Writes the buffered appends (at the end of each entry).
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Payloads::Memory(_) => Ok(()),
            Payloads::Disk(d) => d.flush(),
        }
    }

    /// The files on disk (0 in memory).
    pub fn files(&self) -> usize {
        match self {
            Payloads::Memory(_) => 0,
            Payloads::Disk(d) => d.segs.len(),
        }
    }

    /// What the store holds now, detached from it (see [`Detached`]);
    /// buffered appends are written first.
    pub fn detach(&mut self) -> io::Result<Detached> {
        match self {
            Payloads::Memory(map) => Ok(Detached::Memory(map.clone())),
            Payloads::Disk(d) => {
                d.flush()?;
                let mut files = BTreeMap::new();
                for &first in d.segs.keys() {
                    files.insert(first, File::open(d.path(first))?);
                }
                Ok(Detached::Disk(files))
            }
        }
    }

    /// The directory of a disk store.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Payloads::Memory(_) => None,
            Payloads::Disk(d) => Some(&d.dir),
        }
    }
}

/// The payloads a store holds at one moment, readable on another thread
/// while the store goes on: the files open (a file deleted later is
/// still read whole), or, in memory, a copy of the records.
pub enum Detached {
    Memory(BTreeMap<u64, Vec<u8>>),
    /// Each file by its first seq.
    Disk(BTreeMap<u64, File>),
}

impl Detached {
    /// Reads back message `seq` stored at `loc` when this was taken.
    pub fn read(&self, seq: u64, loc: Loc) -> io::Result<Payload> {
        match self {
            Detached::Memory(map) => map
                .get(&seq)
                .filter(|r| r.len() == loc.len as usize && loc.len > 0)
                .ok_or_else(|| io::Error::other(format!("no message {seq} at {loc:?}")))
                .and_then(|rec| decode(seq, rec)),
            Detached::Disk(files) => {
                let (_, file) = files
                    .range(..=seq)
                    .next_back()
                    .filter(|_| loc.len > 0)
                    .ok_or_else(|| io::Error::other(format!("no file holds message {seq}")))?;
                let mut buf = vec![0; loc.len as usize];
                file.read_exact_at(&mut buf, loc.offset)?;
                decode(seq, &buf)
            }
        }
    }
}

fn decode(seq: u64, rec: &[u8]) -> io::Result<Payload> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    let (body, _) = record::read(rec, 0)
        .map_err(|e| bad(format!("message {seq}: {e}")))?
        .ok_or_else(|| bad(format!("message {seq}: no record")))?;
    match segment::decode(body) {
        Ok(Rec::Msg(m)) if m.seq == seq => Ok(Payload {
            subject: m.subject.into(),
            headers: m.headers.map(Into::into),
            data: m.data.into(),
            binary: m.binary,
            time_ms: m.time_ms,
        }),
        Ok(_) => Err(bad(format!("message {seq}: another record"))),
        Err(e) => Err(bad(format!("message {seq}: {e}"))),
    }
}

impl Disk {
    fn path(&self, first: u64) -> PathBuf {
        self.dir.join(segment::file_name(first))
    }

    fn append(&mut self, m: &MsgRef<'_>) -> io::Result<Loc> {
        let full = self.active.as_ref().is_some_and(|(first, _)| {
            self.segs[first].len + self.pending.len() as u64 >= self.segment_bytes
        });
        if full {
            self.flush()?;
            self.active = None;
        }
        if self.active.is_none() {
            let path = self.path(m.seq);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            self.segs.insert(m.seq, Seg { live: 0, len: 0 });
            self.active = Some((m.seq, file));
            segment::put_head(&mut self.pending, m.seq);
        }
        let Some((first, _)) = self.active else {
            unreachable!("an active file was just made");
        };
        let offset = self.segs[&first].len + self.pending.len() as u64;
        let len = segment::put_msg(&mut self.pending, m);
        self.last = m.seq;
        if let Some(s) = self.segs.get_mut(&first) {
            s.live += 1;
        }
        if self.pending.len() >= PENDING_BYTES_MAX {
            self.flush()?;
        }
        Ok(Loc {
            offset,
            len: len as u32,
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let Some((first, file)) = self.active.as_mut() else {
            self.pending.clear();
            return Ok(());
        };
        let seg = self
            .segs
            .get_mut(first)
            .ok_or_else(|| io::Error::other("lost segment"))?;
        let r = file.write_all_at(&self.pending, seg.len);
        if r.is_ok() {
            seg.len += self.pending.len() as u64;
        }
        self.pending.clear();
        r
    }

    /// The first seq of the file holding `seq`.
    fn seg_of(&self, seq: u64) -> Option<u64> {
        self.segs.range(..=seq).next_back().map(|(&f, _)| f)
    }

    fn read(&self, seq: u64, loc: Loc) -> io::Result<Payload> {
        let first = self
            .seg_of(seq)
            .ok_or_else(|| io::Error::other(format!("no file holds message {seq}")))?;
        let seg = &self.segs[&first];
        let mut buf = vec![0; loc.len as usize];
        let active = self.active.as_ref().filter(|(f, _)| *f == first);
        if let Some((_, file)) = active {
            if loc.offset >= seg.len {
                let at = (loc.offset - seg.len) as usize;
                let rec = self
                    .pending
                    .get(at..at + buf.len())
                    .ok_or_else(|| io::Error::other(format!("message {seq} past the buffer")))?;
                return decode(seq, rec);
            }
            file.read_exact_at(&mut buf, loc.offset)?;
        } else {
            File::open(self.path(first))?.read_exact_at(&mut buf, loc.offset)?;
        }
        decode(seq, &buf)
    }

    fn remove(&mut self, seq: u64) {
        if seq > self.last {
            return;
        }
        let Some(first) = self.seg_of(seq) else {
            return;
        };
        let Some(seg) = self.segs.get_mut(&first) else {
            return;
        };
        seg.live = seg.live.saturating_sub(1);
        if seg.live > 0 {
            return;
        }
        self.segs.remove(&first);
        if self.active.as_ref().is_some_and(|(f, _)| *f == first) {
            self.active = None;
            self.pending.clear();
        }
        let path = self.path(first);
        if let Err(e) = fs::remove_file(&path) {
            crate::log_error!("{}: {e}", path.display());
        }
    }
}

impl Drop for Disk {
    /// The files are a cache of this replica: they go with it.
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "gombus-payloads-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn msg(seq: u64, data: &[u8]) -> MsgRef<'_> {
        MsgRef {
            seq,
            time_ms: seq * 10,
            subject: "a.b",
            headers: seq.is_multiple_of(2).then_some("{\"k\":1}"),
            data,
            binary: seq.is_multiple_of(3),
        }
    }

    fn seg_files(dir: &Path) -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| segment::parse_name(e.unwrap().file_name().to_str()?))
            .collect();
        v.sort_unstable();
        v
    }

    fn check(p: &Payloads, seq: u64, loc: Loc, data: &[u8]) {
        let got = p.read(seq, loc).unwrap();
        let want = msg(seq, data);
        assert_eq!(
            (
                &*got.subject,
                got.headers.as_deref(),
                &*got.data,
                got.binary,
                got.time_ms
            ),
            (
                want.subject,
                want.headers,
                want.data,
                want.binary,
                want.time_ms
            ),
            "message {seq}"
        );
    }

    #[test]
    fn appends_read_back_from_the_buffer_and_from_the_files() {
        for mut p in [
            Payloads::memory(),
            Payloads::open(&temp_dir(), 1 << 20).unwrap(),
        ] {
            let data: Vec<Vec<u8>> = (1..=50u64)
                .map(|i| vec![i as u8; 100 * i as usize])
                .collect();
            let mut locs = Vec::new();
            for (i, d) in data.iter().enumerate() {
                locs.push(p.append(&msg(i as u64 + 1, d)).unwrap());
                // Readable at once, before any flush.
                check(&p, i as u64 + 1, locs[i], d);
            }
            p.flush().unwrap();
            for (i, d) in data.iter().enumerate() {
                check(&p, i as u64 + 1, locs[i], d);
            }
            // A wrong location is an error, not someone else's message.
            assert!(p.read(7, locs[5]).is_err());
            assert!(p.read(7, Loc::default()).is_err());
        }
    }

    #[test]
    fn files_roll_and_go_with_their_last_message() {
        let dir = temp_dir();
        let mut p = Payloads::open(&dir, 10_000).unwrap();
        let d = vec![7u8; 3_000];
        let locs: Vec<Loc> = (1..=12).map(|s| p.append(&msg(s, &d)).unwrap()).collect();
        p.flush().unwrap();
        // Four messages (with the head) make a file full.
        assert_eq!(seg_files(&dir), vec![1, 5, 9]);
        assert_eq!(p.files(), 3);
        for s in [1, 2, 3, 6, 7, 8] {
            p.remove(s);
        }
        assert_eq!(seg_files(&dir), vec![1, 5, 9], "each file keeps one");
        p.remove(4);
        p.remove(5);
        assert_eq!(seg_files(&dir), vec![9]);
        check(&p, 10, locs[9], &d);
        // The active file going empty is deleted too; appends start anew.
        for s in 9..=12 {
            p.remove(s);
        }
        assert!(seg_files(&dir).is_empty());
        let loc = p.append(&msg(13, &d)).unwrap();
        p.flush().unwrap();
        assert_eq!(seg_files(&dir), vec![13]);
        check(&p, 13, loc, &d);
        // Removing what is not there changes nothing.
        p.remove(3);
        p.remove(99);
        assert_eq!(seg_files(&dir), vec![13]);
        // The files are the stream's own segment format.
        let bytes = fs::read(dir.join(segment::file_name(13))).unwrap();
        let (bodies, end, bad) = record::scan(&bytes);
        assert_eq!((end, bad), (bytes.len(), None));
        assert_eq!(segment::decode(bodies[0]), Ok(Rec::Head { first_seq: 13 }));
        assert!(matches!(segment::decode(bodies[1]), Ok(Rec::Msg(m)) if m.seq == 13));
        drop(p);
        assert!(!dir.exists(), "the cache goes with its replica");
    }

    #[test]
    fn opening_empties_what_an_earlier_run_left() {
        let dir = temp_dir();
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(segment::file_name(1)), b"stale").unwrap();
        let mut p = Payloads::open(&dir, 1 << 20).unwrap();
        assert!(seg_files(&dir).is_empty());
        let loc = p.append(&msg(5, b"x")).unwrap();
        check(&p, 5, loc, b"x");
    }
}
