//! Crash rounds with the real binary: a publisher stores acknowledged
//! messages and a pull consumer fetches and acks them while the broker is
//! killed with SIGKILL at a random moment; after each restart every
//! acknowledged message is present exactly once and in order, the stream's
//! counts match what is stored, and the consumer resumes from its acks:
//! no message acked `{ok}` is served again, and none is skipped.
//!
//! The moments come from a seeded generator; the seed is printed and
//! `GOMBUS_CRASH_SEED=<n>` replays it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Broker;
use gombus::client::{Client, ConsumerConfig, StreamConfig};
use serde_json::json;

const ROUNDS: usize = 6;
const STREAM: &str = "CRASH";
const CONSUMER: &str = "worker";

/// SplitMix64 ([`gombus::rand`]): small, seedable, good enough to pick kill moments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        gombus::rand::splitmix64(&mut self.0)
    }
}

/// What the clients saw acknowledged across all rounds.
#[derive(Default)]
struct Seen {
    /// Payload counter -> seq, for every publish acked `{ok, seq}`.
    stored: BTreeMap<u64, u64>,
    /// Seqs whose `ack` was answered `{ok}`.
    acked: BTreeSet<u64>,
    /// Seqs whose `ack` was sent but the broker died before answering:
    /// it may or may not have been stored.
    unsure: BTreeSet<u64>,
}

/// Polls `f` until it is true or `limit` passes.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while !f() {
        if Instant::now() > end {
            return false;
        }
        thread::sleep(Duration::from_millis(2));
    }
    true
}

fn connect(b: &Broker) -> Client {
    Client::connect(&b.addr).unwrap_or_else(|e| panic!("connect to {}: {e}", b.addr))
}

fn publisher(addr: String, next: u64, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) -> u64 {
    let Ok(c) = Client::connect(&addr) else {
        return next;
    };
    let mut k = next;
    while !stop.load(Ordering::Relaxed) {
        match c.publish_stream("crash.x", json!({ "k": k })) {
            Ok(ack) => {
                seen.lock().unwrap().stored.insert(k, ack.seq);
                k += 1;
            }
            // The broker died mid-publish: this one's fate is unknown, so
            // its counter is not reused.
            Err(_) => return k + 1,
        }
    }
    k
}

fn worker(addr: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let Ok(c) = Client::connect(&addr) else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok(msgs) = c.fetch(STREAM, CONSUMER, 20, Some(Duration::from_millis(50))) else {
            return;
        };
        for m in msgs {
            {
                let s = seen.lock().unwrap();
                assert!(
                    !s.acked.contains(&m.seq),
                    "seq {} was served again after its ack was confirmed",
                    m.seq
                );
            }
            if c.ack(STREAM, CONSUMER, m.seq).is_err() {
                seen.lock().unwrap().unsure.insert(m.seq);
                return;
            }
            seen.lock().unwrap().acked.insert(m.seq);
        }
    }
}

/// Reads the whole stream and checks it against what was acknowledged.
fn verify(c: &Client, seen: &Seen, round: usize) {
    let info = c.stream_info(STREAM).unwrap();
    let st = info.state;
    let mut by_seq: BTreeMap<u64, u64> = BTreeMap::new();
    let mut count = 0;
    if st.messages > 0 {
        for seq in st.first_seq..=st.last_seq {
            let Ok(m) = c.stream_get(STREAM, seq) else {
                continue;
            };
            let k = m.data["k"].as_u64().expect("payload counter");
            by_seq.insert(seq, k);
            count += 1;
        }
    }
    assert_eq!(
        count, st.messages,
        "round {round}: stream.info messages match what is stored"
    );
    if let Some((&last, _)) = by_seq.last_key_value() {
        assert_eq!(last, st.last_seq, "round {round}: last_seq");
    }
    // In order and each payload once.
    let ks: Vec<u64> = by_seq.values().copied().collect();
    assert!(
        ks.windows(2).all(|w| w[0] < w[1]),
        "round {round}: stored out of order or twice: {ks:?}"
    );
    // Every acknowledged publish is there under its seq.
    for (&k, &seq) in &seen.stored {
        assert_eq!(
            by_seq.get(&seq),
            Some(&k),
            "round {round}: acked publish k={k} seq={seq} lost"
        );
    }
    // The consumer resumes from its acks.
    let ci = c.consumer_info(STREAM, CONSUMER).unwrap();
    let floor = ci.ack_floor.stream_seq;
    let contiguous = (1..)
        .take_while(|s| seen.acked.contains(s))
        .last()
        .unwrap_or(0);
    assert!(
        floor >= contiguous,
        "round {round}: ack floor {floor} below the confirmed acks up to {contiguous}"
    );
}

