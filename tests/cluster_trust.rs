//! Node-to-node trust, black box: three real `broker` processes on
//! loopback (tests/cluster_support) and raw TCP to their Raft ports.
//! Contract: docs/PROTOCOL.md, "Node-to-node trust".
//!
//! - A Raft heartbeat forged to claim term 1000 from a member, framed as
//!   the transport frames messages, changes no term and no leader and its
//!   connection is closed; against a cluster started without any token the
//!   same bytes do raise the term (so the check is what stops them).
//! - The bytes a real node sent on a Raft connection, recorded by a relay
//!   it was pointed at and played again, are refused.
//! - 200 idle or garbage connections to every Raft port leave the leader
//!   where it was and subscribes are still acked.
//! - A node started with another cluster token never joins.
//! - `cluster.command` on `/control` needs the cluster token: the control
//!   token alone gets `unauthorized`.

mod cluster_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{http_get, Cluster, CONTROL_TOKEN, IDS, LEADER_WAIT};
use gombus::client::{Client, Options};
use gombus::cluster::raft_msg::{self, Body, Message};
use gombus::storage::record;
use serde_json::{json, Value};

/// Bound on every wait below.
const WAIT: Duration = Duration::from_secs(10);

/// Raft's number for node `i` (members are numbered by sorted id).
fn raft_id(i: usize) -> u64 {
    i as u64 + 1
}

/// A heartbeat claiming to come from node `from` in term 1000, framed as
/// the transport frames every message (record: length, crc32, body).
fn forged_heartbeat(from: usize, to: usize) -> Vec<u8> {
    let m = Message {
        group: 0,
        from: raft_id(from),
        to: raft_id(to),
        term: 1000,
        body: Body::Heartbeat {
            commit: 0,
            commit_term: 0,
            read_seq: 0,
        },
    };
    let mut body = Vec::new();
    raft_msg::encode(&mut body, &m);
    let mut frame = Vec::new();
    record::encode(&mut frame, &body);
    frame
}

/// Writes `bytes` to `addr` and waits (bounded) until the other end
/// closes the connection; what it sends meanwhile is read and dropped.
fn send_and_await_close(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.write_all(bytes).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return, // reset: closed as well
        }
        assert!(
            Instant::now() < deadline,
            "{addr} kept the connection open for {WAIT:?}"
        );
    }
}

/// (leader, term) as node `i` reports them.
fn leader_and_term(c: &Cluster, i: usize) -> (Option<String>, u64) {
    let s = c
        .status(i)
        .unwrap_or_else(|e| panic!("{} status: {e}", IDS[i]));
    (
        s["leader"].as_str().map(str::to_string),
        s["term"].as_u64().unwrap_or(0),
    )
}

/// A sample of node `i`'s `/metrics`, by name and label set as written
/// (e.g. `gombus_raft_handshakes_refused_total{reason="proof"}`).
fn metric(c: &Cluster, i: usize, sample: &str) -> f64 {
    let (code, text) = http_get(&c.http[i], "/metrics");
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {sample} in /metrics"))
}

