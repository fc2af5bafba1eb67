//! Segment store: round trips across rolls, removal and purge across
//! restarts, torn-tail recovery at every byte offset, corruption of fsynced
//! data refused.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gombus::storage::sync::{SyncPolicy, Syncer};
use gombus::stream::store::{Options, State, Store, StoreError};
use support::TempDir;

/// A directory under the system temp dir, removed on drop.
fn small(segment_bytes: u64) -> Options {
    Options {
        segment_bytes,
        ..Options::default()
    }
}

fn open(dir: &Path, opts: &Options) -> Store {
    let (s, report) = Store::open(dir, opts.clone()).unwrap();
    assert!(report.cuts.is_empty(), "{:?}", report.cuts);
    s
}

fn payload(i: u64) -> Vec<u8> {
    format!("message number {i} ")
        .repeat((i % 7 + 1) as usize)
        .into_bytes()
}

fn subject(i: u64) -> String {
    format!("orders.{}", i % 3)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip_across_rolls_and_restart() {
    let dir = TempDir::new("roll");
    let opts = small(1024);
    let mut s = open(&dir.0, &opts);
    assert_eq!(
        s.state(),
        State {
            messages: 0,
            bytes: 0,
            first_seq: 0,
            last_seq: 0
        }
    );
    for i in 1..=200u64 {
        let headers = (i % 5 == 0).then(|| format!("{{\"n\":{i}}}"));
        let seq = s
            .append(
                &subject(i),
                headers.as_deref(),
                &payload(i),
                i % 2 == 0,
                1000 + i,
            )
            .unwrap();
        assert_eq!(seq, i);
        if i % 10 == 0 {
            s.flush().unwrap();
        }
    }
    s.flush().unwrap();
    assert!(s.segment_count() > 5, "segments {}", s.segment_count());
    let check = |s: &Store| {
        for i in 1..=200u64 {
            let m = s.get(i).unwrap().unwrap();
            assert_eq!(m.seq, i);
            assert_eq!(m.subject, subject(i));
            assert_eq!(m.data, payload(i));
            assert_eq!(m.binary, i % 2 == 0);
            assert_eq!(m.time_ms, 1000 + i);
            assert_eq!(m.headers, (i % 5 == 0).then(|| format!("{{\"n\":{i}}}")));
        }
        assert_eq!(s.get(0).unwrap(), None);
        assert_eq!(s.get(201).unwrap(), None);
        let st = s.state();
        assert_eq!((st.messages, st.first_seq, st.last_seq), (200, 1, 200));
        assert_eq!(s.last_seq_for_subject("orders.1"), Some(199));
        assert_eq!(s.subject_count("orders.0"), 66);
        assert_eq!(s.next_matching(5, |sub| sub == "orders.2"), Some(5));
        assert_eq!(s.next_matching(6, |sub| sub == "orders.2"), Some(8));
        assert_eq!(s.next_matching(199, |sub| sub == "orders.2"), Some(200));
        assert_eq!(s.next_matching(200, |sub| sub == "orders.1"), None);
    };
    check(&s);
    let bytes = s.state().bytes;
    drop(s);
    let s = open(&dir.0, &opts);
    check(&s);
    assert_eq!(s.state().bytes, bytes);
}

#[test]
fn removals_survive_restart_and_free_segments() {
    let dir = TempDir::new("remove");
    let opts = small(512);
    let mut s = open(&dir.0, &opts);
    for i in 1..=100u64 {
        s.append(&subject(i), None, &payload(i), false, i).unwrap();
    }
    let segs_before = s.segment_count();
    for i in 1..=60u64 {
        assert!(s.remove(i).unwrap());
    }
    assert!(!s.remove(3).unwrap(), "a removed seq is not live");
    assert!(s.remove(77).unwrap());
    s.flush().unwrap();
    assert!(s.segment_count() < segs_before, "front segments deleted");
    assert_eq!(segments(&dir.0).len(), s.segment_count());
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (39, 61, 100));
    drop(s);

    let mut s = open(&dir.0, &opts);
    assert_eq!(s.state(), st);
    assert_eq!(s.get(77).unwrap(), None);
    assert_eq!(s.get(60).unwrap(), None);
    assert_eq!(s.get(61).unwrap().unwrap().data, payload(61));
    assert_eq!(s.next_matching(76, |_| true), Some(76));
    assert_eq!(s.next_matching(77, |_| true), Some(78));

    // Purge: seqs go on from where they were, also after a restart.
    assert_eq!(s.purge().unwrap(), 39);
    s.flush().unwrap();
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (0, 101, 100));
    drop(s);
    let mut s = open(&dir.0, &opts);
    assert_eq!(s.state(), st);
    assert_eq!(segments(&dir.0).len(), 1);
    assert_eq!(s.append("a", None, b"x", false, 1).unwrap(), 101);
}

