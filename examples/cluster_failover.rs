//! One failover measurement on a running gombus cluster: a publisher on
//! one surviving node sends a numbered message every `--interval`, a
//! subscriber on another surviving node receives them, and once messages
//! flow this program kills the leader's process (`kill -9` by PID) and
//! times, from the kill:
//!
//! - `deliver_ms`: the first message delivered whose publish was made
//!   after the kill (publishes between survivors need no leader);
//! - `leader_ms`: a survivor reporting a new leader in `cluster.status`;
//! - `sub_ms`: the first `sub` acknowledged among those sent after the
//!   kill (a change needs a leader to commit it). One `sub` is sent at
//!   the kill on a connection opened before it (`first_sub_ms` and
//!   `first_sub` tell how that one ended), then one every `--sub-every`
//!   on a fresh connection, alternating between the two survivors.
//!
//! It also counts what was published and never delivered, duplicates and
//! out-of-order deliveries, and the longest pause between deliveries
//! after the kill. Publishes made before the publisher's node knew of the
//! subscription are counted apart (`unseen_at_start`, and `visible_ms`:
//! from the subscribe's ack to the publish of the first message
//! delivered), as they say how long a subscription acked on one node
//! takes to reach another, not anything about the failover. Prints one JSON line; exits 1 if something it waited
//! for did not happen within `--max`. `scripts/cluster-bench.sh` runs it
//! against a throwaway three-node cluster and restarts the killed node
//! between runs.
//!
//! ```text
//! cargo run --release --example cluster_failover -- --pub 127.0.0.1:7102 \
//!     --sub 127.0.0.1:7103 --leader n1 --kill-pid 12345 --control-token T
//! ```

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gombus::client::{Client, Error, Options};
use gombus::config::parse_duration;
use serde_json::{json, Value};

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
const SIGKILL: i32 = 9;

struct Args {
    publish: String,
    subscribe: String,
    leader: String,
    pid: i32,
    control_token: Option<String>,
    interval: Duration,
    sub_every: Duration,
    warmup: usize,
    max: Duration,
    subject: String,
}

fn parse_args() -> Result<Args, String> {
    let mut o = getopts::Options::new();
    o.reqopt(
        "",
        "pub",
        "the publisher's server (a survivor)",
        "HOST:PORT",
    );
    o.reqopt(
        "",
        "sub",
        "the subscriber's server (a survivor)",
        "HOST:PORT",
    );
    o.reqopt("", "leader", "the leader's node id", "ID");
    o.reqopt("", "kill-pid", "the leader's process id", "PID");
    o.optopt("", "control-token", "token for /control", "T");
    o.optopt("", "interval", "time between publishes (2ms)", "D");
    o.optopt("", "sub-every", "time between sub attempts (10ms)", "D");
    o.optopt("", "warmup", "deliveries before the kill (200)", "N");
    o.optopt("", "max", "bound on the whole measurement (30s)", "D");
    o.optopt("", "subject", "subject prefix (failover)", "S");
    let m = o
        .parse(std::env::args().skip(1))
        .map_err(|e| format!("{e}\n{}", o.usage("Usage: cluster_failover [flags]")))?;
    let dur = |name: &str, default: Duration| -> Result<Duration, String> {
        m.opt_str(name)
            .map_or(Ok(default), |v| parse_duration(&v))
            .map_err(|e| format!("--{name}: {e}"))
    };
    let num = |name: &str| -> Result<Option<u64>, String> {
        m.opt_str(name)
            .map(|v| v.parse::<u64>().map_err(|_| format!("--{name}: {v:?}")))
            .transpose()
    };
    Ok(Args {
        publish: m.opt_str("pub").unwrap_or_default(),
        subscribe: m.opt_str("sub").unwrap_or_default(),
        leader: m.opt_str("leader").unwrap_or_default(),
        pid: num("kill-pid")?
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 1)
            .ok_or("--kill-pid: not a process id")?,
        control_token: m.opt_str("control-token").filter(|t| !t.is_empty()),
        interval: dur("interval", Duration::from_millis(2))?,
        sub_every: dur("sub-every", Duration::from_millis(10))?,
        warmup: num("warmup")?.unwrap_or(200) as usize,
        max: dur("max", Duration::from_secs(30))?,
        subject: m.opt_str("subject").unwrap_or_else(|| "failover".into()),
    })
}

