//! Deterministic simulation of 3- and 5-node Raft clusters under faults
//! (see tests/raft_harness). `SIM_SEEDS` sets how many seeds run (default
//! 2000, split over four tests: 3 or 5 nodes, durable or memory log);
//! `make sim SEEDS=N` runs more in release. Half the seeds are leader
//! storms (split Appends, leaders crashing right after they append), which
//! reach Raft's Figure 8 case: with the rule that a leader commits only
//! entries of its own term by counting taken out, seeds of the 2000 fail.
//! A failure names its seed and the command that replays it.

mod raft_harness;

use raft_harness::{run_seed, Check};

/// The cluster shape a seed runs: its size and whether logs are in memory.
fn shape(seed: u64) -> (usize, bool) {
    match seed % 4 {
        0 => (3, false),
        1 => (3, true),
        2 => (5, false),
        _ => (5, true),
    }
}

fn seeds_total() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn run_one(seed: u64) -> Result<(), String> {
    let (n, memory) = shape(seed);
    catch(|| run_seed(seed, n, memory))
}

/// A run's result, a panic inside it turned into an error.
fn catch(run: impl FnOnce() -> Result<(), String> + std::panic::UnwindSafe) -> Result<(), String> {
    match std::panic::catch_unwind(run) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {msg}"))
        }
    }
}

