//! Where a replica of a replicated stream keeps its message payloads: in
//! segment files on disk (the broker's choice), or in memory (the
//! deterministic simulation's, and a broker without a data directory).
//! The replica itself keeps only a compact index in memory (seq →
//! subject, time, size and [`Loc`]); apply never reads a payload, so what
//! a backend holds never changes an outcome.
//!
//! On disk a store is a directory of segment files in the stream's own
//! format ([`super::segment`]: a Head record, then Msg records, each
//! framed by [`crate::storage::record`]), named after their first seq.
//! The active file takes appends until it holds `segment_bytes` (the
//! broker's `-segment-size`, as for R1 streams). Appends are buffered and
//! written at the end of each applied entry ([`Payloads::flush`]); a read
//! of a message still in the buffer is served from it.
//!
//! The files are the replica's durable state, together with the group's
//! snapshot (the stream's state without its payloads, see
//! `stream/replica.rs`): before a snapshot at index i is stored, every
//! file written since the last one is fsynced, and the directory with
//! them ([`Detached::sync`]). A file whose messages are all gone is not
//! deleted at once but handed to the next snapshot ([`Detached::dead`]),
//! and deleted once that snapshot is stored, so the files always hold
//! every message of the last stored snapshot. A restarted member opens
//! its store with the live seqs of its snapshot ([`Payloads::reopen`]):
//! it keeps the longest run of whole records that matches them, cuts the
//! rest (a torn tail, a record whose crc fails, a lost file and all after
//! it) and reports what it found; what is missing is fetched from the
//! group's leader. The records after the snapshot's messages are kept
//! too, as the store's tail: the log's replay appends those messages
//! again, and an append whose record the tail holds takes it where it is
//! ([`Tail`]). Nothing is rewritten.
//!
//! Seqs can go back: a replica that takes a snapshot older than what it
//! held ([`super::replica::Replica::rebase`]) drops its newest messages
//! and stores them again as it applies the log. Their old records stay
//! in the files (the same messages: a seq stands for one committed
//! message), so the copy that counts is the one written last, which is
//! also the one in the last file whose first seq is at or below it:
//! appends after seqs went back go to a new file, and reopening lets a
//! later copy of a seq replace an earlier one.
//!
//! A file name is never used twice while the process runs, because a
//! dead file is deleted later on another thread (the Raft thread, once
//! the snapshot is stored): a store that starts over ([`Payloads::clear`],
//! or a new store opened in the same directory) or whose seqs went back
//! may append the same seqs again, and a file it made under a dead
//! file's name would be deleted with its live messages. A store takes a
//! generation from a process-wide counter when it is made and whenever
//! its seqs go back, and names its new files `{first:020}.{generation}.seg`
//! (generation 0: `{first:020}.seg`, as stream segments are); reopening
//! reads files of every generation, ordered by first seq.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::segment::{self, InLog, MsgRef, Rec};
use crate::storage::fsync::{start_writeback, sync_dir, sync_file};
use crate::storage::{log_files, record};

/// Where a message's record is: its offset in the file that holds its
/// seq, its framed length (0: the write failed; it cannot be read) and
/// the crc32 of its body (what the replicas' digest is made of).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loc {
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
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

/// A message found in a store's files when it was reopened: what the
/// replica's index keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub subject: Box<str>,
    pub time_ms: u64,
    /// Its framed record's length (what it counts for in `bytes`).
    pub bytes: u64,
    /// A bucket's delete or purge marker (from its headers).
    pub marker: bool,
    pub loc: Loc,
}

/// A message published through an entry whose data the log says where it
/// stored ([`Payloads::append_at`]) is kept there when its data has at
/// least this many bytes: the store writes an InLog record instead of a
/// second copy.
pub const IN_LOG_MIN: usize = 1024;

/// Buffered appends past this many bytes are written at once.
const PENDING_BYTES_MAX: usize = 1 << 20;

/// Once this many bytes of the active file are written and not yet on
/// their way to the disk, their writeback is started
/// ([`crate::storage::fsync::start_writeback`]): the snapshot's fsync
/// then finds little left to write.
const WRITEBACK_BYTES: u64 = 1 << 20;

/// How much of a file a catch-up reads at once ([`Detached::records_from`]).
pub(super) const SCAN_CHUNK: usize = 256 << 10;

/// Reads into `buf` from `offset` until it is full or the file ends; how
/// many bytes it read.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A replica's payloads.
pub enum Payloads {
    /// Each message's framed record, by seq.
    Memory(BTreeMap<u64, Vec<u8>>),
    Disk(Box<Disk>),
}

/// One file of a disk store.
struct Seg {
    /// Messages in it not removed yet.
    live: u64,
    /// Bytes written to it (the buffer not included).
    len: u64,
    /// The log files its live messages' InLog records point into,
    /// rising, and the data bytes those records stand for (they count
    /// towards `segment_bytes` as if written here).
    data: Vec<u64>,
    refd: u64,
    /// The generation in its name.
    generation: u64,
}

/// The next generation (see the module docs).
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// The name of the file of generation `generation` whose first seq is
/// `first`.
fn file_name(first: u64, generation: u64) -> String {
    match generation {
        0 => segment::file_name(first),
        g => format!("{first:020}.{g}.seg"),
    }
}

/// The first seq and generation a payload file name stands for.
fn parse_name(name: &str) -> Option<(u64, u64)> {
    if let Some(first) = segment::parse_name(name) {
        return Some((first, 0));
    }
    let (first, rest) = name.split_once('.')?;
    let g = rest.strip_suffix(".seg")?;
    if g.is_empty() || !g.bytes().all(|b| b.is_ascii_digit()) || g.starts_with('0') {
        return None;
    }
    let first = segment::parse_name(&format!("{first}.seg"))?;
    Some((first, g.parse().ok()?))
}

/// The records a reopened store found after every message its snapshot
/// names ([`Payloads::reopen`]): messages applied after that snapshot,
/// which the group's log, replayed from it, appends again. An append of
/// the same seq whose record is the same (length and crc; a seq stands
/// for one committed message, so it always is) takes the record where it
/// is instead of writing it again, so a restart rewrites nothing. The
/// first append that differs, or comes after them all, ends the tail:
/// the records not taken are cut (their part of a file cut off, files of
/// nothing else deleted), and appends go on as in any store.
#[derive(Default)]
struct Tail {
    /// Seq, the first seq of its file, where it is, and the length of
    /// the Msg record it is or stands for; seqs rising.
    recs: Vec<(u64, u64, Loc, usize)>,
    /// The next record not taken or passed over.
    at: usize,
}

impl Tail {
    fn pending(&self) -> bool {
        self.at < self.recs.len()
    }

    /// Passes over the records of seqs below `seq`.
    fn pass_below(&mut self, seq: u64) {
        while self.recs.get(self.at).is_some_and(|r| r.0 < seq) {
            self.at += 1;
        }
    }

    /// The first seq of the file of the next record not taken.
    fn next_file(&self) -> Option<u64> {
        self.recs.get(self.at).map(|r| r.1)
    }
}

/// The files of the group's log that a store's InLog records point into
/// (see the module docs): which of them its files need, and when one
/// may go.
struct LogFiles {
    dir: PathBuf,
    /// The log file of the last entry applied, once one applied: every
    /// file before it holds only entries applied already.
    applied: Option<u64>,
    /// Files that segment files point into, with how many of them do.
    /// (By number, rising: a few entries, a map would cost more code.)
    pins: Vec<(u64, u32)>,
    /// Files let go before any entry applied: they go once one does.
    orphans: Vec<u64>,
    /// Open handles, by number (shared with detached states).
    open: Mutex<Vec<(u64, Arc<File>)>>,
}

impl LogFiles {
    fn new(dir: &Path) -> LogFiles {
        LogFiles {
            dir: dir.to_path_buf(),
            applied: None,
            pins: Vec::new(),
            orphans: Vec::new(),
            open: Mutex::new(Vec::new()),
        }
    }

