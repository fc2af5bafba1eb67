//! Stream groups' snapshots kept in files, so that no node holds a
//! stream's snapshot in memory: the file format's names, the small
//! reference the Raft core carries in place of the bytes ([`FileRef`]),
//! writing a snapshot file ([`Writer`]), taking one in from a peer piece
//! by piece ([`Receiving`]) and dropping the ones no longer needed
//! ([`clean`]).
//!
//! Files under a stream group's Raft directory (`raft/g<group>`):
//! - `snapshot.<index>.data`: the state machine's snapshot at `index`
//!   (the bytes of `Replica::snapshot_to`). The `snapshot` record of the
//!   log store holds a [`FileRef`] to it. Written whole (by the broker,
//!   or from a peer's pieces) and fsynced before the record names it.
//! - `snapshot.<index>.tmp`: one being written by the broker.
//! - `snapshot.recv`: one coming from a peer.
//!
//! A snapshot at an index is the state after the same committed entries
//! on every member, so one file per index is enough whoever wrote it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::raft_msg::NodeId;

const MAGIC: &[u8; 4] = b"GSF1";

/// What the core keeps as a file-backed snapshot's data: the file's
/// length and CRC32. The index, hence the file's name, is the snapshot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRef {
    pub size: u64,
    pub crc: u32,
}

impl FileRef {
    /// The 16 bytes a snapshot's data holds for this file.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// The reference in a snapshot's data, if it is one (a snapshot of
    /// the state machine's own bytes starts with its version byte, 1, so
    /// the two cannot be confused).
    pub fn decode(data: &[u8]) -> Option<FileRef> {
        if data.len() != 16 || &data[..4] != MAGIC {
            return None;
        }
        let size = u64::from_le_bytes(data[4..12].try_into().ok()?);
        let crc = u32::from_le_bytes(data[12..16].try_into().ok()?);
        Some(FileRef { size, crc })
    }
}

/// Where the snapshot at `index` is kept in `dir`.
pub fn path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snapshot.{index}.data"))
}

fn tmp_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snapshot.{index}.tmp"))
}

fn recv_path(dir: &Path) -> PathBuf {
    dir.join("snapshot.recv")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Opens the snapshot file `r` names, checking its length.
pub fn open(dir: &Path, index: u64, r: &FileRef) -> io::Result<File> {
    let p = path(dir, index);
    let f = File::open(&p)?;
    let len = f.metadata()?.len();
    if len != r.size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {len} bytes, {} expected", p.display(), r.size),
        ));
    }
    Ok(f)
}

/// Deletes the snapshot files of `dir` other than those at `keep`; with
/// `all` (at start, when nothing is being written), the half-written
/// ones too.
pub fn clean(dir: &Path, keep: &[u64], all: bool) {
    let Ok(list) = fs::read_dir(dir) else {
        return;
    };
    let kept: Vec<String> = keep.iter().map(|i| format!("snapshot.{i}.data")).collect();
    for d in list.flatten() {
        let name = d.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with("snapshot.")
            && (name.ends_with(".data")
                || (all && (name.ends_with(".tmp") || name == "snapshot.recv")));
        if ours && !kept.iter().any(|k| *k == name) {
            if let Err(e) = fs::remove_file(d.path()) {
                crate::log_warn!("removing {}: {e}", d.path().display());
            }
        }
    }
}

/// Writes the snapshot at `index` into `dir`: bytes go to a temporary
/// file, and [`Writer::finish`] makes it durable under its name.
pub struct Writer {
    dir: PathBuf,
    index: u64,
    out: BufWriter<File>,
    hasher: crc32fast::Hasher,
    size: u64,
}

impl Writer {
    /// In `dir`, which must exist (the group's directory: a group
    /// dropped meanwhile is not made again).
    pub fn create(dir: &Path, index: u64) -> io::Result<Writer> {
        let f = File::create(tmp_path(dir, index))?;
        Ok(Writer {
            dir: dir.to_path_buf(),
            index,
            out: BufWriter::with_capacity(1 << 20, f),
            hasher: crc32fast::Hasher::new(),
            size: 0,
        })
    }

