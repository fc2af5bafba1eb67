//! The subscription table and the one `apply` path for its changes
//! (subscribe, unsubscribe, auto-unsubscribe, a connection's or a node's
//! bulk removal, queue-group rules). A single node applies a [`Command`] at
//! once; in cluster mode the same commands are replicated through Raft and
//! every node holds every node's subscriptions, each marked with its
//! [`Owner`]. Only the owning node delivers to a subscription: it maps the
//! owner's connection serial back to its live socket.
//!
//! A delivery is checked against the socket's identity right before it is
//! written: the subscription names its connection slot and its socket's
//! serial, and the table knows which serial holds each slot now. A slot
//! that changed hands (the socket closed or joined `/` afresh) makes the
//! subscription stale: it is dropped, never delivered to whoever holds the
//! slot now.

use std::collections::HashMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use super::groups::{GroupMode, Groups};
use super::sublist::{Match, Sublist};
use crate::port::ConnId;
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::subject;

/// A subscription's key in the index.
pub type SubKey = u64;

/// The most subscriptions one connection may hold.
pub const SUBS_PER_CONN_MAX: usize = 100_000;
/// The longest client-chosen sid.
pub const SID_BYTES_MAX: usize = 128;

/// Who holds a subscription: a node (its Raft id; 1 on a single node)
/// and a connection serial that node never reuses. The serial's high 32
/// bits are the node's boot id, so a restarted node's serials differ from
/// its earlier life's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner {
    pub node: u64,
    pub conn: u64,
}

impl Owner {
    /// The boot id part of the connection serial.
    pub fn boot(self) -> u64 {
        self.conn >> 32
    }
}

#[derive(Debug)]
pub struct Subscription {
    pub owner: Owner,
    /// The local socket, meaningful only while `local` is true.
    pub conn: ConnId,
    /// Owned by this node and its socket is still open.
    pub local: bool,
    pub sid: Box<str>,
    /// The sid as a JSON string literal, written into every delivery.
    pub sid_json: Box<str>,
    pub pattern: Box<str>,
    pub queue: Option<Rc<str>>,
    /// Deliveries left before it ends by itself (`max`, `after`).
    pub remaining: Option<u64>,
}

/// A change to the subscription table. Written by serde as an object
/// with an `op` member; read back by `cluster/entry_json.rs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    Subscribe {
        owner: Owner,
        sid: String,
        pattern: String,
        queue: Option<String>,
        max: Option<u64>,
    },
    Unsubscribe {
        owner: Owner,
        sid: String,
        after: Option<u64>,
    },
    /// Every subscription of a connection, when it closes or leaves `/`.
    RemoveConn {
        owner: Owner,
    },
    /// Every subscription of a node the cluster declared gone, made in
    /// its life `boot` (all of them when `None`): a node that restarted
    /// meanwhile keeps what its new life subscribed.
    RemoveNode {
        node: u64,
        boot: Option<u64>,
    },
    /// A node (re)started with boot id `boot`: subscriptions left from its
    /// earlier lives go.
    NodeUp {
        node: u64,
        boot: u64,
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
    /// Per owner: client sid -> key.
    by_conn: HashMap<Owner, HashMap<Box<str>, SubKey>>,
    pub groups: Groups,
    /// This node's id, for telling its own subscriptions apart.
    me: u64,
    /// This node's open connections: serial -> socket.
    local_conns: HashMap<u64, ConnId>,
    /// Per connection slot: the serial of the socket in `/` on it now (0
    /// when none). A delivery goes out only if it names this serial.
    slots: Vec<u64>,
    /// Subscriptions found stale at delivery time and dropped.
    pub stale_dropped: u64,
    /// Subscriptions whose `max` was used up by a delivery: the removals
    /// the broker still has to apply (or propose) through the one path.
    pub ended: Vec<Command>,
}

impl SubTable {
    /// A table for node `me` (1 on a single node).
    pub fn new(me: u64) -> SubTable {
        SubTable {
            me,
            ..SubTable::default()
        }
    }

    pub fn me(&self) -> u64 {
        self.me
    }

    /// An owner of this node for connection serial `conn`.
    pub fn local_owner(&self, conn: u64) -> Owner {
        Owner {
            node: self.me,
            conn,
        }
    }

