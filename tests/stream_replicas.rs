//! Replicated streams end to end (docs/PROTOCOL.md "Replicated streams"):
//! three real `broker` processes on loopback, an R3 stream, and the loss
//! of the node leading its Raft group (kill -9) or of the whole cluster
//! (every node killed and started again). What a publisher was acked, and
//! what a consumer's acks were answered `{ok}` for, must hold afterwards:
//! every acked message there once and in order, no acked message
//! delivered again.

mod cluster_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{agreed_stream_group_leader, call_until, read_stream, Cluster, IDS};
use gombus::client::Client;
use serde_json::json;

/// How long a replicated stream may take to be placed, elect its group's
/// leader and serve (a fresh cluster, or one just restarted).
const SERVE_WAIT: Duration = Duration::from_secs(20);

/// Creates R3 stream `name` through node 0 and waits until every node
/// names the same leader of its group; returns the leader's index.
fn create_r3(c: &Cluster, name: &str, subjects: &str) -> usize {
    call_until(
        &c.client(0),
        "stream.create",
        json!({"name": name, "subjects": [subjects], "replicas": 3}),
        SERVE_WAIT,
    );
    agreed_stream_group_leader(c, &[0, 1, 2], name, SERVE_WAIT, |_| true)
}

/// An acked publish: k, seq, when it began, when its ack came.
type Acked = (u64, u64, Instant, Instant);

/// Publishes `{"k": k}` for k = 1, 2, … on `client` until `stop`; a
/// publish that fails is not retried. Records each acked k with its seq,
/// when its publish began and when its ack came.
fn publisher(
    client: Client,
    subject: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut k = 0;
        while !stop.load(Ordering::Acquire) {
            k += 1;
            let began = Instant::now();
            if let Ok(ack) = client.publish_stream(&subject, json!({ "k": k })) {
                acked
                    .lock()
                    .unwrap()
                    .push((k, ack.seq, began, Instant::now()));
            }
        }
        k
    })
}

/// Every acked k is in the stream once, at the seq it was acked with;
/// the stream holds each published k at most once, in publish order.
fn check_stream(read: &[(u64, u64)], acked: &[Acked], published: u64) {
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for &(seq, k) in read {
        assert!(k >= 1 && k <= published, "k {k} was never published");
        assert!(seen.insert(k, seq).is_none(), "k {k} stored twice");
    }
    let ks: Vec<u64> = read.iter().map(|r| r.1).collect();
    assert!(ks.windows(2).all(|w| w[0] < w[1]), "out of order: {ks:?}");
    for &(k, seq, _, _) in acked {
        assert_eq!(
            seen.get(&k),
            Some(&seq),
            "acked k {k} (seq {seq}) missing or moved"
        );
    }
}

/// docs/PROTOCOL.md "Replicated streams": a publisher on a node that does
/// not lead the stream keeps publishing while the leader is kill -9'd;
/// publishes work again within 5 s, and every acked message is there
/// once and in order, read through a consumer on a surviving node.
/// Prints the failover time.
#[test]
fn acked_publishes_survive_kill9_of_the_stream_leader() {
    let mut c = Cluster::start();
    let leader = create_r3(&c, "RK", "rk.>");
    let pub_node = (leader + 1) % 3;
    let read_node = (leader + 2) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let p = publisher(
        c.client(pub_node),
        "rk.x".into(),
        Arc::clone(&stop),
        Arc::clone(&acked),
    );
    let enough = |n: usize| {
        let deadline = Instant::now() + SERVE_WAIT;
        while acked.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "fewer than {n} publishes acked");
            thread::sleep(Duration::from_millis(5));
        }
    };
    enough(200);
    let before = acked.lock().unwrap().len();
    c.kill(leader);
    let killed = Instant::now();
    enough(before + 200);
    stop.store(true, Ordering::Release);
    let published = p.join().expect("the publisher");
    let acked = acked.lock().unwrap().clone();
    // The first publish begun after the kill and acked.
    let resumed = acked[before..]
        .iter()
        .find(|a| a.2 > killed)
        .map(|a| a.3)
        .expect("a publish begun after the kill and acked");
    let failover = resumed.duration_since(killed);
    println!(
        "RK: stream leader {} killed; publishes through {} acked again after {} ms \
         ({} acked, {published} published)",
        IDS[leader],
        IDS[pub_node],
        failover.as_millis(),
        acked.len()
    );
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );
    let read = read_stream(&c.client(read_node), "RK", "reader", SERVE_WAIT);
    check_stream(&read, &acked, published);
}

