//! Cluster mode inside the broker: control-state changes made on this node
//! ([`Broker::submit`](super::Broker::submit)) are applied at once on a single node, and in a
//! cluster proposed to the Raft leader (locally, or over the leader's peer
//! link as `cluster.command`) and answered when Raft hands them back
//! committed; publishes whose subscribers live on other nodes are batched
//! per node and sent as `cluster.forward`; stream requests for a stream
//! another node owns are relayed to it; and the leader removes the
//! subscriptions of a node that stays unreachable.
//!
//! This file holds `Cluster`, the state of all of that, whose parts with
//! private fields sit in `cluster/parts/` (`Peers`: links, nodes down,
//! forward batches; `Proposals`: changes waiting for Raft; `Relays`:
//! relayed requests and gathered lists; `MemberChanges`: membership
//! changes waiting, member asks); the broker's side is split by concern: `cluster/proposals.rs` (changes through
//! Raft), `cluster/turn.rs` (Raft and link events, the per-turn work),
//! `cluster/relays.rs` (relayed requests, gathered lists),
//! `cluster/forwards.rs` (forward batches in, pushes out),
//! `cluster/node_loss.rs` and `cluster/membership.rs` (members added and
//! removed while the cluster runs).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use self::actions::{Action, Handles};
use super::ack::{send_ack, send_ack_with};
use super::session::NSP_ROOT;
use crate::cluster::api::{
    forward, CallError, Change, Cmd, FromRaft, Fsm, GroupId, LinkEvent, LinkOut, Links,
    MetaCommand, NodeConfig, PeerMessage, RaftNode, Role, ToRaft, View,
};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::subject;
use crate::routing::groups::GroupMode;
use crate::routing::sublist::Sublist;
use crate::routing::subs::{Command, SubKey};

/// How often the loop reads the Raft thread's view of the cluster.
const VIEW_EVERY: Duration = Duration::from_millis(10);
/// What a proposal to the control group or a call to a peer node was
/// made for. The Raft thread and the node links carry a plain `u64` tag
/// and hand it back with the outcome; [`Tag::raw`] and [`Tag::of`] turn
/// one into the other (a kind in the top bits, a number below), so the
/// answer reaches the part that asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    /// One of this node's own changes: its op number (a waiter).
    Own(u64),
    /// A proposal made for a peer's `cluster.command`.
    Remote(u64),
    /// A request relayed to the node that serves it, or one call of a
    /// gathered listing.
    Relay(u64),
    /// A membership change, or its relay to the leader.
    Member(u64),
    /// A `cluster.catchup` call (`stream_catchup.rs`).
    Catchup(u64),
    /// A `cluster.publish` batch (`stream_batches.rs`).
    Batch(u64),
}

impl Tag {
    const REMOTE: u64 = 1 << 62;
    const RELAY: u64 = 1 << 61;
    const MEMBER: u64 = 1 << 60;
    const CATCHUP: u64 = 1 << 59;
    const BATCH: u64 = 1 << 58;
    /// Every kind's bit: a number never reaches them.
    const KINDS: u64 = Tag::REMOTE | Tag::RELAY | Tag::MEMBER | Tag::CATCHUP | Tag::BATCH;

    /// The `u64` the Raft thread and the links carry.
    pub fn raw(self) -> u64 {
        match self {
            Tag::Own(n) => n,
            Tag::Remote(n) => Tag::REMOTE | n,
            Tag::Relay(n) => Tag::RELAY | n,
            Tag::Member(n) => Tag::MEMBER | n,
            Tag::Catchup(n) => Tag::CATCHUP | n,
            Tag::Batch(n) => Tag::BATCH | n,
        }
    }

