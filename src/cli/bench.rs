//! `gombus bench WORKLOAD`: publishers and subscribers on their own
//! connections and threads, a progress line on runs longer than a second,
//! and a summary table (msgs/s, MB/s, latency percentiles).
//!
//! Workloads: `pub` (publishers only), `sub` (publishers and one
//! subscriber), `fanout` (every subscriber gets every message), `queue`
//! (subscribers share the messages in a queue group), `reqrep` (requests
//! answered by a queue group of responders), `stream` (acked publishes into
//! a stream made for the run and deleted after). Latency is measured from a
//! send timestamp inside each message (same host clock) or, for acked
//! publishes and requests, as the round trip. Acked publishes are
//! pipelined: each publisher keeps up to `--window` of them in flight
//! (default 256) and times each from its send to its ack, so the run
//! measures throughput rather than one round trip after another.
//!
//! `subscribe` measures control changes instead of messages: each client
//! makes `--msgs` subscribes one at a time, each on a fresh subject and
//! sid, timing it from the send of the `sub` to its ack, and unsubscribes
//! it (timed the same way) before the next. In a cluster that ack comes
//! once the change is committed through Raft and applied on the node.
//!
//! `--sub-server` sends subscribers and responders to other servers than
//! publishers (round-robin over the list), e.g. to measure delivery
//! between cluster nodes. Then, before `sub` and `fanout` publish, a
//! warm-up message is published on the publishers' server until every
//! subscriber has received one, so the run starts only once the
//! publishers' node knows of every subscription; receivers skip warm-ups.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::args::{Global, Parsed};
use super::output::{self, Failure};
use super::{connect, connect_tuned, Namespace, Run};
use crate::client::{Client, Error, OutMessage, Payload, PendingAck};

/// A receiver that hears nothing for this long stops waiting.
const IDLE_MAX: Duration = Duration::from_secs(5);
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Bytes one bench subscription may queue before its client drops some.
const RECEIVER_BYTES_MAX: usize = 1 << 30;
/// One wait of a receiver before it checks whether the run is over.
const RECV_SLICE: Duration = Duration::from_millis(100);

/// Default of `--window`: acked publishes each publisher keeps in flight.
const WINDOW_DEFAULT: u64 = 256;
/// How often a warm-up message is published while waiting for every
/// subscriber to hear one, and how long that may take.
const WARMUP_EVERY: Duration = Duration::from_millis(10);
const WARMUP_MAX: Duration = Duration::from_secs(10);

const WORKLOADS: &[&str] = &[
    "pub",
    "sub",
    "fanout",
    "queue",
    "reqrep",
    "stream",
    "subscribe",
];

/// One side's outcome: how many messages, over how long, and latencies
/// in microseconds (empty when not measured).
#[derive(Debug, Default)]
pub struct Side {
    pub msgs: u64,
    pub secs: f64,
    pub lat_us: Vec<u64>,
    /// When a receiver got its last message.
    pub last: Option<Instant>,
    /// Messages the receiving client dropped (its queue was full).
    pub dropped: u64,
    /// Publishes the server acked (acked workloads only).
    pub acked: u64,
}

