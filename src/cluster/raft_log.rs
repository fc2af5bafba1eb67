//! Where a node's Raft state lives between runs: the [`LogStore`] trait
//! with an in-memory ([`MemoryLog`], `-raft-log=memory`) and a durable
//! ([`DurableLog`], the default with `-data`) implementation, the small
//! crc-framed [`StateFile`] that keeps term, vote and epoch under either,
//! and [`persist`], which writes a [`Ready`] in the order Raft requires.
//!
//! Files under the Raft directory (all in [`record`] framing):
//! - `state`: one record, the hard state. Replaced atomically (write
//!   `state.tmp`, fsync, rename, fsync the directory).
//! - `snapshot`: one record, the last snapshot. Replaced the same way.
//!   (A stream group's snapshot data is a reference to a file beside it;
//!   see `snapshot_file.rs`.)
//! - `membership`: one record, the configuration at the snapshot's index
//!   ([`MembershipFile`]); the configuration entries after it are in
//!   `log` like any other entry. Replaced the same way.
//! - `log`, `log.1`, `log.2`, ...: one record per entry, in index order
//!   across the files. Appends go to the last file. A snapshot starts a
//!   new file and deletes the files it covers whole; a file it covers in
//!   part stays, its covered entries skipped, until a later snapshot
//!   covers it. So no entry is ever written twice. A truncation cuts the
//!   file that holds the index and deletes the files after it. Recovery
//!   keeps the valid prefix and cuts a torn tail.
//! - `data.<n>` (a stream group's log only, [`DurableLog::open_keeping`]):
//!   log file `n` once a snapshot covers it whole, kept because the
//!   stream's messages are read from it where the log wrote them (see
//!   `stream/payloads.rs`). The stream says when one may go; the log
//!   never deletes one. New log files are numbered after every data file,
//!   so a number names one file for as long as either exists.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::raft::Ready;
use super::raft_msg::{
    decode_membership, encode_entry, encode_hard_state, encode_membership, encode_snapshot, Entry,
    HardState, Membership, Reader, Snapshot,
};
use crate::storage::log_files::{data_files, data_name, log_name};
use crate::storage::{record, statefile};

/// Why the store could not do its job.
#[derive(Debug)]
pub enum LogError {
    /// An operating-system error on a file.
    Io(PathBuf, io::Error),
    /// A file's content is not what this module writes (named with the
    /// offset of the bad record).
    Corrupt(PathBuf, u64, String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            LogError::Corrupt(p, at, why) => {
                write!(f, "{}: corrupt at offset {at}: {why}", p.display())
            }
        }
    }
}

impl std::error::Error for LogError {}

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |e| LogError::Io(p.to_path_buf(), e)
}

/// What a store held at start: the last snapshot (index 0: none) and the
/// entries after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    pub snapshot: Snapshot,
    pub entries: Vec<Entry>,
}

/// A Raft log's storage. Every method returns once its change is durable
/// (as durable as the implementation is).
pub trait LogStore {
    /// What is stored.
    fn load(&mut self) -> Result<Loaded, LogError>;
    /// Drops every entry at or after `first`, then stores `entries`, which
    /// start at `first`.
    fn append(&mut self, first: u64, entries: &[Entry]) -> Result<(), LogError>;
    /// Stores `snap` and drops the entries it covers; if the log does not
    /// hold an entry at `snap.index` with `snap.term`, drops all entries.
    fn save_snapshot(&mut self, snap: &Snapshot) -> Result<(), LogError>;
    /// Whether the contents survive a restart of the process.
    fn is_durable(&self) -> bool;
    /// Where the data of stored entry `index` is: the number of its file
    /// ([`file_paths`]) and the offset in it. None in memory, or when the
    /// entry is not stored.
    fn data_at(&self, _index: u64) -> Option<(u64, u64)> {
        None
    }
}

/// Writes what a [`Ready`] asks to persist, in order: hard state (through
/// `state`), snapshot, entries.
pub fn persist(
    ready: &Ready,
    state: &mut dyn FnMut(&HardState) -> Result<(), LogError>,
    log: &mut dyn LogStore,
) -> Result<(), LogError> {
    if let Some(hs) = &ready.hard_state {
        state(hs)?;
    }
    if let Some(snap) = &ready.snapshot {
        log.save_snapshot(snap)?;
    }
    if let Some((first, entries)) = &ready.entries {
        log.append(*first, entries)?;
    }
    Ok(())
}

