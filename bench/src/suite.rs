//! The whole benchmark: for every run, peer and group of workloads, start
//! the peer fresh on loopback ports that are free, run the group against
//! it, stop it by PID (TERM, then KILL after 5 s), and write one JSON line
//! per result; at the end, the table of medians. Everything is set by
//! environment variables (see [`Settings::from_env`]); a peer whose
//! program is missing is skipped with a line saying so.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::conn::Proto;
use crate::cpu;
use crate::report;
use crate::work::{self, Spec};

/// Workloads run when WORKLOADS is not set.
pub const DEFAULT_WORKLOADS: &str = "fanout queue reqrep stream kv conns fanout3 stream3";
pub const DEFAULT_PEERS: &str = "gombus nats nats-ws sio-relay";

pub struct Settings {
    pub runs: u32,
    pub workloads: Vec<String>,
    pub peers: Vec<String>,
    pub fanout_msgs: u64,
    pub queue_msgs: u64,
    pub reqrep_msgs: u64,
    pub stream_msgs: u64,
    pub stream3_msgs: u64,
    pub kv_msgs: u64,
    pub kv_keys: u64,
    pub kv_watch_msgs: u64,
    pub kv_watch_rate: u64,
    pub cluster_msgs: u64,
    pub window: u64,
    pub conns: u64,
    pub size: usize,
    pub subs: u64,
    pub batch: u64,
    /// `auto`: reqrep with peer and loadgen on CPU 0, the rest unpinned;
    /// `none`: nothing pinned; `one`: every workload on CPU 0.
    pub pin: String,
    pub gombus_bin: Option<PathBuf>,
    pub gombus_args: Vec<String>,
    pub nats_server: String,
    pub node: String,
    pub relay_dir: Option<PathBuf>,
    pub out: PathBuf,
    pub cluster_wait: Duration,
}

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| d.to_string())
}

fn env_num(k: &str, d: u64) -> Result<u64, String> {
    env_or(k, &d.to_string())
        .trim()
        .parse()
        .map_err(|_| format!("{k} must be a whole number"))
}

impl Settings {
    pub fn from_env() -> Result<Settings, String> {
        let words = |k: &str, d: &str| {
            env_or(k, d)
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let s = Settings {
            runs: env_num("RUNS", 3)? as u32,
            workloads: words("WORKLOADS", DEFAULT_WORKLOADS),
            peers: words("PEERS", DEFAULT_PEERS),
            fanout_msgs: env_num("FANOUT_MSGS", 500_000)?,
            queue_msgs: env_num("QUEUE_MSGS", 1_000_000)?,
            reqrep_msgs: env_num("REQREP_MSGS", 20_000)?,
            stream_msgs: env_num("STREAM_MSGS", 300_000)?,
            stream3_msgs: env_num("STREAM3_MSGS", 300_000)?,
            kv_msgs: env_num("KV_MSGS", 100_000)?,
            kv_keys: env_num("KV_KEYS", 10_000)?.max(1),
            kv_watch_msgs: env_num("KV_WATCH_MSGS", 10_000)?,
            kv_watch_rate: env_num("KV_WATCH_RATE", 2000)?.max(1),
            cluster_msgs: env_num("CLUSTER_MSGS", 200_000)?,
            window: env_num("STREAM_WINDOW", 256)?,
            conns: env_num("CONNS", 5000)?,
            size: env_num("SIZE", 128)? as usize,
            subs: env_num("SUBS", 4)?,
            batch: env_num("BATCH", 128)?.max(1),
            pin: env_or("PIN", "auto"),
            gombus_bin: std::env::var_os("GOMBUS_BIN").map(PathBuf::from),
            gombus_args: words("GOMBUS_ARGS", ""),
            nats_server: env_or("NATS_SERVER", "nats-server"),
            node: env_or("NODE", "node"),
            relay_dir: std::env::var_os("RELAY_DIR").map(PathBuf::from),
            out: PathBuf::from(env_or(
                "GOMBUS_BENCH_OUT",
                "/tmp/gombus-bench-own/results/latest",
            )),
            cluster_wait: Duration::from_secs(env_num("CLUSTER_WAIT", 30)?),
        };
        for w in &s.workloads {
            if ![
                "fanout", "queue", "reqrep", "stream", "kv", "conns", "fanout3", "stream3",
            ]
            .contains(&w.as_str())
            {
                return Err(format!("unknown workload {w:?} in WORKLOADS"));
            }
        }
        for p in &s.peers {
            if !["gombus", "nats", "nats-ws", "sio-relay"].contains(&p.as_str()) {
                return Err(format!(
                    "unknown peer {p:?} in PEERS (gombus, nats, nats-ws, sio-relay)"
                ));
            }
        }
        if !["auto", "none", "one"].contains(&s.pin.as_str()) {
            return Err("PIN must be auto, none or one".into());
        }
        if s.size < crate::payload::DIGITS {
            return Err(format!("SIZE must be at least {}", crate::payload::DIGITS));
        }
        Ok(s)
    }
}

/// Whether `prog` can be run: a path that exists, or a name found in PATH.
pub fn find_program(prog: &str) -> Option<PathBuf> {
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    })
}

