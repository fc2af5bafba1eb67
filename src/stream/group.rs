//! One replicated stream as its Raft group sees it, as a pure component:
//! the [`Replica`] fed by the group's committed entries, and the leader's
//! bookkeeping of what it proposed.
//!
//! Events come in (an op a request asks for, the turn's end, a proposal's
//! index, the group's role, an applied entry) and what follows goes out:
//! entries to propose, and each request's [`Done`]: its op's outcome once
//! the entry holding it applied here, or a refusal. It holds no socket,
//! thread, clock or Raft core: the broker (`broker/stream_groups.rs`)
//! feeds it from the group's Raft thread and renders the answers, and the
//! stream simulation (`tests/stream_harness`) feeds it from simulated
//! nodes, so the code that decides which request an applied entry answers
//! is the code the simulation checks.
//!
//! The rules it keeps:
//! - What one turn brings in becomes ONE entry; a request is answered
//!   only with the outcome of that entry's apply, never before.
//! - An applied entry answers requests only when it is the very entry this
//!   node proposed at that index (same index, same term): another
//!   leader's entry there means this node's proposal is not in the log,
//!   and its requests are refused at once.
//! - A request whose entry is not applied within [`ENTRY_WAIT`] is refused
//!   rather than left waiting.
//! - At most one delivery entry per consumer is in flight, and its
//!   messages go out only while this node still leads in its term.
//! - A new leader proposes an empty entry and serves reads only once an
//!   entry of its own term applied (its state then holds all it acked).
//!
//! `R` is whatever tells the caller whom to answer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::replica::{decode_entry_at, encode_entry, Malformed, Op, Outcome, Replica};

/// How long a request may wait for its entry to be committed and applied
/// before it is refused (the contract's bound is 5 s).
pub const ENTRY_WAIT: Duration = Duration::from_millis(4_500);
/// How often a leader proposes an [`Op::Expire`] for a stream with
/// `max_age_ms` or a `Msg-Id` window.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(1);
/// How often a leader looks for deliveries that used up `max_deliver`
/// (an [`Op::Exhausted`] proposed twice finds nothing the second time).
pub const EXHAUST_EVERY: Duration = Duration::from_millis(100);
/// Most requests waiting on one stream's entries.
pub const WAITING_MAX: usize = 100_000;

/// What became of a request.
#[derive(Debug)]
pub enum Done<R> {
    /// Its op applied in the entry this node proposed: the outcome.
    Applied(R, Outcome),
    /// Its op will not be applied as proposed (refused, overwritten by
    /// another leader's entry, or not applied in time): why.
    Refused(R, &'static str),
}

/// An entry proposed and not applied yet.
struct InFlight<R> {
    /// The term it was appended in (known once appended): the entry
    /// applied at its index is this one only if it has this term (Raft's
    /// log matching: one index and term, one entry).
    term: u64,
    /// One per op (`None`: no one to answer).
    replies: Vec<Option<R>>,
    /// The consumers it carries deliveries for.
    delivers: Vec<String>,
    since: Instant,
}

/// An entry to hand the group's Raft core; its index comes back to
/// [`Group::proposed`] under `tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub tag: u64,
    pub data: Vec<u8>,
}

/// One replicated stream held on this node.
pub struct Group<R> {
    pub replica: Replica,
    /// The last index applied to `replica` (or restored into it).
    pub applied: u64,
    /// Made whole at `applied` from a fetched snapshot after its Raft
    /// core had applied entries past it: those come again, from
    /// `applied + 1` on ([`Group::made_whole`]); any further on that
    /// arrive before them come again too, and are passed over.
    replaying: bool,
    leading: bool,
    term: u64,
    leader: Option<u64>,
    /// Leading, and an entry of this term applied: the state holds
    /// everything this leader acked.
    serving: bool,
    /// The empty entry of this term was proposed.
    barrier: bool,
    /// This turn's ops, with one reply each.
    ops: Vec<Op>,
    replies: Vec<Option<R>>,
    delivers: Vec<String>,
    /// Proposed, index not known yet (by tag).
    proposed: HashMap<u64, InFlight<R>>,
    /// Appended at an index, not applied yet.
    at: BTreeMap<u64, InFlight<R>>,
    /// Consumers with a delivery entry in flight.
    delivering: HashSet<String>,
    next_expire: Option<Instant>,
    next_exhaust: Option<Instant>,
    next_tag: u64,
}

