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
        // A new leader overwrites 7, which sits in the file before the
        // one 8 went to.
        Op::Append(7, vec![e(7, 5)]),
        Op::Append(8, vec![e(8, 5)]),
        // A second compaction: the first file is covered whole.
        Op::Snap(snap(7, 5)),
        Op::Append(9, vec![e(9, 5)]),
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
        l(snap(4, 2), vec![e(5, 3), e(6, 3), e(7, 5)]),
        l(snap(4, 2), vec![e(5, 3), e(6, 3), e(7, 5), e(8, 5)]),
        l(snap(7, 5), vec![e(8, 5)]),
        l(snap(7, 5), vec![e(8, 5), e(9, 5)]),
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

/// A file a snapshot covers whole leaves the log's names at once and is
/// deleted on another thread; one a crash left behind goes at open.
#[test]
fn covered_files_go_without_holding_up_the_snapshot() {
    let dir = TempDir::new("covered");
    let mut d = DurableLog::open(&dir.0).unwrap();
    let ops = script();
    // Through the snapshot the log disagrees with, which takes its files.
    for op in &ops[..12] {
        apply(&mut d, op);
    }
    let names: Vec<String> = (fs::read_dir(&dir.0).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !dir.0.join("log").exists() && !dir.0.join("log.1").exists(),
        "a covered file kept its name: {names:?}"
    );
    let gone = |dir: &Path| -> Vec<String> {
        (fs::read_dir(dir).unwrap())
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".gone"))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone(&dir.0).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "still there: {:?}",
            gone(&dir.0)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(d);
    fs::write(dir.0.join("log.1.gone"), b"left by a crash").unwrap();
    let mut d = DurableLog::open(&dir.0).unwrap();
    assert_eq!(gone(&dir.0), Vec::<String>::new());
    assert_eq!(d.load().unwrap(), expected()[11]);
}

/// Where a durable log says an entry's data is, its bytes are, also after
/// reopening and once the file is a stream's data file; a stream's log
/// keeps covered files as data files, never deletes one, and numbers
/// its new files after them, also when it starts again without its log.
#[test]
fn a_stream_log_says_where_entry_data_is_and_keeps_covered_files_as_data() {
    let dir = TempDir::new("keeping");
    let read_at = |n: u64, at: u64, len: usize| -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let f = gombus::storage::log_files::open(&dir.0, n).unwrap();
        let mut buf = vec![0; len];
        f.read_exact_at(&mut buf, at).unwrap();
        buf
    };
    let mut d = DurableLog::open_keeping(&dir.0).unwrap();
    let ops = script();
    for op in &ops[..12] {
        apply(&mut d, op);
    }
    let want = expected()[11].clone();
    for e in &want.entries {
        let (n, at) = d.data_at(e.index).unwrap();
        assert_eq!(read_at(n, at, e.data.len()), e.data, "entry {}", e.index);
    }
    assert_eq!(d.data_at(1), None, "covered entries are not the log's");
    // The files the snapshots covered whole are data files now.
    let mut data = gombus::storage::log_files::data_files(&dir.0).unwrap();
    assert!(!data.is_empty());
    let gone = fs::read_dir(&dir.0)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".gone")
        })
        .count();
    assert_eq!(gone, 0);
    drop(d);
    let d = DurableLog::open_keeping(&dir.0).unwrap();
    for e in &want.entries {
        let (n, at) = d.data_at(e.index).unwrap();
        assert_eq!(
            read_at(n, at, e.data.len()),
            e.data,
            "entry {} reopened",
            e.index
        );
    }
    drop(d);
    // Started again without its log: its files join the data files, and
    // the new log's first file is numbered after all of them.
    gombus::cluster::raft_log::remove_log(&dir.0).unwrap();
    let mut d = DurableLog::open_keeping(&dir.0).unwrap();
    let now = gombus::storage::log_files::data_files(&dir.0).unwrap();
    assert!(now.len() > data.len());
    data.retain(|n| !now.contains(n));
    assert!(data.is_empty(), "a data file went: {data:?}");
    d.append(1, &[e(1, 9)]).unwrap();
    let (n, at) = d.data_at(1).unwrap();
    assert!(
        n > *now.last().unwrap(),
        "file {n} after data files {now:?}"
    );
    assert_eq!(read_at(n, at, e(1, 9).data.len()), e(1, 9).data);
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