    /// The tag a `u64` handed back stands for.
    pub fn of(raw: u64) -> Tag {
        let n = raw & !Tag::KINDS;
        match raw & Tag::KINDS {
            Tag::REMOTE => Tag::Remote(n),
            Tag::RELAY => Tag::Relay(n),
            Tag::MEMBER => Tag::Member(n),
            Tag::CATCHUP => Tag::Catchup(n),
            Tag::BATCH => Tag::Batch(n),
            _ => Tag::Own(raw),
        }
    }
}

pub(crate) mod actions;
mod forwards;
mod membership;
mod node_loss;
mod parts;
mod proposals;
mod relays;
mod turn;

use parts::member_changes::{MemberChanges, What};
use parts::peers::Peers;
pub use parts::peers::NODE_GONE_AFTER;
use parts::proposals::Proposals;
pub(crate) use parts::proposals::{ChangeAck, PROPOSE_WAIT};
pub(crate) use parts::relays::Listing;
use parts::relays::{Answered, Gather, Relays};

/// How this node takes part in a cluster (from the flags).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Every member's node id, sorted; a member's Raft id is its position + 1.
    pub names: Vec<String>,
    pub raft: NodeConfig,
    /// The other nodes' HTTP addresses (`-cluster`).
    pub peers_http: Vec<SocketAddr>,
}

pub(crate) struct Cluster {
    me: u64,
    /// Every node's name this node has known, by id (members and former
    /// members, for log lines and old subscriptions).
    names: BTreeMap<u64, String>,
    /// The members of the configuration in effect, by id.
    members: Vec<u64>,
    /// The configuration index `members` was taken from.
    members_index: u64,
    /// This node is in the configuration; it was and is no longer.
    member: bool,
    removed: bool,
    /// Membership changes waiting to be answered, the member asks, when
    /// a removed node leaves.
    changes: MemberChanges,
    /// The Raft thread's handle and the peer links: every effect on
    /// them goes through [`Handles::act`].
    io: Handles,
    view: Option<View>,
    next_view: Instant,
    role: Role,
    term: u64,
    leader: Option<u64>,
    /// The peer links, the nodes that are down, the forward batches.
    peers: Peers,
    /// This node's changes waiting for Raft, proposals made for peers,
    /// creates waiting for their group's first leader.
    proposals: Proposals,
    /// Requests relayed to other nodes, listings gathered from them.
    relays: Relays,
    /// The number in the last link tag made (of any kind).
    next_tag: u64,
    /// Sanitized node id (as in request inboxes) -> node.
    inbox_nodes: HashMap<String, u64>,
    /// Subjects of streams other nodes own -> the owner.
    remote_capture: Sublist<u64>,
    capture_dirty: bool,
    boot: u64,
    /// This node's `NodeUp` was proposed, and (`caught_up`) applied.
    up_proposed: bool,
    caught_up: bool,
}

/// Starts a cluster node's helper threads, the Raft thread and the peer
/// links, both waking `waker` (the event loop's) when output waits. The
/// program that runs the loop (`bin/broker.rs`) starts them and hands
/// them to the broker ([`Broker::run_cluster_with`](crate::broker::Broker::run_cluster_with)).
/// The links log in to the peers' `/control` with `cluster_token`.
pub fn start_threads(
    settings: &ClusterSettings,
    waker: Arc<mio::Waker>,
    cluster_token: Option<String>,
    auth_token: Option<String>,
) -> Result<(RaftNode, Links), String> {
    if settings.raft.secret.is_none() {
        crate::log_warn!(
            "cluster: neither -cluster-token nor -control-token is set: any host that \
             reaches the Raft port {} can take part in the cluster",
            settings.raft.listen
        );
    }
    let raft = RaftNode::start(settings.raft.clone(), Arc::clone(&waker))?;
    // On `/` the links relay clients' events, whose rights were checked
    // where each client is connected: they log in with -auth-token, else
    // with the cluster token, which a member admits on `/` with every
    // right (docs/PROTOCOL.md, "Users and permissions"), so `-users`
    // needs no all-rights user.
    let root_token = auth_token.or_else(|| cluster_token.clone());
    let links = Links::start(&settings.peers_http, cluster_token, root_token, waker);
    Ok((raft, links))
}

