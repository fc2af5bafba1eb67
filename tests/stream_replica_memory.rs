//! What a replicated stream keeps in memory (docs/PROTOCOL.md
//! "Replicated streams"; docs/DESIGN.md): a replica holds an index of its
//! messages, and their payloads are in segment files.
//!
//! - In process, with an allocator that counts the bytes in use: a
//!   replica on disk given 200 MB of 64 KB messages holds a few MB.
//! - Three real `broker` processes with an R3 stream: every node's
//!   payload files hold what was published, and every message reads back
//!   whole. Each broker's resident memory is printed for the record (the
//!   Raft log's own copy of the recent entries is in it; see
//!   docs/DESIGN.md).

mod cluster_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{agreed_stream_group_leader, call_until, Cluster};
use gombus::protocol::stream_messages::{read_config, StreamConfig};
use gombus::stream::payloads::Payloads;
use gombus::stream::replica::{Op, Outcome, Publish, Replica};
use serde_json::json;

/// The system allocator, counting the bytes in use.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        IN_USE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        IN_USE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        IN_USE.fetch_add(new, Ordering::Relaxed);
        IN_USE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MSG_BYTES: usize = 64 << 10;

/// Message `k`'s bytes: a pattern no other message has.
fn payload(k: u64, len: usize) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn temp_dir(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gombus-{what}-{}", std::process::id()))
}

#[test]
fn a_replica_on_disk_keeps_only_an_index_in_memory() {
    let serde_json::Value::Object(m) = json!({"name": "BIG", "subjects": ["big.>"]}) else {
        unreachable!()
    };
    let mut cfg: StreamConfig = read_config(m).unwrap();
    cfg.validate().unwrap();
    let dir = temp_dir("replica-memory");
    let mut rep = Replica::with_payloads(cfg, Payloads::open(&dir, 64 << 20).unwrap());
    let now = Instant::now();
    let before = IN_USE.load(Ordering::Relaxed);
    let n = (200 << 20) / MSG_BYTES as u64;
    for k in 1..=n {
        let op = Op::Publish(Publish {
            subject: format!("big.{}", k % 8),
            headers: None,
            data: payload(k, MSG_BYTES),
            binary: true,
            time_ms: k,
        });
        let out = rep.apply(std::slice::from_ref(&op), now);
        assert!(
            matches!(&out[..], [Outcome::Published(Ok(_))]),
            "{k}: {out:?}"
        );
    }
    let held = IN_USE.load(Ordering::Relaxed).saturating_sub(before);
    let total = n * MSG_BYTES as u64;
    assert_eq!(rep.messages(), n);
    // The index: a few hundred bytes a message, not 64 KB.
    assert!(
        held < 4 << 20,
        "{held} bytes in use for {n} messages of {total} bytes"
    );
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk >= total, "{on_disk} bytes on disk");
    for k in 1..=n {
        let m = rep.get(k).unwrap().expect("stored");
        assert_eq!(&*m.subject, format!("big.{}", k % 8));
        assert!(*m.data == *payload(k, MSG_BYTES), "message {k} reads back");
    }
    drop(rep);
    assert!(!dir.exists());
}

/// The bytes of the payload files under `dir`.
fn seg_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                seg_bytes(&p)
            } else if p.extension().is_some_and(|x| x == "seg") {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

fn vm_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A JSON string of about `MSG_BYTES` for message `k` (hex of its pattern).
fn text(k: u64) -> String {
    payload(k, MSG_BYTES / 2)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn an_r3_stream_keeps_its_payloads_in_files_on_every_node() {
    let wait = Duration::from_secs(20);
    let c = Cluster::start();
    call_until(
        &c.client(0),
        "stream.create",
        json!({"name": "BIG", "subjects": ["big.>"], "replicas": 3}),
        wait,
    );
    agreed_stream_group_leader(&c, &[0, 1, 2], "BIG", wait, |_| true);
    let rss0: Vec<u64> = (0..3).map(|i| vm_rss_kb(c.pid(i))).collect();
    let n = 640u64;
    let total = n * MSG_BYTES as u64;
    let publisher = c.client(1);
    let began = Instant::now();
    for k in 1..=n {
        let deadline = Instant::now() + wait;
        loop {
            match publisher.publish_stream("big.x", json!({"k": k, "t": text(k)})) {
                Ok(ack) => {
                    assert_eq!(ack.seq, k);
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "publish {k}: {e}"),
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    let took = began.elapsed();
    // Every node's replica has written the payloads to its files.
    for i in 0..3 {
        let dir = c.data_dir(i).join("replicas");
        let deadline = Instant::now() + wait;
        while seg_bytes(&dir) < total {
            assert!(
                Instant::now() < deadline,
                "node {i}: {} bytes of payload files for {total} published",
                seg_bytes(&dir)
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
    let rss: Vec<u64> = (0..3).map(|i| vm_rss_kb(c.pid(i))).collect();
    eprintln!(
        "published {n} messages, {} MB, in {took:?}; VmRSS kB before {rss0:?}, after {rss:?}",
        total >> 20
    );
    // Every message reads back whole.
    let reader = c.client(2);
    call_until(
        &reader,
        "consumer.create",
        json!({"stream": "BIG", "name": "check"}),
        wait,
    );
    let mut next = 1;
    while next <= n {
        let got = call_until(
            &reader,
            "consumer.fetch",
            json!({"stream": "BIG", "consumer": "check", "batch": 16, "expires_ms": 2000}),
            wait,
        );
        for m in got["messages"].as_array().cloned().unwrap_or_default() {
            let seq = m["seq"].as_u64().expect("a seq");
            assert_eq!(seq, next);
            assert_eq!(m["data"]["k"].as_u64(), Some(seq));
            assert!(
                m["data"]["t"].as_str() == Some(text(seq).as_str()),
                "message {seq} reads back"
            );
            next += 1;
        }
    }
}