fn opts(namespace: &str, token: Option<String>) -> Options {
    Options {
        namespace: namespace.to_string(),
        token,
        timeout: Duration::from_secs(10),
        // A failed connection is an outcome here, not something to hide.
        reconnect: None,
        subscription_capacity: 1 << 20,
        ..Options::default()
    }
}

/// Milliseconds from `from` to `to` (negative if `to` came first).
fn ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1e3
    } else {
        -(from.duration_since(to).as_secs_f64() * 1e3)
    }
}

/// What the threads record; every instant is on this process' clock.
#[derive(Default)]
struct Log {
    /// Send instant of message `seq` (index `seq - 1`).
    published: Vec<Instant>,
    /// (seq, receive instant), in arrival order.
    received: Vec<(u64, Instant)>,
    /// The first survivor to report a new leader: (when, node id).
    new_leader: Option<(Instant, String)>,
    /// (sent, answered, result, server) of every `sub` attempt, attempt
    /// 0 first.
    subs: Vec<(Instant, Instant, Result<(), String>, String)>,
    /// When the subscriber's own subscribe was acked.
    subscribed: Option<Instant>,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cluster_failover: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cluster_failover: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<bool, String> {
    let log = Arc::new(Mutex::new(Log::default()));
    // `stop` ends publishing and the watch; `stop_recv` the receiver,
    // once what was published has had its chance to arrive.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_recv = Arc::new(AtomicBool::new(false));
    let subject = format!("{}.{}", a.subject, std::process::id());
    let root = |addr: &str| {
        Client::connect_with(addr, opts("/", None)).map_err(|e| format!("connect {addr}: {e}"))
    };

    // The subscriber, then the publisher, both on survivors.
    let sub_client = root(&a.subscribe)?;
    let sub = sub_client
        .subscribe(&subject)
        .map_err(|e| format!("subscribe on {}: {e}", a.subscribe))?;
    log.lock().unwrap().subscribed = Some(Instant::now());
    let receiver = {
        let (log, stop) = (Arc::clone(&log), Arc::clone(&stop_recv));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match sub.recv_timeout(Duration::from_millis(20)) {
                    Ok(m) => {
                        let now = Instant::now();
                        if let Some(seq) = m.data.get("seq").and_then(Value::as_u64) {
                            log.lock().unwrap().received.push((seq, now));
                        }
                    }
                    Err(Error::Timeout) => {}
                    Err(_) => break,
                }
            }
            sub.dropped()
        })
    };
    let pub_client = root(&a.publish)?;
    let publisher = {
        let (log, stop, subject, every) = (
            Arc::clone(&log),
            Arc::clone(&stop),
            subject.clone(),
            a.interval,
        );
        thread::spawn(move || -> Result<(), String> {
            let mut next = Instant::now();
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let now = Instant::now();
                log.lock().unwrap().published.push(now);
                pub_client
                    .publish(&subject, json!({ "seq": seq }))
                    .map_err(|e| format!("publish #{seq}: {e}"))?;
                // Pace on a fixed schedule; a late turn does not shift it.
                next += every;
                let now = Instant::now();
                if next > now {
                    thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            Ok(())
        })
    };

    // Messages must flow before the kill.
    let started = Instant::now();
    while log.lock().unwrap().received.len() < a.warmup {
        if started.elapsed() > Duration::from_secs(10) || publisher.is_finished() {
            stop.store(true, Ordering::Relaxed);
            stop_recv.store(true, Ordering::Relaxed);
            let why = match publisher.join() {
                Ok(Err(e)) => e,
                _ => "no deliveries".into(),
            };
            return Err(format!("before the kill: {why}"));
        }
        thread::sleep(Duration::from_millis(5));
    }
    // Connections the measurement uses after the kill, opened before it.
    let token = a.control_token.clone();
    let mut watchers = Vec::new();
    for addr in [&a.publish, &a.subscribe] {
        watchers.push(
            Client::connect_with(addr, opts("/control", token.clone()))
                .map_err(|e| format!("connect {addr}/control: {e}"))?,
        );
    }
    let first_sub = root(&a.subscribe)?;

    // SAFETY: kill(2) with a positive pid only sends a signal.
    let rc = unsafe { kill(a.pid, SIGKILL) };
    let killed = Instant::now();
    if rc != 0 {
        stop.store(true, Ordering::Relaxed);
        stop_recv.store(true, Ordering::Relaxed);
        return Err(format!("kill -9 {} failed", a.pid));
    }

    let mut threads = Vec::new();
    // Attempt 0: a sub sent at once on a connection made before the kill.
    {
        let (log, subject) = (Arc::clone(&log), format!("{subject}.s0"));
        let addr = a.subscribe.clone();
        threads.push(thread::spawn(move || {
            let sent = Instant::now();
            let r = first_sub.subscribe(&subject).map(|_| ());
            let done = Instant::now();
            let r = r.map_err(|e| e.to_string());
            log.lock().unwrap().subs.insert(0, (sent, done, r, addr));
            drop(first_sub);
        }));
    }
    // The leader watch: both survivors' cluster.status, until one names
    // a leader other than the killed one.
    {
        let (log, stop, old) = (Arc::clone(&log), Arc::clone(&stop), a.leader.clone());
        threads.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for w in &watchers {
                    let Ok(v) = w.call("cluster.status", json!({})) else {
                        continue;
                    };
                    if let Some(l) = v.get("leader").and_then(Value::as_str) {
                        if l != old {
                            log.lock().unwrap().new_leader = Some((Instant::now(), l.to_string()));
                            return;
                        }
                    }
                }
                thread::sleep(Duration::from_millis(2));
            }
        }));
    }

    // Fresh `sub` attempts until one is acked, then let messages run a
    // little longer so losses around the change show.
    let servers = [a.publish.clone(), a.subscribe.clone()];
    let mut attempt = 0u64;
    let mut next_attempt = killed + a.sub_every;
    let mut settled_at = None;
    let mut ok = true;
    loop {
        let now = Instant::now();
        let (have_all, any_sub_ok) = {
            let l = log.lock().unwrap();
            let sub_ok = l.subs.iter().any(|s| s.2.is_ok());
            let delivered = first_after(&l, killed).is_some();
            (sub_ok && delivered && l.new_leader.is_some(), sub_ok)
        };
        if have_all && settled_at.is_none() {
            settled_at = Some(now);
        }
        if settled_at.is_some_and(|t| now >= t + Duration::from_millis(300)) {
            break;
        }
        if now.duration_since(killed) > a.max {
            ok = false;
            break;
        }
        if !any_sub_ok && now >= next_attempt {
            attempt += 1;
            next_attempt += a.sub_every;
            let addr = servers[(attempt % 2) as usize].clone();
            let (log, subject) = (Arc::clone(&log), format!("{subject}.s{attempt}"));
            threads.push(thread::spawn(move || {
                let sent = Instant::now();
                let r = Client::connect_with(&addr, opts("/", None))
                    .and_then(|c| c.subscribe(&subject).map(|s| (c, s)));
                let done = Instant::now();
                let r = r.map(drop).map_err(|e| format!("{addr}: {e}"));
                log.lock().unwrap().subs.push((sent, done, r, addr));
            }));
        }
        thread::sleep(Duration::from_millis(1));
    }

    // Stop publishing, then wait (at most a second) for the last
    // publish to arrive.
    stop.store(true, Ordering::Relaxed);
    let pub_result = publisher.join().unwrap_or(Err("publisher panicked".into()));
    let drain = Instant::now();
    while drain.elapsed() < Duration::from_secs(1) {
        let l = log.lock().unwrap();
        let last = l.published.len() as u64;
        if l.received.iter().any(|(seq, _)| *seq == last) {
            break;
        }
        drop(l);
        thread::sleep(Duration::from_millis(5));
    }
    stop_recv.store(true, Ordering::Relaxed);
    let dropped = receiver.join().unwrap_or(0);
    for t in threads {
        let _ = t.join();
    }
    let l = log.lock().unwrap();
    let summary = summarize(&l, killed, a, dropped);
    println!("{summary}");
    if let Err(e) = pub_result {
        eprintln!("cluster_failover: {e}");
        ok = false;
    }
    Ok(ok)
}