impl Cluster {
    /// Carries out `a` ([`Handles::act`]): whether it was taken.
    pub(crate) fn act(&self, a: Action) -> bool {
        self.io.act(a)
    }

    /// Where stream group `group` keeps its snapshot files, when its log
    /// is durable.
    pub(crate) fn group_dir(&self, group: GroupId) -> Option<std::path::PathBuf> {
        self.io.group_dir(group)
    }

    pub fn new(settings: ClusterSettings, boot: u64) -> Cluster {
        let me = settings.raft.id;
        let mut names: BTreeMap<u64, String> =
            crate::maps::map_of((1..).zip(settings.names.iter().cloned()));
        names.extend(settings.raft.names.clone());
        let members = if settings.raft.join {
            Vec::new()
        } else {
            names.keys().copied().collect()
        };
        let inbox_nodes = names
            .iter()
            .map(|(&id, n)| (super::requests::sanitize(n), id))
            .collect();
        Cluster {
            me,
            member: !settings.raft.join,
            removed: false,
            members,
            members_index: 0,
            names,
            changes: MemberChanges::new(Instant::now()),
            peers: Peers::new(settings.peers_http.clone()),
            io: Handles::default(),
            view: None,
            next_view: Instant::now(),
            role: Role::Follower,
            term: 0,
            leader: None,
            proposals: Proposals::new(boot),
            relays: Relays::default(),
            next_tag: 0,
            inbox_nodes,
            remote_capture: Sublist::default(),
            capture_dirty: true,
            boot,
            up_proposed: false,
            caught_up: false,
        }
    }

    /// Talks to Raft through `raft` and to the peers through `links`
    /// from now on: the threads [`start_threads`] started, or detached
    /// handles played by an in-process test (`RaftNode::detached`,
    /// `Links::detached`).
    pub fn run_with(&mut self, raft: RaftNode, links: Links) {
        self.io.run_with(raft, links);
    }

    /// Whether it was given its Raft handle and links ([`Cluster::run_with`]).
    pub fn running(&self) -> bool {
        self.io.running()
    }

