//! The soak's mixed load and its continuous checks: core pub/sub with
//! wildcards (in order per publisher), a queue group answering requests
//! (each request served once), stream publishes with fetch and ack (every
//! acked message delivered once, in order), clients connecting and
//! leaving, and slow consumers that never read their socket. Each worker
//! is a thread with its own client; the streams are listed in
//! [`StreamSpec`]s so replicated streams can join the same checks.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use gombus::client::{Client, Error, Options, Reconnect};
use serde_json::json;

use crate::cluster_support::IDS;
use crate::faults::{FaultLog, Rng};

/// How long a client waits for any ack.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two publishes of one core publisher (about 20/s each).
const CORE_PACE: Duration = Duration::from_millis(50);
/// Pause between two stream publishes of one publisher.
const STREAM_PACE: Duration = Duration::from_millis(50);
/// Pause between two requests of one requester.
const REQUEST_PACE: Duration = Duration::from_millis(200);
/// Pause between two short-lived clients.
const CHURN_PACE: Duration = Duration::from_millis(250);
/// How long a slow consumer holds its unread socket.
const SLOW_HOLD: Duration = Duration::from_secs(10);
/// A worker whose client failed waits this long before trying again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The pull consumers' `ack_wait_ms`: a delivery not acked by then comes
/// again.
pub const ACK_WAIT: Duration = Duration::from_secs(3);
/// A fetch answer lost on its way (its relay or the client's connection
/// failed, or the client gave up waiting) leaves its messages delivered but
/// unacked: they come again after [`ACK_WAIT`], later than the messages
/// after them. Missing past this long, an acked message counts as lost.
const LATE_MAX: Duration = Duration::from_secs(20);
/// Violations kept for the report (all are counted).
const VIOLATIONS_KEPT: usize = 50;

/// One stream under test.
pub struct StreamSpec {
    pub name: String,
    pub subject: String,
    /// The node holding its data (an R1 stream's creator).
    pub owner: usize,
    /// Nodes the publisher and the consumer are connected to.
    pub publish_via: usize,
    pub consume_via: usize,
    check: Mutex<StreamCheck>,
}

impl StreamSpec {
    pub fn r1(i: usize) -> StreamSpec {
        StreamSpec {
            name: format!("SOAK_{}", IDS[i].to_uppercase()),
            subject: format!("soak.stream.{}.x", IDS[i]),
            owner: i,
            publish_via: (i + 1) % 3,
            consume_via: (i + 2) % 3,
            check: Mutex::new(StreamCheck::default()),
        }
    }
}

/// What is known of one stream's messages.
#[derive(Default)]
struct StreamCheck {
    /// seq → id of every publish acked `{ok, seq}`.
    acked: BTreeMap<u64, u64>,
    /// Every seq the consumer was handed.
    seen: BTreeSet<u64>,
    /// seq → the owner's fault epoch when its ack was sent, for every
    /// seq whose ack was answered `{ok}`.
    ok_acked: HashMap<u64, u64>,
    /// The highest seq delivered for the first time.
    max_new: u64,
    /// Acked seqs up to here were checked as delivered.
    checked_upto: u64,
    /// Acked seqs below `max_new` not delivered yet, and since when.
    missing: BTreeMap<u64, Instant>,
}

