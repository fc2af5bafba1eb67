//! One failover measurement of a replicated stream on a running
//! three-node gombus cluster. It creates (or reuses) a stream with three
//! replicas, finds the node leading the stream's Raft group (`/metrics`
//! `gombus_stream_group_leader`), publishes one acked message every
//! `--interval` through a node that does not lead it, and once `--warmup`
//! publishes were acked kills the leader's process (`kill -9` by PID).
//! From the kill it times:
//!
//! - `ack_ms`: the ack of the first publish sent after the kill that the
//!   stream accepted (`{ok, stream, seq}`): a new leader serves publishes;
//! - `info_leader_ms`: a survivor's `stream.info` naming another node as
//!   the stream's `cluster.leader`;
//! - `group_leader_ms`: a survivor's `/metrics` naming another node as
//!   the leader of the stream's group.
//!
//! It counts publishes refused meanwhile (`refused`, by error code) and
//! those whose ack did not come within the client's timeout, and checks
//! that the sequences of the acked publishes only grow. Prints one JSON
//! line; exits 1 if no publish was acked after the kill within `--max`.
//! `scripts/cluster-bench.sh` (part `stream-failover`) runs it against a
//! throwaway cluster and restarts the killed node between runs.
//!
//! ```text
//! cargo run --release --example stream_failover -- \
//!     --nodes 127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403 --pids 11,12,13
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gombus::client::{Client, Error, Options};
use gombus::config::parse_duration;
use serde_json::json;

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
const SIGKILL: i32 = 9;

