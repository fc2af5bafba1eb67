//! What a stream keeps on disk besides its messages: its config, its
//! consumers' configs and their cursors (deliveries made, pending acks with
//! delivery counts), in `<data>/streams/<name>/`:
//!
//! - `meta.snap`: a [`statefile`] (one crc-framed record, replaced
//!   atomically) holding a [`Snapshot`] as JSON, including `gen`, the
//!   number of the log that continues it;
//! - `meta.<gen>.log`: crc-framed binary records of consumer [`Event`]s
//!   made since that snapshot, appended once per loop turn.
//!
//! A restart reads the snapshot and replays its log. When the log grows
//! past [`LOG_BYTES_COMPACT`], a new snapshot with the next `gen` replaces
//! it, so replay is bounded and never applies an event twice: a log is
//! only ever read together with the snapshot that names it.
//!
//! Log record body (little-endian): `u8 kind` (1 delivered, 2 done,
//! 3 done-up-to), `u8 name length`, consumer name, `u64 seq`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::consumer::Event;
use crate::protocol::stream_messages::{ConsumerConfig, StreamConfig};
use crate::storage::record;
use crate::storage::statefile;

/// Log size past which the next loop turn writes a fresh snapshot.
pub const LOG_BYTES_COMPACT: u64 = 8 << 20;

const SNAP: &str = "meta.snap";

/// One consumer as the snapshot holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerSnap {
    pub config: ConsumerConfig,
    pub since: u64,
    pub next_seq: u64,
    pub consumer_seq: u64,
    /// `[seq, deliveries]` of every message awaiting an ack.
    pub pending: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub gen: u64,
    pub config: StreamConfig,
    /// The last seq ever given out (sequences never go back, also when
    /// every message is gone).
    pub last_seq: u64,
    pub consumers: Vec<ConsumerSnap>,
}

/// What [`MetaLog::open`] read: the snapshot, the events logged since
/// (consumer name, event), and the log open for appending.
pub type Opened = (Snapshot, Vec<(String, Event)>, MetaLog);

/// The event log of one stream, open for appending.
#[derive(Debug)]
pub struct MetaLog {
    dir: PathBuf,
    gen: u64,
    file: File,
    /// Encoded records not yet written.
    buf: Vec<u8>,
    /// Bytes in the file.
    len: u64,
}

/// Why the metadata of a stream could not be read.
#[derive(Debug)]
pub enum MetaError {
    Io(PathBuf, io::Error),
    Corrupt(PathBuf, String),
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            MetaError::Corrupt(p, why) => write!(f, "{}: {why}", p.display()),
        }
    }
}

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> MetaError + '_ {
    move |e| MetaError::Io(p.to_path_buf(), e)
}

fn log_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("meta.{gen}.log"))
}

fn write_snap(dir: &Path, body: &[u8]) -> Result<(), MetaError> {
    let path = dir.join(SNAP);
    statefile::write(&path, body).map_err(io_err(&path))
}

impl MetaLog {
    /// Writes the first snapshot of a new stream and opens its log.
    pub fn create(dir: &Path, snap: &mut Snapshot) -> Result<MetaLog, MetaError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        snap.gen = 1;
        let body =
            serde_json::to_vec(snap).map_err(|e| MetaError::Corrupt(dir.into(), e.to_string()))?;
        let log = open_log(dir, 1, true)?;
        write_snap(dir, &body)?;
        Ok(log)
    }

    /// Reads a stream's snapshot and the events logged since; the log is
    /// cut at its first bad record (a torn tail) and opened for appending.
    pub fn open(dir: &Path) -> Result<Opened, MetaError> {
        let path = dir.join(SNAP);
        let body = statefile::read(&path)
            .map_err(io_err(&path))?
            .ok_or_else(|| MetaError::Corrupt(path.clone(), "missing".into()))?;
        let snap: Snapshot = crate::protocol::json_from_bytes(&body)
            .map_err(|e| MetaError::Corrupt(path.clone(), e.to_string()))?;
        let lpath = log_path(dir, snap.gen);
        let bytes = match fs::read(&lpath) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(MetaError::Io(lpath, e)),
        };
        let mut events = Vec::new();
        let mut at = 0;
        while let Ok(Some((body, next))) = record::read(&bytes, at) {
            match decode_event(body) {
                Some(e) => events.push(e),
                None => break,
            }
            at = next;
        }
        let mut log = open_log(dir, snap.gen, false)?;
        if (at as u64) < bytes.len() as u64 {
            log.file.set_len(at as u64).map_err(io_err(&lpath))?;
            log.file.sync_all().map_err(io_err(&lpath))?;
        }
        log.len = at as u64;
        remove_stale_logs(dir, snap.gen);
        Ok((snap, events, log))
    }

    /// Queues one event; [`MetaLog::flush`] writes it.
    pub fn push(&mut self, consumer: &str, e: Event) {
        let (kind, seq) = match e {
            Event::Delivered(s) => (1u8, s),
            Event::Done(s) => (2, s),
            Event::DoneUpTo(s) => (3, s),
        };
        let start = record::begin(&mut self.buf);
        self.buf.push(kind);
        let name = consumer.as_bytes();
        // Names are at most 64 bytes (checked at create).
        self.buf.push(name.len().min(255) as u8);
        self.buf.extend_from_slice(&name[..name.len().min(255)]);
        self.buf.extend_from_slice(&seq.to_le_bytes());
        record::finish(&mut self.buf, start);
    }

    pub fn has_queued(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Writes what was queued (one write(2)); true if anything was.
    pub fn flush(&mut self) -> io::Result<bool> {
        if self.buf.is_empty() {
            return Ok(false);
        }
        self.file.write_all(&self.buf)?;
        self.len += self.buf.len() as u64;
        self.buf.clear();
        Ok(true)
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the log has grown enough to be replaced by a snapshot.
    pub fn wants_compaction(&self) -> bool {
        self.len >= LOG_BYTES_COMPACT
    }

    /// Replaces snapshot and log: `snap` (the state now, every queued
    /// event included) becomes the next generation with an empty log.
    /// Returns the old log's file so the caller can stop syncing it.
    pub fn compact(&mut self, snap: &mut Snapshot) -> Result<File, MetaError> {
        self.flush().map_err(io_err(&self.dir))?;
        snap.gen = self.gen + 1;
        let body = serde_json::to_vec(snap)
            .map_err(|e| MetaError::Corrupt(self.dir.clone(), e.to_string()))?;
        let next = open_log(&self.dir, snap.gen, true)?;
        write_snap(&self.dir, &body)?;
        let old = std::mem::replace(self, next);
        let _ = fs::remove_file(log_path(&self.dir, old.gen));
        Ok(old.file)
    }
}

fn open_log(dir: &Path, gen: u64, fresh: bool) -> Result<MetaLog, MetaError> {
    let path = log_path(dir, gen);
    let mut opts = OpenOptions::new();
    opts.create(true).read(true).write(true);
    if fresh {
        opts.truncate(true);
    }
    let file = opts.open(&path).map_err(io_err(&path))?;
    let len = file.metadata().map_err(io_err(&path))?.len();
    let mut log = MetaLog {
        dir: dir.to_path_buf(),
        gen,
        file,
        buf: Vec::new(),
        len,
    };
    use std::io::Seek;
    log.file.seek(io::SeekFrom::End(0)).map_err(io_err(&path))?;
    Ok(log)
}

fn remove_stale_logs(dir: &Path, gen: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = name
            .strip_prefix("meta.")
            .and_then(|r| r.strip_suffix(".log"))
            .and_then(|g| g.parse::<u64>().ok())
            .is_some_and(|g| g != gen);
        if stale {
            let _ = fs::remove_file(e.path());
        }
    }
}