/// Named event counts for the report.
#[derive(Default)]
pub struct Counters(Mutex<BTreeMap<&'static str, u64>>);

impl Counters {
    pub fn bump(&self, name: &'static str, n: u64) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name)
            .or_default() += n;
    }

    pub fn get(&self, name: &str) -> u64 {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.get(name).copied().unwrap_or(0)
    }

    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// What every worker shares.
pub struct Ctx {
    pub http: Vec<String>,
    pub faults: FaultLog,
    pub counters: Counters,
    pub streams: Vec<StreamSpec>,
    violations: Mutex<Vec<String>>,
    violation_count: AtomicU64,
    /// Cleared when the soak drains: publishers stop.
    pub publishing: AtomicBool,
    /// Cleared at the end: every worker stops.
    pub running: AtomicBool,
    t0: Instant,
    next_request: AtomicU64,
    served: Mutex<HashSet<u64>>,
    /// Subscribers and queue members whose subscription is acked.
    listening: AtomicU64,
}

impl Ctx {
    pub fn new(http: Vec<String>, streams: Vec<StreamSpec>) -> Ctx {
        Ctx {
            http,
            faults: FaultLog::default(),
            counters: Counters::default(),
            streams,
            violations: Mutex::new(Vec::new()),
            violation_count: AtomicU64::new(0),
            publishing: AtomicBool::new(true),
            running: AtomicBool::new(true),
            t0: Instant::now(),
            next_request: AtomicU64::new(1),
            served: Mutex::new(HashSet::new()),
            listening: AtomicU64::new(0),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    pub fn violation(&self, what: String) {
        self.violation_count.fetch_add(1, Ordering::Relaxed);
        let line = format!("[{:.1}s] {what}", self.elapsed().as_secs_f64());
        eprintln!("soak violation: {line}");
        let mut v = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < VIOLATIONS_KEPT {
            v.push(line);
        }
    }

    /// How many of the [`LISTENERS`] have subscribed.
    pub fn listening(&self) -> u64 {
        self.listening.load(Ordering::Relaxed)
    }

    /// A fresh request id (ids are never served twice).
    pub fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    pub fn violation_count(&self) -> u64 {
        self.violation_count.load(Ordering::Relaxed)
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn publishing(&self) -> bool {
        self.publishing.load(Ordering::Relaxed)
    }

    fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// True if a fault of any node overlaps `[from, now]`.
    fn any_fault_since(&self, from: Instant) -> bool {
        self.faults.touched(&[0, 1, 2], from, Instant::now())
    }

    /// Checks (again) that no acked message was skipped: the consumer
    /// gets first deliveries in seq order, so an acked seq below the
    /// highest one delivered is missing; if it is still missing after
    /// [`LATE_MAX`] (time for a redelivery of a lost fetch answer), it is
    /// lost.
    pub fn check_streams(&self) {
        let now = Instant::now();
        for s in &self.streams {
            let mut c = s.check.lock().unwrap_or_else(|p| p.into_inner());
            if c.max_new > c.checked_upto + 1 {
                let skipped: Vec<u64> = c
                    .acked
                    .range(c.checked_upto + 1..c.max_new)
                    .map(|(&seq, _)| seq)
                    .filter(|seq| !c.seen.contains(seq))
                    .collect();
                for seq in skipped {
                    c.missing.insert(seq, now);
                }
                c.checked_upto = c.max_new - 1;
            }
            let c = &mut *c;
            let lost: Vec<u64> = c
                .missing
                .iter()
                .filter(|(seq, since)| !c.seen.contains(seq) && now - **since > LATE_MAX)
                .map(|(&seq, _)| seq)
                .collect();
            c.missing
                .retain(|seq, _| !c.seen.contains(seq) && !lost.contains(seq));
            for seq in lost {
                self.violation(format!(
                    "{}: acked seq {seq} still not delivered {LATE_MAX:?} after the consumer \
                     passed it",
                    s.name
                ));
            }
        }
    }

    /// Acked seqs of every stream the consumer has not been handed yet.
    pub fn undelivered(&self) -> Vec<(String, Vec<u64>)> {
        self.streams
            .iter()
            .map(|s| {
                let c = s.check.lock().unwrap_or_else(|p| p.into_inner());
                let missing = c
                    .acked
                    .keys()
                    .filter(|seq| !c.seen.contains(seq))
                    .copied()
                    .collect();
                (s.name.clone(), missing)
            })
            .collect()
    }
}

/// A client of node `i` that reconnects to it after a drop.
fn reconnecting(ctx: &Ctx, i: usize) -> Result<Client, Error> {
    let opts = Options {
        reconnect: Some(Reconnect {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(500),
            jitter: 0.2,
            max_attempts: None,
        }),
        timeout: CALL_TIMEOUT,
        ..Default::default()
    };
    Client::connect_with(&ctx.http[i], opts)
}

/// Sleeps `d` in short steps, returning early once the soak stops.
fn pace(ctx: &Ctx, d: Duration) {
    let until = Instant::now() + d;
    while ctx.running() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// Subscribing workers [`spawn_listeners`] starts.
pub const LISTENERS: u64 = 6;

fn start(workers: &mut Vec<JoinHandle<()>>, name: String, f: Box<dyn FnOnce() + Send>) {
    workers.push(
        thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("cannot start a soak worker"),
    );
}

/// Starts the workers that only listen: a core subscriber and a queue
/// group member per node. Each counts itself in [`Ctx::listening`] once
/// subscribed.
pub fn spawn_listeners(ctx: &Arc<Ctx>) -> Vec<JoinHandle<()>> {
    let mut workers = Vec::new();
    let mut go = |name: String, f: Box<dyn FnOnce() + Send>| start(&mut workers, name, f);
    for i in 0..3 {
        let c = Arc::clone(ctx);
        go(
            format!("core-sub-{i}"),
            Box::new(move || core_subscriber(&c, i)),
        );
        let c = Arc::clone(ctx);
        go(format!("svc-{i}"), Box::new(move || responder(&c, i)));
    }
    workers
}

/// Starts the workers that publish, request, fetch and come and go.
pub fn spawn_sources(ctx: &Arc<Ctx>, seed: u64) -> Vec<JoinHandle<()>> {
    let mut workers = Vec::new();
    let mut go = |name: String, f: Box<dyn FnOnce() + Send>| start(&mut workers, name, f);
    for i in 0..3 {
        let c = Arc::clone(ctx);
        go(
            format!("core-pub-{i}"),
            Box::new(move || core_publisher(&c, i)),
        );
        let c = Arc::clone(ctx);
        go(format!("req-{i}"), Box::new(move || requester(&c, i)));
    }
    for s in 0..ctx.streams.len() {
        let c = Arc::clone(ctx);
        go(
            format!("stream-pub-{s}"),
            Box::new(move || stream_publisher(&c, s)),
        );
        let c = Arc::clone(ctx);
        go(
            format!("stream-con-{s}"),
            Box::new(move || stream_consumer(&c, s)),
        );
    }
    let c = Arc::clone(ctx);
    go("churn".into(), Box::new(move || churn(&c, seed)));
    let c = Arc::clone(ctx);
    go("slow".into(), Box::new(move || slow_consumers(&c)));
    workers
}

/// Publishes `{p, n}` on `soak.core.<node>.tick`, `n` counting up by one
/// for every publish the client took.
fn core_publisher(ctx: &Ctx, i: usize) {
    let subject = format!("soak.core.{}.tick", IDS[i]);
    let client = match reconnecting(ctx, i) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("core publisher on {}: {e}", IDS[i])),
    };
    let mut n = 0u64;
    while ctx.publishing() {
        match client.publish(&subject, json!({ "p": i, "n": n + 1 })) {
            Ok(()) => {
                n += 1;
                ctx.counters.bump("core messages published", 1);
            }
            Err(_) => ctx.counters.bump("core publishes refused (node down)", 1),
        }
        pace(ctx, CORE_PACE);
    }
}

/// Subscribes to `soak.core.*.tick` and checks each publisher's numbers
/// arrive in order, without gaps except across a fault of the
/// publisher's or this subscriber's node.
fn core_subscriber(ctx: &Ctx, j: usize) {
    let client = match reconnecting(ctx, j) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("core subscriber on {}: {e}", IDS[j])),
    };
    let sub = match client.subscribe("soak.core.*.tick") {
        Ok(s) => s,
        Err(e) => return ctx.violation(format!("core subscribe on {}: {e}", IDS[j])),
    };
    ctx.listening.fetch_add(1, Ordering::Relaxed);
    let mut last: [Option<(u64, Instant)>; 3] = [None; 3];
    while ctx.running() {
        let m = match sub.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => m,
            Err(Error::Timeout) => continue,
            Err(e) => return ctx.violation(format!("core subscription on {} ended: {e}", IDS[j])),
        };
        let (Some(p), Some(n)) = (m.data["p"].as_u64(), m.data["n"].as_u64()) else {
            ctx.violation(format!(
                "core message without p/n on {}: {}",
                IDS[j], m.data
            ));
            continue;
        };
        let p = p as usize;
        if p >= 3 || m.subject != format!("soak.core.{}.tick", IDS[p]) {
            ctx.violation(format!("core message on the wrong subject: {m:?}"));
            continue;
        }
        ctx.counters.bump("core messages checked", 1);
        let now = Instant::now();
        let Some((l, since)) = last[p] else {
            last[p] = Some((n, now));
            continue;
        };
        let excused = || ctx.faults.touched(&[p, j], since, now);
        if n == l + 1 {
        } else if n > l + 1 {
            if excused() {
                ctx.counters.bump("core gaps across a fault", n - l - 1);
            } else {
                ctx.violation(format!(
                    "core {}→{}: {} messages missing after n={l} (got n={n}) with both nodes healthy",
                    IDS[p],
                    IDS[j],
                    n - l - 1
                ));
            }
        } else if excused() {
            ctx.counters.bump("core out of order across a fault", 1);
        } else {
            ctx.violation(format!(
                "core {}→{}: n={n} after n={l} (duplicate or out of order) with both nodes healthy",
                IDS[p], IDS[j]
            ));
        }
        if n > l {
            last[p] = Some((n, now));
        }
    }
    let dropped = sub.dropped();
    if dropped > 0 {
        ctx.violation(format!(
            "core subscriber on {} dropped {dropped} messages",
            IDS[j]
        ));
    }
}

/// A member of queue group `svc` on `soak.svc.*`: answers each request
/// with its id, and checks no request reaches two members.
fn responder(ctx: &Ctx, i: usize) {
    let client = match reconnecting(ctx, i) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("responder on {}: {e}", IDS[i])),
    };
    let sub = match client.queue_subscribe("soak.svc.*", "svc") {
        Ok(s) => s,
        Err(e) => return ctx.violation(format!("queue subscribe on {}: {e}", IDS[i])),
    };
    ctx.listening.fetch_add(1, Ordering::Relaxed);
    while ctx.running() {
        let m = match sub.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => m,
            Err(Error::Timeout) => continue,
            Err(e) => return ctx.violation(format!("queue subscription on {} ended: {e}", IDS[i])),
        };
        let id = m.data["id"].as_u64().unwrap_or(0);
        let first = ctx
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        if !first {
            ctx.violation(format!(
                "request {id} reached two members of queue group svc"
            ));
        }
        ctx.counters.bump("requests served by the queue group", 1);
        if let Some(reply) = &m.reply {
            let _ = client.publish(reply, json!({ "id": id, "by": i }));
        }
    }
}