fn run_group(group: u64) {
    let mut failures = Vec::new();
    let mut seed = group;
    while seed < seeds_total() {
        if let Err(e) = run_one(seed) {
            let (n, memory) = shape(seed);
            let log = if memory { "memory" } else { "durable" };
            failures.push(format!(
                "seed {seed} ({n} nodes, {log} log): {e}\n  replay: SIM_SEED={seed} cargo test --test raft_sim replay -- --ignored --nocapture"
            ));
        }
        seed += 4;
    }
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn sim_3_nodes_durable_log() {
    run_group(0);
}

#[test]
fn sim_3_nodes_memory_log() {
    run_group(1);
}

#[test]
fn sim_5_nodes_durable_log() {
    run_group(2);
}

#[test]
fn sim_5_nodes_memory_log() {
    run_group(3);
}

/// Seeds that once failed, run whatever `SIM_SEEDS` says. 20870: a
/// proposal forwarded during the chaos reached the leader after healing
/// and was acknowledged while the membership settled; the final check
/// must let every member apply it first. 34270, 62812, 68862, 73938,
/// 88206, 88482: a leader promoted a node that was close enough behind
/// but did not vote yet, and died; the others counted the new node's vote
/// and never got it, so no leader was elected after healing (a leader now
/// promotes only a node that said it may vote). They run without split
/// Appends and doomed leaders, as they did when they failed.
const REGRESSION_SEEDS: &[u64] = &[20870, 34270, 62812, 68862, 73938, 88206, 88482];

/// Seeds that failed with every fault on. 41604: a leader of a group
/// with one voter sent its Appends before storing them, with a commit
/// index that counted the entry it had not stored; it crashed before the
/// write, and the learner it had told applied an entry the next leader
/// lacked (an Append sent early now never names such a commit).
const REGRESSION_SEEDS_ALL_FAULTS: &[u64] = &[41604];

/// How a list of seeds is run: with or without split Appends and doomed
/// leaders.
type Runner = fn(u64, usize, bool) -> Check;

#[test]
fn sim_regression_seeds() {
    let lists: [(&[u64], Runner); 2] = [
        (REGRESSION_SEEDS, raft_harness::run_seed_unsplit),
        (REGRESSION_SEEDS_ALL_FAULTS, run_seed),
    ];
    for (seeds, run) in lists {
        for &seed in seeds {
            let (n, memory) = shape(seed);
            assert_eq!(
                catch(|| run(seed, n, memory)),
                Ok(()),
                "seed {seed} ({n} nodes, memory log: {memory})"
            );
        }
    }
}

/// Replays one seed: `SIM_SEED=N cargo test --test raft_sim replay -- --ignored --nocapture`.
#[test]
#[ignore]
fn replay() {
    let seed: u64 = std::env::var("SIM_SEED")
        .expect("set SIM_SEED")
        .parse()
        .expect("SIM_SEED is a number");
    let (n, memory) = shape(seed);
    println!("seed {seed}: {n} nodes, memory log: {memory}");
    let r = run_seed(seed, n, memory);
    assert_eq!(r, Ok(()), "seed {seed}");
}

/// Prints what the first 16 seeds' runs did (steps, commits, acks,
/// reads, leader changes), to see that the chaos is doing its job:
/// `cargo test --test raft_sim stats -- --ignored --nocapture`.
#[test]
#[ignore]
fn stats() {
    for seed in 0..16u64 {
        let (n, memory) = shape(seed);
        let (sim, r) = raft_harness::run(seed, n, memory);
        println!(
            "seed {seed} {r:?} steps {} committed {} acked {} reads {} leader changes {} last term {:?} \
             split appends {} doomed leaders {} (after sending, before storing {})",
            sim.steps,
            sim.committed.len(),
            sim.acked.len(),
            sim.reads_done,
            sim.leader_changes.len(),
            sim.leader_changes.last(),
            sim.splits,
            sim.dooms,
            sim.early_dooms
        );
        assert_eq!(r, Ok(()), "seed {seed}");
    }
}

fn percentile(v: &mut [u64], p: usize) -> u64 {
    v.sort_unstable();
    v[(v.len() - 1) * p / 100]
}

/// Election times with the default timeouts on a calm network (1-8 ms
/// delays): to the first leader, and from a leader's crash to the next
/// one. The p99 after a loss must stay under 1 s. Prints the figures
/// (`cargo test --test raft_sim figures -- --nocapture`).
#[test]
fn figures_election_times() {
    use raft_harness::{Faults, Sim};
    for n in [3, 5] {
        let (mut first, mut failover) = (Vec::new(), Vec::new());
        for seed in 0..300 {
            let mut sim = Sim::new(seed, n, false, Faults::calm());
            let mut t = 0;
            while sim.leader().is_none() {
                t += 1;
                sim.run_until(t).unwrap();
                assert!(t < 10_000, "seed {seed}: no first leader");
            }
            first.push(t);
            t += 1_000;
            sim.run_until(t).unwrap();
            let old = sim.leader().unwrap();
            sim.crash(old);
            let crashed_at = t;
            loop {
                t += 1;
                sim.run_until(t).unwrap();
                if sim.leader().is_some_and(|l| l != old) {
                    break;
                }
                assert!(t < crashed_at + 10_000, "seed {seed}: no leader after loss");
            }
            failover.push(t - crashed_at);
        }
        let tick = gombus::cluster::raft::TICK_MS;
        let (f50, f99) = (percentile(&mut first, 50), percentile(&mut first, 99));
        let (l50, l99) = (percentile(&mut failover, 50), percentile(&mut failover, 99));
        println!(
            "{n} nodes: first leader median {f50} ms ({} ticks), p99 {f99} ms ({} ticks); \
             after leader loss median {l50} ms ({} ticks), p99 {l99} ms ({} ticks)",
            f50 / tick,
            f99 / tick,
            l50 / tick,
            l99 / tick
        );
        assert!(l99 < 1_000, "{n} nodes: p99 failover {l99} ms");
    }
}

/// A healthy 3-node cluster under steady load for 10 simulated seconds:
/// one election at the start and none after; prints commits per second.
#[test]
fn figures_no_spurious_elections_and_throughput() {
    use raft_harness::{Faults, Sim};
    for seed in 0..2 {
        let mut sim = Sim::with_snapshots_every(seed, 3, false, Faults::calm(), 200);
        let mut t = 0;
        while sim.leader().is_none() {
            t += 1;
            sim.run_until(t).unwrap();
        }
        let start = t;
        let committed_at_start = sim.committed.len();
        while t < start + 10_000 {
            t += 1;
            sim.run_until(t).unwrap();
            let l = sim.leader().unwrap();
            for _ in 0..2 {
                sim.propose(l).unwrap();
            }
        }
        assert_eq!(
            sim.leader_changes.len(),
            1,
            "seed {seed}: {:?}",
            sim.leader_changes
        );
        let per_s = (sim.committed.len() - committed_at_start) as u64 / 10;
        println!("seed {seed}: 2000 proposals/s offered, {per_s} committed per simulated second");
        assert!(per_s >= 1_950, "seed {seed}: only {per_s}/s");
    }
}
