//! The subscription table and the one `apply` path for control-state
//! changes (subscribe, unsubscribe, auto-unsubscribe, a connection's bulk
//! removal, queue-group rules). A single node applies a [`Command`] at once;
//! in cluster mode the same commands are what gets replicated.

use std::collections::HashMap;
use std::rc::Rc;

use super::groups::{GroupMode, Groups};
use super::subject;
use super::sublist::{Match, Sublist};
use crate::net::ConnId;
use crate::protocol::errors::{ApiError, Code};

/// A subscription's key in the index.
pub type SubKey = u64;

/// The most subscriptions one connection may hold.
pub const SUBS_PER_CONN_MAX: usize = 100_000;
/// The longest client-chosen sid.
pub const SID_BYTES_MAX: usize = 128;

#[derive(Debug)]
pub struct Subscription {
    pub conn: ConnId,
    pub sid: Box<str>,
    /// The sid as a JSON string literal, written into every delivery.
    pub sid_json: Box<str>,
    pub pattern: Box<str>,
    pub queue: Option<Rc<str>>,
    /// Deliveries left before it ends by itself (`max`, `after`).
    pub remaining: Option<u64>,
}

/// A change to control state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Subscribe {
        conn: ConnId,
        sid: String,
        pattern: String,
        queue: Option<String>,
        max: Option<u64>,
    },
    Unsubscribe {
        conn: ConnId,
        sid: String,
        after: Option<u64>,
    },
    /// Every subscription of a connection, when it closes or leaves `/`.
    RemoveConn {
        conn: ConnId,
    },
    GroupSet {
        queue: String,
        mode: GroupMode,
    },
}

#[derive(Debug, Default)]
pub struct SubTable {
    index: Sublist<SubKey>,
    /// Slab of subscriptions indexed by key: a delivery finds its
    /// subscription without hashing. Freed keys are reused.
    subs: Vec<Option<Subscription>>,
    free: Vec<SubKey>,
    count: usize,
    /// Per connection: client sid -> key.
    by_conn: HashMap<ConnId, HashMap<Box<str>, SubKey>>,
    pub groups: Groups,
}

impl SubTable {
    pub fn new() -> SubTable {
        SubTable::default()
    }

    /// Applies one command; the only way control state changes.
    pub fn apply(&mut self, cmd: Command) -> Result<(), ApiError> {
        match cmd {
            Command::Subscribe {
                conn,
                sid,
                pattern,
                queue,
                max,
            } => self.subscribe(conn, sid, pattern, queue, max),
            Command::Unsubscribe { conn, sid, after } => self.unsubscribe(conn, &sid, after),
            Command::RemoveConn { conn } => {
                self.remove_conn(conn);
                Ok(())
            }
            Command::GroupSet { queue, mode } => {
                if self.groups.set(&queue, mode) {
                    Ok(())
                } else {
                    Err(ApiError::new(Code::Limit, "too many queue-group rules"))
                }
            }
        }
    }

    /// Checks a subscribe before it is applied, so a refusal needs no round.
    pub fn check_subscribe(
        &self,
        conn: ConnId,
        sid: &str,
        pattern: &str,
        queue: Option<&str>,
    ) -> Result<(), ApiError> {
        subject::validate_pattern(pattern)
            .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {pattern:?}")))?;
        if let Some(q) = queue {
            check_queue(q)?;
        }
        if sid.is_empty() || sid.len() > SID_BYTES_MAX {
            return Err(ApiError::new(
                Code::BadRequest,
                "sid must be 1 to 128 bytes",
            ));
        }
        if let Some(mine) = self.by_conn.get(&conn) {
            if mine.contains_key(sid) {
                return Err(ApiError::new(
                    Code::BadRequest,
                    format!("sid {sid:?} is already in use on this socket"),
                ));
            }
            if mine.len() >= SUBS_PER_CONN_MAX {
                return Err(ApiError::new(
                    Code::Limit,
                    "too many subscriptions on this socket",
                ));
            }
        }
        Ok(())
    }

    fn subscribe(
        &mut self,
        conn: ConnId,
        sid: String,
        pattern: String,
        queue: Option<String>,
        max: Option<u64>,
    ) -> Result<(), ApiError> {
        self.check_subscribe(conn, &sid, &pattern, queue.as_deref())?;
        let key = self.free.pop().unwrap_or(self.subs.len() as SubKey);
        self.index.insert(&pattern, queue.as_deref(), key);
        let sid: Box<str> = sid.into();
        self.by_conn
            .entry(conn)
            .or_default()
            .insert(sid.clone(), key);
        let sid_json = serde_json::Value::from(&*sid).to_string().into_boxed_str();
        let queue = queue.map(Rc::from);
        let remaining = max.filter(|&m| m > 0);
        let sub = Subscription {
            conn,
            sid,
            sid_json,
            pattern: pattern.into(),
            queue,
            remaining,
        };
        match self.subs.get_mut(key as usize) {
            Some(slot) => *slot = Some(sub),
            None => self.subs.push(Some(sub)),
        }
        self.count += 1;
        Ok(())
    }

    fn unsubscribe(&mut self, conn: ConnId, sid: &str, after: Option<u64>) -> Result<(), ApiError> {
        let key = self
            .by_conn
            .get(&conn)
            .and_then(|m| m.get(sid))
            .copied()
            .ok_or_else(|| {
                ApiError::new(Code::NotFound, format!("no subscription with sid {sid:?}"))
            })?;
        match after {
            Some(n) if n > 0 => {
                if let Some(s) = self.slot_mut(key) {
                    s.remaining = Some(n);
                }
            }
            _ => self.remove_key(key),
        }
        Ok(())
    }