/// Sends requests to the queue group; each must be answered with its own
/// id, and may fail only across a fault.
fn requester(ctx: &Ctx, i: usize) {
    let client = match reconnecting(ctx, i) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("requester on {}: {e}", IDS[i])),
    };
    while ctx.publishing() {
        let id = ctx.request_id();
        let start = Instant::now();
        match client.request("soak.svc.echo", json!({ "id": id }), CALL_TIMEOUT) {
            Ok(m) if m.data["id"].as_u64() == Some(id) => ctx.counters.bump("requests answered", 1),
            Ok(m) => ctx.violation(format!("request {id} answered with {}", m.data)),
            Err(_) if ctx.any_fault_since(start) => {
                ctx.counters.bump("requests failed across a fault", 1)
            }
            Err(e) => ctx.violation(format!(
                "request {id} from {} failed with every node healthy: {e}",
                IDS[i]
            )),
        }
        pace(ctx, REQUEST_PACE);
    }
}

/// Publishes `{id}` to stream `s` and records every `{ok, seq}`.
fn stream_publisher(ctx: &Ctx, s: usize) {
    let spec = &ctx.streams[s];
    let client = match reconnecting(ctx, spec.publish_via) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("{} publisher: {e}", spec.name)),
    };
    let mut id = 0u64;
    while ctx.publishing() {
        id += 1;
        match client.publish_stream(&spec.subject, json!({ "id": id })) {
            Ok(ack) if ack.stream != spec.name || ack.duplicate => {
                ctx.violation(format!("{} publish {id} acked as {ack:?}", spec.name))
            }
            Ok(ack) => {
                let mut c = spec.check.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(old) = c.acked.insert(ack.seq, id) {
                    drop(c);
                    ctx.violation(format!(
                        "{}: seq {} acked for publish {old} and again for {id}",
                        spec.name, ack.seq
                    ));
                } else {
                    ctx.counters.bump("stream publishes acked", 1);
                }
            }
            // Refused, or unknown (a timeout): either way not promised.
            Err(_) => ctx.counters.bump("stream publishes not acked", 1),
        }
        pace(ctx, STREAM_PACE);
    }
}

