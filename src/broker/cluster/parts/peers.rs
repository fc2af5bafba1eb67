//! Peers: the peer links as this node sees them (the HTTP address each
//! dials, the node it reaches while up), when each unreachable member was
//! first seen down and which ones the leader gave up on, and the forward
//! batches of the turn per node with the forward counts. It does no I/O:
//! the broker drives the links and sends what this part hands it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::cluster::api::{forward, PeerMessage, EMIT_BYTES_MAX};

/// A node whose peer link and Raft connection both stay down this long is
/// declared gone by the leader, which removes its subscriptions.
pub const NODE_GONE_AFTER: Duration = Duration::from_secs(3);

/// The peer links, the nodes that are down, the forward batches.
pub(crate) struct Peers {
    /// Per link: the HTTP address it dials.
    addrs: Vec<SocketAddr>,
    /// Per link: the name of the node it reached while it is up (mapped
    /// to a member as members change).
    names: Vec<Option<String>>,
    /// Per link: the member it reaches, while it is up.
    nodes: Vec<Option<u64>>,
    /// Since when each member has been down, as the leader sees it.
    down_since: HashMap<u64, Instant>,
    /// Nodes whose removal this leader proposed and that are still down.
    removing: HashSet<u64>,
    /// Forward batches being filled this turn, per node.
    batches: BTreeMap<u64, Vec<u8>>,
    /// Batches of this turn already full, in the order they filled.
    full_batches: Vec<(u64, Vec<u8>)>,
    /// Messages sent to other nodes for delivery.
    forwarded: u64,
    /// Forward batches dropped (peer unreachable or its link full).
    dropped: u64,
}

impl Peers {
    /// One link per address in `addrs`, all down.
    pub(crate) fn new(addrs: Vec<SocketAddr>) -> Peers {
        Peers {
            names: vec![None; addrs.len()],
            nodes: vec![None; addrs.len()],
            addrs,
            down_since: HashMap::new(),
            removing: HashSet::new(),
            batches: BTreeMap::new(),
            full_batches: Vec::new(),
            forwarded: 0,
            dropped: 0,
        }
    }

    /// How many links there are, up or down.
    pub(crate) fn link_count(&self) -> usize {
        self.addrs.len()
    }

