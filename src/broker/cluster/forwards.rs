//! Messages between nodes: `cluster.forward` batches received and
//! delivered to this node's subscribers, and stream push deliveries queued
//! for other nodes' subscribers.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// `cluster.forward` from a peer: deliver its batch to this node's
    /// sockets.
    pub(crate) fn cluster_forward(
        &mut self,
        sink: &mut dyn Sink,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        if self.cluster.is_none() {
            return Err(ApiError::new(
                Code::BadRequest,
                "this node is not in a cluster",
            ));
        }
        let batch = attachments
            .first()
            .ok_or_else(|| ApiError::new(Code::BadRequest, "cluster.forward needs its batch"))?;
        let msgs = forward::decode(batch).map_err(|e| ApiError::new(Code::BadRequest, e))?;
        for m in &msgs {
            self.deliver_forwarded(sink, m);
        }
        Ok(Some(crate::protocol::errors::OK_BODY.to_string()))
    }

    /// Delivers a message a peer forwarded: to this node's plain and
    /// broadcast subscribers when `plain`, and to the group members the
    /// sender picked (or, if one is gone, another local member of its
    /// group).
    pub(super) fn deliver_forwarded(&mut self, sink: &mut dyn Sink, m: &PeerMessage<'_>) {
        self.answer_inbox(sink, m.subject, m.data, m.headers, &m.attachments);
        let matches = self.fsm.subs.matches(m.subject);
        let mut targets: Vec<SubKey> = Vec::new();
        if m.plain {
            targets.extend(matches.plain.iter().copied());
            for g in &matches.groups {
                if self.fsm.subs.group_mode(&g.queue) == GroupMode::Broadcast {
                    targets.extend(g.members.iter().copied());
                }
            }
        }
        let me = self.fsm.subs.me();
        for (serial, sid) in &m.picks {
            let owner = self.fsm.subs.local_owner(*serial);
            let key = self.fsm.subs.find(owner, sid);
            if let Some(k) = key.filter(|&k| self.fsm.subs.deliverable(k).is_some()) {
                targets.push(k);
                continue;
            }
            // The picked member is closing: another member of its group
            // here. (One already removed cannot be told apart: the message
            // is lost to that group, as a core message may be.)
            let Some(queue) = key
                .and_then(|k| self.fsm.subs.get(k))
                .and_then(|s| s.queue.clone())
            else {
                continue;
            };
            let other = matches
                .groups
                .iter()
                .filter(|g| *g.queue == *queue)
                .flat_map(|g| g.members.iter().copied())
                .find(|&k| {
                    self.fsm
                        .subs
                        .deliverable(k)
                        .is_some_and(|s| s.owner.node == me)
                });
            if let Some(k) = other {
                targets.push(k);
            }
        }
        if targets.is_empty() {
            return;
        }
        let size = m.data.len() + m.headers.map_or(0, str::len);
        self.deliver_to(sink, &targets, m, size);
    }

    /// Queues the push deliveries a stream made for other nodes'
    /// subscribers.
    pub(crate) fn forward_pushes(&mut self) {
        if self.remote_push.out.is_empty() {
            return;
        }
        let out = std::mem::take(&mut self.remote_push.out);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        for p in &out {
            c.queue_forward(
                p.node,
                &PeerMessage {
                    subject: &p.subject,
                    reply: None,
                    data: &p.data,
                    headers: p.headers.as_deref(),
                    extra: Some(&p.extra),
                    attachments: p.attachments.clone(),
                    plain: false,
                    picks: vec![(p.pick.0, p.pick.1.as_str())],
                },
            );
            c.peers.count_forwarded();
        }
    }
}