/// Fetches from stream `s`'s pull consumer and acks every message,
/// checking each acked message arrives once and in seq order.
fn stream_consumer(ctx: &Ctx, s: usize) {
    let spec = &ctx.streams[s];
    let client = match reconnecting(ctx, spec.consume_via) {
        Ok(c) => c,
        Err(e) => return ctx.violation(format!("{} consumer: {e}", spec.name)),
    };
    let mut fetch_failed: Option<Instant> = None;
    while ctx.running() {
        let batch = match client.fetch(&spec.name, "soak", 64, Some(Duration::from_secs(1))) {
            Ok(b) => b,
            Err(_) => {
                fetch_failed = Some(Instant::now());
                ctx.counters.bump("fetches failed (owner or relay down)", 1);
                pace(ctx, RETRY_PAUSE);
                continue;
            }
        };
        for m in batch {
            let id = m.data["id"].as_u64();
            let mut c = spec.check.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(&at_ack) = c.ok_acked.get(&m.seq) {
                // Cursors are replicated in batches, so an ack in the last
                // one before the owner fails may be delivered again (at
                // least once, docs/PROTOCOL.md section 9).
                if ctx.faults.epoch(spec.owner) > at_ack {
                    ctx.counters
                        .bump("stream redeliveries of {ok}-acked after an owner fault", 1);
                } else {
                    ctx.violation(format!(
                        "{}: seq {} delivered again (delivered={:?}) after its ack was \
                         answered {{ok}}, with no fault of the owner {} since",
                        spec.name, m.seq, m.delivered, IDS[spec.owner]
                    ));
                }
            } else if c.seen.contains(&m.seq) {
                ctx.counters
                    .bump("stream redeliveries (ack not answered {ok})", 1);
            } else {
                if m.seq < c.max_new {
                    // Only a fetch answer lost on its way delivers late.
                    let now = Instant::now();
                    let from = now.checked_sub(LATE_MAX).unwrap_or(now);
                    let path = [spec.owner, spec.consume_via];
                    if ctx.faults.touched(&path, from, now)
                        || fetch_failed.is_some_and(|t| t.elapsed() < LATE_MAX)
                    {
                        ctx.counters
                            .bump("stream late first deliveries (a fetch answer lost)", 1);
                    } else {
                        ctx.violation(format!(
                            "{}: seq {} first delivered after seq {}, with no fault of {} or {} \
                             and no failed fetch",
                            spec.name, m.seq, c.max_new, IDS[spec.owner], IDS[spec.consume_via]
                        ));
                    }
                }
                c.seen.insert(m.seq);
                c.max_new = c.max_new.max(m.seq);
                ctx.counters.bump("stream messages checked", 1);
            }
            if let Some(&want) = c.acked.get(&m.seq) {
                if id != Some(want) {
                    ctx.violation(format!(
                        "{}: seq {} holds {} but publish {want} was acked with it",
                        spec.name, m.seq, m.data
                    ));
                }
            }
            drop(c);
            let epoch = ctx.faults.epoch(spec.owner);
            match client.ack(&spec.name, "soak", m.seq) {
                Ok(()) => {
                    let mut c = spec.check.lock().unwrap_or_else(|p| p.into_inner());
                    c.ok_acked.insert(m.seq, epoch);
                }
                Err(_) => ctx.counters.bump("stream acks not answered {ok}", 1),
            }
        }
    }
}

