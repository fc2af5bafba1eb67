//! Test harness for cluster mode: three real `broker` processes on loopback
//! (fixed free ports picked up front, since every node must know the
//! others' addresses), or on addresses the caller gives with a launcher
//! command each is started through (tests/netns_support puts each in a
//! network namespace), each with its own data directory under one temporary
//! root. Nodes can be killed (SIGKILL), stopped and continued (SIGSTOP /
//! SIGCONT, to cut one node off from the others), terminated (SIGTERM) and
//! restarted on the same ports and data. Dropping the cluster continues
//! every stopped process first, then kills every process by its PID.
//! [`Launch`] picks how the nodes are told about each other: the plain
//! `host:port` list, or the contract's launch lines (`id=URL` pairs).

#![allow(dead_code)] // Each test binary uses a different part of it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

#[path = "../support/mod.rs"]
pub mod support;

#[allow(unused_imports)] // each test binary calls a different part
pub use support::{broker_bin, free_port, free_ports, http_get, try_http_get, TempDir};

use gombus::client::{Client, Options, Reconnect};
use serde_json::{json, Value};

pub const CONTROL_TOKEN: &str = "cluster-secret";
/// The control token of the contract's launch lines.
pub const LAUNCH_LINE_TOKEN: &str = "secret";
/// Node ids, in index order.
pub const IDS: [&str; 3] = ["n1", "n2", "n3"];
/// How long a node may take to print its `listening on` line.
const STARTUP_WAIT: Duration = Duration::from_secs(15);
/// How long a fresh (or restarted) cluster may take to agree on a leader.
pub const LEADER_WAIT: Duration = Duration::from_secs(10);
/// Stderr lines kept per node, shown when a test fails.
const LOG_LINES_MAX: usize = 300;
const LISTENING_MARKER: &str = "listening on ";

/// Held by each running cluster: the tests of one binary run their clusters
/// one after another, so timings (elections, failover) are not measured on
/// a host busy with several clusters at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How the nodes' flags are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// `-cluster` lists the other nodes' `host:port`; every address is a
    /// loopback `127.0.0.1:PORT`; `-data` is absolute.
    Plain,
    /// As the contract's section 9 launch lines: `-cluster` holds every
    /// node as `id=http://127.0.0.1:PORT/socket.io` (its own entry
    /// included), n1 listens as `-addr=:PORT -raft-addr=:PORT`, the
    /// control token is `secret`, and `-data=./data/ID` is relative to the
    /// cluster's root (the nodes' working directory).
    UrlLines,
}

/// One running node process.
struct Proc {
    child: Child,
    stopped: bool,
}

/// Changes the flags node `i` is started with (see [`Cluster::prepare`]).
pub type ArgsEdit = Box<dyn Fn(usize, &mut Vec<String>) + Send + Sync>;

/// Three brokers forming one Raft group.
pub struct Cluster {
    /// `127.0.0.1:PORT` of each node's HTTP / Socket.IO listener.
    pub http: Vec<String>,
    /// `127.0.0.1:PORT` of each node's Raft listener.
    pub raft: Vec<String>,
    /// Applied to every node's flags at each start.
    pub edit_args: Option<ArgsEdit>,
    /// A command node `i`'s broker is started through, the broker's path
    /// and flags appended (e.g. `ip netns exec NS`, which execs it, so the
    /// process is still the broker's PID); none when empty.
    pub launcher: Vec<Vec<String>>,
    root: PathBuf,
    procs: Vec<Option<Proc>>,
    logs: Vec<Arc<Mutex<VecDeque<String>>>>,
    launch: Launch,
    /// Released after `Drop::drop` has killed every node.
    _turn: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts n1..n3 and waits (bounded) until all of them listen and
    /// agree on a leader.
    pub fn start() -> Cluster {
        Cluster::start_with(Launch::Plain)
    }

    /// [`Cluster::start`] with the flags written as `launch` says.
    pub fn start_with(launch: Launch) -> Cluster {
        let mut cluster = Cluster::prepare_with(launch);
        cluster.launch();
        cluster.await_leader(&[0, 1, 2], LEADER_WAIT);
        cluster.await_healthy(&[0, 1, 2], LEADER_WAIT);
        cluster
    }

