//! What a replicated stream keeps in memory (docs/PROTOCOL.md
//! "Replicated streams"; docs/DESIGN.md): a replica holds an index of its
//! messages, their payloads are in segment files, and the stream's Raft
//! group holds a bounded log and snapshots that are files.
//!
//! - In process, with an allocator that counts the bytes in use: a
//!   replica on disk given 200 MB of 64 KB messages holds a few MB.
//! - Three real `broker` processes with an R3 stream given 1 GiB of
//!   64 KiB messages: no broker's resident memory (VmRSS, sampled while
//!   publishing and after, and its peak VmHWM) reaches 200 MB, every
//!   node's payload files hold what was published, and every acked
//!   message reads back whole.
//! - A replica killed while more than a Raft frame's worth (64 MiB) of
//!   messages is published and the group's leader compacts its log: once
//!   restarted it catches up (current, lag 0 in `stream.info`), its
//!   payload files hold every message, and with the old leader frozen
//!   every acked message reads back whole through it.
//! - A replica whose snapshot file is deleted while it is down comes back
//!   without a log and is caught up by the leader, and every acked
//!   message reads back whole through it.

mod cluster_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{
    agreed_stream_group_leader, call_until, has_group_snapshot, replica_entry, Cluster, IDS,
};
use gombus::client::{Client, Options, OutMessage, Payload};
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

/// The tests of this file run one at a time: the in-process one counts
/// every allocation of the test process, which a cluster test's clients
/// running beside it would add to.
static SERIAL: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_replica_on_disk_keeps_only_an_index_in_memory() {
    let _turn = one_at_a_time();
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
    rep.destroy();
    assert!(!dir.exists());
}

/// The bytes of the payload files under `dir`.
fn seg_bytes(dir: &Path) -> u64 {
    file_bytes(dir, &|name| name.ends_with(".seg"))
}

