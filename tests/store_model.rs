//! Randomized model test of the segment store: random appends, reads,
//! removals, purges, limit expiries, flushes, compaction steps and
//! restarts, each checked against a plain in-memory map. Half the runs are
//! key-value workloads (each put removes its subject's previous message)
//! with a cold key written first, the pattern compaction is for. Most
//! opens give the index a short window, so that live rows move out of it
//! to its sparse list. Seeded; a failure prints its seed, and
//! `GOMBUS_SEED=<n> cargo test --test store_model` replays it.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use gombus::storage::sync::{SyncPolicy, Syncer};
use gombus::stream::store::{Options, Store, WINDOW_SLOTS_DEFAULT};
use support::TempDir;

/// SplitMix64 ([`gombus::rand`]): small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        gombus::rand::splitmix64(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Msg {
    subject: String,
    headers: Option<String>,
    data: Vec<u8>,
    binary: bool,
    time_ms: u64,
}

/// Framed record bytes of a message (the store's `bytes` counts these).
fn record_bytes(m: &Msg) -> u64 {
    let headers = m.headers.as_ref().map_or(0, |h| 4 + h.len());
    (8 + 20 + m.subject.len() + headers + m.data.len()) as u64
}

#[derive(Default)]
struct Model {
    msgs: BTreeMap<u64, Msg>,
    next_seq: u64,
}

impl Model {
    fn state(&self) -> (u64, u64, u64, u64) {
        let last = self.next_seq - 1;
        let first = match self.msgs.keys().next() {
            Some(&s) => s,
            None if last == 0 => 0,
            None => self.next_seq,
        };
        let bytes = self.msgs.values().map(record_bytes).sum();
        (self.msgs.len() as u64, bytes, first, last)
    }
}

/// Flushes and closes `store`, then opens it again with `opts`: recovery
/// must find nothing to cut.
fn restart(mut store: Store, dir: &Path, opts: Options, ctx: &str) -> Store {
    store.flush().unwrap();
    drop(store);
    let (store, report) = Store::open(dir, opts).unwrap();
    assert!(report.cuts.is_empty(), "{ctx}: {:?}", report.cuts);
    store
}

/// The seeds to run: `GOMBUS_SEED` alone if set, else `fixed` and one from
/// the clock.
fn seeds(fixed: &[u64]) -> Vec<u64> {
    match std::env::var("GOMBUS_SEED") {
        Ok(s) => vec![s.parse().expect("GOMBUS_SEED is a number")],
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64);
            let mut all = fixed.to_vec();
            all.push(t);
            all
        }
    }
}

const SUBJECTS: [&str; 6] = ["a", "a.b", "orders.eu", "orders.us", "x.y.z", "cold"];

/// The subjects random appends use (the cold key is written on its own).
const HOT: usize = 5;

/// The index's window: mostly short, so that the runs move live rows out
/// of it (which the default window does only past a thousand seqs).
fn window_slots(rng: &mut Rng) -> usize {
    match rng.below(4) {
        0 => WINDOW_SLOTS_DEFAULT,
        _ => rng.below(16) as usize,
    }
}

fn check(store: &Store, model: &Model, rng: &mut Rng, ctx: &str) {
    let st = store.state();
    assert_eq!(
        (st.messages, st.bytes, st.first_seq, st.last_seq),
        model.state(),
        "{ctx}: state"
    );
    for _ in 0..3 {
        let seq = rng.below(model.next_seq + 2);
        let got = store.get(seq).unwrap();
        let want = model.msgs.get(&seq);
        match (got, want) {
            (None, None) => {}
            (Some(g), Some(w)) => {
                assert_eq!(g.seq, seq, "{ctx}");
                let g = Msg {
                    subject: g.subject,
                    headers: g.headers,
                    data: g.data,
                    binary: g.binary,
                    time_ms: g.time_ms,
                };
                assert_eq!(&g, w, "{ctx}: seq {seq}");
            }
            (g, w) => panic!("{ctx}: seq {seq}: store {g:?}, model {w:?}"),
        }
    }
    let subject = SUBJECTS[rng.below(SUBJECTS.len() as u64) as usize];
    let want_last = model
        .msgs
        .iter()
        .rev()
        .find(|(_, m)| m.subject == subject)
        .map(|(&s, _)| s);
    assert_eq!(
        store.last_seq_for_subject(subject),
        want_last,
        "{ctx}: last for {subject}"
    );
    let want_first = model
        .msgs
        .iter()
        .find(|(_, m)| m.subject == subject)
        .map(|(&s, _)| s);
    assert_eq!(
        store.first_seq_for_subject(subject),
        want_first,
        "{ctx}: first for {subject}"
    );
    let count = model.msgs.values().filter(|m| m.subject == subject).count() as u64;
    assert_eq!(
        store.subject_count(subject),
        count,
        "{ctx}: count {subject}"
    );
    let from = rng.below(model.next_seq + 1);
    let prefix = &subject[..1];
    let want_next = model
        .msgs
        .range(from..)
        .find(|(_, m)| m.subject.starts_with(prefix))
        .map(|(&s, _)| s);
    assert_eq!(
        store.next_matching(from, |s| s.starts_with(prefix)),
        want_next,
        "{ctx}: next from {from} matching {prefix}*"
    );
}