/// `n` loopback ports that are free now, picked at random below the
/// kernel's ephemeral range (32768 and up), so that no client connection
/// of this or another program takes one as its source port meanwhile.
pub fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let mut held: Vec<TcpListener> = Vec::new();
    let mut ports = Vec::new();
    let mut tries = 0;
    while ports.len() < n {
        tries += 1;
        if tries > 1000 {
            return Err("no free loopback port between 20000 and 32000".into());
        }
        let p = 20000 + (crate::conn::random_u64() % 12000) as u16;
        if ports.contains(&p) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", p)) {
            held.push(l);
            ports.push(p);
        }
    }
    Ok(ports)
}

/// Socket inodes listening on 127.0.0.1:`port` or any address (from
/// /proc/net/tcp: state 0A is LISTEN).
fn listening_inodes(port: u16) -> Vec<u64> {
    let text = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = [
        format!("0100007F:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[3] == "0A" && want.iter().any(|w| w == f[1]))
                .then(|| f[9].parse().ok())?
        })
        .collect()
}

/// Whether process `pid` holds the socket listening on `port`: the port
/// answered, but it must be our peer that answers, not another program.
fn listens(pid: u32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        fs::read_link(e.path())
            .ok()
            .and_then(|t| {
                let t = t.to_string_lossy().into_owned();
                t.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse::<u64>()
                    .ok()
            })
            .is_some_and(|i| inodes.contains(&i))
    })
}

/// A started peer: its processes (a cluster: one per node, n1 first) and
/// client addresses.
pub struct Running {
    procs: Vec<(Child, PathBuf)>,
    pub addrs: Vec<String>,
    scratch: Option<PathBuf>,
}

impl Running {
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|(c, _)| c.id()).collect()
    }

    /// TERM to every process, KILL to any still there after 5 s.
    pub fn stop(mut self) {
        for (c, _) in &self.procs {
            // SAFETY: kill(2) on a child of ours that has not been reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (c, _) in &mut self.procs {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        if let Some(d) = self.scratch.take() {
            let _ = fs::remove_dir_all(d);
        }
    }

    fn check_alive(&mut self) -> Result<(), String> {
        for (c, log) in &mut self.procs {
            if let Ok(Some(st)) = c.try_wait() {
                let mut tail = String::new();
                let _ = File::open(&*log).and_then(|mut f| f.read_to_string(&mut tail));
                let tail: String = tail
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(format!(
                    "{} exited ({st}); log {}:\n{tail}",
                    c.id(),
                    log.display()
                ));
            }
        }
        Ok(())
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let f = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let f2 = f.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
    cmd.spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))
}