/// The files of a durable log directory at one moment: the log files
/// (`log`, `log.1`, ...) in order, and the snapshot record.
#[derive(Clone)]
struct Files {
    logs: Vec<(u64, Vec<u8>)>,
    snapshot: Option<Vec<u8>>,
}

fn log_name(n: u64) -> String {
    if n == 0 {
        "log".to_string()
    } else {
        format!("log.{n}")
    }
}

fn read_files(dir: &Path) -> Files {
    let mut logs = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let n = match name.as_str() {
            "log" => 0,
            _ => match name.strip_prefix("log.").and_then(|d| d.parse().ok()) {
                Some(n) => n,
                None => continue,
            },
        };
        logs.push((n, fs::read(dir.join(&name)).unwrap()));
    }
    logs.sort();
    Files {
        logs,
        snapshot: fs::read(dir.join("snapshot")).ok(),
    }
}

fn write_files(dir: &Path, f: &Files) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    for (n, bytes) in &f.logs {
        fs::write(dir.join(log_name(*n)), bytes).unwrap();
    }
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
    let mut files_seen = 0;
    for (k, op) in script().iter().enumerate() {
        apply(&mut d, op);
        let after = read_files(&live.0);
        files_seen = files_seen.max(after.logs.len());
        recover_and_check(
            &scratch.0,
            &before,
            &[&prev],
            None,
            &format!("op {k} not started"),
        );
        match op {
            Op::Append(first, _) => {
                // The appended records land in the last file (a
                // truncation first cuts the file holding `first` and
                // deletes the later ones): every byte of them.
                let keep = prev.entries.iter().filter(|x| x.index < *first).count();
                let last = after.logs.len() - 1;
                let cut = offset_of(&after.logs[last].1, *first);
                for j in cut..=after.logs[last].1.len() {
                    let mut f = after.clone();
                    f.logs[last].1.truncate(j);
                    let what = format!("op {k} cut at byte {j}");
                    recover_and_check(&scratch.0, &f, &[], Some((&want[k], keep)), &what);
                }
                // Later files deleted, the cut not made yet.
                let mut f = before.clone();
                f.logs.retain(|(n, _)| *n <= after.logs[last].0);
                let what = format!("op {k} later files deleted");
                recover_and_check(&scratch.0, &f, &[&prev], Some((&prev, keep)), &what);
            }
            Op::Snap(_) => {
                // Nothing is rewritten: a file that stays keeps its bytes.
                for (n, bytes) in &after.logs {
                    if let Some((_, was)) = before.logs.iter().find(|(b, _)| b == n) {
                        assert_eq!(was, bytes, "op {k}: log file {n} rewritten");
                    }
                }
                // Snapshot replaced, the new file not made yet; then made
                // (empty), the covered files not deleted yet. Load
                // finishes the job either way.
                let mut mid = before.clone();
                mid.snapshot = after.snapshot.clone();
                recover_and_check(
                    &scratch.0,
                    &mid,
                    &[&want[k]],
                    None,
                    &format!("op {k} half done"),
                );
                if let Some(&(n, _)) = after.logs.last() {
                    if before.logs.iter().all(|(b, _)| *b < n) {
                        mid.logs.push((n, Vec::new()));
                        let what = format!("op {k} new file made");
                        recover_and_check(&scratch.0, &mid, &[&want[k]], None, &what);
                    }
                }
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
    assert!(
        files_seen >= 2,
        "the script rolls the log into a second file"
    );
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
