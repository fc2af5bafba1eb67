//! The fsync thread: one per broker, shared by every stream's append-only
//! files (segments, and the meta event logs of consumer state). The Raft
//! log is not among them: the Raft thread fsyncs its own log before it
//! acts on it (`cluster/raft_log.rs`).
//!
//! Files are registered once ([`Syncer::register`] keeps a duplicate of
//! the descriptor). After writing to a file with write(2), its owner calls
//! [`Syncer::dirty`] and gets a [`Ticket`]: the number of the fsync round
//! that will cover everything written so far. The thread runs rounds one
//! after another; a round takes every file marked dirty since the previous
//! round started and fsyncs each once (group commit: every append made
//! while a round is in flight shares the next one). When a round ends the
//! thread publishes its number ([`Syncer::done`]) and wakes the event loop
//! through its `mio::Waker`; the loop then releases the acks whose ticket
//! is covered ([`Syncer::covered`]).
//!
//! Policies ([`SyncPolicy`]):
//! - `Always`: a round starts as soon as a file is dirty and no round is in
//!   flight; acks wait for their ticket. An acked message survives power
//!   loss.
//! - `Every(d)`: a round every `d` (if anything is dirty); acks go out
//!   right after write(2), so an acked message survives `kill -9` of the
//!   broker but the last `d` of them may be lost with power.
//! - `Never`: no thread, no fsync; every ticket is covered at once. Safe
//!   against `kill -9`, not against power loss.
//!
//! An fsync failure is sticky ([`Syncer::failure`]): after it nothing is
//! known about what reached the disk (the kernel may have dropped the dirty
//! pages), so the owner must stop acking and report it.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The number of an fsync round. Rounds are numbered from 1; ticket 0 is
/// covered from the start (nothing to wait for).
pub type Ticket = u64;

/// A registered file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey(u64);

/// When written data is fsynced, and so what an ack promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Group commit; acks wait for the fsync covering them (the default).
    Always,
    /// An fsync round every interval; acks go out after write(2).
    Every(Duration),
    /// Never fsync; acks go out after write(2).
    Never,
}

impl SyncPolicy {
    /// Whether an ack must wait until its ticket is covered.
    pub fn acks_wait(self) -> bool {
        matches!(self, SyncPolicy::Always)
    }
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncPolicy::Always => f.write_str("always"),
            SyncPolicy::Never => f.write_str("none"),
            SyncPolicy::Every(d) => {
                let ms = d.as_millis();
                if d.as_nanos() == ms * 1_000_000 {
                    write!(f, "{ms}ms")
                } else {
                    write!(f, "{}us", d.as_micros())
                }
            }
        }
    }
}

/// Shortest interval `-sync` accepts.
pub const SYNC_INTERVAL_MIN: Duration = Duration::from_millis(1);
/// Longest interval `-sync` accepts.
pub const SYNC_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// Parses `-sync`: `always`, `none`, or a duration such as `100ms`, `2s`,
/// `2500us` (1ms ..= 60s; a shorter interval would keep the thread busy
/// for nothing: `always` is the policy for syncing as soon as possible).
pub fn parse_policy(s: &str) -> Result<SyncPolicy, String> {
    let t = s.trim().to_ascii_lowercase();
    match t.as_str() {
        "always" => return Ok(SyncPolicy::Always),
        "none" | "never" => return Ok(SyncPolicy::Never),
        _ => {}
    }
    let bad = || format!("{s:?} is not a sync policy (use always, none or a duration like 100ms)");
    let digits = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let d = match &t[digits..] {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(bad()),
    };
    if d < SYNC_INTERVAL_MIN || d > SYNC_INTERVAL_MAX {
        return Err(format!("{s:?}: the interval must be between 1ms and 60s"));
    }
    Ok(SyncPolicy::Every(d))
}

struct Registered {
    file: Arc<File>,
    dirty: bool,
    /// Drop the descriptor once a round has covered its last write.
    retired: bool,
}

