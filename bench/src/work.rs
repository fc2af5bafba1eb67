//! The workloads. Each takes a [`Spec`] (protocol, addresses, counts and
//! the server processes to watch), runs against a peer that is already up,
//! and returns one JSON row: the rate, latencies where they apply, the
//! server's CPU over the measured phase (also per delivered message), and
//! the exactly-once-in-order checks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::conn::{fail, timed_out, Conn, Event, Proto, StreamView};
use crate::cpu;
use crate::payload::{self, Tally};

/// A receiver or acked publisher that makes no progress for this long fails.
const STALL: Duration = Duration::from_secs(10);
/// How long receivers block before looking at the shared state again.
const SLICE: Duration = Duration::from_millis(100);
/// A write buffer is sent once it holds this much, whatever the batch.
const FLUSH_BYTES: usize = 64 * 1024;
/// Unmeasured requests before reqrep's measured ones.
const WARMUP_REQUESTS: u64 = 1000;

#[derive(Clone, Debug)]
pub struct Spec {
    pub proto: Proto,
    /// Where the publisher (requester) connects.
    pub pub_addr: String,
    /// Where subscribers (responders) connect, round-robin.
    pub sub_addrs: Vec<String>,
    pub msgs: u64,
    pub size: usize,
    pub subs: u64,
    pub window: u64,
    /// Publishes per write (flush).
    pub batch: u64,
    pub conns: u64,
    /// Keys the kv workload spreads its puts over.
    pub keys: u64,
    /// kv-watch: puts made while a watcher listens, and their rate per second.
    pub watch_msgs: u64,
    pub watch_rate: u64,
    /// The server's processes (a cluster: every node).
    pub server_pids: Vec<u32>,
    /// Every node's client address (a cluster: n1 first; else the one).
    pub nodes: Vec<String>,
    /// Publish warm-up messages until every subscriber hears one before
    /// measuring (a cluster, where interest spreads after the sub ack).
    pub warm: bool,
}

type Res<T> = Result<T, String>;

fn e2s(e: std::io::Error) -> String {
    e.to_string()
}

/// Server and own CPU at the start of a measured phase.
struct Clock {
    t0: Instant,
    srv0: Option<f64>,
    own0: f64,
    host0: Option<(u64, u64)>,
    written0: Option<u64>,
}

impl Clock {
    fn start(pids: &[u32]) -> Clock {
        Clock {
            srv0: cpu::cpu_secs_sum(pids),
            own0: cpu::own_cpu_secs(),
            host0: cpu::host_ticks(),
            written0: cpu::written_sum(pids),
            t0: Instant::now(),
        }
    }

    /// Adds elapsed_s, server CPU (% of a core and µs per `units`) and own
    /// CPU to `row`, for a phase that took `secs`.
    fn finish(&self, pids: &[u32], secs: f64, units: u64, row: &mut Map<String, Value>) {
        // CPU time comes in ticks of 10 ms: over a shorter phase than
        // 0.25 s the figures would say little, so they are left out.
        let srv = match (self.srv0, cpu::cpu_secs_sum(pids)) {
            (Some(a), Some(b)) if !pids.is_empty() && secs >= 0.25 => Some(b - a),
            _ => None,
        };
        let own = cpu::own_cpu_secs() - self.own0;
        let written = match (self.written0, cpu::written_sum(pids)) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        row.insert("server_write_bytes".into(), json!(written));
        row.insert("elapsed_s".into(), json!(round(secs, 4)));
        row.insert("server_cpu_s".into(), json!(srv.map(|s| round(s, 3))));
        row.insert(
            "server_cpu_pct".into(),
            json!(srv.map(|s| round(100.0 * s / secs.max(1e-9), 1))),
        );
        row.insert(
            "server_cpu_us_per_msg".into(),
            json!(srv
                .filter(|_| units > 0)
                .map(|s| round(s * 1e6 / units as f64, 3))),
        );
        row.insert(
            "loadgen_cpu_pct".into(),
            json!((secs >= 0.25).then(|| round(100.0 * own / secs, 1))),
        );
        // What else kept the host busy over the phase (other programs,
        // kernel work charged to nobody), in % of one core: noise.
        if let (Some((b0, t0)), Some((b1, t1))) = (self.host0, cpu::host_ticks()) {
            if t1 > t0 && secs >= 0.25 {
                let cores = cpu::all_cpus().len() as f64;
                let busy_cores = (b1 - b0) as f64 / (t1 - t0) as f64 * cores;
                let ours = (srv.unwrap_or(0.0) + own) / secs.max(1e-9);
                row.insert(
                    "host_busy_pct".into(),
                    json!(round(100.0 * busy_cores / cores, 1)),
                );
                row.insert(
                    "other_cpu_pct".into(),
                    json!(round((100.0 * (busy_cores - ours)).max(0.0), 1)),
                );
            }
        }
    }
}

pub fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn latencies(row: &mut Map<String, Value>, mut us: Vec<u64>) {
    us.sort_unstable();
    row.insert("p50_us".into(), json!(quantile(&us, 0.5)));
    row.insert("p99_us".into(), json!(quantile(&us, 0.99)));
    row.insert("max_us".into(), json!(us.last()));
}

fn checks(
    row: &mut Map<String, Value>,
    lost: u64,
    dup: u64,
    reordered: u64,
    bad: u64,
    error: Option<String>,
) {
    let ok = lost == 0 && dup == 0 && reordered == 0 && bad == 0 && error.is_none();
    row.insert("lost".into(), json!(lost));
    row.insert("dup".into(), json!(dup));
    row.insert("reordered".into(), json!(reordered));
    row.insert("bad".into(), json!(bad));
    row.insert("ok".into(), json!(ok));
    row.insert("error".into(), json!(error));
}

fn base(s: &Spec, workload: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("workload".into(), json!(workload));
    m.insert("proto".into(), json!(s.proto.name()));
    m.insert("msgs".into(), json!(s.msgs));
    m.insert("size".into(), json!(s.size));
    m
}

/// What a receiving thread reports.
struct Heard {
    tally: Tally,
    last: Option<Instant>,
    error: Option<String>,
}