/// Clients that connect to a random node, subscribe, see their own
/// message, and leave (closing, or dropping the connection).
fn churn(ctx: &Ctx, seed: u64) {
    let mut rng = Rng::new(seed ^ 0x00c0_ffee);
    let mut k = 0u64;
    while ctx.publishing() {
        k += 1;
        let node = rng.range(0, 2) as usize;
        let start = Instant::now();
        let opts = Options {
            timeout: CALL_TIMEOUT,
            ..Default::default()
        };
        let outcome = Client::connect_with(&ctx.http[node], opts).and_then(|c| {
            let subject = format!("soak.churn.{k}");
            let sub = c.subscribe(&subject)?;
            c.publish(&subject, json!(k))?;
            let m = sub.recv_timeout(CALL_TIMEOUT)?;
            Ok((c, m))
        });
        match outcome {
            Ok((c, m)) if m.data == json!(k) => {
                ctx.counters.bump("short-lived clients", 1);
                if rng.next().is_multiple_of(2) {
                    let _ = c.close();
                } else {
                    drop(c);
                }
            }
            Ok((_, m)) => ctx.violation(format!("short-lived client {k} got {}", m.data)),
            Err(_) if ctx.any_fault_since(start) => ctx
                .counters
                .bump("short-lived clients failed across a fault", 1),
            Err(e) => ctx.violation(format!(
                "short-lived client {k} on {} failed with every node healthy: {e}",
                IDS[node]
            )),
        }
        pace(ctx, CHURN_PACE);
    }
}