struct State {
    files: HashMap<FileKey, Registered>,
    next_key: u64,
    /// The round that will cover a write made now.
    open_round: Ticket,
    /// Something is dirty (saves a walk of `files`).
    any_dirty: bool,
    /// Run a round now, whatever the policy ([`Syncer::sync_now`]).
    force: bool,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// The thread waits on it for work.
    wake: Condvar,
    /// [`Syncer::wait`] waits on it for rounds.
    finished: Condvar,
    done: AtomicU64,
    failure: Mutex<Option<String>>,
    waker: Mutex<Option<Arc<mio::Waker>>>,
    rounds: AtomicU64,
    files_synced: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent
        // (every update is a single assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The broker's fsync thread and the registry of files it syncs.
pub struct Syncer {
    policy: SyncPolicy,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the thread (none for [`SyncPolicy::Never`]).
    pub fn start(policy: SyncPolicy) -> io::Result<Syncer> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                files: HashMap::new(),
                next_key: 1,
                open_round: 1,
                any_dirty: false,
                force: false,
                stop: false,
            }),
            wake: Condvar::new(),
            finished: Condvar::new(),
            done: AtomicU64::new(0),
            failure: Mutex::new(None),
            waker: Mutex::new(None),
            rounds: AtomicU64::new(0),
            files_synced: AtomicU64::new(0),
        });
        let thread = match policy {
            SyncPolicy::Never => None,
            _ => {
                let s = Arc::clone(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("fsync".into())
                        .spawn(move || run(&s, policy))?,
                )
            }
        };
        Ok(Syncer {
            policy,
            shared,
            thread,
        })
    }

    pub fn policy(&self) -> SyncPolicy {
        self.policy
    }

    /// The loop's waker, called after every round.
    pub fn set_waker(&self, waker: Arc<mio::Waker>) {
        *self.shared.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker);
    }

    /// Registers a file (a duplicate descriptor is kept until
    /// [`Syncer::retire`]).
    pub fn register(&self, file: &File) -> io::Result<FileKey> {
        let dup = file.try_clone()?;
        let mut st = self.shared.lock();
        let key = FileKey(st.next_key);
        st.next_key += 1;
        st.files.insert(
            key,
            Registered {
                file: Arc::new(dup),
                dirty: false,
                retired: false,
            },
        );
        Ok(key)
    }

    /// Says that `key` was written: the returned ticket is covered once an
    /// fsync of it that started after this call has completed. Unknown keys
    /// (already retired and dropped) get ticket 0.
    pub fn dirty(&self, key: FileKey) -> Ticket {
        if self.policy == SyncPolicy::Never {
            return 0;
        }
        let mut st = self.shared.lock();
        let round = st.open_round;
        let Some(e) = st.files.get_mut(&key) else {
            return 0;
        };
        e.dirty = true;
        let first = !st.any_dirty;
        st.any_dirty = true;
        drop(st);
        if first && self.policy == SyncPolicy::Always {
            self.shared.wake.notify_one();
        }
        round
    }

    /// The file will not be written again: its descriptor is dropped after
    /// the next round (at once if it is clean).
    pub fn retire(&self, key: FileKey) {
        let mut st = self.shared.lock();
        match st.files.get_mut(&key) {
            Some(e) if e.dirty => e.retired = true,
            Some(_) => {
                st.files.remove(&key);
            }
            None => {}
        }
    }

    /// Forgets a file at once, without syncing what is pending (the file
    /// is being deleted).
    pub fn forget(&self, key: FileKey) {
        self.shared.lock().files.remove(&key);
    }

    /// The last round that completed (every ticket up to it is covered).
    pub fn done(&self) -> Ticket {
        if self.policy == SyncPolicy::Never {
            return Ticket::MAX;
        }
        self.shared.done.load(Ordering::Acquire)
    }

    /// Whether the fsync that `ticket` waits for has completed.
    pub fn covered(&self, ticket: Ticket) -> bool {
        ticket <= self.done()
    }

    /// The first fsync error, if any (sticky).
    pub fn failure(&self) -> Option<String> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Rounds run and file fsyncs made so far (for metrics).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.rounds.load(Ordering::Relaxed),
            self.shared.files_synced.load(Ordering::Relaxed),
        )
    }

    /// Blocks until `ticket` is covered or the syncer failed (for startup,
    /// shutdown and tests; never on the event loop).
    pub fn wait(&self, ticket: Ticket) -> Result<(), String> {
        self.wait_until(ticket, None).map(|_| ())
    }

    /// Starts a round now for everything written so far, whatever the
    /// policy (an interval policy does not wait for its interval), and
    /// blocks until every ticket handed out so far is covered: `Ok(true)`;
    /// `Ok(false)` if `within` passed first (the round goes on, and a
    /// later [`Syncer::covered`] sees it); `Err` on an fsync failure.
    /// Under `Never` nothing is fsynced and it returns `Ok(true)` at once.
    /// For shutdown; never on the event loop's normal path.
    pub fn sync_now(&self, within: Duration) -> Result<bool, String> {
        if self.policy == SyncPolicy::Never {
            return Ok(true);
        }
        let deadline = Instant::now() + within;
        let target = {
            let mut st = self.shared.lock();
            if st.any_dirty {
                st.force = true;
                st.open_round
            } else {
                // Every write so far is in a round already taken (running
                // or done).
                st.open_round - 1
            }
        };
        self.shared.wake.notify_all();
        self.wait_until(target, Some(deadline))
    }

    /// [`Syncer::wait`] with an optional deadline: `Ok(false)` once it
    /// passes with `ticket` still uncovered.
    fn wait_until(&self, ticket: Ticket, deadline: Option<Instant>) -> Result<bool, String> {
        let mut st = self.shared.lock();
        loop {
            if let Some(f) = self.failure() {
                return Err(f);
            }
            if self.covered(ticket) {
                return Ok(true);
            }
            if st.stop {
                return Err("syncer stopped".into());
            }
            let mut step = Duration::from_millis(50);
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                step = step.min(left);
            }
            st = self
                .shared
                .finished
                .wait_timeout(st, step)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        self.shared.finished.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: wait for work (or the interval), run a round, publish it.
fn run(shared: &Shared, policy: SyncPolicy) {
    loop {
        let (round, files, stop) = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.force || (st.any_dirty && policy == SyncPolicy::Always) {
                    break;
                }
                match policy {
                    SyncPolicy::Every(d) => {
                        st = shared
                            .wake
                            .wait_timeout(st, d)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        break;
                    }
                    _ => {
                        st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                }
            }
            st.force = false;
            let round = st.open_round;
            let mut files = Vec::new();
            if st.any_dirty {
                st.open_round += 1;
                st.any_dirty = false;
                st.files.retain(|_, e| {
                    if e.dirty {
                        e.dirty = false;
                        files.push(Arc::clone(&e.file));
                    }
                    !e.retired || e.dirty
                });
            }
            (round, files, st.stop)
        };
        if !files.is_empty() {
            sync_round(shared, round, &files);
        }
        if stop {
            return;
        }
    }
}