    /// File `n`, opened once.
    fn file(&self, n: u64) -> io::Result<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = open.iter().find(|(k, _)| *k == n) {
            return Ok(f.clone());
        }
        let f = Arc::new(log_files::open(&self.dir, n)?);
        open.push((n, f.clone()));
        Ok(f)
    }

    /// Whether a segment file points into file `n`.
    fn pinned(&self, n: u64) -> bool {
        self.pins.binary_search_by_key(&n, |p| p.0).is_ok()
    }

    /// File `n` is needed by one more segment file.
    fn pin(&mut self, n: u64) {
        match self.pins.binary_search_by_key(&n, |p| p.0) {
            Ok(k) => self.pins[k].1 += 1,
            Err(k) => self.pins.insert(k, (n, 1)),
        }
    }

    /// File `n` is needed by one segment file less; when by none, it goes
    /// (its data path into `dead`) once no entry to apply is in it.
    fn unpin(&mut self, n: u64, dead: &mut Vec<PathBuf>) {
        if let Ok(k) = self.pins.binary_search_by_key(&n, |p| p.0) {
            self.pins[k].1 -= 1;
            if self.pins[k].1 > 0 {
                return;
            }
            self.pins.remove(k);
        }
        self.let_go(n, dead);
    }

    fn let_go(&mut self, n: u64, dead: &mut Vec<PathBuf>) {
        match self.applied {
            Some(a) if n < a => {
                self.open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(k, _)| *k != n);
                dead.push(log_files::data_path(&self.dir, n));
            }
            // The file entries apply from: let go when they move on.
            Some(_) => {}
            None => self.orphans.push(n),
        }
    }

    /// An entry stored in file `file` applies: the files before it that
    /// nothing needs go.
    fn entry_in(&mut self, file: u64, dead: &mut Vec<PathBuf>) {
        match self.applied {
            None => {
                self.applied = Some(file);
                for n in std::mem::take(&mut self.orphans) {
                    if n < file {
                        self.let_go(n, dead);
                    }
                }
            }
            Some(a) if file > a => {
                self.applied = Some(file);
                for n in a..file {
                    if !self.pinned(n) {
                        self.let_go(n, dead);
                    }
                }
            }
            Some(_) => {}
        }
    }

    /// The data of `r`, read from its log file and checked against its
    /// crc: the Msg record it stands for, framed.
    fn expand(&self, r: &InLog<'_>) -> io::Result<Vec<u8>> {
        expand_from(&*self.file(r.file)?, r)
    }
}

/// The Msg record InLog record `r` stands for, its data read from `file`
/// (the log file it names) and checked against its crc.
fn expand_from(file: &File, r: &InLog<'_>) -> io::Result<Vec<u8>> {
    let mut data = vec![0; r.len as usize];
    file.read_exact_at(&mut data, r.offset)?;
    let m = MsgRef {
        data: &data,
        ..r.msg.clone()
    };
    let mut rec = Vec::with_capacity(data.len() + 64);
    segment::put_msg(&mut rec, &m);
    if crc_of(&rec) != r.crc {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "message {}: its data in log file {} at {} fails its crc",
                r.msg.seq, r.file, r.offset
            ),
        ));
    }
    Ok(rec)
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
    /// How much of the active file's writeback was started.
    written_back: u64,
    /// The last seq appended.
    last: u64,
    /// Files written to since the last [`Payloads::detach`] (by first
    /// seq), and whether one was made (the directory changed).
    unsynced: BTreeSet<u64>,
    dir_changed: bool,
    /// Files whose messages are all gone, to delete once a snapshot that
    /// no longer names their messages is stored.
    dead: Vec<PathBuf>,
    /// The generation of the files it makes.
    generation: u64,
    /// What a reopened store holds past its snapshot, to take again.
    tail: Tail,
    /// The group's log, when messages are kept where it wrote them.
    log: Option<LogFiles>,
}

/// Empties `dir` (or makes it).
fn empty_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::create_dir_all(dir)
}

impl Payloads {
    pub fn memory() -> Payloads {
        Payloads::Memory(BTreeMap::new())
    }

