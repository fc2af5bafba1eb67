//! Key-value buckets in a cluster (docs/PROTOCOL.md "Key-value buckets"):
//! three real `broker` processes on loopback. Clients on every node do
//! compare-and-set increments of one counter in an R3 bucket for 10 s; the
//! final value equals the number of acked increments, no revision is acked
//! twice and no client sees a revision go back, also across a kill -9 of
//! the bucket's leader. An R1 bucket is used from a node that does not
//! hold it (its events are relayed).

mod cluster_support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{agreed_stream_group_leader, call_until, Cluster};
use gombus::client::{Client, Error, KvWatchEvent, WatchFrom};
use serde_json::{json, Value};

/// How long an R3 bucket may take to be placed and serve.
const SERVE_WAIT: Duration = Duration::from_secs(20);

/// Reads the counter: (value, revision), (0, 0) while it has none.
fn read(c: &Client) -> Result<(u64, u64), Error> {
    match c.call("kv.get", json!({"bucket": "ctr", "key": "n"})) {
        Ok(v) => Ok((
            v["entry"]["value"].as_u64().unwrap_or(0),
            v["entry"]["revision"].as_u64().unwrap_or(0),
        )),
        Err(Error::Server { code, .. }) if code == "not_found" => Ok((0, 0)),
        Err(e) => Err(e),
    }
}

/// Increments the counter by compare-and-set until `stop`, adding the
/// revisions its acked writes got to `acked`. Checks that what this client
/// sees never goes back: each read's revision is at least the latest it
/// saw (read or acked), and each acked write's is above it.
fn incrementer(
    c: Client,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<u64>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut seen = 0u64;
        while !stop.load(Ordering::Acquire) {
            let Ok((n, rev)) = read(&c) else {
                thread::sleep(Duration::from_millis(20));
                continue;
            };
            assert!(
                rev >= seen,
                "a read went back from revision {seen} to {rev}"
            );
            seen = rev;
            let put = json!({"bucket": "ctr", "key": "n", "value": n + 1, "revision": rev});
            if let Ok(v) = c.call("kv.put", put) {
                let r = v["revision"].as_u64().expect("a revision");
                assert!(r > seen, "a write acked at revision {r}, not above {seen}");
                seen = r;
                acked.lock().unwrap().push(r);
            }
        }
    })
}

/// Clients on `nodes` increment the counter for `for_`; a client's
/// assertion failing fails the test.
fn race(c: &Cluster, nodes: &[usize], for_: Duration, acked: &Arc<Mutex<Vec<u64>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = nodes
        .iter()
        .map(|&i| incrementer(c.client(i), Arc::clone(&stop), Arc::clone(acked)))
        .collect();
    // The time to run, not a wait for something to happen.
    thread::sleep(for_);
    stop.store(true, Ordering::Release);
    for w in workers {
        if let Err(e) = w.join() {
            std::panic::resume_unwind(e);
        }
    }
}