/// Every node killed and started again: the stream keeps every message
/// acked before, and its consumers' acked progress.
#[test]
fn a_whole_cluster_restart_keeps_every_acked_message() {
    let mut c = Cluster::start();
    create_r3(&c, "RR", "rr.>");
    let cl = c.client(1);
    let mut acked = Vec::new();
    for k in 1..=150u64 {
        let ack = cl
            .publish_stream("rr.x", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k}: {e}"));
        acked.push((k, ack.seq, Instant::now(), Instant::now()));
    }
    // A consumer that acked the first 50.
    call_until(
        &cl,
        "consumer.create",
        json!({"stream": "RR", "name": "half"}),
        SERVE_WAIT,
    );
    let got = call_until(
        &cl,
        "consumer.fetch",
        json!({"stream": "RR", "consumer": "half", "batch": 50}),
        SERVE_WAIT,
    );
    let first: Vec<u64> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(first, (1..=50).collect::<Vec<_>>());
    for seq in &first {
        cl.call(
            "ack",
            json!({"stream": "RR", "consumer": "half", "seq": seq}),
        )
        .unwrap_or_else(|e| panic!("ack {seq}: {e}"));
    }
    drop(cl);
    for i in 0..3 {
        c.kill(i);
    }
    c.restart_all(&[0, 1, 2]);
    let started = Instant::now();
    let c2 = c.client(2);
    let read = read_stream(&c2, "RR", "after", SERVE_WAIT);
    println!(
        "RR: whole cluster restarted, {} messages read back within {} ms",
        read.len(),
        started.elapsed().as_millis()
    );
    check_stream(&read, &acked, 150);
    assert_eq!(read.len(), 150);
    let got = call_until(
        &c2,
        "consumer.fetch",
        json!({"stream": "RR", "consumer": "half", "batch": 200, "no_wait": true}),
        SERVE_WAIT,
    );
    let next: Vec<u64> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(next, (51..=150).collect::<Vec<_>>(), "half's acks kept");
}

/// A consumer's acks answered `{ok}` survive the loss of the stream's
/// leader: after kill -9 of the leader, a fetch on a survivor delivers
/// the rest, never an acked message.
#[test]
fn acked_consumer_progress_survives_kill9_of_the_stream_leader() {
    let mut c = Cluster::start();
    let leader = create_r3(&c, "RC", "rc.>");
    let node = (leader + 1) % 3;
    let cl = c.client(node);
    for k in 1..=40u64 {
        cl.publish_stream("rc.x", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k}: {e}"));
    }
    call_until(
        &cl,
        "consumer.create",
        json!({"stream": "RC", "name": "work"}),
        SERVE_WAIT,
    );
    let got = call_until(
        &cl,
        "consumer.fetch",
        json!({"stream": "RC", "consumer": "work", "batch": 20}),
        SERVE_WAIT,
    );
    let mut done = Vec::new();
    for m in got["messages"].as_array().unwrap() {
        let seq = m["seq"].as_u64().unwrap();
        cl.call(
            "ack",
            json!({"stream": "RC", "consumer": "work", "seq": seq}),
        )
        .unwrap_or_else(|e| panic!("ack {seq}: {e}"));
        done.push(seq);
    }
    assert_eq!(done, (1..=20).collect::<Vec<_>>());
    c.kill(leader);
    let killed = Instant::now();
    let mut rest = Vec::new();
    let deadline = Instant::now() + SERVE_WAIT;
    loop {
        let got = call_until(
            &cl,
            "consumer.fetch",
            json!({"stream": "RC", "consumer": "work", "batch": 50, "no_wait": true}),
            SERVE_WAIT,
        );
        let msgs = got["messages"].as_array().cloned().unwrap_or_default();
        if msgs.is_empty() && !rest.is_empty() {
            break;
        }
        for m in msgs {
            let seq = m["seq"].as_u64().unwrap();
            assert!(!done.contains(&seq), "acked seq {seq} delivered again");
            if !rest.contains(&seq) {
                rest.push(seq);
            }
            call_until(
                &cl,
                "ack",
                json!({"stream": "RC", "consumer": "work", "seq": seq}),
                SERVE_WAIT,
            );
        }
        assert!(Instant::now() < deadline, "the rest never came: {rest:?}");
        thread::sleep(Duration::from_millis(10));
    }
    println!(
        "RC: leader {} killed; the consumer's remaining {} messages read within {} ms",
        IDS[leader],
        rest.len(),
        killed.elapsed().as_millis()
    );
    rest.sort_unstable();
    assert_eq!(rest, (21..=40).collect::<Vec<_>>());
}