/// Waits until every address accepts connections (at most 10 s), served
/// by the process started for it (a cluster: node i serves address i).
fn wait_ports(r: &mut Running) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for (i, a) in r.addrs.clone().into_iter().enumerate() {
        let pid = r.procs[i.min(r.procs.len() - 1)].0.id();
        let port: u16 = a
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        loop {
            if TcpStream::connect(&a).is_ok() {
                if listens(pid, port) {
                    break;
                }
                r.check_alive()?;
                if Instant::now() > deadline {
                    return Err(format!("another program than ours listens on {a}"));
                }
            }
            r.check_alive()?;
            if Instant::now() > deadline {
                return Err(format!("nothing listens on {a} after 10 s"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Whether `GET /healthz` on `addr` answers 200.
fn healthy(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut head = [0u8; 12];
    s.write_all(req.as_bytes()).is_ok() && s.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// How a peer is started for a group of workloads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// fanout, queue, reqrep, conns: messaging only.
    Plain,
    /// stream, kv: with an empty store (nats: JetStream on).
    Stream,
    /// fanout3: three nodes.
    Cluster,
    /// stream3: three nodes, each with an empty store (nats: JetStream on).
    ClusterStream,
}

pub fn start(set: &Settings, peer: &str, mode: Mode, tag: &str) -> Result<Running, String> {
    let logs = &set.out;
    let scratch = set.out.join(format!("scratch-{peer}-{tag}"));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let clustered = matches!(mode, Mode::Cluster | Mode::ClusterStream);
    let nodes = if clustered { 3 } else { 1 };
    let ports = free_ports(nodes * 2)?;
    let addrs: Vec<String> = ports[..nodes]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let routes: Vec<String> = ports[nodes..]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let mut procs = Vec::new();
    for i in 0..nodes {
        let log = logs.join(format!("{peer}.{tag}.n{}.log", i + 1));
        let others = |v: &[String], pre: &str| {
            v.iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| format!("{pre}{a}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut cmd = match peer {
            "gombus" => {
                let mut c = Command::new(set.gombus_bin.as_ref().ok_or("GOMBUS_BIN is not set")?);
                c.arg(format!("-addr={}", addrs[i])).arg(format!(
                    "-data={}",
                    scratch.join(format!("n{}", i + 1)).display()
                ));
                if clustered {
                    let peers: Vec<String> = routes
                        .iter()
                        .enumerate()
                        .map(|(j, a)| format!("n{}={a}", j + 1))
                        .collect();
                    c.arg(format!("-node-id=n{}", i + 1))
                        .arg(format!("-raft-addr={}", routes[i]))
                        .arg(format!("-raft-peers={}", peers.join(",")))
                        .arg(format!("-cluster={}", others(&addrs, "")))
                        .arg("-bootstrap");
                } else {
                    c.arg("-node-id=bench");
                }
                c.args(&set.gombus_args);
                c
            }
            "nats" | "nats-ws" => {
                // Defaults everywhere, loopback only; nats-ws adds a plain
                // ws:// listener without compression, and the clients use it.
                let mut conf = format!("listen: 127.0.0.1:{}\n", ports[i]);
                if peer == "nats-ws" {
                    conf.push_str(&format!("websocket {{\n  listen: \"{}\"\n  no_tls: true\n  compression: false\n}}\n", routes[i]));
                }
                if matches!(mode, Mode::Stream | Mode::ClusterStream) {
                    // nats-server's default sync; each node a store of its own.
                    conf.push_str(&format!(
                        "jetstream {{\n  store_dir: \"{}\"\n}}\n",
                        scratch.join(format!("js-n{}", i + 1)).display()
                    ));
                }
                let path = scratch.join(format!("nats-n{}.conf", i + 1));
                fs::write(&path, conf).map_err(|e| format!("{}: {e}", path.display()))?;
                let mut c = Command::new(&set.nats_server);
                c.arg("-c").arg(&path);
                if clustered {
                    c.args(["-n", &format!("n{}", i + 1), "--cluster_name", "bench"])
                        .arg(format!("--cluster=nats://{}", routes[i]))
                        .arg(format!("--routes={}", others(&routes, "nats://")));
                }
                c
            }
            "sio-relay" => {
                let dir = set.relay_dir.as_ref().ok_or("RELAY_DIR is not set")?;
                let mut c = Command::new(&set.node);
                c.arg(dir.join("relay.js"))
                    .env("HOST", "127.0.0.1")
                    .env("PORT", ports[i].to_string());
                c
            }
            other => return Err(format!("unknown peer {other}")),
        };
        procs.push((spawn(&mut cmd, &log)?, log));
    }
    let mut r = Running {
        procs,
        addrs,
        scratch: Some(scratch),
    };
    let ready = wait_ports(&mut r).and_then(|_| {
        // nats-ws' clients use the WebSocket listener, which nats-server
        // opens before it serves anyone: the TCP port (opened last) was
        // waited for above.
        if peer == "nats-ws" {
            r.addrs = routes.clone();
            wait_ports(&mut r)?;
        }
        if peer == "gombus" && clustered {
            let deadline = Instant::now() + set.cluster_wait;
            for a in r.addrs.clone() {
                while !healthy(&a) {
                    r.check_alive()?;
                    if Instant::now() > deadline {
                        return Err(format!(
                            "{a} not healthy after {} s",
                            set.cluster_wait.as_secs()
                        ));
                    }
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Ok(())
    });
    match ready {
        Ok(()) => Ok(r),
        Err(e) => {
            r.stop();
            Err(e)
        }
    }
}

/// Why a peer cannot take part on this host, if it cannot.
pub fn unavailable(set: &Settings, peer: &str) -> Option<String> {
    match peer {
        "gombus" => match &set.gombus_bin {
            None => Some("GOMBUS_BIN is not set".into()),
            Some(p) if !p.is_file() => Some(format!("{} does not exist", p.display())),
            _ => None,
        },
        "nats" | "nats-ws" => find_program(&set.nats_server)
            .is_none()
            .then(|| format!("{} not found", set.nats_server)),
        "sio-relay" => {
            if find_program(&set.node).is_none() {
                return Some(format!("{} (Node.js) not found", set.node));
            }
            match &set.relay_dir {
                Some(d) if d.join("node_modules/socket.io").is_dir() => None,
                Some(d) => Some(format!("socket.io is not installed in {}", d.display())),
                None => Some("RELAY_DIR is not set".into()),
            }
        }
        _ => Some("unknown peer".into()),
    }
}

/// Why `peer` does not run `workload`, if it does not.
pub fn not_supported(peer: &str, workload: &str) -> Option<&'static str> {
    match (peer, workload) {
        ("sio-relay", "stream") => Some("the relay has no streams"),
        ("sio-relay", "kv") => Some("the relay has no key-value buckets"),
        ("nats-ws", "kv") => Some("the kv workload compares gombus with nats over TCP"),
        ("sio-relay", "fanout3") => Some("the relay has no clustering"),
        ("nats-ws", "fanout3") => Some("the cluster workload compares gombus with nats over TCP"),
        ("sio-relay", "stream3") => Some("the relay has no streams"),
        ("nats-ws", "stream3") => Some("the cluster workloads compare gombus with nats over TCP"),
        _ => None,
    }
}

fn spec(set: &Settings, peer: &str, r: &Running, workload: &str) -> Spec {
    let proto = match peer {
        "nats" => Proto::Nats,
        "nats-ws" => Proto::NatsWs,
        _ => Proto::Sio,
    };
    let cluster = r.addrs.len() > 1;
    let msgs = match workload {
        "fanout" => set.fanout_msgs,
        "queue" => set.queue_msgs,
        "reqrep" => set.reqrep_msgs,
        "stream" => set.stream_msgs,
        "fanout3" => set.cluster_msgs,
        "stream3" => set.stream3_msgs,
        "kv" => set.kv_msgs,
        _ => set.conns,
    };
    Spec {
        proto,
        pub_addr: r.addrs[0].clone(),
        // A cluster's subscribers are on the nodes other than the publisher's.
        sub_addrs: if cluster {
            r.addrs[1..].to_vec()
        } else {
            r.addrs.clone()
        },
        msgs,
        size: set.size,
        subs: set.subs,
        window: set.window,
        batch: set.batch,
        conns: set.conns,
        keys: set.kv_keys,
        watch_msgs: set.kv_watch_msgs,
        watch_rate: set.kv_watch_rate,
        server_pids: r.pids(),
        nodes: r.addrs.clone(),
        warm: cluster,
    }
}

fn run_one(set: &Settings, peer: &str, r: &Running, workload: &str) -> Result<Vec<Value>, String> {
    let s = spec(set, peer, r, workload);
    let pin = match (set.pin.as_str(), workload) {
        ("one", _) | ("auto", "reqrep") => "one",
        _ => "none",
    };
    if pin == "one" {
        for p in r.pids() {
            cpu::pin_process(p, &[0]);
        }
        cpu::pin(0, &[0]);
    }
    let out = match workload {
        "fanout" => work::fanout(&s, false, "fanout").map(|v| vec![v]),
        "queue" => work::fanout(&s, true, "queue").map(|v| vec![v]),
        "fanout3" => work::fanout(&s, false, "fanout3").map(|v| vec![v]),
        "reqrep" => work::reqrep(&s).map(|v| vec![v]),
        "stream" => work::stream(&s).map(|v| vec![v]),
        "stream3" => work::stream3(&s, set.cluster_wait),
        "kv" => work::kv(&s),
        "conns" => work::conns(&s).map(|v| vec![v]),
        other => Err(format!("unknown workload {other}")),
    };
    if pin == "one" {
        let all = cpu::all_cpus();
        cpu::pin(0, &all);
        for p in r.pids() {
            cpu::pin_process(p, &all);
        }
    }
    out.map(|mut rows| {
        for v in &mut rows {
            v["pin"] = json!(pin);
        }
        rows
    })
}

/// Runs everything; returns the rows.
pub fn run(set: &Settings) -> Result<Vec<Value>, String> {
    fs::create_dir_all(&set.out).map_err(|e| format!("{}: {e}", set.out.display()))?;
    if set.workloads.iter().any(|w| w == "conns") {
        work::check_conns_limit(set.conns)?;
    }
    let mut peers = Vec::new();
    for p in &set.peers {
        match unavailable(set, p) {
            Some(why) => println!("skipping peer {p}: {why}"),
            None => peers.push(p.clone()),
        }
    }
    // Workloads that share one start of a peer.
    let groups: Vec<(Mode, Vec<String>)> = [
        (Mode::Plain, vec!["fanout", "queue", "reqrep"]),
        (Mode::Stream, vec!["stream"]),
        (Mode::Stream, vec!["kv"]),
        (Mode::Plain, vec!["conns"]),
        (Mode::Cluster, vec!["fanout3"]),
        (Mode::ClusterStream, vec!["stream3"]),
    ]
    .into_iter()
    .map(|(m, ws)| {
        (
            m,
            ws.into_iter()
                .filter(|w| set.workloads.iter().any(|x| x == w))
                .map(String::from)
                .collect::<Vec<_>>(),
        )
    })
    .filter(|(_, ws)| !ws.is_empty())
    .collect();
    let jsonl = set.out.join("results.jsonl");
    let mut sink = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&jsonl)
        .map_err(|e| format!("{}: {e}", jsonl.display()))?;
    let mut rows = Vec::new();
    let mut said = Vec::new();
    for run in 1..=set.runs {
        for peer in &peers {
            for (gi, (mode, ws)) in groups.iter().enumerate() {
                let ws: Vec<&String> = ws
                    .iter()
                    .filter(|w| match not_supported(peer, w) {
                        Some(why) => {
                            let line = format!("skipping {w} on {peer}: {why}");
                            if !said.contains(&line) {
                                println!("{line}");
                                said.push(line);
                            }
                            false
                        }
                        None => true,
                    })
                    .collect();
                if ws.is_empty() {
                    continue;
                }
                let tag = format!("run{run}.g{gi}");
                let running = start(set, peer, *mode, &tag);
                for w in ws {
                    let got = match &running {
                        Ok(r) => {
                            run_one(set, peer, r, w).unwrap_or_else(|e| vec![failed_row(w, &e)])
                        }
                        Err(e) => vec![failed_row(w, &format!("{peer} did not start: {e}"))],
                    };
                    for mut row in got {
                        row["peer"] = json!(peer);
                        row["run"] = json!(run);
                        println!("{}", summary(&row));
                        writeln!(sink, "{row}").map_err(|e| e.to_string())?;
                        rows.push(row);
                    }
                }
                if let Ok(r) = running {
                    r.stop();
                }
            }
        }
    }
    Ok(rows)
}

fn failed_row(workload: &str, error: &str) -> Value {
    json!({"workload": workload, "ok": false, "error": error, "lost": null})
}

/// One short progress line for a row.
pub fn summary(row: &Value) -> String {
    let w = row["workload"].as_str().unwrap_or("?");
    let (rate, unit) = report::rate_of(w);
    let mut s = format!(
        "run {} {:<9} {:<8} {:>12} {unit}",
        row["run"],
        row["peer"].as_str().unwrap_or("?"),
        w,
        report::fmt_num(row[rate].as_f64())
    );
    if let Some(c) = row["server_cpu_us_per_msg"].as_f64() {
        s.push_str(&format!(", server CPU {c:.3} µs/msg"));
    }
    if let Some(p) = row["p50_us"].as_f64() {
        s.push_str(&format!(", p50 {p} µs p99 {} µs", row["p99_us"]));
    }
    if let Some(b) = row["bytes_per_conn"].as_f64() {
        s.push_str(&format!(", {b:.0} B/conn"));
    }
    if row["ok"] != json!(true) {
        s.push_str(&format!(
            "  FAILED: {}",
            row["error"]
                .as_str()
                .unwrap_or("lost, duplicated or reordered messages")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports = free_ports(6).unwrap();
        for (i, p) in ports.iter().enumerate() {
            assert!((20000..32000).contains(p));
            assert!(!ports[..i].contains(p));
        }
        TcpListener::bind(("127.0.0.1", ports[0])).expect("still free");
    }

    #[test]
    fn a_listener_is_known_by_its_owner() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listens(std::process::id(), port));
        // PID 1 is not us and does not hold this socket.
        assert!(!listens(1, port));
        drop(l);
        assert!(!listens(std::process::id(), port));
    }

    #[test]
    fn peers_skip_what_they_lack() {
        assert!(not_supported("sio-relay", "stream").is_some());
        assert!(not_supported("gombus", "stream3").is_none());
        assert!(not_supported("sio-relay", "stream3").is_some());
        assert!(not_supported("gombus", "fanout3").is_none());
        assert!(not_supported("nats", "stream").is_none());
        assert!(not_supported("nats", "kv").is_none());
        assert!(not_supported("sio-relay", "kv").is_some());
    }
}