#[test]
fn purge_by_subject_and_expiry() {
    let dir = TempDir::new("purge");
    let opts = small(700);
    let mut s = open(&dir.0, &opts);
    for i in 1..=90u64 {
        s.append(&subject(i), None, &payload(i), false, i * 10)
            .unwrap();
    }
    assert_eq!(s.purge_subjects(|sub| sub == "orders.1").unwrap(), 30);
    assert_eq!(s.subject_count("orders.1"), 0);
    assert_eq!(s.last_seq_for_subject("orders.1"), None);
    // Expire everything older than t=305: seqs 1..=30 (minus purged ones).
    assert_eq!(s.expire_before(305).unwrap(), 20);
    assert_eq!(s.state().first_seq, 32);
    assert_eq!(s.last_seq_for_subject("orders.2"), Some(89));
    assert!(s.remove(89).unwrap());
    assert_eq!(s.last_seq_for_subject("orders.2"), Some(86));
    s.flush().unwrap();
    let st = s.state();
    assert_eq!(st.messages, 90 - 30 - 20 - 1);
    drop(s);
    let s = open(&dir.0, &opts);
    assert_eq!(s.state(), st);
    assert_eq!(s.last_seq_for_subject("orders.2"), Some(86));
    assert_eq!(s.get(31).unwrap(), None, "orders.1 was purged");
    assert_eq!(s.get(30).unwrap(), None, "expired");
    assert_eq!(s.get(32).unwrap().unwrap().seq, 32);
}

/// Writes `n` messages, returns the segment file and where the last record
/// starts.
fn write_n(dir: &Path, n: u64) -> (PathBuf, u64) {
    let mut s = open(dir, &Options::default());
    for i in 1..n {
        s.append(&subject(i), None, &payload(i), false, i).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let seg = segments(dir).pop().unwrap();
    let start = fs::metadata(&seg).unwrap().len();
    let mut s = open(dir, &Options::default());
    s.append(&subject(n), Some("{\"k\":1}"), &payload(n), false, n)
        .unwrap();
    s.flush().unwrap();
    drop(s);
    (seg, start)
}

#[test]
fn torn_last_record_is_cut_at_every_offset() {
    let dir = TempDir::new("torn");
    let (seg, start) = write_n(&dir.0, 5);
    let whole = fs::read(&seg).unwrap();
    for cut in start..whole.len() as u64 {
        fs::write(&seg, &whole[..cut as usize]).unwrap();
        let (mut s, report) = Store::open(&dir.0, Options::default()).unwrap();
        if cut == start {
            assert!(report.cuts.is_empty());
        } else {
            assert_eq!(report.cuts.len(), 1, "cut at {cut}");
            assert_eq!(report.cuts[0].offset, start);
            assert_eq!(report.cuts[0].bytes, cut - start);
            assert_eq!(report.cuts[0].file, seg);
        }
        assert_eq!(s.state().last_seq, 4);
        assert_eq!(s.get(5).unwrap(), None);
        assert_eq!(s.get(4).unwrap().unwrap().data, payload(4));
        assert_eq!(fs::metadata(&seg).unwrap().len(), start);
        // The store goes on appending after the cut.
        assert_eq!(s.append("z", None, b"after", false, 9).unwrap(), 5);
        s.flush().unwrap();
        drop(s);
        let s = open(&dir.0, &Options::default());
        assert_eq!(s.get(5).unwrap().unwrap().data, b"after");
    }
}

#[test]
fn flipped_byte_in_last_record_is_cut_never_served() {
    let dir = TempDir::new("flip");
    let (seg, start) = write_n(&dir.0, 4);
    let whole = fs::read(&seg).unwrap();
    for i in start as usize..whole.len() {
        let mut bytes = whole.clone();
        bytes[i] ^= 0x10;
        fs::write(&seg, &bytes).unwrap();
        let (s, report) = Store::open(&dir.0, Options::default()).unwrap();
        assert_eq!(report.cuts.len(), 1, "flip at {i}");
        assert_eq!(report.cuts[0].offset, start);
        assert_eq!(s.get(4).unwrap(), None, "flip at {i}");
        assert_eq!(s.state().last_seq, 3);
        assert_eq!(s.get(3).unwrap().unwrap().data, payload(3));
    }
}

#[test]
fn corruption_of_fsynced_data_is_refused() {
    let dir = TempDir::new("corrupt");
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).unwrap());
    let opts = Options {
        syncer: Some(Arc::clone(&syncer)),
        ..Options::default()
    };
    let mut s = open(&dir.0, &opts);
    s.append("a", None, b"first", false, 1).unwrap();
    let t = s.flush().unwrap();
    syncer.wait(t).unwrap();
    // The next record carries the mark that the first one was fsynced.
    s.append("a", None, b"second", false, 2).unwrap();
    s.flush().unwrap();
    drop(s);
    let seg = segments(&dir.0).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    let at = bytes.windows(5).position(|w| w == b"first").unwrap();
    bytes[at] ^= 1;
    fs::write(&seg, &bytes).unwrap();
    match Store::open(&dir.0, opts.clone()) {
        Err(StoreError::Corrupt { file, offset, .. }) => {
            assert_eq!(file, seg);
            assert!(offset < at as u64 && offset > 0, "offset {offset}");
            let msg = StoreError::Corrupt {
                file,
                offset,
                why: "x".into(),
            }
            .to_string();
            assert!(msg.contains(&seg.display().to_string()), "{msg}");
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("corrupt fsynced data was served"),
    }
}

