//! The names of a Raft log's files, shared by the log that writes them
//! (`cluster/raft_log.rs`) and by a stream replica that reads its
//! messages where the log wrote them (`stream/payloads.rs`).
//!
//! Log file `n` is `log` for 0 and `log.<n>` after it. A stream group's
//! log keeps a file that a snapshot covers whole as data file `n`,
//! `data.<n>` (a rename), until the stream lets it go. So the bytes of
//! file `n` are under one of its two names at any moment, and a handle
//! opened under either reads them.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The name of log file number `n`.
pub fn log_name(n: u64) -> String {
    if n == 0 {
        "log".to_string()
    } else {
        format!("log.{n}")
    }
}

/// The name of data file number `n`.
pub fn data_name(n: u64) -> String {
    format!("data.{n}")
}

/// The numbers of the data files in `dir`, rising.
pub fn data_files(dir: &Path) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix("data.")) else {
            continue;
        };
        match n.parse::<u64>() {
            Ok(k) if k.to_string() == n => out.push(k),
            _ => {}
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The path data file `n` of the log in `dir` has once it is one.
pub fn data_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(data_name(n))
}

/// File `n` of the log in `dir`, opened for reading under whichever of
/// its names it has (a rename may come between two tries).
pub fn open(dir: &Path, n: u64) -> io::Result<File> {
    let names = [log_name(n), data_name(n), log_name(n)];
    let mut last = None;
    for name in names {
        match File::open(dir.join(name)) {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_under_either_name_and_data_files_are_listed_in_order() {
        let dir = std::env::temp_dir().join(format!("gombus-log-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(log_name(0)), b"zero").unwrap();
        fs::write(dir.join(log_name(3)), b"three").unwrap();
        fs::rename(dir.join(log_name(3)), data_path(&dir, 3)).unwrap();
        fs::write(data_path(&dir, 12), b"twelve").unwrap();
        for bad in ["data.", "data.x", "data.07", "data.1.gone"] {
            fs::write(dir.join(bad), b"").unwrap();
        }
        assert_eq!(data_files(&dir).unwrap(), [3, 12]);
        assert_eq!(io::read_to_string(open(&dir, 0).unwrap()).unwrap(), "zero");
        assert_eq!(io::read_to_string(open(&dir, 3).unwrap()).unwrap(), "three");
        assert_eq!(open(&dir, 4).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }
}