/// The rule both stores share for a snapshot: which of `entries` stay.
fn keep_after(snap: &Snapshot, entries: &mut Vec<Entry>) {
    let agrees = entries
        .iter()
        .any(|e| e.index == snap.index && e.term == snap.term);
    if agrees {
        entries.retain(|e| e.index > snap.index);
    } else {
        entries.clear();
    }
}

/// The log in memory only: gone when the process ends.
#[derive(Debug, Default)]
pub struct MemoryLog {
    snapshot: Snapshot,
    entries: Vec<Entry>,
}

impl MemoryLog {
    pub fn new() -> MemoryLog {
        MemoryLog::default()
    }

    /// Whether the entry at `index` of `term` is stored: in the log, or
    /// covered by the snapshot.
    pub fn holds(&self, index: u64, term: u64) -> bool {
        index <= self.snapshot.index
            || self
                .entries
                .binary_search_by_key(&index, |e| e.index)
                .is_ok_and(|at| self.entries[at].term == term)
    }
}

impl LogStore for MemoryLog {
    fn load(&mut self) -> Result<Loaded, LogError> {
        Ok(Loaded {
            snapshot: self.snapshot.clone(),
            entries: self.entries.clone(),
        })
    }

    fn append(&mut self, first: u64, entries: &[Entry]) -> Result<(), LogError> {
        self.entries.retain(|e| e.index < first);
        self.entries.extend_from_slice(entries);
        Ok(())
    }

    fn save_snapshot(&mut self, snap: &Snapshot) -> Result<(), LogError> {
        keep_after(snap, &mut self.entries);
        self.snapshot = snap.clone();
        Ok(())
    }

    fn is_durable(&self) -> bool {
        false
    }
}

/// Replaces `path` by one record holding `body`, atomically and durably.
fn write_atomic(path: &Path, body: &[u8]) -> Result<(), LogError> {
    statefile::write(path, body).map_err(io_err(path))
}

/// Reads a one-record file; `None` if it does not exist.
fn read_single(path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    statefile::read(path).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => LogError::Corrupt(path.to_path_buf(), 0, e.to_string()),
        _ => LogError::Io(path.to_path_buf(), e),
    })
}

/// Term, vote and epoch in `<dir>/state`, written and fsynced before
/// [`StateFile::save`] returns (so before any reply that depends on them).
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file in `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<StateFile, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        Ok(StateFile {
            path: dir.join("state"),
        })
    }

    /// The stored hard state; the default if none was ever saved.
    pub fn load(&self) -> Result<HardState, LogError> {
        let Some(body) = read_single(&self.path)? else {
            return Ok(HardState::default());
        };
        let mut r = Reader::new(&body);
        let hs = r
            .hard_state()
            .and_then(|hs| r.finish().map(|_| hs))
            .map_err(|e| LogError::Corrupt(self.path.clone(), 0, e.to_string()))?;
        Ok(hs)
    }

    pub fn save(&mut self, hs: &HardState) -> Result<(), LogError> {
        let mut body = Vec::with_capacity(24);
        encode_hard_state(&mut body, hs);
        write_atomic(&self.path, &body)
    }
}

/// The configuration stored beside the snapshot, in `<dir>/membership`
/// (the core's [`crate::cluster::raft::Raft::snapshot_config`]): the
/// configuration at the snapshot's index, which the entries the snapshot
/// replaced no longer say. Written before the snapshot it belongs to, so a
/// crash between the two leaves a file that the log's own configuration
/// entries still agree with.
#[derive(Debug)]
pub struct MembershipFile {
    path: PathBuf,
}

impl MembershipFile {
    /// The membership file in `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<MembershipFile, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        Ok(MembershipFile {
            path: dir.join("membership"),
        })
    }

    /// The stored configuration; `None` if none was ever stored.
    pub fn load(&self) -> Result<Option<Membership>, LogError> {
        let Some(body) = read_single(&self.path)? else {
            return Ok(None);
        };
        decode_membership(&body)
            .map(Some)
            .map_err(|e| LogError::Corrupt(self.path.clone(), 0, e.to_string()))
    }

    pub fn save(&mut self, conf: &Membership) -> Result<(), LogError> {
        let mut body = Vec::new();
        encode_membership(&mut body, conf);
        write_atomic(&self.path, &body)
    }
}

