//! Membership changes of a running cluster, with real broker processes on
//! loopback (docs/PROTOCOL.md, "Membership changes"): nodes started with
//! `-join` are added with `cluster.add` while messages flow, the leader
//! and a dead node are removed, a killed node is replaced by a new one
//! with a new id, every node restarts with its original flags and gets
//! the stored membership back, the cluster shrinks from five back to
//! three without losing an acked stream or core message, a removed
//! node's stream replicas move to another node first, and bad requests
//! are refused with their codes. Every wait is bounded; every
//! process is stopped by its PID.

mod cluster_support;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{broker_bin, call_until, free_port, free_ports, read_stream, try_http_get};
use gombus::client::{Client, Options, Reconnect};
use serde_json::{json, Value};

const TOKEN: &str = "membership-secret";
const STARTUP_WAIT: Duration = Duration::from_secs(15);
const WAIT: Duration = Duration::from_secs(20);
/// One test's processes at a time: elections are timed on a quiet host.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One node: its addresses, flags, and process while it runs.
struct Node {
    name: String,
    http: String,
    raft: String,
    args: Vec<String>,
    child: Option<Child>,
    log: Arc<Mutex<VecDeque<String>>>,
}

/// Seed nodes n1..n3 started with `-raft-peers`, and nodes that join.
struct Nodes {
    root: PathBuf,
    nodes: Vec<Node>,
    _turn: MutexGuard<'static, ()>,
}

impl Nodes {
    /// Starts n1..n3 as the contract's launch lines do (`id=URL` pairs)
    /// and waits until they agree on a leader.
    fn start() -> Nodes {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        // Removed when `Nodes` drops.
        let root = cluster_support::TempDir::new("membership").keep();
        let names = ["n1", "n2", "n3"];
        let ports = free_ports(6);
        let http: Vec<String> = ports[..3]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let raft: Vec<String> = ports[3..]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let peers = (0..3)
            .map(|j| format!("{}={}", names[j], raft[j]))
            .collect::<Vec<_>>()
            .join(",");
        let urls = (0..3)
            .map(|j| format!("{}=http://{}/socket.io", names[j], http[j]))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Nodes {
            root,
            nodes: Vec::new(),
            _turn: turn,
        };
        for i in 0..3 {
            let args = vec![
                format!("-node-id={}", names[i]),
                format!("-addr={}", http[i]),
                format!("-raft-addr={}", raft[i]),
                format!("-raft-peers={peers}"),
                format!("-cluster={urls}"),
                format!("-control-token={TOKEN}"),
                format!("-data={}", nodes.root.join(names[i]).display()),
                "-bootstrap".to_string(),
            ];
            nodes.nodes.push(Node {
                name: names[i].to_string(),
                http: http[i].clone(),
                raft: raft[i].clone(),
                args,
                child: None,
                log: Arc::new(Mutex::new(VecDeque::new())),
            });
        }
        let waits: Vec<_> = (0..3).map(|i| nodes.spawn(i)).collect();
        for (i, w) in waits.into_iter().enumerate() {
            nodes.await_listening(i, &w);
        }
        nodes.await_leader(&[0, 1, 2]);
        nodes
    }

    /// Starts a new node `name` with `-join`, naming member `via` in
    /// `-cluster`; returns its index.
    fn join(&mut self, name: &str, via: usize) -> usize {
        let ports = free_ports(2);
        let http = format!("127.0.0.1:{}", ports[0]);
        let raft = format!("127.0.0.1:{}", ports[1]);
        let args = vec![
            format!("-node-id={name}"),
            format!("-addr={http}"),
            format!("-raft-addr={raft}"),
            "-join".to_string(),
            format!(
                "-cluster={}=http://{}",
                self.nodes[via].name, self.nodes[via].http
            ),
            format!("-control-token={TOKEN}"),
            format!("-data={}", self.root.join(name).display()),
        ];
        self.nodes.push(Node {
            name: name.to_string(),
            http,
            raft,
            args,
            child: None,
            log: Arc::new(Mutex::new(VecDeque::new())),
        });
        let i = self.nodes.len() - 1;
        let w = self.spawn(i);
        self.await_listening(i, &w);
        i
    }

    fn spawn(&mut self, i: usize) -> mpsc::Receiver<String> {
        let bin = broker_bin();
        let node = &mut self.nodes[i];
        let (child, rx, _) = cluster_support::support::spawn_logged(
            Command::new(&bin).args(&node.args),
            &bin,
            &node.log,
            300,
        );
        node.child = Some(child);
        rx
    }

