//! Durable-file building blocks shared by streams and the Raft log. They
//! know nothing of messages, consumers or Raft entries: a body is bytes
//! whose meaning the owner of the file chooses.
//!
//! - [`record`]: length + crc32 record framing of every append-only file
//!   (stream segments and their index files, the meta event logs, the Raft
//!   log) and of the Raft transport's frames.
//! - [`statefile`]: small state files replaced atomically (a stream's meta
//!   snapshot, Raft's hard state and snapshot).
//! - [`sync`]: the broker's fsync thread for stream files (group commit,
//!   tickets, `-sync` policies).
//! - [`fsync`]: fsync of files and directories whose durability the
//!   stream simulation models, with an observer for it.
//! - [`log_files`]: the names of a Raft log's files and of the data
//!   files a stream group's log keeps for its stream.
//! - [`delete_files`]: files whose contents no stored state needs any
//!   more, deleted; [`delete_later`] on a thread of its own.
pub mod fsync;
pub mod log_files;
pub mod record;
pub mod statefile;
pub mod sync;

/// Deletes `files` (one already gone is fine); every one is tried, and
/// the failures are returned with their paths.
pub fn delete_files(files: &[std::path::PathBuf]) -> Vec<(&std::path::Path, std::io::Error)> {
    let mut failed = Vec::new();
    for path in files {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push((path.as_path(), e)),
        }
    }
    failed
}

/// [`delete_files`] on a thread of its own, each failure handed to
/// `failed` there: freeing the blocks of a file of tens of MiB takes ext4
/// 20-30 ms, which the thread that stores Raft rounds must not wait for.
/// The files' names must not be used again meanwhile (callers rename
/// them, or never reuse names).
pub fn delete_later(files: Vec<std::path::PathBuf>, failed: fn(&std::path::Path, &std::io::Error)) {
    if files.is_empty() {
        return;
    }
    // Without a thread they stay: garbage, no harm (a covered log file
    // goes when its log is opened again).
    let _ = std::thread::Builder::new()
        .name("delete".into())
        .spawn(move || {
            for (path, e) in delete_files(&files) {
                failed(path, &e);
            }
        });
}