fn indexes(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    v.sort();
    v
}

/// Subject and payload of each seq, `None` where nothing is live.
type Contents = Vec<Option<(String, Vec<u8>)>>;

/// Everything a reader can see, for comparing two opens.
fn snapshot(s: &Store) -> (State, Contents) {
    let last = s.state().last_seq;
    let msgs = (0..=last + 1)
        .map(|q| s.get(q).unwrap().map(|m| (m.subject, m.data)))
        .collect();
    (s.state(), msgs)
}

#[test]
fn missing_damaged_or_stale_index_is_rebuilt() {
    let dir = TempDir::new("index");
    let opts = small(600);
    let mut s = open(&dir.0, &opts);
    for i in 1..=120u64 {
        s.append(&subject(i), None, &payload(i), false, i).unwrap();
    }
    // Removals recorded in sealed segments, some naming earlier segments.
    for i in (2..=110u64).step_by(3) {
        s.remove(i).unwrap();
        s.append("late", None, b"x", false, 500 + i).unwrap();
    }
    s.expire_before(20).unwrap();
    s.flush().unwrap();
    let want = snapshot(&s);
    drop(s);
    let sealed = segments(&dir.0).len() - 1;
    assert!(sealed >= 5, "{sealed} sealed segments");

    let (s, report) = Store::open(&dir.0, opts.clone()).unwrap();
    assert_eq!(report.from_index, 0);
    assert_eq!(report.rebuilt_indexes.len(), sealed);
    assert_eq!(indexes(&dir.0), report.rebuilt_indexes);
    assert_eq!(snapshot(&s), want);
    drop(s);

    let (s, report) = Store::open(&dir.0, opts.clone()).unwrap();
    assert_eq!(report.from_index, sealed);
    assert!(report.rebuilt_indexes.is_empty());
    assert_eq!(snapshot(&s), want);
    drop(s);

    let idx = indexes(&dir.0);
    // Missing.
    fs::remove_file(&idx[1]).unwrap();
    // Damaged.
    let mut b = fs::read(&idx[2]).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 4;
    fs::write(&idx[2], b).unwrap();
    // Stale: another segment's index (wrong first seq and length).
    fs::copy(&idx[4], &idx[3]).unwrap();
    let (s, report) = Store::open(&dir.0, opts.clone()).unwrap();
    assert_eq!(report.from_index, sealed - 3);
    assert_eq!(
        report.rebuilt_indexes,
        vec![idx[1].clone(), idx[2].clone(), idx[3].clone()]
    );
    assert_eq!(snapshot(&s), want);
    drop(s);
    let (s, report) = Store::open(&dir.0, opts.clone()).unwrap();
    assert_eq!(report.from_index, sealed);
    assert_eq!(snapshot(&s), want);
    drop(s);

    // Leftovers of a crash: a temp index and an index whose segment is gone.
    let tmp = dir.0.join("00000000000000000001.idx.tmp");
    let orphan = dir.0.join("00000000000000999999.idx");
    fs::write(&tmp, b"partial").unwrap();
    fs::copy(&idx[0], &orphan).unwrap();
    let (s, _) = Store::open(&dir.0, opts).unwrap();
    assert!(!tmp.exists() && !orphan.exists());
    assert_eq!(indexes(&dir.0), idx);
    assert_eq!(snapshot(&s), want);
}