    fn await_listening(&self, i: usize, lines: &mpsc::Receiver<String>) {
        let deadline = Instant::now() + STARTUP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("listening on ") => return,
                Ok(_) => {}
                Err(e) => panic!(
                    "{} did not start ({e}):\n{}",
                    self.nodes[i].name,
                    self.logs()
                ),
            }
        }
    }

    /// SIGKILL node `i` by its PID.
    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM node `i` by its PID and wait (bounded) for it to exit.
    fn stop(&mut self, i: usize) {
        let Some(mut c) = self.nodes[i].child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = n.log.lock().unwrap_or_else(|p| p.into_inner());
                format!(
                    "--- {} ---\n{}",
                    n.name,
                    log.iter().cloned().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn control(&self, i: usize, timeout: Duration) -> Client {
        let opts = Options {
            namespace: "/control".into(),
            token: Some(TOKEN.into()),
            timeout,
            ..Default::default()
        };
        Client::connect_with(&self.nodes[i].http, opts)
            .unwrap_or_else(|e| panic!("connect to {}/control: {e}", self.nodes[i].name))
    }

    fn status(&self, i: usize) -> Result<Value, String> {
        let opts = Options {
            namespace: "/control".into(),
            token: Some(TOKEN.into()),
            timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let c = Client::connect_with(&self.nodes[i].http, opts).map_err(|e| e.to_string())?;
        let v = c
            .call("cluster.status", json!({}))
            .map_err(|e| e.to_string())?;
        let _ = c.close();
        Ok(v)
    }

    /// `cluster.add` of node `new` asked of node `at`.
    fn add(&self, at: usize, new: usize) -> Result<Value, String> {
        let n = &self.nodes[new];
        let args = json!({"id": n.name, "raft_addr": n.raft, "addr": n.http});
        self.call(at, "cluster.add", args)
    }

    fn remove(&self, at: usize, name: &str) -> Result<Value, String> {
        self.call(at, "cluster.remove", json!({ "id": name }))
    }

    /// `event` on node `at`'s `/control`: its ack, or the error code.
    fn call(&self, at: usize, event: &str, args: Value) -> Result<Value, String> {
        let c = self.control(at, Duration::from_secs(70));
        let r = c.call(event, args).map_err(|e| {
            eprintln!("{event} on {}: {e}", self.nodes[at].name);
            match e.code() {
                Some(code) => code.to_string(),
                None => e.to_string(),
            }
        });
        let _ = c.close();
        r
    }

    /// Waits until every node in `nodes` names the same leader, one of
    /// them; returns its index.
    fn await_leader(&self, nodes: &[usize]) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            let leaders: Vec<Option<String>> = nodes
                .iter()
                .map(|&i| {
                    self.status(i)
                        .ok()
                        .and_then(|s| s["leader"].as_str().map(str::to_string))
                })
                .collect();
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| x.as_deref() == Some(l)) {
                    if let Some(&i) = nodes.iter().find(|&&i| self.nodes[i].name == *l) {
                        return i;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {nodes:?}: {leaders:?}\n{}",
                self.logs()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until node `i`'s `/healthz` answers `code` with `status`.
    fn await_health(&self, i: usize, code: u16, status: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = try_http_get(&self.nodes[i].http, "/healthz");
            if let Ok((c, body)) = &got {
                if *c == code && body.contains(status) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} /healthz is {got:?}, not {code} {status}\n{}",
                self.nodes[i].name,
                self.logs()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until node `i`'s `cluster.status` lists exactly `names` as
    /// members, every one a voter, with a leader among them.
    fn await_members(&self, i: usize, names: &[&str]) {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.status(i).unwrap_or(Value::Null);
            let mut listed: Vec<(String, bool)> = s["peers"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let id = p["id"].as_str().unwrap_or("?").to_string();
                            (id, p["voter"] == json!(true))
                        })
                        .collect()
                })
                .unwrap_or_default();
            listed.sort();
            let mut want: Vec<(String, bool)> =
                names.iter().map(|n| (n.to_string(), true)).collect();
            want.sort();
            let leader_ok = s["leader"].as_str().is_some_and(|l| names.contains(&l));
            if listed == want && leader_ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} lists {listed:?} (leader {}), not {want:?}\n{}",
                self.nodes[i].name,
                s["leader"],
                self.logs()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn client(&self, i: usize) -> Client {
        Client::connect(&self.nodes[i].http)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.nodes[i].name))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        if thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Receives `want` messages on `sub` (bounded); returns their numbers.
fn drain(sub: &gombus::client::Subscription, want: u64) -> Vec<u64> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while (got.len() as u64) < want && Instant::now() < deadline {
        if let Ok(m) = sub.recv_timeout(Duration::from_millis(200)) {
            // u64::MAX: a probe of the subscriptions, sent before.
            match m.data.as_u64() {
                Some(u64::MAX) => {}
                n => got.push(n.unwrap_or(u64::MAX - 1)),
            }
        }
    }
    got
}