    /// The links that are up and reach a member.
    pub(crate) fn links_up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&l| self.nodes[l].is_some())
            .collect()
    }

    /// The link that reaches `node`, if it is up.
    pub(crate) fn link_to(&self, node: u64) -> Option<usize> {
        self.nodes.iter().position(|n| *n == Some(node))
    }

    /// Whether a link dials `http`.
    pub(crate) fn dials(&self, http: &SocketAddr) -> bool {
        self.addrs.contains(http)
    }

    /// A new link dials `http` (a member added); it is down.
    pub(crate) fn add_link(&mut self, http: SocketAddr) {
        self.addrs.push(http);
        self.nodes.push(None);
        self.names.push(None);
    }

    /// Link `link` came up and reached the node called `name`, which is
    /// member `node` (`None`: not a member): that member is not down.
    pub(crate) fn link_up(&mut self, link: usize, name: String, node: Option<u64>) {
        if let Some(slot) = self.names.get_mut(link) {
            *slot = Some(name);
        }
        if let Some(slot) = self.nodes.get_mut(link) {
            *slot = node;
        }
        if let Some(n) = node {
            self.down_since.remove(&n);
            self.removing.remove(&n);
        }
    }

    /// Link `link` went down.
    pub(crate) fn link_down(&mut self, link: usize) {
        if let Some(slot) = self.nodes.get_mut(link) {
            *slot = None;
        }
        if let Some(slot) = self.names.get_mut(link) {
            *slot = None;
        }
    }

    /// The name of the node each link reached, while it is up.
    pub(crate) fn reached(&self) -> impl Iterator<Item = Option<&str>> + '_ {
        self.names.iter().map(Option::as_deref)
    }

    /// The member each link reaches, in link order, after members changed
    /// (see [`Peers::reached`]).
    pub(crate) fn set_nodes(&mut self, nodes: Vec<Option<u64>>) {
        for (slot, node) in self.nodes.iter_mut().zip(nodes) {
            *slot = node;
        }
    }

    /// Link `link` reaches `node` (`None`: it is down), as a test sets it.
    /// This node does not lead: it watches no member.
    pub(crate) fn stop_watching(&mut self) {
        self.down_since.clear();
    }

    /// Member `node` is heard and connected: it is not down.
    pub(crate) fn heard(&mut self, node: u64) {
        self.down_since.remove(&node);
    }

    /// Member `node` is down at `now`: whether it has now been down
    /// [`NODE_GONE_AFTER`] and is given up on (once, until it is back).
    pub(crate) fn down(&mut self, node: u64, now: Instant) -> bool {
        let since = *self.down_since.entry(node).or_insert(now);
        now.duration_since(since) >= NODE_GONE_AFTER && self.removing.insert(node)
    }

    /// Node `node` is no member: whether it is given up on now (once).
    pub(crate) fn give_up(&mut self, node: u64) -> bool {
        self.removing.insert(node)
    }

    /// Appends a message to the batch for `node`; a batch that reached
    /// the link's event size is closed and a new one begun.
    pub(crate) fn queue_forward(&mut self, node: u64, m: &PeerMessage<'_>) {
        let open = self.batches.entry(node).or_default();
        if open.len() >= EMIT_BYTES_MAX {
            let full = std::mem::take(open);
            self.full_batches.push((node, full));
        }
        forward::push(self.batches.entry(node).or_default(), m);
    }

    /// The forward batches of this turn, per node in the order they
    /// filled: what the turn sends toward each peer.
    pub(crate) fn take_batches(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut batches = std::mem::take(&mut self.full_batches);
        batches.extend(std::mem::take(&mut self.batches));
        batches
    }

    /// One more message sent to another node for delivery.
    pub(crate) fn count_forwarded(&mut self) {
        self.forwarded += 1;
    }

    /// One more forward batch dropped.
    pub(crate) fn count_dropped(&mut self) {
        self.dropped += 1;
    }

    /// Messages sent to other nodes for delivery, and forward batches
    /// dropped.
    pub(crate) fn forward_counts(&self) -> (u64, u64) {
        (self.forwarded, self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u16) -> Vec<SocketAddr> {
        (1..=n)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], 9000 + p)))
            .collect()
    }

    fn message<'a>(subject: &'a str, data: &'a str) -> PeerMessage<'a> {
        // A plain message with neither reply nor headers.
        PeerMessage {
            plain: true,
            subject,
            data,
            picks: Vec::new(),
            reply: None,
            attachments: Vec::new(),
            headers: None,
            extra: None,
        }
    }

    fn subjects(batch: &[u8]) -> Vec<String> {
        forward::decode(batch)
            .unwrap()
            .iter()
            .map(|m| m.subject.to_string())
            .collect()
    }

    #[test]
    fn batches_come_out_full_ones_first_in_the_order_they_filled() {
        let mut p = Peers::new(addrs(2));
        // Each message is a quarter of a batch and more: a batch holds
        // four, and the fifth begins a new one.
        let big = "x".repeat(EMIT_BYTES_MAX / 4 + 1);
        for i in 0..5 {
            p.queue_forward(3, &message(&format!("three.{i}"), &big));
        }
        p.queue_forward(2, &message("two.0", "1"));
        for i in 5..9 {
            p.queue_forward(3, &message(&format!("three.{i}"), &big));
        }
        let batches = p.take_batches();
        let seen: Vec<(u64, Vec<String>)> =
            batches.iter().map(|(n, b)| (*n, subjects(b))).collect();
        let three = |r: std::ops::Range<usize>| -> Vec<String> {
            r.map(|i| format!("three.{i}")).collect()
        };
        assert_eq!(
            seen,
            vec![
                (3, three(0..4)),
                (3, three(4..8)),
                (2, vec!["two.0".to_string()]),
                (3, three(8..9)),
            ]
        );
        assert!(batches
            .iter()
            .all(|(_, b)| b.len() <= EMIT_BYTES_MAX + big.len() + 64));
        assert!(
            p.take_batches().is_empty(),
            "a turn's batches are taken once"
        );
    }

    #[test]
    fn a_member_is_given_up_on_once_after_staying_down() {
        let now = Instant::now();
        let mut p = Peers::new(addrs(1));
        assert!(!p.down(2, now));
        assert!(!p.down(2, now + NODE_GONE_AFTER / 2));
        assert!(p.down(2, now + NODE_GONE_AFTER));
        assert!(!p.down(2, now + NODE_GONE_AFTER * 2), "once");
        // Heard again, then down again: a new count, but it was given up
        // on and is not given up on twice until its link comes back.
        p.heard(2);
        assert!(!p.down(2, now + NODE_GONE_AFTER * 3));
        assert!(!p.down(2, now + NODE_GONE_AFTER * 4));
        p.link_up(0, "n2".into(), Some(2));
        assert!(!p.down(2, now + NODE_GONE_AFTER * 5));
        assert!(p.down(2, now + NODE_GONE_AFTER * 6));
        // A follower watches nobody: the count starts again.
        assert!(!p.down(3, now));
        p.stop_watching();
        assert!(!p.down(3, now + NODE_GONE_AFTER));
        assert!(p.give_up(4));
        assert!(!p.give_up(4));
    }

    #[test]
    fn links_reach_the_members_they_name() {
        let a = addrs(3);
        let mut p = Peers::new(a[..2].to_vec());
        assert_eq!(p.link_count(), 2);
        assert!(p.dials(&a[1]) && !p.dials(&a[2]));
        p.link_up(1, "n3".into(), Some(3));
        p.link_up(0, "n9".into(), None);
        assert_eq!(p.link_to(3), Some(1));
        assert_eq!(p.links_up(), vec![1]);
        // Members changed: n9 was added as node 9, n3 left.
        let nodes = p
            .reached()
            .map(|n| n.and_then(|n| (n == "n9").then_some(9)))
            .collect();
        p.set_nodes(nodes);
        assert_eq!((p.link_to(9), p.link_to(3)), (Some(0), None));
        p.add_link(a[2]);
        assert_eq!(p.link_count(), 3);
        assert!(p.dials(&a[2]));
        p.link_down(0);
        assert_eq!(p.link_to(9), None);
        assert!(p.links_up().is_empty());
        assert_eq!(p.reached().collect::<Vec<_>>(), [None, Some("n3"), None]);
    }

    #[test]
    fn forwards_are_counted() {
        let mut p = Peers::new(addrs(1));
        p.count_forwarded();
        p.count_forwarded();
        p.count_dropped();
        assert_eq!(p.forward_counts(), (2, 1));
    }
}