    /// An empty disk store in `dir`, emptied of what an earlier run left.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<Payloads> {
        Payloads::open_in(dir, segment_bytes, None)
    }

    /// [`Payloads::open`] for a group whose log is in `log`: messages
    /// may be kept where the log wrote them ([`Payloads::append_at`]).
    /// The log's data files of an earlier run go.
    pub fn open_in(dir: &Path, segment_bytes: u64, log: Option<&Path>) -> io::Result<Payloads> {
        empty_dir(dir)?;
        let mut d = Disk::new(dir, segment_bytes);
        d.use_log(log)?;
        Ok(Payloads::Disk(Box::new(d)))
    }

    /// A disk store in `dir` keeping what an earlier run left of the
    /// messages `want` names (sorted, disjoint, inclusive seq ranges): the
    /// longest run of whole records, in seq order, that are exactly the
    /// first messages of `want`. Records of messages not wanted before
    /// the last of them were removed before the snapshot (their files are
    /// deleted once empty). Once all of `want` is found, the whole records
    /// after it, seqs rising, are kept as the store's [`Tail`], for the
    /// log's replay to take again. Everything else is cut: from the first
    /// message that is missing or damaged, the rest of the files. Returns
    /// the store and what it kept of `want`, by seq; the messages of
    /// `want` it lacks are all after the last one it kept.
    pub fn reopen(
        dir: &Path,
        segment_bytes: u64,
        want: &[(u64, u64)],
    ) -> io::Result<(Payloads, BTreeMap<u64, Found>)> {
        Payloads::reopen_in(dir, segment_bytes, want, None)
    }

    /// [`Payloads::reopen`] for a group whose log is in `log`: an InLog
    /// record is whole when its data reads back from the log file it
    /// names with its crc. The log's data files no kept record needs go.
    pub fn reopen_in(
        dir: &Path,
        segment_bytes: u64,
        want: &[(u64, u64)],
        log: Option<&Path>,
    ) -> io::Result<(Payloads, BTreeMap<u64, Found>)> {
        fs::create_dir_all(dir)?;
        let mut files: Vec<(u64, u64)> = fs::read_dir(dir)?
            .filter_map(|e| parse_name(e.ok()?.file_name().to_str()?))
            .collect();
        // A later generation of one first seq was written later.
        files.sort_unstable();
        if let Some(top) = files.iter().map(|f| f.1).max() {
            // Files made from now on are named after every one here.
            GENERATION.fetch_max(top + 1, Ordering::Relaxed);
        }
        let mut d = Disk::new(dir, segment_bytes);
        let log = log.map(LogFiles::new);
        let mut scan = Scan {
            wanted: Wanted::new(want),
            found: BTreeMap::new(),
            starts: Vec::new(),
            tail: Vec::new(),
            log: log.as_ref(),
            files_of: Vec::new(),
        };
        // Each file's kept length, or None: it goes whole.
        let mut keep = Vec::with_capacity(files.len());
        let mut cut = false;
        for (k, &(first, generation)) in files.iter().enumerate() {
            if cut {
                keep.push(None);
                continue;
            }
            let path = dir.join(file_name(first, generation));
            let mut reader = io::BufReader::with_capacity(1 << 20, File::open(&path)?);
            scan.files_of.push(Vec::new());
            let (keep_len, stop) = scan_file(&mut reader, k, first, &mut scan);
            let file_len = reader.get_ref().metadata()?.len();
            keep.push(Some((keep_len, file_len)));
            cut = stop;
        }
        let Scan {
            found,
            starts,
            tail,
            mut files_of,
            ..
        } = scan;
        d.log = log;
        // A file's live messages: the ones kept from it, not replaced by
        // a later copy.
        let mut live = vec![0u64; files.len()];
        for (i, &(k, lo)) in starts.iter().enumerate() {
            let hi = starts.get(i + 1).map_or(u64::MAX, |s| s.1);
            live[k] = found.range(lo..hi).count() as u64;
        }
        let mut in_tail = vec![false; files.len()];
        for &(k, _, _, _) in &tail {
            in_tail[k] = true;
        }
        for (k, &(first, generation)) in files.iter().enumerate() {
            let path = dir.join(file_name(first, generation));
            match keep[k] {
                Some((keep_len, file_len)) if live[k] > 0 || in_tail[k] => {
                    if keep_len < file_len {
                        let f = OpenOptions::new().write(true).open(&path)?;
                        f.set_len(keep_len)?;
                        sync_file(&f, &path)?;
                    }
                    let data = std::mem::take(&mut files_of[k]);
                    if let Some(log) = d.log.as_mut() {
                        data.iter().for_each(|&n| log.pin(n));
                    }
                    d.segs.insert(
                        first,
                        Seg {
                            live: live[k],
                            len: keep_len,
                            data,
                            refd: 0,
                            generation,
                        },
                    );
                }
                _ => {
                    fs::remove_file(&path)?;
                    d.dir_changed = true;
                }
            }
        }
        if d.dir_changed {
            sync_dir(dir)?;
            d.dir_changed = false;
        }
        d.last = found.keys().next_back().copied().unwrap_or(0);
        d.tail = Tail {
            recs: tail
                .into_iter()
                .map(|(k, seq, loc, len)| (seq, files[k].0, loc, len))
                .collect(),
            at: 0,
        };
        d.drop_unneeded_data()?;
        // Appends go to a new file: the last one may be sealed already,
        // and a new file keeps the kept ones as they are.
        Ok((Payloads::Disk(Box::new(d)), found))
    }

    /// Stores message `m` (its seq above every seq stored before).
    pub fn append(&mut self, m: &MsgRef<'_>) -> io::Result<Loc> {
        self.append_at(m, None)
    }

    /// [`Payloads::append`] of a message whose data the group's log
    /// stored at `at` (file number and offset): with data of at least
    /// [`IN_LOG_MIN`] bytes, a disk store that knows the log keeps it
    /// there and writes an InLog record. Its [`Loc`] has the crc of the
    /// Msg record it stands for, as every replica's has.
    pub fn append_at(&mut self, m: &MsgRef<'_>, at: Option<(u64, u64)>) -> io::Result<Loc> {
        match self {
            Payloads::Memory(map) => {
                let mut rec = Vec::new();
                let len = segment::put_msg(&mut rec, m);
                let crc = crc_of(&rec);
                map.insert(m.seq, rec);
                Ok(Loc {
                    offset: 0,
                    len: len as u32,
                    crc,
                })
            }
            Payloads::Disk(d) => d.append(m, at),
        }
    }

    /// An entry stored in log file `file` applies (see [`LogFiles`]).
    pub fn entry_in(&mut self, file: u64) {
        if let Payloads::Disk(d) = self {
            if let Some(log) = d.log.as_mut() {
                log.entry_in(file, &mut d.dead);
            }
        }
    }

    /// Reads back the message `seq` stored at `loc`.
    pub fn read(&self, seq: u64, loc: Loc) -> io::Result<Payload> {
        decode(seq, &self.record(seq, loc)?)
    }

    /// The framed record of message `seq` stored at `loc`, as stored.
    pub fn record(&self, seq: u64, loc: Loc) -> io::Result<Vec<u8>> {
        if loc.len == 0 {
            return Err(io::Error::other(format!("message {seq} was not written")));
        }
        match self {
            Payloads::Memory(map) => map
                .get(&seq)
                .filter(|r| r.len() == loc.len as usize)
                .cloned()
                .ok_or_else(|| io::Error::other(format!("no message {seq} at {loc:?}"))),
            Payloads::Disk(d) => d.record(seq, loc),
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

    /// Drops every message (files deleted at once): the store starts
    /// over empty.
    pub fn clear(&mut self) -> io::Result<()> {
        match self {
            Payloads::Memory(map) => {
                map.clear();
                Ok(())
            }
            Payloads::Disk(d) => {
                let (dir, segment_bytes) = (d.dir.clone(), d.segment_bytes);
                empty_dir(&dir)?;
                sync_dir(&dir)?;
                let mut log = d.log.take();
                let mut dead = std::mem::take(&mut d.dead);
                if let Some(log) = log.as_mut() {
                    for seg in std::mem::take(&mut d.segs).into_values() {
                        seg.data.iter().for_each(|&n| log.unpin(n, &mut dead));
                    }
                }
                **d = Disk::new(&dir, segment_bytes);
                d.log = log;
                d.dead = dead;
                Ok(())
            }
        }
    }

    /// Writes the buffered appends (at the end of each entry).
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Payloads::Memory(_) => Ok(()),
            Payloads::Disk(d) => d.flush(),
        }
    }

    /// Writes the buffered appends and fsyncs every file written since the
    /// last sync, then the directory.
    pub fn sync(&mut self) -> io::Result<()> {
        match self {
            Payloads::Memory(_) => Ok(()),
            Payloads::Disk(d) => d.sync(),
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
    /// buffered appends are written first. The files written since the
    /// last detach and the dead files go with it: whoever takes it
    /// syncs the first ([`Detached::sync`]) and deletes the others once
    /// the state it stands for is stored.
    pub fn detach(&mut self) -> io::Result<Detached> {
        match self {
            Payloads::Memory(map) => Ok(Detached {
                files: Files::Memory(map.clone()),
                log: Vec::new(),
                unsynced: Vec::new(),
                dir: None,
                dead: Vec::new(),
            }),
            Payloads::Disk(d) => {
                d.flush()?;
                let mut files = BTreeMap::new();
                for &first in d.segs.keys() {
                    files.insert(first, File::open(d.path(first))?);
                }
                let unsynced = std::mem::take(&mut d.unsynced)
                    .into_iter()
                    .filter(|f| files.contains_key(f))
                    .map(|f| (f, d.path(f)))
                    .collect();
                let dir = std::mem::take(&mut d.dir_changed).then(|| d.dir.clone());
                let mut log = Vec::new();
                if let Some(l) = d.log.as_ref() {
                    for &(n, _) in &l.pins {
                        log.push((n, l.file(n)?));
                    }
                }
                Ok(Detached {
                    files: Files::Disk(files),
                    log,
                    unsynced,
                    dir,
                    dead: std::mem::take(&mut d.dead),
                })
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

    /// Deletes the store's files and directory (the replica is gone for
    /// good: its stream was deleted or its replica moved).
    pub fn destroy(self) {
        if let Payloads::Disk(d) = self {
            if let Err(e) = fs::remove_dir_all(&d.dir) {
                if e.kind() != io::ErrorKind::NotFound {
                    crate::log_error!("{}: {e}", d.dir.display());
                }
            }
        }
    }
}

/// Walks the seqs of `want` (sorted, disjoint, inclusive ranges) in order.
struct Wanted<'a> {
    ranges: &'a [(u64, u64)],
    /// The range the next wanted seq is in, and that seq.
    at: usize,
    next: Option<u64>,
}

/// What [`Wanted::take`] says of a record.
#[derive(Debug, PartialEq, Eq)]
enum Take {
    /// The next wanted message: keep it.
    Keep,
    /// A message removed before the snapshot: its record stays where it
    /// is, not counted live.
    Skip,
    /// A wanted message is missing before it, or it is past them all:
    /// the files end before it.
    Cut,
}

impl<'a> Wanted<'a> {
    fn new(ranges: &'a [(u64, u64)]) -> Wanted<'a> {
        Wanted {
            ranges,
            at: 0,
            next: ranges.first().map(|r| r.0),
        }
    }

    /// Goes back to `seq`: the next wanted seq is the first at or above
    /// it.
    fn rewind(&mut self, seq: u64) {
        self.at = self.ranges.partition_point(|&(_, hi)| hi < seq);
        self.next = self.ranges.get(self.at).map(|&(lo, _)| lo.max(seq));
    }

    /// Call with increasing seqs.
    fn take(&mut self, seq: u64) -> Take {
        let Some(next) = self.next else {
            return Take::Cut;
        };
        if seq < next {
            return Take::Skip;
        }
        if seq > next {
            return Take::Cut;
        }
        let (_, hi) = self.ranges[self.at];
        if seq < hi {
            self.next = Some(seq + 1);
        } else {
            self.at += 1;
            self.next = self.ranges.get(self.at).map(|r| r.0);
        }
        Take::Keep
    }
}

/// What reopening found so far, over the files in order.
struct Scan<'a> {
    wanted: Wanted<'a>,
    /// The kept messages; their seqs rise in the order they were read.
    found: BTreeMap<u64, Found>,
    /// Where each file's kept messages start in `found`: the file's place
    /// in the order, and its first kept seq.
    starts: Vec<(usize, u64)>,
    /// Once every wanted message is found: the whole records after them,
    /// seqs rising, with the place of their file in the order. They are
    /// what the log's replay will append again ([`Tail`]), each with the
    /// length of the Msg record it is or stands for.
    tail: Vec<(usize, u64, Loc, usize)>,
    /// The group's log, which InLog records are read from.
    log: Option<&'a LogFiles>,
    /// Per file in the order: the log files its kept InLog records point
    /// into, rising.
    files_of: Vec<Vec<u64>>,
}

impl Scan<'_> {
    /// A record of `seq` came after records of seqs at or above it: the
    /// seqs went back when it was written, so it and the records after
    /// it replace what was kept from `seq` on.
    fn rewind(&mut self, seq: u64) {
        self.found.split_off(&seq);
        self.starts.retain(|&(_, lo)| lo < seq);
        self.wanted.rewind(seq);
        self.tail.clear();
    }
}

/// Reads the records of segment file `first`, the `k`th in order, from
/// `r`, one at a time: the length of the prefix to keep, and whether
/// every later file goes too. Kept messages go into `scan`.
fn scan_file(r: &mut impl io::Read, k: usize, first: u64, scan: &mut Scan<'_>) -> (u64, bool) {
    let mut at = 0u64;
    let mut rec = Vec::new();
    loop {
        // One whole record: its head, then its body, checked.
        let mut head = [0u8; record::HEAD_BYTES];
        match read_full(r, &mut head) {
            Ok(0) => return (at, false),
            Ok(n) if n == record::HEAD_BYTES => {}
            // A torn tail or a damaged record: nothing after it is trusted.
            _ => return (at, true),
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as u64;
        if len > record::BODY_BYTES_MAX as u64 {
            return (at, true);
        }
        rec.clear();
        rec.extend_from_slice(&head);
        if !matches!(r.by_ref().take(len).read_to_end(&mut rec), Ok(n) if n as u64 == len) {
            return (at, true);
        }
        let Ok(Some((body, _))) = record::read(&rec, 0) else {
            return (at, true);
        };
        let next = at + rec.len() as u64;
        let decoded = segment::decode(body);
        let (m, in_log) = match decoded {
            Ok(Rec::Head { first_seq }) if at == 0 && first_seq == first => {
                at = next;
                continue;
            }
            Ok(Rec::Msg(m)) if at > 0 && m.seq >= first => (m, None),
            Ok(Rec::InLog(r)) if at > 0 && r.msg.seq >= first => (r.msg.clone(), Some(r)),
            _ => return (at, true),
        };
        {
            {
                if scan.found.keys().next_back().is_some_and(|&s| s >= m.seq) {
                    scan.rewind(m.seq);
                }
                // A later copy of tail records replaces them.
                let keep = scan.tail.partition_point(|t| t.1 < m.seq);
                scan.tail.truncate(keep);
                let take = scan.wanted.take(m.seq);
                let kept =
                    matches!(take, Take::Keep) || (take == Take::Cut && scan.wanted.next.is_none());
                // An InLog record is whole when its data reads back with
                // its crc: kept, it counts as the Msg record it stands for.
                let (crc, msg_len) = match &in_log {
                    Some(r) if kept => {
                        let whole = scan.log.map(|log| log.expand(r));
                        let Some(Ok(msg)) = whole else {
                            return (at, true);
                        };
                        let files = &mut scan.files_of[k];
                        if files.last() != Some(&r.file) {
                            files.push(r.file);
                        }
                        (r.crc, msg.len())
                    }
                    Some(r) => (r.crc, 0),
                    None => (crc_of(&rec), rec.len()),
                };
                let loc = Loc {
                    offset: at,
                    len: rec.len() as u32,
                    crc,
                };
                match take {
                    // Past every wanted message: a tail record.
                    Take::Cut if scan.wanted.next.is_none() => {
                        scan.tail.push((k, m.seq, loc, msg_len))
                    }
                    Take::Keep => {
                        if scan.starts.last().is_none_or(|s| s.0 != k) {
                            scan.starts.push((k, m.seq));
                        }
                        scan.found.insert(
                            m.seq,
                            Found {
                                subject: m.subject.into(),
                                time_ms: m.time_ms,
                                bytes: msg_len as u64,
                                marker: super::limits::asks_of(m.headers).op
                                    != super::limits::KvOp::Put,
                                loc,
                            },
                        );
                    }
                    Take::Skip => {}
                    Take::Cut => return (at, true),
                }
            }
        }
        at = next;
    }
}

/// Reads into `buf` until it is full or the reader ends; how many bytes
/// it read.
fn read_full(r: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The crc32 of a framed record's body, from its head.
fn crc_of(rec: &[u8]) -> u32 {
    u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]])
}

/// The payloads a store holds at one moment, readable on another thread
/// while the store goes on: the files open (a file deleted later is
/// still read whole), or, in memory, a copy of the records. It carries
/// the files written since the store was last detached, to be fsynced
/// before the state it stands for is stored, and the files that died
/// meanwhile, to be deleted after.
pub struct Detached {
    files: Files,
    /// The log files its InLog records point into, open, by number.
    log: Vec<(u64, Arc<File>)>,
    /// The files to fsync: first seq and path.
    unsynced: Vec<(u64, PathBuf)>,
    /// The directory, when files were made in it.
    dir: Option<PathBuf>,
    dead: Vec<PathBuf>,
}

enum Files {
    Memory(BTreeMap<u64, Vec<u8>>),
    /// Each file by its first seq.
    Disk(BTreeMap<u64, File>),
}

impl Detached {
    /// The framed records of the messages after seq `after` through
    /// `last` that `live` keeps, in seq order, about `max_bytes` of them
    /// (at least one), read from message `start`'s record on (a live
    /// message at or before the first one wanted), and the seq they
    /// cover through: the last one's, or `last` when none is left.
    ///
    /// On disk it reads each file in chunks from there, and a seq's copy
    /// that counts is the one in the last file whose first seq is at or
    /// below it (see the module docs): a file's records from the next
    /// file's first seq on are passed over.
    pub fn records_from(
        &self,
        start: (u64, Loc),
        after: u64,
        last: u64,
        live: &dyn Fn(u64) -> bool,
        max_bytes: usize,
    ) -> io::Result<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut through = after;
        let mut take = |seq: u64, rec: &[u8], out: &mut Vec<u8>| {
            if seq <= after || !live(seq) {
                return true;
            }
            if !out.is_empty() && out.len() + rec.len() > max_bytes {
                return false;
            }
            out.extend_from_slice(rec);
            through = seq;
            true
        };
        let files = match &self.files {
            Files::Memory(map) => {
                for (&seq, rec) in map.range(start.0..=last) {
                    if !take(seq, rec, &mut out) {
                        return Ok((out, through));
                    }
                }
                return Ok((out, last.max(through)));
            }
            Files::Disk(files) => files,
        };
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let Some((&first, _)) = files.range(..=start.0).next_back() else {
            return Err(bad(format!("no file holds message {}", start.0)));
        };
        let mut offset = start.1.offset;
        // Read ahead about one batch (a record larger than that doubles
        // it); the buffer is zeroed once per size, not per read.
        let mut chunk = SCAN_CHUNK.min((max_bytes + (16 << 10)).next_power_of_two());
        let mut space = Vec::new();
        for (&f, file) in files.range(first..) {
            let ends = files.range(f + 1..).next().map_or(u64::MAX, |(&n, _)| n);
            if f != first {
                offset = 0;
            }
            'file: loop {
                if space.len() < chunk {
                    space.resize(chunk, 0);
                }
                let n = read_at_most(file, &mut space[..chunk], offset)?;
                let buf = &space[..n];
                let mut at = 0;
                loop {
                    match record::read(buf, at) {
                        Ok(Some((body, end))) => {
                            let (seq, in_log) = match segment::decode(body) {
                                Ok(Rec::Msg(m)) => (Some(m.seq), None),
                                Ok(Rec::InLog(r)) => (Some(r.msg.seq), Some(r)),
                                _ => (None, None),
                            };
                            if let Some(seq) = seq {
                                if seq >= ends {
                                    break 'file;
                                }
                                if seq > last {
                                    return Ok((out, last.max(through)));
                                }
                                let whole;
                                let rec = match in_log {
                                    // Read from the log only when it is sent.
                                    Some(r) if seq > after && live(seq) => {
                                        let file = self
                                            .log
                                            .iter()
                                            .find(|f| f.0 == r.file)
                                            .map(|f| &f.1)
                                            .ok_or_else(|| {
                                                bad(format!(
                                                    "message {seq}: log file {} not held",
                                                    r.file
                                                ))
                                            })?;
                                        whole = expand_from(file, &r)?;
                                        &whole[..]
                                    }
                                    _ => &buf[at..end],
                                };
                                if !take(seq, rec, &mut out) {
                                    return Ok((out, through));
                                }
                            }
                            at = end;
                        }
                        // A record the next chunk holds whole.
                        Ok(None) | Err(record::Bad::Short) if at > 0 => break,
                        // One larger than the chunk.
                        Err(record::Bad::Short) if n == chunk => {
                            chunk *= 2;
                            break;
                        }
                        // The file's end (a torn record past `last` at most).
                        Ok(None) | Err(record::Bad::Short) => break 'file,
                        Err(e) => {
                            return Err(bad(format!(
                                "file of seq {f} at {}: {e}",
                                offset + at as u64
                            )))
                        }
                    }
                }
                offset += at as u64;
            }
        }
        Ok((out, last.max(through)))
    }

    /// Fsyncs the files written since the store was last detached, then
    /// the directory if files were made in it.
    pub fn sync(&self) -> io::Result<()> {
        if let Files::Disk(files) = &self.files {
            for (first, path) in &self.unsynced {
                if let Some(f) = files.get(first) {
                    sync_file(f, path)?;
                }
            }
        }
        if let Some(dir) = &self.dir {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// The files whose messages were all gone when this was taken: to be
    /// deleted once a snapshot at least this recent is stored.
    pub fn take_dead(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.dead)
    }
}