/// Grows 3 → 4 → 5 while a publisher on n3 and subscribers on n1 and n2
/// run: every message reaches both subscribers once and in order; the
/// new nodes vote and serve; then every node restarts with its original
/// flags (seeds with their three-node -raft-peers) and the stored
/// five-member configuration comes back.
#[test]
fn growing_while_messages_flow_then_restarting_from_the_stored_membership() {
    let mut c = Nodes::start();
    let sub1 = c.client(0);
    let s1 = sub1.subscribe("grow.n").unwrap();
    let sub2 = c.client(1);
    let s2 = sub2.subscribe("grow.n").unwrap();
    let publisher = c.client(2);
    // The subscriptions are committed cluster-wide before publishing.
    let deadline = Instant::now() + WAIT;
    loop {
        publisher.publish_acked("grow.n", json!(u64::MAX)).unwrap();
        let a = s1.recv_timeout(Duration::from_millis(100)).is_ok();
        let b = s2.recv_timeout(Duration::from_millis(100)).is_ok();
        if a && b {
            break;
        }
        assert!(Instant::now() < deadline, "subscriptions never spread");
    }
    while s1.try_recv().ok().flatten().is_some() || s2.try_recv().ok().flatten().is_some() {}

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let pub_thread = {
        let stop = Arc::clone(&stop);
        let sent = Arc::clone(&sent);
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                publisher.publish_acked("grow.n", json!(n)).unwrap();
                n += 1;
                sent.store(n, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(2));
            }
            publisher
        })
    };

    let n4 = c.join("n4", 0);
    c.await_health(n4, 503, "waiting to be added");
    // Asked of a follower: relayed to the leader.
    let leader = c.await_leader(&[0, 1, 2]);
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let t = Instant::now();
    assert_eq!(c.add(follower, n4), Ok(json!({"ok": true})));
    eprintln!("n4 added in {:?}", t.elapsed());
    c.await_members(n4, &["n1", "n2", "n3", "n4"]);
    c.await_health(n4, 200, "ok");

    let n5 = c.join("n5", 1);
    // Asked of the node added last.
    assert_eq!(c.add(n4, n5), Ok(json!({"ok": true})));
    c.await_members(0, &["n1", "n2", "n3", "n4", "n5"]);
    c.await_health(n5, 200, "ok");

    // The new node serves: a subscriber on n5 gets n3's messages.
    let sub5 = c.client(n5);
    let s5 = sub5.subscribe("grow.n").unwrap();
    let deadline = Instant::now() + WAIT;
    while s5.recv_timeout(Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "n5's subscriber got nothing");
    }

    // Enough traffic to check, however fast the nodes were added.
    let deadline = Instant::now() + WAIT;
    while sent.load(Ordering::Relaxed) <= 50 {
        assert!(Instant::now() < deadline, "publishes stalled");
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let publisher = pub_thread.join().unwrap();
    let total = sent.load(Ordering::Relaxed);
    assert!(total > 50, "only {total} messages were published");
    let want: Vec<u64> = (0..total).collect();
    assert_eq!(drain(&s1, total), want, "n1's subscriber");
    assert_eq!(drain(&s2, total), want, "n2's subscriber");
    drop((publisher, sub1, sub2, sub5));

    // Everyone restarts with the flags it was started with.
    for i in 0..c.nodes.len() {
        c.stop(i);
    }
    let waits: Vec<_> = (0..c.nodes.len()).map(|i| c.spawn(i)).collect();
    for (i, w) in waits.into_iter().enumerate() {
        c.await_listening(i, &w);
    }
    c.await_leader(&[0, 1, 2, 3, 4]);
    for i in 0..5 {
        c.await_members(i, &["n1", "n2", "n3", "n4", "n5"]);
        c.await_health(i, 200, "ok");
    }
}

