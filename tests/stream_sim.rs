//! Deterministic simulation of replicated streams over many Raft groups
//! (see tests/stream_harness): the control group and two or three R3
//! stream groups on 3 or 5 nodes, with lossy networks, partitions,
//! crashes that lose unsynced writes, members catching up over that
//! network, members whose payload files are damaged, and the checker
//! after every step and at the end of every run. `SIM_SEEDS` sets how many seeds run
//! (default 2000, split over two tests: 3 and 5 nodes); `make sim
//! SEEDS=N` runs more in release. A failure names its seed and the command
//! that replays it.

mod stream_harness;

use stream_harness::Sim;

fn nodes(seed: u64) -> usize {
    if seed.is_multiple_of(2) {
        3
    } else {
        5
    }
}

fn seeds_total() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// What the runs did, summed: catch-ups begun and ended whole, their
/// requests and refusals, groups started again without their log,
/// members damaged and found damaged at their restart, elections won by
/// a member catching up, catch-ups whose core's entries past the
/// snapshot were applied again, log data files deleted.
#[derive(Default)]
struct Tally([u64; 10]);

impl Tally {
    fn add(&mut self, sim: &Sim) {
        let got = [
            sim.catchups,
            sim.caught_up,
            sim.catchup_asks,
            sim.catchup_refused,
            sim.groups_lost,
            sim.damaged_members,
            sim.damage_found,
            sim.leaders_catching_up,
            sim.replays,
            sim.data_files_gone,
        ];
        for (t, g) in self.0.iter_mut().zip(got) {
            *t += g;
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [c, w, a, r, l, d, found, led, again, gone] = self.0;
        write!(
            f,
            "catch-ups {c} (whole {w}, requests {a}, refused {r}, leading meanwhile {led}, \
             entries applied again {again}), groups lost {l}, damaged members {d} \
             (found at restart {found}), log data files deleted {gone}"
        )
    }
}

fn run_one(seed: u64, tally: &mut Tally) -> Result<(), String> {
    let ran = std::panic::catch_unwind(|| {
        let (sim, r) = stream_harness::run(seed, nodes(seed));
        let mut t = Tally::default();
        t.add(&sim);
        (t, r)
    });
    match ran {
        Ok((t, r)) => {
            for (a, b) in tally.0.iter_mut().zip(t.0) {
                *a += b;
            }
            r
        }
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

fn run_group(first: u64) {
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut seed = first;
    let mut ran = 0;
    let mut tally = Tally::default();
    while seed < seeds_total() {
        if let Err(e) = run_one(seed, &mut tally) {
            failures.push(format!(
                "seed {seed} ({} nodes): {e}\n  replay: STREAM_SIM_SEED={seed} cargo test --test stream_sim replay -- --ignored --nocapture",
                nodes(seed)
            ));
        }
        ran += 1;
        seed += 2;
    }
    println!(
        "{ran} seeds of {} nodes in {:.1} s: {tally}",
        nodes(first),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn sim_streams_3_nodes() {
    run_group(0);
}

#[test]
fn sim_streams_5_nodes() {
    run_group(1);
}

/// Seeds beyond the default range that once failed, run on every test
/// run: a catch-up overtaken by commits past its snapshot (the group was
/// left without a quorum: 29699), and such a catch-up whose leader no
/// longer held the snapshot's state (4760, 9191, 9968, 19527).
const REGRESSION_SEEDS: &[u64] = &[29699, 4760, 9191, 9968, 19527];

#[test]
fn sim_regression_seeds() {
    let mut tally = Tally::default();
    for &seed in REGRESSION_SEEDS {
        assert_eq!(
            run_one(seed, &mut tally),
            Ok(()),
            "seed {seed} ({} nodes)",
            nodes(seed)
        );
    }
    println!("regression seeds: {tally}");
}

/// Replays one seed: `STREAM_SIM_SEED=N cargo test --test stream_sim replay
/// -- --ignored --nocapture` (`SIM_TRACE=1` prints every event).
#[test]
#[ignore]
fn replay() {
    let seed: u64 = std::env::var("STREAM_SIM_SEED")
        .expect("set STREAM_SIM_SEED")
        .parse()
        .expect("STREAM_SIM_SEED is a number");
    println!("seed {seed}: {} nodes", nodes(seed));
    let r = stream_harness::run_seed(seed, nodes(seed));
    assert_eq!(r, Ok(()), "seed {seed}");
}

/// What the first 16 seeds' runs did, to see that the chaos bites:
/// `cargo test --test stream_sim stats -- --ignored --nocapture`.
#[test]
#[ignore]
fn stats() {
    for seed in 0..16u64 {
        let (sim, r) = stream_harness::run(seed, nodes(seed));
        let acked: usize = sim.acked.values().map(|a| a.len()).sum();
        let done: usize = sim.done.values().map(|a| a.len()).sum();
        let mut t = Tally::default();
        t.add(&sim);
        println!(
            "seed {seed} {r:?} steps {} acked publishes {acked} handed out {} acks ok {done} \
             leader changes {} snapshots installed {} finished by max_deliver {}; {t}",
            sim.steps, sim.handed_out, sim.leader_changes, sim.snapshots_installed, sim.exhausted
        );
        assert_eq!(r, Ok(()), "seed {seed}");
    }
}