/// The log on disk (see the module doc for the files).
#[derive(Debug)]
pub struct DurableLog {
    dir: PathBuf,
    snap_path: PathBuf,
    /// The log's files in order, each with its number (0 for `log`); the
    /// last is the one appended to.
    files: Vec<(u64, PathBuf)>,
    /// The last file, open for appending.
    file: File,
    /// The last file's length.
    len: u64,
    snapshot: Snapshot,
    /// Index, term, position in `files` and offset of each entry on disk,
    /// the covered ones (at or before the snapshot) first.
    index: Vec<Place>,
    /// How many of `index` the snapshot covers: on disk still, not loaded.
    covered: usize,
    /// Covered files become data files instead of going.
    keep_data: bool,
}

/// Where one entry is: index, term, file (a position in `files`), the
/// offset of its record and the offset of its data.
type Place = (u64, u64, usize, u64, u64);

/// A file that could not be deleted ([`crate::storage::delete_later`]).
pub(crate) fn log_failed_delete(path: &Path, e: &io::Error) {
    crate::log_error!("{}: {e}", path.display());
}

/// Where a covered log file waits to be deleted: a name no log file has.
fn gone_path(p: &Path) -> PathBuf {
    let mut name = p.file_name().unwrap_or_default().to_os_string();
    name.push(".gone");
    p.with_file_name(name)
}

/// The log files in `dir`, in order; covered ones left to delete
/// ([`gone_path`]) are deleted.
fn log_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".gone") {
            // A covered file whose deletion a stop or crash cut short.
            let _ = fs::remove_file(entry.path());
            continue;
        }
        let n = match name.strip_prefix("log") {
            Some("") => 0,
            Some(rest) => match rest.strip_prefix('.').and_then(|d| d.parse::<u64>().ok()) {
                Some(n) if n > 0 && log_name(n) == name => n,
                _ => continue,
            },
            None => continue,
        };
        files.insert(n, entry.path());
    }
    Ok(files.into_iter().collect())
}

/// Removes every log file and the snapshot record of the log in `dir`
/// (a stream group that starts again without its log). Its files become
/// data files: the stream's messages may still be read from them.
pub fn remove_log(dir: &Path) -> Result<(), LogError> {
    for (n, p) in log_files(dir)? {
        let to = dir.join(data_name(n));
        fs::rename(&p, &to).map_err(io_err(&p))?;
    }
    for p in [dir.join("snapshot")] {
        match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(LogError::Io(p, e)),
            _ => {}
        }
    }
    statefile::sync_dir(&dir.join("log")).map_err(io_err(dir))
}

fn open_append(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(io_err(path))
}

impl DurableLog {
    /// Opens (creating if needed) the log in `dir`, recovering it: a torn
    /// or corrupt tail is cut off, and files the snapshot covers whole
    /// are deleted. Nothing is rewritten.
    pub fn open(dir: &Path) -> Result<DurableLog, LogError> {
        DurableLog::open_with(dir, false)
    }

    /// [`DurableLog::open`] for a stream group's log: files a snapshot
    /// covers become data files (see the module doc).
    pub fn open_keeping(dir: &Path) -> Result<DurableLog, LogError> {
        DurableLog::open_with(dir, true)
    }

