//! The segment store of one stream: its directory of segment files, the
//! in-memory index over them, appends, reads, removals and recovery.
//!
//! # Using it
//!
//! ```text
//! let (mut store, report) = Store::open(dir, Options { syncer: Some(syncer), ..Default::default() })?;
//! let seq = store.append("orders.eu", None, b"payload", false, now_ms)?;   // buffered
//! ...                                  // more appends / removals this loop turn
//! let ticket = store.flush()?;         // write(2) of everything buffered
//! // policy `always`: hold the acks until syncer.covered(ticket)
//! // (checked in Handler::woken); `interval` / `none`: ack now.
//! ```
//!
//! - [`Store::open`] creates the directory if needed, loads every segment,
//!   cuts a torn tail and returns a [`Recovery`] report, or
//!   [`StoreError::Corrupt`] (file and offset) when a bad record sits where
//!   data is known to have been fsynced.
//! - Appends and removals are encoded into an in-memory buffer and written
//!   with one write(2) by [`Store::flush`] (or when 1 MiB is buffered). The
//!   engine calls `flush` once per event-loop turn, before it sends any ack
//!   for the turn's appends: an acked message has been written, so it
//!   survives `kill -9` under every sync policy. `flush` hands the file to
//!   the [`Syncer`] and returns the [`Ticket`] of the fsync round that will
//!   cover what it wrote.
//! - Sequences start at 1 and never go back, also across purges and
//!   restarts: the state keeps `last_seq` when every message is gone.
//! - Reads: [`Store::get`], [`Store::last_seq_for_subject`] and
//!   [`Store::first_seq_for_subject`] (the per-subject index),
//!   [`Store::next_matching`] (the next live seq ≥ n whose subject passes a
//!   predicate), [`Store::state`], [`Store::subject_count`]. A read of a
//!   message in the last few MiB of the active segment is served from the
//!   write buffer without a disk read; older ones with one pread.
//! - Removal: [`Store::remove`] (one seq), [`Store::purge`] (all),
//!   [`Store::purge_subjects`] (every message whose subject passes a
//!   predicate), [`Store::expire_before`] (the oldest messages, in seq
//!   order, up to the first one not older than a time). Every removal is a
//!   record in the active segment, so it survives restart once flushed;
//!   a segment is deleted whole once every message in it is gone and every
//!   segment before it is deleted.
//! - Compaction: [`Store::compact_step`] (which a stream runs after each
//!   flush) rewrites sealed segments whose live messages fill under a
//!   quarter of them, oldest first, a bounded run per step, so messages
//!   that outlive newer ones (a key-value bucket's cold keys) no longer
//!   pin every segment written since: disk stays within about four times
//!   the live bytes plus a few segments.
//!
//! # As a log
//!
//! Two operations let the store serve as a replicated log (an entry is a
//! message whose seq is its index): [`Store::remove_below`] compacts the
//! prefix a snapshot covers (and moves the next seq past a snapshot that
//! is ahead of the log), and [`Store::truncate_from`] cuts a conflicting
//! suffix, after which seqs go back. Streams never call them, and cluster
//! mode's Raft log is a file of its own (`cluster/raft_log.rs`); they are
//! checked, with their recovery rules, against a model
//! (`tests/store_model.rs`). A compacted store refuses `truncate_from`
//! (a span says the seqs it covers are settled). Everything else
//! (group commit through the [`Syncer`], recovery, index files) is the
//! same as for streams.
//!
//! # Files and recovery
//!
//! One directory per stream holds `{first_seq:020}.seg` segment files (the
//! record kinds are in [`super::segment`]); other files there are left
//! alone. The last segment is the active one; it rolls (a new file named
//! after the next seq) once it holds `segment_bytes`.
//!
//! A sealed segment gets an index file (`{first_seq:020}.idx`, see
//! [`super::index`]) the first time the store is opened after it was
//! sealed; later opens load the segment from it without reading the
//! segment, as long as the segment's length and last record still match.
//! A missing, damaged or stale index means one scan and a new index.
//!
//! After each completed fsync round the store remembers up to where the
//! active segment was fsynced, and the next record it appends is preceded
//! by a `Synced` mark holding that offset. At open, a segment is read from
//! its start; at the first bad record (short, bad length, crc mismatch):
//! - if a `Synced` mark of that segment (before the bad record, or after it
//!   when its length field lets the scan step over it) lies beyond it, or
//!   any later segment holds a `Synced` mark (the round that synced the
//!   later segment also synced every earlier one), the data there was
//!   fsynced: this is corruption, and open fails naming file and offset;
//! - otherwise it is a torn tail: the file is cut there, and the cut is
//!   reported (file, offset, bytes, reason). Its records are never served.
//!
//! A compacted segment (head, span, a `Synced` mark over the whole file,
//! then needed removals and live messages) was fsynced before it replaced
//! the old file, so a bad record in it is corruption; its mark says
//! nothing about earlier segments. Seqs inside a span that the file does
//! not hold are gone, and do not count as a skip; a segment file whose
//! first seq lies inside an earlier file's span was merged into it by a
//! compaction the crash interrupted, and is deleted, as is a `.seg.tmp`.
//!
//! Marks are written lazily, so the known synced offset is a lower bound:
//! bit rot in the very last acked records may be taken for a torn tail.
//! Under `-sync=none` there are no marks and every bad record is a cut.
//!
//! # Memory
//!
//! The index of seqs (`store/rows.rs`) grows with the live messages, not
//! with the seqs from the first live one to the last: a 24-byte slot per
//! seq of a window of recent seqs (removed ones in between keep their
//! slot while the window holds them), and a 32-byte entry per live message
//! older than the window. After an append the window is at most
//! [`Options::index_window_slots`] (1024 by default) or four slots per
//! live message in it long; past that, its oldest live messages move to
//! the list of older ones. A key-value bucket's cold key thus costs one
//! entry, however many puts came after it. Plus one entry per distinct
//! live subject, plus the write buffer (`cache_bytes`, 4 MiB by default,
//! held at most twice).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::index;
use super::segment::{self, MsgRef, Rec};
use crate::storage::record;
use crate::storage::sync::{FileKey, SyncPolicy, Syncer, Ticket};

