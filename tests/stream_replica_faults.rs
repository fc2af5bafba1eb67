//! Faults under a stream with three replicas, on a real three-node
//! cluster (docs/PROTOCOL.md, "Replicated streams"): one replica frozen
//! (SIGSTOP), publishes through the others go on and are acked; two
//! frozen, a fetch, an ack, a read and publishes on the node left alone
//! are each answered `unavailable` within 5 s, and after
//! SIGCONT they are acked again with nothing acked lost; one replica
//! killed (kill -9) while the log moves on far enough for the group's
//! leader to take a snapshot and drop the entries before it, then started
//! again: it catches up, reports `current`, and every acked message is
//! there, once and in order.

mod cluster_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{
    agreed_stream_group_leader, has_group_snapshot, replica_entry, Cluster, IDS,
};
use gombus::client::{Client, Error, Options};
use serde_json::json;

/// The contract's bound for an answer (`unavailable`) without a majority
/// and for publishing again after losing a minority.
const CONTRACT_WAIT: Duration = Duration::from_secs(5);
/// What a host shared with other builds may add to the contract's bound.
const HOST_SLACK: Duration = Duration::from_secs(3);
/// The contract's bound on `unavailable` without a majority, plus
/// scheduling slack for a loaded test host (as in tests/cluster.rs).
const UNAVAILABLE_BOUND: Duration = Duration::from_millis(5_750);
/// Bound on waits that the contract does not time (catching up, elections
/// after a restart).
const LONG_WAIT: Duration = Duration::from_secs(60);

const STREAM: &str = "FAULTS";
const SUBJECT: &str = "faults.x";

/// A client of node `i` whose calls wait at most `timeout`.
fn client(c: &Cluster, i: usize, timeout: Duration) -> Client {
    let opts = Options {
        timeout,
        reconnect: None,
        ..Options::default()
    };
    Client::connect_with(&c.http[i], opts).unwrap_or_else(|e| panic!("connect to {}: {e}", IDS[i]))
}

/// Creates the stream with three replicas through node 0 and waits until
/// every node names the same leader of its group; returns that leader's
/// index.
fn create_r3(c: &Cluster) -> usize {
    let admin = client(c, 0, Duration::from_secs(10));
    admin
        .call(
            "stream.create",
            json!({"name": STREAM, "subjects": ["faults.>"], "replicas": 3}),
        )
        .expect("stream.create with 3 replicas");
    await_group_leader(c, &[0, 1, 2], None, LONG_WAIT)
}

/// Waits until every node in `nodes` names the same group leader (other
/// than `not`); returns it.
fn await_group_leader(c: &Cluster, nodes: &[usize], not: Option<usize>, within: Duration) -> usize {
    agreed_stream_group_leader(c, nodes, STREAM, within, |l| Some(l) != not)
}

/// Every acked publish: payload number → seq.
type Acked = Arc<Mutex<HashMap<u64, u64>>>;

/// Publishes `{n}` through `cl` and records the seq if acked.
fn publish(cl: &Client, n: u64, acked: &Acked) -> Result<u64, Error> {
    let ack = cl.publish_stream(SUBJECT, json!({ "n": n }))?;
    assert!(!ack.duplicate, "publish {n} acked as a duplicate: {ack:?}");
    let mut a = acked.lock().unwrap();
    assert!(a.insert(n, ack.seq).is_none(), "publish {n} acked twice");
    Ok(ack.seq)
}