impl<R> Group<R> {
    pub fn new(replica: Replica) -> Group<R> {
        Group {
            replica,
            applied: 0,
            replaying: false,
            leading: false,
            term: 0,
            leader: None,
            serving: false,
            barrier: false,
            ops: Vec::new(),
            replies: Vec::new(),
            delivers: Vec::new(),
            proposed: HashMap::new(),
            at: BTreeMap::new(),
            delivering: HashSet::new(),
            next_expire: None,
            next_exhaust: None,
            next_tag: 0,
        }
    }

    /// The replica holds what the snapshot at `index` names (a catch-up
    /// ended). `replay`: the core applied entries past `index` meanwhile,
    /// and hands them over again.
    pub fn made_whole(&mut self, index: u64, replay: bool) {
        self.applied = index;
        self.replaying = replay;
    }

    /// Whether the entries after a catch-up's snapshot are awaited again
    /// ([`Group::made_whole`]).
    pub fn replaying(&self) -> bool {
        self.replaying
    }

    /// This node leads the group (as its Raft core last said).
    pub fn leads(&self) -> bool {
        self.leading
    }

    /// The group's leader as this member knows it.
    pub fn leader(&self) -> Option<u64> {
        self.leader
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Leading, with an entry of this term applied: reads may be served.
    pub fn serving(&self) -> bool {
        self.serving
    }

    /// Requests waiting on this group's entries.
    pub fn waiting(&self) -> usize {
        self.replies.len()
            + (self.proposed.values().chain(self.at.values()))
                .map(|f| f.replies.len())
                .sum::<usize>()
    }

    /// As many requests wait as one group takes.
    pub fn full(&self) -> bool {
        self.waiting() >= WAITING_MAX
    }

    /// Takes `op` into this turn's entry, `reply` (if any) answered once
    /// it applied.
    pub fn take(&mut self, op: Op, reply: Option<R>) {
        self.ops.push(op);
        self.replies.push(reply);
    }

    /// Nothing waiting is answered to a requester `gone` picks any more;
    /// its ops still go through.
    pub fn forget(&mut self, gone: impl Fn(&R) -> bool) {
        let flights = self.proposed.values_mut().chain(self.at.values_mut());
        let lists = std::iter::once(&mut self.replies).chain(flights.map(|f| &mut f.replies));
        for list in lists {
            for r in list.iter_mut() {
                if r.as_ref().is_some_and(&gone) {
                    *r = None;
                }
            }
        }
    }

    /// Consumer `consumer` has a delivery entry in flight.
    pub fn delivering(&self, consumer: &str) -> bool {
        self.delivering.contains(consumer)
    }

    /// Takes a delivery of `seqs` to `consumer` into this turn's entry (at
    /// most one in flight per consumer: check [`Group::delivering`]).
    pub fn deliver(&mut self, consumer: &str, seqs: Vec<u64>, reply: R) {
        self.delivering.insert(consumer.to_string());
        self.delivers.push(consumer.to_string());
        self.take(
            Op::Deliver {
                consumer: consumer.to_string(),
                seqs,
            },
            Some(reply),
        );
    }

    /// The group's Raft core changed role, term or leader. Returns whether
    /// this node just stopped leading.
    pub fn status(&mut self, leading: bool, term: u64, leader: Option<u64>) -> bool {
        let was = self.leading;
        if term != self.term || !leading {
            self.barrier = false;
        }
        self.leading = leading;
        self.term = term;
        self.leader = leader;
        if !leading {
            self.serving = false;
            self.next_expire = None;
            self.next_exhaust = None;
            if was {
                self.delivering.clear();
            }
        }
        was && !leading
    }

    /// The end of a turn: on the leader, the empty entry of a new term,
    /// deliveries out of `max_deliver` and expiry when due, then this
    /// turn's ops as one entry; requests waiting past [`ENTRY_WAIT`] are
    /// refused. `now_ms` is the wall clock an expiry goes by.
    pub fn flush(&mut self, now: Instant, now_ms: u64, done: &mut Vec<Done<R>>) -> Vec<Proposal> {
        let mut out = Vec::new();
        if self.leading && !self.serving && !self.barrier {
            self.barrier = true;
            self.next_tag += 1;
            out.push(Proposal {
                tag: self.next_tag,
                data: encode_entry(&[]),
            });
        }
        if self.leading && self.serving {
            if self.next_exhaust.is_none_or(|t| t <= now) {
                self.next_exhaust = Some(now + EXHAUST_EVERY);
                for consumer in self.replica.consumer_names() {
                    let seqs = self.replica.exhausted_deliveries(&consumer, now);
                    if !seqs.is_empty() {
                        self.ops.push(Op::Exhausted { consumer, seqs });
                        self.replies.push(None);
                    }
                }
            }
            let cfg = self.replica.config();
            if (cfg.max_age_ms > 0 || cfg.duplicate_window_ms > 0)
                && self.next_expire.is_none_or(|t| t <= now)
            {
                self.next_expire = Some(now + EXPIRE_EVERY);
                self.ops.push(Op::Expire { now_ms });
                self.replies.push(None);
            }
        }
        if !self.ops.is_empty() {
            let ops = std::mem::take(&mut self.ops);
            let replies = std::mem::take(&mut self.replies);
            let delivers = std::mem::take(&mut self.delivers);
            if self.leading {
                self.next_tag += 1;
                let tag = self.next_tag;
                out.push(Proposal {
                    tag,
                    data: encode_entry(&ops),
                });
                let f = InFlight {
                    term: 0,
                    replies,
                    delivers,
                    since: now,
                };
                self.proposed.insert(tag, f);
            } else {
                for c in &delivers {
                    self.delivering.remove(c);
                }
                let why = "the stream's leader changed; try again";
                done.extend(replies.into_iter().flatten().map(|r| Done::Refused(r, why)));
            }
        }
        // Whatever waited past the bound: refused, never left hanging.
        let old = |f: &InFlight<R>| now.duration_since(f.since) >= ENTRY_WAIT;
        let stale: Vec<u64> = (self.at.iter().filter(|(_, f)| old(f)))
            .map(|(i, _)| *i)
            .collect();
        for i in stale {
            if let Some(f) = self.at.remove(&i) {
                self.give_up(f, done);
            }
        }
        let stale: Vec<u64> = (self.proposed.iter().filter(|(_, f)| old(f)))
            .map(|(t, _)| *t)
            .collect();
        for t in stale {
            if let Some(f) = self.proposed.remove(&t) {
                self.give_up(f, done);
            }
        }
        out
    }

    /// The proposal under `tag` was appended at `(index, term)` (`None`:
    /// the core refused it).
    pub fn proposed(&mut self, tag: u64, at: Option<(u64, u64)>, done: &mut Vec<Done<R>>) {
        if let Some(mut f) = self.proposed.remove(&tag) {
            match at {
                Some((index, term)) => {
                    f.term = term;
                    self.at.insert(index, f);
                }
                None => self.give_up(f, done),
            }
        }
    }

    /// The committed entry at `index` (of `term`; `data` empty for Raft's
    /// own entries) applies, unless the replica's state is past it. Its
    /// outcomes answer this node's requests only if it is the entry this
    /// node proposed there; with `seen`, every op's outcome is copied
    /// there too (for a checker).
    pub fn apply(
        &mut self,
        index: u64,
        term: u64,
        data: &[u8],
        now: Instant,
        done: &mut Vec<Done<R>>,
        seen: Option<&mut Vec<Outcome>>,
    ) -> Result<(), Malformed> {
        let r = self.apply_at(index, term, data, None, now, done, seen);
        self.replica.flush();
        r
    }

    /// [`Group::apply`] of an entry whose data the log stored at `at`
    /// (file number and offset, `cluster::raft_log::LogStore::data_at`):
    /// the replica keeps the messages it publishes there. Its messages go
    /// to their files with the next [`Replica::flush`].
    #[allow(clippy::too_many_arguments)]
    pub fn apply_at(
        &mut self,
        index: u64,
        term: u64,
        data: &[u8],
        at: Option<(u64, u64)>,
        now: Instant,
        done: &mut Vec<Done<R>>,
        seen: Option<&mut Vec<Outcome>>,
    ) -> Result<(), Malformed> {
        if index <= self.applied {
            // The replica's state holds it already: it was made whole for
            // a snapshot at or after it while the entry was on its way.
            // Requests waiting on it are refused when their wait ends.
            return Ok(());
        }
        if self.replaying {
            if index > self.applied + 1 {
                // Handed over before the replay began: it comes again.
                return Ok(());
            }
            self.replaying = false;
        }
        self.applied = index;
        if self.leading && term == self.term {
            self.serving = true;
        }
        let flight = match self.at.remove(&index) {
            Some(f) if f.term == term => Some(f),
            // Another leader's entry took the index this node's proposal
            // had: that proposal is not in the log, and its requests are
            // answered now, not left waiting.
            Some(f) => {
                self.give_up(f, done);
                None
            }
            None => None,
        };
        if data.is_empty() {
            if let Some(f) = flight {
                self.give_up(f, done);
            }
            return Ok(());
        }
        let (ops, places) = match decode_entry_at(data) {
            Ok(ops) => ops,
            Err(e) => {
                if let Some(f) = flight {
                    self.give_up(f, done);
                }
                return Err(e);
            }
        };
        let outcomes = self.replica.apply_at(&ops, &places, at, now);
        if let Some(seen) = seen {
            seen.extend(outcomes.iter().cloned());
        }
        for (op, out) in ops.iter().zip(&outcomes) {
            if let (Op::Deliver { consumer, .. }, Outcome::Delivered(_)) = (op, out) {
                self.delivering.remove(consumer);
            }
        }
        if let Some(f) = flight {
            // Deliveries go out only while this node still leads in the
            // entry's term: a deposed leader applying its entry late would
            // hand out messages its successor may have seen acked since
            // (entries after this one). Unanswered, they are due again
            // after `ack_wait`, as any delivery that went astray.
            let hands_out = self.leading && self.term == term;
            for ((r, o), op) in f.replies.into_iter().zip(outcomes).zip(&ops) {
                let Some(r) = r else { continue };
                if matches!(op, Op::Deliver { .. }) && !hands_out {
                    done.push(Done::Refused(r, "the stream's leader changed; try again"));
                } else {
                    done.push(Done::Applied(r, o));
                }
            }
        }
        Ok(())
    }

    /// An entry that will not be applied as proposed: its requests are
    /// refused; its deliveries may have gone out, so they are not retried.
    fn give_up(&mut self, f: InFlight<R>, done: &mut Vec<Done<R>>) {
        for c in &f.delivers {
            self.delivering.remove(c);
        }
        let why = "the stream's replicas did not confirm in time; try again";
        done.extend(
            f.replies
                .into_iter()
                .flatten()
                .map(|r| Done::Refused(r, why)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::{read_config, StreamConfig};
    use crate::stream::replica::{decode_entry, Publish};
    use crate::stream::stream::Stored;

    fn group() -> Group<u32> {
        let serde_json::Value::Object(m) = serde_json::json!({"name": "S", "subjects": ["s.>"]})
        else {
            unreachable!()
        };
        let mut cfg: StreamConfig = read_config(m).unwrap();
        cfg.validate().unwrap();
        Group::new(Replica::new(cfg))
    }

    fn publish(n: u32) -> Op {
        Op::Publish(Publish {
            subject: "s.a".into(),
            headers: None,
            data: n.to_string().into_bytes(),
            binary: false,
            time_ms: 1,
        })
    }

    /// The seq a publish was answered with.
    fn seq(d: &Done<u32>) -> Option<(u32, u64)> {
        match d {
            Done::Applied(r, Outcome::Published(Ok(Stored::New { seq, .. }))) => Some((*r, *seq)),
            _ => None,
        }
    }

    #[test]
    fn a_turn_is_one_entry_answered_when_it_applies() {
        let mut g = group();
        let now = Instant::now();
        let mut done = Vec::new();
        g.status(true, 2, Some(1));
        // The new term's empty entry first.
        let barrier = g.flush(now, 0, &mut done);
        assert_eq!(barrier.len(), 1);
        g.apply(1, 2, &[], now, &mut done, None).unwrap();
        assert!(g.serving());
        g.take(publish(1), Some(1));
        g.take(publish(2), Some(2));
        g.take(publish(3), None);
        let p = g.flush(now, 0, &mut done);
        assert_eq!(p.len(), 1, "one entry for the turn");
        assert_eq!(decode_entry(&p[0].data).unwrap().len(), 3);
        g.proposed(p[0].tag, Some((2, 2)), &mut done);
        assert!(done.is_empty(), "nothing answered before the apply");
        assert_eq!(g.waiting(), 3);
        g.apply(2, 2, &p[0].data, now, &mut done, None).unwrap();
        let seqs: Vec<_> = done.iter().filter_map(seq).collect();
        assert_eq!(seqs, [(1, 1), (2, 2)]);
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn another_leaders_entry_at_the_index_refuses_what_this_node_proposed() {
        let mut leader = group();
        let now = Instant::now();
        let mut done = Vec::new();
        leader.status(true, 2, Some(1));
        leader.flush(now, 0, &mut done);
        leader.take(publish(1), Some(7));
        let p = leader.flush(now, 0, &mut done);
        let mine = p.last().unwrap();
        leader.proposed(mine.tag, Some((5, 2)), &mut done);
        // Deposed: a leader of term 3 put its own entry at index 5, with
        // the very same bytes.
        leader.status(false, 3, Some(2));
        leader
            .apply(5, 3, &mine.data, now, &mut done, None)
            .unwrap();
        assert!(matches!(done.as_slice(), [Done::Refused(7, _)]), "{done:?}");
        // The entry still applied to the replica.
        assert_eq!(leader.replica.last_seq(), 1);
    }

    #[test]
    fn requests_are_refused_when_not_leading_or_after_the_wait() {
        let mut g = group();
        let now = Instant::now();
        let mut done = Vec::new();
        g.take(publish(1), Some(1));
        assert!(g.flush(now, 0, &mut done).is_empty());
        assert!(matches!(done.as_slice(), [Done::Refused(1, _)]));
        done.clear();
        g.status(true, 1, Some(1));
        g.flush(now, 0, &mut done);
        g.take(publish(2), Some(2));
        let p = g.flush(now, 0, &mut done);
        g.proposed(p[0].tag, Some((3, 1)), &mut done);
        assert!(g.flush(now + ENTRY_WAIT / 2, 0, &mut done).is_empty());
        assert!(done.is_empty());
        g.flush(now + ENTRY_WAIT, 0, &mut done);
        assert!(matches!(done.as_slice(), [Done::Refused(2, _)]));
        assert_eq!(g.waiting(), 0);
        // A refused proposal is answered at once.
        g.take(publish(3), Some(3));
        let p = g.flush(now, 0, &mut done);
        g.proposed(p[0].tag, None, &mut done);
        assert!(matches!(done.last(), Some(Done::Refused(3, _))));
    }

    #[test]
    fn a_consumer_has_one_delivery_in_flight_until_it_applies_or_is_given_up() {
        let mut g = group();
        let now = Instant::now();
        let mut done = Vec::new();
        g.deliver("c", vec![1], 1);
        assert!(g.delivering("c"));
        // Not leading: refused, and the consumer is free again.
        g.flush(now, 0, &mut done);
        assert!(!g.delivering("c"));
        g.status(true, 1, Some(1));
        g.flush(now, 0, &mut done);
        g.deliver("c", vec![1], 2);
        let p = g.flush(now, 0, &mut done);
        g.proposed(p[0].tag, Some((2, 1)), &mut done);
        assert!(g.delivering("c"));
        g.status(false, 2, Some(2));
        assert!(!g.delivering("c"), "a deposed leader plans nothing");
    }

    #[test]
    fn a_deposed_leader_hands_out_no_delivery_its_entry_made() {
        let mut g = group();
        let now = Instant::now();
        let mut done = Vec::new();
        g.status(true, 1, Some(1));
        g.flush(now, 0, &mut done);
        g.apply(1, 1, &[], now, &mut done, None).unwrap();
        let create = Op::ConsumerCreate {
            config: r#"{"name":"c"}"#.into(),
        };
        g.take(create, None);
        g.take(publish(1), None);
        let p = g.flush(now, 0, &mut done);
        g.proposed(p[0].tag, Some((2, 1)), &mut done);
        g.apply(2, 1, &p[0].data, now, &mut done, None).unwrap();
        g.deliver("c", vec![1], 9);
        let p = g.flush(now, 0, &mut done);
        g.proposed(p[0].tag, Some((3, 1)), &mut done);
        // Deposed before its delivery entry applies (a new leader
        // committed it in term 2).
        g.status(false, 2, Some(2));
        g.apply(3, 1, &p[0].data, now, &mut done, None).unwrap();
        assert!(matches!(done.as_slice(), [Done::Refused(9, _)]), "{done:?}");
        assert!(!g.delivering("c"));
    }

    #[test]
    fn a_forgotten_requester_is_not_answered() {
        let mut g = group();
        let now = Instant::now();
        let mut done = Vec::new();
        g.status(true, 1, Some(1));
        g.flush(now, 0, &mut done);
        g.take(publish(1), Some(1));
        g.take(publish(2), Some(2));
        let p = g.flush(now, 0, &mut done);
        g.forget(|&r| r == 1);
        g.proposed(p[0].tag, Some((2, 1)), &mut done);
        g.apply(2, 1, &p[0].data, now, &mut done, None).unwrap();
        let seqs: Vec<_> = done.iter().filter_map(seq).collect();
        assert_eq!(seqs, [(2, 2)]);
        assert_eq!(g.replica.last_seq(), 2, "its op still went through");
    }
}