    /// Forgets every subscription and rule (a snapshot is about to be
    /// loaded) but keeps which sockets are open here.
    pub fn clear_replicated(&mut self) {
        let me = self.me;
        let local_conns = std::mem::take(&mut self.local_conns);
        let slots = std::mem::take(&mut self.slots);
        let stale_dropped = self.stale_dropped;
        *self = SubTable {
            me,
            local_conns,
            slots,
            stale_dropped,
            ..SubTable::default()
        };
    }

    /// Records that this node's connection `serial` is socket `conn`.
    pub fn attach_local(&mut self, serial: u64, conn: ConnId) {
        self.local_conns.insert(serial, conn);
        if self.slots.len() <= conn {
            self.slots.resize(conn + 1, 0);
        }
        self.slots[conn] = serial;
    }

    /// This node's connection `serial` closed: its subscriptions stop
    /// receiving at once, before their removal is applied.
    pub fn detach_local(&mut self, serial: u64) {
        if let Some(conn) = self.local_conns.remove(&serial) {
            if let Some(on_slot) = self.slots.get_mut(conn).filter(|s| **s == serial) {
                *on_slot = 0;
            }
        }
        let owner = self.local_owner(serial);
        let keys: Vec<SubKey> = self
            .by_conn
            .get(&owner)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        for key in keys {
            if let Some(s) = self.slot_mut(key) {
                s.local = false;
            }
        }
    }

