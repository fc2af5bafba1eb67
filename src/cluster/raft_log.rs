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
//! - `log`: one record per entry, in index order. A truncation cuts the
//!   file; a snapshot rewrites it with only the entries after it.
//!   Recovery keeps the valid prefix and cuts a torn tail.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::raft::Ready;
use super::raft_msg::{
    decode_membership, encode_entry, encode_hard_state, encode_membership, encode_snapshot, Entry,
    HardState, Membership, Reader, Snapshot,
};
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
    log_path: PathBuf,
    snap_path: PathBuf,
    file: File,
    snapshot: Snapshot,
    /// Index, term and file offset of each entry in `log`.
    index: Vec<(u64, u64, u64)>,
    len: u64,
}

impl DurableLog {
    /// Opens (creating if needed) the log in `dir`, recovering it: a torn
    /// or corrupt tail of `log` is cut off.
    pub fn open(dir: &Path) -> Result<DurableLog, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let log_path = dir.join("log");
        let snap_path = dir.join("snapshot");
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(io_err(&log_path))?;
        let mut d = DurableLog {
            log_path,
            snap_path,
            file,
            snapshot: Snapshot::default(),
            index: Vec::new(),
            len: 0,
        };
        d.recover()?;
        let covered = d
            .index
            .first()
            .is_some_and(|&(i, _, _)| i <= d.snapshot.index);
        if covered {
            d.rewrite_after_snapshot()?;
        }
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
        let bytes = fs::read(&self.log_path).map_err(io_err(&self.log_path))?;
        let mut at = 0usize;
        let mut expect = None;
        while let Ok(Some((body, next))) = record::read(&bytes, at) {
            let mut r = Reader::new(body);
            let e = r
                .entry()
                .and_then(|e| r.finish().map(|_| e))
                .map_err(|e| self.corrupt(&self.log_path, at as u64, e.to_string()))?;
            if expect.is_some_and(|x| x != e.index) {
                let why = format!(
                    "entry {} where {} was expected",
                    e.index,
                    expect.unwrap_or(0)
                );
                return Err(self.corrupt(&self.log_path, at as u64, why));
            }
            let Some(after) = e.index.checked_add(1) else {
                let why = "entry index at the end of the range";
                return Err(self.corrupt(&self.log_path, at as u64, why));
            };
            expect = Some(after);
            self.index.push((e.index, e.term, at as u64));
            at = next;
        }
        // What follows the valid prefix is a write that never completed
        // (every completed write was fsynced before it was relied on).
        self.len = at as u64;
        if self.len < bytes.len() as u64 {
            self.file
                .set_len(self.len)
                .map_err(io_err(&self.log_path))?;
            self.file.sync_all().map_err(io_err(&self.log_path))?;
        }
        Ok(())
    }

    fn read_entries(&self) -> Result<Vec<Entry>, LogError> {
        let bytes = fs::read(&self.log_path).map_err(io_err(&self.log_path))?;
        let (bodies, _, _) = record::scan(&bytes);
        let mut out = Vec::with_capacity(bodies.len());
        for (i, body) in bodies.into_iter().enumerate().take(self.index.len()) {
            let e = Reader::new(body)
                .entry()
                .map_err(|e| self.corrupt(&self.log_path, self.index[i].2, e.to_string()))?;
            out.push(e);
        }
        Ok(out)
    }

    fn write_entries(&mut self, entries: &[Entry]) -> Result<(), LogError> {
        let mut out = Vec::new();
        for e in entries {
            let start = record::begin(&mut out);
            encode_entry(&mut out, e);
            record::finish(&mut out, start);
            self.index.push((e.index, e.term, self.len + start as u64));
        }
        self.file.write_all(&out).map_err(io_err(&self.log_path))?;
        self.file.sync_data().map_err(io_err(&self.log_path))?;
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
                return Err(self.corrupt(&self.log_path, 0, why));
            }
        }
        Ok(Loaded {
            snapshot: self.snapshot.clone(),
            entries,
        })
    }

    fn append(&mut self, first: u64, entries: &[Entry]) -> Result<(), LogError> {
        let keep = self.index.iter().take_while(|(i, _, _)| *i < first).count();
        if keep < self.index.len() {
            let cut = self.index[keep].2;
            self.index.truncate(keep);
            self.file.set_len(cut).map_err(io_err(&self.log_path))?;
            self.len = cut;
        }
        self.write_entries(entries)
    }

    fn save_snapshot(&mut self, snap: &Snapshot) -> Result<(), LogError> {
        let mut body = Vec::with_capacity(snap.data.len() + 24);
        encode_snapshot(&mut body, snap);
        write_atomic(&self.snap_path, &body)?;
        self.snapshot = snap.clone();
        self.rewrite_after_snapshot()
    }

    fn is_durable(&self) -> bool {
        true
    }
}

impl DurableLog {
    /// Rewrites the log with only what the snapshot leaves. A crash before
    /// this is done leaves covered entries in the file; [`DurableLog::open`]
    /// sees them and finishes the job.
    fn rewrite_after_snapshot(&mut self) -> Result<(), LogError> {
        // The entries kept are a tail of the file: copy its bytes as they
        // are, never the whole log through memory.
        let snap = (self.snapshot.index, self.snapshot.term);
        let agrees = self.index.iter().any(|&(i, t, _)| (i, t) == snap);
        let keep = if agrees {
            self.index
                .iter()
                .take_while(|&&(i, _, _)| i <= snap.0)
                .count()
        } else {
            self.index.len()
        };
        let cut = self.index.get(keep).map_or(self.len, |&(_, _, at)| at);
        let tmp = self.log_path.with_file_name("log.tmp");
        let copy = || -> io::Result<()> {
            let mut out = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            let mut src = File::open(&self.log_path)?;
            io::Seek::seek(&mut src, io::SeekFrom::Start(cut))?;
            let copied = io::copy(&mut io::Read::take(src, self.len - cut), &mut out)?;
            if copied != self.len - cut {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the log shrank while it was rewritten",
                ));
            }
            out.sync_all()?;
            fs::rename(&tmp, &self.log_path)?;
            statefile::sync_dir(&self.log_path)
        };
        copy().map_err(io_err(&self.log_path))?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.log_path)
            .map_err(io_err(&self.log_path))?;
        self.index.drain(..keep);
        for e in &mut self.index {
            e.2 -= cut;
        }
        self.len -= cut;
        Ok(())
    }
}
