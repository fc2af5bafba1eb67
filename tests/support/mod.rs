//! What many test binaries need, in one place: the broker binary under
//! test, a process started with its stderr drained into a log, free
//! loopback ports, a temporary directory removed on drop, and a plain
//! HTTP/1.1 GET. A test file takes it with `mod support;`; the
//! shared process harnesses (`common`, `cluster_support`) include it too
//! and re-export what their users call.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The broker under test: `GOMBUS_BIN` (`make test` sets it to the static
/// release build), else the one cargo built for this test run.
pub fn broker_bin() -> String {
    std::env::var("GOMBUS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_broker").to_string())
}

/// The last lines a process wrote to stderr, shared with the thread that
/// drains it.
pub type Log = Arc<Mutex<VecDeque<String>>>;

/// Starts `cmd` (`what` names it in a failure) with stdin and stdout
/// closed and stderr drained for the process's whole life, so it never
/// blocks on a full pipe: the draining thread keeps the last `keep` lines
/// in `log` and forwards every line to the receiver, for as long as the
/// receiver is kept. Fails the test if the process cannot start.
pub fn spawn_logged(
    cmd: &mut Command,
    what: &str,
    log: &Log,
    keep: usize,
) -> (
    Child,
    mpsc::Receiver<String>,
    Option<thread::JoinHandle<()>>,
) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let (tx, rx) = mpsc::channel();
    let reader = child.stderr.take().map(|stderr| {
        let log = Arc::clone(log);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line.clone());
                if keep > 0 {
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    if log.len() >= keep {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            }
        })
    });
    (child, rx, reader)
}

/// Where test ports come from: below Linux's default ephemeral range
/// (32768-60999). The kernel takes the local port of every outgoing
/// connection from that range, so a port bound there and let go could
/// be taken by another test's client before the broker binds it (a
/// cluster test once failed with "Address already in use" that way).
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// How many ports this process has tried, so that each try is a new one.
static PORTS_TRIED: AtomicU64 = AtomicU64::new(0);

/// A listener on a free loopback port of [`TEST_PORTS`]. Each test
/// process starts at its own place in the range (by its pid) and walks
/// on from there.
fn bind_test_port() -> TcpListener {
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    let start = u64::from(std::process::id()).wrapping_mul(7_919);
    for _ in 0..span {
        let k = PORTS_TRIED.fetch_add(1, Ordering::Relaxed);
        let port = TEST_PORTS.start + ((start + k) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l;
        }
    }
    panic!("no free loopback port in {TEST_PORTS:?}")
}

/// A free loopback port: bound, read, let go.
pub fn free_port() -> u16 {
    bind_test_port()
        .local_addr()
        .map(|a| a.port())
        .expect("local addr")
}

/// `n` distinct free loopback ports, all held until every one is known.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n).map(|_| bind_test_port()).collect();
    held.iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A fresh, empty directory under the system's temp dir, named
/// `gombus-<tag>-<pid>-<n>-<nanos>`, removed with everything in it on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gombus-{tag}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the directory: the caller now owns its removal.
    pub fn keep(self) -> PathBuf {
        let dir = self.0.clone();
        std::mem::forget(self);
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The whole answer (status line, headers, body) to a GET of `path` on
/// `addr`, sent with `Connection: close` and read to its end (at most 5 s
/// between reads).
pub fn http_exchange(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// A GET of `path` on `addr`: (status code, body); 0 when no status line
/// came.
pub fn try_http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let text = http_exchange(addr, path)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// [`try_http_get`] that fails the test when `addr` cannot be reached.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path).unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"))
}