    fn open_with(dir: &Path, keep_data: bool) -> Result<DurableLog, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        // Left by a crash in the middle of the whole-log rewrite that
        // earlier versions did at each snapshot.
        let _ = fs::remove_file(dir.join("log.tmp"));
        let mut files = log_files(dir)?;
        if files.is_empty() {
            let n = data_files(dir)
                .map_err(io_err(dir))?
                .last()
                .map_or(0, |n| n + 1);
            files.push((n, dir.join(log_name(n))));
        }
        let last = files.last().map(|(_, p)| p.clone()).unwrap_or_default();
        let file = open_append(&last)?;
        let mut d = DurableLog {
            dir: dir.to_path_buf(),
            snap_path: dir.join("snapshot"),
            files,
            file,
            len: 0,
            snapshot: Snapshot::default(),
            index: Vec::new(),
            covered: 0,
            keep_data,
        };
        d.recover()?;
        d.drop_covered()?;
        Ok(d)
    }

    fn corrupt(&self, path: &Path, at: u64, why: impl Into<String>) -> LogError {
        LogError::Corrupt(path.to_path_buf(), at, why.into())
    }

    fn recover(&mut self) -> Result<(), LogError> {
        if let Some(body) = read_single(&self.snap_path)? {
            let mut r = Reader::new(&body);
            self.snapshot = r
                .snapshot()
                .and_then(|s| r.finish().map(|_| s))
                .map_err(|e| self.corrupt(&self.snap_path, 0, e.to_string()))?;
        }
        let mut expect = None;
        for k in 0..self.files.len() {
            let path = self.files[k].1.clone();
            let bytes = fs::read(&path).map_err(io_err(&path))?;
            let mut at = 0usize;
            while let Ok(Some((body, next))) = record::read(&bytes, at) {
                let mut r = Reader::new(body);
                let e = r
                    .entry()
                    .and_then(|e| r.finish().map(|_| e))
                    .map_err(|e| self.corrupt(&path, at as u64, e.to_string()))?;
                if expect.is_some_and(|x| x != e.index) {
                    let why = format!(
                        "entry {} where {} was expected",
                        e.index,
                        expect.unwrap_or(0)
                    );
                    return Err(self.corrupt(&path, at as u64, why));
                }
                let Some(after) = e.index.checked_add(1) else {
                    let why = "entry index at the end of the range";
                    return Err(self.corrupt(&path, at as u64, why));
                };
                expect = Some(after);
                let data = at + record::HEAD_BYTES + body.len() - e.data.len();
                self.index
                    .push((e.index, e.term, k, at as u64, data as u64));
                at = next;
            }
            if at < bytes.len() {
                // What follows the valid prefix is a write that never
                // completed (every completed write was fsynced before it
                // was relied on), and so is every later file.
                self.cut(k, at as u64)?;
                return Ok(());
            }
            if k + 1 == self.files.len() {
                self.len = at as u64;
            }
        }
        Ok(())
    }

    /// Cuts file `k` at `at` and deletes every later file; file `k` is
    /// then the one appended to.
    fn cut(&mut self, k: usize, at: u64) -> Result<(), LogError> {
        let path = self.files[k].1.clone();
        if k + 1 < self.files.len() {
            for (_, p) in self.files.drain(k + 1..) {
                fs::remove_file(&p).map_err(io_err(&p))?;
            }
            statefile::sync_dir(&path).map_err(io_err(&path))?;
            self.file = open_append(&path)?;
        }
        self.file.set_len(at).map_err(io_err(&path))?;
        self.file.sync_all().map_err(io_err(&path))?;
        self.len = at;
        Ok(())
    }

    /// Lets go of what the snapshot covers: the entries at or before its
    /// index when the log holds its entry, else every entry. Files holding
    /// only such entries are deleted; in the others, covered entries stay
    /// on disk and are skipped.
    fn drop_covered(&mut self) -> Result<(), LogError> {
        let snap = (self.snapshot.index, self.snapshot.term);
        let agrees = self.index.iter().any(|&(i, t, _, _, _)| (i, t) == snap);
        let first_kept = if agrees || self.index.first().is_none_or(|p| p.0 > snap.0) {
            self.index.partition_point(|p| p.0 <= snap.0)
        } else {
            self.index.len()
        };
        let keep_from = match self.index.get(first_kept) {
            Some(p) => p.2,
            None => {
                // Nothing is kept. Later entries must not follow the
                // dropped ones in one file (they may not continue them).
                if self.len > 0 {
                    self.roll()?;
                }
                self.files.len() - 1
            }
        };
        if keep_from > 0 {
            // Renamed out of the log's names here, deleted on another
            // thread (freeing a large file's blocks takes tens of ms),
            // and the directory not synced: a file that comes back after
            // a crash holds only what the stored snapshot covers, and
            // goes again at open.
            // A stream's log keeps them as data files (also not synced:
            // one that comes back under its log name is covered again).
            let mut gone = Vec::new();
            for (n, p) in self.files.drain(..keep_from) {
                if self.keep_data {
                    let to = self.dir.join(data_name(n));
                    fs::rename(&p, &to).map_err(io_err(&p))?;
                    continue;
                }
                let to = gone_path(&p);
                fs::rename(&p, &to).map_err(io_err(&p))?;
                gone.push(to);
            }
            crate::storage::delete_later(gone, log_failed_delete);
            self.index.retain(|p| p.2 >= keep_from);
            for p in &mut self.index {
                p.2 -= keep_from;
            }
        }
        self.covered = self.index.partition_point(|p| p.0 <= snap.0);
        Ok(())
    }

    /// Starts a new, empty last file: the entries before it can then go
    /// with their files once a snapshot covers them.
    fn roll(&mut self) -> Result<(), LogError> {
        let n = self.files.last().map_or(0, |f| f.0) + 1;
        let path = self.dir.join(log_name(n));
        let file = open_append(&path)?;
        file.set_len(0).map_err(io_err(&path))?;
        statefile::sync_dir(&path).map_err(io_err(&path))?;
        self.files.push((n, path));
        self.file = file;
        self.len = 0;
        Ok(())
    }

    fn read_entries(&self) -> Result<Vec<Entry>, LogError> {
        let mut out = Vec::with_capacity(self.index.len() - self.covered);
        let mut k = usize::MAX;
        let mut bytes = Vec::new();
        for &(_, _, file, at, _) in &self.index[self.covered..] {
            let path = &self.files[file].1;
            if file != k {
                k = file;
                bytes = fs::read(path).map_err(io_err(path))?;
            }
            let e = match record::read(&bytes, at as usize) {
                Ok(Some((body, _))) => Reader::new(body).entry().map_err(|e| e.to_string()),
                _ => Err("record gone".to_string()),
            };
            out.push(e.map_err(|why| self.corrupt(path, at, why))?);
        }
        Ok(out)
    }

    fn write_entries(&mut self, entries: &[Entry]) -> Result<(), LogError> {
        let mut out = Vec::new();
        let k = self.files.len() - 1;
        for e in entries {
            let start = record::begin(&mut out);
            encode_entry(&mut out, e);
            let data = self.len + (out.len() - e.data.len()) as u64;
            record::finish(&mut out, start);
            self.index
                .push((e.index, e.term, k, self.len + start as u64, data));
        }
        let path = &self.files[k].1;
        self.file.write_all(&out).map_err(io_err(path))?;
        self.file.sync_data().map_err(io_err(path))?;
        self.len += out.len() as u64;
        Ok(())
    }
}

