//! Cluster mode, black box: three real `broker` processes on loopback
//! (tests/cluster_support), driven through the Rust client, `/control`
//! events, HTTP and python-socketio. Contract: docs/PROTOCOL.md §9
//! (replication, cross-node delivery, queue groups, streams owned by one
//! node, failover; replicated streams: `replicas`, the placement, the
//! stream groups and their failover), §6 (`cluster.status`, `group.set`)
//! and §7 (`/healthz`, raft gauges in `/metrics`).
//!
//! One cluster is shared by the cases that leave it healthy (each runs as a
//! named step; the test fails listing every failed step). Cases that kill,
//! stop or restart nodes get a cluster of their own.
//!
//! A subscribe is acked once it is applied on the node that took it; the
//! other nodes apply it within the replication delay. Before a case counts
//! messages that cross nodes, it publishes probes from the publishing node
//! until one reaches the subscription (bounded), so the count starts once
//! the route exists.

mod cluster_support;
#[path = "common/raw_ws.rs"]
mod raw_ws;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{agreed_stream_group_leader, http_get, Cluster, IDS, LEADER_WAIT};
use gombus::client::{
    Client, ConsumerConfig, Error, Event, Message, Options, StreamConfig, Subscription,
};
use serde_json::{json, Value};

/// Bound on any single cross-node delivery the tests wait for.
const DELIVERY_WAIT: Duration = Duration::from_secs(5);
/// The contract's bound on a replicated request while no leader is
/// reachable, plus scheduling slack for a loaded test host.
const UNAVAILABLE_BOUND: Duration = Duration::from_millis(5_750);
/// How long after a kill subscriptions are watched: past the moment the
/// survivors drop the dead node's subscriptions ("a few seconds";
/// docs/OPERATIONS.md says 3 s).
const CLEANUP_WATCH: Duration = Duration::from_secs(6);

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// Publishes `{probe: n}` on `probe` from `publisher` until `sub` receives
/// one (other messages are discarded), failing after `DELIVERY_WAIT`.
fn await_route(publisher: &Client, sub: &Subscription, probe: &str) {
    let deadline = Instant::now() + DELIVERY_WAIT;
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        publisher
            .publish(probe, json!({ "probe": n }))
            .expect("publish probe");
        let until = Instant::now() + Duration::from_millis(100);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match sub.recv_timeout(left) {
                Ok(m) if m.subject == probe => return,
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    panic!(
        "no probe on {probe} reached subscription {} within {DELIVERY_WAIT:?} ({n} sent)",
        sub.sid()
    );
}

/// The next `n` messages on `sub` whose subject is not `skip` (probes),
/// each within `DELIVERY_WAIT` of the previous one.
fn recv_n(sub: &Subscription, n: usize, skip: &str) -> Vec<Message> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match sub.recv_timeout(DELIVERY_WAIT) {
            Ok(m) if m.subject == skip => {}
            Ok(m) => got.push(m),
            Err(e) => panic!(
                "subscription {}: {} of {n} messages, then {e}",
                sub.sid(),
                got.len()
            ),
        }
    }
    got
}

/// Publishes one message on `subject` every 100 ms from `publisher` until
/// `until`, counting those `sub` receives (waiting at most `DELIVERY_WAIT`
/// for the last ones); (sent, received).
fn watch_delivery(
    publisher: &Client,
    sub: &Subscription,
    subject: &str,
    until: Instant,
) -> (u64, u64) {
    let (mut sent, mut got) = (0u64, 0u64);
    while Instant::now() < until {
        sent += 1;
        publisher.publish(subject, json!({ "k": sent })).unwrap();
        let tick_end = Instant::now() + Duration::from_millis(100);
        while let Some(left) = tick_end.checked_duration_since(Instant::now()) {
            match sub.recv_timeout(left) {
                Ok(m) => got += u64::from(m.subject == subject),
                Err(_) => break,
            }
        }
    }
    let drain_until = Instant::now() + DELIVERY_WAIT;
    while got < sent {
        let left = drain_until.saturating_duration_since(Instant::now());
        match sub.recv_timeout(left) {
            Ok(m) => got += u64::from(m.subject == subject),
            Err(_) => break,
        }
    }
    (sent, got)
}

/// The `state` node `i` reports for peer `id` in its `cluster.status`.
fn peer_state(c: &Cluster, i: usize, id: &str) -> Option<String> {
    let status = c.status(i).ok()?;
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["id"] == json!(id))
        .and_then(|p| p["state"].as_str())
        .map(str::to_string)
}

/// Runs one named case; a panic becomes an entry in `failed`.
fn step(failed: &mut Vec<String>, name: &str, body: impl FnOnce()) {
    let started = Instant::now();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(()) => println!("PASS {name} ({} ms)", started.elapsed().as_millis()),
        Err(e) => {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            println!("FAIL {name}: {why}");
            failed.push(format!("{name}: {why}"));
        }
    }
}

/// Fails the test if any step failed; the cluster, dropped while this
/// unwinds, prints every node's log.
fn finish(failed: &[String]) {
    if !failed.is_empty() {
        panic!("{} case(s) failed:\n{}", failed.len(), failed.join("\n"));
    }
}

fn ok(v: Value) -> Value {
    assert_eq!(v["ok"], json!(true), "expected ok:true, got {v}");
    v
}

fn group_rules(control: &Client) -> Vec<Value> {
    let v = ok(control.call("group.list", json!({})).expect("group.list"));
    v["groups"].as_array().cloned().unwrap_or_default()
}

fn has_rule(control: &Client, queue: &str, mode: &str) -> bool {
    group_rules(control)
        .iter()
        .any(|g| g["queue"] == json!(queue) && g["mode"] == json!(mode))
}