fn run(seed: u64, ops: usize, kv: bool) {
    let dir = TempDir::new(&format!("store-model-{seed}"));
    let mut rng = Rng(seed);
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).unwrap());
    let opts = |rng: &mut Rng| Options {
        segment_bytes: 512 + rng.below(2048),
        cache_bytes: rng.below(4096) as usize,
        syncer: (rng.below(2) == 0).then(|| Arc::clone(&syncer)),
        index_window_slots: window_slots(rng),
    };
    let (mut store, _) = Store::open(&dir.0, opts(&mut rng)).unwrap();
    let mut model = Model {
        next_seq: 1,
        ..Model::default()
    };
    let mut now = 1_000u64;
    let mut compactions = 0;
    for op in 0..ops {
        let ctx = format!("seed {seed} op {op}");
        let mut pick = rng.below(100);
        if kv && (0..=81).contains(&pick) {
            // Puts, with the odd removal and purge of one subject.
            pick = match pick {
                0..=69 => 100,
                70..=74 => 50,
                75..=76 => 73,
                _ => pick,
            };
        }
        let cold_gone = !model.msgs.values().any(|m| m.subject == "cold");
        if kv && cold_gone && rng.below(50) == 0 {
            pick = 101;
        }
        match pick {
            0..=49 | 100 | 101 => {
                now += rng.below(20);
                let subject = match pick {
                    101 => "cold",
                    _ => SUBJECTS[rng.below(HOT as u64) as usize],
                };
                if pick >= 100 {
                    if let Some((&old, _)) =
                        model.msgs.iter().rev().find(|(_, m)| m.subject == subject)
                    {
                        model.msgs.remove(&old);
                        assert!(store.remove(old).unwrap(), "{ctx}: put removes {old}");
                    }
                }
                let m = Msg {
                    subject: subject.to_string(),
                    headers: (rng.below(4) == 0).then(|| format!("{{\"h\":{}}}", rng.below(999))),
                    data: vec![rng.below(256) as u8; rng.below(200) as usize],
                    binary: rng.below(2) == 0,
                    time_ms: now,
                };
                let seq = store
                    .append(
                        &m.subject,
                        m.headers.as_deref(),
                        &m.data,
                        m.binary,
                        m.time_ms,
                    )
                    .unwrap();
                assert_eq!(seq, model.next_seq, "{ctx}: append seq");
                model.msgs.insert(seq, m);
                model.next_seq += 1;
            }
            50..=64 => {
                let seq = rng.below(model.next_seq + 1);
                let want = model.msgs.remove(&seq).is_some();
                assert_eq!(store.remove(seq).unwrap(), want, "{ctx}: remove {seq}");
            }
            65..=69 => {
                // Discard old: the limits path removes from the front.
                if let Some((&first, _)) = model.msgs.iter().next() {
                    model.msgs.remove(&first);
                    assert!(store.remove(first).unwrap(), "{ctx}: discard {first}");
                }
            }
            70..=72 => {
                let n = model.msgs.len() as u64;
                model.msgs.clear();
                assert_eq!(store.purge().unwrap(), n, "{ctx}: purge");
            }
            73..=76 => {
                let subject = SUBJECTS[rng.below(SUBJECTS.len() as u64) as usize];
                let before = model.msgs.len();
                model.msgs.retain(|_, m| m.subject != subject);
                let n = (before - model.msgs.len()) as u64;
                assert_eq!(
                    store.purge_subjects(|s| s == subject).unwrap(),
                    n,
                    "{ctx}: purge {subject}"
                );
            }
            77..=81 => {
                let cutoff = now.saturating_sub(rng.below(400));
                let mut n = 0;
                while let Some((&s, m)) = model.msgs.iter().next() {
                    if m.time_ms >= cutoff {
                        break;
                    }
                    model.msgs.remove(&s);
                    n += 1;
                }
                assert_eq!(store.expire_before(cutoff).unwrap(), n, "{ctx}: expire");
            }
            82..=91 => {
                // As a stream does: a flush, then a compaction step.
                store.flush().unwrap();
                if store.compact_step().unwrap() {
                    compactions += 1;
                }
            }
            _ => {
                store = restart(store, &dir.0, opts(&mut rng), &ctx);
            }
        }
        check(&store, &model, &mut rng, &ctx);
        let files = fs::read_dir(&dir.0)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "seg")
            })
            .count();
        assert_eq!(files, store.segment_count(), "{ctx}: segment files");
    }
    if kv {
        assert!(
            compactions > ops / 100,
            "seed {seed}: {compactions} compactions"
        );
    }
}