impl LogStore for DurableLog {
    fn load(&mut self) -> Result<Loaded, LogError> {
        let entries = self.read_entries()?;
        if let Some(first) = entries.first() {
            if first.index != self.snapshot.index + 1 {
                let why = format!(
                    "log starts at {} after snapshot {}",
                    first.index, self.snapshot.index
                );
                let path = self.files[self.index[self.covered].2].1.clone();
                return Err(self.corrupt(&path, 0, why));
            }
        }
        Ok(Loaded {
            snapshot: self.snapshot.clone(),
            entries,
        })
    }

    fn append(&mut self, first: u64, entries: &[Entry]) -> Result<(), LogError> {
        let keep = self.index.partition_point(|p| p.0 < first);
        if keep < self.index.len() {
            let (_, _, k, at, _) = self.index[keep];
            self.index.truncate(keep);
            self.covered = self.covered.min(keep);
            self.cut(k, at)?;
        }
        self.write_entries(entries)
    }

    fn save_snapshot(&mut self, snap: &Snapshot) -> Result<(), LogError> {
        let mut body = Vec::with_capacity(snap.data.len() + 24);
        encode_snapshot(&mut body, snap);
        write_atomic(&self.snap_path, &body)?;
        self.snapshot = snap.clone();
        if self.len > 0 {
            // Later entries go to a file of their own, so that this one
            // can go whole once a snapshot covers it.
            self.roll()?;
        }
        self.drop_covered()
    }

    fn is_durable(&self) -> bool {
        true
    }

    fn data_at(&self, index: u64) -> Option<(u64, u64)> {
        let at = self.index.binary_search_by_key(&index, |p| p.0).ok()?;
        let (_, _, k, _, data) = self.index[at];
        Some((self.files[k].0, data))
    }
}
