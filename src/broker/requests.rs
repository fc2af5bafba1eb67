//! Request/reply inboxes: each `request` gets a reply subject of its own;
//! the first message published to it becomes the requester's ack, and a
//! deadline answers `timeout` when none comes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use crate::port::ConnId;

/// Longest wait a client may ask for.
pub const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(300);
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_millis(5000);
/// Requests one connection may have open at once.
pub const REQUESTS_PER_CONN_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub conn: ConnId,
    pub ack_id: u64,
    pub deadline: Instant,
}

#[derive(Debug)]
pub struct Requests {
    prefix: String,
    next: u64,
    open: HashMap<String, Pending>,
    per_conn: HashMap<ConnId, usize>,
    deadlines: BinaryHeap<Reverse<(Instant, String)>>,
}

impl Requests {
    /// `prefix` makes inboxes unique to this node: `_INBOX.<prefix>.`.
    pub fn new(prefix: &str) -> Requests {
        Requests {
            prefix: format!("_INBOX.{prefix}."),
            next: 0,
            open: HashMap::new(),
            per_conn: HashMap::new(),
            deadlines: BinaryHeap::new(),
        }
    }

    /// Opens an inbox for a request; None when the connection has too many.
    pub fn open(&mut self, conn: ConnId, ack_id: u64, deadline: Instant) -> Option<String> {
        let n = self.per_conn.entry(conn).or_default();
        if *n >= REQUESTS_PER_CONN_MAX {
            return None;
        }
        *n += 1;
        self.next += 1;
        let inbox = format!("{}{}", self.prefix, self.next);
        self.open.insert(
            inbox.clone(),
            Pending {
                conn,
                ack_id,
                deadline,
            },
        );
        self.deadlines.push(Reverse((deadline, inbox.clone())));
        Some(inbox)
    }

    /// A fresh inbox subject that no request waits on.
    pub fn unanswered_inbox(&mut self) -> String {
        self.next += 1;
        format!("{}{}", self.prefix, self.next)
    }

    /// Whether `subject` may be one of our inboxes (cheap pre-check).
    pub fn may_be_inbox(&self, subject: &str) -> bool {
        !self.open.is_empty() && subject.starts_with(&self.prefix)
    }

    /// Takes the request waiting on `inbox`, if any.
    pub fn take(&mut self, inbox: &str) -> Option<Pending> {
        let p = self.open.remove(inbox)?;
        self.release(p.conn);
        self.prune();
        Some(p)
    }

    /// Drops the deadlines of requests no longer open, once they are most
    /// of the heap: a deadline stays there when its request is answered,
    /// and would otherwise keep memory for up to [`REQUEST_TIMEOUT_MAX`]
    /// and wake the loop for nothing (with no request open, a passed one
    /// would never be taken out).
    fn prune(&mut self) {
        if self.open.is_empty() {
            self.deadlines.clear();
        } else if self.deadlines.len() > 2 * self.open.len() + 64 {
            let open = &self.open;
            self.deadlines
                .retain(|Reverse((_, inbox))| open.contains_key(inbox));
        }
    }

    fn release(&mut self, conn: ConnId) {
        if let Some(n) = self.per_conn.get_mut(&conn) {
            *n -= 1;
            if *n == 0 {
                self.per_conn.remove(&conn);
            }
        }
    }

    /// Forgets every request of a connection that went away.
    pub fn drop_conn(&mut self, conn: ConnId) {
        if self.per_conn.remove(&conn).is_some() {
            self.open.retain(|_, p| p.conn != conn);
            self.prune();
        }
    }

    /// Requests whose deadline has passed, removed.
    pub fn expired(&mut self, now: Instant) -> Vec<Pending> {
        let mut out = Vec::new();
        while let Some(Reverse((at, _))) = self.deadlines.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, inbox))) = self.deadlines.pop() else {
                break;
            };
            if let Some(p) = self.open.remove(&inbox) {
                self.release(p.conn);
                out.push(p);
            }
        }
        if self.open.is_empty() {
            self.deadlines.clear();
        }
        out
    }

    /// The next deadline (perhaps of a request answered since: the loop
    /// then wakes once for nothing).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((at, _))| *at)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Keeps a node id usable inside a subject token.
pub(crate) fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inboxes_are_unique_and_answered_once() {
        let t0 = Instant::now();
        let mut r = Requests::new("n1");
        let a = r.open(1, 7, t0 + Duration::from_secs(1)).unwrap();
        let b = r.open(1, 8, t0 + Duration::from_secs(1)).unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("_INBOX.n1."));
        assert!(r.may_be_inbox(&a));
        assert_eq!(r.take(&a).map(|p| p.ack_id), Some(7));
        assert_eq!(r.take(&a), None);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn deadlines_expire_in_order_and_dropped_conns_vanish() {
        let t0 = Instant::now();
        let mut r = Requests::new("n1");
        r.open(1, 1, t0 + Duration::from_millis(10));
        r.open(2, 2, t0 + Duration::from_millis(20));
        r.open(2, 3, t0 + Duration::from_millis(30));
        assert!(r.expired(t0).is_empty());
        assert_eq!(
            r.expired(t0 + Duration::from_millis(20))
                .iter()
                .map(|p| p.ack_id)
                .collect::<Vec<_>>(),
            vec![1, 2]
        );
        r.drop_conn(2);
        assert!(r.is_empty());
        assert!(r.expired(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(r.next_deadline(), None);
    }

    /// An answered request leaves no deadline behind that would wake the
    /// loop at once, forever, with no request open (the loop's poll
    /// timeout is the next deadline), nor one that holds memory until it
    /// passes.
    #[test]
    fn answered_requests_leave_no_deadline_behind() {
        let t0 = Instant::now();
        let mut r = Requests::new("n1");
        let a = r.open(1, 1, t0 + Duration::from_millis(10)).unwrap();
        r.take(&a);
        assert_eq!(r.next_deadline(), None);
        // Many answered while one stays open: the heap stays near the
        // open count.
        let keep = r.open(1, 2, t0 + REQUEST_TIMEOUT_MAX).unwrap();
        for i in 0..10_000 {
            let x = r.open(2, i, t0 + REQUEST_TIMEOUT_MAX).unwrap();
            r.take(&x);
        }
        assert!(
            r.deadlines.len() <= 2 * r.len() + 65,
            "{}",
            r.deadlines.len()
        );
        assert_eq!(r.next_deadline(), Some(t0 + REQUEST_TIMEOUT_MAX));
        r.drop_conn(1);
        assert!(r.is_empty());
        assert_eq!(r.next_deadline(), None);
        assert!(r.take(&keep).is_none());
    }
}