    /// Flushes, fsyncs and renames the file into place; the reference to
    /// hand to the core.
    pub fn finish(self) -> io::Result<FileRef> {
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(tmp_path(&self.dir, self.index), path(&self.dir, self.index))?;
        sync_dir(&self.dir)?;
        Ok(FileRef {
            size: self.size,
            crc: self.hasher.finalize(),
        })
    }
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A reader that checks, once all `size` bytes are read, that they have
/// the CRC the reference says.
pub struct Checked<R> {
    inner: R,
    hasher: crc32fast::Hasher,
    left: u64,
    crc: u32,
}

impl<R: Read> Checked<R> {
    pub fn new(inner: R, r: &FileRef) -> Checked<R> {
        Checked {
            inner,
            hasher: crc32fast::Hasher::new(),
            left: r.size,
            crc: r.crc,
        }
    }
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.hasher.update(&buf[..n]);
        self.left -= n as u64;
        if self.left == 0 && n > 0 && self.hasher.clone().finalize() != self.crc {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "snapshot file fails its CRC",
            ));
        }
        Ok(n)
    }
}

/// Fsync the piece being received at least every this many bytes, so
/// the last fsync, on the Raft thread, is short.
const SYNC_EVERY: u64 = 8 << 20;

/// A snapshot file coming from a peer, piece by piece, in order.
pub struct Receiving {
    from: NodeId,
    index: u64,
    snap_term: u64,
    total: u64,
    written: u64,
    synced: u64,
    hasher: crc32fast::Hasher,
    file: File,
}

impl Receiving {
    /// Takes one piece into `slot` (in `dir`): a piece at offset 0
    /// starts over; one that does not follow the last is ignored (a
    /// transfer cut short is started again by the sender).
    #[allow(clippy::too_many_arguments)]
    pub fn piece(
        slot: &mut Option<Receiving>,
        dir: &Path,
        from: NodeId,
        index: u64,
        snap_term: u64,
        offset: u64,
        total: u64,
        data: &[u8],
    ) -> io::Result<()> {
        if offset == 0 {
            *slot = None;
            fs::create_dir_all(dir)?;
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(recv_path(dir))?;
            *slot = Some(Receiving {
                from,
                index,
                snap_term,
                total,
                written: 0,
                synced: 0,
                hasher: crc32fast::Hasher::new(),
                file,
            });
        }
        let Some(r) = slot.as_mut() else {
            return Ok(());
        };
        let follows = (r.from, r.index, r.snap_term, r.total, r.written)
            == (from, index, snap_term, total, offset);
        if !follows || offset + data.len() as u64 > total {
            return Ok(());
        }
        if let Err(e) = r.file.write_all(data) {
            *slot = None;
            return Err(e);
        }
        r.hasher.update(data);
        r.written += data.len() as u64;
        if r.written - r.synced >= SYNC_EVERY {
            r.file.sync_data()?;
            r.synced = r.written;
        }
        Ok(())
    }