struct Plan {
    workload: String,
    subject: String,
    msgs: u64,
    size: usize,
    pubs: u64,
    subs: u64,
    acked: bool,
    /// Acked publishes in flight per publisher.
    window: u64,
    /// Where subscribers and responders connect (`--sub-server`); empty:
    /// where publishers do.
    sub_servers: Vec<String>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The percentile `q` (0..=1) of sorted values.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn run(p: &Parsed) -> Result<(), Run> {
    let workload = p.args[0].clone();
    if !WORKLOADS.contains(&workload.as_str()) {
        return Err(p
            .usage_error(format!(
                "unknown workload {workload:?} (use {})",
                WORKLOADS.join(", ")
            ))
            .into());
    }
    let few = matches!(workload.as_str(), "reqrep" | "stream");
    let sub_servers: Vec<String> = match p.opt("sub-server") {
        None => Vec::new(),
        Some(v) => {
            let list: Vec<String> = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if list.is_empty() {
                return Err(p
                    .usage_error("--sub-server: no address given".into())
                    .into());
            }
            list
        }
    };
    let plan = Plan {
        subject: p
            .opt("subject")
            .unwrap_or_else(|| format!("bench.{workload}")),
        msgs: p.opt_u64("msgs")?.unwrap_or(match workload.as_str() {
            "subscribe" => 1_000,
            _ if few => 10_000,
            _ => 100_000,
        }),
        // Subscribes carry no payload.
        size: match workload.as_str() {
            "subscribe" => 0,
            _ => p.opt_size("size")?.unwrap_or(128) as usize,
        },
        pubs: p.opt_u64("pubs")?.unwrap_or(1).max(1),
        subs: p.opt_u64("subs")?.unwrap_or(match workload.as_str() {
            "fanout" | "queue" => 4,
            "pub" | "stream" => 0,
            _ => 1,
        }),
        acked: p.flag("acked") || workload == "stream",
        window: p.opt_u64("window")?.unwrap_or(WINDOW_DEFAULT),
        sub_servers,
        workload,
    };
    if plan.msgs == 0 {
        return Err(p.usage_error("--msgs: must be at least 1".into()).into());
    }
    if plan.window == 0 {
        return Err(p.usage_error("--window: must be at least 1".into()).into());
    }
    if plan.workload == "subscribe" {
        if plan.subs == 0 {
            return Err(p.usage_error("--subs: must be at least 1".into()).into());
        }
        let (subscribe, unsubscribe) = subscribes(p, &plan)?;
        report(p, &plan, &subscribe, Some(&unsubscribe));
        return Ok(());
    }
    let (publish, receive) = execute(p, &plan)?;
    report(p, &plan, &publish, receive.as_ref());
    Ok(())
}

/// The settings subscriber or responder `i` connects with: the `i`-th
/// of `--sub-server` (round-robin), or the publishers' servers.
fn sub_global(g: &Global, sub_servers: &[String], i: u64) -> Global {
    if sub_servers.is_empty() {
        return g.clone();
    }
    let at = usize::try_from(i).unwrap_or(0) % sub_servers.len();
    Global {
        servers: vec![sub_servers[at].clone()],
        ..g.clone()
    }
}

/// Whether a received message is a warm-up rather than one of the run's.
fn is_warmup(data: &Value) -> bool {
    data.get("warmup").is_some()
}

/// Publishes a warm-up message on `subject` every [`WARMUP_EVERY`] from
/// the publishers' server until `ready` counts `subs` subscribers.
fn warm_up(p: &Parsed, subject: &str, subs: u64, ready: &AtomicU64) -> Result<(), Failure> {
    let c = connect(&p.global, Namespace::Root)?;
    let started = Instant::now();
    while ready.load(Ordering::Relaxed) < subs {
        if started.elapsed() > WARMUP_MAX {
            return Err(Failure(format!(
                "only {} of {subs} subscribers heard a warm-up message on {subject} within {}s",
                ready.load(Ordering::Relaxed),
                WARMUP_MAX.as_secs()
            )));
        }
        c.publish(subject, json!({"warmup": true}))
            .map_err(|e| Failure::call("warm-up publish", &e))?;
        thread::sleep(WARMUP_EVERY);
    }
    Ok(())
}

/// The `subscribe` workload: `plan.subs` clients share `plan.msgs`
/// subscribes, each on a fresh subject, timed from send to ack and
/// unsubscribed (also timed) before the next. Returns the subscribe side
/// and the unsubscribe side.
fn subscribes(p: &Parsed, plan: &Plan) -> Result<(Side, Side), Failure> {
    let sent = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let progress = {
        let (sent, done) = (Arc::clone(&sent), Arc::clone(&done));
        let received = AtomicU64::new(0);
        let (total, quiet) = (plan.msgs, p.global.json);
        thread::spawn(move || progress_loop(total, 0, &sent, &received, &done, quiet))
    };
    let mut clients = Vec::new();
    for i in 0..plan.subs {
        let g = sub_global(&p.global, &plan.sub_servers, i);
        clients.push(connect(&g, Namespace::Root)?);
    }
    let started = Instant::now();
    let mut workers = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let i = i as u64;
        let n = plan.msgs / plan.subs + u64::from(i < plan.msgs % plan.subs);
        let prefix = format!("{}.{}.{i}", plan.subject, std::process::id());
        let sent = Arc::clone(&sent);
        workers.push(thread::spawn(
            move || -> Result<(Vec<u64>, Vec<u64>), Failure> {
                let mut sub_lat = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
                let mut unsub_lat = Vec::with_capacity(sub_lat.capacity());
                for k in 0..n {
                    let subject = format!("{prefix}.{k}");
                    let t0 = Instant::now();
                    let sub = client
                        .subscribe_with(&subject, None, None)
                        .map_err(|e| Failure::call(&format!("subscribe to {subject}"), &e))?;
                    sub_lat.push(t0.elapsed().as_micros() as u64);
                    let t1 = Instant::now();
                    sub.unsubscribe()
                        .map_err(|e| Failure::call(&format!("unsubscribe from {subject}"), &e))?;
                    unsub_lat.push(t1.elapsed().as_micros() as u64);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                Ok((sub_lat, unsub_lat))
            },
        ));
    }
    let mut subscribe = Side::default();
    let mut unsubscribe = Side::default();
    let mut first_err = None;
    for h in workers {
        match h.join() {
            Ok(Ok((s, u))) => {
                subscribe.lat_us.extend(s);
                unsubscribe.lat_us.extend(u);
            }
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some(Failure("a subscriber panicked".into()))),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _ = progress.join();
    if let Some(e) = first_err {
        return Err(e);
    }
    // Both sides share the run's wall time (each pair runs one after the
    // other), so their rate is pairs per second.
    for side in [&mut subscribe, &mut unsubscribe] {
        side.msgs = side.lat_us.len() as u64;
        side.secs = secs;
    }
    Ok((subscribe, unsubscribe))
}

/// Runs the plan; the publishing side and, when there is one, the
/// receiving side.
fn execute(p: &Parsed, plan: &Plan) -> Result<(Side, Option<Side>), Failure> {
    let sent = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let pad = "x".repeat(plan.size);

    let mut stream_name = None;
    if plan.workload == "stream" {
        let name = format!("bench_{}", std::process::id());
        let c = connect(&p.global, Namespace::Root)?;
        c.call(
            "stream.create",
            json!({"name": name, "subjects": [plan.subject]}),
        )
        .map_err(|e| Failure::call("stream.create", &e))?;
        stream_name = Some(name);
    }

    // Receivers first, each subscribed before any message is sent.
    let expected = match plan.workload.as_str() {
        "sub" | "fanout" => plan.msgs * plan.subs,
        "queue" => plan.msgs,
        _ => 0,
    };
    let mut receivers = Vec::new();
    let mut responders = Vec::new();
    let per_sub = match plan.workload.as_str() {
        "sub" | "fanout" => plan.msgs,
        _ => u64::MAX,
    };
    // Receivers queue everything the run sends, so the count is exact;
    // anything their client still had to drop is reported.
    let capacity = usize::try_from(plan.msgs).unwrap_or(usize::MAX);
    // With --sub-server, `sub` and `fanout` wait for every receiver to
    // hear a warm-up from the publishers' server (see the module doc).
    let warm = !plan.sub_servers.is_empty() && per_sub != u64::MAX;
    let ready = Arc::new(AtomicU64::new(0));
    for i in 0..plan.subs {
        let g = sub_global(&p.global, &plan.sub_servers, i);
        let client = connect_tuned(&g, Namespace::Root, |o| {
            o.subscription_capacity = capacity;
            o.subscription_bytes_max = RECEIVER_BYTES_MAX;
        })?;
        let queue = matches!(plan.workload.as_str(), "queue" | "reqrep").then_some("bench");
        let sub = client
            .subscribe_with(&plan.subject, queue, None)
            .map_err(|e| Failure::call("subscribe", &e))?;
        let received = Arc::clone(&received);
        let done = Arc::clone(&done);
        let ready = Arc::clone(&ready);
        if plan.workload == "reqrep" {
            responders.push(thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let Ok(m) = sub.recv_timeout(Duration::from_millis(200)) else {
                        continue;
                    };
                    if let Some(reply) = &m.reply {
                        let _ = client.publish(reply, &m.data);
                    }
                }
            }));
            continue;
        }
        receivers.push(thread::spawn(move || {
            let mut side = Side::default();
            let mut last = Instant::now();
            let mut warmed = false;
            while side.msgs < per_sub && received.load(Ordering::Relaxed) < expected {
                // Short waits, so a queue member stops soon after the
                // group as a whole has everything.
                match sub.recv_timeout(RECV_SLICE) {
                    Err(Error::Timeout) if last.elapsed() < IDLE_MAX => {}
                    Ok(m) if is_warmup(&m.data) => {
                        if !warmed {
                            warmed = true;
                            ready.fetch_add(1, Ordering::Relaxed);
                        }
                        last = Instant::now();
                    }
                    Ok(m) => {
                        if let Some(t) = m.data.get("t").and_then(Value::as_u64) {
                            side.lat_us.push(now_us().saturating_sub(t));
                        }
                        side.msgs += 1;
                        last = Instant::now();
                        side.last = Some(last);
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => break,
                }
            }
            side.dropped = sub.dropped();
            drop(client);
            side
        }));
    }

