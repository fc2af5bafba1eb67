//! A socket's subscriptions live and die with that socket, and a delivery
//! never reaches another socket. docs/PROTOCOL.md §2 (Namespaces and
//! CONNECT): a repeated CONNECT to `/` replaces the socket, so whatever the
//! old one held is removed first.
//!
//! - The hostile sequence `40`, `421["sub",…]`, `40`, close, on WebSocket
//!   and on polling (all of it in one POST), for Engine.IO v4 and v3; then
//!   bystanders connect, an unmodified python-socketio client and three raw
//!   ones (one of them takes the connection slot the hostile client left),
//!   a third client publishes to the hostile client's subject, and every
//!   bystander must receive nothing but its own messages; the subscription
//!   count must hold only the bystanders' own.
//! - A seeded, bounded random interleaving of connects, repeated connects,
//!   leaves, subscribes, unsubscribes, closes and publishes across raw
//!   clients: at every checkpoint each live socket has received exactly the
//!   deliveries its own current subscriptions were owed (never a sid it did
//!   not create on that socket), and the broker's subscription count equals
//!   the live sockets' subscriptions. `GOMBUS_IDENTITY_SEED=N` replays a seed.
//!
//! Every wait has a deadline; nothing sleeps to synchronise.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::raw_ws::{Ws, WAIT};
use common::Broker;
use serde_json::Value;

/// Bound on the python bystander's start (interpreter, import, connect).
const PY_START: Duration = Duration::from_secs(20);
const SECRET: &str = "secret.x";
/// Raw clients that join after the python bystander.
const RAW_BYSTANDERS: usize = 3;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------
// HTTP helpers (one request per TCP connection, read to EOF).

fn http(addr: &str, method: &str, target: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut raw = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    s.write_all(&raw).expect("write");
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    let mut chunk = [0u8; 8192];
    loop {
        assert!(Instant::now() < deadline, "no complete answer");
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8(out).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_string())
}