/// The counter as `node` reads it, once it serves again.
fn settled(c: &Cluster, node: usize) -> (u64, u64) {
    let deadline = Instant::now() + SERVE_WAIT;
    loop {
        match read(&c.client(node)) {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "kv.get kept failing: {e}"),
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn check(acked: &[u64], value: u64, revision: u64) {
    let distinct: BTreeSet<u64> = acked.iter().copied().collect();
    assert_eq!(distinct.len(), acked.len(), "a revision acked twice");
    assert_eq!(
        value,
        acked.len() as u64,
        "the counter equals the acked increments"
    );
    assert_eq!(
        Some(&revision),
        distinct.last(),
        "the latest acked write is the value"
    );
}

/// docs/PROTOCOL.md "Key-value buckets": compare-and-set is decided by
/// the bucket's leader, so racing writers on three nodes never both win;
/// the leader's loss (kill -9) loses no acked write and revisions never
/// go back. An R1 bucket on node 0 serves clients of node 1.
#[test]
fn compare_and_set_across_a_cluster_and_a_leader_loss() {
    let mut c = Cluster::start();
    let created = call_until(
        &c.client(0),
        "kv.create",
        json!({"bucket": "ctr", "replicas": 3}),
        SERVE_WAIT,
    );
    assert_eq!(created["bucket"]["config"]["replicas"], 3, "{created}");
    assert_eq!(created["bucket"]["config"]["history"], 1, "{created}");
    let leader = agreed_stream_group_leader(&c, &[0, 1, 2], "KV_ctr", SERVE_WAIT, |_| true);
    // The same create again is the bucket; another config is `exists`.
    let again = call_until(
        &c.client(1),
        "kv.create",
        json!({"bucket": "ctr", "replicas": 3}),
        SERVE_WAIT,
    );
    assert_eq!(again["bucket"]["config"]["bucket"], "ctr", "{again}");
    match c.client(2).call(
        "kv.create",
        json!({"bucket": "ctr", "history": 5, "replicas": 3}),
    ) {
        Err(Error::Server { code, .. }) => assert_eq!(code, "exists"),
        other => panic!("another config: {other:?}"),
    }

    // A watch on a follower sees every applied write, in order.
    let follower = c.client((leader + 1) % 3);
    let w = follower
        .kv("ctr")
        .watch(Some("n"), WatchFrom::UpdatesOnly)
        .expect("a watch on a follower");
    assert_eq!(
        w.next_timeout(SERVE_WAIT).expect("caught up"),
        KvWatchEvent::CaughtUp
    );

    let acked = Arc::new(Mutex::new(Vec::new()));
    race(&c, &[0, 1, 2], Duration::from_secs(10), &acked);
    let (value, revision) = settled(&c, (leader + 1) % 3);
    let before = acked.lock().unwrap().clone();
    assert!(
        before.len() >= 500,
        "too few increments acked: {}",
        before.len()
    );
    check(&before, value, revision);
    let mut watched = Vec::new();
    while watched.last() != Some(&revision) {
        match w.next_timeout(SERVE_WAIT).expect("a watched write") {
            KvWatchEvent::Entry(e) => watched.push(e.revision),
            other => panic!("a watch event: {other:?}"),
        }
    }
    assert!(
        watched.windows(2).all(|p| p[0] < p[1]),
        "watched out of order: {watched:?}"
    );
    let seen: BTreeSet<u64> = watched.iter().copied().collect();
    assert!(
        before.iter().all(|r| seen.contains(r)),
        "an acked write was not watched"
    );
    w.stop().expect("stop the watch");

    // The leader goes; the others go on from where it was.
    c.kill(leader);
    let rest: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (v, r) = settled(&c, rest[0]);
    assert_eq!((v, r), (value, revision), "an acked write lost or moved");
    race(&c, &rest, Duration::from_secs(1), &acked);
    let (value, revision) = settled(&c, rest[1]);
    let all = acked.lock().unwrap().clone();
    assert!(
        all.len() > before.len(),
        "no increment acked after the leader's loss"
    );
    check(&all, value, revision);

    // A leader that cannot reach a majority answers no read: a read of a
    // replicated bucket goes through the log.
    let l = agreed_stream_group_leader(&c, &rest, "KV_ctr", SERVE_WAIT, |_| true);
    let f = rest.iter().copied().find(|&i| i != l).expect("a follower");
    c.pause(f);
    let got = c
        .client(l)
        .call("kv.get", json!({"bucket": "ctr", "key": "n"}));
    c.resume(f);
    assert!(
        got.is_err(),
        "a read answered by a leader with no majority: {got:?}"
    );

    // An R1 bucket lives on the node that created it; the others relay.
    let owner = rest[0];
    let other = rest[1];
    call_until(
        &c.client(owner),
        "kv.create",
        json!({"bucket": "one"}),
        SERVE_WAIT,
    );
    let put = call_until(
        &c.client(other),
        "kv.put",
        json!({"bucket": "one", "key": "k", "value": {"x": 1}}),
        SERVE_WAIT,
    );
    let rev = put["revision"].as_u64().expect("a revision");
    let got: Value = c
        .client(other)
        .call("kv.get", json!({"bucket": "one", "key": "k"}))
        .expect("kv.get through another node");
    assert_eq!(got["entry"]["value"], json!({"x": 1}));
    assert_eq!(got["entry"]["revision"], rev);
    match c.client(other).call(
        "kv.put",
        json!({"bucket": "one", "key": "k", "value": 2, "revision": rev + 5}),
    ) {
        Err(Error::Server { code, .. }) => assert_eq!(code, "wrong_revision"),
        other => panic!("a stale compare-and-set: {other:?}"),
    }

    // Every node lists and describes every bucket: the R1 one wherever it
    // lives, the replicated one with its leader's state.
    for &i in &rest {
        let deadline = Instant::now() + SERVE_WAIT;
        let listed = loop {
            let got = c.client(i).call("kv.list", json!({}));
            let fine = got.as_ref().is_ok_and(|v| {
                let b = &v["buckets"];
                b[0]["config"]["bucket"] == "ctr"
                    && b[0]["state"]["revision"] == revision
                    && b[1]["config"]["bucket"] == "one"
                    && b[1]["state"]["revision"] == rev
                    && b.as_array().map(Vec::len) == Some(2)
            });
            if fine || Instant::now() > deadline {
                break got;
            }
            thread::sleep(Duration::from_millis(50));
        };
        let listed = listed.expect("kv.list");
        let b = &listed["buckets"];
        assert_eq!(b.as_array().map(Vec::len), Some(2), "node {i}: {listed}");
        assert_eq!(b[0]["config"]["bucket"], "ctr", "node {i}: {listed}");
        assert_eq!(b[0]["config"]["replicas"], 3, "node {i}: {listed}");
        assert_eq!(b[0]["state"]["values"], 1, "node {i}: {listed}");
        assert_eq!(b[0]["state"]["revision"], revision, "node {i}: {listed}");
        assert_eq!(b[1]["config"]["bucket"], "one", "node {i}: {listed}");
        assert_eq!(b[1]["config"]["replicas"], 1, "node {i}: {listed}");
        assert_eq!(b[1]["state"]["values"], 1, "node {i}: {listed}");
        assert_eq!(b[1]["state"]["revision"], rev, "node {i}: {listed}");
        for (bucket, at) in [("ctr", revision), ("one", rev)] {
            let info = call_until(
                &c.client(i),
                "kv.info",
                json!({ "bucket": bucket }),
                SERVE_WAIT,
            );
            assert_eq!(info["bucket"]["config"]["bucket"], bucket, "{info}");
            assert_eq!(info["bucket"]["state"]["revision"], at, "{info}");
        }
    }
}