/// An R2 stream on three nodes: the node holding no replica serves it
/// too (relayed through a member to the group's leader), publishes and
/// a consumer's fetch and acks alike.
#[test]
fn a_node_without_a_replica_serves_an_r2_stream() {
    let c = Cluster::start();
    call_until(
        &c.client(0),
        "stream.create",
        json!({"name": "R2", "subjects": ["r2.>"], "replicas": 2}),
        SERVE_WAIT,
    );
    // The cluster field, once the group has a leader, names both members.
    let deadline = Instant::now() + SERVE_WAIT;
    let members: Vec<String> = loop {
        let info = c.client(0).call("stream.info", json!({"name": "R2"}));
        if let Ok(info) = &info {
            let cl = &info["cluster"];
            if let Some(leader) = cl["leader"].as_str() {
                let mut m: Vec<String> = cl["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|r| r["node"].as_str().map(str::to_string))
                    .collect();
                m.push(leader.to_string());
                m.sort_unstable();
                break m;
            }
        }
        assert!(Instant::now() < deadline, "R2 never had a leader: {info:?}");
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(members.len(), 2, "{members:?}");
    let outside = (0..3)
        .find(|&i| !members.iter().any(|m| m == IDS[i]))
        .unwrap();
    let cl = c.client(outside);
    for k in 1..=20u64 {
        let ack = cl
            .publish_stream("r2.x", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k} on {}: {e}", IDS[outside]));
        assert_eq!((ack.stream.as_str(), ack.seq), ("R2", k));
    }
    let read = read_stream(&cl, "R2", "outside", SERVE_WAIT);
    let ks: Vec<u64> = read.iter().map(|r| r.1).collect();
    assert_eq!(ks, (1..=20).collect::<Vec<_>>());
}

/// Receives push deliveries on `sub` until every k of `want` came; acks
/// each one (retried until `{ok}`) and adds its seq to `acked`. A
/// delivery of a seq already in `acked` fails the test. Returns the
/// `(seq, k)` of every delivery.
fn take_pushes(
    cl: &Client,
    sub: &gombus::client::Subscription,
    want: &[u64],
    acked: &mut Vec<u64>,
    within: Duration,
) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut seen_k = Vec::new();
    while !want.iter().all(|k| seen_k.contains(k)) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "push deliveries missing: have k {seen_k:?}, want {want:?}"
        );
        let Ok(m) = sub.recv_timeout(left.min(Duration::from_millis(500))) else {
            continue;
        };
        let d = m
            .stream
            .clone()
            .expect("a push delivery names its stream message");
        assert_eq!((d.stream.as_str(), d.consumer.as_str()), ("RP", "push"));
        assert!(
            !acked.contains(&d.seq),
            "seq {} delivered again after its ack was answered ok",
            d.seq
        );
        let k = m.data["k"].as_u64().expect("k in data");
        got.push((d.seq, k));
        seen_k.push(k);
        call_until(
            cl,
            "ack",
            json!({"stream": "RP", "consumer": "push", "seq": d.seq}),
            SERVE_WAIT,
        );
        acked.push(d.seq);
    }
    got
}