fn decode_event(body: &[u8]) -> Option<(String, Event)> {
    let (&kind, rest) = body.split_first()?;
    let (&n, rest) = rest.split_first()?;
    let name = rest.get(..n as usize)?;
    let seq = rest.get(n as usize..n as usize + 8)?;
    let seq = u64::from_le_bytes(seq.try_into().ok()?);
    let name = std::str::from_utf8(name).ok()?.to_string();
    let e = match kind {
        1 => Event::Delivered(seq),
        2 => Event::Done(seq),
        3 => Event::DoneUpTo(seq),
        _ => return None,
    };
    Some((name, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::read_config;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gombus-meta-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn snap() -> Snapshot {
        let serde_json::Value::Object(m) = serde_json::json!({"name":"S","subjects":["a"]}) else {
            panic!()
        };
        Snapshot {
            gen: 0,
            config: read_config(m).unwrap(),
            last_seq: 0,
            consumers: Vec::new(),
        }
    }

    #[test]
    fn events_survive_reopen_and_torn_tails_are_cut() {
        let dir = temp_dir("reopen");
        let mut s = snap();
        let mut log = MetaLog::create(&dir, &mut s).unwrap();
        log.push("c", Event::Delivered(1));
        log.push("c", Event::Done(1));
        log.flush().unwrap();
        log.push("c", Event::Delivered(2));
        log.flush().unwrap();
        drop(log);
        // A torn tail: half of a record.
        let lp = log_path(&dir, 1);
        let mut bytes = fs::read(&lp).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(&[9, 0, 0]);
        fs::write(&lp, &bytes).unwrap();
        let (back, events, log) = MetaLog::open(&dir).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            events,
            vec![
                ("c".to_string(), Event::Delivered(1)),
                ("c".to_string(), Event::Done(1)),
                ("c".to_string(), Event::Delivered(2))
            ]
        );
        assert_eq!(fs::metadata(&lp).unwrap().len(), whole as u64);
        drop(log);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn compaction_starts_a_new_generation() {
        let dir = temp_dir("compact");
        let mut s = snap();
        let mut log = MetaLog::create(&dir, &mut s).unwrap();
        log.push("c", Event::Delivered(1));
        s.last_seq = 7;
        log.compact(&mut s).unwrap();
        assert_eq!(s.gen, 2);
        log.push("c", Event::Done(1));
        log.flush().unwrap();
        let (back, events, _log) = MetaLog::open(&dir).unwrap();
        assert_eq!(back.last_seq, 7);
        assert_eq!(events, vec![("c".to_string(), Event::Done(1))]);
        assert!(!log_path(&dir, 1).exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_corrupt_snapshot_is_an_error_naming_the_file() {
        let dir = temp_dir("corrupt");
        let mut s = snap();
        MetaLog::create(&dir, &mut s).unwrap();
        let p = dir.join(SNAP);
        let mut b = fs::read(&p).unwrap();
        let last = b.len() - 1;
        b[last] ^= 0xff;
        fs::write(&p, b).unwrap();
        let e = MetaLog::open(&dir).unwrap_err().to_string();
        assert!(e.contains("meta.snap") && e.contains("crc"), "{e}");
        fs::remove_dir_all(dir).unwrap();
    }
}