/// Waits until `i`'s subscribe succeeds (retrying `unavailable` while a new
/// leader settles), bounded by `within`.
fn subscribe_when_ready(client: &Client, subject: &str, within: Duration) -> Subscription {
    let deadline = Instant::now() + within;
    loop {
        match client.subscribe(subject) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("subscribe {subject}: {e}; retrying");
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("subscribe {subject} still failing after {within:?}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Cases on one shared, healthy cluster.
// ---------------------------------------------------------------------------

#[test]
fn shared_cluster_cases() {
    let c = Cluster::start();
    let mut failed = Vec::new();
    step(&mut failed, "status_agrees_on_all_nodes", || {
        status_agrees(&c)
    });
    // Before any other step has subscribed: it counts subscriptions.
    step(
        &mut failed,
        "a_repeated_connect_on_n1_leaves_no_subscription_on_any_node",
        || repeated_connect_across_nodes(&c),
    );
    step(&mut failed, "publish_on_n1_and_n3_reaches_n2", || {
        pubsub_across_nodes(&c)
    });
    step(
        &mut failed,
        "a_burst_across_nodes_arrives_whole_in_order",
        || burst_across_nodes(&c),
    );
    step(
        &mut failed,
        "queue_group_spans_nodes_3000_exactly_once",
        || queue_group_spans_nodes(&c),
    );
    step(&mut failed, "request_on_n1_answered_on_n3", || {
        request_across_nodes(&c)
    });
    step(&mut failed, "group_rule_set_on_n1_in_force_on_n3", || {
        group_rule_across_nodes(&c)
    });
    step(&mut failed, "stream_created_on_n1_usable_from_n2", || {
        stream_across_nodes(&c)
    });
    step(
        &mut failed,
        "replicas_checked_and_the_placement_known_on_every_node",
        || replicated_stream_placement(&c),
    );
    step(
        &mut failed,
        "r3_leader_current_and_lag_agree_on_every_node",
        || r3_cluster_field_agrees(&c),
    );
    step(
        &mut failed,
        "an_r3_stream_takes_publishes_right_after_its_create",
        || r3_serves_after_create(&c),
    );
    step(&mut failed, "python_socketio_across_nodes", || {
        python_across_nodes(&c)
    });
    finish(&failed);
}

/// docs/PROTOCOL.md §2: a repeated CONNECT to `/` replaces the socket,
/// and what the old one held is removed through the replicated path; a
/// later connection on the same node (and slot) gets none of it. Runs
/// while no other client holds subscriptions, so the counts are its own.
fn repeated_connect_across_nodes(c: &Cluster) {
    let controls: Vec<Client> = (0..3).map(|i| c.control(i)).collect();
    let before: Vec<u64> = controls.iter().map(subscription_count).collect();
    let settle = |extra: u64, what: &str| {
        let deadline = Instant::now() + LEADER_WAIT;
        for (i, control) in controls.iter().enumerate() {
            loop {
                let n = subscription_count(control);
                if n == before[i] + extra {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{what}: node {} counts {n} subscriptions, expected {}",
                    IDS[i],
                    before[i] + extra
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let mut a = raw_ws::Ws::join(&c.http[0]);
    let ack = a.call("sub", r#"{"subject":"cl.secret","sid":"orphan"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    settle(1, "after the subscribe");
    let again = a.connect();
    assert!(again.starts_with("0{\"sid\":"), "{again}");
    settle(0, "after the repeated CONNECT");
    let ack = a.call("sub", r#"{"subject":"cl.secret","sid":"orphan2"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    settle(1, "after a subscribe on the new socket");
    a.close();
    settle(0, "after the close");
    // A bystander on n1 gets nothing of it; the mark comes after.
    let mut b = raw_ws::Ws::join(&c.http[0]);
    let ack = b.call("sub", r#"{"subject":"cl.mark","sid":"mine"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    settle(1, "after the bystander's subscribe");
    let publisher = c.client(1);
    publisher
        .publish("cl.secret", json!("not for you"))
        .expect("publish");
    publisher.publish("cl.mark", json!("end")).expect("publish");
    b.next(|p| p.contains("\"subject\":\"cl.mark\""));
    let msgs = b.take_msgs();
    assert!(msgs.is_empty(), "the bystander also got {msgs:?}");
    b.close();
    settle(0, "after the bystander left");
}

fn status_agrees(c: &Cluster) {
    let statuses: Vec<Value> = (0..3)
        .map(|i| ok(c.status(i).expect("cluster.status")))
        .collect();
    let leader = statuses[0]["leader"].clone();
    let term = statuses[0]["term"].clone();
    assert!(leader.is_string(), "no leader in {}", statuses[0]);
    assert!(
        term.as_u64().is_some_and(|t| t >= 1),
        "bad term in {}",
        statuses[0]
    );
    for (i, s) in statuses.iter().enumerate() {
        assert_eq!(s["node_id"], json!(IDS[i]), "{s}");
        assert_eq!(
            s["leader"], leader,
            "{} disagrees on the leader: {s}",
            IDS[i]
        );
        assert_eq!(s["term"], term, "{} disagrees on the term: {s}", IDS[i]);
        assert!(s["commit_index"].as_u64().is_some(), "{s}");
        let peers = s["peers"].as_array().expect("peers array");
        let ids: BTreeSet<&str> = peers.iter().filter_map(|p| p["id"].as_str()).collect();
        assert_eq!(ids, IDS.into_iter().collect(), "{} peers: {s}", IDS[i]);
        for p in peers {
            let state = p["state"].as_str().unwrap_or("");
            assert!(
                ["leader", "follower", "candidate", "unreachable"].contains(&state),
                "peer state {state:?} in {s}"
            );
            assert!(p.get("match_index").is_some(), "match_index in {s}");
        }
    }
    // The leader's own view: itself leading, the others following.
    let l = IDS
        .iter()
        .position(|id| json!(id) == leader)
        .expect("leader id");
    for p in statuses[l]["peers"].as_array().unwrap() {
        let want = if p["id"] == leader {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(p["state"], json!(want), "leader's view: {}", statuses[l]);
        assert!(
            p["match_index"].as_u64().is_some(),
            "leader's view: {}",
            statuses[l]
        );
    }
    for (addr, id) in c.http.iter().zip(IDS) {
        let (code, body) = http_get(addr, "/healthz");
        assert_eq!(code, 200, "{id} /healthz: {body}");
        let (code, body) = http_get(addr, "/metrics");
        assert_eq!(code, 200);
        assert_eq!(
            gauge(&body, "gombus_raft_term"),
            term.as_f64(),
            "{id} /metrics term:\n{body}"
        );
        let leads = gauge(&body, "gombus_raft_leader");
        assert_eq!(
            leads,
            Some(if json!(id) == leader { 1.0 } else { 0.0 }),
            "{id}:\n{body}"
        );
    }
}

/// The value of an unlabelled gauge in a Prometheus text body.
fn gauge(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn pubsub_across_nodes(c: &Cluster) {
    let (p1, s2, p3) = (c.client(0), c.client(1), c.client(2));
    let sub = s2.subscribe("c1.>").expect("subscribe on n2");
    await_route(&p1, &sub, "c1.probe");
    await_route(&p3, &sub, "c1.probe");
    for k in 0..10 {
        p1.publish("c1.from.n1", json!({ "k": k })).unwrap();
        p3.publish("c1.from.n3", json!({ "k": k })).unwrap();
    }
    let got = recv_n(&sub, 20, "c1.probe");
    let mut seen: BTreeSet<(String, u64)> = BTreeSet::new();
    for m in &got {
        let k = m.data["k"].as_u64().expect("k");
        assert!(seen.insert((m.subject.clone(), k)), "twice: {m:?}");
    }
    for k in 0..10 {
        assert!(seen.contains(&("c1.from.n1".into(), k)), "missing n1 #{k}");
        assert!(seen.contains(&("c1.from.n3".into(), k)), "missing n3 #{k}");
    }
    // Per publisher, the order is kept.
    for from in ["c1.from.n1", "c1.from.n3"] {
        let ks: Vec<u64> = got
            .iter()
            .filter(|m| m.subject == from)
            .map(|m| m.data["k"].as_u64().unwrap())
            .collect();
        assert_eq!(ks, (0..10).collect::<Vec<_>>(), "order from {from}");
    }
    assert!(sub
        .recv_timeout(Duration::from_millis(200))
        .is_err_and(|e| e == Error::Timeout));
}

/// Publishes faster than one event carries between nodes, so forward
/// batches pile up on the link and are gathered: every message still
/// arrives, once and in order (a gathered event once outgrew the peer's
/// payload limit, which dropped the link and its queue).
fn burst_across_nodes(c: &Cluster) {
    const PUBLISHERS: u64 = 4;
    const N: u64 = 10_000;
    let s2 = c.client(1);
    let sub = s2.subscribe("burst.>").expect("subscribe on n2");
    let publishers: Vec<Client> = (0..PUBLISHERS).map(|_| c.client(0)).collect();
    await_route(&publishers[0], &sub, "burst.probe");
    let pad = "x".repeat(1000);
    thread::scope(|scope| {
        for (p, client) in publishers.iter().enumerate() {
            let pad = &pad;
            scope.spawn(move || {
                let subject = format!("burst.p{p}");
                for k in 0..N {
                    client
                        .publish(&subject, json!({ "k": k, "pad": pad }))
                        .expect("publish");
                }
            });
        }
    });
    let got = recv_n(&sub, (PUBLISHERS * N) as usize, "burst.probe");
    for p in 0..PUBLISHERS {
        let subject = format!("burst.p{p}");
        let ks: Vec<u64> = got
            .iter()
            .filter(|m| m.subject == subject)
            .filter_map(|m| m.data["k"].as_u64())
            .collect();
        assert_eq!(ks.len() as u64, N, "from publisher {p}");
        assert!(
            ks.iter().enumerate().all(|(i, &k)| k == i as u64),
            "publisher {p}'s messages out of order"
        );
    }
    assert_eq!(sub.dropped(), 0, "the client's queue dropped messages");
}

fn queue_group_spans_nodes(c: &Cluster) {
    const TOTAL: u64 = 3_000;
    let clients: Vec<Client> = (0..3).map(|i| c.client(i)).collect();
    let subs: Vec<Subscription> = clients
        .iter()
        .map(|cl| {
            cl.queue_subscribe("c2.work", "c2-workers")
                .expect("queue sub")
        })
        .collect();
    // Every node publishes a third; each has a member of its own, so no
    // message can find the group empty while the others' members spread.
    let per_node = TOTAL / 3;
    thread::scope(|s| {
        for (i, cl) in clients.iter().enumerate() {
            s.spawn(move || {
                for k in 0..per_node {
                    let id = i as u64 * per_node + k;
                    cl.publish("c2.work", json!({ "id": id })).expect("publish");
                }
                cl.ping().expect("ping after publishing");
            });
        }
    });
    let mut count: BTreeMap<u64, u32> = BTreeMap::new();
    let mut per_member = [0u64; 3];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut quiet_since: Option<Instant> = None;
    // Read until every id arrived, then keep reading for a quiet 500 ms so
    // that a late duplicate is still counted.
    loop {
        let mut any = false;
        for (j, sub) in subs.iter().enumerate() {
            while let Ok(Some(m)) = sub.try_recv() {
                let id = m.data["id"].as_u64().expect("id");
                *count.entry(id).or_default() += 1;
                per_member[j] += 1;
                any = true;
            }
        }
        if any {
            quiet_since = None;
        } else if count.len() as u64 == TOTAL {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(500) {
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        if !any {
            thread::sleep(Duration::from_millis(5));
        }
    }
    println!("queue group: per member (n1, n2, n3) {per_member:?}");
    let missing: Vec<u64> = (0..TOTAL).filter(|id| !count.contains_key(id)).collect();
    let twice: Vec<(&u64, &u32)> = count.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        missing.is_empty(),
        "{} of {TOTAL} never arrived (first: {:?})",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        twice.is_empty(),
        "{} delivered more than once: {:?}",
        twice.len(),
        &twice[..twice.len().min(10)]
    );
    assert_eq!(per_member.iter().sum::<u64>(), TOTAL);
    assert!(
        per_member.iter().all(|&n| n > 0),
        "a member got nothing: {per_member:?}"
    );
    for s in subs {
        assert_eq!(s.dropped(), 0);
    }
}

fn request_across_nodes(c: &Cluster) {
    let (requester, responder) = (c.client(0), c.client(2));
    let sub = responder.subscribe("c3.svc").expect("responder sub on n3");
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let Ok(m) = sub.recv_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                if let Some(reply) = &m.reply {
                    let answer = json!({ "answer": m.data["q"], "by": "n3" });
                    responder.publish(reply, answer).expect("reply");
                }
            }
        });
        let result = catch_unwind(AssertUnwindSafe(|| {
            // The first request may come before n1 knows the responder.
            let deadline = Instant::now() + DELIVERY_WAIT;
            loop {
                match requester.request("c3.svc", json!({ "q": -1 }), Duration::from_millis(500)) {
                    Ok(_) => break,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("first request: {e}");
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("no request answered within {DELIVERY_WAIT:?}: {e}"),
                }
            }
            for q in 0..20 {
                let m = requester
                    .request("c3.svc", json!({ "q": q }), Duration::from_secs(2))
                    .unwrap_or_else(|e| panic!("request {q}: {e}"));
                assert_eq!(m.data, json!({ "answer": q, "by": "n3" }));
            }
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    });
}

fn group_rule_across_nodes(c: &Cluster) {
    let ctl1 = c.control(0);
    ok(ctl1
        .call(
            "group.set",
            json!({ "queue": "c4-fanout", "mode": "broadcast" }),
        )
        .expect("group.set on n1"));
    let ctl3 = c.control(2);
    let deadline = Instant::now() + DELIVERY_WAIT;
    while !has_rule(&ctl3, "c4-fanout", "broadcast") {
        assert!(
            Instant::now() < deadline,
            "n3 never listed the rule: {:?}",
            group_rules(&ctl3)
        );
        thread::sleep(Duration::from_millis(20));
    }
    let (p1, m3a, m3b) = (c.client(0), c.client(2), c.client(2));
    let a = m3a
        .queue_subscribe("c4.>", "c4-fanout")
        .expect("member a on n3");
    let b = m3b
        .queue_subscribe("c4.>", "c4-fanout")
        .expect("member b on n3");
    // Both members must be known on n1: probe until each saw one.
    await_route(&p1, &a, "c4.probe");
    await_route(&p1, &b, "c4.probe");
    for k in 0..20 {
        p1.publish("c4.data", json!({ "k": k })).unwrap();
    }
    for (name, sub) in [("a", &a), ("b", &b)] {
        let ks: Vec<u64> = recv_n(sub, 20, "c4.probe")
            .iter()
            .map(|m| m.data["k"].as_u64().unwrap())
            .collect();
        assert_eq!(ks, (0..20).collect::<Vec<_>>(), "member {name} on n3");
    }
}

/// `stream.info` through `client` once its node knows the stream (the
/// metadata reaches the other nodes within the replication delay); prints
/// that delay when it was not zero.
fn await_stream(client: &Client, name: &str, node: &str) -> gombus::client::StreamInfo {
    let started = Instant::now();
    let mut misses = 0;
    loop {
        match client.stream_info(name) {
            Ok(info) => {
                if misses > 0 {
                    println!(
                        "{node} answered stream.info {name} after {misses} not_found ({} ms)",
                        started.elapsed().as_millis()
                    );
                }
                return info;
            }
            Err(e) if e.code() == Some("not_found") && started.elapsed() < DELIVERY_WAIT => {
                misses += 1;
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("stream.info {name} on {node}: {e}"),
        }
    }
}

fn stream_across_nodes(c: &Cluster) {
    let (c1, c2, c3) = (c.client(0), c.client(1), c.client(2));
    let created = c1
        .stream_create(&StreamConfig::new("C5", &["c5.>"]))
        .expect("stream.create on n1");
    assert_eq!(created.state.messages, 0);
    // Visible from n2 (metadata is replicated; the request is forwarded).
    let info = await_stream(&c2, "C5", "n2");
    assert_eq!(info.config["name"], json!("C5"));
    assert_eq!(info.config["subjects"], json!(["c5.>"]));
    // Publishes on n2 are captured by the stream that lives on n1.
    for k in 1..=5u64 {
        let ack = c2
            .publish_stream("c5.orders", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k} on n2: {e}"));
        assert_eq!((ack.stream.as_str(), ack.seq), ("C5", k));
    }
    assert_eq!(c1.stream_info("C5").unwrap().state.messages, 5);
    assert_eq!(await_stream(&c3, "C5", "n3").state.last_seq, 5);
    // A consumer created, fetched and acked through n2.
    c2.consumer_create("C5", &ConsumerConfig::new("c5-pull"))
        .expect("consumer.create on n2");
    let msgs = c2
        .fetch("C5", "c5-pull", 5, Some(Duration::from_secs(2)))
        .expect("fetch on n2");
    let seqs: Vec<u64> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    assert_eq!(msgs[2].data, json!({ "k": 3 }));
    for m in &msgs {
        c2.ack("C5", "c5-pull", m.seq).expect("ack on n2");
    }
    let ci = c1
        .consumer_info("C5", "c5-pull")
        .expect("consumer.info on n1");
    assert_eq!(ci.ack_floor.stream_seq, 5, "{ci:?}");
    assert_eq!(ci.num_ack_pending, 0, "{ci:?}");
    assert_eq!(ci.num_pending, 0, "{ci:?}");
    let again = c2.fetch("C5", "c5-pull", 5, None).expect("fetch no_wait");
    assert!(again.is_empty(), "acked messages came again: {again:?}");
    // stream.get through n3.
    assert_eq!(c3.stream_get("C5", 4).unwrap().data, json!({ "k": 4 }));
}

/// The `cluster` field of `stream.info` through `client`, once it lists
/// `replicas` other nodes (the placement reaches every node within the
/// replication delay).
fn await_cluster_field(client: &Client, name: &str, replicas: usize, node: &str) -> Value {
    let deadline = Instant::now() + DELIVERY_WAIT;
    loop {
        let last = client.call("stream.info", json!({ "name": name }));
        if let Ok(info) = &last {
            let listed = info["cluster"]["replicas"].as_array().map(Vec::len);
            if listed == Some(replicas) {
                return info["cluster"].clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "stream.info {name} on {node} never listed {replicas} replicas: {last:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// docs/PROTOCOL.md "Replicated streams": `replicas` is checked against
/// the cluster's size, the placement is recorded through the control
/// group so every node reports it, and a repeated create must ask for
/// the same count. The stream is served by its group's leader, which
/// every node reports as `leader`, the two other members as replicas.
fn replicated_stream_placement(c: &Cluster) {
    let (c1, c2, c3) = (c.client(0), c.client(1), c.client(2));
    let create = |replicas: Value| {
        c1.call(
            "stream.create",
            json!({"name": "R3", "subjects": ["r3.>"], "replicas": replicas}),
        )
    };
    for bad in [json!(4), json!(0), json!(-1), json!("3"), json!(1.5)] {
        let e = create(bad.clone()).expect_err("a bad replicas count");
        assert_eq!(e.code(), Some("bad_request"), "replicas {bad}: {e}");
    }
    let created = create(json!(3)).expect("stream.create R3 with 3 replicas");
    assert_eq!(created["stream"]["config"]["name"], json!("R3"));
    for (i, client) in [&c1, &c2, &c3].into_iter().enumerate() {
        let cluster = await_cluster_field(client, "R3", 2, IDS[i]);
        // Nodes are named by their node ids, as cluster.status names them.
        let leader = cluster["leader"].as_str();
        assert!(
            leader.is_some_and(|l| IDS.contains(&l)),
            "on {}: {cluster}",
            IDS[i]
        );
        let mut nodes: Vec<&str> = cluster["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["node"].as_str().expect("a replica's node id"))
            .chain(leader)
            .collect();
        nodes.sort_unstable();
        assert_eq!(nodes, IDS.to_vec(), "on {}: {cluster}", IDS[i]);
    }
    // Each of the three nodes runs the stream's Raft group (the cluster's
    // first, group 1) with its log in a directory of its own: its first
    // leader's entry reaches every member's log.
    let deadline = Instant::now() + DELIVERY_WAIT;
    for (i, node) in IDS.iter().enumerate() {
        let log = c.data_dir(i).join("raft/g1/log");
        while std::fs::metadata(&log).map_or(0, |m| m.len()) == 0 {
            assert!(
                Instant::now() < deadline,
                "no entry in {} on {node}",
                log.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
    // The same create again is answered as before; another count is not.
    create(json!(3)).expect("the same create again");
    let e = create(json!(2)).expect_err("another replica count");
    assert_eq!(e.code(), Some("exists"), "{e}");
    // Publishes from n2 are acked in order and readable from n3.
    for k in 1..=3u64 {
        let ack = c2
            .publish_stream("r3.k", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k} on n2: {e}"));
        assert_eq!((ack.stream.as_str(), ack.seq), ("R3", k));
    }
    assert_eq!(c3.stream_get("R3", 2).unwrap().data, json!({ "k": 2 }));
    // An R1 stream reports its owner as leader and no replicas.
    let r1 = await_cluster_field(&c3, "C5", 0, "n3");
    assert_eq!(r1["leader"], json!("n1"), "{r1}");
    // Each entry of stream.list carries it too, whichever node answers.
    let listed = c2
        .call("stream.list", json!({}))
        .expect("stream.list on n2");
    let entry = |name: &str| {
        listed["streams"]
            .as_array()
            .and_then(|l| l.iter().find(|s| s["config"]["name"] == json!(name)))
            .map(|s| s["cluster"].clone())
            .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
    };
    assert!(entry("R3")["leader"].is_string(), "{listed}");
    assert_eq!(entry("R3")["replicas"].as_array().map(Vec::len), Some(2));
    assert_eq!(entry("C5")["replicas"], json!([]), "{listed}");
}

/// A replica as a `cluster` field lists it: node, `current`, `lag`.
type ReplicaView = (String, bool, u64);

/// A `cluster` field reduced to what every node must agree on: the
/// leader, and each replica's node, `current` and `lag` (None: a field
/// is missing, or `lag` is not an integer).
fn cluster_view(cluster: &Value) -> Option<(String, Vec<ReplicaView>)> {
    let leader = cluster["leader"].as_str()?.to_string();
    let mut replicas = Vec::new();
    for r in cluster["replicas"].as_array()? {
        let node = r["node"].as_str()?.to_string();
        replicas.push((node, r["current"].as_bool()?, r["lag"].as_u64()?));
    }
    replicas.sort();
    Some((leader, replicas))
}

/// docs/PROTOCOL.md "Replicated streams": `stream.info` carries `cluster`
/// in its `stream` object (beside `config` and `state`) as each
/// `stream.list` entry does, and whichever node is asked, leader,
/// `current` and `lag` (an integer) are the leader's: a node that does
/// not lead the stream asks its leader.
fn r3_cluster_field_agrees(c: &Cluster) {
    let clients = [c.client(0), c.client(1), c.client(2)];
    cluster_support::call_until(
        &clients[1],
        "stream.create",
        json!({"name": "R3LAG", "subjects": ["r3lag.>"], "replicas": 3}),
        DELIVERY_WAIT,
    );
    agreed_stream_group_leader(c, &[0, 1, 2], "R3LAG", DELIVERY_WAIT, |_| true);
    for k in 1..=5u64 {
        let ack = clients[(k % 3) as usize]
            .publish_stream("r3lag.k", json!({ "k": k }))
            .unwrap_or_else(|e| panic!("publish {k} to R3LAG: {e}"));
        assert_eq!(ack.seq, k);
    }
    // Polled: the replicas catch up within a heartbeat or two.
    let deadline = Instant::now() + DELIVERY_WAIT;
    loop {
        let mut views = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let info = client.call("stream.info", json!({ "name": "R3LAG" }));
            let info = info.map(|v| v["stream"]["cluster"].clone());
            let list = client.call("stream.list", json!({}));
            let entry = list.map(|l| {
                l["streams"]
                    .as_array()
                    .and_then(|l| l.iter().find(|s| s["config"]["name"] == json!("R3LAG")))
                    .map_or(Value::Null, |s| s["cluster"].clone())
            });
            views.push((IDS[i], "stream.info", info));
            views.push((IDS[i], "stream.list", entry));
        }
        let seen: Vec<_> = views
            .iter()
            .map(|(_, _, v)| v.as_ref().ok().and_then(cluster_view))
            .collect();
        let agreed = seen[0]
            .as_ref()
            .is_some_and(|first| first.1.len() == 2 && first.1.iter().all(|r| r.1 && r.2 == 0))
            && seen.iter().all(|v| *v == seen[0]);
        if agreed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes never agreed on R3LAG's leader, current and integer lag: {views:#?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// docs/PROTOCOL.md "Replicated streams": the create of an R3 stream is
/// acked once its group has a leader, so publishes made right after it
/// (no sleep, no retry) are each acked with the next seq.
fn r3_serves_after_create(c: &Cluster) {
    let client = c.client(1);
    let t0 = Instant::now();
    client
        .call(
            "stream.create",
            json!({"name": "R3NOW", "subjects": ["r3now.>"], "replicas": 3}),
        )
        .expect("stream.create R3NOW");
    eprintln!(
        "stream.create of an R3 stream acked after {:?}",
        t0.elapsed()
    );
    // 4 MiB in 64 KiB messages.
    let pad = "x".repeat(64 << 10);
    for k in 1..=64u64 {
        let ack = client
            .publish_stream("r3now.k", json!({ "k": k, "pad": pad }))
            .unwrap_or_else(|e| panic!("publish {k} right after the create: {e}"));
        assert_eq!((ack.stream.as_str(), ack.seq), ("R3NOW", k));
    }
}

// ---------------------------------------------------------------------------
// python-socketio across nodes (tests/interop/py_cluster.py).
// ---------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The script connects python-socketio to n2 and subscribes, prints
/// `READY`, waits for a message this test publishes on n1, then publishes
/// from python-socketio on n3 to a Rust subscriber on n1.
fn python_across_nodes(c: &Cluster) {
    let python = repo_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `scripts/test-deps.sh` (or `make test`) to install the interop clients",
        python.display()
    );
    let (c1, c3) = (c.client(0), c.client(2));
    let to_rust = c1.subscribe("interop.cluster.to_rust").expect("sub on n1");
    await_route(&c3, &to_rust, "interop.cluster.to_rust");
    let mut child = Command::new(&python)
        .arg(repo_root().join("tests/interop/py_cluster.py"))
        .arg(format!("http://{}", c.http[1]))
        .arg(format!("http://{}", c.http[2]))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start py_cluster.py");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let err_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let mut lines = Vec::new();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let next = |lines: &mut Vec<String>, within: Duration| -> Option<String> {
            let l = rx.recv_timeout(within).ok()?;
            lines.push(l.clone());
            Some(l)
        };
        // READY: python's subscription on n2 is acked.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match next(&mut lines, left) {
                Some(l) if l == "READY" => break,
                Some(l) if l.starts_with("FAIL") => panic!("script: {l}"),
                Some(_) => {}
                None => panic!("no READY from the script: {lines:?}"),
            }
        }
        // Publish on n1 until the script reports the delivery (the route to
        // n2 may take the replication delay to appear).
        let mut sent = 0;
        loop {
            sent += 1;
            c1.publish(
                "interop.cluster.to_py",
                json!({ "from": "rust", "n": sent }),
            )
            .unwrap();
            match next(&mut lines, Duration::from_millis(100)) {
                Some(l) if l.starts_with("PASS to_python") => break,
                Some(l) if l.starts_with("FAIL") => panic!("script: {l}"),
                Some(_) => {}
                None if Instant::now() < deadline && sent < 50 => {}
                None => panic!("python on n2 got nothing after {sent} publishes on n1: {lines:?}"),
            }
        }
        let m = loop {
            match to_rust.recv_timeout(DELIVERY_WAIT) {
                Ok(m) if m.data.get("probe").is_some() => {}
                Ok(m) => break m,
                Err(e) => panic!("no message from python on n3: {e}; script said {lines:?}"),
            }
        };
        assert_eq!(m.data, json!({ "from": "python", "via": "n3" }));
        while let Some(l) = next(&mut lines, Duration::from_secs(10)) {
            if l.starts_with("summary:") {
                break;
            }
        }
        assert!(
            lines.iter().all(|l| !l.starts_with("FAIL")),
            "script failed: {lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("PASS relayed_stream_answer")),
            "the relayed stream check did not run: {lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("PASS replicated_stream_info")),
            "the replicated stream check did not run: {lines:?}"
        );
    }));
    let _ = child.kill();
    let status = child.wait();
    let _ = reader.join();
    let stderr_text = err_reader.join().unwrap_or_default();
    if let Err(e) = outcome {
        eprintln!("py_cluster.py status {status:?}\nstdout: {lines:?}\nstderr:\n{stderr_text}");
        std::panic::resume_unwind(e);
    }
}

// ---------------------------------------------------------------------------
// The leader is killed.
// ---------------------------------------------------------------------------

#[test]
fn leader_kill_fails_over_keeping_subscriptions_and_cursors() {
    let mut c = Cluster::start();
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    // The stream's owner must survive: it is a follower.
    let owner = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    println!(
        "leader {} (term {term}), stream owner {}, other {}",
        IDS[leader], IDS[owner], IDS[other]
    );
    let (co, cf) = (c.client(owner), c.client(other));

    // A stream on the owner; a consumer acked half way through the other.
    co.stream_create(&StreamConfig::new("FO", &["fo.stream.>"]))
        .expect("stream.create");
    await_stream(&cf, "FO", IDS[other]);
    for k in 1..=10u64 {
        let ack = cf
            .publish_stream("fo.stream.x", json!({ "k": k }))
            .expect("publish_stream");
        assert_eq!(ack.seq, k);
    }
    cf.consumer_create("FO", &ConsumerConfig::new("fo-pull"))
        .expect("consumer.create");
    let first = cf
        .fetch("FO", "fo-pull", 5, Some(Duration::from_secs(2)))
        .expect("fetch");
    assert_eq!(
        first.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    for m in &first {
        cf.ack("FO", "fo-pull", m.seq).expect("ack");
    }
    let ci = co.consumer_info("FO", "fo-pull").expect("consumer.info");
    assert_eq!(ci.ack_floor.stream_seq, 5, "{ci:?}");

    // Subscriptions on both survivors, routes known across.
    let sub_o = co.subscribe("fo.live.>").expect("sub on owner");
    let sub_f = cf.subscribe("fo.live.>").expect("sub on other");
    await_route(&cf, &sub_o, "fo.live.probe");
    await_route(&co, &sub_f, "fo.live.probe");
    // A client of the leader, to be cut off by the kill.
    let cl = c.client(leader);
    let _doomed = cl.subscribe("fo.live.>").expect("sub on leader");

    let killed = Instant::now();
    c.kill(leader);
    // Delivery between the survivors on a subscription made before.
    await_route(&cf, &sub_o, "fo.live.probe");
    println!(
        "failover: kill -> first delivery on an existing subscription: {} ms",
        killed.elapsed().as_millis()
    );
    let survivors = [owner, other];
    let (new_leader, new_term) = c.await_leader(&survivors, Duration::from_secs(5));
    let elected = killed.elapsed();
    assert!(new_term > term, "term {new_term} after {term}");
    println!(
        "failover: {} killed, {} leads (term {new_term}) after {} ms",
        IDS[leader],
        IDS[new_leader],
        elected.as_millis()
    );
    assert!(elected < Duration::from_secs(5), "{elected:?}");

    // A new subscription on a survivor, delivered from the other survivor.
    let fresh_client = c.client(owner);
    let fresh = subscribe_when_ready(&fresh_client, "fo.after.>", Duration::from_secs(5));
    await_route(&cf, &fresh, "fo.after.probe");
    let delivered = killed.elapsed();
    println!(
        "failover: kill -> first delivery to a subscription made after the kill: {} ms",
        delivered.as_millis()
    );

    // The subscriptions made before the kill still deliver, both ways.
    for k in 0..10 {
        cf.publish("fo.live.from_other", json!({ "k": k })).unwrap();
        co.publish("fo.live.from_owner", json!({ "k": k })).unwrap();
    }
    let on_owner: Vec<Message> = recv_n(&sub_o, 20, "fo.live.probe");
    let from_other = on_owner
        .iter()
        .filter(|m| m.subject == "fo.live.from_other")
        .count();
    assert_eq!(from_other, 10, "owner's sub: {on_owner:?}");
    let on_other: Vec<Message> = recv_n(&sub_f, 20, "fo.live.probe");
    let from_owner = on_other
        .iter()
        .filter(|m| m.subject == "fo.live.from_owner")
        .count();
    assert_eq!(from_owner, 10, "other's sub: {on_other:?}");
    let fresh_other = cf.subscribe("fo.after.>").expect("a second new subscribe");
    await_route(&co, &fresh_other, "fo.after.probe");

    // Still delivering once the dead leader's subscriptions are dropped.
    let (sent, got) = watch_delivery(&cf, &sub_o, "fo.live.watch", killed + CLEANUP_WATCH);
    println!(
        "{} s after the kill: {got} of {sent} messages reached a survivor's subscription",
        CLEANUP_WATCH.as_secs()
    );
    assert_eq!(
        got, sent,
        "a survivor's subscription lost messages after the leader died"
    );

    // The acked cursor survived: the next fetch starts at 6.
    let rest = cf
        .fetch("FO", "fo-pull", 10, Some(Duration::from_secs(2)))
        .expect("fetch after failover");
    let seqs: Vec<u64> = rest.iter().map(|m| m.seq).collect();
    assert!(
        seqs.iter().all(|&s| s > 5),
        "acked messages delivered again: {seqs:?}"
    );
    assert_eq!(seqs.first(), Some(&6), "{seqs:?}");
    let ci = co
        .consumer_info("FO", "fo-pull")
        .expect("consumer.info after failover");
    assert!(ci.ack_floor.stream_seq >= 5, "{ci:?}");
}

// ---------------------------------------------------------------------------
// A follower is killed and restarted.
// ---------------------------------------------------------------------------

/// docs/PROTOCOL.md "Replicated streams": an R3 stream's Raft group runs
/// on its three nodes, and after kill -9 of the node leading it the other
/// two elect a new leader within the contract's 5 s. Prints the time.
#[test]
fn stream_group_elects_a_new_leader_after_kill9_of_its_leader() {
    let mut c = Cluster::start();
    c.client(0)
        .call(
            "stream.create",
            json!({"name": "FG", "subjects": ["fg.>"], "replicas": 3}),
        )
        .expect("stream.create FG with 3 replicas");
    let victim = agreed_stream_group_leader(&c, &[0, 1, 2], "FG", DELIVERY_WAIT, |_| true);
    c.kill(victim);
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let new = agreed_stream_group_leader(&c, &survivors, "FG", Duration::from_secs(5), |l| {
        l != victim
    });
    println!(
        "stream group of FG: leader {} killed, {} leads after {} ms",
        IDS[victim],
        IDS[new],
        killed.elapsed().as_millis()
    );
}

#[test]
fn follower_killed_and_restarted_catches_up() {
    let mut c = Cluster::start();
    let (leader, _) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    let x = (leader + 1) % 3;
    let y = (leader + 2) % 3;
    let rc = c.reconnecting_client(x);
    let events = rc.events();
    let sub = rc.subscribe("fr.>").expect("sub on the follower");
    let cy = c.client(y);
    await_route(&cy, &sub, "fr.probe");
    // A queue group with a member on each node.
    let (cx, cl) = (c.client(x), c.client(leader));
    let members: Vec<Subscription> = [&cx, &cl, &cy]
        .iter()
        .map(|cli| {
            cli.queue_subscribe("frq.work", "fr-workers")
                .expect("queue sub")
        })
        .collect();
    for m in &members[1..] {
        await_route(&cx, m, "frq.work");
    }
    await_route(&cl, &members[0], "frq.work");
    // A responder that lives only on the node about to die.
    let responder = cx.subscribe("frsvc.only").expect("responder sub");
    await_route(&cl, &responder, "frsvc.only");

    let killed = Instant::now();
    c.kill(x);
    // Once the leader sees the node gone, the group skips its member: every
    // message reaches one of the two left, none is lost to the dead one.
    let deadline = killed + DELIVERY_WAIT;
    while peer_state(&c, leader, IDS[x]).as_deref() != Some("unreachable") {
        assert!(
            Instant::now() < deadline,
            "{} never saw {} unreachable",
            IDS[leader],
            IDS[x]
        );
        thread::sleep(Duration::from_millis(20));
    }
    println!(
        "{} reports {} unreachable {} ms after the kill",
        IDS[leader],
        IDS[x],
        killed.elapsed().as_millis()
    );
    // Its only responder is out of reach: no_responders at once, not a
    // request timing out.
    let asked = Instant::now();
    let err = cl
        .request("frsvc.only", json!({}), Duration::from_secs(3))
        .expect_err("nobody can answer");
    assert_eq!(err.code(), Some("no_responders"), "{err}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{err} took {:?}",
        asked.elapsed()
    );
    for id in 0..300u64 {
        cl.publish("frq.work", json!({ "id": id })).unwrap();
    }
    let mut count: BTreeMap<u64, u32> = BTreeMap::new();
    let deadline = Instant::now() + DELIVERY_WAIT;
    while count.len() < 300 && Instant::now() < deadline {
        for m in &members[1..] {
            while let Ok(Some(msg)) = m.try_recv() {
                if let Some(id) = msg.data["id"].as_u64() {
                    *count.entry(id).or_default() += 1;
                }
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        count.len(),
        300,
        "lost to the dead member: {}",
        300 - count.len()
    );
    assert!(
        count.values().all(|&n| n == 1),
        "delivered twice in the group"
    );
    // Changes committed while it is down.
    let ctl = c.control(leader);
    ok(ctl
        .call(
            "group.set",
            json!({ "queue": "fr-bcast", "mode": "broadcast" }),
        )
        .expect("group.set while a follower is down"));
    let _more: Vec<Subscription> = (0..5)
        .map(|k| {
            cy.subscribe(&format!("fr.extra.{k}"))
                .expect("sub while down")
        })
        .collect();
    let target = ok(c.status(leader).expect("leader status"))["commit_index"]
        .as_u64()
        .expect("commit_index");

    let restarted = Instant::now();
    c.restart(x);
    // Catch-up: the restarted node's commit index reaches the leader's.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mine = c
            .status(x)
            .ok()
            .and_then(|s| s["commit_index"].as_u64())
            .unwrap_or(0);
        if mine >= target {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} commit_index {mine} never reached the leader's {target}",
            IDS[x]
        );
        thread::sleep(Duration::from_millis(50));
    }
    println!(
        "follower {} caught up to commit index {target} in {} ms after its restart",
        IDS[x],
        restarted.elapsed().as_millis()
    );
    let ctl_x = c.control(x);
    assert!(
        has_rule(&ctl_x, "fr-bcast", "broadcast"),
        "the rule set while {} was down: {:?}",
        IDS[x],
        group_rules(&ctl_x)
    );

    // The reconnecting client is back and delivers again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Reconnected { .. }) => break,
            Ok(Event::ResubscribeFailed { sid, error }) => panic!("resubscribe {sid}: {error}"),
            Ok(_) => {}
            Err(e) => panic!("the client of {} did not reconnect: {e}", IDS[x]),
        }
    }
    let resumed = catch_unwind(AssertUnwindSafe(|| await_route(&cy, &sub, "fr.probe")));
    if resumed.is_err() {
        // Tell a lost resubscription apart from a node that delivers nothing.
        let cx = c.client(x);
        let fresh = cx
            .subscribe("fr.>")
            .expect("fresh subscribe on the restarted node");
        let fresh_ok = catch_unwind(AssertUnwindSafe(|| await_route(&cy, &fresh, "fr.probe")));
        panic!(
            "the subscription re-sent on reconnect to the restarted {} receives nothing \
             ({} ms after the restart); a fresh subscription there {}",
            IDS[x],
            restarted.elapsed().as_millis(),
            if fresh_ok.is_ok() {
                "does receive"
            } else {
                "receives nothing either"
            }
        );
    }
    for k in 0..5 {
        cy.publish("fr.after", json!({ "k": k })).unwrap();
    }
    let ks: Vec<u64> = recv_n(&sub, 5, "fr.probe")
        .iter()
        .map(|m| m.data["k"].as_u64().unwrap())
        .collect();
    assert_eq!(ks, vec![0, 1, 2, 3, 4]);

    // The survivors drop a dead node's subscriptions a few seconds after
    // it died; that must not take the re-sent one with it. Keep publishing
    // past that moment (watching, not waiting: each message is counted),
    // then check the subscription still delivers.
    let (sent, got) = watch_delivery(&cy, &sub, "fr.watch", killed + CLEANUP_WATCH);
    let mut seen = Vec::new();
    while let Ok(Some(ev)) = events.try_recv() {
        seen.push(ev);
    }
    println!(
        "{} s after the kill: {got} of {sent} watch messages arrived; client events: {seen:?}",
        CLEANUP_WATCH.as_secs()
    );
    let still = catch_unwind(AssertUnwindSafe(|| await_route(&cy, &sub, "fr.probe")));
    assert!(
        still.is_ok(),
        "the re-sent subscription on {} stopped delivering once the dead node's \
         subscriptions were dropped ({got} of {sent} watch messages arrived; events {seen:?})",
        IDS[x]
    );
    assert_eq!(got, sent, "watch messages lost; client events {seen:?}");
    // And the restarted node takes new subscriptions.
    let cx = c.client(x);
    let s = cx
        .subscribe("fr.new")
        .expect("subscribe on the restarted node");
    await_route(&cy, &s, "fr.new");
}

// ---------------------------------------------------------------------------
// A node cut off from the other two.
// ---------------------------------------------------------------------------

/// Subscribe and group.set on `i` at once, each expected to fail with
/// `unavailable` within the bound.
/// `subscriptions` of `server.info` (the replicated subscription table).
fn subscription_count(control: &Client) -> u64 {
    let v = ok(control.call("server.info", json!({})).expect("server.info"));
    v["subscriptions"].as_u64().expect("subscriptions")
}

/// Subscribe and group.set on `i` at once, each expected to fail with
/// `unavailable` within the bound.
fn expect_unavailable(c: &Cluster, i: usize) {
    let opts = Options {
        timeout: Duration::from_secs(15),
        ..Default::default()
    };
    let client = Client::connect_with(&c.http[i], opts).expect("connect");
    let ctl = c.control_with_timeout(i, Duration::from_secs(15));
    thread::scope(|s| {
        let sub = s.spawn(|| {
            let t = Instant::now();
            (client.subscribe("cut.x").map(|_| ()), t.elapsed())
        });
        let rule = s.spawn(|| {
            let t = Instant::now();
            (
                ctl.call(
                    "group.set",
                    json!({ "queue": "cut-q", "mode": "broadcast" }),
                )
                .map(|_| ()),
                t.elapsed(),
            )
        });
        for (what, h) in [("subscribe", sub), ("group.set", rule)] {
            let (result, took) = h.join().unwrap();
            println!(
                "{what} on cut-off {}: {result:?} after {} ms",
                IDS[i],
                took.as_millis()
            );
            let err = result.expect_err("succeeded without a reachable majority");
            assert_eq!(err.code(), Some("unavailable"), "{what}: {err}");
            assert!(took <= UNAVAILABLE_BOUND, "{what} took {took:?}");
        }
    });
}

#[test]
fn node_cut_off_answers_unavailable() {
    let mut c = Cluster::start();
    let (leader, _) = c.await_leader(&[0, 1, 2], LEADER_WAIT);

    // A follower cut off from the leader and the other follower.
    let x = (leader + 1) % 3;
    // A subscriber on it from before the cut.
    let rc = c.reconnecting_client(x);
    let kept = rc
        .subscribe("cut.kept.>")
        .expect("subscribe before the cut");
    await_route(&c.client(leader), &kept, "cut.kept.probe");
    let others: Vec<usize> = (0..3).filter(|&j| j != x).collect();
    for &j in &others {
        c.pause(j);
    }
    expect_unavailable(&c, x);
    for &j in &others {
        c.resume(j);
    }
    let healed = Instant::now();
    let (leader, _) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    // The subscriber from before the cut hears the other nodes again (its
    // node may have had it subscribe anew, after the cluster dropped the
    // cut-off node's subscriptions).
    let cl = c.client(leader);
    await_route(&cl, &kept, "cut.kept.probe");
    println!(
        "after healing: the subscriber on {} hears {} again within {} ms; client events {:?}",
        IDS[x],
        IDS[leader],
        healed.elapsed().as_millis(),
        std::iter::from_fn(|| rc.events().try_recv().ok().flatten()).collect::<Vec<_>>()
    );
    let cx = c.client(x);
    let sub = subscribe_when_ready(&cx, "cut.healed.>", Duration::from_secs(5));
    await_route(&c.client(leader), &sub, "cut.healed.probe");

    // The leader cut off from both followers.
    let followers: Vec<usize> = (0..3).filter(|&j| j != leader).collect();
    for &j in &followers {
        c.pause(j);
    }
    expect_unavailable(&c, leader);
    for &j in &followers {
        c.resume(j);
    }
    c.await_leader(&[0, 1, 2], LEADER_WAIT);
}

// ---------------------------------------------------------------------------
// A node that stops answering (SIGSTOP) is treated like a lost one.
// ---------------------------------------------------------------------------

/// A follower stopped with SIGSTOP: its process and sockets stay, it
/// answers nothing. The others must drop its subscriptions after a few
/// seconds, as for a dead node; once it runs again, its subscriber is heard
/// again (the node has its clients subscribe anew).
#[test]
fn stopped_node_loses_its_subscriptions_and_gets_them_back() {
    let mut c = Cluster::start();
    let (leader, _) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    let x = (leader + 1) % 3;
    let rc = c.reconnecting_client(x);
    let kept = rc.subscribe("stop.kept.>").expect("subscribe");
    let cl = c.client(leader);
    await_route(&cl, &kept, "stop.kept.probe");
    let ctl = c.control(leader);
    let subs_before = subscription_count(&ctl);
    c.pause(x);
    let paused = Instant::now();
    let deadline = paused + Duration::from_secs(10);
    while subscription_count(&ctl) >= subs_before {
        assert!(
            Instant::now() < deadline,
            "{} still counts {subs_before} subscriptions 10 s after {} stopped answering; \
             its peers: {}",
            IDS[leader],
            IDS[x],
            c.status(leader)
                .map(|s| s["peers"].clone())
                .unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{} dropped the subscriptions of the stopped {} after {} ms",
        IDS[leader],
        IDS[x],
        paused.elapsed().as_millis()
    );
    c.resume(x);
    let resumed = Instant::now();
    let deadline = resumed + Duration::from_secs(10);
    loop {
        let r = catch_unwind(AssertUnwindSafe(|| {
            await_route(&cl, &kept, "stop.kept.probe")
        }));
        if r.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the subscriber on {} was not heard again within 10 s of its node resuming",
            IDS[x]
        );
    }
    println!(
        "after its subscriptions were dropped: the subscriber on {} is heard again {} ms \
         after its node resumed; client events {:?}",
        IDS[x],
        resumed.elapsed().as_millis(),
        std::iter::from_fn(|| rc.events().try_recv().ok().flatten()).collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------
// The whole cluster restarts.
// ---------------------------------------------------------------------------

#[test]
fn whole_cluster_restart_keeps_rules_and_streams() {
    let mut c = Cluster::start();
    let ctl = c.control(0);
    ok(ctl
        .call(
            "group.set",
            json!({ "queue": "wr-bcast", "mode": "broadcast" }),
        )
        .expect("group.set"));
    let c1 = c.client(0);
    c1.stream_create(&StreamConfig::new("WR", &["wr.>"]))
        .expect("stream.create on n1");
    for k in 1..=3u64 {
        let ack = c1
            .publish_stream("wr.x", json!({ "k": k }))
            .expect("publish_stream");
        assert_eq!(ack.seq, k);
    }
    c1.consumer_create("WR", &ConsumerConfig::new("wr-pull"))
        .expect("consumer.create");
    let got = c1
        .fetch("WR", "wr-pull", 1, Some(Duration::from_secs(2)))
        .expect("fetch");
    assert_eq!(got.len(), 1);
    c1.ack("WR", "wr-pull", got[0].seq).expect("ack");
    drop((ctl, c1));

    for (i, id) in IDS.iter().enumerate() {
        let clean = c.terminate(i, Duration::from_secs(10));
        assert!(clean, "{id} did not exit within 10 s of SIGTERM");
    }
    c.restart_all(&[0, 1, 2]);
    c.await_leader(&[0, 1, 2], LEADER_WAIT);

    for (i, id) in IDS.iter().enumerate() {
        let ctl = c.control(i);
        assert!(
            has_rule(&ctl, "wr-bcast", "broadcast"),
            "{id} after restart: {:?}",
            group_rules(&ctl)
        );
    }
    let c2 = c.client(1);
    let info = c2
        .stream_info("WR")
        .expect("stream.info on n2 after restart");
    assert_eq!(info.config["subjects"], json!(["wr.>"]));
    assert_eq!(info.state.messages, 3, "{info:?}");
    let ci = c
        .client(2)
        .consumer_info("WR", "wr-pull")
        .expect("consumer.info on n3");
    assert_eq!(ci.ack_floor.stream_seq, 1, "{ci:?}");
    assert_eq!(
        c.client(0).stream_get("WR", 2).unwrap().data,
        json!({ "k": 2 })
    );
}