    /// This node's Raft id.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// Every member's Raft id (this node's included), ascending.
    pub fn node_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.members.iter().copied()
    }

    /// Whether `id` is a voter of the configuration in effect (a member
    /// still catching up is not).
    pub fn is_voter(&self, id: u64) -> bool {
        self.view
            .as_ref()
            .and_then(|v| v.members.iter().find(|m| m.id == id))
            .is_none_or(|m| m.voter)
    }

    /// Why this node serves nothing cluster-wide, if it does not: it
    /// waits to be added, or it was removed.
    pub fn not_serving(&self) -> Option<&'static str> {
        if self.removed {
            Some("removed from the cluster")
        } else if !self.member {
            Some("waiting to be added")
        } else {
            None
        }
    }

    /// The loop's copy of the Raft thread's view (up to `VIEW_EVERY` old).
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// Messages sent to other nodes for delivery, and forward batches
    /// dropped (peer unreachable or its link full).
    pub fn forward_counts(&self) -> (u64, u64) {
        self.peers.forward_counts()
    }

    /// Queues `m` for `node` (see [`Cluster::queue_forward`]) and counts
    /// it as forwarded for delivery.
    pub fn forward_delivery(&mut self, node: u64, m: &PeerMessage<'_>) {
        self.peers.queue_forward(node, m);
        self.peers.count_forwarded();
    }

    pub fn name_of(&self, node: u64) -> Option<&str> {
        self.names.get(&node).map(String::as_str)
    }

    /// The member called `name`, if one is.
    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.names
            .iter()
            .find(|(id, n)| n.as_str() == name && self.members.contains(id))
            .map(|(&id, _)| id)
    }

    pub fn leader(&self) -> Option<u64> {
        self.leader
    }

    /// Since start, this node has applied what was committed before it
    /// started (and announced itself).
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// The Raft thread's view as it is now (the loop's copy in `view` may
    /// be up to `VIEW_EVERY` old).
    pub fn fresh_view(&self) -> Option<View> {
        self.io.view().or_else(|| self.view.clone())
    }

    /// The link that reaches `node`, if it is up.
    fn link_to(&self, node: u64) -> Option<usize> {
        self.peers.link_to(node)
    }

    /// Whether deliveries to `node` can go out now.
    /// Its peer link is up and, as far as this node can tell (a leader
    /// hears every follower), it answers.
    pub fn reachable(&self, node: u64) -> bool {
        if node == self.me {
            return true;
        }
        let heard = self
            .view
            .as_ref()
            .and_then(|v| v.peers.iter().find(|p| p.id == node))
            .is_none_or(|p| p.heard);
        heard && self.link_to(node).is_some()
    }

    /// Calls node-to-node event `event` on `node`'s `/control`; its
    /// answer comes back as a link answer with the tag returned (`None`:
    /// no link reaches `node`, or its queue is full). A `fenced` call
    /// carries the number of the connection it goes out on
    /// ([`LinkOut::fenced`]).
    #[allow(clippy::too_many_arguments)]
    pub fn call_node(
        &mut self,
        node: u64,
        kind: fn(u64) -> Tag,
        event: &str,
        args: String,
        attachments: Vec<Vec<u8>>,
        timeout: Duration,
        fenced: bool,
    ) -> Option<u64> {
        let link = self.link_to(node)?;
        let tag = self.tag(kind);
        let mut out = LinkOut::control(tag, event, args, timeout).with_attachments(attachments);
        if fenced {
            out = out.fenced();
        }
        let queued = self.call_link(link, out);
        queued.then_some(tag)
    }

    /// Queues `out` on link `link`; false when the link's queue is full.
    fn call_link(&self, link: usize, out: LinkOut) -> bool {
        self.act(Action::Call { link, out })
    }

    /// A fresh tag of `kind` (e.g. `Tag::Relay`), as the links carry it.
    fn tag(&mut self, kind: fn(u64) -> Tag) -> u64 {
        self.next_tag += 1;
        kind(self.next_tag).raw()
    }

    /// Forgets what waits for `conn`'s socket in `/` (it ended): replies
    /// to its changes, and relayed stream events and gathers.
    pub fn forget_root(&mut self, conn: ConnId) {
        self.proposals.forget(conn, Some(NSP_ROOT));
        self.relays.forget(conn);
    }

    /// Socket `conn` closed: nothing waiting is answered on it any more
    /// (its slot may be reused by another socket).
    pub fn forget_conn(&mut self, conn: ConnId) {
        self.proposals.forget(conn, None);
        self.relays.forget(conn);
        self.changes.forget(conn);
    }

    /// Appends a message to the batch for `node` (see
    /// [`Peers::queue_forward`]).
    pub fn queue_forward(&mut self, node: u64, m: &PeerMessage<'_>) {
        self.peers.queue_forward(node, m);
    }

    /// The forward batches of this turn (see [`Peers::take_batches`]).
    pub fn take_batches(&mut self) -> Vec<(u64, Vec<u8>)> {
        self.peers.take_batches()
    }

    /// Which node owns the stream capturing `subject`, if another does.
    pub fn remote_capture(&mut self, fsm: &Fsm, subject: &str) -> Option<u64> {
        if self.capture_dirty {
            self.capture_dirty = false;
            self.remote_capture = Sublist::default();
            for s in fsm.streams.values().filter(|s| s.owner != self.me) {
                let subjects = s.config.get("subjects").and_then(Value::as_array);
                for p in subjects.into_iter().flatten().filter_map(Value::as_str) {
                    if subject::validate_pattern(p).is_ok() {
                        self.remote_capture.insert(p, None, s.owner);
                    }
                }
            }
        }
        if self.remote_capture.is_empty() {
            return None;
        }
        let m = self.remote_capture.matches(subject);
        m.plain.first().copied()
    }

    /// The node whose request inbox `subject` is, if another node's.
    pub fn inbox_node(&self, subject: &str) -> Option<u64> {
        let rest = subject.strip_prefix("_INBOX.")?;
        let name = rest.split('.').next()?;
        self.inbox_nodes
            .get(name)
            .copied()
            .filter(|&n| n != self.me)
    }
}

