//! A ring of per-second samples of the broker's traffic counters, for
//! the rates and the chart of the last minutes on the dashboard. Pure: the
//! caller passes the time and the counters.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Time between samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Samples kept: five minutes at one per second.
pub const SAMPLES_MAX: usize = 300;

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub msgs_in: u64,
    pub msgs_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Traffic over one interval, per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    /// Milliseconds since the broker started, at the interval's end.
    pub at_ms: u64,
    pub msgs_in: f64,
    pub msgs_out: f64,
    pub bytes_in: f64,
    pub bytes_out: f64,
}

#[derive(Debug)]
pub struct History {
    started: Instant,
    next: Instant,
    last: Option<(Instant, Counters)>,
    rates: VecDeque<Rate>,
}

impl History {
    pub fn new(now: Instant) -> History {
        History {
            started: now,
            next: now,
            last: None,
            rates: VecDeque::with_capacity(SAMPLES_MAX),
        }
    }

    /// When the next sample is due.
    pub fn next_at(&self) -> Instant {
        self.next
    }

    /// Takes a sample if one is due; returns whether it did.
    pub fn sample(&mut self, now: Instant, c: Counters) -> bool {
        if now < self.next {
            return false;
        }
        if let Some((then, prev)) = self.last {
            let secs = now.saturating_duration_since(then).as_secs_f64();
            if secs > 0.0 {
                let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
                if self.rates.len() == SAMPLES_MAX {
                    self.rates.pop_front();
                }
                self.rates.push_back(Rate {
                    at_ms: now.saturating_duration_since(self.started).as_millis() as u64,
                    msgs_in: per_s(c.msgs_in, prev.msgs_in),
                    msgs_out: per_s(c.msgs_out, prev.msgs_out),
                    bytes_in: per_s(c.bytes_in, prev.bytes_in),
                    bytes_out: per_s(c.bytes_out, prev.bytes_out),
                });
            }
        }
        self.last = Some((now, c));
        // Late turns do not make samples bunch up.
        self.next = (self.next + SAMPLE_EVERY).max(now + SAMPLE_EVERY / 2);
        true
    }

    /// The rates, oldest first.
    pub fn rates(&self) -> impl Iterator<Item = &Rate> {
        self.rates.iter()
    }

    /// The latest rate, zero before two samples exist.
    pub fn current(&self) -> Rate {
        self.rates.back().copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(msgs: u64) -> Counters {
        Counters {
            msgs_in: msgs,
            msgs_out: 2 * msgs,
            bytes_in: 100 * msgs,
            bytes_out: 200 * msgs,
        }
    }

    #[test]
    fn rates_per_second_and_bounded() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        assert!(h.sample(t0, c(0)));
        assert!(!h.sample(t0 + Duration::from_millis(500), c(5)));
        assert!(h.sample(t0 + Duration::from_secs(1), c(10)));
        let r = h.current();
        assert_eq!(r.msgs_in, 10.0);
        assert_eq!(r.msgs_out, 20.0);
        assert_eq!(r.bytes_out, 2000.0);
        assert_eq!(r.at_ms, 1000);
        for i in 2..1000u64 {
            h.sample(t0 + Duration::from_secs(i), c(10 * i));
        }
        assert_eq!(h.rates().count(), SAMPLES_MAX);
        assert_eq!(h.current().msgs_in, 10.0);
    }

    #[test]
    fn late_sampling_does_not_bunch() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        h.sample(t0, c(0));
        assert!(h.sample(t0 + Duration::from_secs(10), c(100)));
        assert_eq!(h.current().msgs_in, 10.0);
        assert!(!h.sample(t0 + Duration::from_millis(10_100), c(101)));
        assert!(h.next_at() >= t0 + Duration::from_millis(10_500));
    }
}
