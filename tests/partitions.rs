//! Network partitions under a replicated stream, on a real network: three
//! nodes in network namespaces (tests/netns_support), an R3 stream, and a
//! publisher on every node's own namespace keeping several publishes in
//! flight while a seeded schedule cuts the stream's leader off from its
//! peers (its own publisher keeps publishing to it), heals it, drops the
//! packets of the new leader to one follower one way, loses packets on
//! one node's link and slows it (netem delay, or a rate limit where the
//! kernel has no netem), and cuts the leader three times more, shortly, so that
//! a deposed leader still has proposals in flight when it hears of the
//! new leader's entries. Afterwards each
//! node in turn is made the group's leader and its replica read whole;
//! the history checker (tests/netns_support/history.rs) holds every
//! publisher's history against every replica. Skips (passing, with a
//! message) where network namespaces cannot be made.
//!
//! `PARTITION_SEED=N` replays a seed; the default is fixed.
//! `PARTITION_DURATION=30m` (`make soak` sets it) goes on after the fixed
//! schedule with faults drawn from the seed (leader and control-leader
//! cuts, cuts of any node, one-way drops either way, lossy and slow links
//! on one or every node, short leader cuts, a flapping link, a follower
//! killed and its replica's payload files damaged (a bit flipped or a
//! file cut short) before it restarts, a node added and removed again,
//! while the stream's or the control group's leader is cut off or not)
//! until the time is up; the checks are the same.

mod cluster_support;
mod netns_support;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cluster_support::{call_until, IDS};
use gombus::client::{Client, Error, Options, OutMessage, Payload};
use gombus::rand::SplitMix64;
use netns_support::history::{self, Cut, History, Op, Outcome, Replica};
use netns_support::NetCluster;
use serde_json::json;

const STREAM: &str = "PART";
/// The seed when `PARTITION_SEED` is not set.
const DEFAULT_SEED: u64 = 26;
/// Publishes each publisher keeps in flight.
const IN_FLIGHT: usize = 8;
/// Pause between two publishes of one publisher (a load, not a wait).
const PACE: Duration = Duration::from_millis(10);
/// How long a publisher waits for one ack; past the server's own bound
/// (4.5 s) so that its answer is seen.
const ACK_WAIT: Duration = Duration::from_secs(8);
/// How long a new group may take to be placed and elect its leader, and
/// how long an election after a cut may take.
const ELECT_WAIT: Duration = Duration::from_secs(20);
/// The contract's bound for serving again after a heal.
const SERVE_BOUND: Duration = Duration::from_secs(5);
/// What a host shared with other builds may add to the contract's bound
/// (as in tests/stream_replica_faults.rs).
const HOST_SLACK: Duration = Duration::from_secs(3);
/// How long after a heal (or after it is asked, without a cut) a node's
/// add may take to be answered `{ok}`, asked again after `unavailable`:
/// the new node is running and its log is short, so only a change lost
/// with a deposed leader and answered at the contract's 60 s bound
/// comes near it.
const CHANGE_BOUND: Duration = Duration::from_secs(20);

/// A publisher's shared view: the send time (µs after `epoch`) of the
/// latest publish it was acked for.
struct Pub {
    epoch: Instant,
    acked_sent_us: AtomicU64,
}