/// A WebSocket client frame (masked) carrying `text`.
fn ws_text(text: &str) -> Vec<u8> {
    let p = text.as_bytes();
    let mut f = vec![0x81u8];
    if p.len() < 126 {
        f.push(0x80 | p.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    }
    let mask = [0x5a, 0x17, 0xc3, 0x09];
    f.extend_from_slice(&mask);
    f.extend(p.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Opens a raw WebSocket session on `addr`, subscribes to `soak.>` and
/// never reads again.
fn slow_session(addr: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(CALL_TIMEOUT))?;
    s.set_write_timeout(Some(CALL_TIMEOUT))?;
    write!(
        s,
        "GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {addr}\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: c29hay1zbG93LWNvbnN1bWU=\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        s.read_exact(&mut byte)?;
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        return Err(std::io::Error::other("upgrade refused"));
    }
    s.write_all(&ws_text("40"))?;
    s.write_all(&ws_text(r#"42["sub",{"subject":"soak.>","sid":"slow"}]"#))?;
    Ok(s)
}

/// Slow consumers: one at a time, on each node in turn, a socket that
/// subscribes to everything and then reads nothing for a while.
fn slow_consumers(ctx: &Ctx) {
    let mut k = 0usize;
    while ctx.running() {
        let node = k % 3;
        k += 1;
        match slow_session(&ctx.http[node]) {
            Ok(s) => {
                ctx.counters.bump("slow consumers (unread sockets)", 1);
                pace(ctx, SLOW_HOLD);
                drop(s);
            }
            Err(_) => pace(ctx, RETRY_PAUSE),
        }
    }
}