/// Fills several segments; returns the options used.
fn fill_segments(dir: &Path, syncer: Option<Arc<Syncer>>) -> Options {
    let opts = Options {
        segment_bytes: 400,
        syncer: syncer.clone(),
        ..Options::default()
    };
    let mut s = open(dir, &opts);
    for i in 1..=40u64 {
        s.append(&subject(i), None, &payload(i), false, i).unwrap();
        let t = s.flush().unwrap();
        if let Some(sy) = &syncer {
            sy.wait(t).unwrap();
        }
    }
    drop(s);
    opts
}

#[test]
fn torn_sealed_segment_without_sync_marks_is_cut() {
    let dir = TempDir::new("sealed-torn");
    let opts = fill_segments(&dir.0, None);
    let segs = segments(&dir.0);
    assert!(segs.len() >= 4);
    let victim = &segs[1];
    let len = fs::metadata(victim).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(victim).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let (s, report) = Store::open(&dir.0, opts).unwrap();
    assert_eq!(report.cuts.len(), 1);
    assert_eq!(&report.cuts[0].file, victim);
    // The messages of later segments are still served.
    let st = s.state();
    assert_eq!(st.last_seq, 40);
    assert_eq!(s.get(40).unwrap().unwrap().data, payload(40));
    assert_eq!(st.messages, 39, "only the torn record is gone");
}

#[test]
fn corrupt_sealed_segment_with_later_sync_marks_is_refused() {
    let dir = TempDir::new("sealed-corrupt");
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).unwrap());
    let opts = fill_segments(&dir.0, Some(syncer));
    let segs = segments(&dir.0);
    assert!(segs.len() >= 4);
    let victim = &segs[1];
    let mut bytes = fs::read(victim).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x08;
    fs::write(victim, &bytes).unwrap();
    match Store::open(&dir.0, opts) {
        Err(StoreError::Corrupt { file, offset, .. }) => {
            assert_eq!(&file, victim);
            assert!(offset < n as u64);
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("corrupt fsynced data was served"),
    }
}

#[test]
fn a_damaged_record_found_by_a_read_names_file_and_offset() {
    let dir = TempDir::new("read-corrupt");
    let opts = Options {
        cache_bytes: 0,
        ..small(400)
    };
    let mut s = open(&dir.0, &opts);
    for i in 1..=30u64 {
        s.append(&subject(i), None, &payload(i), false, i).unwrap();
    }
    s.flush().unwrap();
    let seg = segments(&dir.0)[0].clone();
    let mut bytes = fs::read(&seg).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"message number 2")
        .unwrap();
    bytes[at] ^= 1;
    fs::write(&seg, &bytes).unwrap();
    let err = s.get(2).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains(&seg.display().to_string()),
        "{err}"
    );
    assert_eq!(s.get(1).unwrap().unwrap().data, payload(1));
}

#[test]
fn input_bounds_and_edge_values() {
    let dir = TempDir::new("bounds");
    let mut s = open(&dir.0, &Options::default());
    let long = "s".repeat(65_535);
    assert_eq!(s.append(&long, None, b"", false, 0).unwrap(), 1);
    let err = s
        .append(&"s".repeat(65_536), None, b"", false, 0)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let err = s.append("", None, b"x", false, 0).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // Empty headers text and empty payload are kept as given.
    assert_eq!(s.append("h", Some(""), b"", true, u64::MAX).unwrap(), 2);
    let big = vec![0xa5u8; 3 << 20];
    assert_eq!(s.append("big", None, &big, true, 5).unwrap(), 3);
    s.flush().unwrap();
    drop(s);
    let s = open(&dir.0, &Options::default());
    assert_eq!(s.get(1).unwrap().unwrap().subject, long);
    let m = s.get(2).unwrap().unwrap();
    assert_eq!(
        (m.headers.as_deref(), m.data.len(), m.binary, m.time_ms),
        (Some(""), 0, true, u64::MAX)
    );
    assert_eq!(s.get(3).unwrap().unwrap().data, big);
    assert_eq!(s.state().last_seq, 3);
}