    fn remove_conn(&mut self, conn: ConnId) {
        let Some(mine) = self.by_conn.remove(&conn) else {
            return;
        };
        for key in mine.into_values() {
            if let Some(s) = self.take(key) {
                self.index.remove(&s.pattern, s.queue.as_deref(), key);
            }
        }
    }

    fn remove_key(&mut self, key: SubKey) {
        let Some(s) = self.take(key) else {
            return;
        };
        self.index.remove(&s.pattern, s.queue.as_deref(), key);
        if let Some(mine) = self.by_conn.get_mut(&s.conn) {
            mine.remove(&s.sid);
            if mine.is_empty() {
                self.by_conn.remove(&s.conn);
            }
        }
    }

    /// Counts one delivery to `key`. When its `max` (or `after`) is used
    /// up, returns the command that ends it, for the caller to apply like
    /// any other change (so the removal takes the one `apply` path).
    pub fn delivered(&mut self, key: SubKey) -> Option<Command> {
        let s = self.slot_mut(key)?;
        let left = s.remaining.as_mut()?;
        *left = left.saturating_sub(1);
        (*left == 0).then(|| Command::Unsubscribe {
            conn: s.conn,
            sid: s.sid.to_string(),
            after: None,
        })
    }

    /// Whether `key` may receive: it exists and its `max` is not used up
    /// (a used-up one waits for its removal to be applied).
    pub fn deliverable(&self, key: SubKey) -> Option<&Subscription> {
        self.get(key).filter(|s| s.remaining != Some(0))
    }

    pub fn matches(&mut self, subject: &str) -> Rc<Match<SubKey>> {
        self.index.matches(subject)
    }

    pub fn get(&self, key: SubKey) -> Option<&Subscription> {
        self.subs.get(key as usize)?.as_ref()
    }

    fn slot_mut(&mut self, key: SubKey) -> Option<&mut Subscription> {
        self.subs.get_mut(key as usize)?.as_mut()
    }

    /// Empties a slot and frees its key for reuse.
    fn take(&mut self, key: SubKey) -> Option<Subscription> {
        let s = self.subs.get_mut(key as usize)?.take()?;
        self.free.push(key);
        self.count -= 1;
        Some(s)
    }

    pub fn group_mode(&self, queue: &str) -> GroupMode {
        self.groups.mode(queue)
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn conn_has_sid(&self, conn: ConnId, sid: &str) -> bool {
        self.by_conn.get(&conn).is_some_and(|m| m.contains_key(sid))
    }
}

/// The rule for a queue-group name (in `sub` and in `group.set`): 1 to
/// 256 bytes, no whitespace.
pub fn check_queue(q: &str) -> Result<(), ApiError> {
    if q.is_empty() || q.len() > subject::SUBJECT_BYTES_MAX || q.chars().any(char::is_whitespace) {
        return Err(ApiError::new(
            Code::BadRequest,
            "queue must be a non-empty name of at most 256 bytes without whitespace",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(
        conn: ConnId,
        sid: &str,
        pattern: &str,
        queue: Option<&str>,
        max: Option<u64>,
    ) -> Command {
        Command::Subscribe {
            conn,
            sid: sid.into(),
            pattern: pattern.into(),
            queue: queue.map(Into::into),
            max,
        }
    }

    #[test]
    fn subscribe_match_unsubscribe() {
        let mut t = SubTable::new();
        t.apply(sub(1, "a", "x.*", None, None)).unwrap();
        t.apply(sub(2, "a", "x.>", Some("q"), None)).unwrap();
        let m = t.matches("x.y");
        assert_eq!(m.plain.len(), 1);
        assert_eq!(m.groups.len(), 1);
        assert_eq!(
            t.apply(sub(1, "a", "y", None, None)).unwrap_err().code,
            Code::BadRequest
        );
        assert_eq!(
            t.apply(sub(1, "b", "y..z", None, None)).unwrap_err().code,
            Code::BadSubject
        );
        assert_eq!(
            t.apply(Command::Unsubscribe {
                conn: 1,
                sid: "zz".into(),
                after: None
            })
            .unwrap_err()
            .code,
            Code::NotFound
        );
        t.apply(Command::Unsubscribe {
            conn: 1,
            sid: "a".into(),
            after: None,
        })
        .unwrap();
        assert!(t.matches("x.y").plain.is_empty());
        t.apply(Command::RemoveConn { conn: 2 }).unwrap();
        assert!(t.is_empty());
        assert!(t.matches("x.y").is_empty());
    }

    #[test]
    fn max_and_after_end_subscriptions() {
        let mut t = SubTable::new();
        t.apply(sub(1, "a", "x", None, Some(2))).unwrap();
        let k = t.matches("x").plain[0];
        assert_eq!(t.delivered(k), None);
        assert!(t.deliverable(k).is_some());
        let end = t.delivered(k).expect("max reached");
        assert_eq!(
            end,
            Command::Unsubscribe {
                conn: 1,
                sid: "a".into(),
                after: None
            }
        );
        // Used up: no more deliveries while the removal is pending.
        assert!(t.deliverable(k).is_none());
        t.apply(end).unwrap();
        assert!(t.get(k).is_none());
        assert!(!t.conn_has_sid(1, "a"));
        t.apply(sub(1, "b", "x", None, None)).unwrap();
        let k = t.matches("x").plain[0];
        assert_eq!(t.delivered(k), None, "no max: never ends by itself");
        t.apply(Command::Unsubscribe {
            conn: 1,
            sid: "b".into(),
            after: Some(1),
        })
        .unwrap();
        let end = t.delivered(k).expect("after reached");
        t.apply(end).unwrap();
        assert!(t.matches("x").is_empty());
    }
}