mod compact;
mod rows;
#[doc(hidden)]
pub use compact::Phase;
pub use rows::WINDOW_SLOTS_DEFAULT;
use rows::{IndexRow, Rows};

/// Default size at which the active segment rolls.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 << 20;
/// Largest segment size (offsets in the index are `u32`).
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// Buffered bytes that trigger a write(2) without waiting for `flush`.
pub const PENDING_BYTES_MAX: usize = 1 << 20;

const _: () = assert!(SEGMENT_BYTES_MAX + record::BODY_BYTES_MAX as u64 <= u32::MAX as u64);

/// How a store is opened.
#[derive(Clone)]
pub struct Options {
    /// The active segment rolls once it holds this many bytes.
    pub segment_bytes: u64,
    /// Recent bytes of the active segment kept in memory for reads.
    pub cache_bytes: usize,
    /// The broker's fsync thread (`None`: never fsync, as `-sync=none`).
    pub syncer: Option<Arc<Syncer>>,
    /// Recent seqs the index keeps a slot for however few of them are
    /// live; live messages older than the window's front, among mostly
    /// removed ones, are kept in a sparse list instead (see "# Memory").
    pub index_window_slots: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            cache_bytes: 4 << 20,
            syncer: None,
            index_window_slots: WINDOW_SLOTS_DEFAULT,
        }
    }
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub seq: u64,
    pub time_ms: u64,
    pub subject: String,
    /// Raw JSON object text, as given to `append`.
    pub headers: Option<String>,
    pub data: Vec<u8>,
    pub binary: bool,
}

/// The contract's stream state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub messages: u64,
    /// Framed record bytes of the live messages.
    pub bytes: u64,
    /// First live seq; `last_seq + 1` when empty; 0 when nothing was ever
    /// stored.
    pub first_seq: u64,
    pub last_seq: u64,
}

/// A torn tail cut at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub file: PathBuf,
    pub offset: u64,
    pub bytes: u64,
    pub why: String,
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cut {} bytes of {} at offset {} ({})",
            self.bytes,
            self.file.display(),
            self.offset,
            self.why
        )
    }
}

/// What [`Store::open`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    pub cuts: Vec<Cut>,
    pub segments: usize,
    pub messages: u64,
    /// Segment files deleted at open because every message in them is gone.
    pub deleted: usize,
    /// Sealed segments loaded from their index file without reading them.
    pub from_index: usize,
    /// Index files written because they were missing, damaged or stale.
    pub rebuilt_indexes: Vec<PathBuf>,
}

/// Why a store cannot be opened.
#[derive(Debug)]
pub enum StoreError {
    Io {
        path: PathBuf,
        err: io::Error,
    },
    /// A bad record where data is known to be fsynced.
    Corrupt {
        file: PathBuf,
        offset: u64,
        why: String,
    },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Io { path, err } => write!(f, "{}: {err}", path.display()),
            StoreError::Corrupt { file, offset, why } => write!(
                f,
                "{} is corrupt at offset {offset}: {why} (data there was fsynced; refusing to serve this stream)",
                file.display()
            ),
        }
    }
}

