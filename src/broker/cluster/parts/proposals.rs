//! Proposals: this node's control-state changes waiting to come back
//! committed (by operation number, in the order they are offered to a
//! leader, with their stage, retry time and deadline), the proposals made
//! for peers' `cluster.command`s (by tag), and the creates of replicated
//! streams waiting for their group's first leader. It decides what is due
//! and what has expired; the broker talks to Raft and the links.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::cluster::api::{Change, Cmd, GroupId};
use crate::port::ConnId;

/// How long a client's change may wait for a leader before it is refused
/// with `unavailable` (the contract allows 5 s).
pub const PROPOSE_WAIT: Duration = Duration::from_secs(4);
/// How long the broker's own changes (a closed socket's removal, a node's
/// removal) keep being retried.
const INTERNAL_WAIT: Duration = Duration::from_secs(120);
/// Pause between attempts to hand a change to a leader.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// Most changes waiting for a leader at once (and most proposals made for
/// peers); more are refused.
const WAITERS_MAX: usize = 100_000;
/// The part of the boot id an operation number carries (bits 32-57 of
/// the number): the bits above mark the link tags of other kinds.
const OP_BOOT_MASK: u64 = (1 << 26) - 1;

/// Who gets the answer to a change once it is applied.
#[derive(Debug, Clone)]
pub(crate) struct ChangeAck {
    pub conn: ConnId,
    pub nsp: &'static str,
    pub ack_id: u64,
    /// The ack body on success.
    pub ok_body: String,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Stage {
    /// Not (or no longer) with a leader; retry at `next_try`.
    Waiting,
    /// Handed to a leader; waiting for it to come back committed.
    Sent,
}

struct Waiter {
    data: Vec<u8>,
    reply: Option<ChangeAck>,
    deadline: Instant,
    stage: Stage,
    next_try: Instant,
}

/// A waiting change taken off: it came back, or its time ran out.
pub(crate) struct Taken {
    /// Whom to answer (`None`: one of the broker's own changes).
    pub reply: Option<ChangeAck>,
    /// When the change was made (for a client's change; a broker's own
    /// has no use for it).
    pub made: Instant,
}

/// The `stream.create` of a new replicated stream, applied and waiting for
/// its group's first leader.
struct CreateWait {
    reply: ChangeAck,
    group: GroupId,
    deadline: Instant,
}

/// This node's changes waiting for Raft, and the proposals made for peers.
pub(crate) struct Proposals {
    /// By operation number: handed to leaders in this order.
    waiters: BTreeMap<u64, Waiter>,
    /// This node's operation numbers: boot id, then a counter.
    next_op: u64,
    /// Proposals made for peers: tag -> the peer's control socket and ack.
    remote: HashMap<u64, (ConnId, u64)>,
    /// Creates of replicated streams waiting for their group's leader.
    created: Vec<CreateWait>,
}

impl Proposals {
    /// The proposals of a node that started with boot id `boot`.
    pub(crate) fn new(boot: u64) -> Proposals {
        Proposals {
            waiters: BTreeMap::new(),
            // Operation numbers carry (26 bits of) the boot id, so an entry
            // from this node's earlier life, replayed from the log, answers
            // nobody; they stay below the bits that mark the other tags.
            next_op: (boot & OP_BOOT_MASK) << 32,
            remote: HashMap::new(),
            created: Vec::new(),
        }
    }

    /// Whether a change a client waits for must be refused: too many wait.
    pub(crate) fn full(&self) -> bool {
        self.waiters.len() >= WAITERS_MAX
    }

    /// Node `me`'s change `cmd`, made at `now`, waits to be offered to a
    /// leader; its operation number is returned. With `reply` it is a
    /// client's and waits [`PROPOSE_WAIT`], else the broker's own.
    pub(crate) fn submit(
        &mut self,
        me: u64,
        cmd: Cmd,
        reply: Option<ChangeAck>,
        now: Instant,
    ) -> u64 {
        self.next_op += 1;
        let op = self.next_op;
        let entry = Change { node: me, op, cmd };
        let wait = if reply.is_some() {
            PROPOSE_WAIT
        } else {
            INTERNAL_WAIT
        };
        self.waiters.insert(
            op,
            Waiter {
                data: entry.encode(),
                reply,
                deadline: now + wait,
                stage: Stage::Waiting,
                next_try: now,
            },
        );
        op
    }

    /// The encoded entry of change `op` and the time it has left, if it is
    /// waiting and due to be offered at `now`; its next try is then set
    /// [`RETRY_EVERY`] later. The caller marks it [`Proposals::sent`] once
    /// a leader has it.
    pub(crate) fn due(&mut self, op: u64, now: Instant) -> Option<(&[u8], Duration)> {
        let w = self.waiters.get_mut(&op)?;
        if w.stage != Stage::Waiting || w.next_try > now {
            return None;
        }
        w.next_try = now + RETRY_EVERY;
        Some((&w.data, w.deadline.saturating_duration_since(now)))
    }