    /// Picks the ports and the data root, starting nothing: set
    /// `edit_args`, then [`Cluster::launch`].
    pub fn prepare() -> Cluster {
        Cluster::prepare_with(Launch::Plain)
    }

    /// [`Cluster::prepare`] with the flags written as `launch` says.
    pub fn prepare_with(launch: Launch) -> Cluster {
        // Six distinct ports: one at a time, a port just let go can be
        // handed out again.
        let mut addrs: Vec<String> = free_ports(6)
            .into_iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let raft = addrs.split_off(3);
        Cluster::prepare_at(launch, addrs, raft)
    }

    /// [`Cluster::prepare_with`] on the given HTTP and Raft addresses
    /// (e.g. each node's own address in a network namespace).
    pub fn prepare_at(launch: Launch, http: Vec<String>, raft: Vec<String>) -> Cluster {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        // Removed when the cluster drops, once its processes are gone.
        let root = TempDir::new("cluster").keep();
        Cluster {
            http,
            raft,
            edit_args: None,
            launcher: vec![Vec::new(); 3],
            root,
            procs: (0..3).map(|_| None).collect(),
            logs: (0..3)
                .map(|_| Arc::new(Mutex::new(VecDeque::new())))
                .collect(),
            launch,
            _turn: turn,
        }
    }

    /// Starts every node and waits (bounded) until each listens.
    pub fn launch(&mut self) {
        let waits: Vec<_> = (0..3).map(|i| self.spawn(i)).collect();
        for (i, lines) in waits.into_iter().enumerate() {
            self.await_listening(i, &lines);
        }
    }

