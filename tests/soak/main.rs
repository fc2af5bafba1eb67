//! Chaos soak of a three-node loopback cluster: a mixed load (see
//! `load.rs`) runs while a seeded schedule kills (-9), freezes (SIGSTOP,
//! then SIGCONT) and restarts one node at a time, with a healthy period
//! between faults so a majority always stays. The checks run throughout;
//! the soak ends with a drain (every acked stream message must reach its
//! consumer), writes report.md and memory.svg, and fails on any
//! violation, printing the seed and the command that replays it.
//!
//! `cargo test --test soak` runs it for 30 s (part of `make test`);
//! `make soak DURATION=30m SEED=…` for longer. Knobs (environment):
//! `SOAK_DURATION` (`90`, `90s`, `5m`, `1h`), `SOAK_SEED`,
//! `SOAK_REPORT_DIR`, `SOAK_RECOVERY_MAX` (seconds, default 10).

#[path = "../cluster_support/mod.rs"]
mod cluster_support;
mod faults;
mod load;
mod report;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gombus::client::ConsumerConfig;
use gombus::client::StreamConfig;
use serde_json::Value;

use cluster_support::{try_http_get, Cluster, IDS};
use faults::{Kind, Rng};
use load::{Ctx, StreamSpec};
use report::{FaultRecord, Sample};

/// How often resources are sampled and the stream checks run.
const TICK: Duration = Duration::from_secs(1);
/// Healthy time between two faults.
const HEALTHY_MIN: Duration = Duration::from_secs(5);
const HEALTHY_MAX: Duration = Duration::from_secs(10);
/// How long a killed node stays down.
const DOWN_MIN: Duration = Duration::from_millis(500);
const DOWN_MAX: Duration = Duration::from_secs(4);
/// How long a frozen node stays stopped (past 3 s the others declare it
/// gone, so both sides of that line are exercised).
const FROZEN_MIN: Duration = Duration::from_millis(500);
const FROZEN_MAX: Duration = Duration::from_secs(5);
/// Bound on a clean stop (SIGTERM).
const TERM_WAIT: Duration = Duration::from_secs(10);
/// Bound on the drain: every acked stream message delivered.
const DRAIN_MAX: Duration = Duration::from_secs(60);
/// Stream data stays well inside the data directory bound.
const STREAM_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Bound on the listeners' subscriptions reaching every node.
const SETTLE_MAX: Duration = Duration::from_secs(10);

struct Config {
    duration: Duration,
    seed: u64,
    report_dir: PathBuf,
    recovery_max: Duration,
    /// The duration as given, for the replay command.
    duration_text: String,
}

fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => t.split_at(at),
        None => (t, "s"),
    };
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

impl Config {
    fn from_env() -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let duration_text = var("SOAK_DURATION").unwrap_or_else(|| "30s".into());
        let duration = parse_duration(&duration_text)
            .unwrap_or_else(|| panic!("SOAK_DURATION={duration_text}: want e.g. 90s, 5m, 1h"));
        let seed = match var("SOAK_SEED") {
            Some(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("SOAK_SEED={s}: want an unsigned integer")),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000_000)
                .unwrap_or(1),
        };
        let report_dir = var("SOAK_REPORT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("soak-{}", report::stamp()))
            });
        let recovery_max = Duration::from_secs(
            var("SOAK_RECOVERY_MAX")
                .and_then(|s| s.parse().ok())
                .unwrap_or(10),
        );
        Config {
            duration,
            seed,
            report_dir,
            recovery_max,
            duration_text,
        }
    }

    fn replay(&self) -> String {
        format!(
            "make soak DURATION={} SEED={}",
            self.duration_text, self.seed
        )
    }
}

/// Drives the soak: the fault schedule, sampling and the health checks
/// all run on this thread, which owns the cluster.
struct Soak {
    cluster: Cluster,
    ctx: Arc<Ctx>,
    samples: Vec<Sample>,
    /// Bounds already reported per node, so one excess is one violation.
    over_reported: [bool; 3],
    next_tick: Instant,
}

impl Soak {
    /// Samples and checks if a tick is due.
    fn tick(&mut self) {
        if Instant::now() < self.next_tick {
            return;
        }
        self.next_tick = Instant::now() + TICK;
        let mut nodes = [None; 3];
        for (i, slot) in nodes.iter_mut().enumerate() {
            if self.cluster.is_running(i) && !self.cluster.is_paused(i) {
                *slot = report::usage(self.cluster.pid(i), &self.cluster.data_dir(i));
            }
        }
        for (i, u) in nodes.iter().enumerate() {
            let Some(u) = u else { continue };
            let over = report::over_bounds(u);
            if !over.is_empty() && !self.over_reported[i] {
                self.over_reported[i] = true;
                self.ctx
                    .violation(format!("{} over its bounds: {}", IDS[i], over.join(", ")));
            }
        }
        self.samples.push(Sample {
            at: self.ctx.elapsed(),
            nodes,
        });
        self.ctx.check_streams();
    }