impl std::error::Error for StoreError {}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |err| StoreError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// One segment file.
struct Seg {
    first_seq: u64,
    path: PathBuf,
    file: File,
    /// Live messages in it.
    live: u64,
    /// Framed bytes of its live messages.
    live_bytes: u64,
    /// Message records the file holds, live or removed.
    held: u64,
    /// Its length once sealed (the active segment's is `active_len`).
    len: u64,
    /// Rewritten by compaction: it has a span.
    compacted: bool,
    /// Its registration with the syncer (the active segment only).
    key: Option<FileKey>,
}

struct SubjectInfo {
    name: Box<str>,
    count: u64,
    /// Last live seq with this subject; 0 when it must be searched again.
    last: Cell<u64>,
    /// No live seq with this subject is below it (the oldest is found by
    /// searching on from here, and remembered).
    first: Cell<u64>,
}

/// Live subjects, interned: index rows hold a `u32` id.
#[derive(Default)]
struct Subjects {
    infos: Vec<SubjectInfo>,
    ids: HashMap<Box<str>, u32>,
    free: Vec<u32>,
}

impl Subjects {
    fn add(&mut self, name: &str, seq: u64) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            let info = &mut self.infos[id as usize];
            info.count += 1;
            info.last.set(seq);
            return id;
        }
        let info = SubjectInfo {
            name: name.into(),
            count: 1,
            last: Cell::new(seq),
            first: Cell::new(seq),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.infos[id as usize] = info;
                id
            }
            None => {
                self.infos.push(info);
                (self.infos.len() - 1) as u32
            }
        };
        self.ids.insert(name.into(), id);
        id
    }

    fn drop_one(&mut self, id: u32, seq: u64) {
        let info = &mut self.infos[id as usize];
        info.count -= 1;
        if info.last.get() == seq {
            info.last.set(0);
        }
        if info.count == 1 && info.last.get() != 0 {
            // The one left is the last: a key-value bucket's next read of
            // the key needs no search from the seq just removed.
            info.first.set(info.last.get());
        }
        if info.count == 0 {
            let name = std::mem::take(&mut info.name);
            self.ids.remove(&name);
            self.free.push(id);
        }
    }

    fn clear(&mut self) {
        *self = Subjects::default();
    }
}

