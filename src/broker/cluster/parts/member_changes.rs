//! MemberChanges: the `cluster.add` and `cluster.remove` changes waiting to
//! be answered (by tag: what each changes, its configuration entry once
//! appended, its deadline, a removal's wait for replicas to move), the
//! `cluster.members` calls asked of peers and when to ask again, and when
//! a removed node leaves. It decides which changes are done from the Raft
//! view; the broker proposes, relays and answers.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::cluster::api::{ChangeState, View};
use crate::port::ConnId;

/// How long `cluster.remove` waits for the removal to commit.
pub const REMOVE_WAIT: Duration = Duration::from_secs(15);
/// How often a removal waiting for moves asks again for the moves not
/// recorded yet.
const MOVE_ASK_EVERY: Duration = Duration::from_secs(1);
/// How often a node waiting to be added asks its peers who the members
/// are.
pub const ASK_EVERY: Duration = Duration::from_secs(1);
/// Most `cluster.members` calls outstanding at once.
const ASKS_MAX: usize = 64;
/// A member that knows no leader this long asks its peers whether it is
/// still a member: a follower removed while cut off from the leader never
/// receives the entry that removes it.
const LEADERLESS_ASK_AFTER: Duration = Duration::from_secs(2);

/// What a membership change changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    Add(u64),
    Remove(u64),
    /// Relayed to the leader: its answer is this one's.
    Relayed,
}

/// A membership change waiting to be answered.
pub(crate) struct Pending {
    conn: ConnId,
    ack_id: Option<u64>,
    what: What,
    /// The index of its configuration entry, once appended.
    index: Option<u64>,
    deadline: Instant,
    /// A removal waiting for the node's replicas to move: when to ask
    /// for the moves again.
    moving: Option<Instant>,
}

impl Pending {
    /// The `/control` socket and ack id to answer, if an answer is wanted.
    pub(crate) fn answer_to(&self) -> Option<(ConnId, u64)> {
        self.ack_id.map(|a| (self.conn, a))
    }

    pub(crate) fn what(&self) -> What {
        self.what
    }
}

/// A membership change done: whom to answer, and why it failed (`None`:
/// it completed).
pub(crate) struct Done {
    pub conn: ConnId,
    pub ack_id: u64,
    pub error: Option<&'static str>,
}

/// The membership changes waiting, the member asks, the leaving time.
pub(crate) struct MemberChanges {
    /// Membership changes waiting to be answered, by tag.
    changes: HashMap<u64, Pending>,
    /// `cluster.members` asked of peers while this node waits to be
    /// added, and when to ask again.
    asks: HashSet<u64>,
    next_ask: Instant,
    /// Since when this node has known no leader.
    leaderless_since: Option<Instant>,
    /// When this removed node closes its clients.
    leave_at: Option<Instant>,
}

impl MemberChanges {
    pub(crate) fn new(now: Instant) -> MemberChanges {
        MemberChanges {
            changes: HashMap::new(),
            asks: HashSet::new(),
            next_ask: now,
            leaderless_since: None,
            leave_at: None,
        }
    }

    /// Whether a removal waits for its node's replicas to move.
    pub(crate) fn moving_under_way(&self) -> bool {
        self.changes.values().any(|p| p.moving.is_some())
    }

    /// Change `what` with tag `tag`, for control socket `conn`'s event
    /// `ack_id`, waits until `deadline`; with `moving`, a removal waits
    /// first for its node's replicas to move (asking for them from then).
    pub(crate) fn add(
        &mut self,
        tag: u64,
        conn: ConnId,
        ack_id: Option<u64>,
        what: What,
        deadline: Instant,
        moving: Option<Instant>,
    ) {
        let p = Pending {
            conn,
            ack_id,
            what,
            index: None,
            deadline,
            moving,
        };
        self.changes.insert(tag, p);
    }

    /// The Raft core appended change `tag` at `index`.
    pub(crate) fn proposed(&mut self, tag: u64, index: u64) {
        if let Some(p) = self.changes.get_mut(&tag) {
            p.index = Some(index);
        }
    }