    if warm {
        if let Err(e) = warm_up(p, &plan.subject, plan.subs, &ready) {
            done.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }

    let total = plan.msgs;
    let progress = {
        let (sent, received, done) = (Arc::clone(&sent), Arc::clone(&received), Arc::clone(&done));
        let quiet = p.global.json;
        thread::spawn(move || progress_loop(total, expected, &sent, &received, &done, quiet))
    };

    let started = Instant::now();
    let mut publishers = Vec::new();
    for i in 0..plan.pubs {
        let n = total / plan.pubs + u64::from(i < total % plan.pubs);
        let window = usize::try_from(plan.window).unwrap_or(usize::MAX);
        let client = connect_tuned(&p.global, Namespace::Root, |o| {
            o.async_acks_max = window;
        })?;
        let sent = Arc::clone(&sent);
        let subject = plan.subject.clone();
        let pad = pad.clone();
        let workload = plan.workload.clone();
        let acked = plan.acked;
        let timeout = p.global.timeout;
        publishers.push(thread::spawn(
            move || -> Result<(Vec<u64>, u64), Failure> {
                if acked && workload != "reqrep" {
                    let pipe = Pipeline {
                        client: &client,
                        subject: &subject,
                        stored: workload == "stream",
                        window,
                        sent: &sent,
                    };
                    let (lat, acks) = pipe.run(n, &pad)?;
                    client.ping().map_err(|e| Failure::call("ping", &e))?;
                    return Ok((lat, acks));
                }
                let mut lat = Vec::new();
                for _ in 0..n {
                    let data = json!({"t": now_us(), "p": pad});
                    let t0 = Instant::now();
                    let r = match workload.as_str() {
                        "reqrep" => client.request(&subject, data, timeout).map(|_| ()),
                        _ if acked => client.publish_acked(&subject, data).map(|_| ()),
                        _ => client.publish(&subject, data),
                    };
                    r.map_err(|e| Failure::call(&format!("{workload} on {subject}"), &e))?;
                    if acked || workload == "reqrep" {
                        lat.push(t0.elapsed().as_micros() as u64);
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                // Everything sent was processed once the ping is answered.
                client.ping().map_err(|e| Failure::call("ping", &e))?;
                Ok((lat, 0))
            },
        ));
    }
    let mut publish = Side::default();
    let mut first_err = None;
    for h in publishers {
        match h.join() {
            Ok(Ok((lat, acks))) => {
                publish.lat_us.extend(lat);
                publish.acked += acks;
            }
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some(Failure("a publisher panicked".into()))),
        }
    }
    publish.secs = started.elapsed().as_secs_f64();
    publish.msgs = sent.load(Ordering::Relaxed);

    let mut receive = None;
    if !receivers.is_empty() {
        let mut side = Side::default();
        for h in receivers {
            if let Ok(s) = h.join() {
                side.msgs += s.msgs;
                side.dropped += s.dropped;
                // From the first publish to the last delivery anywhere.
                if let Some(last) = s.last {
                    let secs = last.saturating_duration_since(started).as_secs_f64();
                    side.secs = side.secs.max(secs);
                }
                side.lat_us.extend(s.lat_us);
            }
        }
        receive = Some(side);
    }
    done.store(true, Ordering::Relaxed);
    for h in responders {
        let _ = h.join();
    }
    let _ = progress.join();
    if let Some(name) = stream_name {
        if let Ok(c) = connect(&p.global, Namespace::Root) {
            let _ = c.call("stream.delete", json!({"name": name}));
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok((publish, receive))
}

/// One publisher's acked publishes, up to `window` of them in flight.
struct Pipeline<'a> {
    client: &'a Client,
    subject: &'a str,
    /// Each ack must say which stream stored the message.
    stored: bool,
    window: usize,
    sent: &'a AtomicU64,
}

impl Pipeline<'_> {
    /// Publishes `n` messages; returns each one's latency from its send to
    /// its ack, in microseconds, and how many were acked. Acks already
    /// here are collected before each send, so a latency is at most one
    /// send late; with `window` in flight it waits for the oldest.
    fn run(&self, n: u64, pad: &str) -> Result<(Vec<u64>, u64), Failure> {
        let mut lat = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut inflight: VecDeque<(Instant, PendingAck)> = VecDeque::new();
        for _ in 0..n {
            while let Some((_, front)) = inflight.front_mut() {
                if !front.is_ready() && inflight.len() < self.window {
                    break;
                }
                if let Some((t0, ack)) = inflight.pop_front() {
                    self.settle(t0, ack, &mut lat)?;
                }
            }
            let data = json!({"t": now_us(), "p": pad});
            let msg = OutMessage::new(self.subject, Payload::Json(data));
            let t0 = Instant::now();
            let ack = self
                .client
                .publish_async(&msg)
                .map_err(|e| Failure::call(&format!("publish on {}", self.subject), &e))?;
            inflight.push_back((t0, ack));
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        while let Some((t0, ack)) = inflight.pop_front() {
            self.settle(t0, ack, &mut lat)?;
        }
        let acks = lat.len() as u64;
        Ok((lat, acks))
    }

    fn settle(&self, t0: Instant, ack: PendingAck, lat: &mut Vec<u64>) -> Result<(), Failure> {
        let what = format!("acked publish on {}", self.subject);
        let v = ack.wait().map_err(|e| Failure::call(&what, &e))?;
        lat.push(t0.elapsed().as_micros() as u64);
        if self.stored && v.get("seq").and_then(Value::as_u64).is_none() {
            return Err(Failure(format!("{what}: no stream stored it: {v}")));
        }
        Ok(())
    }
}

fn progress_loop(
    total: u64,
    expected: u64,
    sent: &AtomicU64,
    received: &AtomicU64,
    done: &AtomicBool,
    quiet: bool,
) {
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut next = started + PROGRESS_EVERY;
    let mut drew = false;
    while !done.load(Ordering::Relaxed) {
        // Short naps so the loop ends soon after the run does.
        thread::sleep(Duration::from_millis(50));
        if quiet || Instant::now() < next {
            continue;
        }
        next += PROGRESS_EVERY;
        let mut line = format!(
            "{:>5.1}s  sent {}/{}",
            started.elapsed().as_secs_f64(),
            sent.load(Ordering::Relaxed),
            total
        );
        if expected > 0 {
            line.push_str(&format!(
                "  received {}/{}",
                received.load(Ordering::Relaxed),
                expected
            ));
        }
        let mut err = std::io::stderr().lock();
        let _ = if tty {
            write!(err, "\r{line}   ")
        } else {
            writeln!(err, "{line}")
        };
        drew = true;
    }
    if drew && tty {
        eprintln!();
    }
}

fn side_json(role: &str, s: &Side, size: usize, acked: bool) -> Value {
    let mut lat = s.lat_us.clone();
    lat.sort_unstable();
    let rate = if s.secs > 0.0 {
        s.msgs as f64 / s.secs
    } else {
        0.0
    };
    let mut row = json!({
        "role": role,
        "msgs": s.msgs,
        "dropped": s.dropped,
        "seconds": s.secs,
        "msgs_per_sec": rate,
        "mb_per_sec": rate * size as f64 / 1e6,
        "latency_us": if lat.is_empty() { Value::Null } else { json!({
            "p50": percentile(&lat, 0.50),
            "p90": percentile(&lat, 0.90),
            "p99": percentile(&lat, 0.99),
            "max": lat.last(),
        })},
    });
    if acked {
        row["acked"] = json!(s.acked);
    }
    row
}

fn report(p: &Parsed, plan: &Plan, publish: &Side, receive: Option<&Side>) {
    let pub_role = match plan.workload.as_str() {
        "subscribe" => "subscribe",
        "reqrep" => "request",
        "stream" => "publish (acked)",
        _ if plan.acked => "publish (acked)",
        _ => "publish",
    };
    let pipelined = plan.acked && plan.workload != "reqrep";
    let mut rows = vec![side_json(pub_role, publish, plan.size, pipelined)];
    if let Some(r) = receive {
        let role = match plan.workload.as_str() {
            "subscribe" => "unsubscribe",
            _ => "receive",
        };
        rows.push(side_json(role, r, plan.size, false));
    }
    if p.global.json {
        let mut summary = json!({
            "workload": plan.workload,
            "subject": plan.subject,
            "msgs": plan.msgs,
            "size": plan.size,
            "pubs": plan.pubs,
            "subs": plan.subs,
            "rows": rows,
        });
        if pipelined {
            summary["window"] = json!(plan.window);
        }
        if !plan.sub_servers.is_empty() {
            summary["sub_servers"] = json!(plan.sub_servers);
        }
        output::json_pretty(&summary);
        return;
    }
    let window = if pipelined {
        format!(" (window {})", plan.window)
    } else {
        String::new()
    };
    if plan.workload == "subscribe" {
        println!(
            "bench subscribe: {} subscribes, each unsubscribed before the next, {} client(s), on {}.*\n",
            plan.msgs, plan.subs, plan.subject
        );
    } else {
        println!(
            "bench {}: {} msgs of {} B, {} publisher(s){window}, {} subscriber(s) on {}\n",
            plan.workload, plan.msgs, plan.size, plan.pubs, plan.subs, plan.subject
        );
    }
    let us = |v: &Value, k: &str| {
        v["latency_us"][k]
            .as_u64()
            .map_or("-".to_string(), |n| n.to_string())
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                output::plain(&r["role"]),
                output::plain(&r["msgs"]),
                format!("{:.3}", r["seconds"].as_f64().unwrap_or(0.0)),
                format!("{:.0}", r["msgs_per_sec"].as_f64().unwrap_or(0.0)),
                format!("{:.2}", r["mb_per_sec"].as_f64().unwrap_or(0.0)),
                us(r, "p50"),
                us(r, "p90"),
                us(r, "p99"),
                us(r, "max"),
            ]
        })
        .collect();
    output::table(
        &[
            "ROLE", "MSGS", "SECONDS", "MSGS/S", "MB/S", "P50 us", "P90 us", "P99 us", "MAX us",
        ],
        &table,
    );
    if let Some(r) = receive.filter(|r| r.dropped > 0) {
        println!(
            "\nthe receiving clients dropped {} messages (their queues were full)",
            r.dropped
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.9), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