/// The first delivery of a message published after `killed`.
fn first_after(l: &Log, killed: Instant) -> Option<(u64, Instant)> {
    l.received
        .iter()
        .find(|(seq, _)| {
            (*seq as usize)
                .checked_sub(1)
                .and_then(|i| l.published.get(i))
                .is_some_and(|t| *t > killed)
        })
        .copied()
}

fn summarize(l: &Log, killed: Instant, a: &Args, dropped: u64) -> Value {
    let first = first_after(l, killed);
    let after_kill = l.published.iter().filter(|t| **t > killed).count();
    let mut seen = HashSet::new();
    let (mut dup, mut reordered, mut top) = (0u64, 0u64, 0u64);
    for (seq, _) in &l.received {
        if !seen.insert(*seq) {
            dup += 1;
        } else if *seq < top {
            reordered += 1;
        }
        top = top.max(*seq);
    }
    // Publishes that never arrived, however late, from the first one
    // delivered on; those before it went out before the publisher's node
    // knew of the subscription.
    let first_seq = l.received.iter().map(|r| r.0).min().unwrap_or(1).max(1);
    let lost: Vec<u64> = (first_seq..=l.published.len() as u64)
        .filter(|s| !seen.contains(s))
        .collect();
    let visible_ms = l
        .subscribed
        .zip(l.published.get(first_seq as usize - 1))
        .map(|(acked, t)| ms(acked, *t));
    // Longest pause between deliveries from the kill on (the kill itself
    // counts as the first point).
    let mut gap: f64 = 0.0;
    let mut prev = killed;
    for (_, t) in l.received.iter().filter(|(_, t)| *t > killed) {
        gap = gap.max(ms(prev, *t));
        prev = *t;
    }
    let sub_ok = l.subs.iter().filter(|s| s.2.is_ok()).map(|s| s.1).min();
    let first_sub = l.subs.first();
    // Per survivor, the first acked attempt: when it was sent and acked.
    let mut acked: Vec<_> = l.subs.iter().filter(|s| s.2.is_ok()).collect();
    acked.sort_by_key(|s| s.1);
    let mut first_acks = serde_json::Map::new();
    for s in acked {
        first_acks
            .entry(s.3.clone())
            .or_insert_with(|| json!({"sent_ms": ms(killed, s.0), "acked_ms": ms(killed, s.1)}));
    }
    json!({
        "old_leader": a.leader,
        "new_leader": l.new_leader.as_ref().map(|n| n.1.clone()),
        "deliver_ms": first.map(|f| ms(killed, f.1)),
        "leader_ms": l.new_leader.as_ref().map(|n| ms(killed, n.0)),
        "sub_ms": sub_ok.map(|t| ms(killed, t)),
        "first_sub_ms": first_sub.map(|s| ms(killed, s.1)),
        "first_sub": first_sub.map(|s| match &s.2 {
            Ok(()) => "ok".to_string(),
            Err(e) => e.clone(),
        }),
        "sub_attempts": l.subs.len(),
        "sub_errors": l.subs.iter().filter(|s| s.2.is_err()).count(),
        "first_acks": first_acks,
        "interval_ms": a.interval.as_secs_f64() * 1e3,
        "published": l.published.len(),
        "published_after_kill": after_kill,
        "received": l.received.len(),
        "lost": lost.len(),
        "unseen_at_start": first_seq - 1,
        "visible_ms": visible_ms,
        "lost_seqs": lost.iter().take(20).collect::<Vec<_>>(),
        "dup": dup,
        "reordered": reordered,
        "dropped": dropped,
        "max_gap_ms": gap,
    })
}