    /// Takes change `tag` off (refused, or answered by the leader).
    pub(crate) fn take(&mut self, tag: u64) -> Option<Pending> {
        self.changes.remove(&tag)
    }

    /// The removals waiting for replicas to move: tag, node, and when to
    /// ask for the moves again.
    pub(crate) fn moving(&self) -> Vec<(u64, u64, Instant)> {
        self.changes
            .iter()
            .filter_map(|(&tag, p)| match (p.what, p.moving) {
                (What::Remove(id), Some(at)) => Some((tag, id, at)),
                _ => None,
            })
            .collect()
    }

    /// Removal `tag`'s node holds no replica any more at `now`: it is
    /// proposed, and waits [`REMOVE_WAIT`] to commit.
    pub(crate) fn moved(&mut self, tag: u64, now: Instant) {
        if let Some(p) = self.changes.get_mut(&tag) {
            p.moving = None;
            p.deadline = now + REMOVE_WAIT;
        }
    }

    /// Removal `tag` asked for its moves at `now`.
    pub(crate) fn asked_moves(&mut self, tag: u64, now: Instant) {
        if let Some(p) = self.changes.get_mut(&tag) {
            p.moving = Some(now + MOVE_ASK_EVERY);
        }
    }

    /// Takes off the changes that `view` shows done, that failed or that
    /// ran out of time at `now` (`leads`: this node leads), and returns
    /// those that want an answer.
    pub(crate) fn done(&mut self, view: &View, now: Instant, leads: bool) -> Vec<Done> {
        let mut done = Vec::new();
        for (&tag, p) in &self.changes {
            let finished = match (p.what, p.index) {
                (What::Add(id), Some(index)) => {
                    view.conf_index >= index
                        && view.commit >= view.conf_index
                        && view.members.iter().any(|m| m.id == id && m.voter)
                        && view.change == ChangeState::Idle
                }
                (What::Remove(_), None) if p.moving.is_some() => {
                    if now >= p.deadline {
                        done.push((
                            tag,
                            Some(
                                "the node's stream replicas did not move to other nodes in \
                                 time; the move goes on: try again later (see stream.info)",
                            ),
                        ));
                    }
                    continue;
                }
                (What::Remove(id), Some(index)) => {
                    view.commit >= index && !view.members.iter().any(|m| m.id == id)
                }
                _ => false,
            };
            if finished {
                done.push((tag, None));
            } else if !leads && p.index.is_some() {
                // Proposed here, and this node no longer leads: its entry
                // may be lost (a leader cut off is deposed, and the new
                // one's log may not hold it), and no one here sees the
                // change through. Answered now rather than at the bound.
                done.push((
                    tag,
                    Some(
                        "leadership moved before the change completed; it may or may not be \
                         in the configuration: see cluster.status, then try again",
                    ),
                ));
            } else if now >= p.deadline {
                let why = match p.what {
                    What::Add(_) => {
                        "the new node has not caught up yet (is it running with -join and \
                         the cluster token?); see cluster.status"
                    }
                    _ => "the change did not complete in time; see cluster.status",
                };
                done.push((tag, Some(why)));
            }
        }
        done.into_iter()
            .filter_map(|(tag, error)| {
                let (conn, ack_id) = self.changes.remove(&tag)?.answer_to()?;
                Some(Done {
                    conn,
                    ack_id,
                    error,
                })
            })
            .collect()
    }

    /// Whether to ask the peers who the members are at `now`: this node
    /// waits to be added (not `member`), or has known no leader for a
    /// while (`leader_known`), and was not `removed`; at most once per
    /// [`ASK_EVERY`], with few calls outstanding. A yes counts as the ask.
    pub(crate) fn ask_due(
        &mut self,
        now: Instant,
        leader_known: bool,
        member: bool,
        removed: bool,
    ) -> bool {
        if leader_known {
            self.leaderless_since = None;
        }
        let leaderless = !leader_known
            && now.duration_since(*self.leaderless_since.get_or_insert(now))
                >= LEADERLESS_ASK_AFTER;
        let wants = !member || leaderless;
        if !wants || removed || now < self.next_ask || self.asks.len() >= ASKS_MAX {
            return false;
        }
        self.next_ask = now + ASK_EVERY;
        true
    }