/// The bytes of the files under `dir` (at any depth) whose names `take`.
fn file_bytes(dir: &Path, take: &dyn Fn(&str) -> bool) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                file_bytes(&p, take)
            } else if p.file_name().and_then(|n| n.to_str()).is_some_and(take) {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

/// The bytes node data directory `data` holds for its stream replicas:
/// their payload files, and the files of their groups' logs (where a
/// replica keeps the messages that came through its log).
fn stored_bytes(data: &Path) -> u64 {
    let log_file = |name: &str| {
        name == "log"
            || name
                .strip_prefix("log.")
                .or_else(|| name.strip_prefix("data."))
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
    };
    seg_bytes(&data.join("replicas"))
        + std::fs::read_dir(data.join("raft"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|g| file_bytes(&g.path(), &log_file))
            .sum::<u64>()
}

/// A `kB` field (`VmRSS`, `VmHWM`) of process `pid`'s /proc status; 0 if
/// it cannot be read.
fn proc_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The bound on a broker's resident memory while an R3 stream grows far
/// past it: the replica's index, the Raft log's 64 MiB budget of entries
/// not yet in a snapshot, and buffers.
const RSS_BOUND_KB: u64 = 200 << 10;

/// Samples the resident memory of some processes every 50 ms on a thread
/// of its own, keeping each one's largest sample.
struct RssWatch {
    stop: Arc<AtomicBool>,
    sampler: thread::JoinHandle<Vec<u64>>,
}

impl RssWatch {
    fn start(pids: Vec<u32>) -> RssWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let sampler = thread::spawn(move || {
            let mut max = vec![0u64; pids.len()];
            loop {
                for (m, &pid) in max.iter_mut().zip(&pids) {
                    *m = (*m).max(proc_kb(pid, "VmRSS"));
                }
                if flag.load(Ordering::Relaxed) {
                    return max;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        RssWatch { stop, sampler }
    }

    /// Stops sampling (after one last sample); each process's largest
    /// VmRSS in kB.
    fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler.join().expect("the RSS sampler")
    }
}

const STREAM: &str = "BIG";
const SUBJECT: &str = "big.x";
/// Bound on a wait for a single step (a publish acked, a leader agreed).
const STEP_WAIT: Duration = Duration::from_secs(20);

/// Message `k`: its number (u64, little-endian), then a pattern no
/// other message has; `MSG_BYTES` in all.
fn message(k: u64) -> Vec<u8> {
    let mut m = k.to_le_bytes().to_vec();
    m.extend(payload(k, MSG_BYTES - 8));
    m
}

/// Creates the R3 stream (limits far above what the tests publish) and
/// waits until every node names the same leader of its group; returns
/// that leader's index.
fn create_r3(c: &Cluster) -> usize {
    call_until(
        &c.client(0),
        "stream.create",
        json!({
            "name": STREAM,
            "subjects": ["big.>"],
            "replicas": 3,
            "max_msgs": 1_000_000,
            "max_bytes": 16u64 << 30,
        }),
        STEP_WAIT,
    );
    agreed_stream_group_leader(c, &[0, 1, 2], STREAM, STEP_WAIT, |_| true)
}

/// A client of node `i` whose calls wait at most 10 s.
fn client(c: &Cluster, i: usize) -> Client {
    let opts = Options {
        timeout: Duration::from_secs(10),
        reconnect: None,
        ..Options::default()
    };
    Client::connect_with(&c.http[i], opts).unwrap_or_else(|e| panic!("connect to {}: {e}", IDS[i]))
}

/// Publishes message `k` (binary, with `k` as its `Msg-Id`, so a retry
/// after an `unavailable` stores it once) through `cl` until it is acked,
/// for at most `STEP_WAIT`; returns its seq.
fn publish(cl: &Client, k: u64) -> u64 {
    let msg = OutMessage::new(SUBJECT, Payload::Bytes(message(k)))
        .with_header("Msg-Id", &format!("m{k}"));
    let deadline = Instant::now() + STEP_WAIT;
    loop {
        match cl.publish_stream_msg(&msg) {
            Ok(ack) => return ack.seq,
            Err(e) => assert!(Instant::now() < deadline, "publish {k}: {e}"),
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every acked publish: message number → seq.
type Acked = BTreeMap<u64, u64>;

/// Publishes messages `ks`, in order, through `cl` and records their seqs.
fn publish_all(cl: &Client, ks: impl IntoIterator<Item = u64>, acked: &mut Acked) {
    for k in ks {
        let seq = publish(cl, k);
        assert!(
            acked.insert(k, seq).is_none(),
            "message {k} published twice"
        );
    }
}

/// Reads the stream whole through `cl` with a new consumer `consumer`
/// (no acks, batches of 16): every message is some `message(k)` byte for
/// byte, each `k` once, seqs rising, the messages each publisher made in
/// the order it made them, and every acked message at its acked seq. A
/// fetch whose answer was lost (its relay timed out on a loaded host)
/// took its messages with it, as `ack_policy: none` says: an acked
/// message the fetches did not bring is read by its seq instead.
fn check_read_back(cl: &Client, consumer: &str, acked: &Acked, within: Duration) {
    let last_seq = acked.values().copied().max().unwrap_or(0);
    call_until(
        cl,
        "consumer.create",
        json!({"stream": STREAM, "name": consumer, "ack_policy": "none"}),
        STEP_WAIT,
    );
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut last = 0;
    let deadline = Instant::now() + within;
    while last < last_seq {
        let step = Instant::now() + STEP_WAIT;
        let batch = loop {
            match cl.fetch(STREAM, consumer, 16, Some(Duration::from_secs(2))) {
                Ok(b) => break b,
                Err(e) => assert!(
                    Instant::now() < step,
                    "consumer.fetch after seq {last}: {e}"
                ),
            }
            thread::sleep(Duration::from_millis(50));
        };
        for m in batch {
            assert!(m.seq > last, "seq {} delivered after {last}", m.seq);
            last = m.seq;
            let bytes = m.bytes.as_deref().unwrap_or_default();
            let k = bytes
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or_else(|| panic!("seq {} holds {} bytes", m.seq, bytes.len()));
            assert!(
                bytes == message(k).as_slice(),
                "seq {} (message {k}) does not read back whole ({} bytes)",
                m.seq,
                bytes.len()
            );
            if let Some(before) = seen.insert(k, m.seq) {
                panic!("message {k} stored twice (seq {before} and {})", m.seq);
            }
        }
        assert!(
            Instant::now() < deadline,
            "reading {STREAM} back took over {within:?} (at seq {last} of {last_seq})"
        );
    }
    for (k, seq) in acked {
        if seen.contains_key(k) {
            assert_eq!(seen[k], *seq, "acked message {k} is not at its acked seq");
            continue;
        }
        let step = Instant::now() + STEP_WAIT;
        let m = loop {
            match cl.stream_get(STREAM, *seq) {
                Ok(m) => break m,
                Err(e) => assert!(
                    Instant::now() < step,
                    "acked message {k} (seq {seq}), not fetched, cannot be read: {e}"
                ),
            }
            thread::sleep(Duration::from_millis(50));
        };
        assert!(
            m.bytes.as_deref() == Some(message(*k).as_slice()),
            "acked message {k} (seq {seq}) does not read back whole"
        );
    }
}

/// Waits (at most `within`) until node `i`'s replica files (payload
/// files and stream logs, [`stored_bytes`]) hold `bytes`.
fn await_payload_files(c: &Cluster, i: usize, bytes: u64, within: Duration) {
    let dir = c.data_dir(i);
    let deadline = Instant::now() + within;
    while stored_bytes(&dir) < bytes {
        assert!(
            Instant::now() < deadline,
            "{}: {} bytes of replica files after {within:?} for {bytes} bytes published",
            IDS[i],
            stored_bytes(&dir)
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// The bytes process `pid` has sent to storage (`write_bytes` less
/// `cancelled_write_bytes` of its /proc io).
fn written(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    field("write_bytes").saturating_sub(field("cancelled_write_bytes"))
}

/// Bytes a replica may write per byte published to an R3 stream: the
/// Raft log's copy (the payload files keep only where in the log each
/// message is), small snapshots. A second copy would make it about 2.
const WRITES_PER_BYTE_MAX: f64 = 1.5;

#[test]
fn resident_memory_stays_bounded_while_an_r3_stream_grows() {
    let _turn = one_at_a_time();
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let pids: Vec<u32> = (0..3).map(|i| c.pid(i)).collect();
    let rss0: Vec<u64> = pids.iter().map(|&p| proc_kb(p, "VmRSS")).collect();
    let written0: Vec<u64> = pids.iter().map(|&p| written(p)).collect();
    let watch = RssWatch::start(pids.clone());
    // 1 GiB from two publishers, one on the group's leader and one on
    // another node (which relays to it); each publishes in order.
    let n = (1024u64 << 20) / MSG_BYTES as u64;
    let began = Instant::now();
    let publishers: Vec<_> = [leader, (leader + 1) % 3]
        .into_iter()
        .enumerate()
        .map(|(w, node)| {
            let cl = client(&c, node);
            thread::spawn(move || {
                let mut acked = Acked::new();
                publish_all(&cl, (1..=n).filter(|k| k % 2 == w as u64), &mut acked);
                acked
            })
        })
        .collect();
    let mut acked = Acked::new();
    for p in publishers {
        let part = p.join().expect("a publisher");
        let mut prev = 0;
        for &seq in part.values() {
            assert!(seq > prev, "one publisher's messages stored out of order");
            prev = seq;
        }
        acked.extend(part);
    }
    let took = began.elapsed();
    assert_eq!(acked.len() as u64, n);
    let total = n * MSG_BYTES as u64;
    // Every node's replica has written the payloads to its files; the
    // sampling goes on meanwhile.
    for i in 0..3 {
        await_payload_files(&c, i, total, STEP_WAIT);
    }
    let sampled = watch.finish();
    let hwm: Vec<u64> = pids.iter().map(|&p| proc_kb(p, "VmHWM")).collect();
    // Each replica writes a published byte once (its Raft log, where its
    // payload files say the message is); its snapshots hold no payloads.
    let per_byte: Vec<f64> = (0..3)
        .map(|i| (written(pids[i]) - written0[i]) as f64 / total as f64)
        .collect();
    eprintln!("bytes written per byte published, per node: {per_byte:.2?}");
    for (i, w) in per_byte.iter().enumerate() {
        assert!(
            *w <= WRITES_PER_BYTE_MAX,
            "{} wrote {w:.2} bytes per byte published (at most {WRITES_PER_BYTE_MAX})",
            IDS[i]
        );
    }
    for (i, id) in IDS.iter().enumerate() {
        let files = snapshot_files(&c.data_dir(i));
        assert!(!files.is_empty(), "{id}: no snapshot after {total} bytes");
        for f in files {
            let len = std::fs::metadata(&f).map_or(0, |m| m.len());
            assert!(len < 1 << 20, "{id}: {} holds {len} bytes", f.display());
        }
    }
    eprintln!(
        "published {n} messages, {} MB, in {took:?}; VmRSS kB at the start {rss0:?}, \
         largest sampled {sampled:?}, peak (VmHWM) {hwm:?}",
        total >> 20
    );
    for i in 0..3 {
        let peak = sampled[i].max(hwm[i]);
        assert!(
            peak < RSS_BOUND_KB,
            "{}: resident memory reached {peak} kB (largest VmRSS sample {} kB, VmHWM {} kB) \
             with {} MB published to an R3 stream; the bound is {RSS_BOUND_KB} kB",
            IDS[i],
            sampled[i],
            hwm[i],
            total >> 20
        );
    }
    let t0 = Instant::now();
    check_read_back(
        &client(&c, (leader + 2) % 3),
        "check",
        &acked,
        Duration::from_secs(60),
    );
    eprintln!("read {n} messages back in {:?}", t0.elapsed());

    // A member restarted, after kill -9 and after SIGTERM, keeps its
    // files: it is current again within 5 s and rewrites nothing. The
    // records applied after its last snapshot are taken where they are
    // when the log's replay appends them again, so what it writes is the
    // log's and snapshot's bookkeeping, well under 8 MiB (rewriting the
    // records after the snapshot wrote about 31 MB here).
    for (how, node) in [("kill -9", (leader + 1) % 3), ("SIGTERM", (leader + 2) % 3)] {
        if how == "kill -9" {
            c.kill(node);
        } else {
            assert!(c.terminate(node, STEP_WAIT), "{} did not stop", IDS[node]);
        }
        c.restart(node);
        let pid = c.pid(node);
        await_current(&c, leader, node, Duration::from_secs(5));
        let w = written(pid);
        eprintln!(
            "{} after {how}: {} MB written until current",
            IDS[node],
            w >> 20
        );
        assert!(
            w < 8 << 20,
            "{} wrote {w} bytes after {how} until current",
            IDS[node]
        );
    }
}

#[test]
fn a_replica_behind_a_snapshot_larger_than_a_frame_catches_up() {
    let _turn = one_at_a_time();
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let victim = (leader + 1) % 3;
    let third = (leader + 2) % 3;
    assert!(
        !has_group_snapshot(&c.data_dir(leader)),
        "a snapshot before anything was published"
    );
    let cl = client(&c, third);
    let mut acked = Acked::new();
    publish_all(&cl, 1..=16, &mut acked);
    await_payload_files(&c, victim, 16 * MSG_BYTES as u64, STEP_WAIT);
    c.kill(victim);
    // 160 MiB (well past the Raft transport's 64 MiB frame; set
    // CATCHUP_MIB=512 for the full-size run docs/PERFORMANCE.md reports)
    // while the replica is down, then on until the leader has compacted
    // its log.
    let began = Instant::now();
    let mib: u64 = std::env::var("CATCHUP_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(160);
    let n = (mib << 20) / MSG_BYTES as u64;
    publish_all(&cl, 17..=n, &mut acked);
    let mut k = n;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !has_group_snapshot(&c.data_dir(leader)) {
        assert!(
            Instant::now() < deadline,
            "no snapshot on the group's leader after {} acked publishes of {MSG_BYTES} bytes",
            acked.len()
        );
        k += 1;
        publish_all(&cl, [k], &mut acked);
    }
    let total = acked.len() as u64 * MSG_BYTES as u64;
    eprintln!(
        "{} messages ({} MB) acked in {:?} with {} down; the leader has a snapshot",
        acked.len(),
        total >> 20,
        began.elapsed(),
        IDS[victim]
    );

    c.restart(victim);
    // While it catches up, a publisher on the third node keeps about
    // 5 MB/s going (one message every 12 ms), so the leader keeps
    // writing and compacting.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = {
        let (stop, cl) = (stop.clone(), client(&c, third));
        thread::spawn(move || {
            let mut mine = Acked::new();
            let mut k = k;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k += 1;
                publish_all(&cl, [k], &mut mine);
                thread::sleep(Duration::from_millis(12));
            }
            mine
        })
    };
    let restarted = Instant::now();
    await_current(&c, third, victim, Duration::from_secs(90));
    let took = restarted.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let during = live.join().expect("the live publisher");
    let peak_kb = proc_kb(c.pid(victim), "VmHWM");
    eprintln!(
        "{} current {took:?} after its restart; {} messages acked meanwhile; its peak VmHWM {} MB",
        IDS[victim],
        during.len(),
        peak_kb >> 10
    );
    assert!(
        peak_kb < 200 << 10,
        "{} peaked at {peak_kb} kB while catching up",
        IDS[victim]
    );
    acked.extend(during);
    await_payload_files(&c, victim, total, STEP_WAIT);
    // It fetched by ranges what it lacked, not the stream again.
    let log = c.log(victim);
    assert!(!log.contains("starting over"), "{log}");
    let fetched: u64 = log
        .lines()
        .filter_map(|l| l.split("caught up to its snapshot at ").nth(1))
        .filter_map(|l| l.split(": ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    // At most: what was published while it was down, and what came
    // while it caught up (a snapshot taken meanwhile names some of it).
    let lacked = acked.len() as u64 * MSG_BYTES as u64 - 16 * MSG_BYTES as u64;
    eprintln!("{} fetched {fetched} bytes, lacking {lacked}", IDS[victim]);
    assert!(
        fetched > 0 && fetched as f64 <= 1.1 * lacked as f64,
        "{} fetched {fetched} bytes for {lacked} it lacked",
        IDS[victim]
    );
    // Freeze the old leader: the stream is served by the restarted
    // replica and the third node, so it reads back from the restarted
    // replica's copy.
    c.pause(leader);
    agreed_stream_group_leader(&c, &[victim, third], STREAM, STEP_WAIT, |l| l != leader);
    check_read_back(
        &client(&c, victim),
        "check",
        &acked,
        Duration::from_secs(60),
    );
    c.resume(leader);
}

/// Waits until `stream.info`, asked on node `ask`, lists replica `node`
/// as current with lag 0, or names `node` the group's leader (a leader
/// holds everything committed; the group may elect a restarted member,
/// for instance when a loaded host delays the old leader's heartbeats);
/// fails after `within`. While the group changes leaders `stream.info`
/// answers `unavailable`: asked again until then.
fn await_current(c: &Cluster, ask: usize, node: usize, within: Duration) {
    let started = Instant::now();
    let info_client = client(c, ask);
    loop {
        let last = match info_client.call("stream.info", json!({ "name": STREAM })) {
            Ok(info) => {
                let entry = replica_entry(&info, node);
                let leads = info["cluster"]["leader"] == json!(IDS[node]);
                if leads
                    || entry
                        .as_ref()
                        .is_some_and(|e| e["current"] == json!(true) && e["lag"] == json!(0))
                {
                    break;
                }
                format!("its entry {entry:?} in {info}")
            }
            Err(e) => format!("stream.info failed: {e}"),
        };
        assert!(
            started.elapsed() < within,
            "{} not current with lag 0 within {within:?}; last seen: {last}",
            IDS[node]
        );
        thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "{} current with lag 0 after {:?}",
        IDS[node],
        started.elapsed()
    );
}

/// Whether a stream group of the node with data directory `data` has
/// stored a snapshot.
fn has_snapshot(data: &Path) -> bool {
    !snapshot_files(data).is_empty()
}

/// Data file 0 of the stream group log of the node with data directory
/// `data`, once there is one.
fn first_data_file(data: &Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(data.join("raft"))
        .ok()?
        .flatten()
        .filter(|g| g.file_name().to_string_lossy().starts_with('g'))
        .map(|g| g.path().join("data.0"))
        .find(|p| p.exists())
}

/// The stream groups' snapshot files under node data directory `data`.
fn snapshot_files(data: &Path) -> Vec<std::path::PathBuf> {
    let Ok(groups) = std::fs::read_dir(data.join("raft")) else {
        return Vec::new();
    };
    groups
        .flatten()
        .filter(|g| g.file_name().to_string_lossy().starts_with('g'))
        .filter_map(|g| std::fs::read_dir(g.path()).ok())
        .flat_map(|files| files.flatten().map(|f| f.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("snapshot.") && name.ends_with(".data")
        })
        .collect()
}

/// A replica whose snapshot file is lost while it is down (a disk that
/// lost it, an operator's mistake) does not start from a state it does
/// not have: it comes back as a node without a log and is caught up by
/// the group's leader.
#[test]
fn a_replica_whose_snapshot_file_is_lost_is_caught_up_again() {
    damaged_replica_heals("its snapshot file deleted", 48, has_snapshot, |data| {
        let lost = snapshot_files(data);
        assert!(!lost.is_empty());
        for f in &lost {
            std::fs::remove_file(f).unwrap();
        }
    });
}

/// A replica whose payload files are damaged while it is down (one bit
/// flipped a third of the way into its first file, its last file cut
/// short) keeps the messages before the damage, fetches the rest from
/// the group's leader, and loses nothing. The member may find the damage
/// after its group's core has started and answered the leader; the
/// leader then learns of the core started again without its log from
/// heartbeat answers alone (nothing is published meanwhile).
#[test]
fn a_replica_whose_payload_files_are_damaged_is_caught_up_again() {
    damaged_replica_heals(
        "a bit flipped and its last file cut",
        48,
        has_snapshot,
        |data| {
            let mut files: Vec<_> = std::fs::read_dir(data.join("replicas"))
                .unwrap()
                .flatten()
                .flat_map(|g| std::fs::read_dir(g.path()).unwrap().flatten())
                .map(|f| f.path())
                .collect();
            files.sort();
            assert!(!files.is_empty(), "no payload files");
            let first = &files[0];
            let mut bytes = std::fs::read(first).unwrap();
            let at = bytes.len() / 3;
            bytes[at] ^= 0x01;
            std::fs::write(first, &bytes).unwrap();
            let last = files.last().unwrap();
            let len = std::fs::metadata(last).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(last).unwrap();
            f.set_len(len - 100).unwrap();
        },
    );
}

/// A replica one of whose stream log's data files (a log file a snapshot
/// covered, which holds the data of the messages that came through it)
/// is damaged while it is down finds the damage when it reopens its
/// files, keeps the messages before it and fetches the rest.
#[test]
fn a_replica_whose_log_data_file_is_damaged_is_caught_up_again() {
    // 80 MiB through a log of 32 MiB files: the second snapshot covers
    // the first file whole, which makes it data file 0.
    damaged_replica_heals(
        "bits flipped in a log data file",
        80,
        |d| first_data_file(d).is_some(),
        |data| {
            let first = first_data_file(data).unwrap();
            let mut bytes = std::fs::read(&first).unwrap();
            // One bit in every 4 KiB of its second half. An entry of one
            // 64 KiB message has under 100 bytes besides the data, so
            // most land in data the messages of that half need. (Eight
            // bits at the file's ninths all landed between messages once:
            // its 513 entries divide by nine.)
            for at in (bytes.len() / 2..bytes.len()).step_by(4096) {
                bytes[at] ^= 0x01;
            }
            std::fs::write(&first, &bytes).unwrap();
        },
    );
}

/// Whether a stream group of the node with data directory `data` is
/// started again without its log (`node.rs`'s `lost` mark, there until
/// its replica is whole and its core votes again).
fn lost_mark(data: &Path) -> bool {
    std::fs::read_dir(data.join("raft"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|g| g.path().join("lost").exists())
}

/// Waits (at most `within`) until node `i`, since its last start, has
/// made its replica whole from its group leader's snapshot (its log says
/// so) and votes in its group again (its `lost_mark` is gone).
fn await_whole_again(c: &Cluster, i: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let log = c.log(i);
        let since_start = log.rsplit("info config node_id=").next().unwrap_or("");
        let caught_up = since_start.contains("caught up to its snapshot");
        if caught_up && !lost_mark(&c.data_dir(i)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} not whole and voting again after {within:?} (caught up: {caught_up})",
            IDS[i]
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Publishes `mib` MiB to an R3 stream (past the log's budget, so every
/// replica takes a snapshot), waits until `ready` holds for one
/// replica's data directory, kills it, damages its files with `damage`
/// (given that directory), and restarts it: it must be current again,
/// hold every message, and serve each acked message once it leads.
fn damaged_replica_heals(what: &str, mib: u64, ready: fn(&Path) -> bool, damage: impl Fn(&Path)) {
    let _turn = one_at_a_time();
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let victim = (leader + 1) % 3;
    let third = (leader + 2) % 3;
    let cl = client(&c, third);
    let mut acked = Acked::new();
    // Past the log's 32 MiB budget: every replica takes a snapshot.
    let n = (mib << 20) / MSG_BYTES as u64;
    publish_all(&cl, 1..=n, &mut acked);
    let deadline = Instant::now() + STEP_WAIT;
    while !ready(&c.data_dir(victim)) {
        assert!(
            Instant::now() < deadline,
            "{} not ready to be damaged ({what}) after {n} publishes",
            IDS[victim]
        );
        thread::sleep(Duration::from_millis(50));
    }
    c.kill(victim);
    damage(&c.data_dir(victim));
    eprintln!("{}: {what}", IDS[victim]);
    c.restart(victim);
    // Nothing is published meanwhile: the leader learns that the replica
    // lacks its log once their link is up again, and sends its snapshot.
    let deadline = Instant::now() + Duration::from_secs(30);
    while snapshot_files(&c.data_dir(victim)).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} has no snapshot file again after {:?}",
            IDS[victim],
            Duration::from_secs(30)
        );
        thread::sleep(Duration::from_millis(50));
    }
    // It finds the damage: its group starts again without its log, a
    // non-voter until the leader's snapshot has made its replica whole.
    await_whole_again(&c, victim, Duration::from_secs(60));
    await_current(&c, third, victim, Duration::from_secs(60));
    let total = acked.len() as u64 * MSG_BYTES as u64;
    await_payload_files(&c, victim, total, STEP_WAIT);
    c.pause(leader);
    agreed_stream_group_leader(&c, &[victim, third], STREAM, STEP_WAIT, |l| l != leader);
    check_read_back(
        &client(&c, victim),
        "check",
        &acked,
        Duration::from_secs(60),
    );
    c.resume(leader);
}