#[test]
fn store_matches_model() {
    for seed in seeds(&[1, 2, 3, 4]) {
        let kv = seed % 2 == 0;
        eprintln!("store model: seed {seed} kv {kv} (replay with GOMBUS_SEED={seed})");
        // Key-value runs compact every few rolls, each step with its
        // fsyncs: fewer ops keep the test quick.
        run(seed, if kv { 1500 } else { 4000 }, kv);
    }
}

/// The store used as a Raft log: appends, suffix cuts (`truncate_from`),
/// prefix compaction (`remove_below`), reads and restarts against a map.
fn run_log(seed: u64, ops: usize) {
    let dir = TempDir::new(&format!("store-log-model-{seed}"));
    let mut rng = Rng(seed);
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).unwrap());
    let opts = |rng: &mut Rng| Options {
        segment_bytes: 300 + rng.below(1500),
        cache_bytes: rng.below(2048) as usize,
        syncer: (rng.below(2) == 0).then(|| Arc::clone(&syncer)),
        index_window_slots: window_slots(rng),
    };
    let (mut store, _) = Store::open(&dir.0, opts(&mut rng)).unwrap();
    let mut model = Model {
        next_seq: 1,
        ..Model::default()
    };
    let (mut cuts, mut compactions) = (0, 0);
    for op in 0..ops {
        let ctx = format!("log seed {seed} op {op}");
        let pick = rng.below(100);
        if std::env::var("GOMBUS_TRACE").is_ok() {
            eprintln!(
                "{ctx}: pick {pick} state {:?} segments {}",
                store.state(),
                store.segment_count()
            );
        }
        match pick {
            0..=59 => {
                let m = Msg {
                    subject: format!("term.{}", rng.below(4)),
                    headers: None,
                    data: vec![rng.below(256) as u8; rng.below(120) as usize],
                    binary: true,
                    time_ms: op as u64,
                };
                let seq = store
                    .append(&m.subject, None, &m.data, true, m.time_ms)
                    .unwrap();
                assert_eq!(seq, model.next_seq, "{ctx}: append");
                model.msgs.insert(seq, m);
                model.next_seq += 1;
            }
            60..=71 => {
                let st = store.state();
                if st.messages > 0 {
                    let seq = st.first_seq + rng.below(st.last_seq - st.first_seq + 1);
                    let gone = model.msgs.split_off(&seq).len() as u64;
                    model.next_seq = seq;
                    assert_eq!(store.truncate_from(seq).unwrap(), gone, "{ctx}: cut {seq}");
                    cuts += 1;
                }
            }
            72..=79 => {
                let seq = rng.below(model.next_seq + 3);
                let keep = model.msgs.split_off(&seq);
                let gone = std::mem::replace(&mut model.msgs, keep).len() as u64;
                model.next_seq = model.next_seq.max(seq);
                assert_eq!(
                    store.remove_below(seq).unwrap(),
                    gone,
                    "{ctx}: compact {seq}"
                );
                compactions += 1;
            }
            80..=89 => {
                store.flush().unwrap();
            }
            _ => {
                store = restart(store, &dir.0, opts(&mut rng), &ctx);
            }
        }
        let st = store.state();
        let (msgs, bytes, first, last) = model.state();
        assert_eq!(
            (st.messages, st.bytes, st.last_seq),
            (msgs, bytes, last),
            "{ctx}: state"
        );
        if msgs > 0 {
            assert_eq!(st.first_seq, first, "{ctx}: first");
        }
        for _ in 0..3 {
            let seq = rng.below(model.next_seq + 2);
            let got = store.get(seq).unwrap().map(|m| m.data);
            assert_eq!(
                got.as_ref(),
                model.msgs.get(&seq).map(|m| &m.data),
                "{ctx}: seq {seq}"
            );
        }
    }
    assert!(
        cuts > ops / 20 && compactions > ops / 20,
        "{cuts} cuts, {compactions} compactions"
    );
}

#[test]
fn store_as_a_log_matches_model() {
    for seed in seeds(&[11, 12]) {
        eprintln!("store log model: seed {seed} (replay with GOMBUS_SEED={seed})");
        run_log(seed, 3000);
    }
}