#[test]
fn acked_messages_and_acks_survive_sigkill() {
    let seed = std::env::var("GOMBUS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("crash test seed {seed} (GOMBUS_CRASH_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut b = Broker::start(&[]);
    {
        let c = connect(&b);
        let mut cfg = StreamConfig::new(STREAM, &["crash.>"]);
        cfg.max_msgs = Some(1_000_000);
        c.stream_create(&cfg).unwrap();
        let mut cc = ConsumerConfig::new(CONSUMER);
        cc.ack_wait_ms = Some(60_000);
        c.consumer_create(STREAM, &cc).unwrap();
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut next = 0;
    for round in 1..=ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let p = {
            let (addr, seen, stop) = (b.addr.clone(), Arc::clone(&seen), Arc::clone(&stop));
            thread::spawn(move || publisher(addr, next, seen, stop))
        };
        let w = {
            let (addr, seen, stop) = (b.addr.clone(), Arc::clone(&seen), Arc::clone(&stop));
            thread::spawn(move || worker(addr, seen, stop))
        };
        // The kill comes after a random number of confirmed publishes and
        // acks, so it lands mid-traffic at a different point each round.
        let publishes = seen.lock().unwrap().stored.len() + 20 + (rng.next() % 300) as usize;
        let acks = seen.lock().unwrap().acked.len() + 10 + (rng.next() % 200) as usize;
        let traffic = eventually(Duration::from_secs(20), || {
            let s = seen.lock().unwrap();
            s.stored.len() >= publishes && s.acked.len() >= acks
        });
        assert!(traffic, "round {round}: traffic stalled before the kill");
        let run = format!("{publishes} publishes and {acks} acks");
        // SIGKILL by PID mid-traffic, then a new process on the same data.
        b.restart(&[]);
        stop.store(true, Ordering::Relaxed);
        next = p.join().expect("publisher thread");
        w.join().expect("worker thread");
        let c = connect(&b);
        let s = seen.lock().unwrap();
        eprintln!(
            "round {round}: killed after {run}; {} publishes and {} acks confirmed so far",
            s.stored.len(),
            s.acked.len()
        );
        verify(&c, &s, round);
    }
    // Drain: every stored message is delivered exactly until acked; none
    // acked is served again and none is skipped.
    let c = connect(&b);
    let stop = Arc::new(AtomicBool::new(false));
    let drain_end = Instant::now() + Duration::from_secs(10);
    loop {
        let msgs = c
            .fetch(STREAM, CONSUMER, 100, Some(Duration::from_millis(100)))
            .unwrap();
        if msgs.is_empty() || Instant::now() > drain_end {
            break;
        }
        let mut s = seen.lock().unwrap();
        for m in msgs {
            assert!(
                !s.acked.contains(&m.seq),
                "seq {} served again after its ack",
                m.seq
            );
            c.ack(STREAM, CONSUMER, m.seq).unwrap();
            s.acked.insert(m.seq);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let s = seen.lock().unwrap();
    let st = c.stream_info(STREAM).unwrap().state;
    let stored: BTreeSet<u64> = (st.first_seq..=st.last_seq)
        .filter(|&q| c.stream_get(STREAM, q).is_ok())
        .collect();
    // An ack sent as the broker died may have been stored: those seqs
    // may be gone from the consumer without a confirmation.
    let missing: Vec<&u64> = stored
        .difference(&s.acked)
        .filter(|q| !s.unsure.contains(q))
        .collect();
    assert!(
        missing.is_empty(),
        "stored but never delivered to the consumer: {missing:?}"
    );
    let ci = c.consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
    assert!(s.stored.len() > ROUNDS, "the rounds stored something");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "crash rounds stay under a minute"
    );
}
