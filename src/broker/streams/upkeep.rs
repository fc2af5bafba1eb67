//! The per-turn work of the streams: limits by age, redelivery timers,
//! push deliveries, waiting fetches, one write per touched file, and when
//! the loop must come back.

use super::*;

impl Streams {
    /// Once per loop turn: limits by age, redelivery timers, push
    /// deliveries, waiting fetches, then one write per touched file and the
    /// release of every ack that write made true.
    pub fn tick(
        &mut self,
        sink: &mut dyn Sink,
        subs: &mut SubTable,
        remote: &mut crate::broker::stream_out::RemotePush,
    ) {
        if self.down.is_some() {
            return;
        }
        let now = sink.now();
        self.wall = WallClock::read(now);
        let now_ms = self.wall.ms_at(now);
        let sweep = subs.len() != self.last_subs || now >= self.next_sweep;
        if sweep {
            self.last_subs = subs.len();
            self.next_sweep = now + SWEEP_EVERY;
        }
        let mut more = false;
        for slot in self.set.values_mut() {
            let due = slot.due.is_some_and(|d| d <= now);
            if !(slot.touched || due || sweep) {
                continue;
            }
            maintain(slot, now, now_ms);
            more |= push_slot(sink, subs, remote, slot, now, &mut self.pick);
            plan_slot(slot, now, now_ms);
        }
        self.serve_waits(sink, now);
        self.flush_all(now, now_ms);
        self.release(sink);
        self.plan(now, more);
    }

    /// The handler-wide deadline for the loop (computed by `tick`).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_at
    }

    pub(super) fn plan(&mut self, now: Instant, more: bool) {
        if more {
            self.next_at = Some(now);
            return;
        }
        let mut at: Option<Instant> = None;
        let mut fold = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        for w in &self.waits {
            fold(Some(w.deadline));
        }
        let mut push_waiting = false;
        for slot in self.set.values() {
            fold(slot.due);
            push_waiting |= slot.push_waiting;
        }
        if push_waiting {
            fold(Some(self.next_sweep));
        }
        self.next_at = at;
    }
}
