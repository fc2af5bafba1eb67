//! The cluster's events in the loop: what the Raft thread reports
//! (applied entries, snapshots, views), what the peer links report, and
//! the per-turn work (retries, expiries, the watch on nodes, forward
//! batches sent).

use super::*;
use crate::broker::Broker;

impl Broker {
    /// Drains what the Raft thread and the links reported.
    pub(crate) fn cluster_woken(&mut self, sink: &mut dyn Sink) {
        while let Some(msg) = self
            .cluster
            .as_ref()
            .and_then(|c| c.io.raft_node())
            .and_then(RaftNode::try_recv)
        {
            self.on_raft(sink, msg);
        }
        while let Some(ev) = self
            .cluster
            .as_ref()
            .and_then(|c| c.io.links())
            .and_then(Links::try_recv)
        {
            self.on_link(sink, ev);
        }
    }

    pub(super) fn on_raft(&mut self, sink: &mut dyn Sink, msg: FromRaft) {
        match msg {
            FromRaft::Restore { index, data } => {
                if let Err(e) = self.fsm.restore(&data) {
                    crate::log_error!("cannot load the cluster snapshot at {index}: {e}");
                }
                self.fsm.applied = index;
                if let Some(c) = self.cluster.as_mut() {
                    c.capture_dirty = true;
                }
                self.hold_stream_groups();
            }
            FromRaft::Apply { index, data } => {
                if data.is_empty() {
                    self.fsm.applied = index;
                    return;
                }
                let entry = match Change::decode(&data) {
                    Ok(e) => e,
                    Err(e) => {
                        crate::log_error!("skipping committed entry {index}: {e}");
                        self.fsm.applied = index;
                        return;
                    }
                };
                let result = self.fsm.apply_entry(&entry);
                self.fsm.applied = index;
                if result.as_ref().is_err_and(|e| e.stale) {
                    self.stale_entry(sink, entry);
                    return;
                }
                let result = result.map_err(|e| e.error);
                self.after_apply(sink, &entry.cmd);
                let me = self.fsm.subs.me();
                if entry.node != me {
                    return;
                }
                let Some(w) = self
                    .cluster
                    .as_mut()
                    .and_then(|c| c.proposals.take(entry.op))
                else {
                    return;
                };
                match (w.reply, result) {
                    (Some(r), Ok(())) => self.answer_applied(sink, &entry.cmd, r, w.made),
                    (Some(r), Err(e)) => self.refuse(sink, &r, &e),
                    (None, _) => {}
                }
            }
            FromRaft::Proposed { tag, result } => {
                let Some(c) = self.cluster.as_mut() else {
                    return;
                };
                if let Tag::Remote(_) = Tag::of(tag) {
                    if let Some((conn, ack_id)) = c.proposals.take_remote(tag) {
                        let body = match result {
                            Ok(index) => format!("[{{\"ok\":true,\"index\":{index}}}]"),
                            Err(e) => ApiError::new(Code::Unavailable, e.to_string()).ack_body(),
                        };
                        send_ack(sink, conn, "/control", ack_id, &body);
                    }
                } else if result.is_err() {
                    c.proposals.unsent(tag);
                }
            }
            FromRaft::Status(s) => {
                let name = |n: Option<u64>| {
                    self.cluster
                        .as_ref()
                        .and_then(|c| n.and_then(|n| c.name_of(n)))
                        .unwrap_or("none")
                        .to_string()
                };
                crate::log_info!(
                    "raft: {:?} in term {}, leader {}",
                    s.role,
                    s.term,
                    name(s.leader)
                );
                if let Some(c) = self.cluster.as_mut() {
                    c.role = s.role;
                    c.term = s.term;
                    c.leader = s.leader;
                    // Whatever was with the old leader may be lost: offer
                    // it again (applying twice is harmless, see below).
                    c.proposals.offer_all_again(sink.now());
                }
                self.retry_waiters(sink.now());
            }
            FromRaft::Group { group, event } => {
                let status = matches!(event, crate::cluster::api::GroupEvent::Status(_));
                if let crate::cluster::api::GroupEvent::Status(s) = &event {
                    self.group_leader_moved(sink, group, s.leader);
                }
                self.on_group(sink, group, event);
                if status {
                    let now = sink.now();
                    self.answer_created(sink, now);
                }
            }
            FromRaft::Changed { tag, result } => self.member_proposed(sink, tag, result),
            FromRaft::WantSnapshot => {
                let data = self.fsm.snapshot();
                let index = self.fsm.applied;
                if let Some(c) = self.cluster.as_ref() {
                    c.act(Action::Raft(ToRaft::Compact { index, data }));
                }
            }
        }
    }

    pub(super) fn on_link(&mut self, sink: &mut dyn Sink, ev: LinkEvent) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        match ev {
            LinkEvent::Up { link, node_id } => {
                let node = c.id_of(&node_id);
                if node.is_none() && c.member {
                    crate::log_warn!("peer link {link} reached {node_id:?}, which is not a member");
                }
                c.peers.link_up(link, node_id, node);
                if let Some(n) = node {
                    self.nudge_stream_groups(n);
                }
                self.retry_waiters(sink.now());
            }
            LinkEvent::Down { link } => {
                c.peers.link_down(link);
            }
            LinkEvent::Answer { tag, result } => {
                match Tag::of(tag) {
                    Tag::Member(_) => return self.member_relay_answered(sink, tag, result),
                    Tag::Relay(_) => return self.relay_answered(sink, tag, result),
                    Tag::Catchup(_) => return self.catchup_answered(sink.now(), tag, result),
                    Tag::Batch(_) => return self.batch_answered(sink, tag, result),
                    Tag::Own(_) | Tag::Remote(_) => {}
                }
                let ok = result.as_ref().is_ok_and(|(text, _)| {
                    serde_json::from_str::<Value>(text)
                        .is_ok_and(|v| v.get("ok") == Some(&Value::Bool(true)))
                });
                if !ok {
                    c.proposals.unsent(tag);
                }
            }
        }
    }

    /// Once per loop turn: send the forward batches, retry or expire
    /// waiting changes, announce this node, and (on the leader) give up
    /// on nodes that stay unreachable.
    pub(crate) fn cluster_tick(&mut self, sink: &mut dyn Sink) {
        let ended = std::mem::take(&mut self.fsm.subs.ended);
        for cmd in ended {
            self.submit_internal(sink, Cmd::Subs(cmd));
        }
        let now = sink.now();
        let me = self.fsm.subs.me();
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        for (node, batch) in c.take_batches() {
            let sent = c
                .link_to(node)
                .is_some_and(|link| c.act(Action::Forward { link, batch }));
            if !sent {
                c.peers.count_dropped();
            }
        }
        // Once a leader is known: say this node is up (dropping its
        // earlier life's subscriptions). When that comes back applied,
        // everything committed before it has been applied here too.
        if c.leader.is_some() && c.member && !c.up_proposed {
            c.up_proposed = true;
            let boot = c.boot;
            self.submit_internal(sink, Cmd::Subs(Command::NodeUp { node: me, boot }));
        }
        self.retry_waiters(now);
        self.expire_waiters(sink, now);
        self.answer_created(sink, now);
        if let Some(c) = self.cluster.as_mut() {
            // The Raft thread's view, every VIEW_EVERY rather than every
            // turn of a busy loop.
            if c.next_view <= now {
                c.next_view = now + VIEW_EVERY;
                c.view = c.io.view();
                self.follow_members(sink, now);
                self.watch_nodes(sink, now);
            }
        }
    }
}