struct Args {
    /// Client addresses of n1..n3, in node id order (node id k is index k-1).
    nodes: Vec<String>,
    pids: Vec<i32>,
    stream: String,
    interval: Duration,
    warmup: usize,
    max: Duration,
    ack_timeout: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut o = getopts::Options::new();
    o.reqopt("", "nodes", "client addresses of n1,n2,n3", "A,B,C");
    o.reqopt("", "pids", "their process ids, in the same order", "P,Q,R");
    o.optopt("", "stream", "the stream (FAILOVER)", "NAME");
    o.optopt("", "interval", "time between publishes (5ms)", "D");
    o.optopt("", "warmup", "acked publishes before the kill (100)", "N");
    o.optopt("", "max", "bound on the time after the kill (30s)", "D");
    o.optopt("", "ack-timeout", "how long one publish waits (2s)", "D");
    let m = o
        .parse(std::env::args().skip(1))
        .map_err(|e| format!("{e}\n{}", o.usage("Usage: stream_failover [flags]")))?;
    let dur = |name: &str, default: Duration| -> Result<Duration, String> {
        m.opt_str(name)
            .map_or(Ok(default), |v| parse_duration(&v))
            .map_err(|e| format!("--{name}: {e}"))
    };
    let list = |name: &str| -> Vec<String> {
        m.opt_str(name)
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    let nodes = list("nodes");
    let pids = list("pids")
        .iter()
        .map(|p| p.parse::<i32>().ok().filter(|p| *p > 1))
        .collect::<Option<Vec<_>>>()
        .ok_or("--pids: not process ids")?;
    if nodes.len() != 3 || pids.len() != 3 {
        return Err("--nodes and --pids take three entries each".into());
    }
    Ok(Args {
        nodes,
        pids,
        stream: m.opt_str("stream").unwrap_or_else(|| "FAILOVER".into()),
        interval: dur("interval", Duration::from_millis(5))?,
        warmup: m
            .opt_str("warmup")
            .map(|v| v.parse().map_err(|_| format!("--warmup: {v:?}")))
            .transpose()?
            .unwrap_or(100),
        max: dur("max", Duration::from_secs(30))?,
        ack_timeout: dur("ack-timeout", Duration::from_secs(2))?,
    })
}

fn client(addr: &str, timeout: Duration) -> Result<Client, String> {
    let opts = Options {
        timeout,
        // A failed connection is an outcome here, not something to hide.
        reconnect: None,
        ..Options::default()
    };
    Client::connect_with(addr, opts).map_err(|e| format!("connect {addr}: {e}"))
}

/// `GET /metrics` on `addr`: the leader (node id, 0 for none) the node
/// knows for `stream`'s group, if it reports the stream at all.
fn group_leader(addr: &str, stream: &str) -> Option<u64> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let want = format!("gombus_stream_group_leader{{stream=\"{stream}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// `cluster.leader` of `stream.info` on `c` (node id), if any.
fn info_leader(c: &Client, stream: &str) -> Option<u64> {
    let v = c.call("stream.info", json!({ "name": stream })).ok()?;
    let leader = v.get("cluster").unwrap_or(&v["stream"]["cluster"])["leader"].as_str()?;
    // Node ids are n1, n2, … on the measured cluster.
    leader.trim_start_matches('n').parse().ok()
}

fn ms(from: Instant, to: Instant) -> f64 {
    (to.saturating_duration_since(from).as_secs_f64() * 1e4).round() / 10.0
}

/// What the threads record.
#[derive(Default)]
struct Log {
    info_leader: Option<(Instant, u64)>,
    group_leader: Option<(Instant, u64)>,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stream_failover: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("stream_failover: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<bool, String> {
    let subject = format!("{}.x", a.stream.to_lowercase());
    // The stream, created through n1 (the same config again is accepted).
    let admin = client(&a.nodes[0], Duration::from_secs(10))?;
    let created = admin.call(
        "stream.create",
        json!({"name": a.stream, "subjects": [format!("{}.>", a.stream.to_lowercase())], "replicas": 3}),
    );
    match created {
        Ok(_) => {}
        Err(e) if e.code() == Some("exists") => {}
        Err(e) => return Err(format!("stream.create with 3 replicas: {e}")),
    }
    drop(admin);
    // The group's leader, as every node reports it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let seen: Vec<Option<u64>> = a.nodes.iter().map(|n| group_leader(n, &a.stream)).collect();
        match seen[0] {
            Some(l) if (1..=3).contains(&l) && seen.iter().all(|s| *s == Some(l)) => break l,
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "the nodes do not agree on a group leader: {seen:?}"
                ))
            }
            _ => thread::sleep(Duration::from_millis(20)),
        }
    };
    let victim = (leader - 1) as usize;
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let (pub_node, watch_node) = (survivors[0], survivors[1]);

    let publisher = client(&a.nodes[pub_node], a.ack_timeout)?;
    let watcher = client(&a.nodes[watch_node], Duration::from_millis(500))?;
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));

    // Watches a survivor's stream.info and /metrics for another leader.
    let watch = {
        let (log, stop, killed_at) = (Arc::clone(&log), Arc::clone(&stop), Arc::clone(&killed_at));
        let (addr, stream) = (a.nodes[watch_node].clone(), a.stream.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if killed_at.lock().unwrap().is_some() {
                    let info = info_leader(&watcher, &stream).filter(|l| *l != 0 && *l != leader);
                    let group = group_leader(&addr, &stream).filter(|l| *l != 0 && *l != leader);
                    let now = Instant::now();
                    let mut g = log.lock().unwrap();
                    if let (None, Some(l)) = (g.info_leader, info) {
                        g.info_leader = Some((now, l));
                    }
                    if let (None, Some(l)) = (g.group_leader, group) {
                        g.group_leader = Some((now, l));
                    }
                    if g.info_leader.is_some() && g.group_leader.is_some() {
                        break;
                    }
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // Publishes, one at a time; the kill after `warmup` acks.
    let mut acked_before = 0usize;
    let mut acked_after = 0usize;
    let mut first_ack: Option<Instant> = None;
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    let mut timeouts = 0u64;
    let mut last_seq = 0u64;
    let mut reordered = 0u64;
    let mut n = 0u64;
    let mut kill_t: Option<Instant> = None;
    let warm_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if kill_t.is_none() && acked_before >= a.warmup {
            let t = Instant::now();
            // SAFETY: kill(2) with a pid given to us and a constant signal.
            if unsafe { kill(a.pids[victim], SIGKILL) } != 0 {
                return Err(format!("kill -9 {} failed", a.pids[victim]));
            }
            kill_t = Some(t);
            *killed_at.lock().unwrap() = Some(t);
        }
        if let Some(k) = kill_t {
            let g = log.lock().unwrap();
            let leaders_seen = g.info_leader.is_some() && g.group_leader.is_some();
            drop(g);
            if (first_ack.is_some() && (leaders_seen || acked_after >= 50)) || k.elapsed() > a.max {
                break;
            }
        } else if Instant::now() > warm_deadline {
            return Err(format!(
                "only {acked_before} of {} warm-up publishes acked in 30 s",
                a.warmup
            ));
        }
        n += 1;
        let sent = Instant::now();
        match publisher.publish_acked(&subject, json!({ "n": n })) {
            Ok(ack) => {
                let seq = ack["seq"].as_u64().unwrap_or(0);
                if seq <= last_seq {
                    reordered += 1;
                }
                last_seq = last_seq.max(seq);
                match kill_t {
                    Some(k) if sent >= k => {
                        acked_after += 1;
                        first_ack.get_or_insert_with(Instant::now);
                    }
                    _ => acked_before += 1,
                }
            }
            Err(Error::Timeout) => timeouts += 1,
            Err(e) => {
                let code = e.code().unwrap_or("client").to_string();
                *refused.entry(code).or_default() += 1;
                if kill_t.is_none() {
                    return Err(format!("publish refused before the kill: {e}"));
                }
            }
        }
        thread::sleep(a.interval.saturating_sub(sent.elapsed()));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = watch.join();
    let k = kill_t.unwrap_or_else(Instant::now);
    let g = log.lock().unwrap();
    let out = json!({
        "old_leader": format!("n{leader}"),
        "pub_node": format!("n{}", pub_node + 1),
        "ack_ms": first_ack.map(|t| ms(k, t)),
        "info_leader_ms": g.info_leader.map(|(t, _)| ms(k, t)),
        "group_leader_ms": g.group_leader.map(|(t, _)| ms(k, t)),
        "new_leader": g.group_leader.or(g.info_leader).map(|(_, l)| format!("n{l}")),
        "acked_before": acked_before,
        "acked_after": acked_after,
        "refused": refused,
        "timeouts": timeouts,
        "reordered": reordered,
    });
    println!("{out}");
    Ok(first_ack.is_some() && reordered == 0)
}
