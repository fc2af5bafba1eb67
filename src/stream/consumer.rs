//! One consumer's state machine, pure (no I/O; time comes in as `Instant`):
//! the delivery cursor, the messages delivered and not yet acked with their
//! delivery counts, the redelivery schedule (ack_wait, `nak` delay), the
//! `max_deliver` and `max_ack_pending` rules and the three ack policies.
//!
//! Every change that must survive a restart is one of the [`Event`]s; the
//! caller logs them and a restarted consumer replays them through
//! [`Consumer::replay`], which is the same code the live calls use.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::protocol::errors::{ApiError, Code};
use crate::protocol::stream_messages::{AckPolicy, ConsumerConfig};

/// What a consumer reads from its stream.
pub trait Source {
    /// The first stored sequence `>= from` whose subject passes `filter`.
    fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64>;
    /// Whether `seq` is still stored.
    fn contains(&self, seq: u64) -> bool;
    /// The last sequence the stream gave out.
    fn last_seq(&self) -> u64;
}

/// A durable change of consumer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `seq` was handed out (first time or again).
    Delivered(u64),
    /// `seq` is done with: acked, termed, or out of deliveries.
    Done(u64),
    /// Everything up to and including `seq` is acked (ack_policy all).
    DoneUpTo(u64),
}

#[derive(Debug, Clone)]
struct Pending {
    consumer_seq: u64,
    deliveries: u64,
    deadline: Instant,
}

/// A delivery to make: the stream sequence and how often (this one
/// included) it has been delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub seq: u64,
    pub deliveries: u64,
}

#[derive(Debug, Clone)]
pub struct Consumer {
    pub cfg: ConsumerConfig,
    /// Next stream sequence to look at for a first delivery.
    next_seq: u64,
    /// Deliveries made (first ones and redeliveries).
    consumer_seq: u64,
    pending: BTreeMap<u64, Pending>,
    /// Pending sequences due for redelivery, oldest first.
    ready: BTreeSet<u64>,
    /// Redelivery deadlines of pending sequences.
    timers: BTreeSet<(Instant, u64)>,
}

/// `{stream_seq, consumer_seq}` as consumer.info shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqPair {
    pub stream_seq: u64,
    pub consumer_seq: u64,
}

impl Consumer {
    /// A consumer that starts its first deliveries at `start_seq`.
    pub fn new(cfg: ConsumerConfig, start_seq: u64) -> Consumer {
        Consumer {
            cfg,
            next_seq: start_seq.max(1),
            consumer_seq: 0,
            pending: BTreeMap::new(),
            ready: BTreeSet::new(),
            timers: BTreeSet::new(),
        }
    }

    fn tracks_acks(&self) -> bool {
        self.cfg.ack_policy != AckPolicy::None
    }

    fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.cfg.ack_wait_ms)
    }

    pub fn delivered(&self) -> SeqPair {
        SeqPair {
            stream_seq: self.next_seq - 1,
            consumer_seq: self.consumer_seq,
        }
    }

    /// Everything up to `stream_seq` is done with; every delivery up to
    /// `consumer_seq` is done with or was made again later. A redelivery
    /// takes a new consumer seq, so the oldest pending message need not
    /// hold the lowest one: the floor is below the lowest still pending.
    pub fn ack_floor(&self) -> SeqPair {
        let Some((&seq, _)) = self.pending.iter().next() else {
            return self.delivered();
        };
        let lowest = self.pending.values().map(|p| p.consumer_seq).min();
        SeqPair {
            stream_seq: seq - 1,
            consumer_seq: lowest.unwrap_or(1).saturating_sub(1),
        }
    }

    pub fn num_ack_pending(&self) -> usize {
        self.pending.len()
    }

    pub fn num_redelivered(&self) -> usize {
        self.pending.values().filter(|p| p.deliveries > 1).count()
    }

    /// Whether `seq` was delivered and is not done with yet.
    pub fn is_pending(&self, seq: u64) -> bool {
        self.pending.contains_key(&seq)
    }

    /// How often `seq` has been delivered, while it awaits an ack (0 when
    /// it does not).
    pub fn deliveries(&self, seq: u64) -> u64 {
        self.pending.get(&seq).map_or(0, |p| p.deliveries)
    }

    /// Whether this consumer is done with `seq` (delivered and acked).
    pub fn has_acked(&self, seq: u64) -> bool {
        seq < self.next_seq && !self.pending.contains_key(&seq)
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether a delivery could be made now without looking at the stream
    /// beyond `last_seq`.
    pub fn may_have_work(&self, last_seq: u64) -> bool {
        !self.ready.is_empty() || (self.next_seq <= last_seq && !self.full())
    }

    fn full(&self) -> bool {
        self.tracks_acks() && self.pending.len() as u64 >= self.cfg.max_ack_pending
    }

    /// The next delivery, redeliveries first; records it as made.
    pub fn next(
        &mut self,
        now: Instant,
        src: &impl Source,
        events: &mut Vec<Event>,
    ) -> Option<Delivery> {
        while let Some(seq) = self.ready.pop_first() {
            if !src.contains(seq) {
                self.finish(seq);
                events.push(Event::Done(seq));
                continue;
            }
            events.push(Event::Delivered(seq));
            return Some(self.deliver(seq, now));
        }
        if self.full() {
            return None;
        }
        let filter = self.cfg.filter_subject.as_deref();
        let Some(seq) = src.next_matching(self.next_seq, filter) else {
            // Nothing (matching) stored past the cursor: skip to the end
            // so the next look starts where new messages will be.
            self.next_seq = self.next_seq.max(src.last_seq() + 1);
            return None;
        };
        events.push(Event::Delivered(seq));
        Some(self.deliver(seq, now))
    }

    /// Records a delivery of `seq` (live or replayed).
    fn deliver(&mut self, seq: u64, now: Instant) -> Delivery {
        self.consumer_seq += 1;
        self.next_seq = self.next_seq.max(seq + 1);
        if !self.tracks_acks() {
            return Delivery { seq, deliveries: 1 };
        }
        let deadline = now + self.ack_wait();
        let p = self.pending.entry(seq).or_insert(Pending {
            consumer_seq: 0,
            deliveries: 0,
            deadline,
        });
        self.timers.remove(&(p.deadline, seq));
        p.consumer_seq = self.consumer_seq;
        p.deliveries += 1;
        p.deadline = deadline;
        let deliveries = p.deliveries;
        self.timers.insert((deadline, seq));
        self.ready.remove(&seq);
        Delivery { seq, deliveries }
    }

    fn finish(&mut self, seq: u64) -> bool {
        let Some(p) = self.pending.remove(&seq) else {
            return false;
        };
        self.timers.remove(&(p.deadline, seq));
        self.ready.remove(&seq);
        true
    }

    fn unknown(&self, seq: u64) -> Result<(), ApiError> {
        if seq == 0 || seq >= self.next_seq {
            return Err(ApiError::new(
                Code::NotFound,
                format!(
                    "sequence {seq} was not delivered to consumer {:?}",
                    self.cfg.name
                ),
            ));
        }
        Ok(())
    }

    /// `ack`: returns the sequences now done with (for retention).
    pub fn ack(&mut self, seq: u64, events: &mut Vec<Event>) -> Result<Vec<u64>, ApiError> {
        self.unknown(seq)?;
        if self.cfg.ack_policy == AckPolicy::All {
            let done: Vec<u64> = self.pending.range(..=seq).map(|(&s, _)| s).collect();
            for &s in &done {
                self.finish(s);
            }
            events.push(Event::DoneUpTo(seq));
            return Ok(done);
        }
        // An ack of a sequence already done with is accepted again.
        if self.finish(seq) {
            events.push(Event::Done(seq));
            return Ok(vec![seq]);
        }
        Ok(Vec::new())
    }

    /// `term`: never deliver `seq` again.
    pub fn term(&mut self, seq: u64, events: &mut Vec<Event>) -> Result<bool, ApiError> {
        self.unknown(seq)?;
        let done = self.finish(seq);
        if done {
            events.push(Event::Done(seq));
        }
        Ok(done)
    }

    fn pending_mut(&mut self, seq: u64) -> Result<&mut Pending, ApiError> {
        self.unknown(seq)?;
        let name = &self.cfg.name;
        let msg = format!("sequence {seq} is not awaiting an ack on consumer {name:?}");
        self.pending
            .get_mut(&seq)
            .ok_or_else(|| ApiError::new(Code::NotFound, msg))
    }

    /// `nak`: redeliver `seq` after `delay` (at once when zero).
    pub fn nak(&mut self, seq: u64, delay: Duration, now: Instant) -> Result<(), ApiError> {
        let p = self.pending_mut(seq)?;
        let old = p.deadline;
        p.deadline = now + delay;
        let new = p.deadline;
        self.timers.remove(&(old, seq));
        if delay.is_zero() {
            self.ready.insert(seq);
        } else {
            self.ready.remove(&seq);
            self.timers.insert((new, seq));
        }
        Ok(())
    }

    /// `wip`: the client is still working on `seq`; restart its ack_wait.
    pub fn wip(&mut self, seq: u64, now: Instant) -> Result<(), ApiError> {
        let wait = self.ack_wait();
        let p = self.pending_mut(seq)?;
        let old = p.deadline;
        p.deadline = now + wait;
        let new = p.deadline;
        if self.ready.contains(&seq) {
            return Ok(());
        }
        self.timers.remove(&(old, seq));
        self.timers.insert((new, seq));
        Ok(())
    }

    /// Moves every pending sequence whose deadline passed to the
    /// redelivery queue; one that used up `max_deliver` is done with
    /// instead (and logged as such).
    pub fn expire(&mut self, now: Instant, events: &mut Vec<Event>) {
        while let Some(&(at, seq)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let used_up = self
                .pending
                .get(&seq)
                .is_some_and(|p| self.cfg.max_deliver > 0 && p.deliveries >= self.cfg.max_deliver);
            if used_up {
                self.finish(seq);
                events.push(Event::Done(seq));
            } else {
                self.ready.insert(seq);
            }
        }
    }

    /// The next redelivery deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// Forgets `seq` if it is pending (the message is gone); true if it was.
    pub fn forget(&mut self, seq: u64) -> bool {
        self.finish(seq)
    }

    /// Forgets pending sequences that are no longer stored (after a purge
    /// or a limit dropped them).
    pub fn forget_missing(&mut self, src: &impl Source, events: &mut Vec<Event>) {
        let gone: Vec<u64> = self
            .pending
            .keys()
            .copied()
            .filter(|&s| !src.contains(s))
            .collect();
        for s in gone {
            self.finish(s);
            events.push(Event::Done(s));
        }
    }

    /// Re-applies a logged event (at start-up).
    pub fn replay(&mut self, e: Event, now: Instant) {
        match e {
            Event::Delivered(seq) => {
                self.deliver(seq, now);
            }
            Event::Done(seq) => {
                self.finish(seq);
            }
            Event::DoneUpTo(seq) => {
                let done: Vec<u64> = self.pending.range(..=seq).map(|(&s, _)| s).collect();
                for s in done {
                    self.finish(s);
                }
            }
        }
    }

    /// After a restart, when the stream ends at `last_seq`: what the
    /// consumer remembers delivering past it never reached the disk (a
    /// power loss can keep the cursor's write and lose the message's), so
    /// the cursor goes back to where the stream ends and those sequences,
    /// which new messages will take again, are delivered as new.
    pub fn clamp(&mut self, last_seq: u64) {
        self.next_seq = self.next_seq.min(last_seq + 1);
        let beyond: Vec<u64> = self
            .pending
            .range(last_seq + 1..)
            .map(|(&s, _)| s)
            .collect();
        for s in beyond {
            self.finish(s);
        }
    }

    /// After a restart: every message that was awaiting an ack is due for
    /// redelivery now.
    pub fn resume(&mut self) {
        self.timers.clear();
        self.ready = self.pending.keys().copied().collect();
    }

    /// The state as a compact snapshot: cursor, deliveries made, and the
    /// pending sequences with their delivery counts.
    pub fn snapshot(&self) -> (u64, u64, Vec<(u64, u64)>) {
        let pending = self
            .pending
            .iter()
            .map(|(&s, p)| (s, p.deliveries))
            .collect();
        (self.next_seq, self.consumer_seq, pending)
    }

    /// Restores a snapshot taken with [`Consumer::snapshot`].
    pub fn restore(
        &mut self,
        next_seq: u64,
        consumer_seq: u64,
        pending: &[(u64, u64)],
        now: Instant,
    ) {
        self.next_seq = next_seq.max(1);
        self.consumer_seq = consumer_seq;
        self.pending.clear();
        self.timers.clear();
        self.ready.clear();
        for &(seq, deliveries) in pending {
            self.pending.insert(
                seq,
                Pending {
                    consumer_seq,
                    deliveries,
                    deadline: now,
                },
            );
            self.timers.insert((now, seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::stream_messages::{read_config, ConsumerConfig};

    struct Msgs(Vec<(u64, &'static str)>);

    impl Source for Msgs {
        fn next_matching(&self, from: u64, filter: Option<&str>) -> Option<u64> {
            self.0
                .iter()
                .find(|(s, subj)| {
                    *s >= from && filter.is_none_or(|f| crate::protocol::subject::matches(f, subj))
                })
                .map(|(s, _)| *s)
        }
        fn contains(&self, seq: u64) -> bool {
            self.0.iter().any(|(s, _)| *s == seq)
        }
        fn last_seq(&self) -> u64 {
            self.0.last().map_or(0, |(s, _)| *s)
        }
    }

    fn cfg(v: serde_json::Value) -> ConsumerConfig {
        let serde_json::Value::Object(m) = v else {
            panic!("object")
        };
        let mut c: ConsumerConfig = read_config(m).unwrap();
        c.validate().unwrap();
        c
    }

    fn msgs(n: u64) -> Msgs {
        Msgs(
            (1..=n)
                .map(|s| (s, if s % 2 == 0 { "even" } else { "odd" }))
                .collect(),
        )
    }

    #[test]
    fn explicit_acks_move_the_floor() {
        let now = Instant::now();
        let src = msgs(3);
        let mut c = Consumer::new(cfg(serde_json::json!({"name":"c"})), 1);
        let mut ev = Vec::new();
        let got: Vec<u64> =
            std::iter::from_fn(|| c.next(now, &src, &mut ev).map(|d| d.seq)).collect();
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!(c.ack(2, &mut ev).unwrap(), vec![2]);
        assert_eq!(c.ack_floor().stream_seq, 0);
        c.ack(1, &mut ev).unwrap();
        assert_eq!(c.ack_floor().stream_seq, 2);
        assert_eq!(c.num_ack_pending(), 1);
        assert_eq!(c.ack(9, &mut ev).unwrap_err().code, Code::NotFound);
        assert_eq!(
            c.nak(1, Duration::ZERO, now).unwrap_err().code,
            Code::NotFound
        );
        assert!(c.ack(1, &mut ev).unwrap().is_empty());
    }

    #[test]
    fn ack_wait_redelivers_until_max_deliver() {
        let now = Instant::now();
        let src = msgs(1);
        let mut c = Consumer::new(
            cfg(serde_json::json!({"name":"c","ack_wait_ms":100,"max_deliver":2})),
            1,
        );
        let mut ev = Vec::new();
        assert_eq!(
            c.next(now, &src, &mut ev),
            Some(Delivery {
                seq: 1,
                deliveries: 1
            })
        );
        assert_eq!(c.next(now, &src, &mut ev), None);
        let later = now + Duration::from_millis(100);
        assert_eq!(c.next_deadline(), Some(later));
        c.expire(later, &mut ev);
        assert_eq!(
            c.next(later, &src, &mut ev),
            Some(Delivery {
                seq: 1,
                deliveries: 2
            })
        );
        assert_eq!(c.num_redelivered(), 1);
        c.expire(later + Duration::from_millis(100), &mut ev);
        assert_eq!(c.num_ack_pending(), 0);
        assert_eq!(ev.last(), Some(&Event::Done(1)));
    }

    #[test]
    fn nak_delay_and_wip() {
        let now = Instant::now();
        let src = msgs(2);
        let mut c = Consumer::new(cfg(serde_json::json!({"name":"c","ack_wait_ms":1000})), 1);
        let mut ev = Vec::new();
        c.next(now, &src, &mut ev);
        c.nak(1, Duration::from_millis(50), now).unwrap();
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(2));
        assert_eq!(c.next(now, &src, &mut ev), None);
        c.expire(now + Duration::from_millis(50), &mut ev);
        assert_eq!(
            c.next(now, &src, &mut ev).map(|d| (d.seq, d.deliveries)),
            Some((1, 2))
        );
        c.wip(2, now + Duration::from_millis(900)).unwrap();
        // Seq 1 is due at +1000 ms, seq 2 (wip at +900) at +1900 ms.
        c.expire(now + Duration::from_millis(1500), &mut ev);
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(1));
        assert!(!c.may_have_work(2));
        c.nak(2, Duration::ZERO, now).unwrap();
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(2));
        assert!(c.term(2, &mut ev).unwrap());
        assert!(!c.is_pending(2));
    }

    #[test]
    fn max_ack_pending_pauses_and_filter_skips() {
        let now = Instant::now();
        let src = msgs(6);
        let mut c = Consumer::new(
            cfg(serde_json::json!({"name":"c","max_ack_pending":2,"filter_subject":"even"})),
            1,
        );
        let mut ev = Vec::new();
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(2));
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(4));
        assert_eq!(c.next(now, &src, &mut ev), None);
        c.ack(2, &mut ev).unwrap();
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(6));
    }

    #[test]
    fn ack_all_and_none() {
        let now = Instant::now();
        let src = msgs(3);
        let mut c = Consumer::new(cfg(serde_json::json!({"name":"c","ack_policy":"all"})), 1);
        let mut ev = Vec::new();
        while c.next(now, &src, &mut ev).is_some() {}
        assert_eq!(c.ack(2, &mut ev).unwrap(), vec![1, 2]);
        assert_eq!(c.ack_floor().stream_seq, 2);
        let mut n = Consumer::new(cfg(serde_json::json!({"name":"n","ack_policy":"none"})), 1);
        while n.next(now, &src, &mut ev).is_some() {}
        assert_eq!(n.ack_floor().stream_seq, 3);
        assert_eq!(n.num_ack_pending(), 0);
    }

    #[test]
    fn ack_floor_consumer_seq_stays_below_every_pending_delivery() {
        let src = msgs(3);
        let now = Instant::now();
        let mut c = Consumer::new(cfg(serde_json::json!({"name":"c"})), 1);
        let mut ev = Vec::new();
        while c.next(now, &src, &mut ev).is_some() {}
        // 1, 2, 3 went out as consumer seqs 1, 2, 3; 1 again as 4.
        c.nak(1, Duration::ZERO, now).unwrap();
        assert_eq!(c.next(now, &src, &mut ev).map(|d| d.seq), Some(1));
        let f = c.ack_floor();
        assert_eq!((f.stream_seq, f.consumer_seq), (0, 1));
        c.ack(2, &mut ev).unwrap();
        c.ack(3, &mut ev).unwrap();
        let f = c.ack_floor();
        assert_eq!((f.stream_seq, f.consumer_seq), (0, 3));
        c.ack(1, &mut ev).unwrap();
        let f = c.ack_floor();
        assert_eq!((f.stream_seq, f.consumer_seq), (3, 4));
    }

    #[test]
    fn replay_rebuilds_the_same_state() {
        let now = Instant::now();
        let src = msgs(5);
        let conf = cfg(serde_json::json!({"name":"c"}));
        let mut live = Consumer::new(conf.clone(), 1);
        let mut ev = Vec::new();
        for _ in 0..4 {
            live.next(now, &src, &mut ev);
        }
        live.ack(1, &mut ev).unwrap();
        live.ack(3, &mut ev).unwrap();
        let mut again = Consumer::new(conf, 1);
        for e in &ev {
            again.replay(*e, now);
        }
        assert_eq!(again.snapshot(), live.snapshot());
        again.resume();
        let redelivered: Vec<u64> =
            std::iter::from_fn(|| again.next(now, &src, &mut Vec::new()).map(|d| d.seq)).collect();
        assert_eq!(redelivered, vec![2, 4, 5]);
    }
}