/// docs/PROTOCOL.md "Replicated streams": a push consumer on an R3
/// stream gets every published message on its `deliver_subject`; after
/// kill -9 of the stream's leader the new leader goes on delivering, and
/// no message whose ack was answered `{ok}` is delivered again.
#[test]
fn a_push_consumer_on_an_r3_stream_survives_kill9_of_the_leader() {
    let mut c = Cluster::start();
    let leader = create_r3(&c, "RP", "rp.>");
    let node = (leader + 1) % 3;
    let cl = c.client(node);
    let sub = cl.subscribe("deliver.rp").expect("subscribe");
    call_until(
        &cl,
        "consumer.create",
        json!({"stream": "RP", "name": "push", "deliver_subject": "deliver.rp"}),
        SERVE_WAIT,
    );
    for k in 1..=40u64 {
        cl.publish_stream("rp.x", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k}: {e}"));
    }
    let mut acked = Vec::new();
    let first = take_pushes(
        &cl,
        &sub,
        &(1..=40).collect::<Vec<_>>(),
        &mut acked,
        SERVE_WAIT,
    );
    let mut seqs: Vec<u64> = first.iter().map(|d| d.0).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    c.kill(leader);
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // The survivors name the dead leader until one of them is elected.
    let deadline = Instant::now() + SERVE_WAIT;
    let new_leader = loop {
        let l = agreed_stream_group_leader(&c, &survivors, "RP", SERVE_WAIT, |_| true);
        if l != leader {
            break l;
        }
        assert!(Instant::now() < deadline, "no new leader of RP's group");
        thread::sleep(Duration::from_millis(20));
    };
    for k in 41..=80u64 {
        let deadline = Instant::now() + SERVE_WAIT;
        while let Err(e) = cl.publish_stream("rp.x", json!({ "k": k })) {
            assert!(Instant::now() < deadline, "publish {k}: {e}");
            thread::sleep(Duration::from_millis(20));
        }
    }
    let rest = take_pushes(
        &cl,
        &sub,
        &(41..=80).collect::<Vec<_>>(),
        &mut acked,
        SERVE_WAIT,
    );
    println!(
        "RP: leader {} killed; {} deliveries from the new leader {} within {} ms",
        IDS[leader],
        rest.len(),
        IDS[new_leader],
        killed.elapsed().as_millis()
    );
    // Nothing else comes: every message was acked once.
    let late = sub.recv_timeout(Duration::from_millis(300));
    if let Ok(m) = late {
        let seq = m.stream.map(|d| d.seq);
        assert!(
            seq.is_some_and(|s| !acked.contains(&s)),
            "acked seq {seq:?} delivered again"
        );
    }
}

/// docs/PROTOCOL.md "Replicated streams" (an R3 stream behaves as an R1
/// one): a message whose deliveries used up the consumer's `max_deliver`
/// and whose last `ack_wait` ran out is done with: no longer ack-pending,
/// never delivered again, and gone from a work queue, as on one node.
#[test]
fn a_delivery_out_of_max_deliver_is_finished_on_an_r3_stream() {
    let c = Cluster::start();
    call_until(
        &c.client(0),
        "stream.create",
        json!({"name": "MD", "subjects": ["md.>"], "replicas": 3, "retention": "workqueue"}),
        SERVE_WAIT,
    );
    agreed_stream_group_leader(&c, &[0, 1, 2], "MD", SERVE_WAIT, |_| true);
    let cl = c.client(1);
    call_until(
        &cl,
        "consumer.create",
        json!({"stream": "MD", "name": "once", "max_deliver": 1, "ack_wait_ms": 300}),
        SERVE_WAIT,
    );
    for k in 1..=3u64 {
        let ack = cl
            .publish_stream("md.x", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k}: {e}"));
        assert_eq!(ack.seq, k);
    }
    let got = call_until(
        &cl,
        "consumer.fetch",
        json!({"stream": "MD", "consumer": "once", "batch": 3, "expires_ms": 2000}),
        SERVE_WAIT,
    );
    let seqs: Vec<u64> = got["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["seq"].as_u64())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    call_until(
        &cl,
        "ack",
        json!({"stream": "MD", "consumer": "once", "seq": 2}),
        SERVE_WAIT,
    );
    // 1 and 3 are never acked: once their ack_wait runs out they are done.
    let deadline = Instant::now() + SERVE_WAIT;
    loop {
        let info = call_until(
            &cl,
            "consumer.info",
            json!({"stream": "MD", "name": "once"}),
            SERVE_WAIT,
        );
        let stream = call_until(&cl, "stream.info", json!({"name": "MD"}), SERVE_WAIT);
        let pending = info["consumer"]["num_ack_pending"].as_u64();
        let messages = stream["stream"]["state"]["messages"].as_u64();
        if pending == Some(0) && messages == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ack-pending {pending:?}, messages {messages:?}: {info} {stream}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let again = call_until(
        &cl,
        "consumer.fetch",
        json!({"stream": "MD", "consumer": "once", "batch": 3, "no_wait": true}),
        SERVE_WAIT,
    );
    assert_eq!(
        again["messages"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );
}