#[test]
fn expiry_stops_at_the_first_message_not_older() {
    let dir = TempDir::new("expiry");
    let mut s = open(&dir.0, &small(300));
    // Times out of order (a clock step back): expiry walks in seq order.
    for (i, t) in [10u64, 20, 5, 30, 40].iter().enumerate() {
        s.append("t", None, &payload(i as u64), false, *t).unwrap();
    }
    assert_eq!(s.expire_before(15).unwrap(), 1, "stops at seq 2 (t=20)");
    assert_eq!(s.state().first_seq, 2);
    assert_eq!(s.expire_before(35).unwrap(), 3);
    assert_eq!(s.state().first_seq, 5);
    assert_eq!(s.expire_before(35).unwrap(), 0);
    s.flush().unwrap();
    drop(s);
    let s = open(&dir.0, &small(300));
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (1, 5, 5));
}

#[test]
fn a_log_cuts_its_suffix_across_segments_and_compacts_its_prefix() {
    let dir = TempDir::new("log");
    let syncer = Arc::new(Syncer::start(SyncPolicy::Always).unwrap());
    let opts = Options {
        segment_bytes: 300,
        syncer: Some(Arc::clone(&syncer)),
        ..Options::default()
    };
    let mut s = open(&dir.0, &opts);
    for i in 1..=60u64 {
        s.append("t1", None, &payload(i), true, i).unwrap();
    }
    let t = s.flush().unwrap();
    syncer.wait(t).unwrap();
    let segs = s.segment_count();
    assert!(segs > 5);
    // Compact a prefix, then cut back into an early segment.
    assert_eq!(s.remove_below(11).unwrap(), 10);
    assert_eq!(s.truncate_from(20).unwrap(), 41);
    assert!(s.segment_count() < segs);
    assert_eq!(s.state().last_seq, 19);
    for i in 20..=25u64 {
        assert_eq!(s.append("t2", None, b"new", true, i).unwrap(), i);
    }
    s.flush().unwrap();
    drop(s);
    let s = open(&dir.0, &opts);
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (15, 11, 25));
    assert_eq!(s.get(10).unwrap(), None);
    assert_eq!(s.get(19).unwrap().unwrap().data, payload(19));
    assert_eq!(s.get(20).unwrap().unwrap().subject, "t2");
    assert_eq!(s.get(26).unwrap(), None);
    drop(s);

    // Cutting below the first segment is refused; compaction past the end
    // moves the next seq on (a snapshot ahead of the log).
    let mut s = open(&dir.0, &opts);
    s.remove_below(40).unwrap();
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (0, 40, 39));
    let err = s.truncate_from(30).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(s.append("t3", None, b"x", true, 1).unwrap(), 40);
}

/// A snapshot far ahead of the log moves the next seq by 2^40; reopening
/// replays the Floor record and the message after it without holding the
/// skipped seqs in memory (one entry each would be terabytes).
#[test]
fn compaction_far_past_the_end_reopens() {
    let dir = TempDir::new("far-floor");
    let opts = small(1 << 20);
    let mut s = open(&dir.0, &opts);
    for i in 1..=5u64 {
        s.append("f", None, &payload(i), false, i).unwrap();
    }
    let far = 1u64 << 40;
    assert_eq!(s.remove_below(far).unwrap(), 5);
    assert_eq!(s.append("f", None, b"after", false, 9).unwrap(), far);
    s.flush().unwrap();
    drop(s);
    let s = open(&dir.0, &opts);
    let st = s.state();
    assert_eq!((st.messages, st.first_seq, st.last_seq), (1, far, far));
    assert_eq!(s.get(far).unwrap().unwrap().data, b"after");
    assert_eq!(s.get(3).unwrap(), None);
}

