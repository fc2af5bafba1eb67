//! Node loss: a node whose peer link and Raft connection both stay down
//! for `NODE_GONE_AFTER`, or that was removed from the configuration, is
//! declared gone by the leader, which removes its subscriptions.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// The leader declares gone the nodes whose link and Raft connection
    /// stay down, removing their subscriptions.
    pub(super) fn watch_nodes(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if c.role != Role::Leader {
            c.peers.stop_watching();
            return;
        }
        let view = c.view.clone();
        let mut gone = Vec::new();
        let members = c.members.clone();
        for &node in &members {
            if node == c.me {
                continue;
            }
            // Down: silent to Raft for a second (a frozen or cut-off node
            // may keep its TCP connections), or with both its Raft
            // connection and its peer link closed (a dead one).
            let peer = view
                .as_ref()
                .and_then(|v| v.peers.iter().find(|p| p.id == node));
            let heard = peer.is_some_and(|p| p.heard);
            let connected = peer.is_some_and(|p| p.connected) || c.link_to(node).is_some();
            if heard && connected {
                c.peers.heard(node);
                continue;
            }
            if c.peers.down(node, now) {
                gone.push(node);
            }
        }
        // Nodes removed from the configuration: their subscriptions go
        // too (once per node; a node that comes back is a new member).
        if !members.is_empty() {
            let mut owners: Vec<u64> = self.fsm.subs.iter().map(|s| s.owner.node).collect();
            owners.sort_unstable();
            owners.dedup();
            for node in owners {
                if !members.contains(&node) && c.peers.give_up(node) {
                    gone.push(node);
                }
            }
        }
        for node in gone {
            let has_subs = self.fsm.subs.iter().any(|s| s.owner.node == node);
            if has_subs {
                let name = self
                    .cluster
                    .as_ref()
                    .and_then(|c| c.name_of(node))
                    .unwrap_or("?")
                    .to_string();
                crate::log_warn!("node {name} is unreachable; removing its subscriptions");
                // Only the life the cluster knows of: a node that already
                // restarted keeps its new subscriptions.
                let boot = self.fsm.boots.get(&node).copied();
                self.submit_internal(sink, Cmd::Subs(Command::RemoveNode { node, boot }));
            }
        }
    }
}