    /// The message naming the file has come: whether the snapshot at
    /// `index` is now in place in `dir` (received whole and matching `r`,
    /// or there already).
    pub fn finish(
        slot: &mut Option<Receiving>,
        dir: &Path,
        from: NodeId,
        index: u64,
        snap_term: u64,
        r: &FileRef,
    ) -> io::Result<bool> {
        if open(dir, index, r).is_ok() {
            *slot = None;
            return Ok(true);
        }
        let Some(got) = slot.take() else {
            return Ok(false);
        };
        let whole = (got.from, got.index, got.snap_term, got.total, got.written)
            == (from, index, snap_term, r.size, r.size)
            && got.hasher.clone().finalize() == r.crc;
        if !whole {
            return Ok(false);
        }
        got.file.sync_all()?;
        fs::rename(recv_path(dir), path(dir, index))?;
        sync_dir(dir)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gombus-snapfile-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A snapshot stored here while a leader's snapshot is held back
    /// keeps both files; the others go, half-written ones only at start.
    #[test]
    fn cleaning_keeps_every_snapshot_named() {
        let d = tmp_dir("clean");
        fs::create_dir_all(&d).unwrap();
        let names = [
            "snapshot.5.data",
            "snapshot.7.data",
            "snapshot.9.data",
            "snapshot.3.tmp",
        ];
        for n in names {
            fs::write(d.join(n), b"x").unwrap();
        }
        let left = || {
            let mut v: Vec<String> = fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        clean(&d, &[9, 5], false);
        assert_eq!(
            left(),
            ["snapshot.3.tmp", "snapshot.5.data", "snapshot.9.data"]
        );
        clean(&d, &[9], true);
        assert_eq!(left(), ["snapshot.9.data"]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_reference_is_told_from_a_snapshots_own_bytes() {
        let r = FileRef {
            size: 1 << 40,
            crc: 0xdead_beef,
        };
        assert_eq!(FileRef::decode(&r.encode()), Some(r));
        assert_eq!(FileRef::decode(b"\x01GSF1............"), None);
        assert_eq!(FileRef::decode(&r.encode()[..15]), None);
    }

    #[test]
    fn written_pieces_and_received_pieces_give_the_same_file() {
        let a = tmp_dir("a");
        let b = tmp_dir("b");
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert!(Writer::create(&a, 9).is_err(), "no directory, no file");
        fs::create_dir_all(&a).unwrap();
        let mut w = Writer::create(&a, 9).unwrap();
        w.write_all(&bytes).unwrap();
        let r = w.finish().unwrap();
        assert_eq!(r.size, bytes.len() as u64);
        assert_eq!(fs::read(path(&a, 9)).unwrap(), bytes);

        // Received in pieces, one of them out of order and ignored.
        let mut slot = None;
        let mut off = 0;
        for piece in bytes.chunks(30_000) {
            Receiving::piece(&mut slot, &b, 1, 9, 2, off, r.size, piece).unwrap();
            Receiving::piece(&mut slot, &b, 1, 9, 2, off + 5, r.size, piece).unwrap();
            off += piece.len() as u64;
        }
        assert!(Receiving::finish(&mut slot, &b, 1, 9, 2, &r).unwrap());
        assert_eq!(fs::read(path(&b, 9)).unwrap(), bytes);

        // Read back through the check; a wrong CRC is caught at the end.
        let mut got = Vec::new();
        Checked::new(open(&b, 9, &r).unwrap(), &r)
            .read_to_end(&mut got)
            .unwrap();
        assert_eq!(got, bytes);
        let bad = FileRef {
            crc: r.crc ^ 1,
            ..r
        };
        let mut sink = Vec::new();
        assert!(Checked::new(open(&b, 9, &bad).unwrap(), &bad)
            .read_to_end(&mut sink)
            .is_err());

        // Cleaning keeps only the one asked for.
        fs::write(path(&b, 3), b"old").unwrap();
        fs::write(tmp_path(&b, 12), b"half").unwrap();
        clean(&b, &[9], true);
        let left: Vec<String> = fs::read_dir(&b)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["snapshot.9.data"]);
        let _ = fs::remove_dir_all(&a);
        let _ = fs::remove_dir_all(&b);
    }

    #[test]
    fn a_transfer_cut_short_or_from_another_sender_is_not_taken() {
        let d = tmp_dir("c");
        let r = FileRef { size: 10, crc: 0 };
        let mut slot = None;
        Receiving::piece(&mut slot, &d, 1, 4, 2, 0, 10, b"01234").unwrap();
        assert!(!Receiving::finish(&mut slot, &d, 1, 4, 2, &r).unwrap());
        let whole = b"0123456789";
        let r = FileRef {
            size: 10,
            crc: crc32fast::hash(whole),
        };
        Receiving::piece(&mut slot, &d, 1, 4, 2, 0, 10, &whole[..5]).unwrap();
        Receiving::piece(&mut slot, &d, 1, 4, 2, 5, 10, &whole[5..]).unwrap();
        assert!(!Receiving::finish(&mut slot, &d, 3, 4, 2, &r).unwrap());
        assert!(!path(&d, 4).exists());
        let _ = fs::remove_dir_all(&d);
    }
}