    /// Waits until `/healthz` answers 200 on every node in `nodes` (a
    /// leader is known and the node has caught up with the cluster).
    pub fn await_healthy(&self, nodes: &[usize], within: Duration) {
        let deadline = Instant::now() + within;
        for &i in nodes {
            loop {
                let answer = try_http_get(&self.http[i], "/healthz");
                if matches!(answer, Ok((200, _))) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} /healthz still {answer:?} after {within:?}",
                    IDS[i]
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The control token the nodes are started with.
    pub fn token(&self) -> &'static str {
        match self.launch {
            Launch::Plain => CONTROL_TOKEN,
            Launch::UrlLines => LAUNCH_LINE_TOKEN,
        }
    }

    /// The flags node `i` is started with.
    pub fn args(&self, i: usize) -> Vec<String> {
        if self.launch == Launch::UrlLines {
            return self.launch_line(i);
        }
        let peers = (0..3)
            .map(|j| format!("{}={}", IDS[j], self.raft[j]))
            .collect::<Vec<_>>()
            .join(",");
        let others = (0..3)
            .filter(|&j| j != i)
            .map(|j| self.http[j].clone())
            .collect::<Vec<_>>()
            .join(",");
        let mut args = vec![
            format!("-node-id={}", IDS[i]),
            format!("-addr={}", self.http[i]),
            format!("-data={}", self.root.join(IDS[i]).display()),
            format!("-raft-addr={}", self.raft[i]),
            format!("-raft-peers={peers}"),
            format!("-cluster={others}"),
            "-bootstrap".to_string(),
            format!("-control-token={CONTROL_TOKEN}"),
        ];
        if let Some(edit) = &self.edit_args {
            edit(i, &mut args);
        }
        args
    }

    /// Node `i`'s flags in the contract's launch-line form (n1's with
    /// `:port` listen addresses).
    fn launch_line(&self, i: usize) -> Vec<String> {
        let port = |a: &str| a.rsplit_once(':').map(|(_, p)| p.to_string());
        let (addr, raft_addr) = if i == 0 {
            (
                format!(":{}", port(&self.http[i]).unwrap_or_default()),
                format!(":{}", port(&self.raft[i]).unwrap_or_default()),
            )
        } else {
            (self.http[i].clone(), self.raft[i].clone())
        };
        let peers = (0..3)
            .map(|j| format!("{}={}", IDS[j], self.raft[j]))
            .collect::<Vec<_>>()
            .join(",");
        let urls = (0..3)
            .map(|j| format!("{}=http://{}/socket.io", IDS[j], self.http[j]))
            .collect::<Vec<_>>()
            .join(",");
        vec![
            format!("-node-id={}", IDS[i]),
            format!("-addr={addr}"),
            format!("-raft-addr={raft_addr}"),
            format!("-raft-peers={peers}"),
            format!("-cluster={urls}"),
            format!("-control-token={LAUNCH_LINE_TOKEN}"),
            format!("-data=./data/{}", IDS[i]),
            "-bootstrap".to_string(),
        ]
    }

    fn spawn(&mut self, i: usize) -> mpsc::Receiver<String> {
        let bin = broker_bin();
        let mut command = match self.launcher[i].split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        command.args(self.args(i)).current_dir(&self.root);
        let (child, rx, _) =
            support::spawn_logged(&mut command, &bin, &self.logs[i], LOG_LINES_MAX);
        self.procs[i] = Some(Proc {
            child,
            stopped: false,
        });
        rx
    }

    fn await_listening(&mut self, i: usize, lines: &mpsc::Receiver<String>) {
        let deadline = Instant::now() + STARTUP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(LISTENING_MARKER) => return,
                Ok(_) => {}
                Err(e) => {
                    // Say whether the process died or is still up (busy,
                    // or stuck), the first thing a failed start needs.
                    let state = match self.procs[i].as_mut().map(|p| p.child.try_wait()) {
                        Some(Ok(Some(status))) => format!("it exited: {status}"),
                        Some(Ok(None)) => "it is still running".to_string(),
                        Some(Err(e)) => format!("its state is unknown: {e}"),
                        None => "it was not started".to_string(),
                    };
                    panic!(
                        "{} did not print `{LISTENING_MARKER}` within {STARTUP_WAIT:?} ({e}); \
                         {state}; stderr:\n{}",
                        IDS[i],
                        self.log(i)
                    )
                }
            }
        }
    }

    /// Node `i`'s last stderr lines.
    pub fn log(&self, i: usize) -> String {
        let log = self.logs[i].lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i]
            .as_ref()
            .expect("node is not running")
            .child
            .id()
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.procs[i].is_some()
    }

    /// True while node `i` is stopped by [`Cluster::pause`].
    pub fn is_paused(&self, i: usize) -> bool {
        self.procs[i].as_ref().is_some_and(|p| p.stopped)
    }

    /// Node `i`'s `-data` directory.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        match self.launch {
            Launch::Plain => self.root.join(IDS[i]),
            Launch::UrlLines => self.root.join("data").join(IDS[i]),
        }
    }

    /// A messaging (`/`) client of node `i`.
    pub fn client(&self, i: usize) -> Client {
        Client::connect(&self.http[i])
            .unwrap_or_else(|e| panic!("connect to {} ({}): {e}", IDS[i], self.http[i]))
    }

    /// A messaging client of node `i` that reconnects (to the same node)
    /// after the connection drops, re-sending its subscriptions.
    pub fn reconnecting_client(&self, i: usize) -> Client {
        let opts = Options {
            reconnect: Some(Reconnect {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(250),
                jitter: 0.2,
                max_attempts: None,
            }),
            ..Default::default()
        };
        Client::connect_with(&self.http[i], opts)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", IDS[i]))
    }

    /// A `/control` client of node `i`.
    pub fn control(&self, i: usize) -> Client {
        self.control_with_timeout(i, Duration::from_secs(5))
    }

    pub fn control_with_timeout(&self, i: usize, timeout: Duration) -> Client {
        let opts = Options {
            namespace: "/control".into(),
            token: Some(self.token().into()),
            timeout,
            ..Default::default()
        };
        Client::connect_with(&self.http[i], opts)
            .unwrap_or_else(|e| panic!("connect to {}/control: {e}", IDS[i]))
    }

    /// Node `i`'s `cluster.status` ack, or why it could not be had.
    pub fn status(&self, i: usize) -> Result<Value, String> {
        let opts = Options {
            namespace: "/control".into(),
            token: Some(self.token().into()),
            timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let c = Client::connect_with(&self.http[i], opts).map_err(|e| e.to_string())?;
        let v = c
            .call("cluster.status", json!({}))
            .map_err(|e| e.to_string())?;
        let _ = c.close();
        Ok(v)
    }

    /// Waits until every node in `nodes` reports the same non-null leader
    /// (one of `nodes`) in the same term; returns the leader's index and
    /// the term.
    pub fn await_leader(&self, nodes: &[usize], within: Duration) -> (usize, u64) {
        let deadline = Instant::now() + within;
        let mut last;
        loop {
            last = nodes.iter().map(|&i| self.status(i)).collect::<Vec<_>>();
            if let Some(found) = agreed_leader(&last) {
                if let Some(&l) = nodes.iter().find(|&&i| IDS[i] == found.0) {
                    return (l, found.1);
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "nodes {:?} did not agree on a leader within {within:?}; last statuses: {last:?}",
            nodes.iter().map(|&i| IDS[i]).collect::<Vec<_>>()
        );
    }

    /// Every node's recent stderr, labelled.
    pub fn all_logs(&self) -> String {
        (0..3)
            .map(|i| format!("--- {} stderr (last lines) ---\n{}", IDS[i], self.log(i)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILL node `i` (by PID) and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            if p.stopped {
                signal(p.child.id(), "CONT");
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// SIGTERM node `i` and wait at most `limit` for it to exit; kills it
    /// if it is still running then. True if it exited on its own.
    pub fn terminate(&mut self, i: usize, limit: Duration) -> bool {
        let Some(mut p) = self.procs[i].take() else {
            return true;
        };
        signal(p.child.id(), "TERM");
        let deadline = Instant::now() + limit;
        loop {
            match p.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    return false;
                }
            }
        }
    }

    /// Starts node `i` again on its ports and data directory and waits
    /// (bounded) until it listens.
    pub fn restart(&mut self, i: usize) {
        assert!(self.procs[i].is_none(), "{} is still running", IDS[i]);
        let lines = self.spawn(i);
        self.await_listening(i, &lines);
    }

    /// Starts every node in `nodes` again (all at once, so none waits on
    /// the others to form a majority) and waits until each listens.
    pub fn restart_all(&mut self, nodes: &[usize]) {
        let waits: Vec<_> = nodes
            .iter()
            .map(|&i| {
                assert!(self.procs[i].is_none(), "{} is still running", IDS[i]);
                (i, self.spawn(i))
            })
            .collect();
        for (i, lines) in waits {
            self.await_listening(i, &lines);
        }
    }

    /// SIGSTOP node `i`: it keeps its sockets but answers nothing.
    pub fn pause(&mut self, i: usize) {
        let p = self.procs[i].as_mut().expect("node is not running");
        signal(p.child.id(), "STOP");
        p.stopped = true;
    }

    /// SIGCONT node `i` after [`Cluster::pause`].
    pub fn resume(&mut self, i: usize) {
        let p = self.procs[i].as_mut().expect("node is not running");
        if p.stopped {
            signal(p.child.id(), "CONT");
            p.stopped = false;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Continue before killing, so no stopped process is left behind.
        for p in self.procs.iter_mut().flatten() {
            if p.stopped {
                signal(p.child.id(), "CONT");
                p.stopped = false;
            }
        }
        for i in 0..3 {
            self.kill(i);
        }
        if thread::panicking() {
            eprintln!("{}", self.all_logs());
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `kill -SIG pid`.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status();
}

/// The (leader, term) every status agrees on, if they all do.
fn agreed_leader(statuses: &[Result<Value, String>]) -> Option<(String, u64)> {
    let mut agreed: Option<(String, u64)> = None;
    for s in statuses {
        let s = s.as_ref().ok()?;
        let leader = s["leader"].as_str()?.to_string();
        let term = s["term"].as_u64()?;
        match &agreed {
            None => agreed = Some((leader, term)),
            Some(a) if *a == (leader.clone(), term) => {}
            Some(_) => return None,
        }
    }
    agreed
}

/// The leader of stream `name`'s Raft group as node `i`'s `/metrics`
/// names it, as an index into the cluster's nodes (None: none known, or
/// the node does not answer).
pub fn stream_group_leader(c: &Cluster, i: usize, name: &str) -> Option<usize> {
    let (code, body) = try_http_get(&c.http[i], "/metrics").ok()?;
    if code != 200 {
        return None;
    }
    let prefix = format!("gombus_stream_group_leader{{stream=\"{name}\"}} ");
    let id = body
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<f64>().ok())?;
    // Seed members' Raft ids are their places in the sorted ids, from 1.
    (id >= 1.0)
        .then(|| id as usize - 1)
        .filter(|&k| k < c.http.len())
}

/// Polls until every node of `nodes` names the same leader of stream
/// `name`'s group, one `accept` takes; returns its index. Fails after
/// `within`.
pub fn agreed_stream_group_leader(
    c: &Cluster,
    nodes: &[usize],
    name: &str,
    within: Duration,
    accept: impl Fn(usize) -> bool,
) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let seen: Vec<Option<usize>> = nodes
            .iter()
            .map(|&i| stream_group_leader(c, i, name))
            .collect();
        if let Some(l) = seen[0].filter(|&l| accept(l)) {
            if seen.iter().all(|s| *s == Some(l)) {
                return l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "nodes {nodes:?} never agreed on a leader of {name}'s group within {within:?}: \
             {seen:?}\n{}",
            c.all_logs()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// `event` through `client`, retried while it fails (a stream group
/// electing its leader answers `unavailable`), for at most `within`.
pub fn call_until(client: &Client, event: &str, args: Value, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        match client.call(event, args.clone()) {
            Ok(v) => return v,
            Err(e) => assert!(
                Instant::now() < deadline,
                "{event} {args} kept failing: {e}"
            ),
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Reads stream `stream` whole through a new consumer `consumer`: each
/// message's `(seq, k)` (`k` from its `{"k": …}` data) in delivery
/// order, each acked; every call retried for at most `within`.
pub fn read_stream(
    client: &Client,
    stream: &str,
    consumer: &str,
    within: Duration,
) -> Vec<(u64, u64)> {
    call_until(
        client,
        "consumer.create",
        json!({"stream": stream, "name": consumer}),
        within,
    );
    let mut out = Vec::new();
    let deadline = Instant::now() + within;
    loop {
        let got = call_until(
            client,
            "consumer.fetch",
            json!({"stream": stream, "consumer": consumer, "batch": 256, "no_wait": true}),
            within,
        );
        let msgs = got["messages"].as_array().cloned().unwrap_or_default();
        if msgs.is_empty() {
            return out;
        }
        for m in msgs {
            let seq = m["seq"].as_u64().expect("a seq");
            out.push((seq, m["data"]["k"].as_u64().expect("k in data")));
            call_until(
                client,
                "ack",
                json!({"stream": stream, "consumer": consumer, "seq": seq}),
                within,
            );
        }
        assert!(Instant::now() < deadline, "reading {stream} never ended");
    }
}

/// Whether a node's data directory `data` holds the Raft snapshot record
/// of some stream group (`raft/g<group>/snapshot`; the control group's is
/// not one).
pub fn has_group_snapshot(data: &std::path::Path) -> bool {
    let Ok(dirs) = std::fs::read_dir(data.join("raft")) else {
        return false;
    };
    dirs.flatten().any(|d| {
        d.file_name().to_string_lossy().starts_with('g') && d.path().join("snapshot").is_file()
    })
}

/// The `stream.info` cluster entry of replica `node` (an index into
/// `IDS`), if listed; the `cluster` field is read at the top level or
/// under `stream`.
pub fn replica_entry(info: &Value, node: usize) -> Option<Value> {
    info.get("cluster")
        .or_else(|| info["stream"].get("cluster"))?
        .get("replicas")?
        .as_array()?
        .iter()
        .find(|r| r["node"].as_str() == Some(IDS[node]))
        .cloned()
}