    /// Change `op` is with a leader.
    pub(crate) fn sent(&mut self, op: u64) {
        if let Some(w) = self.waiters.get_mut(&op) {
            w.stage = Stage::Sent;
        }
    }

    /// Change `op` did not reach a leader (refused, or its call failed):
    /// it is offered again at its next try.
    pub(crate) fn unsent(&mut self, op: u64) {
        if let Some(w) = self.waiters.get_mut(&op) {
            w.stage = Stage::Waiting;
        }
    }

    /// The leader changed: whatever was with the old one may be lost, so
    /// every change is offered again from `now`.
    pub(crate) fn offer_all_again(&mut self, now: Instant) {
        for w in self.waiters.values_mut() {
            w.stage = Stage::Waiting;
            w.next_try = now;
        }
    }

    /// The changes waiting to be offered, in operation order.
    pub(crate) fn waiting(&self) -> Vec<u64> {
        self.waiters
            .iter()
            .filter(|(_, w)| w.stage == Stage::Waiting)
            .map(|(op, _)| *op)
            .collect()
    }

    /// Whether change `op` still waits to be offered.
    pub(crate) fn is_waiting(&self, op: u64) -> bool {
        self.waiters
            .get(&op)
            .is_some_and(|w| w.stage == Stage::Waiting)
    }

    /// Takes change `op` off (it came back committed, or stale).
    pub(crate) fn take(&mut self, op: u64) -> Option<Taken> {
        self.waiters.remove(&op).map(|w| Taken {
            made: w.deadline.checked_sub(PROPOSE_WAIT).unwrap_or(w.deadline),
            reply: w.reply,
        })
    }