/// Waits until node `i`'s `/metrics` shows `sample` at `at_least` or more
/// (the figures reach `/metrics` a few milliseconds after the event).
fn await_metric(c: &Cluster, i: usize, sample: &str, at_least: f64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = metric(c, i, sample);
        if v >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {sample} still {v}, expected {at_least} or more",
            IDS[i]
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A `/control` client of node `i` logging in with `token`.
fn control_with(c: &Cluster, i: usize, token: &str) -> Result<Client, gombus::client::Error> {
    let opts = Options {
        namespace: "/control".into(),
        token: Some(token.into()),
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    Client::connect_with(&c.http[i], opts)
}

/// Waits until node `i`'s stderr has a line containing `text`.
fn await_log(c: &Cluster, i: usize, text: &str) {
    let deadline = Instant::now() + WAIT;
    while !c.log(i).contains(text) {
        assert!(
            Instant::now() < deadline,
            "{} never logged {text:?}; its log:\n{}",
            IDS[i],
            c.log(i)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_forged_heartbeat_changes_no_term_and_is_closed() {
    let c = Cluster::start();
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    for i in 0..IDS.len() {
        // Claims to be the leader, or (sent to the leader) another member.
        let from = if i == leader { (i + 1) % 3 } else { leader };
        send_and_await_close(&c.raft[i], &forged_heartbeat(from, i));
        let refused = r#"gombus_raft_handshakes_refused_total{reason="hello"}"#;
        await_metric(&c, i, refused, 1.0);
        // The log line may reach the harness after the metric moved.
        await_log(&c, i, "not a handshake frame");
    }
    // The frames were read and refused (counted above) before their
    // connections closed: nothing of them can still be on its way.
    for (i, id) in IDS.iter().enumerate() {
        assert_eq!(
            leader_and_term(&c, i),
            (Some(IDS[leader].to_string()), term),
            "{id} moved"
        );
    }
}

#[test]
fn without_any_token_the_forged_heartbeat_raises_the_term() {
    let mut c = Cluster::prepare();
    c.edit_args = Some(Box::new(|_, args| {
        args.retain(|a| !a.starts_with("-control-token"))
    }));
    c.launch();
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    assert!(term < 1000);
    assert!(
        c.log(0).contains("any host that reaches the Raft port"),
        "no warning at start:\n{}",
        c.log(0)
    );
    let follower = (leader + 1) % 3;
    let mut s = TcpStream::connect(&c.raft[follower]).unwrap();
    s.write_all(&forged_heartbeat(leader, follower)).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        // Once in term 1000, the cluster elects again from there.
        let (_, now) = leader_and_term(&c, follower);
        if now >= 1000 {
            break;
        }
        assert!(Instant::now() < deadline, "term still {now}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Accepts connections on `listener` and relays each to `upstream` both
/// ways; what the first one relayed sends is also kept in `recorded`.
fn relay(listener: TcpListener, upstream: String, recorded: Arc<Mutex<Vec<u8>>>) {
    thread::spawn(move || {
        let mut kept = 0;
        for conn in listener.incoming() {
            let Ok(down) = conn else { return };
            let Ok(up) = TcpStream::connect(&upstream) else {
                continue;
            };
            let keep = (kept == 0).then(|| Arc::clone(&recorded));
            kept += 1;
            pipe(down.try_clone().unwrap(), up.try_clone().unwrap(), keep);
            pipe(up, down, None);
        }
    });
}

/// Copies `from` to `to` on a thread of its own until either closes.
fn pipe(mut from: TcpStream, mut to: TcpStream, keep: Option<Arc<Mutex<Vec<u8>>>>) {
    thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(k) = &keep {
                let mut k = k.lock().unwrap();
                if k.len() < 64 << 10 {
                    k.extend_from_slice(&buf[..n]);
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

#[test]
fn a_replayed_handshake_is_refused() {
    // n1 reaches n2's Raft port through a relay that records what n1
    // sends: its hello, its proof and Raft frames.
    let mut c = Cluster::prepare();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let via = listener.local_addr().unwrap().to_string();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    relay(listener, c.raft[1].clone(), Arc::clone(&recorded));
    let n2_raft = c.raft[1].clone();
    c.edit_args = Some(Box::new(move |i, args| {
        if i == 0 {
            for a in args.iter_mut().filter(|a| a.starts_with("-raft-peers=")) {
                *a = a.replace(&format!("n2={n2_raft}"), &format!("n2={via}"));
            }
        }
    }));
    c.launch();
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    c.await_healthy(&[0, 1, 2], LEADER_WAIT);
    // Hello (62 bytes) and proof (46), sent once n1 had checked n2's proof,
    // and whatever Raft frames followed.
    let deadline = Instant::now() + WAIT;
    while recorded.lock().unwrap().len() < 62 + 46 {
        assert!(
            Instant::now() < deadline,
            "n1 sent n2 nothing via the relay"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let replay = recorded.lock().unwrap().clone();
    let proof = r#"gombus_raft_handshakes_refused_total{reason="proof"}"#;
    let before = metric(&c, 1, proof);
    // Played again to n2 directly: n2's new nonce makes the old proof
    // worthless, so it closes the connection before reading any frame.
    send_and_await_close(&c.raft[1], &replay);
    await_metric(&c, 1, proof, before + 1.0);
    assert!(c.log(1).contains("failed its proof"), "{}", c.log(1));
    for i in 0..3 {
        assert_eq!(
            leader_and_term(&c, i),
            (Some(IDS[leader].to_string()), term)
        );
    }
}

#[test]
fn strangers_flooding_every_raft_port_change_nothing() {
    let c = Cluster::start();
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    // On each node: 100 idle connections and 100 that send garbage (half
    // of them a length far beyond any handshake frame).
    let mut held = Vec::new();
    for addr in &c.raft {
        for k in 0..200 {
            let Ok(mut s) = TcpStream::connect(addr) else {
                continue; // the backlog was full: refused is fine too
            };
            match k % 4 {
                0 => {
                    let _ = s.write_all(&[0xff; 300]);
                }
                1 => {
                    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
                }
                _ => {}
            }
            held.push(s);
        }
    }
    // Subscribes on the leader and on a follower are still acked, and
    // nothing moved.
    let follower = (leader + 1) % 3;
    for i in [leader, follower] {
        let client = c.client(i);
        for n in 0..20 {
            client
                .subscribe(&format!("flood.{i}.{n}"))
                .unwrap_or_else(|e| panic!("subscribe on {} during the flood: {e}", IDS[i]));
        }
    }
    for (i, id) in IDS.iter().enumerate() {
        assert_eq!(
            leader_and_term(&c, i),
            (Some(IDS[leader].to_string()), term),
            "{id} moved"
        );
        let evicted = r#"gombus_raft_handshakes_refused_total{reason="evicted"}"#;
        assert!(metric(&c, i, evicted) >= 1.0, "{id} evicted nobody");
    }
    drop(held);
}

#[test]
fn a_node_with_another_cluster_token_never_joins() {
    let mut c = Cluster::prepare();
    c.edit_args = Some(Box::new(|i, args| {
        if i == 2 {
            args.push("-cluster-token=not-the-clusters".into());
        }
    }));
    c.launch();
    let (leader, _) = c.await_leader(&[0, 1], LEADER_WAIT);
    c.await_healthy(&[0, 1], LEADER_WAIT);
    // n3 says why, and so do the nodes it tried to reach or that tried it.
    await_log(&c, 2, "cluster tokens differ?");
    await_log(&c, leader, "cluster tokens differ?");
    let (code, body) = http_get(&c.http[2], "/healthz");
    assert_eq!(code, 503, "n3 /healthz: {body}");
    assert_eq!(leader_and_term(&c, 2).0, None, "n3 knows no leader");
    // A leader counts a member reachable once it has heard from it within a
    // second; n3 is never heard from.
    let deadline = Instant::now() + WAIT;
    loop {
        let s = c.status(leader).unwrap();
        let n3 = s["peers"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["id"] == "n3"))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(
            n3["match_index"],
            json!(0),
            "the leader sent n3 nothing: {s}"
        );
        if n3["reachable"] == json!(false) {
            assert_eq!(n3["state"], json!("unreachable"), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "n3 still reachable: {s}");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(
            &c,
            leader,
            r#"gombus_raft_messages_rejected_total{reason="sender"}"#
        ),
        0.0
    );
    // Two members still serve: a subscribe is acked.
    let client = c.client(leader);
    client.subscribe("still.served").unwrap();
}

#[test]
fn cluster_command_needs_the_cluster_token() {
    const CLUSTER_TOKEN: &str = "members-only";
    let mut c = Cluster::prepare();
    c.edit_args = Some(Box::new(|_, args| {
        args.push(format!("-cluster-token={CLUSTER_TOKEN}"))
    }));
    c.launch();
    let (leader, _) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    // Followers announce themselves to the leader with cluster.command over
    // their peer links: healthy followers show the links hold the token.
    c.await_healthy(&[0, 1, 2], LEADER_WAIT);

    let operator = control_with(&c, leader, CONTROL_TOKEN).unwrap();
    assert!(operator.call("cluster.status", json!({})).is_ok());
    let entry = json!({"entry": {"node": 1, "op": 1, "cmd": {}}});
    let err = operator
        .call("cluster.command", entry.clone())
        .expect_err("cluster.command with the control token");
    assert_eq!(err.code(), Some("unauthorized"), "{err}");
    let err = operator
        .call("cluster.forward", json!({}))
        .expect_err("cluster.forward with the control token");
    assert_eq!(err.code(), Some("unauthorized"), "{err}");

    // The cluster token passes the check (this entry is then refused for
    // what it is, not for who sent it).
    let peer = control_with(&c, leader, CLUSTER_TOKEN).unwrap();
    let err = peer
        .call("cluster.command", json!({}))
        .expect_err("an empty cluster.command");
    assert_eq!(err.code(), Some("bad_request"), "{err}");
    assert!(control_with(&c, leader, "neither").is_err());

    // Messages still cross nodes (cluster.forward over the links).
    let follower = (leader + 1) % 3;
    let subscriber = c.client(follower);
    let sub = subscriber.subscribe("trust.>").unwrap();
    let publisher = c.client(leader);
    let deadline = Instant::now() + WAIT;
    loop {
        publisher.publish("trust.x", json!({"n": 1})).unwrap();
        if sub.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "no delivery across nodes");
    }
}