    /// The `cluster.members` call with tag `tag` went out.
    pub(crate) fn asked(&mut self, tag: u64) {
        self.asks.insert(tag);
    }

    /// Whether `tag` is a `cluster.members` call (taken off).
    pub(crate) fn ask_answered(&mut self, tag: u64) -> bool {
        self.asks.remove(&tag)
    }

    /// This node was removed: it leaves at `at`.
    pub(crate) fn leave_at(&mut self, at: Instant) {
        self.leave_at = Some(at);
    }

    /// Whether it is time to leave at `now` (once).
    pub(crate) fn time_to_leave(&mut self, now: Instant) -> bool {
        let leave = self.leave_at.is_some_and(|t| t <= now);
        if leave {
            self.leave_at = None;
        }
        leave
    }

    /// Socket `conn` closed: its changes are answered nowhere.
    pub(crate) fn forget(&mut self, conn: ConnId) {
        self.changes.retain(|_, p| p.conn != conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::api::{MemberView, Role, TransportStats};

    /// A view at configuration `conf_index`, committed up to `commit`,
    /// with `voters` and `learners` as members.
    fn view(conf_index: u64, commit: u64, voters: &[u64], learners: &[u64]) -> View {
        let member = |id: u64, voter: bool| MemberView {
            id,
            voter,
            info: None,
        };
        View {
            role: Role::Leader,
            term: 1,
            leader: Some(1),
            commit,
            last_index: commit,
            peers: Vec::new(),
            dropped: 0,
            transport: TransportStats::default(),
            groups: Default::default(),
            members: voters
                .iter()
                .map(|&id| member(id, true))
                .chain(learners.iter().map(|&id| member(id, false)))
                .collect(),
            conf_index,
            change: ChangeState::Idle,
            member: true,
            removed: false,
        }
    }

    fn answers(done: Vec<Done>) -> Vec<(ConnId, u64, Option<&'static str>)> {
        done.into_iter()
            .map(|d| (d.conn, d.ack_id, d.error))
            .collect()
    }

    #[test]
    fn an_add_is_answered_once_the_node_votes_in_a_committed_configuration() {
        let now = Instant::now();
        let mut m = MemberChanges::new(now);
        m.add(7, 3, Some(30), What::Add(4), now + REMOVE_WAIT, None);
        // Not appended yet, then appended but not committed, then
        // committed with the node still catching up: all still waiting.
        assert!(m.done(&view(5, 5, &[1, 2, 3], &[]), now, true).is_empty());
        m.proposed(7, 6);
        assert!(m.done(&view(6, 5, &[1, 2, 3], &[4]), now, true).is_empty());
        assert!(m.done(&view(6, 6, &[1, 2, 3], &[4]), now, true).is_empty());
        let done = m.done(&view(7, 7, &[1, 2, 3, 4], &[]), now, true);
        assert_eq!(answers(done), [(3, 30, None)]);
        assert!(m.take(7).is_none(), "answered once");
    }

    #[test]
    fn a_change_is_refused_when_leadership_moves_or_its_time_is_up() {
        let now = Instant::now();
        let mut m = MemberChanges::new(now);
        let v = view(5, 5, &[1, 2, 3], &[]);
        m.add(1, 3, Some(30), What::Remove(3), now + REMOVE_WAIT, None);
        m.proposed(1, 6);
        m.add(2, 4, Some(40), What::Add(9), now + REMOVE_WAIT, None);
        m.add(3, 5, None, What::Relayed, now, None);
        // No longer leading: the proposed removal is answered; the add
        // never appended waits; the relayed one without an ack goes
        // silently at its deadline.
        let done = m.done(&v, now, false);
        assert_eq!(
            answers(done),
            [(
                3,
                30,
                Some(
                    "leadership moved before the change completed; it may or may not be in \
                     the configuration: see cluster.status, then try again"
                )
            )]
        );
        assert!(m.take(3).is_none());
        let done = answers(m.done(&v, now + REMOVE_WAIT, true));
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].0, done[0].1), (4, 40));
        assert!(done[0]
            .2
            .unwrap()
            .starts_with("the new node has not caught up"));
    }

    #[test]
    fn a_removal_waits_for_moves_then_for_its_commit() {
        let now = Instant::now();
        let mut m = MemberChanges::new(now);
        assert!(!m.moving_under_way());
        m.add(
            1,
            3,
            Some(30),
            What::Remove(2),
            now + REMOVE_WAIT,
            Some(now),
        );
        assert!(m.moving_under_way());
        assert_eq!(m.moving(), [(1, 2, now)]);
        m.asked_moves(1, now);
        assert_eq!(m.moving(), [(1, 2, now + MOVE_ASK_EVERY)]);
        // Waiting for moves, it is not done even though node 2 is gone
        // from the view.
        assert!(m.done(&view(5, 5, &[1, 3], &[]), now, true).is_empty());
        let later = now + Duration::from_secs(5);
        m.moved(1, later);
        assert!(m.moving().is_empty() && !m.moving_under_way());
        m.proposed(1, 6);
        assert!(m.done(&view(6, 5, &[1, 3], &[]), later, true).is_empty());
        let done = m.done(&view(6, 6, &[1, 3], &[]), later, true);
        assert_eq!(answers(done), [(3, 30, None)]);
        // A removal whose moves never finish is refused at its deadline.
        m.add(
            2,
            3,
            Some(31),
            What::Remove(3),
            now + REMOVE_WAIT,
            Some(now),
        );
        assert!(m.done(&view(6, 6, &[1, 3], &[]), now, true).is_empty());
        let done = answers(m.done(&view(6, 6, &[1, 3], &[]), now + REMOVE_WAIT, true));
        assert_eq!(done.len(), 1);
        assert!(done[0].2.unwrap().contains("did not move"));
    }

    #[test]
    fn members_are_asked_while_waiting_to_be_added_or_long_leaderless() {
        let now = Instant::now();
        let mut m = MemberChanges::new(now);
        // Waiting to be added: at once, then once per ASK_EVERY.
        assert!(m.ask_due(now, false, false, false));
        assert!(!m.ask_due(now + ASK_EVERY / 2, false, false, false));
        assert!(m.ask_due(now + ASK_EVERY, false, false, false));
        // A removed node never asks.
        assert!(!m.ask_due(now + ASK_EVERY * 3, false, false, true));
        // A member with a leader never asks; without one, only after
        // LEADERLESS_ASK_AFTER.
        let t = now + ASK_EVERY * 4;
        assert!(!m.ask_due(t, true, true, false));
        assert!(!m.ask_due(t, false, true, false));
        assert!(!m.ask_due(t + LEADERLESS_ASK_AFTER / 2, false, true, false));
        assert!(m.ask_due(t + LEADERLESS_ASK_AFTER, false, true, false));
        // Too many asks outstanding: no more until answers come back.
        for tag in 0..ASKS_MAX as u64 {
            m.asked(tag);
        }
        let t = t + LEADERLESS_ASK_AFTER + ASK_EVERY;
        assert!(!m.ask_due(t, false, false, false));
        assert!(m.ask_answered(0));
        assert!(!m.ask_answered(0));
        assert!(m.ask_due(t, false, false, false));
    }

    #[test]
    fn a_removed_node_leaves_once_at_its_time_and_forgets_closed_sockets() {
        let now = Instant::now();
        let mut m = MemberChanges::new(now);
        assert!(!m.time_to_leave(now));
        m.leave_at(now + ASK_EVERY);
        assert!(!m.time_to_leave(now));
        assert!(m.time_to_leave(now + ASK_EVERY));
        assert!(!m.time_to_leave(now + ASK_EVERY * 2));
        m.add(1, 3, Some(30), What::Add(4), now, None);
        m.add(2, 4, Some(40), What::Add(5), now, None);
        m.forget(3);
        assert!(m.take(1).is_none());
        assert_eq!(
            m.take(2).map(|p| (p.answer_to(), p.what())),
            Some((Some((4, 40)), What::Add(5)))
        );
    }
}