/// One stream's segment store. See the module docs.
pub struct Store {
    dir: PathBuf,
    opts: Options,
    segs: VecDeque<Seg>,
    /// Bytes of the active segment from `cache_start` to its logical end;
    /// the part from `written` on is not written yet.
    cache: Vec<u8>,
    cache_start: u64,
    written: u64,
    rows: Rows,
    next_seq: u64,
    msgs: u64,
    bytes: u64,
    subjects: Subjects,
    /// The directory, registered with the syncer (new and deleted files).
    dir_key: Option<FileKey>,
    dir_dirty: bool,
    /// Written since the last `Syncer::dirty` call.
    undirtied: bool,
    last_ticket: Ticket,
    /// (ticket, active-segment offset written when it was taken).
    rounds: VecDeque<(Ticket, u64)>,
    synced: u64,
    marked: u64,
    failed: Option<String>,
    /// Sealed segments may be worth compacting (set at open and roll).
    compact_due: bool,
    /// A Truncate record was loaded or written: seqs may go back, so no
    /// segment is compacted.
    truncated: bool,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`. See the module docs
    /// for what recovery does.
    pub fn open(dir: &Path, opts: Options) -> Result<(Store, Recovery), StoreError> {
        if opts.segment_bytes == 0 || opts.segment_bytes > SEGMENT_BYTES_MAX {
            return Err(StoreError::Io {
                path: dir.to_path_buf(),
                err: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "segment size must be between 1 byte and 1 GiB",
                ),
            });
        }
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let mut names = Vec::new();
        let mut idx_files = Vec::new();
        for ent in fs::read_dir(dir).map_err(io_at(dir))? {
            let ent = ent.map_err(io_at(dir))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if let Some(first) = segment::parse_name(name) {
                names.push(first);
            } else if let Some(first) = index::parse_name(name) {
                idx_files.push((first, ent.path()));
            } else if name.ends_with(".idx.tmp") || name.ends_with(".seg.tmp") {
                // Left by a crash while an index or a compacted segment
                // was written.
                let _ = fs::remove_file(ent.path());
            }
        }
        names.sort_unstable();
        for (first, path) in idx_files {
            if names.binary_search(&first).is_err() {
                // Its segment was deleted after it (a crash in between).
                let _ = fs::remove_file(path);
            }
        }
        let rows = Rows::new(1, opts.index_window_slots);
        let mut store = Store {
            dir: dir.to_path_buf(),
            opts,
            segs: VecDeque::new(),
            cache: Vec::new(),
            cache_start: 0,
            written: 0,
            rows,
            next_seq: 1,
            msgs: 0,
            bytes: 0,
            subjects: Subjects::default(),
            dir_key: None,
            dir_dirty: false,
            undirtied: false,
            last_ticket: 0,
            rounds: VecDeque::new(),
            synced: 0,
            marked: 0,
            failed: None,
            compact_due: true,
            truncated: false,
        };
        let report = super::recover::load(&mut store, &names)?;
        Ok((store, report))
    }

    /// The stream's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a message (buffered; written by the next [`Store::flush`]).
    /// `headers` is raw JSON object text. The subject must be 1..=65535
    /// bytes.
    pub fn append(
        &mut self,
        subject: &str,
        headers: Option<&str>,
        data: &[u8],
        binary: bool,
        time_ms: u64,
    ) -> io::Result<u64> {
        self.check()?;
        if subject.is_empty() || subject.len() > segment::SUBJECT_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "subject must be 1..=65535 bytes",
            ));
        }
        let body = segment::MSG_FIXED_BYTES
            + subject.len()
            + headers.map_or(0, |h| 4 + h.len())
            + data.len();
        if body > record::BODY_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message too large for one record",
            ));
        }
        if self.active_len() >= self.opts.segment_bytes && self.next_seq > self.active().first_seq {
            self.roll()?;
        }
        self.put_mark();
        let seq = self.next_seq;
        let off = self.active_len();
        if off + (body + record::HEAD_BYTES) as u64 > u64::from(u32::MAX) {
            // Only an active segment holding no message can get here (it
            // cannot roll to a file of the same name): removal records alone
            // past 4 GiB.
            return Err(io::Error::other("active segment past 4 GiB"));
        }
        let len = segment::put_msg(
            &mut self.cache,
            &MsgRef {
                seq,
                time_ms,
                subject,
                headers,
                data,
                binary,
            },
        );
        let indexed = self.index_msg(seq, off, len as u64, subject, time_ms, 0);
        debug_assert!(indexed, "an append takes the next seq");
        self.write_if_full()?;
        Ok(seq)
    }

    /// Writes everything buffered with one write(2), tells the syncer, and
    /// returns the ticket of the fsync round that covers every append and
    /// removal made so far (0 with no syncer or nothing ever written).
    pub fn flush(&mut self) -> io::Result<Ticket> {
        self.check()?;
        self.write_pending()?;
        if let Some(s) = &self.opts.syncer {
            if let Some(f) = s.failure() {
                return Err(io::Error::other(f));
            }
            if self.dir_dirty {
                if let Some(k) = self.dir_key {
                    self.last_ticket = self.last_ticket.max(s.dirty(k));
                }
                self.dir_dirty = false;
            }
            if self.undirtied {
                if let Some(k) = self.active().key {
                    let t = s.dirty(k);
                    self.last_ticket = self.last_ticket.max(t);
                    // One entry per round: bounded by the rounds in flight.
                    match self.rounds.back_mut() {
                        Some(r) if r.0 == t => r.1 = self.written,
                        _ => self.rounds.push_back((t, self.written)),
                    }
                }
                self.undirtied = false;
            }
        }
        Ok(self.last_ticket)
    }

    /// Flushes and fsyncs on this thread (shutdown, tests; not for the
    /// event loop).
    pub fn sync_now(&mut self) -> io::Result<()> {
        self.flush()?;
        self.active().file.sync_data()?;
        File::open(&self.dir)?.sync_all()
    }

    /// The contract's state.
    pub fn state(&self) -> State {
        let last_seq = self.next_seq - 1;
        let first_seq = if self.msgs > 0 {
            self.rows.first().unwrap_or(self.next_seq)
        } else if last_seq == 0 {
            0
        } else {
            self.next_seq
        };
        State {
            messages: self.msgs,
            bytes: self.bytes,
            first_seq,
            last_seq,
        }
    }

    /// The message `seq`, if it is live. An `InvalidData` error names the
    /// file and offset of a record that fails its crc.
    pub fn get(&self, seq: u64) -> io::Result<Option<Message>> {
        let Some(e) = self.entry(seq) else {
            return Ok(None);
        };
        let mut owned = Vec::new();
        let (bytes, seg) = self.record_bytes(seq, e, &mut owned)?;
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} offset {}: {why}", seg.path.display(), e.off),
            )
        };
        let body = match record::read(bytes, 0) {
            Ok(Some((body, _))) => body,
            Ok(None) => return Err(bad("empty record".into())),
            Err(b) => return Err(bad(b.to_string())),
        };
        match segment::decode(body) {
            Ok(Rec::Msg(m)) if m.seq == seq => Ok(Some(Message {
                seq,
                time_ms: m.time_ms,
                subject: m.subject.to_string(),
                headers: m.headers.map(str::to_string),
                data: m.data.to_vec(),
                binary: m.binary,
            })),
            Ok(_) => Err(bad("not the message the index points at".into())),
            Err(m) => Err(bad(m.to_string())),
        }
    }

    /// The subject and time of a live message, without reading it.
    pub fn meta(&self, seq: u64) -> Option<(&str, u64)> {
        let e = self.entry(seq)?;
        Some((&self.subjects.infos[e.subj as usize].name, e.time_ms))
    }

    /// The last live seq whose subject is exactly `subject`.
    pub fn last_seq_for_subject(&self, subject: &str) -> Option<u64> {
        let &id = self.subjects.ids.get(subject)?;
        let info = &self.subjects.infos[id as usize];
        if info.last.get() == 0 {
            let (seq, _) = self.rows.live_from(0).rev().find(|(_, e)| e.subj == id)?;
            info.last.set(seq);
        }
        Some(info.last.get())
    }

    /// The first live seq whose subject is exactly `subject`.
    pub fn first_seq_for_subject(&self, subject: &str) -> Option<u64> {
        let &id = self.subjects.ids.get(subject)?;
        let info = &self.subjects.infos[id as usize];
        let seq = self.rows.find_subject_from(info.first.get(), id)?;
        info.first.set(seq);
        Some(seq)
    }

    /// The first live seq ≥ `from` whose subject passes `pred` (asked once
    /// per run of equal subjects).
    pub fn next_matching(&self, from: u64, mut pred: impl FnMut(&str) -> bool) -> Option<u64> {
        let mut memo: Option<(u32, bool)> = None;
        let found = self.rows.find_from(from, |e| match memo {
            Some((id, r)) if id == e.subj => r,
            _ => {
                let r = pred(&self.subjects.infos[e.subj as usize].name);
                memo = Some((e.subj, r));
                r
            }
        });
        found.map(|(seq, _)| seq)
    }

    /// Live messages with exactly this subject.
    pub fn subject_count(&self, subject: &str) -> u64 {
        self.subjects
            .ids
            .get(subject)
            .map_or(0, |&id| self.subjects.infos[id as usize].count)
    }

    /// Every live subject with its message count (in no particular order).
    pub fn subjects(&self) -> impl Iterator<Item = (&str, u64)> {
        self.subjects
            .infos
            .iter()
            .filter(|i| i.count > 0)
            .map(|i| (&*i.name, i.count))
    }

    /// Removes one message; false if it was not live.
    pub fn remove(&mut self, seq: u64) -> io::Result<bool> {
        self.check()?;
        if !self.unindex(seq) {
            return Ok(false);
        }
        self.put_mark();
        segment::put_remove(&mut self.cache, &[seq]);
        self.settle()?;
        self.write_if_full()?;
        Ok(true)
    }

    /// Removes every message; returns how many there were. The seqs go on
    /// from where they were.
    pub fn purge(&mut self) -> io::Result<u64> {
        self.check()?;
        let n = self.msgs;
        self.rows.clear(self.next_seq);
        self.msgs = 0;
        self.bytes = 0;
        self.subjects.clear();
        for s in &mut self.segs {
            s.live = 0;
            s.live_bytes = 0;
        }
        if self.next_seq > self.active().first_seq {
            // A fresh segment, so the old ones can all go.
            self.roll()?;
        }
        self.put_mark();
        segment::put_floor(&mut self.cache, self.next_seq);
        self.settle()?;
        Ok(n)
    }

    /// Removes every message whose subject passes `pred`; returns how many.
    pub fn purge_subjects(&mut self, mut pred: impl FnMut(&str) -> bool) -> io::Result<u64> {
        self.check()?;
        let mut verdict: Vec<Option<bool>> = vec![None; self.subjects.infos.len()];
        let mut seqs = Vec::new();
        for (seq, e) in self.rows.live_from(0) {
            let v = &mut verdict[e.subj as usize];
            let pass = *v.get_or_insert_with(|| pred(&self.subjects.infos[e.subj as usize].name));
            if pass {
                seqs.push(seq);
            }
        }
        for &s in &seqs {
            self.unindex(s);
        }
        if !seqs.is_empty() {
            self.put_mark();
            segment::put_remove(&mut self.cache, &seqs);
            self.settle()?;
            self.write_if_full()?;
        }
        Ok(seqs.len() as u64)
    }

    /// Removes the oldest live messages, in seq order, while their time is
    /// before `cutoff_ms` (stops at the first one that is not); returns how
    /// many.
    pub fn expire_before(&mut self, cutoff_ms: u64) -> io::Result<u64> {
        self.check()?;
        let mut n = 0;
        let mut stop = self.next_seq;
        for (seq, e) in self.rows.live_from(0) {
            if e.time_ms >= cutoff_ms {
                stop = seq;
                break;
            }
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        self.unindex_below(stop);
        self.put_mark();
        segment::put_floor(&mut self.cache, stop);
        self.settle()?;
        self.write_if_full()?;
        Ok(n)
    }

    /// Removes every message below `seq` (a log compacted up to a
    /// snapshot); when `seq` is past the last message, the next append gets
    /// `seq`. Returns how many were removed.
    pub fn remove_below(&mut self, seq: u64) -> io::Result<u64> {
        self.check()?;
        let end = seq.min(self.next_seq);
        let n = self.rows.live_from(0).take_while(|&(s, _)| s < end).count() as u64;
        if n == 0 && seq <= self.next_seq {
            return Ok(0);
        }
        self.floor(seq);
        self.put_mark();
        segment::put_floor(&mut self.cache, seq);
        self.settle()?;
        self.write_if_full()?;
        Ok(n)
    }

    /// Removes every message at or after `seq`; the next append gets
    /// `seq`. This is the suffix cut a replicated log needs when a leader
    /// overwrites conflicting entries; seqs go back, so a stream never
    /// calls it. `seq` may not be below the first live seq (or, with none
    /// live, the next one): a log never cuts what it compacted. Segments
    /// wholly past `seq` are deleted (and the directory fsynced) before the
    /// Truncate record is written, so a power loss cannot bring them back
    /// behind it. Returns how many messages were removed.
    pub fn truncate_from(&mut self, seq: u64) -> io::Result<u64> {
        self.check()?;
        if seq >= self.next_seq {
            return Ok(0);
        }
        if self.segs.iter().any(|s| s.compacted) {
            // A compacted segment's span claims the seqs up to the next
            // segment; seqs going back would contradict it.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot truncate a compacted store",
            ));
        }
        // Below the first live seq everything is gone already (compacted
        // or removed): a cut there would bring back seqs a compaction
        // passed. It also keeps the cut inside the segments there are.
        let first = self.rows.first().unwrap_or(self.next_seq);
        if seq < first.max(1) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot truncate from {seq}: everything below {first} is already gone"),
            ));
        }
        let n = self.rows.live_from(seq).count() as u64;
        let j = self.seg_of(seq);
        self.write_pending()?;
        self.truncate_mem(seq);
        if j + 1 < self.segs.len() {
            self.drop_segments_after(j)?;
            self.reactivate_last()?;
            // The deleted segments may have held the removal records of
            // messages that remain: say them again.
            let mut live = self.rows.live_from(first).map(|(s, _)| s).peekable();
            let dead: Vec<u64> = (first..seq)
                .filter(|&s| live.next_if_eq(&s).is_none())
                .collect();
            drop(live);
            segment::put_floor(&mut self.cache, first);
            segment::put_remove(&mut self.cache, &dead);
        }
        self.put_mark();
        segment::put_truncate(&mut self.cache, seq);
        self.settle()?;
        self.write_if_full()?;
        Ok(n)
    }

    /// Segment files (for tests and metrics).
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// Bytes the in-memory index of seqs holds (for tests and metrics;
    /// the subjects and the write buffer are apart).
    pub fn index_bytes(&self) -> usize {
        self.rows.bytes()
    }

    // ---- internals shared with recovery ----

    #[inline]
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(f) => Err(io::Error::other(format!("store failed earlier: {f}"))),
            None => Ok(()),
        }
    }

    fn active(&self) -> &Seg {
        // Invariant: open leaves at least one segment and nothing removes
        // the last one.
        self.segs
            .back()
            .expect("a store always has an active segment")
    }

    fn active_len(&self) -> u64 {
        self.cache_start + self.cache.len() as u64
    }

    fn entry(&self, seq: u64) -> Option<IndexRow> {
        self.rows.get(seq)
    }

    fn seg_of(&self, seq: u64) -> usize {
        self.segs
            .partition_point(|s| s.first_seq <= seq)
            .saturating_sub(1)
    }

    /// The framed record of `seq`: from the cache when it is there, else
    /// read into `owned`.
    fn record_bytes<'a>(
        &'a self,
        seq: u64,
        e: IndexRow,
        owned: &'a mut Vec<u8>,
    ) -> io::Result<(&'a [u8], &'a Seg)> {
        let i = self.seg_of(seq);
        let seg = &self.segs[i];
        let off = u64::from(e.off);
        let len = e.len as usize;
        if i + 1 == self.segs.len() && off >= self.cache_start {
            let at = (off - self.cache_start) as usize;
            if let Some(b) = self.cache.get(at..at + len) {
                return Ok((b, seg));
            }
        }
        owned.resize(len, 0);
        seg.file.read_exact_at(owned, off)?;
        Ok((owned, seg))
    }

    /// Indexes a message record of the active segment. Seqs skip ahead
    /// where messages were lost to a cut (or past a floor): while a
    /// message is live, at most `gap_max` seqs past the last one indexed.
    /// A longer skip is refused (false): it is more than the segment files
    /// could have held, a number read from disk rather than the data
    /// there. So is u64::MAX, which leaves no next seq.
    #[must_use]
    pub(super) fn index_msg(
        &mut self,
        seq: u64,
        off: u64,
        len: u64,
        subject: &str,
        time_ms: u64,
        gap_max: u64,
    ) -> bool {
        debug_assert!(seq >= self.next_seq);
        let gap = if self.rows.is_empty() {
            0
        } else {
            seq.saturating_sub(self.rows.end())
        };
        if gap > gap_max || seq == u64::MAX {
            return false;
        }
        let subj = self.subjects.add(subject, seq);
        self.rows.push(
            seq,
            IndexRow {
                off: off as u32,
                len: len as u32,
                subj,
                time_ms,
            },
        );
        self.next_seq = seq + 1;
        self.msgs += 1;
        self.bytes += len;
        if let Some(s) = self.segs.back_mut() {
            s.live += 1;
            s.live_bytes += len;
            s.held += 1;
        }
        true
    }

    /// One past the last seq the index covers.
    pub(super) fn entries_end(&self) -> u64 {
        self.rows.end()
    }

    /// Marks `seq` removed in memory; false if it was not live.
    pub(super) fn unindex(&mut self, seq: u64) -> bool {
        let Some(e) = self.rows.remove(seq) else {
            return false;
        };
        self.msgs -= 1;
        self.bytes -= u64::from(e.len);
        self.subjects.drop_one(e.subj, seq);
        let j = self.seg_of(seq);
        let s = &mut self.segs[j];
        s.live -= 1;
        s.live_bytes -= u64::from(e.len);
        true
    }

    /// Every live message below `seq` is gone; the seqs go on from at
    /// least `seq`.
    pub(super) fn floor(&mut self, seq: u64) {
        self.unindex_below(seq);
        self.next_seq = self.next_seq.max(seq);
    }

    /// Marks every live message below `seq` removed in memory.
    fn unindex_below(&mut self, seq: u64) {
        while let Some(first) = self.rows.first().filter(|&s| s < seq) {
            if !self.unindex(first) {
                break;
            }
        }
    }

    /// Every message at or after `seq` is gone; `seq` is the next one.
    pub(super) fn truncate_mem(&mut self, seq: u64) {
        self.truncated = true;
        if seq >= self.next_seq {
            return;
        }
        let cut: Vec<u64> = self.rows.live_from(seq).map(|(s, _)| s).collect();
        for s in cut {
            self.unindex(s);
        }
        self.rows.truncate(seq);
        self.next_seq = seq;
    }

    /// Deletes the segments after index `j`, last first, and fsyncs the
    /// directory.
    fn drop_segments_after(&mut self, j: usize) -> io::Result<()> {
        while self.segs.len() > j + 1 {
            let Some(seg) = self.segs.pop_back() else {
                break;
            };
            if let (Some(s), Some(k)) = (&self.opts.syncer, seg.key) {
                s.forget(k);
            }
            self.remove_index(seg.first_seq)?;
            fs::remove_file(&seg.path)?;
        }
        File::open(&self.dir)?.sync_all()
    }

    /// Makes the last segment, sealed until now, the active one again.
    fn reactivate_last(&mut self) -> io::Result<()> {
        let seg = self
            .segs
            .back_mut()
            .expect("a store always has an active segment");
        seg.file = OpenOptions::new().read(true).write(true).open(&seg.path)?;
        let tail = fs::read(&seg.path)?;
        let first = seg.first_seq;
        // It will change: its index would be stale.
        self.remove_index(first)?;
        self.activate(&tail)
    }

    fn remove_index(&self, first_seq: u64) -> io::Result<()> {
        match fs::remove_file(self.dir.join(index::file_name(first_seq))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes segments (but the active one) that hold no live message,
    /// from the front.
    pub(super) fn settle(&mut self) -> io::Result<()> {
        self.rows.skip_to(self.next_seq);
        while self.segs.len() > 1 && self.segs[0].live == 0 {
            let Some(seg) = self.segs.pop_front() else {
                break;
            };
            if let (Some(s), Some(k)) = (&self.opts.syncer, seg.key) {
                s.forget(k);
            }
            // The index first: a segment without one is rebuilt, an index
            // without its segment would be an orphan.
            self.remove_index(seg.first_seq)?;
            fs::remove_file(&seg.path)?;
            self.dir_dirty = true;
        }
        Ok(())
    }

    /// Before the next record: a `Synced` mark when a round completed
    /// since the last one.
    #[inline]
    fn put_mark(&mut self) {
        let Some(s) = &self.opts.syncer else {
            return;
        };
        if s.policy() == SyncPolicy::Never {
            self.rounds.clear();
            return;
        }
        let done = s.done();
        while let Some(&(t, off)) = self.rounds.front() {
            if t > done {
                break;
            }
            self.synced = self.synced.max(off);
            self.rounds.pop_front();
        }
        if self.synced > self.marked {
            segment::put_synced(&mut self.cache, self.synced);
            self.marked = self.synced;
        }
    }

    fn write_if_full(&mut self) -> io::Result<()> {
        if self.active_len() - self.written >= PENDING_BYTES_MAX as u64 {
            self.write_pending()?;
        }
        Ok(())
    }

    /// One write(2) of the buffered bytes; then trims the cache.
    fn write_pending(&mut self) -> io::Result<()> {
        let from = (self.written - self.cache_start) as usize;
        if from == self.cache.len() {
            return Ok(());
        }
        let seg = self
            .segs
            .back()
            .expect("a store always has an active segment");
        if let Err(e) = seg.file.write_all_at(&self.cache[from..], self.written) {
            self.failed = Some(format!("write to {}: {e}", seg.path.display()));
            return Err(e);
        }
        self.written = self.active_len();
        self.undirtied = true;
        let keep = self.opts.cache_bytes;
        if self.cache.len() > keep.saturating_mul(2).max(PENDING_BYTES_MAX) {
            let drop = self.cache.len() - keep;
            self.cache.drain(..drop);
            self.cache_start += drop as u64;
        }
        Ok(())
    }

    /// Starts a new active segment named after the next seq; the old one
    /// is written out and handed to the syncer one last time.
    fn roll(&mut self) -> io::Result<()> {
        self.write_pending()?;
        if let (Some(s), Some(k)) = (&self.opts.syncer, self.active().key) {
            if self.undirtied {
                self.last_ticket = self.last_ticket.max(s.dirty(k));
            }
            s.retire(k);
        }
        let len = self.active_len();
        if let Some(seg) = self.segs.back_mut() {
            seg.key = None;
            seg.len = len;
        }
        self.undirtied = false;
        self.compact_due = true;
        let first = self.next_seq;
        let path = self.dir.join(segment::file_name(first));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        self.push_segment(first, path, file);
        self.activate(&[])?;
        self.dir_dirty = true;
        Ok(())
    }

    /// Makes the last segment (opened read-write) the active one; `tail`
    /// is its valid content (empty: a head record is written first).
    pub(super) fn activate(&mut self, tail: &[u8]) -> io::Result<()> {
        let seg = self
            .segs
            .back_mut()
            .expect("a store always has an active segment");
        seg.key = match &self.opts.syncer {
            Some(s) => Some(s.register(&seg.file)?),
            None => None,
        };
        let first_seq = seg.first_seq;
        self.rounds.clear();
        self.synced = 0;
        self.marked = 0;
        self.written = tail.len() as u64;
        let keep = tail.len().saturating_sub(self.opts.cache_bytes);
        self.cache_start = keep as u64;
        self.cache = tail[keep..].to_vec();
        if tail.is_empty() {
            segment::put_head(&mut self.cache, first_seq);
            self.write_pending()?;
        }
        Ok(())
    }

    /// Adds a segment after the others (its messages are indexed next).
    pub(super) fn push_segment(&mut self, first_seq: u64, path: PathBuf, file: File) {
        let len = file.metadata().map_or(0, |m| m.len());
        self.segs.push_back(Seg {
            first_seq,
            path,
            file,
            live: 0,
            live_bytes: 0,
            held: 0,
            len,
            compacted: false,
            key: None,
        });
    }

    /// The segment pushed last was compacted (recovery read its span).
    pub(super) fn mark_compacted(&mut self) {
        if let Some(s) = self.segs.back_mut() {
            s.compacted = true;
        }
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub(super) fn set_next_seq(&mut self, seq: u64) {
        self.next_seq = self.next_seq.max(seq);
        self.rows.skip_to(self.next_seq);
    }

    pub(super) fn register_dir(&mut self) -> io::Result<()> {
        if let Some(s) = &self.opts.syncer {
            let d = File::open(&self.dir)?;
            self.dir_key = Some(s.register(&d)?);
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.failed.is_none() {
            let _ = self.write_pending();
        }
        if let Some(s) = &self.opts.syncer {
            if let Some(k) = self.segs.back().and_then(|seg| seg.key) {
                if self.undirtied {
                    s.dirty(k);
                }
                s.retire(k);
            }
            if let Some(k) = self.dir_key {
                if self.dir_dirty {
                    s.dirty(k);
                }
                s.retire(k);
            }
        }
    }
}