/// A queue member's delivery count, on a cache line of its own so that
/// members do not slow each other down.
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

/// Reads deliveries until it has all `n` (fanout), the group has them all
/// (queue: the members' `slots` add up to `n`; looked at every 64
/// deliveries and whenever nothing comes), `stop` is set, or nothing comes
/// for STALL.
fn receive(
    mut c: Conn,
    n: u64,
    slots: Option<(Arc<Vec<Slot>>, usize)>,
    warm: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Heard {
    let mut h = Heard {
        tally: Tally::new(n),
        last: None,
        error: None,
    };
    let mut warmed = false;
    let mut progress = Instant::now();
    let group_done = |slots: &Vec<Slot>| {
        slots
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum::<u64>()
            >= n
    };
    let mut check = true;
    loop {
        let done = match &slots {
            Some((all, _)) => check && group_done(all),
            None => h.tally.complete(),
        };
        if done || stop.load(Ordering::Relaxed) {
            break;
        }
        check = false;
        match c.next() {
            Ok(Event::Msg { data, .. }) => {
                if payload::is_warm(data) {
                    if !warmed {
                        warmed = true;
                        warm.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                h.tally.note(data);
                let now = Instant::now();
                h.last = Some(now);
                progress = now;
                if let Some((all, i)) = &slots {
                    let got = h.tally.distinct + h.tally.dup + h.tally.bad;
                    all[*i].0.store(got, Ordering::Relaxed);
                    check = got.is_multiple_of(64);
                }
            }
            Ok(_) => {}
            Err(e) if timed_out(&e) => {
                check = true;
                if progress.elapsed() > STALL && (warmed || warm.load(Ordering::Relaxed) == 0) {
                    h.error = Some(format!("no delivery for {} s", STALL.as_secs()));
                    break;
                }
            }
            Err(e) => {
                h.error = Some(e.to_string());
                break;
            }
        }
    }
    h
}

/// Publishes warm-up bodies every 10 ms until `want` receivers heard one.
fn warm_up(p: &mut Conn, subject: &[u8], size: usize, heard: &AtomicU64, want: u64) -> Res<()> {
    let body = payload::warm_body(size);
    let deadline = Instant::now() + Duration::from_secs(30);
    while heard.load(Ordering::Relaxed) < want {
        if Instant::now() > deadline {
            return Err(format!(
                "warm-up: {} of {want} subscribers heard the publisher's node within 30 s",
                heard.load(Ordering::Relaxed)
            ));
        }
        p.publish(subject, &body).map_err(e2s)?;
        p.flush().map_err(e2s)?;
        thread::sleep(Duration::from_millis(10));
    }
    p.barrier().map_err(e2s)
}

/// fanout (every subscriber gets every message) or queue (a group of
/// `subs` members shares them). `name` is the row's workload name.
pub fn fanout(s: &Spec, queue: bool, name: &str) -> Res<Value> {
    let subject = if queue { "bench.queue" } else { "bench.fanout" };
    let (n, k) = (s.msgs, s.subs.max(1));
    let slots = queue.then(|| Arc::new((0..k).map(|_| Slot::default()).collect::<Vec<_>>()));
    let warm = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut receivers = Vec::new();
    for i in 0..k {
        let addr = &s.sub_addrs[i as usize % s.sub_addrs.len()];
        let mut c = Conn::connect(s.proto, addr, false)
            .map_err(|e| format!("subscriber {i} at {addr}: {e}"))?;
        c.subscribe(subject, queue.then_some("q"), 1).map_err(e2s)?;
        c.set_read_timeout(SLICE).map_err(e2s)?;
        let slots = slots.clone().map(|all| (all, i as usize));
        let (warm, stop) = (warm.clone(), stop.clone());
        receivers.push(thread::spawn(move || receive(c, n, slots, warm, stop)));
    }
    let run = || -> Res<(Clock, f64)> {
        let mut p = Conn::connect(s.proto, &s.pub_addr, false).map_err(e2s)?;
        if s.warm {
            warm_up(&mut p, subject.as_bytes(), s.size, &warm, k)?;
        }
        let mut body = payload::body(s.size);
        let clock = Clock::start(&s.server_pids);
        for seq in 0..n {
            payload::stamp(&mut body, seq);
            p.publish(subject.as_bytes(), &body).map_err(e2s)?;
            if (seq + 1) % s.batch == 0 || p.buffered() >= FLUSH_BYTES {
                p.flush().map_err(e2s)?;
            }
        }
        p.barrier()
            .map_err(|e| format!("end-of-publish barrier: {e}"))?;
        let pub_s = clock.t0.elapsed().as_secs_f64();
        Ok((clock, pub_s))
    };
    let published = run();
    if published.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    let heard: Vec<Heard> = receivers
        .into_iter()
        .map(|h| h.join().expect("receiver thread"))
        .collect();
    let (clock, pub_s) = published?;
    let last = heard
        .iter()
        .filter_map(|h| h.last)
        .max()
        .unwrap_or(clock.t0);
    let secs = last.duration_since(clock.t0).as_secs_f64().max(1e-9);
    let error = heard.iter().find_map(|h| h.error.clone());
    let mut row = base(s, name);
    row.insert("subs".into(), json!(k));
    let (deliveries, lost, dup, reordered, bad) = if queue {
        let mut all = Tally::new(n);
        for h in &heard {
            all.merge(&h.tally);
        }
        (n, all.lost(), all.dup, all.reordered, all.bad)
    } else {
        let sum = |f: fn(&Tally) -> u64| heard.iter().map(|h| f(&h.tally)).sum::<u64>();
        (
            n * k,
            sum(Tally::lost),
            sum(|t| t.dup),
            sum(|t| t.reordered),
            sum(|t| t.bad),
        )
    };
    row.insert("msgs_per_s".into(), json!(round(n as f64 / secs, 0)));
    row.insert(
        "deliveries_per_s".into(),
        json!(round(deliveries as f64 / secs, 0)),
    );
    row.insert(
        "pub_per_s".into(),
        json!(round(n as f64 / pub_s.max(1e-9), 0)),
    );
    clock.finish(&s.server_pids, secs, deliveries, &mut row);
    checks(&mut row, lost, dup, reordered, bad, error);
    Ok(Value::Object(row))
}

/// reqrep: one responder echoes, one requester makes sequential requests.
pub fn reqrep(s: &Spec) -> Res<Value> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut r = Conn::connect(s.proto, &s.sub_addrs[0], false).map_err(e2s)?;
    r.subscribe("bench.req", None, 1).map_err(e2s)?;
    r.set_read_timeout(SLICE).map_err(e2s)?;
    let stop2 = stop.clone();
    let responder = thread::spawn(move || -> Option<String> {
        let (mut reply, mut data) = (Vec::new(), Vec::new());
        while !stop2.load(Ordering::Relaxed) {
            match r.next() {
                Ok(Event::Msg {
                    data: d,
                    reply: Some(rp),
                    ..
                }) => {
                    reply.clear();
                    reply.extend_from_slice(rp);
                    data.clear();
                    data.extend_from_slice(d);
                    if let Err(e) = r.respond(&reply, &data).and_then(|_| r.flush()) {
                        return Some(format!("responder: {e}"));
                    }
                }
                Ok(_) => {}
                Err(e) if timed_out(&e) => {}
                Err(e) => return Some(format!("responder: {e}")),
            }
        }
        None
    });
    let mut q = Conn::connect(s.proto, &s.pub_addr, false).map_err(e2s)?;
    q.listen_inbox().map_err(e2s)?;
    q.set_read_timeout(Duration::from_secs(5)).map_err(e2s)?;
    let mut body = payload::body(s.size);
    let (mut failed, mut bad) = (0u64, 0u64);
    let mut error = None;
    let mut lat = Vec::with_capacity(s.msgs as usize);
    let mut clock = None;
    let mut done = 0u64;
    for i in 0..WARMUP_REQUESTS + s.msgs {
        if i == WARMUP_REQUESTS {
            clock = Some(Clock::start(&s.server_pids));
        }
        payload::stamp(&mut body, i);
        let t = Instant::now();
        q.request("bench.req", &body, i)
            .and_then(|_| q.flush())
            .map_err(e2s)?;
        let answered = loop {
            match q.next() {
                Ok(Event::Ack { id, data, raw }) if id == i => {
                    if data != &body[..] {
                        bad += 1;
                        error.get_or_insert_with(|| {
                            format!("reply differs: {}", String::from_utf8_lossy(raw))
                        });
                    }
                    break true;
                }
                Ok(_) => {}
                Err(e) => {
                    failed += 1;
                    error.get_or_insert_with(|| format!("request {i}: {e}"));
                    break false;
                }
            }
        };
        if i >= WARMUP_REQUESTS && answered {
            lat.push(t.elapsed().as_micros() as u64);
            done += 1;
        }
        if failed >= 3 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let resp_err = responder.join().expect("responder thread");
    let clock = clock.ok_or_else(|| error.clone().unwrap_or_else(|| "warm-up failed".into()))?;
    let secs = clock.t0.elapsed().as_secs_f64();
    let mut row = base(s, "reqrep");
    row.insert(
        "msgs_per_s".into(),
        json!(round(done as f64 / secs.max(1e-9), 0)),
    );
    latencies(&mut row, lat);
    clock.finish(&s.server_pids, secs, done, &mut row);
    let lost = s.msgs - done;
    checks(&mut row, lost, 0, 0, bad, error.or(resp_err));
    Ok(Value::Object(row))
}

/// The stream sequence number in an ack, or None for a refusal.
pub fn ack_seq(raw: &[u8]) -> Option<u64> {
    if refused(raw) {
        return None;
    }
    number_after(raw, b"\"seq\":")
}

/// stream: acked publishes into stream BENCH with at most `window` awaiting
/// their ack; topped up when a quarter of the window (at most `batch`) is free.
pub fn stream(s: &Spec) -> Res<Value> {
    let mut c = Conn::connect(s.proto, &s.pub_addr, false).map_err(e2s)?;
    c.listen_inbox().map_err(e2s)?;
    c.create_stream("BENCH", "bench.stream.>", 1).map_err(e2s)?;
    Ok(Value::Object(publish_window(
        s,
        &mut c,
        "bench.stream.x",
        "stream",
    )))
}

/// The acked publishes of stream and stream3 on connection `c` (its stream
/// made already): `s.msgs` publishes to `subject`, at most `s.window`
/// awaiting their ack. The row: rate, latencies, CPU and checks.
fn publish_window(s: &Spec, c: &mut Conn, subject: &str, workload: &str) -> Map<String, Value> {
    let mut body = payload::body(s.size);
    let send = |c: &mut Conn, id: u64| {
        payload::stamp(&mut body, id);
        c.publish_acked(subject, &body, id)
    };
    let answer = |_: u64, _: &[u8], raw: &[u8]| {
        ack_seq(raw).ok_or_else(|| format!("publish refused: {}", String::from_utf8_lossy(raw)))
    };
    windowed(s, c, workload, true, send, answer).0
}

/// `s.msgs` acked operations on connection `c`, operation `id` sent by
/// `send`, at most `s.window` awaiting their answer; topped up when a
/// quarter of the window (at most `s.batch`) is free. `answer` reads an
/// operation's answer (id, data, whole answer) into its sequence number
/// (stream seq, key revision), or says why it is refused or wrong. With
/// `ordered`, a later operation must get a higher sequence number (acked
/// writes of one publisher). The row (rate `acked_per_s`, latencies, CPU,
/// checks) and the sequence number of each operation (0: none).
fn windowed(
    s: &Spec,
    c: &mut Conn,
    workload: &str,
    ordered: bool,
    mut send: impl FnMut(&mut Conn, u64) -> std::io::Result<()>,
    mut answer: impl FnMut(u64, &[u8], &[u8]) -> Result<u64, String>,
) -> (Map<String, Value>, Vec<u64>) {
    let (n, w) = (s.msgs, s.window.max(1));
    let mut error = None;
    if let Err(e) = c.set_read_timeout(SLICE) {
        error = Some(e.to_string());
    }
    let refill = (w / 4).clamp(1, s.batch.max(1));
    let mut sent_at = vec![0u32; n as usize];
    let mut acked = Tally::new(n);
    let (mut next, mut inflight, mut last_seq) = (0u64, 0u64, 0u64);
    let (mut bad, mut acks_out_of_order) = (0u64, 0u64);
    // The seq each publish was acked with (0: none), by publish id.
    let mut seq_of = vec![0u64; n as usize];
    let mut lat = Vec::with_capacity(n as usize);
    let clock = Clock::start(&s.server_pids);
    let mut progress = Instant::now();
    let mut last_ack = clock.t0;
    let mut refused = 0u64;
    while acked.distinct < n && error.is_none() {
        let free = w - inflight;
        if next < n && (free >= refill || inflight == 0) {
            let k = free.min(n - next);
            let at = clock.t0.elapsed().as_micros() as u32;
            let sent = (next..next + k)
                .try_for_each(|id| {
                    sent_at[id as usize] = at;
                    send(c, id)
                })
                .and_then(|_| c.flush());
            if let Err(e) = sent {
                error = Some(e.to_string());
                break;
            }
            next += k;
            inflight += k;
        }
        match c.next() {
            Ok(Event::Ack { id, data, raw }) => {
                let now = Instant::now();
                progress = now;
                if id >= next {
                    // An ack naming no publish sent.
                    bad += 1;
                    continue;
                }
                let before = acked.dup;
                acked.note_seq(id);
                if acked.dup > before {
                    continue;
                }
                inflight -= 1;
                last_ack = now;
                let t = now.duration_since(clock.t0).as_micros() as u64;
                lat.push(t.saturating_sub(u64::from(sent_at[id as usize])));
                match answer(id, data, raw) {
                    Err(why) => {
                        refused += 1;
                        error.get_or_insert(why);
                    }
                    Ok(q) => {
                        seq_of[id as usize] = q;
                        if q < last_seq {
                            acks_out_of_order += 1;
                        }
                        last_seq = last_seq.max(q);
                    }
                }
            }
            Ok(_) => {}
            Err(e) if timed_out(&e) => {
                if progress.elapsed() > STALL {
                    error = Some(format!("no ack for {} s", STALL.as_secs()));
                    break;
                }
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let secs = last_ack.duration_since(clock.t0).as_secs_f64().max(1e-9);
    let mut row = base(s, workload);
    row.insert("window".into(), json!(w));
    let stored = acked.distinct - refused;
    row.insert("acked_per_s".into(), json!(round(stored as f64 / secs, 0)));
    row.insert("acked".into(), json!(stored));
    latencies(&mut row, lat);
    clock.finish(&s.server_pids, secs, stored, &mut row);
    let lost = acked.lost() + refused;
    // Acks may arrive in any order (counted, not judged); stream sequence
    // numbers may not: a later publish must be stored under a higher one,
    // and no two publishes under the same.
    let (mut reordered, mut dup_seq, mut prev) = (0u64, 0u64, 0u64);
    for &q in seq_of.iter().filter(|q| ordered && **q > 0) {
        if q == prev {
            dup_seq += 1;
        } else if q < prev {
            reordered += 1;
        }
        prev = prev.max(q);
    }
    if ordered {
        row.insert("acks_out_of_order".into(), json!(acks_out_of_order));
    }
    checks(
        &mut row,
        lost,
        acked.dup + dup_seq,
        reordered,
        bad + refused,
        error,
    );
    (row, seq_of)
}

/// The bucket the kv workload writes.
const BUCKET: &str = "bench";

/// kv: bucket `bench` (history 1) is created, then `s.msgs` acked puts,
/// put `id` writing body `id` to key `k<id % keys>`, then `s.msgs` gets of
/// the latest value of key `k<id % keys>`, each with at most `s.window`
/// awaiting their answer and the stream workload's refill rule. Puts
/// must get revisions in put order, each once; every get must return the
/// key's last put, body and revision. One row each, `kv-put` and `kv-get`.
pub fn kv(s: &Spec) -> Res<Vec<Value>> {
    let mut c = Conn::connect(s.proto, &s.pub_addr, false).map_err(e2s)?;
    c.listen_inbox().map_err(e2s)?;
    c.set_read_timeout(Duration::from_secs(5)).map_err(e2s)?;
    c.create_bucket(BUCKET).map_err(e2s)?;
    let (n, keys) = (s.msgs, s.keys.clamp(1, s.msgs.max(1)));
    let key = |id: u64| format!("k{}", id % keys);
    let mut body = payload::body(s.size);
    let put = |c: &mut Conn, id: u64| {
        payload::stamp(&mut body, id);
        c.kv_put(BUCKET, &key(id), &body, id)
    };
    let put_answer = |_: u64, _: &[u8], raw: &[u8]| {
        kv_revision(raw).ok_or_else(|| format!("put refused: {}", String::from_utf8_lossy(raw)))
    };
    let (mut put_row, revision_of) = windowed(s, &mut c, "kv-put", true, put, put_answer);
    put_row.insert("keys".into(), json!(keys));
    if put_row["ok"] != json!(true) {
        return Ok(vec![Value::Object(put_row)]);
    }
    // The last put of key `id % keys`.
    let last = |id: u64| {
        let k = id % keys;
        k + (n - 1 - k) / keys * keys
    };
    let mut want = payload::body(s.size);
    let proto = s.proto;
    let get = |c: &mut Conn, id: u64| c.kv_get(BUCKET, &key(id), id);
    let get_answer = |id: u64, data: &[u8], raw: &[u8]| {
        let l = last(id);
        payload::stamp(&mut want, l);
        match kv_entry(proto, data, raw) {
            Some((value, rev)) if value == want && rev == revision_of[l as usize] => Ok(rev),
            _ => Err(format!(
                "get of {} answered {}, not put {l} at revision {}",
                key(id),
                String::from_utf8_lossy(raw),
                revision_of[l as usize]
            )),
        }
    };
    let (mut get_row, _) = windowed(s, &mut c, "kv-get", false, get, get_answer);
    get_row.insert("keys".into(), json!(keys));
    let mut rows = vec![Value::Object(put_row), Value::Object(get_row)];
    if s.watch_msgs > 0 {
        let mut watch_row = kv_watch(s, &mut c, n, keys);
        watch_row.insert("keys".into(), json!(keys));
        rows.push(Value::Object(watch_row));
    }
    Ok(rows)
}

/// What one watch delivery is.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched<'a> {
    /// A put stored at `revision` with this value.
    Put { revision: u64, value: &'a [u8] },
    /// gombus: the end of the watch's initial values.
    CaughtUp,
    /// NATS: a flow-control request (status 100 with a reply subject),
    /// answered by an empty message to that subject.
    FlowControl,
    /// Anything else: a NATS idle heartbeat, a marker.
    Other,
}

/// Reads a watch delivery (`data`, `reply` and `raw` of an `Event::Msg`):
/// gombus `{sid, bucket, key, value, revision, op, time}` or
/// `{sid, bucket, caught_up:true}`; NATS a JetStream push delivery, whose
/// stream sequence (the revision) is the fourth token of its reply
/// subject `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
/// seq>.<time>.<pending>` (or the sixth, after a domain and an account
/// hash, in the longer form).
pub fn kv_watched<'a>(
    proto: Proto,
    data: &'a [u8],
    reply: Option<&[u8]>,
    raw: &'a [u8],
) -> Watched<'a> {
    match proto {
        Proto::Sio => {
            if memchr::memmem::find(raw, b"\"caught_up\":true").is_some() {
                return Watched::CaughtUp;
            }
            if memchr::memmem::find(raw, b"\"op\":\"put\"").is_none() {
                return Watched::Other;
            }
            match (
                number_after(raw, b"\"revision\":"),
                crate::sio::string_field(raw, b"\"value\":\""),
            ) {
                (Some(revision), Some(value)) => Watched::Put { revision, value },
                _ => Watched::Other,
            }
        }
        Proto::Nats | Proto::NatsWs => {
            if raw.starts_with(b"NATS/1.0 100") {
                return match reply {
                    Some(_) => Watched::FlowControl,
                    None => Watched::Other,
                };
            }
            if raw.starts_with(b"NATS/1.0 ") {
                // Another status, or a marker (`KV-Operation`).
                return Watched::Other;
            }
            if memchr::memmem::find(raw, b"KV-Operation:").is_some() {
                return Watched::Other;
            }
            let Some(tokens) = reply.and_then(|r| r.strip_prefix(b"$JS.ACK.")) else {
                return Watched::Other;
            };
            let tokens: Vec<&[u8]> = tokens.split(|&c| c == b'.').collect();
            let at = match tokens.len() {
                7 => 3,
                n if n >= 9 => 5,
                _ => return Watched::Other,
            };
            match std::str::from_utf8(tokens[at])
                .ok()
                .and_then(|t| t.parse().ok())
            {
                Some(revision) => Watched::Put {
                    revision,
                    value: data,
                },
                None => Watched::Other,
            }
        }
    }
}

/// What the watcher of kv-watch heard: each put's revision, when it came
/// (µs after the phase's start) and the number its value carries.
struct WatchHeard {
    got: Vec<(u64, u64, Option<u64>)>,
    error: Option<String>,
}

/// Reads watch deliveries on `w` until `m` puts came, `stop` is set, or
/// nothing comes for STALL; answers flow-control requests.
fn watch_receive(
    mut w: Conn,
    proto: Proto,
    m: u64,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> WatchHeard {
    let mut h = WatchHeard {
        got: Vec::with_capacity(m as usize),
        error: None,
    };
    let mut progress = Instant::now();
    while (h.got.len() as u64) < m && !stop.load(Ordering::Relaxed) {
        let answer = match w.next() {
            Ok(Event::Msg { data, reply, raw }) => match kv_watched(proto, data, reply, raw) {
                Watched::Put { revision, value } => {
                    let now = Instant::now();
                    progress = now;
                    let at = now.duration_since(t0).as_micros() as u64;
                    h.got.push((revision, at, payload::seq_of(value)));
                    None
                }
                Watched::FlowControl => reply.map(<[u8]>::to_vec),
                Watched::CaughtUp | Watched::Other => None,
            },
            Ok(_) => None,
            Err(e) if timed_out(&e) => {
                if progress.elapsed() > STALL {
                    h.error = Some(format!("watch: no delivery for {} s", STALL.as_secs()));
                    break;
                }
                None
            }
            Err(e) => {
                h.error = Some(format!("watch: {e}"));
                break;
            }
        };
        if let Some(to) = answer {
            if let Err(e) = w.respond(&to, b"").and_then(|_| w.flush()) {
                h.error = Some(format!("watch: flow-control answer: {e}"));
                break;
            }
        }
    }
    h
}

/// kv-watch: a second connection watches bucket `bench` for new writes
/// only; then `s.watch_msgs` acked puts are made on `c` at a steady
/// `s.watch_rate` per second (put `j` sent at j ÷ rate, whatever the
/// acks), put `j` writing body `n + j` to key `k<(n + j) % keys>`. Each
/// put's latency is from its send to the watcher receiving its revision.
/// Every acked revision must reach the watcher once, in revision order,
/// with its value.
fn kv_watch(s: &Spec, c: &mut Conn, n: u64, keys: u64) -> Map<String, Value> {
    let m = s.watch_msgs;
    let mut row = base(s, "kv-watch");
    row.insert("msgs".into(), json!(m));
    row.insert("rate_target".into(), json!(s.watch_rate));
    let watcher = Conn::connect(s.proto, &s.sub_addrs[0], false).and_then(|mut w| {
        w.set_read_timeout(Duration::from_secs(5))?;
        w.kv_watch(BUCKET)?;
        w.set_read_timeout(SLICE)?;
        Ok(w)
    });
    let w = match watcher {
        Ok(w) => w,
        Err(e) => {
            checks(&mut row, m, 0, 0, 0, Some(format!("watch: {e}")));
            return row;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let (proto, stop2) = (s.proto, stop.clone());
    let receiver = thread::spawn(move || watch_receive(w, proto, m, t0, stop2));
    let period = Duration::from_secs_f64(1.0 / s.watch_rate.max(1) as f64);
    let mut body = payload::body(s.size);
    let mut sent_at = vec![0u64; m as usize];
    // The revision each put was acked with (0: none yet).
    let mut revision_of = vec![0u64; m as usize];
    let mut answered = 0u64;
    let mut error: Option<String> = None;
    let clock = Clock::start(&s.server_pids);
    // One ack read into `revision_of`; false when none was there.
    let mut take_ack = |c: &mut Conn, answered: &mut u64| -> Res<bool> {
        match c.next() {
            Ok(Event::Ack { id, raw, .. }) => {
                let j = id.wrapping_sub(n);
                if j >= m || revision_of[j as usize] != 0 {
                    return Err(format!(
                        "an ack for no put awaiting one: {}",
                        String::from_utf8_lossy(raw)
                    ));
                }
                revision_of[j as usize] = kv_revision(raw)
                    .ok_or_else(|| format!("put refused: {}", String::from_utf8_lossy(raw)))?;
                *answered += 1;
                Ok(true)
            }
            Ok(_) => Ok(true),
            Err(e) if timed_out(&e) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    };
    let mut paced = || -> Res<()> {
        for j in 0..m {
            // Take the acks that came, then wait for put j's time.
            c.set_nonblocking(true).map_err(e2s)?;
            while take_ack(c, &mut answered)? {}
            c.set_nonblocking(false).map_err(e2s)?;
            let due = clock.t0 + period.mul_f64(j as f64);
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            let id = n + j;
            payload::stamp(&mut body, id);
            sent_at[j as usize] = t0.elapsed().as_micros() as u64;
            c.kv_put(BUCKET, &format!("k{}", id % keys), &body, id)
                .and_then(|_| c.flush())
                .map_err(e2s)?;
        }
        c.set_read_timeout(SLICE).map_err(e2s)?;
        let mut progress = Instant::now();
        while answered < m {
            if take_ack(c, &mut answered)? {
                progress = Instant::now();
            } else if progress.elapsed() > STALL {
                return Err(format!("no ack for {} s", STALL.as_secs()));
            }
        }
        Ok(())
    };
    if let Err(e) = paced() {
        error = Some(e);
        stop.store(true, Ordering::Relaxed);
    }
    let heard = receiver.join().expect("watcher thread");
    let last = heard.got.last().map_or(0, |g| g.1);
    let secs = (last.saturating_sub(clock.t0.duration_since(t0).as_micros() as u64) as f64 / 1e6)
        .max(1e-9);
    // Each revision's put, and what the watcher made of them.
    let put_of: std::collections::HashMap<u64, usize> = revision_of
        .iter()
        .enumerate()
        .filter(|(_, r)| **r > 0)
        .map(|(j, r)| (*r, j))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let (mut dup, mut reordered, mut bad, mut prev) = (0u64, 0u64, 0u64, 0u64);
    let mut lat = Vec::with_capacity(heard.got.len());
    for &(revision, at, value) in &heard.got {
        if !seen.insert(revision) {
            dup += 1;
            error.get_or_insert(format!("watch: revision {revision} came again"));
            continue;
        }
        if revision < prev {
            reordered += 1;
            error.get_or_insert(format!("watch: revision {revision} came after {prev}"));
        }
        prev = prev.max(revision);
        match put_of.get(&revision) {
            Some(&j) if value == Some(n + j as u64) => {
                lat.push(at.saturating_sub(sent_at[j]));
            }
            _ => {
                bad += 1;
                error.get_or_insert(format!(
                    "watch: revision {revision} with value {value:?} is no acked put's"
                ));
            }
        }
    }
    let missed: Vec<u64> = {
        let mut v: Vec<u64> = put_of
            .keys()
            .filter(|r| !seen.contains(r))
            .copied()
            .collect();
        v.sort_unstable();
        v
    };
    if let Some(first) = missed.first() {
        error.get_or_insert(format!(
            "watch: {} acked revisions never came, the first {first}",
            missed.len()
        ));
    }
    let received = heard.got.len() as u64;
    row.insert("received".into(), json!(received));
    row.insert(
        "watched_per_s".into(),
        json!(round(received as f64 / secs, 0)),
    );
    latencies(&mut row, lat);
    clock.finish(&s.server_pids, secs, received, &mut row);
    let lost = missed.len() as u64 + (m - answered);
    checks(&mut row, lost, dup, reordered, bad, error.or(heard.error));
    row
}

/// The number after `key` (e.g. `"seq":`) in `raw`.
fn number_after(raw: &[u8], key: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(raw, key)? + key.len();
    let digits = raw[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&raw[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Whether an answer is a refusal (an error, `ok:false`).
fn refused(raw: &[u8]) -> bool {
    memchr::memmem::find(raw, b"\"error\"").is_some()
        || memchr::memmem::find(raw, b"\"ok\":false").is_some()
}

/// The revision a put's answer gives: gombus `{ok, revision}`, a
/// JetStream PubAck's `seq`; None for a refusal.
pub fn kv_revision(raw: &[u8]) -> Option<u64> {
    if refused(raw) {
        return None;
    }
    number_after(raw, b"\"revision\":").or_else(|| number_after(raw, b"\"seq\":"))
}

/// The value and revision a get's answer gives: gombus `{ok, entry:{value,
/// revision}}` (the bench's values are JSON strings), a JetStream direct
/// get's message (the value as body, the revision in `Nats-Sequence`);
/// None for a refusal or a missing key.
pub fn kv_entry<'a>(proto: Proto, data: &'a [u8], raw: &'a [u8]) -> Option<(&'a [u8], u64)> {
    match proto {
        Proto::Sio => {
            if refused(raw) {
                return None;
            }
            let value = crate::sio::string_field(raw, b"\"value\":\"")?;
            Some((value, number_after(raw, b"\"revision\":")?))
        }
        Proto::Nats | Proto::NatsWs => {
            // A missing key is a header-only `NATS/1.0 404 …`.
            if !raw.starts_with(b"NATS/1.0\r\n") {
                return None;
            }
            Some((data, number_after(raw, b"Nats-Sequence: ")?))
        }
    }
}

/// How long stream3 waits for a stream's leader and replicas, and for its
/// information after the run.
const STREAM3_WAIT: Duration = Duration::from_secs(10);

/// Reads stream `name`'s information on `c` until `want` holds (at most
/// `within`; a read timeout or an error answer is tried again); the last
/// view and whether it held.
fn await_view(
    c: &mut Conn,
    name: &str,
    within: Duration,
    want: impl Fn(&StreamView) -> bool,
) -> (Option<StreamView>, bool) {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        if let Ok(v) = c.stream_info(name) {
            let ok = v.error.is_none() && want(&v);
            last = Some(v);
            if ok {
                return (last, true);
            }
        }
        if Instant::now() >= deadline {
            return (last, false);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Creates stream `name` over `subject` with three replicas through `c`,
/// trying again while the cluster cannot take it yet (a JetStream cluster
/// still electing its meta leader answers with an error or not at all),
/// at most `within`.
fn create_replicated(c: &mut Conn, name: &str, subject: &str, within: Duration) -> Res<()> {
    let deadline = Instant::now() + within;
    loop {
        match c.create_stream(name, subject, 3) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("stream.create with 3 replicas: {e}"))
            }
            Err(_) => thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// stream3: the stream workload against a three-node cluster, with the
/// stream kept by three replicas. It runs twice, each time on a stream of
/// its own: with the publisher connected to a node that does not lead the
/// stream (`via: follower`, every publish goes to the leader and back),
/// then to the leader (`via: leader`). Before publishing, the stream's
/// information must show a leader and two replicas; after the last ack it
/// must hold every acked message. One row each, workloads
/// `stream3-follower` and `stream3-leader`.
pub fn stream3(s: &Spec, create_wait: Duration) -> Res<Vec<Value>> {
    let mut rows = Vec::new();
    for (via, tag) in [("follower", "F"), ("leader", "L")] {
        let workload = format!("stream3-{via}");
        let name = format!("BENCH3{tag}");
        let prefix = format!("bench.s3{}", tag.to_lowercase());
        let mut admin = Conn::connect(s.proto, &s.nodes[0], false).map_err(e2s)?;
        admin.listen_inbox().map_err(e2s)?;
        admin
            .set_read_timeout(Duration::from_secs(2))
            .map_err(e2s)?;
        create_replicated(&mut admin, &name, &format!("{prefix}.>"), create_wait)?;
        let (view, placed) = await_view(&mut admin, &name, STREAM3_WAIT, |v| {
            v.leader.is_some() && v.replicas == 2
        });
        let view = view.unwrap_or_default();
        let mut row = if !placed {
            let mut row = base(s, &workload);
            checks(
                &mut row,
                0,
                0,
                0,
                0,
                Some(format!(
                    "the stream's information shows no leader with two replicas within {} s: {view:?}",
                    STREAM3_WAIT.as_secs()
                )),
            );
            row
        } else {
            let leader = view.leader.unwrap_or(0);
            let at = match via {
                "leader" => leader,
                _ => (leader + 1) % s.nodes.len(),
            };
            let addr = s
                .nodes
                .get(at)
                .ok_or("the stream's leader is no node we started")?;
            let mut c = Conn::connect(s.proto, addr, false).map_err(e2s)?;
            c.listen_inbox().map_err(e2s)?;
            let mut row = publish_window(s, &mut c, &format!("{prefix}.x"), &workload);
            row.insert("pub_node".into(), json!(format!("n{}", at + 1)));
            // What every node sent to storage, per byte published, per
            // replica (the three nodes hold one each).
            let published = row["acked"].as_u64().unwrap_or(0) * s.size as u64;
            let per_byte = row["server_write_bytes"]
                .as_u64()
                .filter(|_| published > 0)
                .map(|w| round(w as f64 / published as f64 / s.nodes.len() as f64, 2));
            row.insert("write_per_byte".into(), json!(per_byte));
            row.insert("stream_leader".into(), json!(format!("n{}", leader + 1)));
            let acked = row["acked"].as_u64().unwrap_or(0);
            let (after, held) = await_view(&mut admin, &name, STREAM3_WAIT, |v| {
                v.messages == Some(acked)
            });
            let after = after.unwrap_or_default();
            row.insert("stream_messages".into(), json!(after.messages));
            row.insert("replicas_current".into(), json!(after.current));
            if !held && row["ok"] == json!(true) {
                row.insert("ok".into(), json!(false));
                row.insert(
                    "error".into(),
                    json!(format!(
                        "{acked} publishes acked, the stream holds {:?}",
                        after.messages
                    )),
                );
            }
            row
        };
        row.insert("via".into(), json!(via));
        row.insert("replicas".into(), json!(view.replicas + 1));
        rows.push(Value::Object(row));
    }
    Ok(rows)
}

/// conns: `conns` idle connections, each with one confirmed subscription,
/// opened by four threads; the server's RSS growth per connection.
pub fn conns(s: &Spec) -> Res<Value> {
    const THREADS: u64 = 4;
    let total = s.conns;
    let rss0 = cpu::rss_sum(&s.server_pids);
    let clock = Clock::start(&s.server_pids);
    let mut opened = Vec::new();
    for t in 0..THREADS {
        let (proto, addr) = (s.proto, s.pub_addr.clone());
        let ids: Vec<u64> = (t..total).step_by(THREADS as usize).collect();
        opened.push(thread::spawn(move || {
            let mut held = Vec::with_capacity(ids.len());
            let mut err = None;
            for i in ids {
                let c = Conn::connect(proto, &addr, true)
                    .and_then(|mut c| c.subscribe(&format!("bench.idle.{i}"), None, 1).map(|_| c));
                match c {
                    Ok(c) => held.push(c),
                    Err(e) => {
                        err.get_or_insert(format!("connection {i}: {e}"));
                    }
                }
            }
            (held, err)
        }));
    }
    let mut sets = Vec::new();
    let mut error = None;
    for h in opened {
        let (held, err) = h.join().expect("connecting thread");
        error = error.or(err);
        sets.push(held);
    }
    let secs = clock.t0.elapsed().as_secs_f64();
    let up: u64 = sets.iter().map(|v| v.len() as u64).sum();
    let mut row = base(s, "conns");
    row.insert("msgs".into(), json!(total));
    row.insert(
        "conns_per_s".into(),
        json!(round(up as f64 / secs.max(1e-9), 0)),
    );
    clock.finish(&s.server_pids, secs, up, &mut row);
    // Let the server settle what the last connections left behind before
    // reading its memory.
    thread::sleep(Duration::from_secs(2));
    let rss1 = cpu::rss_sum(&s.server_pids);
    row.insert("rss_before_bytes".into(), json!(rss0));
    row.insert("rss_after_bytes".into(), json!(rss1));
    let per = match (rss0, rss1) {
        (Some(a), Some(b)) if up > 0 => Some(round((b as f64 - a as f64) / up as f64, 0)),
        _ => None,
    };
    row.insert("bytes_per_conn".into(), json!(per));
    // Every held connection must still answer.
    let checkers: Vec<_> = sets
        .into_iter()
        .map(|mut held| {
            thread::spawn(move || {
                let mut dead = 0u64;
                for c in &mut held {
                    if c.barrier().is_err() {
                        dead += 1;
                    }
                }
                dead
            })
        })
        .collect();
    let dead: u64 = checkers
        .into_iter()
        .map(|h| h.join().expect("checking thread"))
        .sum();
    if dead > 0 {
        error.get_or_insert(format!("{dead} connections did not answer at the end"));
    }
    checks(&mut row, total - up + dead, 0, 0, 0, error);
    Ok(Value::Object(row))
}

/// Raises this process's open-file limit to its hard limit (children
/// inherit it): conns needs a descriptor per connection on both sides.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain get/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            return r.rlim_cur;
        }
    }
    0
}

pub fn check_conns_limit(conns: u64) -> Res<()> {
    let lim = raise_nofile();
    if lim < conns + 64 {
        return Err(fail(format!(
            "open-file limit {lim} is too low for {conns} connections"
        ))
        .to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn stream_acks_both_protocols() {
        assert_eq!(
            ack_seq(br#"12[{"ok":true,"stream":"BENCH","seq":42}]"#),
            Some(42)
        );
        assert_eq!(ack_seq(br#"{"stream":"BENCH","seq":7}"#), Some(7));
        assert_eq!(
            ack_seq(br#"{"error":{"code":503,"description":"x"},"seq":1}"#),
            None
        );
        assert_eq!(ack_seq(br#"[{"ok":false,"error":{"code":"limit"}}]"#), None);
    }

    #[test]
    fn kv_answers_both_protocols() {
        assert_eq!(kv_revision(br#"[{"ok":true,"revision":9}]"#), Some(9));
        assert_eq!(kv_revision(br#"{"stream":"KV_bench","seq":9}"#), Some(9));
        let refused = br#"[{"ok":false,"error":{"code":"wrong_revision","revision":3}}]"#;
        assert_eq!(kv_revision(refused), None);
        let got = br#"[{"ok":true,"entry":{"key":"k1","value":"0000000004xx","revision":5,"time":1,"op":"put"}}]"#;
        assert_eq!(
            kv_entry(Proto::Sio, b"", got),
            Some((&b"0000000004xx"[..], 5))
        );
        let missing = br#"[{"ok":false,"error":{"code":"not_found"}}]"#;
        assert_eq!(kv_entry(Proto::Sio, b"", missing), None);
        let head = "NATS/1.0\r\nNats-Stream: KV_bench\r\nNats-Sequence: 5\r\n\r\n";
        let raw = format!("{head}0000000004xx");
        let data = &raw.as_bytes()[head.len()..];
        assert_eq!(
            kv_entry(Proto::Nats, data, raw.as_bytes()),
            Some((&b"0000000004xx"[..], 5))
        );
        let gone = b"NATS/1.0 404 Message Not Found\r\n\r\n";
        assert_eq!(kv_entry(Proto::Nats, b"", gone), None);
    }

    #[test]
    fn kv_watch_deliveries_both_protocols() {
        let put = br#"42["msg",{"sid":"1","bucket":"bench","key":"k4","value":"0000000004xx","revision":12,"op":"put","time":1}]"#;
        assert_eq!(
            kv_watched(Proto::Sio, b"", None, put),
            Watched::Put {
                revision: 12,
                value: b"0000000004xx"
            }
        );
        let caught = br#"42["msg",{"sid":"1","bucket":"bench","caught_up":true}]"#;
        assert_eq!(kv_watched(Proto::Sio, b"", None, caught), Watched::CaughtUp);
        let marker = br#"42["msg",{"sid":"1","bucket":"bench","key":"k4","revision":13,"op":"delete","time":1}]"#;
        assert_eq!(kv_watched(Proto::Sio, b"", None, marker), Watched::Other);

        let ack = b"$JS.ACK.KV_bench.dN7x.1.12.1.1795952964681000000.0";
        assert_eq!(
            kv_watched(Proto::Nats, b"0000000004xx", Some(ack), b"0000000004xx"),
            Watched::Put {
                revision: 12,
                value: b"0000000004xx"
            }
        );
        let long = b"$JS.ACK.hub.ACCHASH.KV_bench.dN7x.1.77.1.1795952964681000000.0.tok";
        assert!(matches!(
            kv_watched(Proto::Nats, b"v", Some(long), b"v"),
            Watched::Put { revision: 77, .. }
        ));
        let fc = b"NATS/1.0 100 FlowControl Request\r\n\r\n";
        assert_eq!(
            kv_watched(Proto::Nats, b"", Some(b"$JS.FC.KV_bench.x.y"), fc),
            Watched::FlowControl
        );
        let beat = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\n\r\n";
        assert_eq!(kv_watched(Proto::Nats, b"", None, beat), Watched::Other);
        let del = b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n";
        assert_eq!(kv_watched(Proto::Nats, b"", Some(ack), del), Watched::Other);
        assert_eq!(kv_watched(Proto::Nats, b"v", None, b"v"), Watched::Other);
        assert_eq!(
            kv_watched(
                Proto::Nats,
                b"v",
                Some(b"$JS.ACK.KV_bench.x.1.z.1.1.0"),
                b"v"
            ),
            Watched::Other
        );
    }
}