fn sync_round(shared: &Shared, round: Ticket, files: &[Arc<File>]) {
    for f in files {
        if let Err(e) = f.sync_data() {
            let mut fail = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
            if fail.is_none() {
                *fail = Some(format!("fsync failed: {e}"));
            }
        }
    }
    let failed = shared
        .failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some();
    shared.rounds.fetch_add(1, Ordering::Relaxed);
    shared
        .files_synced
        .fetch_add(files.len() as u64, Ordering::Relaxed);
    {
        // Under the lock, so a `wait` that just found the ticket uncovered
        // is already waiting when the notification comes.
        let _st = shared.lock();
        if !failed {
            shared.done.store(round, Ordering::Release);
        }
        shared.finished.notify_all();
    }
    let waker = shared
        .waker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if let Some(w) = waker {
        let _ = w.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print() {
        assert_eq!(parse_policy("always"), Ok(SyncPolicy::Always));
        assert_eq!(parse_policy(" NONE "), Ok(SyncPolicy::Never));
        assert_eq!(
            parse_policy("100ms"),
            Ok(SyncPolicy::Every(Duration::from_millis(100)))
        );
        assert_eq!(
            parse_policy("2s"),
            Ok(SyncPolicy::Every(Duration::from_secs(2)))
        );
        assert_eq!(
            parse_policy("2500us"),
            Ok(SyncPolicy::Every(Duration::from_micros(2500)))
        );
        for bad in [
            "", "ms", "0ms", "999us", "61s", "1.5s", "10", "-1ms", "fast",
        ] {
            assert!(parse_policy(bad).is_err(), "{bad:?}");
        }
        for s in ["always", "none", "100ms", "2500us", "2000ms"] {
            let p = parse_policy(s).unwrap();
            assert_eq!(parse_policy(&p.to_string()), Ok(p), "{s}");
        }
        assert!(SyncPolicy::Always.acks_wait());
        assert!(!SyncPolicy::Never.acks_wait());
    }

    fn temp_file(tag: &str) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "gombus-sync-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let f = File::create(&path).unwrap();
        (path, f)
    }

    #[test]
    fn always_covers_each_ticket_and_groups_writes() {
        let s = Syncer::start(SyncPolicy::Always).unwrap();
        let (path, mut f) = temp_file("always");
        let key = s.register(&f).unwrap();
        let mut last = 0;
        for i in 0..50u8 {
            use std::io::Write;
            f.write_all(&[i; 64]).unwrap();
            let t = s.dirty(key);
            assert!(t >= last, "tickets never go back");
            last = t;
        }
        s.wait(last).unwrap();
        assert!(s.covered(last));
        let (rounds, _) = s.counts();
        assert!((1..=50).contains(&rounds), "rounds {rounds}");
        // Nothing dirty: no new round, the open ticket stays uncovered.
        assert!(!s.covered(last + 1));
        s.retire(key);
        drop(s);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn interval_policy_syncs_on_its_own() {
        let s = Syncer::start(SyncPolicy::Every(Duration::from_millis(5))).unwrap();
        let (path, f) = temp_file("every");
        let key = s.register(&f).unwrap();
        let t = s.dirty(key);
        assert!(!s.policy().acks_wait());
        s.wait(t).unwrap();
        assert!(s.done() >= t);
        drop(s);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn sync_now_runs_a_round_without_waiting_for_the_interval() {
        // An interval far longer than the test may take: only a forced
        // round can cover the write in time.
        let s = Syncer::start(SyncPolicy::Every(SYNC_INTERVAL_MAX)).unwrap();
        let (path, f) = temp_file("now");
        let key = s.register(&f).unwrap();
        // Nothing written yet: nothing to wait for.
        assert_eq!(s.sync_now(Duration::ZERO), Ok(true));
        let t = s.dirty(key);
        assert!(!s.covered(t));
        let t0 = Instant::now();
        assert_eq!(s.sync_now(Duration::from_secs(10)), Ok(true));
        assert!(s.covered(t));
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_eq!(s.counts(), (1, 1));
        // Nothing written since: nothing to wait for, no new round.
        assert_eq!(s.sync_now(Duration::ZERO), Ok(true));
        assert_eq!(s.counts(), (1, 1));
        drop(s);
        // Under `none` there is no thread and nothing to wait for.
        let n = Syncer::start(SyncPolicy::Never).unwrap();
        let k = n.register(&f).unwrap();
        assert_eq!(n.dirty(k), 0);
        assert_eq!(n.sync_now(Duration::ZERO), Ok(true));
        assert_eq!(n.counts(), (0, 0));
        drop(n);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn one_round_covers_every_dirty_file_and_retired_files_are_dropped() {
        let s = Syncer::start(SyncPolicy::Always).unwrap();
        let (pa, fa) = temp_file("multi-a");
        let (pb, fb) = temp_file("multi-b");
        let a = s.register(&fa).unwrap();
        let b = s.register(&fb).unwrap();
        let ta = s.dirty(a);
        let tb = s.dirty(b);
        s.retire(a);
        s.wait(ta.max(tb)).unwrap();
        assert!(s.covered(ta) && s.covered(tb));
        let (_, files) = s.counts();
        assert!(files >= 2, "both files fsynced: {files}");
        // `a` was retired: once its last round ran it is forgotten, and a
        // write reported for it has nothing to wait for.
        assert_eq!(s.dirty(a), 0);
        let tb2 = s.dirty(b);
        assert!(tb2 > 0);
        s.wait(tb2).unwrap();
        s.forget(b);
        assert_eq!(s.dirty(b), 0);
        assert_eq!(s.failure(), None);
        drop(s);
        std::fs::remove_file(pa).unwrap();
        std::fs::remove_file(pb).unwrap();
    }

    #[test]
    fn the_waker_is_called_after_a_round() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(7)).unwrap());
        let s = Syncer::start(SyncPolicy::Always).unwrap();
        s.set_waker(waker);
        let (path, f) = temp_file("waker");
        let key = s.register(&f).unwrap();
        let t = s.dirty(key);
        let mut events = mio::Events::with_capacity(4);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            assert!(std::time::Instant::now() < deadline, "no wake within 10 s");
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            if events.iter().any(|e| e.token() == mio::Token(7)) {
                break;
            }
        }
        // The round is published before the loop is woken.
        assert!(s.covered(t));
        drop(s);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn never_covers_everything() {
        let s = Syncer::start(SyncPolicy::Never).unwrap();
        let (path, f) = temp_file("never");
        let key = s.register(&f).unwrap();
        let t = s.dirty(key);
        assert!(s.covered(t));
        assert_eq!(s.counts(), (0, 0));
        drop(s);
        std::fs::remove_file(path).unwrap();
    }
}