fn call_error_value(e: &CallError) -> String {
    json!({"ok": false, "error": {"code": e.code, "message": e.message}}).to_string()
}

/// Keeps `c` usable when an entry is applied twice (a change resent after
/// a leader change): subscribing with a sid already taken is refused and
/// removals are idempotent, so a repeat changes nothing.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::subs::Owner;

    #[test]
    fn applying_a_change_twice_changes_nothing() {
        let mut f = Fsm::new(1);
        let sub = Cmd::Subs(Command::Subscribe {
            owner: Owner { node: 2, conn: 1 },
            sid: "a".into(),
            pattern: "x".into(),
            queue: None,
            max: None,
        });
        f.apply(&sub).unwrap();
        assert!(f.apply(&sub).is_err());
        assert_eq!(f.subs.len(), 1);
        let rm = Cmd::Subs(Command::RemoveConn {
            owner: Owner { node: 2, conn: 1 },
        });
        f.apply(&rm).unwrap();
        f.apply(&rm).unwrap();
        assert!(f.subs.is_empty());
    }

    fn test_settings() -> ClusterSettings {
        ClusterSettings {
            names: vec!["n1".into(), "n.2".into(), "n3".into()],
            raft: NodeConfig {
                id: 1,
                listen: "127.0.0.1:1".parse().unwrap(),
                members: BTreeMap::new(),
                data: std::path::PathBuf::from("/nonexistent"),
                memory_log: true,
                bootstrap: false,
                secret: None,
                names: BTreeMap::new(),
                infos: BTreeMap::new(),
                join: false,
            },
            peers_http: vec![],
        }
    }

    #[test]
    fn inboxes_route_to_their_node() {
        let c = Cluster::new(test_settings(), 1);
        assert_eq!(c.inbox_node("_INBOX.n_2.ab12.7"), Some(2));
        assert_eq!(c.inbox_node("_INBOX.n1.ab12.7"), None, "own inbox");
        assert_eq!(c.inbox_node("_INBOX.zz.ab12.7"), None);
        assert_eq!(c.inbox_node("orders.new"), None);
    }

    #[test]
    fn tags_come_back_as_the_kind_they_were_made_as() {
        for n in [1, 7, 1 << 40, (1 << 58) - 1] {
            for tag in [
                Tag::Remote(n),
                Tag::Relay(n),
                Tag::Member(n),
                Tag::Catchup(n),
                Tag::Batch(n),
                Tag::Own(n),
            ] {
                assert_eq!(Tag::of(tag.raw()), tag);
            }
        }
    }

    #[test]
    fn a_nodes_own_operation_numbers_are_never_taken_for_another_kind() {
        // Boot ids are random 32-bit numbers: with every high bit set,
        // the operation numbers must still read as this node's own.
        for boot in [1, 0xffff_ffff, 0x8000_0000, 0x7c00_0000, 0x0400_0000] {
            let mut p = Proposals::new(boot);
            let now = Instant::now();
            for _ in 0..3 {
                let op = p.submit(1, Cmd::Subs(Command::NodeUp { node: 1, boot }), None, now);
                assert_eq!(Tag::of(op), Tag::Own(op), "boot {boot:#x}");
            }
        }
    }
}