/// Decodes the framed record of message `seq`.
pub fn decode(seq: u64, rec: &[u8]) -> io::Result<Payload> {
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
    fn new(dir: &Path, segment_bytes: u64) -> Disk {
        Disk {
            dir: dir.to_path_buf(),
            segment_bytes: segment_bytes.max(1),
            segs: BTreeMap::new(),
            active: None,
            pending: Vec::new(),
            written_back: 0,
            last: 0,
            unsynced: BTreeSet::new(),
            dir_changed: false,
            dead: Vec::new(),
            generation: next_generation(),
            tail: Tail::default(),
            log: None,
        }
    }

    /// The path of the file `first` (one of `segs`).
    fn path(&self, first: u64) -> PathBuf {
        let generation = self
            .segs
            .get(&first)
            .map_or(self.generation, |s| s.generation);
        self.dir.join(file_name(first, generation))
    }

    /// Keeps InLog records' data in the log in `log` (if any): the data
    /// files there that no record of the store needs go.
    fn use_log(&mut self, log: Option<&Path>) -> io::Result<()> {
        self.log = log.map(LogFiles::new);
        self.drop_unneeded_data()
    }

    /// The log's data files no segment file needs go (with the next
    /// snapshot, as dead files do).
    fn drop_unneeded_data(&mut self) -> io::Result<()> {
        let Some(log) = self.log.as_ref() else {
            return Ok(());
        };
        let have = match log_files::data_files(&log.dir) {
            Ok(have) => have,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        for n in have {
            if !log.pinned(n) {
                self.dead.push(log_files::data_path(&log.dir, n));
            }
        }
        Ok(())
    }

    fn append(&mut self, m: &MsgRef<'_>, at: Option<(u64, u64)>) -> io::Result<Loc> {
        if self.tail.pending() {
            if let Some(loc) = self.take_from_tail(m) {
                return Ok(loc);
            }
        }
        let at = at.filter(|_| self.log.is_some() && m.data.len() >= IN_LOG_MIN);
        let full = self.active.as_ref().is_some_and(|(first, _)| {
            let seg = &self.segs[first];
            seg.len + seg.refd + self.pending.len() as u64 >= self.segment_bytes
        });
        let back = m.seq <= self.last;
        if back {
            // Seqs went back (see the module docs): a new file, under a
            // name no file had.
            self.generation = next_generation();
        }
        if full || back {
            self.flush()?;
            self.active = None;
        }
        if self.active.is_none() {
            let path = self.dir.join(file_name(m.seq, self.generation));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            let generation = self.generation;
            self.segs.insert(
                m.seq,
                Seg {
                    live: 0,
                    len: 0,
                    data: Vec::new(),
                    refd: 0,
                    generation,
                },
            );
            self.active = Some((m.seq, file));
            self.written_back = 0;
            self.dir_changed = true;
            segment::put_head(&mut self.pending, m.seq);
        }
        let Some((first, _)) = self.active else {
            unreachable!("an active file was just made");
        };
        self.unsynced.insert(first);
        let offset = self.segs[&first].len + self.pending.len() as u64;
        let start = self.pending.len();
        let (len, crc) = match at {
            Some((file, data)) => {
                let (len, _, crc) = segment::put_in_log(&mut self.pending, m, file, data);
                let seg = self
                    .segs
                    .get_mut(&first)
                    .expect("the active file is a segment");
                seg.refd += m.data.len() as u64;
                if seg.data.last() != Some(&file) {
                    seg.data.push(file);
                    if let Some(log) = self.log.as_mut() {
                        log.pin(file);
                    }
                }
                (len, crc)
            }
            None => {
                let len = segment::put_msg(&mut self.pending, m);
                (len, crc_of(&self.pending[start..]))
            }
        };
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
            crc,
        })
    }

    /// The tail's record of `m`, when it holds the very record an append
    /// would write: taken in place, its file to be fsynced with the next
    /// snapshot (it may have been written but not synced before the
    /// restart). Otherwise the tail ends (see [`Tail`]) and `m` is
    /// appended as usual.
    fn take_from_tail(&mut self, m: &MsgRef<'_>) -> Option<Loc> {
        // Records of seqs the replay passes over (removed before the
        // snapshot, or never appended again) stay where they are, as
        // records of removed messages do.
        self.tail.pass_below(m.seq);
        let Some(&(seq, file, loc, msg_len)) = self.tail.recs.get(self.tail.at) else {
            self.end_tail(None);
            return None;
        };
        // The same Msg record, whether the tail holds it whole or as an
        // InLog record (the log's replay stores its data where it was).
        let (len, crc) = segment::msg_sum(m);
        let same = seq == m.seq && len == msg_len && crc == loc.crc;
        let Some(seg) = self.segs.get_mut(&file).filter(|_| same) else {
            self.end_tail(Some((file, loc.offset)));
            return None;
        };
        seg.live += 1;
        self.last = m.seq;
        if self.unsynced.insert(file) {
            // Its name may not be on disk either.
            self.dir_changed = true;
        }
        self.tail.at += 1;
        if !self.tail.pending() {
            self.end_tail(None);
        }
        Some(loc)
    }

    /// Ends the tail: with `cut`, the file `cut.0` loses what it holds
    /// from offset `cut.1` on (no fsync: what comes back after a crash is
    /// the same messages, which a later copy replaces), and every tail
    /// file left without a message goes with the next snapshot.
    fn end_tail(&mut self, cut: Option<(u64, u64)>) {
        let files: BTreeSet<u64> = self.tail.recs.iter().map(|r| r.1).collect();
        self.tail = Tail::default();
        if let Some((first, offset)) = cut {
            let path = self.path(first);
            if let Some(seg) = self.segs.get_mut(&first) {
                let cut = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(offset));
                match cut {
                    Ok(()) => seg.len = offset,
                    // Left whole: its records past `offset` are passed over
                    // when it is read, and replaced when reopened.
                    Err(e) => crate::log_warn!("{}: cutting its tail: {e}", path.display()),
                }
            }
        }
        for first in files {
            if self.segs.get(&first).is_some_and(|s| s.live == 0) {
                self.retire(first);
            }
        }
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
            // Whole pages only: the last one takes the next appends.
            let end = seg.len & !4095;
            if end >= self.written_back + WRITEBACK_BYTES {
                start_writeback(file, self.written_back, end - self.written_back);
                self.written_back = end;
            }
        }
        self.pending.clear();
        r
    }

    fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        for first in std::mem::take(&mut self.unsynced) {
            if self.segs.contains_key(&first) {
                let path = self.path(first);
                sync_file(&File::open(&path)?, &path)?;
            }
        }
        if std::mem::take(&mut self.dir_changed) {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The first seq of the file holding `seq`.
    fn seg_of(&self, seq: u64) -> Option<u64> {
        self.segs.range(..=seq).next_back().map(|(&f, _)| f)
    }

    /// The Msg record of `seq` at `loc`, read whole (an InLog record's
    /// data from the log).
    fn record(&self, seq: u64, loc: Loc) -> io::Result<Vec<u8>> {
        let rec = self.stored(seq, loc)?;
        if rec.get(record::HEAD_BYTES) != Some(&segment::KIND_IN_LOG) {
            return Ok(rec);
        }
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let (body, _) = record::read(&rec, 0)
            .map_err(|e| bad(format!("message {seq}: {e}")))?
            .ok_or_else(|| bad(format!("message {seq}: no record")))?;
        match (segment::decode(body), self.log.as_ref()) {
            (Ok(Rec::InLog(r)), Some(log)) if r.msg.seq == seq => log.expand(&r),
            (Ok(Rec::InLog(_)), None) => Err(bad(format!("message {seq}: in a log it lacks"))),
            _ => Err(bad(format!("message {seq}: another record"))),
        }
    }

    /// The record of `seq` at `loc`, as stored.
    fn stored(&self, seq: u64, loc: Loc) -> io::Result<Vec<u8>> {
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
                return Ok(rec.to_vec());
            }
            file.read_exact_at(&mut buf, loc.offset)?;
        } else {
            File::open(self.path(first))?.read_exact_at(&mut buf, loc.offset)?;
        }
        Ok(buf)
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
        // A file the tail has records in to take stays until the tail ends.
        if seg.live > 0 || self.tail.next_file().is_some_and(|f| f <= first) {
            return;
        }
        self.retire(first);
    }

    /// The file of `first`, holding no message now, leaves the store: it
    /// is deleted once a snapshot taken after this is stored.
    fn retire(&mut self, first: u64) {
        let path = self.path(first);
        if let Some(seg) = self.segs.remove(&first) {
            if let Some(log) = self.log.as_mut() {
                seg.data.iter().for_each(|&n| log.unpin(n, &mut self.dead));
            }
        }
        if self.active.as_ref().is_some_and(|(f, _)| *f == first) {
            // Its buffered appends are of removed messages, which no
            // stored snapshot names (each snapshot fsyncs what it names).
            self.active = None;
            self.pending.clear();
        }
        self.unsynced.remove(&first);
        self.dead.push(path);
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

    /// The file of first seq `first` in `dir`, of whatever generation.
    fn seg_path(dir: &Path, first: u64) -> PathBuf {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                parse_name(p.file_name().unwrap().to_str().unwrap()).map(|n| n.0) == Some(first)
            })
            .unwrap_or_else(|| panic!("no file {first} in {}", dir.display()))
    }

    fn seg_files(dir: &Path) -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| Some(parse_name(e.unwrap().file_name().to_str()?)?.0))
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

    /// What a stored snapshot does: the dead files go.
    fn compact(p: &mut Payloads) {
        let mut d = p.detach().unwrap();
        d.sync().unwrap();
        assert!(crate::storage::delete_files(&d.take_dead()).is_empty());
    }

    #[test]
    fn files_roll_and_go_with_their_last_message_once_a_snapshot_is_stored() {
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
        assert_eq!(p.files(), 1);
        assert_eq!(
            seg_files(&dir),
            vec![1, 5, 9],
            "kept until a snapshot is stored"
        );
        compact(&mut p);
        assert_eq!(seg_files(&dir), vec![9]);
        check(&p, 10, locs[9], &d);
        // The active file going empty goes too; appends start anew.
        for s in 9..=12 {
            p.remove(s);
        }
        compact(&mut p);
        assert!(seg_files(&dir).is_empty());
        let loc = p.append(&msg(13, &d)).unwrap();
        p.flush().unwrap();
        assert_eq!(seg_files(&dir), vec![13]);
        check(&p, 13, loc, &d);
        // Removing what is not there changes nothing.
        p.remove(3);
        p.remove(99);
        compact(&mut p);
        assert_eq!(seg_files(&dir), vec![13]);
        // The files are the stream's own segment format.
        let bytes = fs::read(seg_path(&dir, 13)).unwrap();
        let (bodies, end, bad) = record::scan(&bytes);
        assert_eq!((end, bad), (bytes.len(), None));
        assert_eq!(segment::decode(bodies[0]), Ok(Rec::Head { first_seq: 13 }));
        assert!(matches!(segment::decode(bodies[1]), Ok(Rec::Msg(m)) if m.seq == 13));
        // Dropped, the store leaves its files; destroyed, they go.
        drop(p);
        assert_eq!(seg_files(&dir), vec![13]);
        let (p, found) = Payloads::reopen(&dir, 10_000, &[(13, 13)]).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![13]);
        p.destroy();
        assert!(!dir.exists());
    }

    #[test]
    fn reopening_keeps_the_wanted_records_and_cuts_the_rest() {
        let dir = temp_dir();
        let d = vec![3u8; 3_000];
        let locs = twelve_written(&dir, &d);
        // 2 and 6 were removed before the snapshot, which ends at 10: 11
        // and 12 came after it (the log applies them again).
        let want = [(1, 1), (3, 5), (7, 10)];
        let (p, found) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        assert_eq!(
            found.keys().copied().collect::<Vec<_>>(),
            vec![1, 3, 4, 5, 7, 8, 9, 10]
        );
        for (&s, f) in &found {
            assert_eq!(f.loc, locs[s as usize - 1], "message {s}");
            assert_eq!(f.bytes, u64::from(f.loc.len));
            check(&p, s, f.loc, &d);
        }
        drop(p);
        // The file of 9..=12 stays whole: 11 and 12 are its tail, for the
        // log's replay to take again.
        let len = fs::metadata(seg_path(&dir, 9)).unwrap().len();
        assert_eq!(len, locs[11].offset + u64::from(locs[11].len));
        // A torn tail: the last record cut in half.
        let f = OpenOptions::new()
            .write(true)
            .open(seg_path(&dir, 9))
            .unwrap();
        f.set_len(locs[9].offset + 100).unwrap();
        let (_, found) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        assert_eq!(found.keys().next_back(), Some(&9));
        // One flipped bit in a sealed file: it and everything after go.
        let path = seg_path(&dir, 5);
        let mut bytes = fs::read(&path).unwrap();
        let at = (locs[5].offset + 40) as usize;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let (mut p, found) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![1, 3, 4, 5]);
        assert_eq!(seg_files(&dir), vec![1, 5]);
        // Appends go on after what was kept.
        let loc = p.append(&msg(7, &d)).unwrap();
        check(&p, 7, loc, &d);
        p.flush().unwrap();
        // A lost file: what it held and everything after is missing.
        fs::remove_file(seg_path(&dir, 1)).unwrap();
        let (_, found) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        assert!(found.is_empty());
        assert!(seg_files(&dir).is_empty());
    }

    /// A store in `dir` (files of 10 000 bytes) given messages 1 to 12 of
    /// `d`, written and closed; where each went.
    fn twelve_written(dir: &Path, d: &[u8]) -> Vec<Loc> {
        let mut p = Payloads::open(dir, 10_000).unwrap();
        let locs = (1..=12).map(|s| p.append(&msg(s, d)).unwrap()).collect();
        p.flush().unwrap();
        locs
    }

    /// The length of every file in `dir`, by name.
    fn file_lens(dir: &Path) -> BTreeMap<String, u64> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                (name, e.metadata().unwrap().len())
            })
            .collect()
    }

    #[test]
    fn a_reopened_store_takes_its_tail_again_instead_of_rewriting_it() {
        let dir = temp_dir();
        let d = vec![5u8; 3_000];
        let locs = twelve_written(&dir, &d);
        let before = file_lens(&dir);
        // The snapshot ends at 10; the replay appends 11 and 12 again:
        // taken where they are, nothing written.
        let want = [(1, 1), (3, 5), (7, 10)];
        let (mut p, _) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        for s in [11, 12] {
            let loc = p.append(&msg(s, &d)).unwrap();
            assert_eq!(loc, locs[s as usize - 1], "message {s}");
            check(&p, s, loc, &d);
        }
        p.flush().unwrap();
        assert_eq!(file_lens(&dir), before, "the tail was written again");
        // Past the tail, appends go to a new file; the taken records'
        // file is fsynced with the next snapshot.
        let loc13 = p.append(&msg(13, &d)).unwrap();
        let Payloads::Disk(disk) = &p else {
            unreachable!()
        };
        assert!(disk.unsynced.contains(&9) && disk.unsynced.contains(&13));
        compact(&mut p);
        assert_eq!(seg_files(&dir), vec![1, 5, 9, 13]);
        drop(p);
        let (_, found) = Payloads::reopen(&dir, 10_000, &[(1, 1), (3, 5), (7, 13)]).unwrap();
        assert_eq!(found[&12].loc, locs[11]);
        assert_eq!(found[&13].loc, loc13);

        // A record that differs ends the tail: the rest is cut, and a file
        // of nothing but tail records goes with the next snapshot.
        let (mut p, _) = Payloads::reopen(&dir, 10_000, &want).unwrap();
        let other = vec![6u8; 3_000];
        let loc = p.append(&msg(11, &other)).unwrap();
        check(&p, 11, loc, &other);
        p.flush().unwrap();
        assert_eq!(
            fs::metadata(seg_path(&dir, 9)).unwrap().len(),
            locs[10].offset
        );
        compact(&mut p);
        assert_eq!(seg_files(&dir), vec![1, 5, 9, 11]);
        drop(p);
        let (_, found) = Payloads::reopen(&dir, 10_000, &[(1, 1), (3, 5), (7, 11)]).unwrap();
        assert_eq!(found[&11].loc, loc);

        // Seqs the replay passes over stay where they are; a taken record
        // removed at once (a work queue's ack) leaves its file to the
        // records of the tail still to take.
        let dir = temp_dir();
        let locs = twelve_written(&dir, &d);
        let before = file_lens(&dir);
        let (mut p, found) = Payloads::reopen(&dir, 10_000, &[(1, 8)]).unwrap();
        assert_eq!(found.len(), 8);
        assert_eq!(p.append(&msg(10, &d)).unwrap(), locs[9]);
        p.remove(10);
        assert_eq!(p.append(&msg(11, &d)).unwrap(), locs[10]);
        check(&p, 11, locs[10], &d);
        p.remove(11);
        assert_eq!(p.append(&msg(12, &d)).unwrap(), locs[11]);
        p.flush().unwrap();
        assert_eq!(file_lens(&dir), before);
        p.remove(12);
        // The file of 9..=12 holds nothing now: it goes.
        compact(&mut p);
        assert_eq!(seg_files(&dir), vec![1, 5]);
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

    #[test]
    fn file_names_carry_their_generation() {
        for (first, g) in [(1, 0), (39, 14), (u64::MAX, 7)] {
            assert_eq!(parse_name(&file_name(first, g)), Some((first, g)));
        }
        assert_eq!(file_name(5, 0), segment::file_name(5));
        for bad in [
            "00000000000000000005.0.seg",
            "00000000000000000005..seg",
            "5.1.seg",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    /// A store that starts over stores the same seqs again under other
    /// names: deleting the files that died before (as the Raft thread
    /// does once a snapshot is stored) leaves the new ones alone.
    #[test]
    fn a_dead_file_is_never_named_like_a_live_one() {
        let dir = temp_dir();
        let mut p = Payloads::open(&dir, 10_000).unwrap();
        let d = vec![7u8; 3_000];
        for s in 1..=8 {
            p.append(&msg(s, &d)).unwrap();
        }
        for s in 5..=8 {
            p.remove(s);
        }
        // File 5 died; its deletion waits for a snapshot.
        let mut before = p.detach().unwrap();
        let dead = before.take_dead();
        assert_eq!(dead.len(), 1);
        // Seqs go back: 5..=8 are stored again.
        let locs: Vec<Loc> = (5..=8).map(|s| p.append(&msg(s, &d)).unwrap()).collect();
        p.flush().unwrap();
        assert!(crate::storage::delete_files(&dead).is_empty());
        for (s, loc) in (5..=8).zip(&locs) {
            check(&p, s, *loc, &d);
        }
        // It starts over: everything again, under new names.
        let mut again = p.detach().unwrap();
        p.clear().unwrap();
        let locs: Vec<Loc> = (1..=8).map(|s| p.append(&msg(s, &d)).unwrap()).collect();
        p.flush().unwrap();
        assert!(crate::storage::delete_files(&again.take_dead()).is_empty());
        for (s, loc) in (1..=8).zip(&locs) {
            check(&p, s, *loc, &d);
        }
    }

    /// Seqs that went back leave older copies in the files: after a
    /// restart, each seq is read from the copy written last.
    #[test]
    fn reopening_takes_the_copy_written_last() {
        let dir = temp_dir();
        let mut p = Payloads::open(&dir, 10_000).unwrap();
        let d = vec![7u8; 3_000];
        let old: Vec<Loc> = (1..=6).map(|s| p.append(&msg(s, &d)).unwrap()).collect();
        p.flush().unwrap();
        // 3 and 4 (in file 1) and 5 and 6 (all of file 5) dropped, then
        // stored again, with 7.
        for s in 3..=6 {
            p.remove(s);
        }
        let locs: Vec<Loc> = (3..=7).map(|s| p.append(&msg(s, &d)).unwrap()).collect();
        p.flush().unwrap();
        // The crash came before the dead file 5 was deleted.
        assert_eq!(seg_files(&dir), vec![1, 3, 5, 7]);
        drop(p);
        let (p, found) = Payloads::reopen(&dir, 10_000, &[(1, 7)]).unwrap();
        assert_eq!(
            found.keys().copied().collect::<Vec<_>>(),
            (1..=7).collect::<Vec<_>>()
        );
        for (s, f) in &found {
            check(&p, *s, f.loc, &d);
        }
        // 3 and 4 from file 3, written after file 1's copies; 5 and 6
        // from the dead file 5, which holds them by name (the same
        // messages as file 3's later copies).
        assert_eq!(found[&3].loc, locs[0]);
        assert_eq!(found[&4].loc, locs[1]);
        assert_eq!(found[&5].loc, old[4]);
        assert_eq!(found[&6].loc, old[5]);
        assert_eq!(p.files(), 4);
        drop(p);
        let (p, again) = Payloads::reopen(&dir, 10_000, &[(1, 7)]).unwrap();
        assert_eq!(again, found);
        for (s, f) in &again {
            check(&p, *s, f.loc, &d);
        }
    }

    /// A log directory whose file `n` holds, for each seq, its data (at
    /// the offsets returned) after a few bytes of something else, as a
    /// log's entry records would.
    struct FakeLog {
        dir: PathBuf,
        /// Seq → (file, offset).
        at: BTreeMap<u64, (u64, u64)>,
    }

    impl FakeLog {
        fn new() -> FakeLog {
            let dir = temp_dir();
            fs::create_dir_all(&dir).unwrap();
            FakeLog {
                dir,
                at: BTreeMap::new(),
            }
        }

        /// Writes `data` of `seq` into log file `n` (appended).
        fn write(&mut self, n: u64, seq: u64, data: &[u8]) -> (u64, u64) {
            use std::io::Write;
            let path = self.dir.join(log_files::log_name(n));
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(b"entry head").unwrap();
            let offset = f.metadata().unwrap().len();
            f.write_all(data).unwrap();
            self.at.insert(seq, (n, offset));
            (n, offset)
        }

        /// Log file `n` is covered: it becomes a data file.
        fn cover(&self, n: u64) {
            fs::rename(
                self.dir.join(log_files::log_name(n)),
                log_files::data_path(&self.dir, n),
            )
            .unwrap();
        }
    }

    fn big(seq: u64) -> Vec<u8> {
        (0..IN_LOG_MIN as u64 + 300 + seq)
            .map(|i| (i * 31 + seq) as u8)
            .collect()
    }

    #[test]
    fn a_message_in_the_log_is_kept_there_and_reads_back_as_if_written_whole() {
        let mut log = FakeLog::new();
        let dir = temp_dir();
        let mut p = Payloads::open_in(&dir, 1 << 20, Some(&log.dir)).unwrap();
        let mut whole = Payloads::memory();
        let small = vec![5u8; 10];
        let mut locs = Vec::new();
        for seq in 1..=6u64 {
            let file = 1 + seq / 4;
            p.entry_in(file);
            let data = if seq == 3 { small.clone() } else { big(seq) };
            let at = log.write(file, seq, &data);
            let loc = p.append_at(&msg(seq, &data), Some(at)).unwrap();
            // The same crc (the replicas' digest) and the same record.
            let w = whole.append(&msg(seq, &data)).unwrap();
            assert_eq!(loc.crc, w.crc, "message {seq}");
            check(&p, seq, loc, &data);
            assert_eq!(p.record(seq, loc).unwrap(), whole.record(seq, w).unwrap());
            locs.push((loc, data));
        }
        p.flush().unwrap();
        // Only the small message's data is in the store's file.
        let written = fs::metadata(seg_path(&dir, 1)).unwrap().len();
        let data_bytes: usize = locs.iter().map(|(_, d)| d.len()).sum();
        assert!(written < 6 * 120 + 10, "{written} bytes for {data_bytes}");
        for (i, (loc, data)) in locs.iter().enumerate() {
            check(&p, i as u64 + 1, *loc, data);
        }
        // Data that no longer reads back with its crc is an error.
        let (n, offset) = log.at[&5];
        let f = OpenOptions::new()
            .write(true)
            .open(log.dir.join(log_files::log_name(n)))
            .unwrap();
        f.write_all_at(&[0xFF ^ big(5)[7]], offset + 7).unwrap();
        let err = p.read(5, locs[4].0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        check(&p, 4, locs[3].0, &locs[3].1);
    }

    #[test]
    fn log_files_go_once_no_live_message_needs_them_and_no_entry_is_left_in_them() {
        let mut log = FakeLog::new();
        let dir = temp_dir();
        // A data file of an earlier run that nothing needs goes first.
        fs::write(log_files::data_path(&log.dir, 0), b"old").unwrap();
        // Two messages a segment file.
        let seg = 2 * (big(1).len() as u64 + 60);
        let mut p = Payloads::open_in(&dir, seg, Some(&log.dir)).unwrap();
        let mut locs = BTreeMap::new();
        for seq in 1..=6u64 {
            // Log files 1, 1, 2, 2, 3, 3.
            let file = seq.div_ceil(2);
            p.entry_in(file);
            let data = big(seq);
            let at = log.write(file, seq, &data);
            locs.insert(seq, p.append_at(&msg(seq, &data), Some(at)).unwrap());
        }
        p.flush().unwrap();
        assert_eq!(seg_files(&dir), vec![1, 3, 5]);
        let dead = |p: &mut Payloads| -> Vec<String> {
            let mut d = p.detach().unwrap();
            let mut v: Vec<String> = d
                .take_dead()
                .iter()
                .filter(|p| p.starts_with(&log.dir))
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(dead(&mut p), ["data.0"]);
        // A frozen state reads its messages from the log files it holds,
        // also once their names changed.
        log.cover(3);
        let frozen = p.detach().unwrap();
        let (recs, through) = frozen
            .records_from((5, locs[&5]), 4, 6, &|_| true, 1 << 20)
            .unwrap();
        assert_eq!(through, 6);
        let mut whole = Payloads::memory();
        let mut want = Vec::new();
        for seq in 5..=6 {
            let w = whole.append(&msg(seq, &big(seq))).unwrap();
            want.extend(whole.record(seq, w).unwrap());
        }
        assert_eq!(recs, want);
        // Segment file 3 (messages 3, 4, in log file 2) empties.
        p.remove(3);
        p.remove(4);
        assert_eq!(dead(&mut p), ["data.2"]);
        p.remove(1);
        p.remove(2);
        assert_eq!(dead(&mut p), ["data.1"]);
        // Log file 3 holds the last entry applied: it stays, needed or
        // not, until an entry in a later file applies.
        check(&p, 6, locs[&6], &big(6));
        p.remove(5);
        p.remove(6);
        assert_eq!(dead(&mut p), Vec::<String>::new());
        p.entry_in(4);
        assert_eq!(dead(&mut p), ["data.3"]);
    }

    #[test]
    fn reopening_reads_in_log_records_from_the_log_and_cuts_at_damaged_data() {
        let mut log = FakeLog::new();
        let dir = temp_dir();
        let mut p = Payloads::open_in(&dir, 1 << 20, Some(&log.dir)).unwrap();
        let mut locs = BTreeMap::new();
        for seq in 1..=8u64 {
            let file = 1 + seq / 5;
            p.entry_in(file);
            let data = big(seq);
            let at = log.write(file, seq, &data);
            locs.insert(seq, p.append_at(&msg(seq, &data), Some(at)).unwrap());
        }
        p.sync().unwrap();
        drop(p);
        log.cover(1);
        let whole_len = |seq: u64| {
            let mut m = Payloads::memory();
            let loc = m.append(&msg(seq, &big(seq))).unwrap();
            loc.len as u64
        };
        // Wanted 1..=5; 6..=8 are the tail, taken again in place.
        let (mut p, found) = Payloads::reopen_in(&dir, 1 << 20, &[(1, 5)], Some(&log.dir)).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        for (seq, f) in &found {
            assert_eq!(f.loc, locs[seq]);
            assert_eq!(f.bytes, whole_len(*seq), "counted as the whole record");
            check(&p, *seq, f.loc, &big(*seq));
        }
        let before = fs::metadata(seg_path(&dir, 1)).unwrap().len();
        for seq in 6..=8 {
            p.entry_in(2);
            let at = log.at[&seq];
            let loc = p.append_at(&msg(seq, &big(seq)), Some(at)).unwrap();
            assert_eq!(loc, locs[&seq]);
        }
        p.flush().unwrap();
        assert_eq!(fs::metadata(seg_path(&dir, 1)).unwrap().len(), before);
        assert!(
            p.detach().unwrap().take_dead().is_empty(),
            "every log file is needed"
        );
        drop(p);
        // One byte of message 4's data flipped: 4 and after are cut.
        let (n, offset) = log.at[&4];
        let f = OpenOptions::new()
            .write(true)
            .open(log_files::data_path(&log.dir, n))
            .unwrap();
        f.write_all_at(&[0xFF ^ big(4)[0]], offset).unwrap();
        let (_, found) = Payloads::reopen_in(&dir, 1 << 20, &[(1, 8)], Some(&log.dir)).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        // Without its log, no InLog record is whole.
        let (_, found) = Payloads::reopen_in(&dir, 1 << 20, &[(1, 3)], None).unwrap();
        assert!(found.is_empty());
    }
}