impl Pub {
    /// Waits until a publish sent after `after` is acked; how long after
    /// `after` that was (None: not within `within`).
    fn await_served(&self, after: Instant, within: Duration) -> Option<Duration> {
        let since = after.saturating_duration_since(self.epoch).as_micros() as u64;
        while self.acked_sent_us.load(Ordering::Relaxed) <= since {
            if after.elapsed() >= within {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
        Some(after.elapsed())
    }
}

/// Publishes `{"p": p, "k": k}` for k = 1, 2, … through node `node`
/// (the thread runs in its namespace) with up to [`IN_FLIGHT`] acks
/// awaited, until `stop`; then waits for what is in flight and returns its
/// history.
fn publisher(addr: String, p: u64, node: usize, stop: Arc<AtomicBool>, seen: Arc<Pub>) -> History {
    let connect = || {
        let opts = Options {
            timeout: ACK_WAIT,
            ..Default::default()
        };
        let deadline = Instant::now() + ELECT_WAIT;
        loop {
            match Client::connect_with(&addr, opts.clone()) {
                Ok(c) => return c,
                Err(e) => assert!(Instant::now() < deadline, "p{p} cannot connect: {e}"),
            }
            thread::sleep(Duration::from_millis(50));
        }
    };
    let mut client = connect();
    let subject = format!("part.{p}");
    let mut ops = Vec::new();
    let mut flight: VecDeque<(u64, Instant, gombus::client::PendingAck)> = VecDeque::new();
    let mut k = 0;
    let settle = |ops: &mut Vec<Op>, k, sent: Instant, r: Result<serde_json::Value, Error>| {
        let outcome = match r {
            Ok(v) => match v["seq"].as_u64() {
                Some(seq) => {
                    let us = sent.saturating_duration_since(seen.epoch).as_micros() as u64;
                    seen.acked_sent_us.fetch_max(us, Ordering::Relaxed);
                    Outcome::Acked(seq)
                }
                None => Outcome::Unknown(format!("ack without seq: {v}")),
            },
            Err(Error::Server { code, .. }) => Outcome::Refused(code),
            Err(Error::Timeout) => Outcome::Unanswered,
            Err(e) => Outcome::Unknown(format!("{e:?}")),
        };
        ops.push(Op {
            k,
            sent,
            done: Instant::now(),
            outcome,
        });
    };
    loop {
        let stopping = stop.load(Ordering::Acquire);
        if !stopping && flight.len() < IN_FLIGHT {
            k += 1;
            let msg = OutMessage::new(&subject, Payload::Json(json!({"p": p, "k": k})));
            let sent = Instant::now();
            match client.publish_async(&msg) {
                Ok(pending) => flight.push_back((k, sent, pending)),
                Err(e) => {
                    let closed = matches!(e, Error::Closed);
                    settle(&mut ops, k, sent, Err(e));
                    if closed {
                        // Answers of what was in flight on it are lost too.
                        for (k, sent, pending) in flight.drain(..) {
                            settle(&mut ops, k, sent, pending.wait_timeout(Duration::ZERO));
                        }
                        client = connect();
                    }
                }
            }
            thread::sleep(PACE);
            continue;
        }
        if flight.is_empty() {
            break;
        }
        // Each answer is taken when it comes (so its time is right),
        // whatever order the answers come in; one not here after
        // ACK_WAIT is given up.
        let mut any = false;
        let mut i = 0;
        while i < flight.len() {
            let late = flight[i].1.elapsed() >= ACK_WAIT;
            if flight[i].2.is_ready() || late {
                let (k, sent, pending) = flight.remove(i).expect("in range");
                settle(&mut ops, k, sent, pending.wait_timeout(Duration::ZERO));
                any = true;
            } else {
                i += 1;
            }
        }
        if !any {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let _ = client.close();
    ops.sort_by_key(|o| o.k);
    History { p, node, ops }
}

/// Reads the whole stream through node `leader`, which leads the group
/// (so what it answers is its own replica): (seq, (p, k)) in order.
fn read_replica(nc: &NetCluster, leader: usize, consumer: &str) -> Vec<(u64, (u64, u64))> {
    nc.on(leader, |c| {
        let opts = Options {
            timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let cl = Client::connect_with(&c.http[leader], opts).expect("connect to read");
        let info = call_until(&cl, "stream.info", json!({"name": STREAM}), ELECT_WAIT);
        let last = info["stream"]["state"]["last_seq"]
            .as_u64()
            .expect("last_seq");
        call_until(
            &cl,
            "consumer.create",
            json!({"stream": STREAM, "name": consumer, "ack_policy": "none"}),
            ELECT_WAIT,
        );
        let mut out = Vec::new();
        let mut at = 0;
        // A bound on each step, not on the whole read: a long stream read
        // on a busy host takes as long as it takes while batches come.
        let mut deadline = Instant::now() + ELECT_WAIT;
        while at < last {
            let batch = match cl.fetch(STREAM, consumer, 512, None) {
                Ok(b) => b,
                Err(e) => {
                    assert!(Instant::now() < deadline, "reading {}: {e}", IDS[leader]);
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            assert!(
                !batch.is_empty(),
                "fetch on {} ended at seq {at} of {last}",
                IDS[leader]
            );
            for m in batch {
                at = m.seq;
                let p = m.data["p"].as_u64().unwrap_or(u64::MAX);
                let k = m.data["k"].as_u64().unwrap_or(0);
                out.push((m.seq, (p, k)));
            }
            deadline = Instant::now() + ELECT_WAIT;
        }
        let _ = cl.close();
        out
    })
}

/// The fault windows of a run and what was measured across them.
struct Faults {
    t0: Instant,
    seen: Vec<Arc<Pub>>,
    faults: Vec<(Instant, Instant, String)>,
    cuts: Vec<Cut>,
    /// Per cut, how long the majority side took to ack a publish sent
    /// after the cut began (None: not while the cut lasted).
    failovers: Vec<Option<Duration>>,
    /// Replicas damaged while their node was down.
    corruptions: usize,
    /// Nodes added and removed: id, how long the add and the removal
    /// took to be answered `{ok}`.
    memberships: Vec<(String, Duration, Duration)>,
    /// Adds that took longer than [`CHANGE_BOUND`] after their cut.
    slow_changes: Vec<String>,
}

/// Waits (bounded) until node `at`'s `cluster.status` lists `name` as a
/// voter (`voter`), or does not list it (not `voter`).
fn await_voter(nc: &NetCluster, at: usize, name: &str, voter: bool) {
    let deadline = Instant::now() + ELECT_WAIT;
    loop {
        let s = nc.on(at, |c| c.status(at)).unwrap_or_default();
        let listed = s["peers"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["id"] == json!(name))
                .map(|p| p["voter"] == json!(true))
        });
        if listed == voter.then_some(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} lists {name} as {listed:?} (voter: Some(true), gone: None), not {}",
            IDS[at],
            if voter { "a voter" } else { "gone" }
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Asks membership change `event` of node `at` until it is answered
/// `{ok}`, or refused with a `bad_request` whose message has `done` (the
/// change was made by an earlier try); `unavailable` (no leader, another
/// change under way) is asked again. How long it took.
fn change(
    nc: &NetCluster,
    at: usize,
    event: &str,
    args: serde_json::Value,
    done: &str,
) -> Duration {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    loop {
        let r = nc.on(at, |c| {
            let cl = c.control_with_timeout(at, Duration::from_secs(70));
            let r = cl.call(event, args.clone());
            let _ = cl.close();
            r
        });
        match r {
            Ok(_) => return start.elapsed(),
            Err(Error::Server { code, message, .. })
                if code == "bad_request" && message.contains(done) =>
            {
                return start.elapsed();
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "{event} {args} on {} not done in {:?}: {e}",
                    IDS[at],
                    start.elapsed()
                );
                thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Damages one payload file of the replicas under node data directory
/// `data` as `rng` picks: one bit flipped, or the file cut short; says
/// what it did.
fn damage_replica(data: &std::path::Path, rng: &mut SplitMix64) -> String {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(data.join("replicas"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|g| std::fs::read_dir(g.path()).ok())
        .flat_map(|fs| fs.flatten().map(|f| f.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return "no payload file to damage".into();
    }
    let f = &files[rng.below(files.len())];
    let name = f.file_name().unwrap_or_default().to_string_lossy();
    let len = std::fs::metadata(f).map_or(0, |m| m.len());
    if len == 0 {
        return format!("{name} empty, left as it is");
    }
    let at = rng.below(len as usize) as u64;
    if rng.below(2) == 0 {
        let mut bytes = std::fs::read(f).expect("read a payload file");
        let bit = rng.below(8);
        bytes[at as usize] ^= 1 << bit;
        std::fs::write(f, &bytes).expect("write a payload file");
        format!("bit {bit} of byte {at} of {len} flipped in {name}")
    } else {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .expect("open a payload file");
        file.set_len(at).expect("cut a payload file");
        format!("{name} cut from {len} to {at} bytes")
    }
}

impl Faults {
    /// Cuts node `l` off from its peers for `hold` (its own publisher goes
    /// on publishing to it), then heals it and waits until every node's
    /// publisher is acked again.
    fn cut_leader(&mut self, nc: &mut NetCluster, l: usize, hold: Duration, what: &str) {
        let other = (l + 1) % 3;
        eprintln!(
            "partitions: {:.1}s cut {} ({what}) for {hold:?}",
            self.t0.elapsed().as_secs_f64(),
            IDS[l]
        );
        nc.net.cut(l);
        let start = Instant::now();
        // The majority side acks again (measured while the cut lasts).
        self.failovers
            .push(self.seen[other].await_served(start, hold));
        thread::sleep(hold.saturating_sub(start.elapsed()));
        let end = Instant::now();
        nc.net.heal(l);
        self.faults.push((start, end, format!("{} cut", IDS[l])));
        self.cuts.push(Cut {
            node: l,
            start,
            end,
        });
        self.settle(end);
    }

    /// Waits (bounded, not checked here) until every node's publisher is
    /// acked for a publish sent after `after`.
    fn settle(&self, after: Instant) {
        for s in &self.seen {
            s.await_served(after, ELECT_WAIT);
        }
    }

    /// Drops node `from`'s packets to node `to` for `hold`.
    fn one_way(&mut self, nc: &mut NetCluster, from: usize, to: usize, hold: Duration) {
        eprintln!(
            "partitions: {:.1}s drop {} -> {} for {hold:?}",
            self.t0.elapsed().as_secs_f64(),
            IDS[from],
            IDS[to]
        );
        nc.net.drop_one_way(from, to);
        let start = Instant::now();
        thread::sleep(hold);
        nc.net.clear(from);
        let end = Instant::now();
        self.faults
            .push((start, end, format!("{}->{} dropped", IDS[from], IDS[to])));
        self.settle(end);
    }

    /// Makes the links of `nodes` lossy and slow for `hold`.
    fn lossy(
        &mut self,
        nc: &mut NetCluster,
        nodes: &[usize],
        loss: u32,
        delay: u32,
        hold: Duration,
    ) {
        let mut applied = String::new();
        for &i in nodes {
            applied = nc.net.impair(i, loss, delay, delay / 2, 256);
        }
        let names: Vec<&str> = nodes.iter().map(|&i| IDS[i]).collect();
        eprintln!(
            "partitions: {:.1}s links of {names:?}: {applied}, for {hold:?}",
            self.t0.elapsed().as_secs_f64(),
        );
        let start = Instant::now();
        thread::sleep(hold);
        for &i in nodes {
            nc.net.clear(i);
        }
        let end = Instant::now();
        self.faults.push((start, end, format!("{names:?} lossy")));
        self.settle(end);
    }

    /// Kills node `i`, damages its replica's payload files while it is
    /// down (one bit flipped, or a file cut short, where `rng` says: the
    /// file-corruption faults of Jepsen's NATS analysis), and starts it
    /// again: it must heal from the others and lose nothing (the checks at
    /// the end read its replica whole), and every node serves again.
    fn corrupt(&mut self, nc: &mut NetCluster, i: usize, rng: &mut SplitMix64) {
        nc.c.kill(i);
        let start = Instant::now();
        let what = damage_replica(&nc.c.data_dir(i), rng);
        eprintln!(
            "partitions: {:.1}s {} killed, {what}, restarted",
            self.t0.elapsed().as_secs_f64(),
            IDS[i]
        );
        nc.c.restart(i);
        let end = Instant::now();
        self.faults
            .push((start, end, format!("{} down, {what}", IDS[i])));
        self.corruptions += 1;
        self.settle(end);
    }

    /// Adds a node (a new id each time, started in the spare namespace)
    /// and removes it again; when `cut` says so, node `cut.0` is cut off
    /// for `cut.1` from when the add is asked (healed on time, however
    /// long the add takes): membership changes under a partition. The
    /// stream's replicas stay where they are.
    fn membership(&mut self, nc: &mut NetCluster, cut: Option<(usize, Duration)>) {
        let name = format!("n{}", 4 + self.memberships.len());
        let via = (0..3)
            .find(|&i| Some(i) != cut.map(|c| c.0))
            .expect("a node");
        eprintln!(
            "partitions: {:.1}s {name} added through {} and removed{}",
            self.t0.elapsed().as_secs_f64(),
            IDS[via],
            cut.map_or(String::new(), |(i, hold)| format!(
                ", {} cut for {hold:?} meanwhile",
                IDS[i]
            ))
        );
        let start = Instant::now();
        let joined = nc.join(&name, via);
        let nc: &NetCluster = nc;
        let (added, window) = thread::scope(|s| {
            let args = joined.add_args();
            let adding = s.spawn(move || change(nc, via, "cluster.add", args, "a member already"));
            let window = cut.map(|(i, hold)| {
                nc.net.cut(i);
                let start = Instant::now();
                thread::sleep(hold);
                let end = Instant::now();
                nc.net.heal(i);
                (i, start, end)
            });
            let added = adding
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (added, window)
        });
        if let Some((i, start, end)) = window {
            self.cuts.push(Cut {
                node: i,
                start,
                end,
            });
            self.faults.push((start, end, format!("{} cut", IDS[i])));
        }
        await_voter(nc, via, &name, true);
        let removed = change(
            nc,
            via,
            "cluster.remove",
            json!({"id": name}),
            "not a member",
        );
        await_voter(nc, via, &name, false);
        drop(joined);
        let end = Instant::now();
        self.faults
            .push((start, end, format!("{name} added and removed")));
        let bound = cut.map_or(Duration::ZERO, |c| c.1) + CHANGE_BOUND;
        if added > bound {
            self.slow_changes.push(format!(
                "adding {name} through {} took {added:?} (bound {bound:?}){}",
                IDS[via],
                cut.map_or(String::new(), |(i, hold)| format!(
                    ", {} cut for {hold:?} from when it was asked",
                    IDS[i]
                ))
            ));
        }
        self.memberships.push((name, added, removed));
        self.settle(end);
    }

    /// Takes node `i`'s link down and up `times` times (each down
    /// `down`, up `up`), then waits until every node serves again.
    fn flap(&mut self, nc: &mut NetCluster, i: usize, times: u32, down: Duration, up: Duration) {
        eprintln!(
            "partitions: {:.1}s flap {}'s link {times} times ({down:?} down, {up:?} up)",
            self.t0.elapsed().as_secs_f64(),
            IDS[i]
        );
        for _ in 0..times {
            nc.net.cut(i);
            let start = Instant::now();
            thread::sleep(down);
            let end = Instant::now();
            nc.net.heal(i);
            self.faults.push((start, end, format!("{} flap", IDS[i])));
            thread::sleep(up);
        }
        self.settle(Instant::now());
    }
}

/// After the fixed schedule, a longer run (`PARTITION_DURATION`, e.g.
/// `30m`, as `make soak` sets it) goes on with faults drawn from `rng`
/// until `until`.
fn random_faults(nc: &mut NetCluster, log: &mut Faults, rng: &mut SplitMix64, until: Instant) {
    let ms = |rng: &mut SplitMix64, lo: u64, hi: u64| {
        Duration::from_millis(lo + rng.below((hi - lo + 1) as usize) as u64)
    };
    while Instant::now() < until {
        let leader = nc.agreed_stream_leader(&[0, 1, 2], STREAM, ELECT_WAIT);
        let leader = leader.unwrap_or_else(|| rng.below(3));
        match rng.below(9) {
            0 => {
                let hold = ms(rng, 3000, 9000);
                log.cut_leader(nc, leader, hold, "the stream's leader");
            }
            1 => {
                let l = nc.control_leader(rng.below(3)).unwrap_or(leader);
                let hold = ms(rng, 3000, 9000);
                log.cut_leader(nc, l, hold, "the control group's leader");
            }
            2 => {
                let hold = ms(rng, 1000, 9000);
                log.cut_leader(nc, rng.below(3), hold, "a node");
            }
            3 => {
                let other = (leader + 1 + rng.below(2)) % 3;
                let (from, to) = if rng.below(2) == 0 {
                    (leader, other)
                } else {
                    (other, leader)
                };
                let hold = ms(rng, 2000, 8000);
                log.one_way(nc, from, to, hold);
            }
            4 => {
                let nodes: Vec<usize> = if rng.below(2) == 0 {
                    vec![rng.below(3)]
                } else {
                    vec![0, 1, 2]
                };
                let loss = 5 + rng.below(26) as u32;
                let delay = 20 + rng.below(181) as u32;
                let hold = ms(rng, 5000, 15000);
                log.lossy(nc, &nodes, loss, delay, hold);
            }
            5 => {
                let hold = ms(rng, 1000, 1500);
                log.cut_leader(nc, leader, hold, "the stream's leader, short");
            }
            6 => {
                // A minority node: a follower of the stream's group.
                let victim = (leader + 1 + rng.below(2)) % 3;
                log.corrupt(nc, victim, rng);
            }
            7 => {
                let cut = match rng.below(3) {
                    0 => None,
                    1 => Some(leader),
                    _ => Some(nc.control_leader(rng.below(3)).unwrap_or(leader)),
                };
                let cut = cut.map(|i| (i, ms(rng, 1000, 6000)));
                log.membership(nc, cut);
            }
            _ => {
                let times = 3 + rng.below(4) as u32;
                let down = ms(rng, 200, 800);
                let up = ms(rng, 300, 1000);
                log.flap(nc, leader, times, down, up);
            }
        }
        // A quiet spell between faults.
        thread::sleep(ms(rng, 1000, 3000));
    }
}

/// `90s`, `30m`, `2h` or plain seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

#[test]
fn acked_publishes_survive_leader_cuts_one_way_drops_and_lossy_links() {
    let duration = std::env::var("PARTITION_DURATION")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| parse_duration(&s).unwrap_or_else(|| panic!("PARTITION_DURATION {s:?}")));
    // A fixed seed in `make test`; a fresh one for a longer run unless
    // one is given.
    let seed = std::env::var("PARTITION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            if duration.is_some() {
                gombus::rand::random_seed()
            } else {
                DEFAULT_SEED
            }
        });
    let mut nc = match NetCluster::start() {
        Ok(nc) => nc,
        Err(why) => {
            eprintln!("SKIPPED partitions: {why}");
            return;
        }
    };
    let replay = format!(
        "PARTITION_SEED={seed}{}",
        duration.map_or(String::new(), |d| format!(
            " PARTITION_DURATION={}s",
            d.as_secs()
        ))
    );
    eprintln!("partitions: seed {seed} for {duration:?} (replay: {replay})");
    let mut rng = SplitMix64(seed);
    let t0 = Instant::now();
    for i in 0..3 {
        nc.await_healthy(i, ELECT_WAIT);
    }
    nc.on(0, |c| {
        call_until(
            &c.client(0),
            "stream.create",
            json!({"name": STREAM, "subjects": ["part.>"], "replicas": 3}),
            ELECT_WAIT,
        )
    });
    let leader = nc
        .agreed_stream_leader(&[0, 1, 2], STREAM, ELECT_WAIT)
        .expect("no leader of the stream's group");

    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Arc<Pub>> = (0..3)
        .map(|_| {
            Arc::new(Pub {
                epoch: t0,
                acked_sent_us: AtomicU64::new(0),
            })
        })
        .collect();
    let pubs: Vec<_> = (0..3)
        .map(|i| {
            let (addr, stop, seen) = (nc.c.http[i].clone(), stop.clone(), seen[i].clone());
            nc.spawn_on(i, move || publisher(addr, i as u64 + 1, i, stop, seen))
        })
        .collect();
    for s in &seen {
        assert!(
            s.await_served(t0, ELECT_WAIT).is_some(),
            "a publisher got no ack before any fault"
        );
    }
    // Some load before the first fault.
    thread::sleep(Duration::from_secs(2));

    let mut log = Faults {
        t0,
        seen: seen.clone(),
        faults: Vec::new(),
        cuts: Vec::new(),
        failovers: Vec::new(),
        corruptions: 0,
        memberships: Vec::new(),
        slow_changes: Vec::new(),
    };

    // 1. The stream's leader cut off from its peers; its publisher goes on.
    let hold = Duration::from_millis(6000 + rng.below(3000) as u64);
    log.cut_leader(&mut nc, leader, hold, "the stream's leader");

    // 2. The new leader's packets to one follower dropped, one way.
    let l2 = nc
        .agreed_stream_leader(&[0, 1, 2], STREAM, ELECT_WAIT)
        .expect("no leader after the heal");
    let followers: Vec<usize> = (0..3).filter(|&i| i != l2).collect();
    let to = followers[rng.below(2)];
    let hold = Duration::from_millis(3000 + rng.below(2000) as u64);
    log.one_way(&mut nc, l2, to, hold);

    // 3. A lossy, slow link.
    let lossy = rng.below(3);
    let loss = 5 + rng.below(11) as u32;
    let delay = 20 + rng.below(61) as u32;
    let hold = Duration::from_millis(6000 + rng.below(2000) as u64);
    log.lossy(&mut nc, &[lossy], loss, delay, hold);

    // 4. The leader cut three times more, each time for well under the
    // server's 4.5 s bound on a proposal and more than an election takes
    // (400-800 ms), so that its proposals are still in flight when the
    // new leader's entries reach it.
    for round in 0..3 {
        let l = nc
            .agreed_stream_leader(&[0, 1, 2], STREAM, ELECT_WAIT)
            .expect("no leader before a short cut");
        let hold = Duration::from_millis(1000 + rng.below(500) as u64);
        let what = format!("the stream's leader, short cut {}", round + 1);
        log.cut_leader(&mut nc, l, hold, &what);
    }

    if let Some(d) = duration {
        random_faults(&mut nc, &mut log, &mut rng, t0 + d);
    }

    stop.store(true, Ordering::Release);
    let histories: Vec<History> = pubs
        .into_iter()
        .map(|h| h.join().expect("a publisher panicked"))
        .collect();
    let run = t0.elapsed();

    // Every node's replica, read while it leads the group: the leader is
    // read, then cut off so another is elected, until all three are read.
    let mut replicas: Vec<Replica> = Vec::new();
    for round in 0..12 {
        let l = nc
            .agreed_stream_leader(&[0, 1, 2], STREAM, ELECT_WAIT)
            .expect("no leader to read through");
        if !replicas.iter().any(|r| r.node == l) {
            let msgs = read_replica(&nc, l, &format!("check{round}"));
            replicas.push(Replica { node: l, msgs });
        }
        if replicas.len() == 3 {
            break;
        }
        nc.net.cut(l);
        let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
        if let Some(n) = nc.agreed_stream_leader(&others, STREAM, ELECT_WAIT) {
            if !replicas.iter().any(|r| r.node == n) {
                let msgs = read_replica(&nc, n, &format!("check{round}b"));
                replicas.push(Replica { node: n, msgs });
            }
        }
        nc.net.heal(l);
        if replicas.len() == 3 {
            break;
        }
    }

    let (violations, sum) =
        history::check(&histories, &replicas, &log.cuts, SERVE_BOUND + HOST_SLACK);
    eprintln!(
        "partitions: seed {seed}, faults for {:.1}s, {} published, {} acked, {} refused, \
         {} without an answer (connection lost or none came); replicas read: {:?}",
        run.as_secs_f64(),
        sum.published,
        sum.acked,
        sum.refused,
        sum.unknown,
        replicas
            .iter()
            .map(|r| (IDS[r.node], r.msgs.len()))
            .collect::<Vec<_>>()
    );
    eprintln!(
        "partitions: failover (first ack on the majority side after a cut): {:?}; \
         {} fault windows, {} cuts, {} replicas damaged while down; nodes added and \
         removed (time to {{ok}} of each): {:?}",
        log.failovers,
        log.faults.len(),
        log.cuts.len(),
        log.corruptions,
        log.memberships
    );
    for (node, per) in &sum.recoveries {
        eprintln!(
            "partitions: after {} healed, first ack per node: {:?}",
            IDS[*node], per
        );
    }
    assert!(
        violations.is_empty(),
        "seed {seed} (replay: {replay}):\n{}",
        history::report(&violations, &histories, &log.faults, t0, 20)
    );
    assert_eq!(replicas.len(), 3, "not every replica could be read");
    assert!(
        log.slow_changes.is_empty(),
        "seed {seed} (replay: {replay}): membership changes answered late:\n{}",
        log.slow_changes.join("\n")
    );
}