#[test]
fn a_torn_head_of_a_fresh_segment_is_rewritten() {
    let dir = TempDir::new("torn-head");
    let opts = small(200);
    let mut s = open(&dir.0, &opts);
    for i in 1..=6u64 {
        s.append("h", None, &payload(i), false, i).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let last = segments(&dir.0).pop().unwrap();
    let first: u64 = last.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    for keep in 0..17u64 {
        let f = fs::OpenOptions::new().write(true).open(&last).unwrap();
        f.set_len(keep).unwrap();
        drop(f);
        let (mut s, report) = Store::open(&dir.0, opts.clone()).unwrap();
        assert_eq!(report.cuts.len(), usize::from(keep > 0), "keep {keep}");
        assert_eq!(s.state().last_seq, first - 1);
        assert_eq!(s.append("h", None, b"again", false, 9).unwrap(), first);
        s.flush().unwrap();
        drop(s);
        let s = open(&dir.0, &opts);
        assert_eq!(s.get(first).unwrap().unwrap().data, b"again");
        assert_eq!(s.get(first - 1).unwrap().unwrap().data, payload(first - 1));
    }
}

/// What a key-value bucket with history 1 does to its store: each put
/// removes the subject's previous message.
struct Kv {
    live: std::collections::BTreeMap<u64, (String, Vec<u8>)>,
}

impl Kv {
    fn put(&mut self, s: &mut Store, subject: &str, data: &[u8]) -> u64 {
        if let Some(old) = s.last_seq_for_subject(subject) {
            assert!(s.remove(old).unwrap());
            self.live.remove(&old);
        }
        let seq = s.append(subject, None, data, false, 1).unwrap();
        self.live.insert(seq, (subject.to_string(), data.to_vec()));
        seq
    }

    /// The store shows exactly the live messages, none of the removed.
    fn check(&self, s: &Store, ctx: &str) {
        let st = s.state();
        assert_eq!(st.messages, self.live.len() as u64, "{ctx}: {st:?}");
        for q in 0..=st.last_seq + 1 {
            let got = s.get(q).unwrap().map(|m| (m.subject, m.data));
            assert_eq!(got.as_ref(), self.live.get(&q), "{ctx}: seq {q}");
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    segments(dir)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn compaction_frees_the_segments_a_cold_key_pins() {
    let dir = TempDir::new("compact-cold");
    let opts = small(16 << 10);
    let mut s = open(&dir.0, &opts);
    let mut kv = Kv {
        live: Default::default(),
    };
    kv.put(&mut s, "cold", b"written once");
    for i in 0..4000u64 {
        kv.put(&mut s, &format!("hot.{}", i % 10), &[i as u8; 128]);
        if i % 20 == 19 {
            s.flush().unwrap();
            while s.compact_step().unwrap() {}
        }
    }
    s.flush().unwrap();
    // 4000 puts of ~170 bytes fill 40 segments of 16 KiB; compaction keeps
    // the cold key and the hot keys' last values in one small file.
    assert!(s.segment_count() <= 3, "{} segments", s.segment_count());
    assert!(dir_bytes(&dir.0) <= 2 * (16 << 10), "{}", dir_bytes(&dir.0));
    kv.check(&s, "before restart");
    drop(s);
    for round in 0..2 {
        let s = open(&dir.0, &opts);
        kv.check(&s, &format!("reopen {round}"));
    }
}

/// Copies every file of `from` into a new directory.
fn copy_dir(from: &Path, tag: &str) -> TempDir {
    let to = TempDir::new(tag);
    for e in fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, to.0.join(p.file_name().unwrap())).unwrap();
    }
    to
}

/// A store where compaction must keep removal records: the first segment
/// stays mostly live (not worth rewriting) but holds messages removed
/// later, from segments that are worth rewriting.
fn store_needing_removals(dir: &Path, opts: &Options) -> (Store, Kv) {
    let mut s = open(dir, opts);
    let mut kv = Kv {
        live: Default::default(),
    };
    for i in 0..24u64 {
        kv.put(&mut s, &format!("keep.{i}"), &[b'k'; 100]);
    }
    let mut doomed: Vec<String> = (0..6).map(|i| format!("keep.{}", i * 4)).collect();
    for i in 0..300u64 {
        kv.put(&mut s, &format!("hot.{}", i % 4), &[i as u8; 100]);
        if i % 40 == 39 {
            if let Some(subj) = doomed.pop() {
                let q = s.last_seq_for_subject(&subj).unwrap();
                assert!(s.remove(q).unwrap());
                kv.live.remove(&q);
            }
        }
    }
    s.flush().unwrap();
    (s, kv)
}

#[test]
fn a_crash_at_every_compaction_step_recovers_exactly_the_live_messages() {
    let dir = TempDir::new("compact-crash");
    let opts = small(3000);
    // Index files for the sealed segments, as a store that was reopened has.
    drop(store_needing_removals(&dir.0, &opts).0);
    let (mut s, kv) = {
        let s = open(&dir.0, &opts);
        let (_, kv) = (0, rebuild_kv(&s));
        (s, kv)
    };
    kv.check(&s, "reopened");
    let before = s.segment_count();
    let mut snaps: Vec<(String, TempDir)> = Vec::new();
    let mut steps = 0;
    loop {
        let mut seen = |p: gombus::stream::store::Phase| {
            let tag = format!("step {steps} {p:?}");
            snaps.push((tag, copy_dir(&dir.0, "compact-crash-snap")));
        };
        if !s.compact_step_seen(&mut seen).unwrap() {
            break;
        }
        steps += 1;
    }
    assert!(steps >= 1, "nothing was compacted");
    assert!(
        s.segment_count() < before,
        "{} segments, {before} before",
        s.segment_count()
    );
    kv.check(&s, "after compaction");
    // A crash while the new file was written leaves a torn temp file.
    let (tag, written) = &snaps[0];
    assert!(tag.ends_with("Written"), "{tag}");
    let torn = copy_dir(&written.0, "compact-crash-torn");
    for e in fs::read_dir(&torn.0).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(".seg.tmp") {
            let len = fs::metadata(&p).unwrap().len();
            fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
    }
    snaps.push(("torn temp file".into(), torn));
    // A crash after the rename, with only some of the merged segments
    // deleted.
    let mut partial = Vec::new();
    for w in snaps.windows(2) {
        let ((t, renamed), (_, done)) = (&w[0], &w[1]);
        if !t.ends_with("Renamed") {
            continue;
        }
        let names = |d: &Path| -> Vec<_> {
            segments(d)
                .iter()
                .map(|p| p.file_name().unwrap().to_owned())
                .collect()
        };
        let kept = names(&done.0);
        let merged: Vec<_> = names(&renamed.0)
            .into_iter()
            .filter(|n| !kept.contains(n))
            .collect();
        if merged.len() >= 2 {
            let c = copy_dir(&renamed.0, "compact-crash-partial");
            fs::remove_file(c.0.join(&merged[0])).unwrap();
            partial.push(c);
        }
    }
    assert!(!partial.is_empty(), "no step merged segments");
    snaps.extend(
        partial
            .into_iter()
            .map(|d| ("partly deleted".to_string(), d)),
    );
    for (tag, snap) in &snaps {
        for round in 0..2 {
            let (s, report) = Store::open(&snap.0, opts.clone()).unwrap();
            assert!(report.cuts.is_empty(), "{tag}: {:?}", report.cuts);
            kv.check(&s, &format!("{tag}, open {round}"));
            assert_eq!(segments(&snap.0).len(), s.segment_count(), "{tag}");
            let tmp = fs::read_dir(&snap.0)
                .unwrap()
                .any(|e| e.unwrap().path().to_string_lossy().ends_with(".tmp"));
            assert!(!tmp, "{tag}: a temp file was left");
        }
    }
    drop(s);
    let s = open(&dir.0, &opts);
    kv.check(&s, "reopened after compaction");
}

/// The live messages of `s`, read back.
fn rebuild_kv(s: &Store) -> Kv {
    let mut live = std::collections::BTreeMap::new();
    for q in 0..=s.state().last_seq {
        if let Some(m) = s.get(q).unwrap() {
            live.insert(q, (m.subject, m.data));
        }
    }
    Kv { live }
}

/// The figures of docs/DESIGN.md: one cold key, then 200 000 puts of
/// 128 B over 10 hot keys (history 1) with 1 MiB segments, flushing every
/// 100 puts as an event loop turn would; one compaction step after each
/// flush (as a stream takes) unless `GOMBUS_COMPACT=0`. Prints segments, bytes on disk and the
/// process's resident memory. Run with
/// `cargo test --release --test store cold_key_figures -- --ignored --nocapture`.
#[test]
#[ignore]
fn cold_key_figures() {
    let compact = std::env::var("GOMBUS_COMPACT").map_or(true, |v| v != "0");
    let dir = TempDir::new("compact-figures");
    let opts = small(1 << 20);
    let mut s = open(&dir.0, &opts);
    let mut kv = Kv {
        live: Default::default(),
    };
    kv.put(&mut s, "kv.cold", b"written once");
    for i in 0..200_000u64 {
        kv.put(&mut s, &format!("kv.hot.{}", i % 10), &[b'v'; 128]);
        if i % 100 == 99 {
            s.flush().unwrap();
            if compact {
                s.compact_step().unwrap();
            }
        }
    }
    s.flush().unwrap();
    let rss = fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("VmRSS: ?")
        .to_string();
    eprintln!(
        "compaction {compact}: {} live, {} segments, {} bytes on disk, {} index bytes, {rss}",
        s.state().messages,
        s.segment_count(),
        dir_bytes(&dir.0),
        s.index_bytes()
    );
    drop(s);
    let s = open(&dir.0, &opts);
    kv.check(&s, "reopened");
    eprintln!("reopened: {} index bytes", s.index_bytes());
}

/// The index follows the live messages, not the seqs from the oldest to
/// the newest: a cold key and ever more puts of ten hot keys (each
/// removing the key's previous message) keep it under a bound that does
/// not grow with the puts; so does reopening, from the segments, from
/// their index files, and from a compacted file whose seqs skip.
#[test]
fn a_cold_key_does_not_grow_the_index() {
    // 24 bytes a seq would be 480 KB and 2.4 MB here.
    const INDEX_BYTES_MAX: usize = 128 << 10;
    for puts in [20_000u64, 100_000] {
        let dir = TempDir::new("index-cold");
        let opts = small(256 << 10);
        let mut s = open(&dir.0, &opts);
        let cold = s
            .append("kv.cold", None, b"written once", false, 1)
            .unwrap();
        let mut last = [0u64; 10];
        for i in 0..puts {
            let k = (i % 10) as usize;
            let seq = s
                .append(&format!("kv.hot.{k}"), None, b"v", false, 2)
                .unwrap();
            if last[k] != 0 {
                assert!(s.remove(last[k]).unwrap());
            }
            last[k] = seq;
        }
        s.flush().unwrap();
        let check = |s: &Store, ctx: &str| {
            let bytes = s.index_bytes();
            assert!(
                bytes <= INDEX_BYTES_MAX,
                "{ctx}, {puts} puts: {bytes} bytes"
            );
            assert_eq!(s.state().messages, 11, "{ctx}");
            assert_eq!(s.state().first_seq, cold, "{ctx}");
            assert_eq!(s.get(cold).unwrap().unwrap().data, b"written once", "{ctx}");
            assert_eq!(s.get(cold + 1).unwrap(), None, "{ctx}");
            assert_eq!(s.next_matching(cold + 1, |_| true), Some(last[0]), "{ctx}");
            for (k, &q) in last.iter().enumerate() {
                assert_eq!(s.last_seq_for_subject(&format!("kv.hot.{k}")), Some(q));
                assert_eq!(s.get(q).unwrap().unwrap().data, b"v", "{ctx}: seq {q}");
            }
        };
        check(&s, "written");
        drop(s);
        check(&open(&dir.0, &opts), "scanned");
        let mut s = open(&dir.0, &opts);
        check(&s, "from index files");
        while s.compact_step().unwrap() {}
        assert!(s.segment_count() <= 3, "{} segments", s.segment_count());
        drop(s);
        check(&open(&dir.0, &opts), "compacted");
    }
}

#[test]
fn a_skip_no_span_explains_is_still_refused_after_compaction() {
    use gombus::stream::segment::{self, MsgRef};
    let dir = TempDir::new("compact-skip");
    let opts = small(4 << 10);
    let mut s = open(&dir.0, &opts);
    let mut kv = Kv {
        live: Default::default(),
    };
    kv.put(&mut s, "cold", b"written once");
    for i in 0..600u64 {
        kv.put(&mut s, &format!("hot.{}", i % 3), &[b'h'; 100]);
        s.flush().unwrap();
        s.compact_step().unwrap();
    }
    assert!(s.segment_count() <= 3, "{} segments", s.segment_count());
    let far = s.state().last_seq + 1_000_000_000;
    drop(s);
    kv.check(&open(&dir.0, &opts), "compacted");
    let mut out = Vec::new();
    segment::put_head(&mut out, far);
    segment::put_msg(
        &mut out,
        &MsgRef {
            seq: far,
            time_ms: 1,
            subject: "x",
            headers: None,
            data: b"",
            binary: false,
        },
    );
    fs::write(dir.0.join(segment::file_name(far)), out).unwrap();
    match Store::open(&dir.0, opts) {
        Err(StoreError::Corrupt { why, .. }) => assert!(why.contains("beyond"), "{why}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a skip of a billion seqs was taken"),
    }
}
