//! A writer process killed with SIGKILL loses nothing it reported as
//! written: every message appended before a `flush` returned (and, under
//! `-sync=always`, before its ticket was covered) is there after a reopen,
//! under each sync policy. The writer is this test binary run again in a
//! child mode.

mod support;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gombus::storage::sync::{parse_policy, Syncer};
use gombus::stream::store::{Options, Store};
use support::TempDir;

const CHILD_DIR: &str = "GOMBUS_STORE_KILL_DIR";
const CHILD_POLICY: &str = "GOMBUS_STORE_KILL_POLICY";

fn payload(seq: u64) -> Vec<u8> {
    let n = (seq * 37 % 300) as usize;
    (0..n).map(|i| (seq as usize + i) as u8).collect()
}

fn subject(seq: u64) -> String {
    format!("kill.{}", seq % 5)
}

/// The child: appends forever in batches, printing the last seq each time
/// a batch is written (and fsynced when the policy says acks wait).
fn child(dir: &Path, policy: &str) {
    let policy = parse_policy(policy).expect("policy");
    let syncer = Arc::new(Syncer::start(policy).expect("syncer"));
    let opts = Options {
        segment_bytes: 64 << 10,
        syncer: Some(Arc::clone(&syncer)),
        ..Options::default()
    };
    let (mut s, _) = Store::open(dir, opts).expect("open");
    let mut out = std::io::stdout().lock();
    let mut batch = 1;
    loop {
        let mut last = 0;
        for _ in 0..batch {
            let seq = s.state().last_seq + 1;
            last = s
                .append(&subject(seq), None, &payload(seq), false, seq)
                .expect("append");
            assert_eq!(last, seq);
        }
        let t = s.flush().expect("flush");
        if policy.acks_wait() {
            syncer.wait(t).expect("fsync");
        }
        writeln!(out, "acked {last}").expect("stdout");
        out.flush().expect("stdout");
        batch = batch % 40 + 1;
    }
}

/// Kills the child on drop, whatever happens in the test.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kill_and_check(policy: &str) {
    let dir = TempDir::new(&format!("store-kill-{policy}"));
    let exe = std::env::current_exe().unwrap();
    let mut child = Killed(
        Command::new(exe)
            .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, &dir.0)
            .env(CHILD_POLICY, policy)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Some(n) = line.strip_prefix("acked ") {
                if tx.send(n.parse::<u64>().unwrap()).is_err() {
                    return;
                }
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut acked = 0;
    while acked < 3000 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{policy}: only {acked} acked in 30 s");
        if let Ok(n) = rx.recv_timeout(left) {
            acked = n;
        }
    }
    // SIGKILL while the child keeps appending.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    while let Ok(n) = rx.try_recv() {
        acked = acked.max(n);
    }
    drop(child);

    let (s, report) = Store::open(&dir.0, Options::default()).unwrap();
    // SIGKILL can stop a write(2) of several pages part-way (the kernel
    // checks for a fatal signal between pages), so the newest segment may
    // end in a torn record, cut at reopen; nothing else may be cut, and
    // what was acked is checked below.
    assert!(report.cuts.len() <= 1, "{policy}: {:?}", report.cuts);
    if let Some(cut) = report.cuts.first() {
        let newest = fs::read_dir(&dir.0)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .max()
            .expect("a segment");
        assert_eq!(cut.file, newest, "{policy}: a cut before the tail: {cut}");
    }
    let st = s.state();
    assert!(st.last_seq >= acked, "{policy}: {acked} acked, {st:?}");
    for seq in 1..=st.last_seq {
        let m = s.get(seq).unwrap().unwrap();
        assert_eq!(m.data, payload(seq), "{policy}: seq {seq}");
        assert_eq!(m.subject, subject(seq));
    }
}

#[test]
fn child_writer() {
    // Only does something when started by `kill_and_check`.
    if let (Ok(dir), Ok(policy)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_POLICY)) {
        child(Path::new(&dir), &policy);
    }
}

#[test]
fn kill_9_loses_no_acked_message_sync_always() {
    kill_and_check("always");
}

#[test]
fn kill_9_loses_no_acked_message_sync_interval() {
    kill_and_check("20ms");
}

#[test]
fn kill_9_loses_no_acked_message_sync_none() {
    kill_and_check("none");
}