    /// Waits `d`, ticking.
    fn wait(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.tick();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    /// Waits until every node answers `/healthz` 200 and all report the
    /// same leader in the same term; how long that took, or `None` past
    /// `within`.
    fn await_recovered(&mut self, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < within {
            self.tick();
            let healthy = (0..3).all(|i| {
                matches!(
                    try_http_get(&self.cluster.http[i], "/healthz"),
                    Ok((200, _))
                )
            });
            if healthy && self.agreed_leader() {
                return Some(start.elapsed());
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn agreed_leader(&self) -> bool {
        let views: Vec<Option<(String, u64)>> = (0..3)
            .map(|i| {
                let s: Value = self.cluster.status(i).ok()?;
                Some((s["leader"].as_str()?.to_string(), s["term"].as_u64()?))
            })
            .collect();
        views[0].is_some() && views.iter().all(|v| *v == views[0])
    }

    /// Injects one fault on `node` and waits for the cluster to be
    /// healthy again.
    fn fault(
        &mut self,
        rng: &mut Rng,
        node: usize,
        kind: Kind,
        recovery_max: Duration,
    ) -> FaultRecord {
        let at = self.ctx.elapsed();
        self.ctx.faults.begin(node);
        let out = Instant::now();
        match kind {
            Kind::Kill => {
                self.cluster.kill(node);
                let down = rng.millis(DOWN_MIN, DOWN_MAX);
                self.wait(down);
            }
            Kind::Freeze => {
                self.cluster.pause(node);
                let frozen = rng.millis(FROZEN_MIN, FROZEN_MAX);
                self.wait(frozen);
            }
            Kind::Restart => {
                if !self.cluster.terminate(node, TERM_WAIT) {
                    self.ctx.violation(format!(
                        "{} did not exit within {TERM_WAIT:?} of SIGTERM (killed)",
                        IDS[node]
                    ));
                }
            }
        }
        let out_for = out.elapsed();
        let back = Instant::now();
        match kind {
            Kind::Freeze => self.cluster.resume(node),
            Kind::Kill | Kind::Restart => self.cluster.restart(node),
        }
        let recovered = self.await_recovered(recovery_max);
        let recovery = recovered.map(|_| back.elapsed());
        self.ctx.faults.end(node);
        if recovery.is_none() {
            self.ctx.violation(format!(
                "after {} of {}: the cluster was not healthy (/healthz 200, one leader) within {recovery_max:?}",
                kind.name(),
                IDS[node]
            ));
        } else if let Some(r) = recovery.filter(|r| *r > recovery_max) {
            self.ctx.violation(format!(
                "after {} of {}: back to healthy in {r:?}, over the bound {recovery_max:?}",
                kind.name(),
                IDS[node]
            ));
        }
        FaultRecord {
            at,
            node,
            kind,
            out_for,
            recovery,
        }
    }
}

/// Creates the R1 streams (each on its owner) with their pull consumers.
fn create_streams(cluster: &Cluster, specs: &[StreamSpec]) {
    for s in specs {
        let c = cluster.client(s.owner);
        let mut cfg = StreamConfig::new(&s.name, &[&s.subject]);
        cfg.max_bytes = Some(STREAM_MAX_BYTES);
        c.stream_create(&cfg)
            .unwrap_or_else(|e| panic!("stream.create {}: {e}", s.name));
        let mut cc = ConsumerConfig::new("soak");
        cc.ack_wait_ms = Some(load::ACK_WAIT.as_millis() as u64);
        c.consumer_create(&s.name, &cc)
            .unwrap_or_else(|e| panic!("consumer.create {}: {e}", s.name));
        let _ = c.close();
    }
}

/// Waits (bounded) until every listener has subscribed and a request
/// sent on each node finds the queue group: the subscriptions are applied
/// everywhere before the load starts.
fn await_listeners(cluster: &Cluster, ctx: &Ctx) {
    let deadline = Instant::now() + SETTLE_MAX;
    while ctx.listening() < load::LISTENERS {
        assert!(
            Instant::now() < deadline,
            "only {} of {} listeners subscribed within {SETTLE_MAX:?}",
            ctx.listening(),
            load::LISTENERS
        );
        thread::sleep(Duration::from_millis(20));
    }
    for (i, name) in IDS.iter().enumerate() {
        let c = cluster.client(i);
        loop {
            let id = ctx.request_id();
            let answer = c.request(
                "soak.svc.probe",
                serde_json::json!({ "id": id }),
                SETTLE_MAX,
            );
            if answer.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no answer from the queue group on {name} within {SETTLE_MAX:?}: {answer:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let _ = c.close();
    }
}

struct Outcome {
    violations: u64,
    summary: String,
}

fn run(cfg: &Config) -> Outcome {
    let cluster = Cluster::start();
    let streams: Vec<StreamSpec> = (0..3).map(StreamSpec::r1).collect();
    create_streams(&cluster, &streams);
    let ctx = Arc::new(Ctx::new(cluster.http.clone(), streams));
    let mut workers = load::spawn_listeners(&ctx);
    await_listeners(&cluster, &ctx);
    workers.extend(load::spawn_sources(&ctx, cfg.seed));
    let mut soak = Soak {
        cluster,
        ctx: Arc::clone(&ctx),
        samples: Vec::new(),
        over_reported: [false; 3],
        next_tick: Instant::now(),
    };
    let mut rng = Rng::new(cfg.seed);
    let mut faults = Vec::new();
    let end = Instant::now() + cfg.duration;
    loop {
        let healthy = rng.millis(HEALTHY_MIN, HEALTHY_MAX);
        // The last fault needs room to recover before the load stops.
        if Instant::now() + healthy + FROZEN_MAX + cfg.recovery_max > end {
            break;
        }
        soak.wait(healthy);
        let node = rng.range(0, 2) as usize;
        let kind = [Kind::Kill, Kind::Freeze, Kind::Restart][rng.range(0, 2) as usize];
        let record = soak.fault(&mut rng, node, kind, cfg.recovery_max);
        let stuck = record.recovery.is_none();
        faults.push(record);
        if stuck {
            break;
        }
    }
    soak.wait(end.saturating_duration_since(Instant::now()));

    // Drain: publishers stop; every acked stream message must arrive.
    ctx.publishing.store(false, Ordering::Relaxed);
    let drain = Instant::now();
    let mut missing = ctx.undelivered();
    while missing.iter().any(|(_, m)| !m.is_empty()) && drain.elapsed() < DRAIN_MAX {
        soak.wait(Duration::from_millis(200));
        missing = ctx.undelivered();
    }
    for (name, seqs) in &missing {
        if !seqs.is_empty() {
            ctx.violation(format!(
                "{name}: {} acked messages never delivered within {DRAIN_MAX:?} of the drain \
                 (first seqs {:?})",
                seqs.len(),
                &seqs[..seqs.len().min(10)]
            ));
        }
    }
    soak.tick();
    ctx.running.store(false, Ordering::Relaxed);
    for w in workers {
        if w.join().is_err() {
            ctx.violation("a load worker panicked".into());
        }
    }
    // The load must have happened for the checks to mean anything.
    for what in [
        "core messages checked",
        "requests answered",
        "stream messages checked",
        "short-lived clients",
    ] {
        if ctx.counters.get(what) == 0 {
            ctx.violation(format!("no {what}: the load made no progress"));
        }
    }

    let counters = ctx.counters.snapshot();
    let violations = ctx.violations();
    let ran = ctx.elapsed();
    let replay = cfg.replay();
    let r = report::Report {
        seed: cfg.seed,
        planned: cfg.duration,
        ran,
        recovery_max: cfg.recovery_max,
        faults: &faults,
        counters: &counters,
        samples: &soak.samples,
        violations: &violations,
        violation_count: ctx.violation_count(),
        replay: &replay,
    };
    let mut md = report::markdown(&r);
    if ctx.violation_count() > 0 {
        md.push_str("\n## Node logs (last lines)\n\n```text\n");
        md.push_str(&soak.cluster.all_logs());
        md.push_str("\n```\n");
    }
    let written = std::fs::create_dir_all(&cfg.report_dir)
        .and_then(|()| std::fs::write(cfg.report_dir.join("report.md"), &md))
        .and_then(|()| {
            std::fs::write(
                cfg.report_dir.join("memory.svg"),
                report::memory_svg(&soak.samples, ran),
            )
        });
    let checked = |k: &str| ctx.counters.get(k);
    let worst = report::worst_recovery(&faults).unwrap_or_default();
    let mut summary = format!(
        "soak: seed {} ran {:.0} s: {} faults (worst recovery {:.1} s), {} core messages, \
         {} requests, {} stream messages checked, {} violations",
        cfg.seed,
        ran.as_secs_f64(),
        faults.len(),
        worst.as_secs_f64(),
        checked("core messages checked"),
        checked("requests answered"),
        checked("stream messages checked"),
        ctx.violation_count()
    );
    match written {
        Ok(()) => summary.push_str(&format!(
            "\nsoak: report {}",
            cfg.report_dir.join("report.md").display()
        )),
        Err(e) => summary.push_str(&format!(
            "\nsoak: cannot write the report to {}: {e}\n{md}",
            cfg.report_dir.display()
        )),
    }
    Outcome {
        violations: ctx.violation_count(),
        summary,
    }
}

#[test]
fn chaos_soak() {
    let cfg = Config::from_env();
    eprintln!(
        "soak: seed {} for {:?}; replay with `{}`",
        cfg.seed,
        cfg.duration,
        cfg.replay()
    );
    let outcome = run(&cfg);
    eprintln!("{}", outcome.summary);
    assert_eq!(
        outcome.violations,
        0,
        "the soak found {} violations (see the report); replay with `{}`",
        outcome.violations,
        cfg.replay()
    );
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("45s"), Some(Duration::from_secs(45)));
    assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
    assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_duration("5x"), None);
    assert_eq!(parse_duration("m"), None);
}
