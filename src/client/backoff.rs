//! Reconnect policy of the Rust client: capped exponential backoff with
//! jitter. A pure decision core: it hands out delays and never sleeps or
//! reads a clock; its random source is seeded by the caller, so a sequence
//! can be replayed in a test.

use std::time::Duration;

/// How a client reconnects after its connection drops.
///
/// Attempt `n` (from 0) waits `min(max, initial * 2^n)`, less a random part
/// of up to `jitter` of it, so that many clients cut off together do not
/// return in lockstep. The defaults: 50 ms doubling to 2 s, jitter 0.5 (each
/// wait is drawn from `[d/2, d]`), retrying forever.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reconnect {
    /// The wait before the first attempt.
    pub initial: Duration,
    /// The cap on any wait.
    pub max: Duration,
    /// The fraction of each wait that is random, from 0 (none) to 1 (the
    /// whole wait is drawn from `[0, d]`). Values outside are clamped.
    pub jitter: f64,
    /// Attempts before the client gives up and closes; `None` retries
    /// forever.
    pub max_attempts: Option<u32>,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
            jitter: 0.5,
            max_attempts: None,
        }
    }
}

/// The waits of one outage, attempt by attempt.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    policy: Reconnect,
    attempts: u32,
    rng: u64,
}

impl Backoff {
    /// `seed` feeds the jitter; any value works.
    pub(crate) fn new(policy: Reconnect, seed: u64) -> Self {
        Backoff {
            policy,
            attempts: 0,
            rng: seed,
        }
    }

    /// Attempts handed out so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The wait before the next attempt, or `None` once `max_attempts` are
    /// used up.
    pub(crate) fn next_delay(&mut self) -> Option<Duration> {
        if self
            .policy
            .max_attempts
            .is_some_and(|max| self.attempts >= max)
        {
            return None;
        }
        let base = self.base(self.attempts);
        self.attempts = self.attempts.saturating_add(1);
        let jitter = if self.policy.jitter.is_nan() {
            0.0
        } else {
            self.policy.jitter.clamp(0.0, 1.0)
        };
        Some(base.mul_f64(1.0 - jitter * self.unit()))
    }

    /// `min(max, initial * 2^attempt)` without overflow.
    fn base(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.policy
            .initial
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.policy.max)
    }

    /// A number in `[0, 1)` from [`crate::rand::splitmix64`].
    fn unit(&mut self) -> f64 {
        let bits = crate::rand::splitmix64(&mut self.rng) >> 11;
        // 53 random bits over 2^53: exactly representable, below 1.
        bits as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_jitter_waits_double_up_to_the_cap() {
        let policy = Reconnect {
            jitter: 0.0,
            ..Reconnect::default()
        };
        let mut backoff = Backoff::new(policy, 7);
        let waits: Vec<_> = (0..9).map(|_| backoff.next_delay().unwrap()).collect();
        let expected = [50, 100, 200, 400, 800, 1600, 2000, 2000, 2000].map(ms);
        assert_eq!(waits, expected);
        assert_eq!(backoff.attempts(), 9);
    }

    #[test]
    fn jitter_stays_within_its_share_and_varies() {
        for seed in [1, 2, 42, u64::MAX] {
            let mut backoff = Backoff::new(Reconnect::default(), seed);
            let mut seen = Vec::new();
            for attempt in 0..40u32 {
                let base = ms(50)
                    .checked_mul(1 << attempt.min(20))
                    .unwrap()
                    .min(ms(2000));
                let wait = backoff.next_delay().unwrap();
                assert!(
                    wait <= base,
                    "seed {seed} attempt {attempt}: {wait:?} > {base:?}"
                );
                assert!(wait >= base / 2, "seed {seed} attempt {attempt}: {wait:?}");
                seen.push(wait);
            }
            let capped = &seen[10..];
            assert!(
                capped.iter().any(|w| *w != capped[0]),
                "seed {seed}: jitter never varied"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_waits() {
        let run = |seed| {
            let mut backoff = Backoff::new(Reconnect::default(), seed);
            (0..10).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(99), run(99));
        assert_ne!(run(99), run(100));
    }

    #[test]
    fn gives_up_after_max_attempts() {
        let policy = Reconnect {
            max_attempts: Some(3),
            ..Reconnect::default()
        };
        let mut backoff = Backoff::new(policy, 5);
        assert!((0..3).all(|_| backoff.next_delay().is_some()));
        assert_eq!(backoff.next_delay(), None);
        assert_eq!(backoff.attempts(), 3);
        let never = Reconnect {
            max_attempts: Some(0),
            ..Reconnect::default()
        };
        assert_eq!(Backoff::new(never, 5).next_delay(), None);
    }

    #[test]
    fn odd_settings_stay_bounded() {
        let full = Reconnect {
            jitter: 7.0,
            initial: Duration::MAX,
            max: ms(10),
            max_attempts: None,
        };
        let mut backoff = Backoff::new(full, 3);
        for _ in 0..100 {
            assert!(backoff.next_delay().unwrap() <= ms(10));
        }
        let nan = Reconnect {
            jitter: f64::NAN,
            ..Reconnect::default()
        };
        assert_eq!(Backoff::new(nan, 3).next_delay(), Some(ms(50)));
    }
}
