//! Deterministic simulation of 3- and 5-node Raft clusters under faults
//! (see tests/raft_harness). `SIM_SEEDS` sets how many seeds run (default
//! 2000, split over four tests: 3 or 5 nodes, durable or memory log);
//! `make sim SEEDS=N` runs more in release. A failure names its seed and
//! the command that replays it.

mod raft_harness;

use raft_harness::run_seed;

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
    match std::panic::catch_unwind(|| run_seed(seed, n, memory)) {
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

#[test]
#[ignore]
fn stats() {
    for seed in 0..16u64 {
        let (n, memory) = shape(seed);
        let (sim, r) = raft_harness::run(seed, n, memory);
        println!(
            "seed {seed} {r:?} steps {} committed {} acked {} reads {} leader changes {} last term {:?}",
            sim.steps,
            sim.committed.len(),
            sim.acked.len(),
            sim.reads_done,
            sim.leader_changes.len(),
            sim.leader_changes.last()
        );
    }
}