    /// Takes off every change whose deadline is `now` or past, in
    /// operation order.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Taken> {
        let expired: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(op, _)| *op)
            .collect();
        expired.iter().filter_map(|&op| self.take(op)).collect()
    }

    /// Whether no more proposals for peers can wait.
    pub(crate) fn remote_full(&self) -> bool {
        self.remote.len() >= WAITERS_MAX
    }

    /// The proposal with tag `tag` was made for control socket `conn`'s
    /// `cluster.command` `ack_id`.
    pub(crate) fn add_remote(&mut self, tag: u64, conn: ConnId, ack_id: u64) {
        self.remote.insert(tag, (conn, ack_id));
    }

    /// The socket and ack id the proposal with tag `tag` answers.
    pub(crate) fn take_remote(&mut self, tag: u64) -> Option<(ConnId, u64)> {
        self.remote.remove(&tag)
    }

    /// A new replicated stream's create, answered by `reply`, waits for
    /// group `group`'s first leader until `deadline`.
    pub(crate) fn wait_for_leader(&mut self, reply: ChangeAck, group: GroupId, deadline: Instant) {
        self.created.push(CreateWait {
            reply,
            group,
            deadline,
        });
    }

    /// Takes off the creates whose group has a leader (`led`) or whose
    /// deadline is `now` or past: each reply, and whether its group is led.
    pub(crate) fn created_done(
        &mut self,
        now: Instant,
        led: impl Fn(GroupId) -> bool,
    ) -> Vec<(ChangeAck, bool)> {
        if self.created.is_empty() {
            return Vec::new();
        }
        let (done, wait): (Vec<CreateWait>, Vec<CreateWait>) = std::mem::take(&mut self.created)
            .into_iter()
            .partition(|w| led(w.group) || w.deadline <= now);
        self.created = wait;
        done.into_iter()
            .map(|w| {
                let led = led(w.group);
                (w.reply, led)
            })
            .collect()
    }

    /// Socket `conn` ended, in namespace `nsp` only or (`None`) whole:
    /// nothing waiting is answered on it any more (its slot may be reused).
    pub(crate) fn forget(&mut self, conn: ConnId, nsp: Option<&str>) {
        for w in self.waiters.values_mut() {
            if w.reply
                .as_ref()
                .is_some_and(|r| r.conn == conn && nsp.is_none_or(|n| r.nsp == n))
            {
                w.reply = None;
            }
        }
        if nsp.is_none() {
            self.remote.retain(|_, (c, _)| *c != conn);
        }
        self.created.retain(|w| w.reply.conn != conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::subs::Command;

    fn cmd(n: u64) -> Cmd {
        Cmd::Subs(Command::NodeUp { node: n, boot: 1 })
    }

    fn ack(conn: ConnId, nsp: &'static str) -> ChangeAck {
        ChangeAck {
            conn,
            nsp,
            ack_id: conn as u64 * 10,
            ok_body: "[{\"ok\":true}]".into(),
        }
    }

    #[test]
    fn changes_are_numbered_in_order_and_offered_oldest_first() {
        let now = Instant::now();
        let mut p = Proposals::new(0x1234);
        let a = p.submit(1, cmd(1), None, now);
        let b = p.submit(1, cmd(2), Some(ack(3, "/")), now);
        let c = p.submit(1, cmd(3), None, now);
        assert!(a < b && b < c);
        assert_eq!(a >> 32, 0x1234, "the boot id is in the number");
        assert_eq!(p.waiting(), vec![a, b, c]);
        // The entry carries this node and the operation number.
        let (data, _) = p.due(b, now).unwrap();
        let entry = Change::decode(data).unwrap();
        assert_eq!((entry.node, entry.op), (1, b));
        p.sent(b);
        assert_eq!(p.waiting(), vec![a, c]);
        assert!(!p.is_waiting(b));
        p.unsent(b);
        assert_eq!(p.waiting(), vec![a, b, c]);
    }

    #[test]
    fn a_change_is_due_again_only_after_the_retry_pause() {
        let now = Instant::now();
        let mut p = Proposals::new(1);
        let op = p.submit(1, cmd(1), Some(ack(3, "/")), now);
        let (_, left) = p.due(op, now).unwrap();
        assert_eq!(left, PROPOSE_WAIT);
        // Not handed over (no leader): still waiting, not due until the
        // pause has passed.
        assert!(p.is_waiting(op));
        assert!(p.due(op, now + RETRY_EVERY / 2).is_none());
        let (_, left) = p.due(op, now + RETRY_EVERY).unwrap();
        assert_eq!(left, PROPOSE_WAIT - RETRY_EVERY);
        // With a leader it is not due, until the leader changes.
        p.sent(op);
        assert!(p.due(op, now + RETRY_EVERY * 5).is_none());
        p.offer_all_again(now + RETRY_EVERY * 5);
        assert!(p.due(op, now + RETRY_EVERY * 5).is_some());
    }

    #[test]
    fn a_clients_change_expires_sooner_than_the_brokers_own() {
        let now = Instant::now();
        let mut p = Proposals::new(1);
        let client = p.submit(1, cmd(2), Some(ack(3, "/")), now);
        let own = p.submit(1, cmd(1), None, now);
        assert!(p.expire(now + PROPOSE_WAIT - RETRY_EVERY).is_empty());
        let gone = p.expire(now + PROPOSE_WAIT);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].reply.as_ref().map(|r| r.conn), Some(3));
        assert_eq!(gone[0].made, now);
        assert!(p.take(client).is_none());
        assert_eq!(p.waiting(), vec![own]);
        let gone = p.expire(now + INTERNAL_WAIT);
        assert!(gone.len() == 1 && gone[0].reply.is_none());
        assert!(p.waiting().is_empty());
    }

    #[test]
    fn a_closed_socket_is_answered_nothing() {
        let now = Instant::now();
        let mut p = Proposals::new(1);
        let on_root = p.submit(1, cmd(1), Some(ack(3, "/")), now);
        let on_control = p.submit(1, cmd(2), Some(ack(3, "/control")), now);
        p.add_remote(77, 3, 9);
        p.wait_for_leader(ack(3, "/"), 5, now + PROPOSE_WAIT);
        // Its `/` ended: only the change answered on `/` loses its reply,
        // and the create waiting on it goes.
        p.forget(3, Some("/"));
        assert!(p.created_done(now + INTERNAL_WAIT, |_| true).is_empty());
        let changes: Vec<bool> = [on_root, on_control]
            .iter()
            .map(|&op| p.take(op).unwrap().reply.is_some())
            .collect();
        assert_eq!(changes, [false, true]);
        assert_eq!(p.take_remote(77), Some((3, 9)));
        // The whole socket closed: the peer's proposal is forgotten too.
        p.add_remote(78, 3, 9);
        p.forget(3, None);
        assert_eq!(p.take_remote(78), None);
    }

    #[test]
    fn a_create_is_answered_when_its_group_is_led_or_its_time_is_up() {
        let now = Instant::now();
        let mut p = Proposals::new(1);
        p.wait_for_leader(ack(1, "/"), 10, now + PROPOSE_WAIT);
        p.wait_for_leader(ack(2, "/"), 20, now + PROPOSE_WAIT);
        p.wait_for_leader(ack(3, "/"), 30, now + PROPOSE_WAIT * 2);
        let done = p.created_done(now, |g| g == 20);
        let done: Vec<(ConnId, bool)> = done.iter().map(|(r, led)| (r.conn, *led)).collect();
        assert_eq!(done, [(2, true)]);
        let done = p.created_done(now + PROPOSE_WAIT, |_| false);
        let done: Vec<(ConnId, bool)> = done.iter().map(|(r, led)| (r.conn, *led)).collect();
        assert_eq!(done, [(1, false)]);
        assert_eq!(p.created_done(now + PROPOSE_WAIT * 2, |_| false).len(), 1);
    }
}
