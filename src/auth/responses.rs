//! `allow_responses` bookkeeping for one connection (docs/PROTOCOL.md §11):
//! each request delivered to it opens one publish to its reply subject,
//! good until the request's time runs out. The clock is passed in.

use std::collections::HashMap;
use std::time::Instant;

/// Bound on the reply subjects one connection may hold open at once; past
/// it, expired ones go first, then the one that expires soonest. With
/// subjects of at most 256 bytes this keeps a socket's table under about
/// 300 KiB even when other clients flood it with requests.
pub const RESPONSES_OPEN_MAX: usize = 1024;

#[derive(Debug, Default)]
pub struct Responses {
    /// Reply subject -> until when the one answer may be published.
    open: HashMap<Box<str>, Instant>,
}

impl Responses {
    /// A request with reply subject `reply` was delivered; its answer may
    /// be published until `until`.
    pub fn grant(&mut self, reply: &str, until: Instant, now: Instant) {
        if self.open.len() >= RESPONSES_OPEN_MAX && !self.open.contains_key(reply) {
            self.open.retain(|_, t| *t >= now);
            if self.open.len() >= RESPONSES_OPEN_MAX {
                let soonest = self
                    .open
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    self.open.remove(&k);
                }
            }
        }
        let t = self.open.entry(reply.into()).or_insert(until);
        *t = (*t).max(until);
    }

    /// Uses up the answer to `subject`: true when one was open and still
    /// in time.
    pub fn take(&mut self, subject: &str, now: Instant) -> bool {
        self.open.remove(subject).is_some_and(|until| until >= now)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn clear(&mut self) {
        self.open.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_answer_per_request_within_its_time() {
        let now = Instant::now();
        let mut r = Responses::default();
        r.grant("_INBOX.1", now + Duration::from_secs(1), now);
        assert!(!r.take("_INBOX.2", now), "never delivered");
        assert!(r.take("_INBOX.1", now));
        assert!(!r.take("_INBOX.1", now), "only once");
        r.grant("_INBOX.3", now + Duration::from_millis(10), now);
        assert!(!r.take("_INBOX.3", now + Duration::from_millis(11)), "late");
    }

    #[test]
    fn the_table_is_bounded() {
        let now = Instant::now();
        let mut r = Responses::default();
        for i in 0..RESPONSES_OPEN_MAX + 100 {
            let until = now + Duration::from_millis(1000 + i as u64);
            r.grant(&format!("r.{i}"), until, now);
            assert!(r.len() <= RESPONSES_OPEN_MAX);
        }
        // The newest grants survive; the soonest to expire went.
        assert!(r.take(&format!("r.{}", RESPONSES_OPEN_MAX + 99), now));
        assert!(!r.take("r.0", now));
    }
}
