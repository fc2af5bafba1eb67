//! A replica of a replicated stream catching up to a leader's small
//! snapshot by ranges of messages, both ends, as pure bookkeeping: the
//! member's [`CatchUp`] (what it asks for next, what an answer does to
//! its replica, when it is whole) and the leader's [`Sources`] (the
//! states it froze for its last snapshots, and what it answers from
//! them). The caller carries the requests and answers (the broker over
//! the peer links' `cluster.catchup`, the stream simulation over its
//! lossy network) and brings the clock.
//!
//! One request per catch-up is in flight at a time, for at most the
//! caller's batch size, so the bytes in flight are bounded. A request not
//! answered within [`Pace::call_wait`] is made again; a refused or failed
//! one waits [`Pace::retry`]. An answer is taken only if it answers the
//! request in flight (its tag), so a late or duplicated answer changes
//! nothing. The leader answers from the state frozen for that snapshot
//! (index copy and payload files held open), so its compacting again does
//! not disturb a catch-up: only once it dropped that state (it keeps
//! [`FROZEN_KEPT`]) is the member refused, and the leader takes a new
//! snapshot, which its core sends; the member rebases onto it and goes on
//! from what it holds.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::replica::{Frozen, Replica, Target};

/// Snapshots a node keeps to serve members catching up from them.
pub const FROZEN_KEPT: usize = 2;

/// Most bytes of entries past the snapshot a catch-up lets its core
/// commit before it gives up ([`Next::Lost`]): they wait in the core's
/// log, in memory, until the replica is whole and they are applied.
pub const SKIPPED_BYTES_MAX: u64 = 32 << 20;

/// How long the member waits on the leader.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// A request unanswered this long is made again.
    pub call_wait: Duration,
    /// After a refusal or a failed request, the next waits this long.
    pub retry: Duration,
    /// A leader refusing for want of a state takes a new snapshot at most
    /// this often.
    pub forced_every: Duration,
}

/// What the member does next ([`CatchUp::next`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Entries past the snapshot were committed meanwhile (a leader whose
    /// log covers the snapshot fed the core) and cannot be applied again
    /// from the core's log: this member leads (it has no one to fetch
    /// from), or they are more than [`SKIPPED_BYTES_MAX`]. The group must
    /// start again here without its log and be sent a fresh snapshot. (A
    /// leader that no longer holds the snapshot's state answers with a
    /// later state it holds instead, [`Answer::Newer`]: the newer
    /// snapshot its core sends is not one this core, already past it,
    /// takes.)
    Lost,
    /// The replica holds exactly what the snapshot names, its files
    /// fsynced: the core may take the snapshot at `index`. `replay`: the
    /// core committed entries past `index` meanwhile, which were not
    /// applied; it hands them over again from its log.
    Whole { index: u64, replay: bool },
    /// What it held disagreed with the snapshot: it was emptied, and asks
    /// again from the start.
    StartedOver,
    /// Ask the leader for the records after `after` of its state at
    /// `index`; then [`CatchUp::asked`].
    Ask { index: u64, after: u64 },
    /// A request is in flight, or a retry is not due yet.
    Wait,
}