/// A node killed with SIGKILL is replaced by a new node with a new id,
/// the dead one is removed, then the leader removes itself: it steps
/// down, closes its clients (which reconnect to a member) and answers
/// 503; its subscriptions are gone cluster-wide.
#[test]
fn replacing_a_killed_node_and_removing_the_leader() {
    let mut c = Nodes::start();
    // n3 dies for good; n1 and n2 go on (with a new leader if n3 led).
    c.kill(2);
    c.await_leader(&[0, 1]);
    let n4 = c.join("n4", 0);
    assert_eq!(c.add(0, n4), Ok(json!({"ok": true})));
    assert_eq!(c.remove(1, "n3"), Ok(json!({"ok": true})));
    c.await_members(0, &["n1", "n2", "n4"]);
    c.await_members(n4, &["n1", "n2", "n4"]);

    let leader = c.await_leader(&[0, 1, n4]);
    let others: Vec<usize> = [0, 1, n4].into_iter().filter(|&i| i != leader).collect();
    // A client of the leader, able to fall back on the others.
    let urls: Vec<String> = std::iter::once(leader)
        .chain(others.iter().copied())
        .map(|i| c.nodes[i].http.clone())
        .collect();
    let opts = Options {
        reconnect: Some(Reconnect {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(250),
            jitter: 0.2,
            max_attempts: None,
        }),
        ..Default::default()
    };
    let roamer = Client::connect_any_with(&urls, opts).unwrap();
    assert_eq!(roamer.url().as_deref(), Some(c.nodes[leader].http.as_str()));
    let roaming = roamer.subscribe("roam.x").unwrap();
    let watcher = c.client(others[0]);
    let watch = watcher.subscribe("roam.x").unwrap();
    // Wait until both subscriptions are known everywhere.
    let publisher = c.client(others[1]);
    let deadline = Instant::now() + WAIT;
    loop {
        publisher.publish_acked("roam.x", json!("hello")).unwrap();
        let a = roaming.recv_timeout(Duration::from_millis(100)).is_ok();
        let b = watch.recv_timeout(Duration::from_millis(100)).is_ok();
        if a && b {
            break;
        }
        assert!(Instant::now() < deadline, "subscriptions never spread");
    }

    let name = c.nodes[leader].name.clone();
    assert_eq!(c.remove(others[0], &name), Ok(json!({"ok": true})));
    let names: Vec<&str> = others.iter().map(|&i| c.nodes[i].name.as_str()).collect();
    c.await_members(others[0], &names);
    c.await_members(others[1], &names);
    c.await_health(leader, 503, "removed from the cluster");

    // The roaming client was closed by the removed node and came back on
    // a member: publishes from a member reach it there.
    let deadline = Instant::now() + WAIT;
    loop {
        let _ = publisher.publish_acked("roam.x", json!("again"));
        let on_member = roamer
            .url()
            .is_some_and(|u| u != c.nodes[leader].http && roamer.is_connected());
        if on_member {
            if let Ok(m) = roaming.recv_timeout(Duration::from_millis(200)) {
                if m.data == json!("again") {
                    break;
                }
                continue;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the removed node's client did not come back on a member (url {:?})",
            roamer.url()
        );
        thread::sleep(Duration::from_millis(50));
    }
    // New clients are refused by the removed node.
    let refused = Client::connect(&c.nodes[leader].http).map(|_| ());
    assert!(
        matches!(&refused, Err(gombus::client::Error::ConnectRefused(m)) if m.contains("removed")),
        "{refused:?}"
    );
}

/// Bad requests get their codes: duplicates and unknown ids are
/// `bad_request`, a second change while a node catches up is
/// `unavailable`, and the node still catching up can be removed.
#[test]
fn bad_membership_requests_are_refused() {
    let c = Nodes::start();
    let n1 = &c.nodes[0];
    let dup_id = json!({"id": "n2", "raft_addr": "127.0.0.1:1", "addr": "127.0.0.1:2"});
    assert_eq!(c.call(0, "cluster.add", dup_id), Err("bad_request".into()));
    let dup_raft = json!({"id": "n9", "raft_addr": n1.raft, "addr": "127.0.0.1:2"});
    assert_eq!(
        c.call(1, "cluster.add", dup_raft),
        Err("bad_request".into())
    );
    let dup_http = json!({"id": "n9", "raft_addr": "127.0.0.1:1", "addr": n1.http});
    assert_eq!(
        c.call(2, "cluster.add", dup_http),
        Err("bad_request".into())
    );
    let no_host = json!({"id": "n9", "raft_addr": ":9999", "addr": "127.0.0.1:2"});
    assert_eq!(c.call(0, "cluster.add", no_host), Err("bad_request".into()));
    assert_eq!(c.remove(1, "n9"), Err("bad_request".into()));

    // A node that never comes: its add waits (the caller gives up), and
    // meanwhile another change is refused as under way.
    let ghost_raft = format!("127.0.0.1:{}", free_port());
    let ghost = json!({"id": "ghost", "raft_addr": ghost_raft, "addr": "127.0.0.1:3"});
    let impatient = c.control(0, Duration::from_millis(1500));
    assert!(impatient.call("cluster.add", ghost).is_err());
    let deadline = Instant::now() + WAIT;
    loop {
        let s = c.status(1).unwrap();
        let listed = s["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == json!("ghost") && p["voter"] == json!(false));
        if listed {
            break;
        }
        assert!(Instant::now() < deadline, "ghost not listed: {s}");
        thread::sleep(Duration::from_millis(50));
    }
    let other = json!({"id": "n8", "raft_addr": "127.0.0.1:4", "addr": "127.0.0.1:5"});
    assert_eq!(c.call(2, "cluster.add", other), Err("unavailable".into()));
    assert_eq!(c.remove(1, "n1").err(), Some("unavailable".into()));
    assert_eq!(c.remove(2, "ghost"), Ok(json!({"ok": true})));
    c.await_members(0, &["n1", "n2", "n3"]);
}

/// Every node id `stream.info` of `stream` names (leader and replicas,
/// sorted), once it names a leader and every replica is current.
fn current_replicas(client: &Client, stream: &str) -> Option<(String, Vec<String>)> {
    let info = client.call("stream.info", json!({ "name": stream })).ok()?;
    let cluster = &info["cluster"];
    let leader = cluster["leader"].as_str()?.to_string();
    let replicas = cluster["replicas"].as_array()?;
    if !replicas.iter().all(|r| r["current"] == json!(true)) {
        return None;
    }
    let mut all: Vec<String> = replicas
        .iter()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect();
    all.push(leader.clone());
    all.sort();
    Some((leader, all))
}

/// Waits until stream `stream` has a leader and its replicas are exactly
/// `want` (sorted), all current; returns the leader.
fn await_replicas(client: &Client, stream: &str, want: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((leader, all)) = current_replicas(client, stream) {
            if all == want {
                return leader;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{stream} is not on {want:?}: {:?}",
            client.call("stream.info", json!({ "name": stream }))
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Of the four nodes n1..n4, `removed` is gone: node `at` lists the three
/// others as members, and stream MOVE's replicas are on them.
fn await_moved(c: &Nodes, at: usize, removed: &str) {
    let stay: Vec<&str> = ["n1", "n2", "n3", "n4"]
        .into_iter()
        .filter(|n| *n != removed)
        .collect();
    c.await_members(at, &stay);
    await_replicas(&c.client(at), "MOVE", &stay);
}

/// Lets `publisher` have 200 more publishes acked, stops it, and checks
/// stream MOVE through node `at` against what was acked.
fn finish_publishing(
    c: &Nodes,
    at: usize,
    acked: &Mutex<Vec<(u64, u64)>>,
    stop: &AtomicBool,
    publisher: thread::JoinHandle<u64>,
) {
    let n = acked.lock().unwrap().len();
    await_acked(acked, n + 200);
    stop.store(true, Ordering::Release);
    let published = publisher.join().unwrap();
    check_stream(&c.client(at), "MOVE", &acked.lock().unwrap(), published);
}

/// Publishes `{"k": k}` for k = 1, 2, … to `subject` through `client`
/// until `stop`, recording each acked `(k, seq)`.
fn stream_publisher(
    client: Client,
    subject: &'static str,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, u64)>>>,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut k = 0;
        while !stop.load(Ordering::Acquire) {
            k += 1;
            if let Ok(ack) = client.publish_stream(subject, json!({ "k": k })) {
                acked.lock().unwrap().push((k, ack.seq));
            }
        }
        k
    })
}

/// Waits until `acked` holds `n` entries.
fn await_acked(acked: &Mutex<Vec<(u64, u64)>>, n: usize) {
    let deadline = Instant::now() + WAIT;
    while acked.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "publishes are not acked");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Reads all of `stream` through a new consumer and checks it: every
/// acked k once, in order, at its acked seq; nothing never published.
fn check_stream(client: &Client, stream: &str, acked: &[(u64, u64)], published: u64) {
    let read = read_stream(client, stream, "check", WAIT);
    let ks: Vec<u64> = read.iter().map(|r| r.1).collect();
    assert!(ks.windows(2).all(|w| w[0] < w[1]), "out of order or twice");
    assert!(ks.iter().all(|&k| k >= 1 && k <= published));
    let stored: std::collections::BTreeMap<u64, u64> =
        read.into_iter().map(|(seq, k)| (k, seq)).collect();
    for &(k, seq) in acked {
        assert_eq!(
            stored.get(&k),
            Some(&seq),
            "acked k {k} (seq {seq}) lost or moved"
        );
    }
}

/// Three nodes and n4 added; R3 stream `MOVE` created through n1 (so on
/// n1..n3). Returns the cluster, n4's index and the stream's leader.
fn four_nodes_with_an_r3_stream() -> (Nodes, usize, String) {
    let mut c = Nodes::start();
    let n4 = c.join("n4", 0);
    assert_eq!(c.add(0, n4), Ok(json!({"ok": true})));
    c.await_members(0, &["n1", "n2", "n3", "n4"]);
    c.await_health(n4, 200, "ok");
    let admin = c.client(0);
    call_until(
        &admin,
        "stream.create",
        json!({"name": "MOVE", "subjects": ["move.>"], "replicas": 3}),
        WAIT,
    );
    let leader = await_replicas(&admin, "MOVE", &["n1", "n2", "n3"]);
    (c, n4, leader)
}

/// docs/PROTOCOL.md "Membership changes": removing a node that holds a
/// replica of an R3 stream (here the stream group's leader) first moves
/// that replica to the one node without any, while a publisher keeps
/// publishing through that node; the removal is answered `{ok}`, the
/// stream lives on the three remaining nodes, and every acked message is
/// there once, in order, at its acked seq.
#[test]
fn removing_a_node_moves_its_stream_replicas_first() {
    let (c, n4, leader) = four_nodes_with_an_r3_stream();
    let gone = c.nodes.iter().position(|n| n.name == leader).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let publisher = stream_publisher(
        c.client(n4),
        "move.k",
        Arc::clone(&stop),
        Arc::clone(&acked),
    );
    await_acked(&acked, 200);

    // Asked of a node that stays.
    let at = (0..3).find(|&i| i != gone).unwrap();
    let t = Instant::now();
    assert_eq!(c.remove(at, &leader), Ok(json!({"ok": true})));
    eprintln!("{leader} removed, its replica moved, in {:?}", t.elapsed());
    c.await_health(gone, 503, "removed from the cluster");
    await_moved(&c, at, &leader);
    // Publishing goes on after the move.
    finish_publishing(&c, n4, &acked, &stop, publisher);
}

/// A node holding a replica of an R3 stream dies for good (SIGKILL, its
/// disk gone); a new node is added and the dead one removed: the dead
/// node's replica is re-created on the new node from the two survivors,
/// and no acked message is lost.
#[test]
fn replacing_a_dead_node_moves_its_stream_replica_to_the_new_one() {
    let (mut c, n4, leader) = four_nodes_with_an_r3_stream();
    // A replica that does not lead the stream's group dies: the control
    // group's leader when it is one (the harder case: the cluster elects
    // again before the removal can be asked).
    let control = c.await_leader(&[0, 1, 2, n4]);
    let dead = if control < 3 && c.nodes[control].name != leader {
        control
    } else {
        (0..3).find(|&i| c.nodes[i].name != leader).unwrap()
    };
    let dead_name = c.nodes[dead].name.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let publisher = stream_publisher(
        c.client(n4),
        "move.k",
        Arc::clone(&stop),
        Arc::clone(&acked),
    );
    await_acked(&acked, 200);
    c.kill(dead);
    let n = acked.lock().unwrap().len();
    await_acked(&acked, n + 200);
    // The dead node may have led the control group: the removal is asked
    // once the others agree on a new leader (while they elect one, it
    // would be answered `unavailable`).
    let alive: Vec<usize> = [0, 1, 2, n4].into_iter().filter(|&i| i != dead).collect();
    c.await_leader(&alive);

    let at = (0..3).find(|&i| i != dead).unwrap();
    assert_eq!(c.remove(at, &dead_name), Ok(json!({"ok": true})));
    await_moved(&c, at, &dead_name);
    finish_publishing(&c, n4, &acked, &stop, publisher);
}

/// Grows 3 → 4 → 5 and shrinks back to 3, removing a node added on the
/// way and then the leader of the control group (a seed that also leads
/// the R3 stream's group, unless leadership moved meanwhile), while one
/// node publishes to the R3 stream and core messages, and another node
/// subscribes: the stream takes publishes again after each step, every
/// acked stream message is read back afterwards at the seq it was acked
/// with, and every acked core message reaches the subscriber once and in
/// order. The publisher's and the subscriber's nodes stay members.
#[test]
fn growing_to_five_and_shrinking_to_three_loses_no_acked_message() {
    let mut c = Nodes::start();
    let leader = c.await_leader(&[0, 1, 2]);
    // The publisher and the subscriber sit on the two seeds that do not
    // lead now, so the leader can be removed later without them.
    let seeds: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (pub_node, sub_node) = (seeds[0], seeds[1]);

    // Created through the leader, so the stream's group starts there
    // too (its preferred first leader): removing that node later moves
    // the stream's leadership as well.
    call_until(
        &c.client(leader),
        "stream.create",
        json!({"name": "SHRINK", "subjects": ["shrink.s.>"], "replicas": 3}),
        WAIT,
    );
    // The stream's group has a leader that serves it.
    call_until(
        &c.client(sub_node),
        "stream.info",
        json!({"name": "SHRINK"}),
        WAIT,
    );
    let sub_client = c.client(sub_node);
    let sub = sub_client.subscribe("shrink.core").unwrap();
    let core_pub = c.client(pub_node);
    let deadline = Instant::now() + WAIT;
    loop {
        core_pub
            .publish_acked("shrink.core", json!(u64::MAX))
            .unwrap();
        if sub.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the subscription never spread");
    }
    while sub.try_recv().ok().flatten().is_some() {}

    // Core messages: numbered, each publish acked or counted as failed.
    let stop = Arc::new(AtomicBool::new(false));
    let core_acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let core_thread = {
        let (stop, acked) = (Arc::clone(&stop), Arc::clone(&core_acked));
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                if core_pub.publish_acked("shrink.core", json!(n)).is_ok() {
                    acked.lock().unwrap().push(n);
                }
                n += 1;
                thread::sleep(Duration::from_millis(3));
            }
            n
        })
    };
    // Stream messages {"k": k}: each acked one with the seq it got; a
    // failed publish (the group electing a leader) is not retried, and
    // the next one waits a little so a leaderless stream is not hammered.
    let stream_acked = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let stream_client = c.client(pub_node);
    let stream_thread = {
        let (stop, acked) = (Arc::clone(&stop), Arc::clone(&stream_acked));
        thread::spawn(move || {
            let mut k = 0u64;
            let mut failed: BTreeMap<String, u64> = BTreeMap::new();
            while !stop.load(Ordering::Acquire) {
                k += 1;
                match stream_client.publish_stream("shrink.s.x", json!({ "k": k })) {
                    Ok(ack) => acked.lock().unwrap().push((k, ack.seq)),
                    Err(e) => {
                        *failed.entry(e.to_string()).or_default() += 1;
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            eprintln!("failed stream publishes: {failed:?}");
            (k, stream_client)
        })
    };
    // Waits until `n` more stream publishes than now are acked: the
    // stream still takes messages in the state the cluster is in.
    let more_stream_acks = |n: usize, what: &str| {
        let want = stream_acked.lock().unwrap().len() + n;
        let deadline = Instant::now() + WAIT;
        while stream_acked.lock().unwrap().len() < want {
            assert!(
                Instant::now() < deadline,
                "the stream took fewer than {n} publishes {what}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    };
    more_stream_acks(50, "before any change");

    let n4 = c.join("n4", pub_node);
    c.await_health(n4, 503, "waiting to be added");
    assert_eq!(c.add(sub_node, n4), Ok(json!({"ok": true})));
    c.await_members(pub_node, &["n1", "n2", "n3", "n4"]);
    // n4 is asked the next change: it must know the members and reach
    // the leader first.
    c.await_members(n4, &["n1", "n2", "n3", "n4"]);
    c.await_health(n4, 200, "ok");
    more_stream_acks(50, "with four members");
    let n5 = c.join("n5", sub_node);
    assert_eq!(c.add(n4, n5), Ok(json!({"ok": true})));
    c.await_members(pub_node, &["n1", "n2", "n3", "n4", "n5"]);
    c.await_health(n5, 200, "ok");
    more_stream_acks(50, "with five members");

    // Shrink: first a node added on the way (one that does not lead),
    // then whoever leads the control group now, unless that is the
    // publisher's or the subscriber's node (then the other added node).
    let leader = c.await_leader(&[0, 1, 2, n4, n5]);
    let first = if leader == n5 { n4 } else { n5 };
    let first_name = c.nodes[first].name.clone();
    assert_eq!(c.remove(pub_node, &first_name), Ok(json!({"ok": true})));
    c.await_health(first, 503, "removed from the cluster");
    let left: Vec<usize> = [0, 1, 2, n4, n5]
        .into_iter()
        .filter(|&i| i != first)
        .collect();
    let leader = c.await_leader(&left);
    let second = if leader == pub_node || leader == sub_node {
        *left
            .iter()
            .find(|&&i| i != pub_node && i != sub_node && i != leader && i >= 3)
            .unwrap_or(&leader)
    } else {
        leader
    };
    eprintln!(
        "removing {} then {} (control leader {})",
        first_name, c.nodes[second].name, c.nodes[leader].name
    );
    let second_name = c.nodes[second].name.clone();
    assert_eq!(c.remove(sub_node, &second_name), Ok(json!({"ok": true})));
    c.await_health(second, 503, "removed from the cluster");
    let stay: Vec<usize> = left.into_iter().filter(|&i| i != second).collect();
    let names: Vec<&str> = stay.iter().map(|&i| c.nodes[i].name.as_str()).collect();
    for &i in &stay {
        c.await_members(i, &names);
    }
    // The stream's three replicas are on the three members (moved off
    // the removed nodes first), all current.
    let mut sorted = names.clone();
    sorted.sort();
    await_replicas(&c.client(sub_node), "SHRINK", &sorted);
    more_stream_acks(50, "after shrinking back to three");

    stop.store(true, Ordering::Release);
    let core_sent = core_thread.join().unwrap();
    let (stream_published, stream_client) = stream_thread.join().unwrap();

    // Core: every acked number arrived once and in order.
    let core_acked = core_acked.lock().unwrap().clone();
    assert!(
        core_acked.len() > 100,
        "only {} core publishes acked",
        core_acked.len()
    );
    let last_acked = *core_acked.last().unwrap();
    let deadline = Instant::now() + WAIT;
    let mut got: Vec<u64> = Vec::new();
    while got.last().is_none_or(|&l| l < last_acked) && Instant::now() < deadline {
        if let Ok(m) = sub.recv_timeout(Duration::from_millis(200)) {
            // u64::MAX: a late copy of the probe sent before.
            match m.data.as_u64() {
                Some(u64::MAX) => {}
                n => got.push(n.expect("a number")),
            }
        }
    }
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "core messages repeated or out of order"
    );
    assert!(
        got.iter().all(|&n| n < core_sent),
        "a core message never published"
    );
    let missing: Vec<u64> = core_acked
        .iter()
        .copied()
        .filter(|n| got.binary_search(n).is_err())
        .collect();
    assert!(missing.is_empty(), "acked core messages lost: {missing:?}");

    // Stream: every acked k at the seq it was acked with, each k once,
    // in publish order; read through the subscriber's node.
    let stream_acked = stream_acked.lock().unwrap().clone();
    let read = read_stream(&c.client(sub_node), "SHRINK", "after", WAIT);
    let mut at: BTreeMap<u64, u64> = BTreeMap::new();
    for &(seq, k) in &read {
        assert!(k >= 1 && k <= stream_published, "k {k} was never published");
        assert!(at.insert(k, seq).is_none(), "k {k} stored twice");
    }
    let ks: Vec<u64> = read.iter().map(|r| r.1).collect();
    assert!(ks.windows(2).all(|w| w[0] < w[1]), "stream out of order");
    for &(k, seq) in &stream_acked {
        assert_eq!(
            at.get(&k),
            Some(&seq),
            "acked k {k} (seq {seq}) missing or moved"
        );
    }
    eprintln!(
        "{} core messages acked, {} stream messages acked of {stream_published}",
        core_acked.len(),
        stream_acked.len()
    );
    drop((stream_client, sub_client));
}