/// Publishes through `cl` until one is acked (at most `within`); returns
/// how long that took. Numbers come from `next`.
fn publish_until_acked(cl: &Client, next: &mut u64, acked: &Acked, within: Duration) -> Duration {
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < within {
        *next += 1;
        match publish(cl, *next, acked) {
            Ok(_) => return t0.elapsed(),
            Err(e) => last = Some(e),
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("no publish acked within {within:?}; last answer: {last:?}");
}

/// Calls `f` until it succeeds (a group electing its leader, or a read
/// before the leader applied an entry of its term, answers
/// `unavailable`), at most `within`.
fn retry<T>(within: Duration, what: &str, mut f: impl FnMut() -> Result<T, Error>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "{what}: {e} after {within:?}"),
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Reads the whole stream through node `i` (a consumer without acks,
/// fetched in batches) and checks that every acked publish is there
/// exactly once, at the seq its ack named, and that the acked publishes
/// of one publisher are stored in the order it made them.
fn check_all_acked(c: &Cluster, i: usize, acked: &Acked, consumer: &str) {
    let cl = client(c, i, Duration::from_secs(10));
    let info = retry(LONG_WAIT, "stream.info", || cl.stream_info(STREAM));
    retry(LONG_WAIT, "consumer.create", || {
        cl.call(
            "consumer.create",
            json!({"stream": STREAM, "name": consumer, "ack_policy": "none"}),
        )
    });
    let acked = acked.lock().unwrap().clone();
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut last = 0;
    let deadline = Instant::now() + LONG_WAIT;
    while last < info.state.last_seq {
        let batch = retry(LONG_WAIT, "consumer.fetch", || {
            cl.fetch(STREAM, consumer, 256, None)
        });
        assert!(
            !batch.is_empty(),
            "fetch on {} ended at seq {last} of {}",
            IDS[i],
            info.state.last_seq
        );
        for m in batch {
            assert!(m.seq > last, "seq {} delivered after {last}", m.seq);
            last = m.seq;
            let n = m.data["n"].as_u64().expect("a payload number");
            assert!(
                seen.insert(n, m.seq).is_none(),
                "payload {n} stored twice (seq {} and {})",
                seen[&n],
                m.seq
            );
        }
        assert!(Instant::now() < deadline, "reading the stream never ended");
    }
    for (n, seq) in &acked {
        assert_eq!(
            seen.get(n),
            Some(seq),
            "acked publish {n} (seq {seq}) is not there as acked"
        );
    }
    // Each publisher (payload numbers n / 1 000 000) publishes one at a
    // time: its later publishes have higher seqs.
    let mut by_n: Vec<(u64, u64)> = acked.into_iter().collect();
    by_n.sort_unstable();
    for w in by_n.windows(2) {
        if w[0].0 / 1_000_000 == w[1].0 / 1_000_000 {
            assert!(w[0].1 < w[1].1, "acked publishes out of order: {w:?}");
        }
    }
}

#[test]
fn one_frozen_replica_leaves_publishing_acked() {
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let acked: Acked = Arc::default();
    let mut n = 0;
    let cl = client(&c, (leader + 1) % 3, Duration::from_secs(2));
    for _ in 0..50 {
        n += 1;
        publish(&cl, n, &acked).expect("publish before the freeze");
    }
    // Freeze the group's leader: the two others must elect one and go on.
    c.pause(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let took = publish_until_acked(&cl, &mut n, &acked, CONTRACT_WAIT + HOST_SLACK);
    eprintln!("publishing acked again {took:?} after freezing the leader");
    // Both survivors take publishes.
    let other = client(&c, others[1], Duration::from_secs(2));
    for k in 0..100 {
        n += 1;
        let through = if k % 2 == 0 { &cl } else { &other };
        publish(through, n, &acked).expect("publish with one replica frozen");
    }
    let new_leader = await_group_leader(&c, &others, Some(leader), CONTRACT_WAIT);
    assert_ne!(new_leader, leader);
    c.resume(leader);
    check_all_acked(&c, others[0], &acked, "check");
}

#[test]
fn two_frozen_replicas_answer_unavailable_then_recover() {
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let acked: Acked = Arc::default();
    let mut n = 0;
    // The publisher's node stays up; the two others are frozen.
    let keep = (leader + 1) % 3;
    let frozen: Vec<usize> = (0..3).filter(|&i| i != keep).collect();
    let cl = client(&c, keep, Duration::from_secs(15));
    for _ in 0..50 {
        n += 1;
        publish(&cl, n, &acked).expect("publish before the freeze");
    }
    // A pull consumer with one message delivered and not acked yet.
    cl.call("consumer.create", json!({"stream": STREAM, "name": "pull"}))
        .expect("consumer.create before the freeze");
    let held = cl
        .fetch(STREAM, "pull", 1, None)
        .expect("fetch before the freeze");
    let held_seq = held.first().map(|m| m.seq).expect("a message to hold");
    for &i in &frozen {
        c.pause(i);
    }
    // Right after the freeze, while the node left alone still takes the
    // frozen leader for its group's leader: a fetch (waiting up to 5 s
    // for messages), an ack and a read are each answered `unavailable`
    // within the contract's 5 s, not at the end of the relay's own wait.
    let fetch = json!({"stream": STREAM, "consumer": "pull", "batch": 1, "expires_ms": 5_000});
    let ack = json!({"stream": STREAM, "consumer": "pull", "seq": held_seq});
    let info = json!({ "name": STREAM });
    for (event, arg) in [
        ("consumer.fetch", fetch),
        ("ack", ack),
        ("stream.info", info),
    ] {
        let t0 = Instant::now();
        let answer = cl.call(event, arg);
        let took = t0.elapsed();
        match answer {
            Err(e) => assert_eq!(e.code(), Some("unavailable"), "{event}: {e}"),
            Ok(v) => panic!("{event} answered {v} with two of three replicas frozen"),
        }
        eprintln!("{event} answered unavailable after {took:?}");
        assert!(
            took <= UNAVAILABLE_BOUND,
            "{event}: `unavailable` took {took:?}"
        );
    }
    // Every publish is answered, and within the contract's bound, with
    // `unavailable`: never acked, never left unanswered.
    for _ in 0..3 {
        n += 1;
        let t0 = Instant::now();
        let answer = publish(&cl, n, &acked);
        let took = t0.elapsed();
        match answer {
            Err(e) => assert_eq!(
                e.code(),
                Some("unavailable"),
                "publish without a majority: {e}"
            ),
            Ok(seq) => panic!("publish {n} acked (seq {seq}) with two of three replicas frozen"),
        }
        assert!(took <= UNAVAILABLE_BOUND, "`unavailable` took {took:?}");
    }
    for &i in &frozen {
        c.resume(i);
    }
    publish_until_acked(&cl, &mut n, &acked, LONG_WAIT);
    for _ in 0..50 {
        n += 1;
        publish(&cl, n, &acked).expect("publish after recovery");
    }
    check_all_acked(&c, keep, &acked, "check");
}

#[test]
fn killed_replica_catches_up_after_the_leader_compacted() {
    let mut c = Cluster::start();
    let leader = create_r3(&c);
    let victim = (leader + 1) % 3;
    let third = (leader + 2) % 3;
    assert!(
        !has_group_snapshot(&c.data_dir(leader)),
        "a snapshot before anything was published"
    );
    let acked: Acked = Arc::default();
    let cl = client(&c, leader, Duration::from_secs(5));
    for n in 1..=20 {
        publish(&cl, n, &acked).expect("publish before the kill");
    }
    c.kill(victim);
    // Sequential acked publishes from a few connections, each its own
    // log entry more or less, until the leader has taken a snapshot.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
            let cl = client(
                &c,
                if w % 2 == 0 { leader } else { third },
                Duration::from_secs(5),
            );
            thread::spawn(move || {
                let mut n = 1_000_000 * (w + 1);
                let mut refused = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // With a majority up, a refusal is possible only when
                    // an entry takes longer than the server's bound on a
                    // busy host; it must stay rare.
                    if publish(&cl, n, &acked).is_err() {
                        refused += 1;
                        assert!(
                            refused <= 10,
                            "{refused} publishes refused with one replica down"
                        );
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !has_group_snapshot(&c.data_dir(leader)) {
        assert!(
            Instant::now() < deadline,
            "no snapshot on the leader after {} acked publishes",
            acked.lock().unwrap().len()
        );
        thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("publisher");
    }
    let total = acked.lock().unwrap().len();
    eprintln!("{total} publishes acked before the leader's snapshot");

    c.restart(victim);
    // The replica reports current (lag 0) in the stream's information.
    let info_client = client(&c, third, Duration::from_secs(5));
    let deadline = Instant::now() + LONG_WAIT;
    loop {
        let info = info_client
            .call("stream.info", json!({ "name": STREAM }))
            .expect("stream.info");
        let entry = replica_entry(&info, victim);
        if entry.as_ref().is_some_and(|e| e["current"] == json!(true)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} not current within {LONG_WAIT:?}: {info}",
            IDS[victim]
        );
        thread::sleep(Duration::from_millis(100));
    }
    // Freeze the old leader: the stream is now served by the restarted
    // replica and the third node (a majority only with the restarted
    // replica's copy), and every acked message must still be there.
    c.pause(leader);
    await_group_leader(
        &c,
        &[victim, third],
        Some(leader),
        CONTRACT_WAIT + HOST_SLACK,
    );
    check_all_acked(&c, victim, &acked, "check");
    c.resume(leader);
}