fn metric(addr: &str, name: &str) -> u64 {
    let (_, body) = http(addr, "GET", "/metrics", b"");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// Waits (bounded) until `name` reads `want`.
fn wait_metric(addr: &str, name: &str, want: u64, context: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = metric(addr, name);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{context}: {name} is {got}, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// A raw Engine.IO polling client (v3 or v4 payload framing).

struct Poll {
    addr: String,
    sid: String,
    eio: u8,
}

impl Poll {
    fn target(&self) -> String {
        format!(
            "/socket.io/?EIO={}&transport=polling&sid={}",
            self.eio, self.sid
        )
    }

    fn open(addr: &str, eio: u8) -> Poll {
        let (status, body) = http(
            addr,
            "GET",
            &format!("/socket.io/?EIO={eio}&transport=polling"),
            b"",
        );
        assert_eq!(status, 200, "{body}");
        let open = match eio {
            3 => body.split_once(':').expect("v3 length").1.to_string(),
            _ => body.clone(),
        };
        let json = open.strip_prefix('0').expect("open packet");
        let end = json.find('}').expect("open JSON") + 1;
        let v: Value = serde_json::from_str(&json[..end]).expect("open JSON");
        Poll {
            addr: addr.to_string(),
            sid: v["sid"].as_str().expect("sid").to_string(),
            eio,
        }
    }

    /// Posts Engine.IO packets in one payload.
    fn post(&self, packets: &[&str]) {
        let body = match self.eio {
            3 => packets
                .iter()
                .map(|p| format!("{}:{p}", p.encode_utf16().count()))
                .collect::<String>(),
            _ => packets.join("\x1e"),
        };
        let (status, answer) = http(&self.addr, "POST", &self.target(), body.as_bytes());
        assert_eq!((status, answer.as_str()), (200, "ok"));
    }
}

// ---------------------------------------------------------------------------
// The python-socketio bystander.

struct Bystander {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Bystander {
    fn start(url: &str, transport: &str) -> Bystander {
        let root = repo_root();
        let python = root.join(".venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run scripts/test-deps.sh",
            python.display()
        );
        let mut child = Command::new(python)
            .arg(root.join("tests/interop/py_bystander.py"))
            .arg(url)
            .arg(transport)
            .current_dir(&root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut b = Bystander { child, lines };
        let ready = b.line(PY_START);
        assert_eq!(ready, "READY", "python bystander did not start");
        b
    }

    fn line(&mut self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("python bystander said nothing within {within:?}: {e}"))
    }
}

impl Drop for Bystander {
    /// Closes its stdin (it disconnects and exits), waits for that within
    /// a bound, and kills it (by PID) past it.
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the hostile client does before it leaves.
enum Transport {
    WebSocket,
    Polling,
}

/// The hostile sequence, then the bystander; see the module comment.
fn orphan_case(transport: Transport, eio: u8) {
    let broker = Broker::start(&["-ping-interval=2s"]);
    let addr = broker.addr.clone();
    // The publisher joins first, so it holds a slot of its own.
    let mut publisher = Ws::join(&addr);
    let sub = format!("[\"sub\",{{\"subject\":\"{SECRET}\",\"sid\":\"orphan\"}}]");
    let py_transport = match transport {
        Transport::WebSocket => {
            let mut a = Ws::open(&addr, eio);
            a.connect();
            a.send(&format!("21{sub}"));
            let ack = a.next(|p| p.starts_with("31["));
            assert!(ack.contains("\"ok\":true"), "{ack}");
            a.connect();
            a.close();
            "websocket"
        }
        Transport::Polling => {
            let a = Poll::open(&addr, eio);
            a.post(&["40", &format!("421{sub}"), "40"]);
            a.post(&["1"]);
            "polling"
        }
    };
    wait_metric(&addr, "gombus_sessions", 1, "the hostile client left");
    // Raw bystanders as well, so that whichever connection the hostile
    // client's slot went to is a bystander's: on polling, python's HTTP
    // connections may take it before its session does, so the raw ones
    // join first there.
    let join_raw = || -> Vec<Ws> {
        (0..RAW_BYSTANDERS)
            .map(|_| {
                let mut r = Ws::join(&addr);
                let ack = r.call("sub", r#"{"subject":"bystander.mark","sid":"mine"}"#);
                assert_eq!(ack["ok"], true, "{ack}");
                r
            })
            .collect()
    };
    let polling = py_transport == "polling";
    let mut raw = if polling { join_raw() } else { Vec::new() };
    let mut b = Bystander::start(&format!("http://{addr}"), py_transport);
    if !polling {
        raw = join_raw();
    }
    let published = publisher.call(
        "pub",
        &format!("{{\"subject\":\"{SECRET}\",\"data\":\"for orphan only\"}}"),
    );
    assert_eq!(published["ok"], true, "{published}");
    let mark = publisher.call("pub", r#"{"subject":"bystander.mark","data":"end"}"#);
    assert_eq!(mark["ok"], true, "{mark}");
    let verdict = b.line(WAIT * 2);
    assert_eq!(verdict, "PASS bystander", "python-socketio bystander");
    for r in &mut raw {
        r.next(|p| p.contains("\"subject\":\"bystander.mark\""));
        let foreign: Vec<String> = r
            .inbox
            .iter()
            .filter(|p| p.contains("msg"))
            .cloned()
            .collect();
        assert!(foreign.is_empty(), "a raw bystander received {foreign:?}");
    }
    // Only the bystanders' own subscriptions are left.
    assert_eq!(
        metric(&addr, "gombus_subscriptions"),
        1 + RAW_BYSTANDERS as u64,
        "a closed socket's subscription is still in the index"
    );
}

#[test]
fn repeated_connect_over_websocket_eio4_reaches_no_stranger() {
    orphan_case(Transport::WebSocket, 4);
}

#[test]
fn repeated_connect_over_websocket_eio3_reaches_no_stranger() {
    orphan_case(Transport::WebSocket, 3);
}

#[test]
fn repeated_connect_over_polling_eio4_reaches_no_stranger() {
    orphan_case(Transport::Polling, 4);
}

#[test]
fn repeated_connect_over_polling_eio3_reaches_no_stranger() {
    orphan_case(Transport::Polling, 3);
}

/// A repeated CONNECT answers with a new socket id and leaves the old
/// socket's subscriptions behind; the new socket works.
#[test]
fn repeated_connect_replaces_the_socket() {
    let broker = Broker::start(&[]);
    let addr = broker.addr.clone();
    let mut a = Ws::open(&addr, 4);
    let first = a.connect();
    let ack = a.call("sub", r#"{"subject":"a.b","sid":"old"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    let second = a.connect();
    assert!(second.starts_with("0{\"sid\":"), "{second}");
    assert_ne!(first, second, "a new socket gets a new id");
    assert_eq!(metric(&addr, "gombus_subscriptions"), 0);
    let ack = a.call("unsub", r#"{"sid":"old"}"#);
    assert_eq!(ack["error"]["code"], "not_found", "{ack}");
    // The sid is free again on the new socket.
    let ack = a.call("sub", r#"{"subject":"a.b","sid":"old"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    let ack = a.call("pub", r#"{"subject":"a.b","data":1}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    a.call("ping", "{}");
    assert_eq!(a.take_msgs(), vec![("old".to_string(), Value::from(1))]);
}

// ---------------------------------------------------------------------------
// The randomized interleaving.

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One raw client of the random run and what it is owed.
struct Actor {
    ws: Ws,
    joined: bool,
    /// Its current socket's subscriptions: sid -> subject.
    subs: BTreeMap<String, String>,
    /// Deliveries owed since the last checkpoint: (sid, publish number).
    owed: Vec<(String, u64)>,
}

const ACTORS: usize = 5;
const SUBJECTS: u64 = 4;
const OPS: usize = 2000;
const CHECK_EVERY: usize = 25;

fn checkpoint(addr: &str, actors: &mut [Option<Actor>], seed: u64, op: usize) {
    let mut live_subs = 0;
    for (i, slot) in actors.iter_mut().enumerate() {
        let Some(a) = slot else { continue };
        if !a.joined {
            // Events on a namespace not joined go unanswered: join again.
            let answer = a.ws.connect();
            assert!(answer.starts_with("0{"), "seed {seed} op {op}: {answer}");
            a.joined = true;
        }
        // Every delivery of an earlier publish is queued before this ack.
        let pong = a.ws.call("ping", "{}");
        assert_eq!(pong["ok"], true, "seed {seed} op {op}: {pong}");
        let mut got: Vec<(String, u64)> =
            a.ws.take_msgs()
                .into_iter()
                .map(|(sid, data)| (sid, data.as_u64().expect("publish number")))
                .collect();
        got.sort();
        let mut owed = std::mem::take(&mut a.owed);
        owed.sort();
        assert_eq!(
            got, owed,
            "seed {seed} op {op}: actor {i} received (left) other than owed (right); \
             replay with GOMBUS_IDENTITY_SEED={seed}"
        );
        live_subs += a.subs.len() as u64;
    }
    wait_metric(
        addr,
        "gombus_subscriptions",
        live_subs,
        &format!("seed {seed} op {op}: subscriptions of live sockets only"),
    );
}

#[test]
fn random_interleaving_keeps_every_subscription_with_its_socket() {
    let seed = std::env::var("GOMBUS_IDENTITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0019_u64);
    let broker = Broker::start(&[]);
    let addr = broker.addr.clone();
    let mut rng = Rng(seed | 1);
    let mut publisher = Ws::join(&addr);
    let mut actors: Vec<Option<Actor>> = (0..ACTORS).map(|_| None).collect();
    let mut next_sid = 0u64;
    let mut publishes = 0u64;
    let mut seen_ops: HashMap<&str, usize> = HashMap::new();
    for op in 0..OPS {
        let i = rng.below(ACTORS as u64) as usize;
        let roll = rng.below(100);
        let what = match &mut actors[i] {
            None => {
                actors[i] = Some(Actor {
                    ws: Ws::join(&addr),
                    joined: true,
                    subs: BTreeMap::new(),
                    owed: Vec::new(),
                });
                "open"
            }
            Some(a) if !a.joined => {
                let answer = a.ws.connect();
                assert!(answer.starts_with("0{"), "seed {seed} op {op}: {answer}");
                a.joined = true;
                "connect"
            }
            Some(_) if (50..=57).contains(&roll) => {
                if let Some(a) = actors[i].take() {
                    if rng.below(2) == 0 {
                        a.ws.close();
                    } else {
                        // Gone without a goodbye.
                        drop(a);
                    }
                }
                "close"
            }
            Some(a) => match roll {
                0..=9 => {
                    let answer = a.ws.connect();
                    assert!(answer.starts_with("0{"), "seed {seed} op {op}: {answer}");
                    // A new socket: the old one's subscriptions are gone.
                    a.subs.clear();
                    "reconnect"
                }
                10..=14 => {
                    a.ws.send("1");
                    a.subs.clear();
                    a.joined = false;
                    "leave"
                }
                15..=39 => {
                    next_sid += 1;
                    let sid = format!("s{next_sid}");
                    let subject = format!("r.{}", rng.below(SUBJECTS));
                    let ack = a.ws.call(
                        "sub",
                        &format!("{{\"subject\":\"{subject}\",\"sid\":\"{sid}\"}}"),
                    );
                    assert_eq!(ack["ok"], true, "seed {seed} op {op}: {ack}");
                    a.subs.insert(sid, subject);
                    "sub"
                }
                40..=49 if !a.subs.is_empty() => {
                    let k = rng.below(a.subs.len() as u64) as usize;
                    let sid = a.subs.keys().nth(k).cloned().unwrap_or_default();
                    let ack = a.ws.call("unsub", &format!("{{\"sid\":\"{sid}\"}}"));
                    assert_eq!(ack["ok"], true, "seed {seed} op {op}: {ack}");
                    a.subs.remove(&sid);
                    "unsub"
                }
                _ => {
                    publishes += 1;
                    let subject = format!("r.{}", rng.below(SUBJECTS));
                    let ack = publisher.call(
                        "pub",
                        &format!("{{\"subject\":\"{subject}\",\"data\":{publishes}}}"),
                    );
                    assert_eq!(ack["ok"], true, "seed {seed} op {op}: {ack}");
                    for a in actors.iter_mut().flatten() {
                        for (sid, s) in &a.subs {
                            if *s == subject {
                                a.owed.push((sid.clone(), publishes));
                            }
                        }
                    }
                    "pub"
                }
            },
        };
        *seen_ops.entry(what).or_default() += 1;
        if op % CHECK_EVERY == CHECK_EVERY - 1 {
            checkpoint(&addr, &mut actors, seed, op);
        }
    }
    checkpoint(&addr, &mut actors, seed, OPS);
    // The run exercised every kind of step.
    let kinds: HashSet<&str> = seen_ops.keys().copied().collect();
    for k in [
        "open",
        "connect",
        "reconnect",
        "leave",
        "sub",
        "unsub",
        "close",
        "pub",
    ] {
        assert!(
            kinds.contains(k),
            "seed {seed}: no {k} step in {seen_ops:?}"
        );
    }
}
