//! The Raft log stores: one test body run against the memory and the
//! durable store, reopening the durable one, the state file, and a crash
//! at every write boundary of a small run (every byte of every append, and
//! between each step of a snapshot) recovering to a consistent prefix.

mod support;

use std::fs;
use std::path::Path;

use gombus::cluster::raft_log::{
    DurableLog, Loaded, LogStore, MembershipFile, MemoryLog, StateFile,
};
use gombus::cluster::raft_msg::{Entry, EntryKind, HardState, Member, Membership, Snapshot};
use gombus::storage::record;
use support::TempDir;

/// A fresh directory under the system temp dir, removed on drop.
fn e(index: u64, term: u64) -> Entry {
    Entry {
        term,
        index,
        kind: EntryKind::Command,
        data: format!("cmd {index} of term {term}").into_bytes(),
    }
}

fn snap(index: u64, term: u64) -> Snapshot {
    Snapshot {
        index,
        term,
        data: format!("state at {index}").into_bytes(),
    }
}

/// One step of the scripted run.
#[derive(Clone)]
enum Op {
    Append(u64, Vec<Entry>),
    Snap(Snapshot),
}

fn script() -> Vec<Op> {
    vec![
        Op::Append(1, vec![e(1, 1), e(2, 1)]),
        Op::Append(3, vec![e(3, 1)]),
        Op::Append(4, vec![e(4, 2), e(5, 2), e(6, 2)]),
        // A new leader overwrites 5 and 6.
        Op::Append(5, vec![e(5, 3)]),
        Op::Append(6, vec![e(6, 3), e(7, 3)]),
        // Local compaction: the log agrees at 4, entries after it stay.
        Op::Snap(snap(4, 2)),
        Op::Append(8, vec![e(8, 3)]),
        // An installed snapshot the log disagrees with: everything goes.
        Op::Snap(snap(10, 4)),
        Op::Append(11, vec![e(11, 4), e(12, 4)]),
    ]
}

fn apply(store: &mut dyn LogStore, op: &Op) {
    match op {
        Op::Append(first, es) => store.append(*first, es).unwrap(),
        Op::Snap(s) => store.save_snapshot(s).unwrap(),
    }
}

/// What each store must hold after each step of the script.
fn expected() -> Vec<Loaded> {
    let l = |s: Snapshot, es: Vec<Entry>| Loaded {
        snapshot: s,
        entries: es,
    };
    let none = Snapshot::default;
    vec![
        l(none(), vec![e(1, 1), e(2, 1)]),
        l(none(), vec![e(1, 1), e(2, 1), e(3, 1)]),
        l(
            none(),
            vec![e(1, 1), e(2, 1), e(3, 1), e(4, 2), e(5, 2), e(6, 2)],
        ),
        l(none(), vec![e(1, 1), e(2, 1), e(3, 1), e(4, 2), e(5, 3)]),
        l(
            none(),
            vec![
                e(1, 1),
                e(2, 1),
                e(3, 1),
                e(4, 2),
                e(5, 3),
                e(6, 3),
                e(7, 3),
            ],
        ),
        l(snap(4, 2), vec![e(5, 3), e(6, 3), e(7, 3)]),
        l(snap(4, 2), vec![e(5, 3), e(6, 3), e(7, 3), e(8, 3)]),
        l(snap(10, 4), vec![]),
        l(snap(10, 4), vec![e(11, 4), e(12, 4)]),
    ]
}

fn run_script(store: &mut dyn LogStore) {
    for (op, want) in script().iter().zip(expected()) {
        apply(store, op);
        assert_eq!(store.load().unwrap(), want);
    }
}

#[test]
fn memory_log_follows_the_script() {
    let mut m = MemoryLog::new();
    assert!(!m.is_durable());
    run_script(&mut m);
}

#[test]
fn durable_log_follows_the_script_and_survives_reopening() {
    let dir = TempDir::new("script");
    let mut d = DurableLog::open(&dir.0).unwrap();
    assert!(d.is_durable());
    for (op, want) in script().iter().zip(expected()) {
        apply(&mut d, op);
        assert_eq!(d.load().unwrap(), want);
        drop(d);
        d = DurableLog::open(&dir.0).unwrap();
        assert_eq!(d.load().unwrap(), want, "after reopening");
    }
}

#[test]
fn state_file_round_trips_and_survives_a_torn_replacement() {
    let dir = TempDir::new("state");
    let mut s = StateFile::open(&dir.0).unwrap();
    assert_eq!(s.load().unwrap(), HardState::default());
    let hs = HardState {
        term: 7,
        vote: Some(3),
        epoch: 2,
    };
    s.save(&hs).unwrap();
    assert_eq!(StateFile::open(&dir.0).unwrap().load().unwrap(), hs);

    // A crash while writing the next state leaves a torn state.tmp: the
    // state file itself is still the last whole one.
    let mut next = Vec::new();
    record::encode(&mut next, &[9; 24]);
    for cut in 0..next.len() {
        fs::write(dir.0.join("state.tmp"), &next[..cut]).unwrap();
        assert_eq!(StateFile::open(&dir.0).unwrap().load().unwrap(), hs);
    }

    // A damaged state file is an error naming the file, not a silent reset
    // (a node that forgot its vote could vote twice).
    let mut bytes = fs::read(dir.0.join("state")).unwrap();
    bytes[10] ^= 1;
    fs::write(dir.0.join("state"), &bytes).unwrap();
    let err = StateFile::open(&dir.0)
        .unwrap()
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("state") && err.contains("crc"), "{err}");
}

/// The files of a durable log directory at one moment.
#[derive(Clone)]
struct Files {
    log: Vec<u8>,
    snapshot: Option<Vec<u8>>,
}

