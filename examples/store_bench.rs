//! Measures the segment store on this disk: append throughput with one
//! write(2) per append and with one per batch, raw fsync latency, and the
//! acked rate one publisher with a window of outstanding acks reaches under
//! group commit (`-sync=always`).
//!
//! `cargo run --release --example store_bench [parts] [dir]`: parts is a
//! comma list of `fsync,group,append,read` (default: all); dir defaults to
//! a fresh directory under the system temp dir, removed at the end.

use std::collections::VecDeque;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gombus::storage::sync::{SyncPolicy, Syncer, Ticket};
use gombus::stream::store::{Options, Store};

/// A new directory for one part; the previous part's files are deleted and
/// the deletion committed first, so its journal work is not timed here.
fn fresh(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    let _ = fs::remove_dir_all(&d);
    if let Ok(dir) = fs::File::open(base) {
        let _ = dir.sync_all();
    }
    d
}

fn appends(base: &Path, size: usize, batch: usize, total: usize) {
    let dir = fresh(base, &format!("append-{size}-{batch}"));
    let (mut s, _) = Store::open(&dir, Options::default()).expect("open");
    let data = vec![b'x'; size];
    let t0 = Instant::now();
    for i in 0..total {
        s.append("bench.orders", None, &data, false, i as u64)
            .expect("append");
        if (i + 1) % batch == 0 {
            s.flush().expect("flush");
        }
    }
    s.flush().expect("flush");
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "append {size:>5} B, write(2) every {batch:>3} appends: {:>9.0} msgs/s {:>7.1} MB/s",
        total as f64 / dt,
        (total * size) as f64 / dt / 1e6
    );
    drop(s);
    let _ = fs::remove_dir_all(&dir);
}

fn fsync_latency(base: &Path, n: usize) {
    fs::create_dir_all(base).expect("dir");
    let path = base.join("fsync-probe");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        f.write_all(&[7u8; 160]).expect("write");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        lat.push(t.elapsed());
    }
    lat.sort();
    let avg = lat.iter().sum::<Duration>() / n as u32;
    println!(
        "fdatasync after a 160 B append: avg {:?} p50 {:?} p99 {:?} max {:?}",
        avg,
        lat[n / 2],
        lat[n * 99 / 100],
        lat[n - 1]
    );
    let _ = fs::remove_file(&path);
}

/// One publisher, `window` acks outstanding: every loop turn appends what
/// the window allows, flushes, and releases the acks whose fsync is done.
fn group_commit(base: &Path, size: usize, window: usize, total: usize) {
    let dir = fresh(base, &format!("group-{size}-{window}"));
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).expect("syncer"));
    let opts = Options {
        syncer: Some(Arc::clone(&syncer)),
        ..Options::default()
    };
    let (mut s, _) = Store::open(&dir, opts).expect("open");
    let data = vec![b'x'; size];
    let mut held: VecDeque<(Ticket, usize)> = VecDeque::new();
    let (mut sent, mut acked, mut in_flight) = (0usize, 0usize, 0usize);
    let t0 = Instant::now();
    while acked < total {
        let room = (window - in_flight).min(total - sent);
        if room > 0 {
            for _ in 0..room {
                s.append("bench.orders", None, &data, false, sent as u64)
                    .expect("append");
            }
            let t = s.flush().expect("flush");
            held.push_back((t, room));
            sent += room;
            in_flight += room;
        }
        // The event loop would sleep in poll until the waker fires.
        if let Some(&(t, _)) = held.front() {
            syncer.wait(t).expect("fsync");
        }
        while let Some(&(t, n)) = held.front() {
            if !syncer.covered(t) {
                break;
            }
            held.pop_front();
            acked += n;
            in_flight -= n;
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    let (rounds, files) = syncer.counts();
    println!(
        "group commit {size:>5} B, window {window}: {:>9.0} acked msgs/s, {:.0} fsync rounds/s, {:.0} msgs per round ({files} file fsyncs)",
        total as f64 / dt,
        rounds as f64 / dt,
        total as f64 / rounds.max(1) as f64
    );
    drop(s);
    drop(syncer);
    let _ = fs::remove_dir_all(&dir);
}

/// Resident memory of this process, in bytes (Linux).
fn rss_bytes() -> u64 {
    let statm = fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn reads(base: &Path, total: usize) {
    let dir = fresh(base, "reads");
    let rss0 = rss_bytes();
    let (mut s, _) = Store::open(&dir, Options::default()).expect("open");
    let data = vec![b'x'; 128];
    for i in 0..total {
        let subject = format!("bench.orders.{}", i % 1000);
        s.append(&subject, None, &data, false, i as u64)
            .expect("append");
    }
    s.flush().expect("flush");
    let grown = rss_bytes().saturating_sub(rss0);
    println!(
        "memory: {total} messages on 1000 subjects grew the process by {:.1} MiB ({:.0} B per message, write cache included)",
        grown as f64 / (1 << 20) as f64,
        grown as f64 / total as f64
    );
    let t0 = Instant::now();
    let mut n = 0;
    for seq in 1..=total as u64 {
        n += s.get(seq).expect("get").map_or(0, |m| m.data.len());
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "get 128 B, {total} messages in order (recent ones from memory): {:.0} reads/s ({n} bytes)",
        total as f64 / dt
    );
    drop(s);
    let t0 = Instant::now();
    let (s, report) = Store::open(&dir, Options::default()).expect("reopen");
    println!(
        "reopen with {} messages in {} segment(s): {:?}",
        report.messages,
        report.segments,
        t0.elapsed()
    );
    drop(s);
    let _ = fs::remove_dir_all(&dir);
}

fn main() {
    let parts = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fsync,group,append,read".into());
    let base = std::env::args().nth(2).map_or_else(
        || std::env::temp_dir().join(format!("gombus-store-bench-{}", std::process::id())),
        PathBuf::from,
    );
    fs::create_dir_all(&base).expect("bench dir");
    let run = |part: &str| parts.split(',').any(|p| p == part);
    // Fsync-bound parts first: the append runs leave hundreds of MB of
    // dirty pages whose writeback slows every fsync that follows.
    if run("fsync") {
        fsync_latency(&base, 2000);
    }
    if run("group") {
        for window in [64, 256] {
            group_commit(&base, 128, window, 1_000_000);
        }
        group_commit(&base, 4096, 256, 100_000);
    }
    if run("append") {
        for (size, total) in [(128, 1_000_000), (4096, 100_000)] {
            appends(&base, size, 1, total);
            appends(&base, size, 256, total);
        }
    }
    if run("read") {
        reads(&base, 300_000);
    }
    let _ = fs::remove_dir_all(&base);
}
