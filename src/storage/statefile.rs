//! Small state files replaced atomically (stream and consumer configs,
//! Raft hard state): the body is framed with [`super::record`], written to
//! `<name>.tmp`, fsynced, renamed over `<name>`, and the directory fsynced.
//! A reader sees the old file or the new one, whole; a crc mismatch can
//! only be corruption and is an error naming the file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::record;

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with a file holding `body`; durable when it returns.
pub fn write(path: &Path, body: &[u8]) -> io::Result<()> {
    let mut framed = Vec::with_capacity(body.len() + record::HEAD_BYTES);
    record::encode(&mut framed, body);
    replace(path, &framed)
}

/// Replaces `path` with a file holding exactly `bytes` (already framed by
/// the caller, e.g. a log rewritten as many records): temp file, fsync,
/// rename, fsync of the directory; durable when it returns.
pub fn replace(path: &Path, framed: &[u8]) -> io::Result<()> {
    let tmp = temp_path(path);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(framed)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    sync_dir(path)
}

/// The body of `path`; `None` when there is no such file.
pub fn read(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    match record::read(&bytes, 0) {
        Ok(Some((body, end))) if end == bytes.len() => Ok(Some(body.to_vec())),
        Ok(Some(_)) => Err(bad("trailing bytes after the record".into())),
        Ok(None) => Err(bad("empty file".into())),
        Err(b) => Err(bad(b.to_string())),
    }
}

/// Removes `path` (and a leftover temp file); durable when it returns.
pub fn remove(path: &Path) -> io::Result<()> {
    let _ = fs::remove_file(temp_path(path));
    match fs::remove_file(path) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Fsyncs the directory holding `path` (a rename or unlink is durable only
/// then).
pub fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_replace_remove() {
        let dir = std::env::temp_dir().join(format!(
            "gombus-statefile-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stream.json");
        assert_eq!(read(&path).unwrap(), None);
        write(&path, b"{\"v\":1}").unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), b"{\"v\":1}");
        write(&path, b"{\"v\":2,\"longer\":true}").unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), b"{\"v\":2,\"longer\":true}");
        assert!(!temp_path(&path).exists());

        // A flipped byte or a cut file is an error naming the file.
        let mut bytes = fs::read(&path).unwrap();
        bytes[10] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = read(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("stream.json"), "{err}");
        fs::write(&path, &bytes[..5]).unwrap();
        assert!(read(&path).is_err());

        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
        remove(&path).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
