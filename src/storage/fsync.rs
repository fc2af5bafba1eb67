//! fsync of files and directories whose durability a simulation models,
//! and what such a simulation hears of it.
//!
//! The code that must sync before it stores a state (a replica's payload
//! files before a snapshot that names them) calls [`sync_file`] and
//! [`sync_dir`]. They fsync, and, when a test has installed an observer on
//! the calling thread ([`observe`]), tell it what became durable: a file's
//! length, or a directory's entries. The stream simulation keeps that as
//! each node's disk image and cuts every file back to it when the node
//! crashes, so a sync left out shows up as a lost message. No observer is
//! installed in the broker; the cost there is one thread-local check.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::path::Path;

/// What became durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// A file's first `len` bytes.
    File { len: u64 },
    /// A directory's entries as they are now.
    Dir,
}

/// Hears every sync made on its thread.
pub type Observer = Box<dyn FnMut(&Path, Synced)>;

thread_local! {
    static OBSERVER: RefCell<Option<Observer>> = const { RefCell::new(None) };
}

/// Installs `o` for this thread (`None` removes it); returns the one it
/// replaces.
pub fn observe(o: Option<Observer>) -> Option<Observer> {
    OBSERVER.with(|cell| std::mem::replace(&mut *cell.borrow_mut(), o))
}

fn tell(path: &Path, what: Synced) {
    OBSERVER.with(|cell| {
        if let Some(o) = cell.borrow_mut().as_mut() {
            o(path, what);
        }
    });
}

/// Fsyncs `file`, which is at `path`.
pub fn sync_file(file: &File, path: &Path) -> io::Result<()> {
    file.sync_all()?;
    if OBSERVER.with(|cell| cell.borrow().is_some()) {
        let len = file.metadata()?.len();
        tell(path, Synced::File { len });
    }
    Ok(())
}

/// Fsyncs directory `dir` (its entries: files made, renamed or deleted).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    tell(dir, Synced::Dir);
    Ok(())
}

/// Starts writing `len` bytes of `file` from `offset` back to the disk,
/// without waiting for them and without a journal commit
/// (`sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`). Durable they are
/// only after [`sync_file`]; this spreads that sync's writes over the
/// time the bytes were written, so that it does not hold the disk (and
/// the other files' fsyncs queued behind it) for the whole batch at
/// once. A hint: failures are ignored.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    const SYNC_FILE_RANGE_WRITE: u32 = 2;
    extern "C" {
        /// `int sync_file_range(int fd, off64_t offset, off64_t nbytes,
        /// unsigned int flags)`.
        fn sync_file_range(fd: i32, offset: i64, nbytes: i64, flags: u32) -> i32;
    }
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is `file`'s, open for the whole call; the
    // call only queues writeback of the file's pages and reads no memory
    // of ours.
    unsafe {
        sync_file_range(file.as_raw_fd(), offset, len, SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[test]
    fn an_observer_hears_what_its_thread_synced() {
        let dir = std::env::temp_dir().join(format!("gombus-fsync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"hello").unwrap();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        observe(Some(Box::new(move |p: &Path, s| {
            h.lock().unwrap().push((p.to_path_buf(), s))
        })));
        sync_file(&f, &path).unwrap();
        sync_dir(&dir).unwrap();
        // Another thread's syncs are not this observer's.
        let (p2, d2) = (path.clone(), dir.clone());
        std::thread::spawn(move || {
            sync_file(&File::open(&p2).unwrap(), &p2).unwrap();
            sync_dir(&d2).unwrap();
        })
        .join()
        .unwrap();
        assert!(observe(None).is_some());
        sync_dir(&dir).unwrap();
        assert_eq!(
            *heard.lock().unwrap(),
            [
                (path.clone(), Synced::File { len: 5 }),
                (dir.clone(), Synced::Dir)
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