    /// Applies one command; the only way control state changes.
    pub fn apply(&mut self, cmd: Command) -> Result<(), ApiError> {
        match cmd {
            Command::Subscribe {
                owner,
                sid,
                pattern,
                queue,
                max,
            } => self.subscribe(owner, sid, pattern, queue, max),
            Command::Unsubscribe { owner, sid, after } => self.unsubscribe(owner, &sid, after),
            Command::RemoveConn { owner } => {
                self.remove_conn(owner);
                Ok(())
            }
            Command::RemoveNode { node, boot } => {
                self.remove_owners(|o| o.node == node && boot.is_none_or(|b| o.boot() == b));
                Ok(())
            }
            Command::NodeUp { node, boot } => {
                self.remove_owners(|o| o.node == node && o.boot() != boot);
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
        owner: Owner,
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
        if let Some(mine) = self.by_conn.get(&owner) {
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
        owner: Owner,
        sid: String,
        pattern: String,
        queue: Option<String>,
        max: Option<u64>,
    ) -> Result<(), ApiError> {
        self.check_subscribe(owner, &sid, &pattern, queue.as_deref())?;
        let key = self.free.pop().unwrap_or(self.subs.len() as SubKey);
        self.index.insert(&pattern, queue.as_deref(), key);
        let sid: Box<str> = sid.into();
        self.by_conn
            .entry(owner)
            .or_default()
            .insert(sid.clone(), key);
        let local = if owner.node == self.me {
            self.local_conns.get(&owner.conn).copied()
        } else {
            None
        };
        let sid_json = serde_json::Value::from(&*sid).to_string().into_boxed_str();
        let queue = queue.map(Rc::from);
        let remaining = max.filter(|&m| m > 0);
        let sub = Subscription {
            owner,
            conn: local.unwrap_or(ConnId::MAX),
            local: local.is_some(),
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

    fn unsubscribe(&mut self, owner: Owner, sid: &str, after: Option<u64>) -> Result<(), ApiError> {
        let key = self
            .by_conn
            .get(&owner)
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

    /// Removes every subscription of the owners `which` selects.
    fn remove_owners(&mut self, which: impl Fn(Owner) -> bool) {
        let owners: Vec<Owner> = self.by_conn.keys().copied().filter(|&o| which(o)).collect();
        for o in owners {
            self.remove_conn(o);
        }
    }

    fn remove_conn(&mut self, owner: Owner) {
        let Some(mine) = self.by_conn.remove(&owner) else {
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
        if let Some(mine) = self.by_conn.get_mut(&s.owner) {
            mine.remove(&s.sid);
            if mine.is_empty() {
                self.by_conn.remove(&s.owner);
            }
        }
    }

    /// Counts one delivery to `key`. When its `max` (or `after`) is used
    /// up, returns the command that ends it, for the caller to apply like
    /// any other change (so the removal takes the one `apply` path).
    #[inline]
    pub fn delivered(&mut self, key: SubKey) -> Option<Command> {
        let s = self.slot_mut(key)?;
        let left = s.remaining.as_mut()?;
        *left = left.saturating_sub(1);
        (*left == 0).then(|| Command::Unsubscribe {
            owner: s.owner,
            sid: s.sid.to_string(),
            after: None,
        })
    }

    /// Whether `key` may receive here: it exists, this node owns it, its
    /// socket is open and still holds the slot it names, and its `max` is
    /// not used up (a used-up one waits for its removal to be applied).
    pub fn deliverable(&self, key: SubKey) -> Option<&Subscription> {
        self.get(key)
            .filter(|s| s.local && s.remaining != Some(0) && self.holds_slot(s))
    }

    /// Whether the socket `s` was made on is the one on its slot now.
    fn holds_slot(&self, s: &Subscription) -> bool {
        self.slots.get(s.conn) == Some(&s.owner.conn)
    }

    /// [`SubTable::deliverable`], called right before a delivery is
    /// written. A subscription whose slot changed hands is stale: its
    /// owner's subscriptions stop receiving and their removal is queued in
    /// `ended` (the one removal path); it is never delivered.
    pub fn target(&mut self, key: SubKey) -> Option<&Subscription> {
        let s = self.get(key)?;
        if s.local && !self.holds_slot(s) {
            let owner = s.owner;
            let mut dropped = 0;
            for k in self
                .by_conn
                .get(&owner)
                .into_iter()
                .flat_map(|m| m.values())
            {
                if let Some(Some(sub)) = self.subs.get_mut(*k as usize) {
                    dropped += u64::from(std::mem::take(&mut sub.local));
                }
            }
            self.stale_dropped += dropped;
            self.ended.push(Command::RemoveConn { owner });
            crate::log_warn!(
                "dropped {dropped} stale subscriptions of socket {:x}",
                owner.conn
            );
            return None;
        }
        self.deliverable(key)
    }

    /// Every subscription, in key order (for snapshots and listings).
    pub fn iter(&self) -> impl Iterator<Item = &Subscription> {
        self.subs.iter().flatten()
    }

    /// Whether `owner` holds any subscription.
    pub fn has_owner(&self, owner: Owner) -> bool {
        self.by_conn.contains_key(&owner)
    }

    /// A subscription of `owner` by its sid.
    pub fn find(&self, owner: Owner, sid: &str) -> Option<SubKey> {
        self.by_conn.get(&owner)?.get(sid).copied()
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

    pub fn conn_has_sid(&self, owner: Owner, sid: &str) -> bool {
        self.by_conn
            .get(&owner)
            .is_some_and(|m| m.contains_key(sid))
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

    fn own(conn: u64) -> Owner {
        Owner { node: 1, conn }
    }

    /// A table whose connections 1 and 2 are open on this node.
    fn table() -> SubTable {
        let mut t = SubTable::new(1);
        t.attach_local(1, 1);
        t.attach_local(2, 2);
        t
    }

    fn sub(conn: u64, sid: &str, pattern: &str, queue: Option<&str>, max: Option<u64>) -> Command {
        Command::Subscribe {
            owner: own(conn),
            sid: sid.into(),
            pattern: pattern.into(),
            queue: queue.map(Into::into),
            max,
        }
    }

    #[test]
    fn subscribe_match_unsubscribe() {
        let mut t = table();
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
                owner: own(1),
                sid: "zz".into(),
                after: None
            })
            .unwrap_err()
            .code,
            Code::NotFound
        );
        t.apply(Command::Unsubscribe {
            owner: own(1),
            sid: "a".into(),
            after: None,
        })
        .unwrap();
        assert!(t.matches("x.y").plain.is_empty());
        t.apply(Command::RemoveConn { owner: own(2) }).unwrap();
        assert!(t.is_empty());
        assert!(t.matches("x.y").is_empty());
    }

    #[test]
    fn max_and_after_end_subscriptions() {
        let mut t = table();
        t.apply(sub(1, "a", "x", None, Some(2))).unwrap();
        let k = t.matches("x").plain[0];
        assert_eq!(t.delivered(k), None);
        assert!(t.deliverable(k).is_some());
        let end = t.delivered(k).expect("max reached");
        assert_eq!(
            end,
            Command::Unsubscribe {
                owner: own(1),
                sid: "a".into(),
                after: None
            }
        );
        // Used up: no more deliveries while the removal is pending.
        assert!(t.deliverable(k).is_none());
        t.apply(end).unwrap();
        assert!(t.get(k).is_none());
        assert!(!t.conn_has_sid(own(1), "a"));
        t.apply(sub(1, "b", "x", None, None)).unwrap();
        let k = t.matches("x").plain[0];
        assert_eq!(t.delivered(k), None, "no max: never ends by itself");
        t.apply(Command::Unsubscribe {
            owner: own(1),
            sid: "b".into(),
            after: Some(1),
        })
        .unwrap();
        let end = t.delivered(k).expect("after reached");
        t.apply(end).unwrap();
        assert!(t.matches("x").is_empty());
    }
}

#[cfg(test)]
mod owner_tests {
    use super::*;

    fn sub(node: u64, conn: u64, sid: &str) -> Command {
        Command::Subscribe {
            owner: Owner { node, conn },
            sid: sid.into(),
            pattern: "x".into(),
            queue: None,
            max: None,
        }
    }

    #[test]
    fn only_open_local_subscriptions_are_deliverable() {
        let boot = 7u64 << 32;
        let mut t = SubTable::new(1);
        t.attach_local(boot | 1, 10);
        t.apply(sub(1, boot | 1, "a")).unwrap();
        t.apply(sub(2, 5, "a")).unwrap();
        let m = t.matches("x");
        let local: Vec<_> = m.plain.iter().filter_map(|&k| t.deliverable(k)).collect();
        assert_eq!(local.len(), 1);
        assert_eq!(local[0].conn, 10);
        t.detach_local(boot | 1);
        assert!(m.plain.iter().all(|&k| t.deliverable(k).is_none()));
        assert_eq!(t.len(), 2, "closing stops delivery; removal is a command");
    }

    #[test]
    fn a_slot_that_changed_hands_never_receives_an_old_subscription() {
        let boot = 7u64 << 32;
        let mut t = SubTable::new(1);
        // Socket serial 1 on slot 3 subscribes; serial 2 takes the slot
        // without serial 1 having been detached.
        t.attach_local(boot | 1, 3);
        t.apply(sub(1, boot | 1, "old")).unwrap();
        t.apply(sub(1, boot | 1, "old2")).unwrap();
        t.attach_local(boot | 2, 3);
        t.apply(sub(1, boot | 2, "new")).unwrap();
        let m = t.matches("x");
        let mut sent: Vec<String> = Vec::new();
        for &k in &m.plain {
            if let Some(s) = t.target(k) {
                assert_eq!(s.conn, 3);
                sent.push(s.sid.to_string());
            }
        }
        assert_eq!(sent, vec!["new".to_string()]);
        assert_eq!(t.stale_dropped, 2, "both of the old socket's");
        assert_eq!(
            t.ended,
            vec![Command::RemoveConn {
                owner: Owner {
                    node: 1,
                    conn: boot | 1
                }
            }]
        );
        for cmd in std::mem::take(&mut t.ended) {
            t.apply(cmd).unwrap();
        }
        assert_eq!(t.len(), 1);
        // Detaching the old serial now leaves the new holder in place.
        t.detach_local(boot | 1);
        let k = t.matches("x").plain[0];
        assert!(t.deliverable(k).is_some());
    }

    #[test]
    fn node_removal_and_restart() {
        let mut t = SubTable::new(1);
        t.apply(sub(2, (1 << 32) | 1, "a")).unwrap();
        t.apply(sub(2, (1 << 32) | 2, "a")).unwrap();
        t.apply(sub(3, 1, "a")).unwrap();
        t.apply(Command::NodeUp { node: 2, boot: 1 }).unwrap();
        assert_eq!(t.len(), 3, "same boot: nothing goes");
        t.apply(Command::NodeUp { node: 2, boot: 2 }).unwrap();
        assert_eq!(t.len(), 1, "a new boot drops the earlier life's");
        t.apply(sub(3, (5 << 32) | 1, "b")).unwrap();
        t.apply(Command::RemoveNode {
            node: 3,
            boot: Some(5),
        })
        .unwrap();
        assert_eq!(
            t.len(),
            1,
            "only the life declared gone loses its subscriptions"
        );
        t.apply(Command::RemoveNode {
            node: 3,
            boot: None,
        })
        .unwrap();
        assert!(t.is_empty());
        assert!(t.matches("x").is_empty());
    }

    #[test]
    fn commands_are_written_as_json_objects_with_an_op() {
        let c = Command::GroupSet {
            queue: "q".into(),
            mode: GroupMode::Broadcast,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"op":"group_set","queue":"q","mode":"broadcast"}"#);
    }
}