fn read_files(dir: &Path) -> Files {
    Files {
        log: fs::read(dir.join("log")).unwrap_or_default(),
        snapshot: fs::read(dir.join("snapshot")).ok(),
    }
}

fn write_files(dir: &Path, f: &Files) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("log"), &f.log).unwrap();
    if let Some(s) = &f.snapshot {
        fs::write(dir.join("snapshot"), s).unwrap();
    }
}

/// Byte offset of the first record whose entry index is >= `first`.
fn offset_of(log: &[u8], first: u64) -> usize {
    let mut at = 0;
    while let Ok(Some((body, next))) = record::read(log, at) {
        let index = u64::from_le_bytes(body[8..16].try_into().unwrap());
        if index >= first {
            return at;
        }
        at = next;
    }
    at
}

/// Opens the directory as it would be found after a crash and checks that
/// it loads as one of `allowed`, or (for a torn append) as a prefix of
/// `grown` that keeps at least `keep` entries; then that it takes new
/// writes.
fn recover_and_check(
    dir: &Path,
    f: &Files,
    allowed: &[&Loaded],
    grown: Option<(&Loaded, usize)>,
    what: &str,
) {
    write_files(dir, f);
    let mut d = DurableLog::open(dir).unwrap_or_else(|err| panic!("{what}: {err}"));
    let got = d.load().unwrap();
    let ok_whole = allowed.contains(&&got);
    let ok_prefix = grown.is_some_and(|(g, keep)| {
        got.snapshot == g.snapshot
            && got.entries.len() >= keep
            && got.entries.len() <= g.entries.len()
            && got.entries[..] == g.entries[..got.entries.len()]
    });
    assert!(ok_whole || ok_prefix, "{what}: recovered {got:?}");
    // The recovered log is a clean base: a new entry goes right after it.
    let next = got.entries.last().map_or(got.snapshot.index, |x| x.index) + 1;
    d.append(next, &[e(next, 9)]).unwrap();
    drop(d);
    let again = DurableLog::open(dir).unwrap().load().unwrap();
    assert_eq!(again.entries.last(), Some(&e(next, 9)), "{what}");
}

#[test]
fn a_crash_at_every_write_boundary_recovers_a_consistent_prefix() {
    let live = TempDir::new("crash-live");
    let scratch = TempDir::new("crash-scratch");
    let mut d = DurableLog::open(&live.0).unwrap();
    let want = expected();
    let mut before = read_files(&live.0);
    let mut prev = Loaded::default();
    for (k, op) in script().iter().enumerate() {
        apply(&mut d, op);
        let after = read_files(&live.0);
        match op {
            Op::Append(first, _) => {
                // Before the cut, after the cut, and every byte of the
                // appended records.
                let cut = offset_of(&before.log, *first);
                let keep = prev.entries.iter().filter(|x| x.index < *first).count();
                recover_and_check(
                    &scratch.0,
                    &before,
                    &[&prev],
                    None,
                    &format!("op {k} not started"),
                );
                for j in cut..=after.log.len() {
                    let f = Files {
                        log: after.log[..j].to_vec(),
                        snapshot: after.snapshot.clone(),
                    };
                    let what = format!("op {k} cut at byte {j}");
                    recover_and_check(&scratch.0, &f, &[], Some((&want[k], keep)), &what);
                }
            }
            Op::Snap(_) => {
                // Snapshot replaced, log not yet rewritten: load finishes
                // the job. Also a torn snapshot.tmp lying around.
                let mid = Files {
                    log: before.log.clone(),
                    snapshot: after.snapshot.clone(),
                };
                recover_and_check(
                    &scratch.0,
                    &before,
                    &[&prev],
                    None,
                    &format!("op {k} not started"),
                );
                recover_and_check(
                    &scratch.0,
                    &mid,
                    &[&want[k]],
                    None,
                    &format!("op {k} half done"),
                );
                recover_and_check(
                    &scratch.0,
                    &after,
                    &[&want[k]],
                    None,
                    &format!("op {k} done"),
                );
            }
        }
        before = after;
        prev = want[k].clone();
    }
}

#[test]
fn a_corrupt_snapshot_file_is_an_error_naming_it() {
    let dir = TempDir::new("badsnap");
    let mut d = DurableLog::open(&dir.0).unwrap();
    d.append(1, &[e(1, 1)]).unwrap();
    d.save_snapshot(&snap(1, 1)).unwrap();
    drop(d);
    let p = dir.0.join("snapshot");
    let mut bytes = fs::read(&p).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&p, &bytes).unwrap();
    let err = DurableLog::open(&dir.0).unwrap_err().to_string();
    assert!(
        err.contains("snapshot") && err.contains("offset 0"),
        "{err}"
    );
}

/// The configuration stored beside the snapshot comes back whole after a
/// reopen; none stored is `None`; a damaged file is an error, not a
/// silent fall back to `-raft-peers`.
#[test]
fn membership_file_round_trips_and_refuses_damage() {
    let dir = TempDir::new("membership");
    let mut f = MembershipFile::open(&dir.0).unwrap();
    assert_eq!(f.load().unwrap(), None);
    let conf = Membership {
        members: vec![
            Member {
                id: 1,
                voter: true,
                data: b"{\"name\":\"n1\"}".to_vec(),
            },
            Member {
                id: 1 << 63 | 5,
                voter: false,
                data: Vec::new(),
            },
        ],
    };
    f.save(&conf).unwrap();
    assert_eq!(
        MembershipFile::open(&dir.0).unwrap().load().unwrap(),
        Some(conf)
    );
    let mut bytes = fs::read(dir.0.join("membership")).unwrap();
    bytes[10] ^= 1;
    fs::write(dir.0.join("membership"), &bytes).unwrap();
    assert!(MembershipFile::open(&dir.0).unwrap().load().is_err());
}