/// What the leader answered, as the member reads it.
#[derive(Debug)]
pub enum Answer<'a> {
    /// Framed records (as [`Frozen::records_after`] gives them) of the
    /// state at `index`.
    Records { index: u64, recs: &'a [u8] },
    /// Refused for want of the state at the catch-up's index, with the
    /// small snapshot `small` of a later state at `index` that the leader
    /// holds instead.
    Newer { index: u64, small: &'a [u8] },
    /// Refused (no such state any more, not the leader) or failed.
    Refused,
}

/// A replica fetching what a snapshot names from the group's leader.
#[derive(Debug)]
pub struct CatchUp {
    /// The snapshot's index: the core takes it once the replica is whole.
    pub index: u64,
    target: Target,
    /// The request in flight (its tag) and when it was made.
    asked: Option<(u64, Instant)>,
    /// Not asked again before then.
    retry_at: Option<Instant>,
    /// When it began.
    pub since: Instant,
    /// Record bytes received.
    pub received: u64,
    /// The last entry the core committed meanwhile (it is skipped).
    skipped_through: u64,
    /// The bytes of those entries past the snapshot.
    skipped_bytes: u64,
}

impl CatchUp {
    /// Catching up to the snapshot at `index`, whose state the replica
    /// took (`Replica::rebase` or `Replica::restore_files` gave `target`).
    pub fn new(index: u64, target: Target, now: Instant) -> CatchUp {
        CatchUp {
            index,
            target,
            asked: None,
            retry_at: None,
            since: now,
            received: 0,
            skipped_through: 0,
            skipped_bytes: 0,
        }
    }

    /// The core committed the entry at `index`, of `bytes`, during the
    /// catch-up (it is not applied): past the snapshot, it is to be
    /// applied again once the replica is whole.
    pub fn skipped(&mut self, index: u64, bytes: usize) {
        self.skipped_through = self.skipped_through.max(index);
        if index > self.index {
            self.skipped_bytes += bytes as u64;
        }
    }

    /// Whether the core committed entries past the snapshot meanwhile.
    fn is_past(&self) -> bool {
        self.skipped_through > self.index
    }

    /// Whether `tag` is the request in flight.
    pub fn waits_on(&self, tag: u64) -> bool {
        self.asked.is_some_and(|(t, _)| t == tag)
    }

    /// The next step for `replica`, which took this catch-up's snapshot;
    /// `leads`: this member leads the group. Whole: its files are fsynced
    /// first (an error is returned, and the step is tried again next
    /// time).
    pub fn next(
        &mut self,
        replica: &mut Replica,
        leads: bool,
        now: Instant,
        pace: &Pace,
    ) -> io::Result<Next> {
        let past = self.is_past();
        if past && (leads || self.skipped_bytes > SKIPPED_BYTES_MAX) {
            return Ok(Next::Lost);
        }
        let held = replica.held_through();
        if !self.target.wants_after(held) {
            if !replica.is_whole(&self.target) {
                replica.start_over();
                self.asked = None;
                return Ok(Next::StartedOver);
            }
            replica.sync()?;
            return Ok(Next::Whole {
                index: self.index,
                replay: past,
            });
        }
        let waiting = self
            .asked
            .is_some_and(|(_, at)| now.saturating_duration_since(at) < pace.call_wait);
        if waiting || self.retry_at.is_some_and(|t| now < t) {
            return Ok(Next::Wait);
        }
        Ok(Next::Ask {
            index: self.index,
            after: held,
        })
    }

    /// The request [`Next::Ask`] asked for was made under `tag`, or could
    /// not be made (`None`: tried again after [`Pace::retry`]).
    pub fn asked(&mut self, tag: Option<u64>, now: Instant, pace: &Pace) {
        self.asked = tag.map(|t| (t, now));
        self.retry_at = match tag {
            Some(_) => None,
            None => Some(now + pace.retry),
        };
    }

    /// The answer to the request made under `tag`, taken into `replica`.
    /// Returns false if it answers no request in flight (late, repeated,
    /// or of an earlier catch-up): nothing changed. Records that do not
    /// fit (damaged, not the ones wanted) make the replica start over.
    pub fn answered(
        &mut self,
        replica: &mut Replica,
        tag: u64,
        answer: Answer<'_>,
        now: Instant,
        pace: &Pace,
    ) -> Result<bool, super::replica::Malformed> {
        if !self.waits_on(tag) {
            return Ok(false);
        }
        self.asked = None;
        let recs = match answer {
            Answer::Records { index, recs } if index == self.index => recs,
            Answer::Newer { index, small } if index > self.index && self.is_past() => {
                // The core committed past this snapshot, so the newer one
                // the leader's core sends would not be held for it: the
                // replica goes on from the later state instead. What the
                // core committed up to `index` is in that state.
                self.target = replica.rebase(&mut &small[..], small.len() as u64, now)?;
                self.index = index;
                self.retry_at = None;
                // Entries skipped through the new state are in it. Their
                // bytes are summed, not kept one by one, so they are
                // forgotten only when the state covers all of them (else
                // the sum stays an upper bound).
                if self.skipped_through <= index {
                    self.skipped_bytes = 0;
                }
                return Ok(true);
            }
            _ => {
                self.retry_at = Some(now + pace.retry);
                return Ok(true);
            }
        };
        self.received += recs.len() as u64;
        if let Err(e) = replica.take_records(recs, &self.target) {
            replica.start_over();
            return Err(e);
        }
        Ok(true)
    }
}

/// What a leader answers a member asking for records.
#[derive(Debug)]
pub enum Served {
    /// The framed records after `after`, and the seq they cover through.
    Records(Vec<u8>, u64),
    /// This node no longer holds that snapshot's state. `snapshot_now`:
    /// it is to take a new snapshot (which its core sends in turn).
    /// `newer`: the index and small snapshot of the latest later state it
    /// holds, for a member whose core is already past the one it asked
    /// for ([`Answer::Newer`]).
    Gone {
        snapshot_now: bool,
        newer: Option<(u64, Vec<u8>)>,
    },
}

/// A node's latest frozen states of one replica, to serve members
/// catching up from them.
#[derive(Default)]
pub struct Sources {
    kept: VecDeque<(u64, Arc<Frozen>)>,
    /// When a snapshot was last taken unasked for a member.
    forced_at: Option<Instant>,
}

impl Sources {
    /// Keeps the state frozen for the snapshot at `index`, dropping the
    /// oldest beyond [`FROZEN_KEPT`].
    pub fn keep(&mut self, index: u64, frozen: Arc<Frozen>) {
        self.kept.retain(|(i, _)| *i != index);
        self.kept.push_back((index, frozen));
        while self.kept.len() > FROZEN_KEPT {
            self.kept.pop_front();
        }
    }

    /// The state frozen at `index`, if kept.
    pub fn at(&self, index: u64) -> Option<Arc<Frozen>> {
        (self.kept.iter())
            .find(|(i, _)| *i == index)
            .map(|(_, f)| f.clone())
    }

    /// The answer to a member asking for the records after `after` of the
    /// state at `index`, at most `max` bytes (at least one record). This
    /// node has applied through `applied`. Without that state it takes a
    /// new snapshot if it has applied that far and did not force one
    /// within [`Pace::forced_every`].
    pub fn serve(
        &mut self,
        index: u64,
        after: u64,
        max: usize,
        applied: u64,
        now: Instant,
        pace: &Pace,
    ) -> io::Result<Served> {
        let Some(frozen) = self.at(index) else {
            let due = self
                .forced_at
                .is_none_or(|t| now.saturating_duration_since(t) >= pace.forced_every);
            let snapshot_now = due && applied >= index;
            if snapshot_now {
                self.forced_at = Some(now);
            }
            let newer = (self.kept.iter().rev())
                .find(|(i, _)| *i > index)
                .map(|(i, f)| (*i, f.small().to_vec()));
            return Ok(Served::Gone {
                snapshot_now,
                newer,
            });
        };
        let (recs, through) = frozen.records_after(after, max)?;
        Ok(Served::Records(recs, through))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::read_config;
    use crate::stream::payloads::Payloads;
    use crate::stream::replica::{Op, Publish};

    const PACE: Pace = Pace {
        call_wait: Duration::from_millis(300),
        retry: Duration::from_millis(100),
        forced_every: Duration::from_secs(2),
    };

    fn temp_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "gombus-catchup-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// A leader's replica with `n` messages on files, frozen: its small
    /// snapshot and the state.
    fn leader(n: u64, now: Instant) -> (Vec<u8>, Arc<Frozen>, std::path::PathBuf) {
        let v = serde_json::json!({"name":"S","subjects":["a.>"]});
        let serde_json::Value::Object(m) = v else {
            unreachable!()
        };
        let mut cfg: crate::protocol::stream_messages::StreamConfig = read_config(m).unwrap();
        cfg.validate().unwrap();
        let dir = temp_dir();
        let mut r = Replica::with_payloads(cfg, Payloads::open(&dir, 4_096).unwrap());
        for i in 0..n {
            let op = Op::Publish(Publish {
                subject: "a.b".into(),
                headers: None,
                data: format!("\"{}\"", "q".repeat(100 + i as usize % 30)).into_bytes(),
                binary: false,
                time_ms: i,
            });
            r.apply(&[op], now);
        }
        let frozen = r.freeze().unwrap();
        let mut small = Vec::new();
        frozen.store(&mut small).unwrap();
        (small, Arc::new(frozen), dir)
    }

    /// An empty member that took the snapshot `small` (at index 40).
    fn member(small: &[u8], now: Instant) -> (Replica, CatchUp, std::path::PathBuf) {
        let dir = temp_dir();
        let (rep, target) =
            Replica::restore_files(&mut &small[..], small.len() as u64, now, &dir, 4_096, None)
                .unwrap();
        (rep, CatchUp::new(40, target, now), dir)
    }

    /// Over a link that loses one request in three and repeats every
    /// answer, the member asks one batch at a time, asks again when an
    /// answer is late, takes each answer once, and ends whole, its
    /// snapshot served by a leader that compacted twice since.
    #[test]
    fn a_member_catches_up_over_a_lossy_link_one_batch_at_a_time() {
        let t0 = Instant::now();
        let (small, frozen, ldir) = leader(50, t0);
        let mut sources = Sources::default();
        sources.keep(40, frozen.clone());
        let (mut rep, mut cu, mdir) = member(&small, t0);
        // The leader compacts again: the state at 40 is still kept.
        sources.keep(45, frozen.clone());
        let mut now = t0;
        let (mut tag, mut asks, mut lost, mut late) = (0, 0, 0, 0);
        let whole = loop {
            now += Duration::from_millis(10);
            match cu.next(&mut rep, false, now, &PACE).unwrap() {
                Next::Ask { index, after } => {
                    asks += 1;
                    tag += 1;
                    cu.asked(Some(tag), now, &PACE);
                    assert_eq!(index, 40);
                    if asks % 3 == 0 {
                        lost += 1;
                        continue;
                    }
                    let Served::Records(recs, _) =
                        sources.serve(index, after, 1_000, 45, now, &PACE).unwrap()
                    else {
                        panic!("the state at 40 is kept");
                    };
                    assert!(recs.len() <= 1_000 + 200, "one bounded batch");
                    let answer = || Answer::Records { index, recs: &recs };
                    assert!(cu.answered(&mut rep, tag, answer(), now, &PACE).unwrap());
                    // The repeated answer changes nothing.
                    assert!(!cu.answered(&mut rep, tag, answer(), now, &PACE).unwrap());
                    // Nor does the answer to a request given up on.
                    if tag > 1 {
                        late += 1;
                        assert!(!cu
                            .answered(&mut rep, tag - 1, answer(), now, &PACE)
                            .unwrap());
                    }
                }
                Next::Wait => {}
                Next::Whole {
                    index,
                    replay: false,
                } => break index,
                other => panic!("{other:?}"),
            }
            assert!(now < t0 + Duration::from_secs(60), "never whole");
        };
        assert_eq!(whole, 40);
        assert!(lost > 0 && late > 0);
        assert_eq!(rep.messages(), 50);
        assert!(cu.received > 0);
        let _ = std::fs::remove_dir_all(ldir);
        let _ = std::fs::remove_dir_all(mdir);
    }

    /// A request in flight holds the next one back until it is answered
    /// or `call_wait` passes; a refusal holds it back for `retry`.
    #[test]
    fn one_request_at_a_time_and_retries_after_a_wait() {
        let t0 = Instant::now();
        let (small, _, ldir) = leader(5, t0);
        let (mut rep, mut cu, mdir) = member(&small, t0);
        assert_eq!(
            cu.next(&mut rep, false, t0, &PACE).unwrap(),
            Next::Ask {
                index: 40,
                after: 0
            }
        );
        cu.asked(Some(7), t0, &PACE);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            cu.next(&mut rep, false, at(299), &PACE).unwrap(),
            Next::Wait
        );
        assert!(matches!(
            cu.next(&mut rep, false, at(300), &PACE).unwrap(),
            Next::Ask { .. }
        ));
        cu.asked(Some(8), at(300), &PACE);
        assert!(cu
            .answered(&mut rep, 8, Answer::Refused, at(310), &PACE)
            .unwrap());
        assert_eq!(
            cu.next(&mut rep, false, at(409), &PACE).unwrap(),
            Next::Wait
        );
        assert!(matches!(
            cu.next(&mut rep, false, at(410), &PACE).unwrap(),
            Next::Ask { .. }
        ));
        // A request that could not be sent waits too.
        cu.asked(None, at(410), &PACE);
        assert_eq!(
            cu.next(&mut rep, false, at(500), &PACE).unwrap(),
            Next::Wait
        );
        // Records of another snapshot's state count as a refusal.
        cu.asked(Some(9), at(510), &PACE);
        let recs = [0u8; 0];
        let other = Answer::Records {
            index: 41,
            recs: &recs,
        };
        assert!(cu.answered(&mut rep, 9, other, at(510), &PACE).unwrap());
        assert_eq!(rep.messages(), 0);
        assert_eq!(
            cu.next(&mut rep, false, at(600), &PACE).unwrap(),
            Next::Wait
        );
        let _ = std::fs::remove_dir_all(ldir);
        let _ = std::fs::remove_dir_all(mdir);
    }

    /// Entries committed past the snapshot during the catch-up are
    /// applied again once the member is whole (`replay`), unless the
    /// member leads or they grow past `SKIPPED_BYTES_MAX`: then it is
    /// `Lost`. Entries at or below the snapshot count for neither.
    #[test]
    fn entries_past_the_snapshot_are_replayed_or_lose_the_catch_up() {
        let t0 = Instant::now();
        let (small, frozen, ldir) = leader(5, t0);
        let (mut rep, mut cu, mdir) = member(&small, t0);
        cu.skipped(39, 1 << 30);
        cu.skipped(40, 1 << 30);
        let Next::Ask { index, after } = cu.next(&mut rep, false, t0, &PACE).unwrap() else {
            panic!("asks");
        };
        cu.asked(Some(1), t0, &PACE);
        cu.skipped(41, 100);
        // A follower goes on; one that leads now has no one to ask.
        assert_eq!(cu.next(&mut rep, true, t0, &PACE).unwrap(), Next::Lost);
        assert_eq!(cu.next(&mut rep, false, t0, &PACE).unwrap(), Next::Wait);
        let (recs, _) = frozen.records_after(after, 1 << 20).unwrap();
        let answer = Answer::Records { index, recs: &recs };
        assert!(cu.answered(&mut rep, 1, answer, t0, &PACE).unwrap());
        assert_eq!(
            cu.next(&mut rep, false, t0, &PACE).unwrap(),
            Next::Whole {
                index: 40,
                replay: true
            }
        );
        // Too much waiting in the core's log: lost, whole or not.
        cu.skipped(42, SKIPPED_BYTES_MAX as usize);
        assert_eq!(cu.next(&mut rep, false, t0, &PACE).unwrap(), Next::Lost);
        let _ = std::fs::remove_dir_all(ldir);
        let _ = std::fs::remove_dir_all(mdir);
    }

    /// A refusal that offers a later state is taken only by a member
    /// whose core is past the snapshot it asked for: it rebases onto that
    /// state and asks for it from then on.
    #[test]
    fn a_member_past_its_snapshot_goes_on_from_a_later_state() {
        let t0 = Instant::now();
        let (small, _, ldir) = leader(5, t0);
        let (later, frozen, ldir2) = leader(8, t0);
        let (mut rep, mut cu, mdir) = member(&small, t0);
        let offer = || Answer::Newer {
            index: 44,
            small: &later,
        };
        let ask = |cu: &mut CatchUp, rep: &mut Replica, now| {
            let next = cu.next(rep, false, now, &PACE).unwrap();
            let Next::Ask { index, after } = next else {
                panic!("{next:?}");
            };
            (index, after)
        };
        assert_eq!(ask(&mut cu, &mut rep, t0).0, 40);
        cu.asked(Some(1), t0, &PACE);
        // Not past its snapshot: a refusal like any other.
        assert!(cu.answered(&mut rep, 1, offer(), t0, &PACE).unwrap());
        assert_eq!(cu.next(&mut rep, false, t0, &PACE).unwrap(), Next::Wait);
        let t1 = t0 + PACE.retry;
        assert_eq!(ask(&mut cu, &mut rep, t1).0, 40);
        cu.asked(Some(2), t1, &PACE);
        cu.skipped(41, 10);
        assert!(cu.answered(&mut rep, 2, offer(), t1, &PACE).unwrap());
        let (index, after) = ask(&mut cu, &mut rep, t1);
        assert_eq!(index, 44);
        cu.asked(Some(3), t1, &PACE);
        let (recs, _) = frozen.records_after(after, 1 << 20).unwrap();
        let answer = Answer::Records { index, recs: &recs };
        assert!(cu.answered(&mut rep, 3, answer, t1, &PACE).unwrap());
        // Whole at the later state, which holds what the core committed
        // through 41: nothing to apply again.
        assert_eq!(
            cu.next(&mut rep, false, t1, &PACE).unwrap(),
            Next::Whole {
                index: 44,
                replay: false
            }
        );
        assert_eq!(rep.messages(), 8);
        assert_eq!(cu.skipped_bytes, 0, "entries through 44 are in the state");
        for d in [ldir, ldir2, mdir] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Records the target does not name make the member start over.
    #[test]
    fn records_that_do_not_fit_start_it_over() {
        let t0 = Instant::now();
        let (small, frozen, ldir) = leader(20, t0);
        let (mut rep, mut cu, mdir) = member(&small, t0);
        let (recs, _) = frozen.records_after(0, 1_000).unwrap();
        cu.asked(Some(1), t0, &PACE);
        let a = Answer::Records {
            index: 40,
            recs: &recs,
        };
        cu.answered(&mut rep, 1, a, t0, &PACE).unwrap();
        assert!(rep.messages() > 0);
        // The same records again are not above what it holds.
        cu.asked(Some(2), t0, &PACE);
        let a = Answer::Records {
            index: 40,
            recs: &recs,
        };
        assert!(cu.answered(&mut rep, 2, a, t0, &PACE).is_err());
        assert_eq!(rep.messages(), 0);
        let _ = std::fs::remove_dir_all(ldir);
        let _ = std::fs::remove_dir_all(mdir);
    }

    /// A leader keeps its last two states; asked for an older one, it
    /// refuses and takes a new snapshot, at most once per `forced_every`
    /// and only if it applied that far.
    #[test]
    fn a_leader_without_the_state_forces_a_snapshot_now_and_then() {
        let t0 = Instant::now();
        let (_, frozen, ldir) = leader(3, t0);
        let mut s = Sources::default();
        for i in [10, 20, 30] {
            s.keep(i, frozen.clone());
        }
        assert!(s.at(10).is_none() && s.at(20).is_some() && s.at(30).is_some());
        let gone = |s: &mut Sources, applied, ms| match s
            .serve(10, 0, 100, applied, t0 + Duration::from_millis(ms), &PACE)
            .unwrap()
        {
            Served::Gone { snapshot_now, .. } => snapshot_now,
            Served::Records(..) => panic!("served a state it dropped"),
        };
        assert!(!gone(&mut s, 9, 0), "not applied that far");
        assert!(gone(&mut s, 31, 0));
        assert!(!gone(&mut s, 31, 1_999));
        assert!(gone(&mut s, 31, 2_000));
        assert!(matches!(
            s.serve(20, 0, 100, 31, t0, &PACE).unwrap(),
            Served::Records(..)
        ));
        let _ = std::fs::remove_dir_all(ldir);
    }
}
