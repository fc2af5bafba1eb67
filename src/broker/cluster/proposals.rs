//! Control-state changes made on this node: applied at once on a single
//! node, and in a cluster handed to the Raft leader (locally, or over its
//! peer link as `cluster.command`), retried while there is none, answered
//! when they come back applied or refused when they wait too long.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// Applies a control-state change: at once on a single node (the
    /// answer is returned), or through Raft in a cluster (`Ok(None)`: the
    /// reply, if any, is sent when the change comes back applied).
    pub(crate) fn submit(
        &mut self,
        sink: &mut dyn Sink,
        cmd: Cmd,
        reply: Option<ChangeAck>,
    ) -> Result<Option<String>, ApiError> {
        let Some(c) = self.cluster.as_mut() else {
            self.fsm.apply(&cmd)?;
            self.after_apply(sink, &cmd);
            return Ok(reply.map(|r| r.ok_body));
        };
        if reply.is_some() && c.proposals.full() {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many changes waiting for the cluster",
            ));
        }
        let now = sink.now();
        c.proposals.submit(c.me, cmd, reply, now);
        self.retry_waiters(now);
        Ok(None)
    }

    /// A change made by the broker itself (no client waits for it).
    pub(crate) fn submit_internal(&mut self, sink: &mut dyn Sink, cmd: Cmd) {
        match self.submit(sink, cmd, None) {
            // What it would end is gone already (a socket's own unsub or
            // close came first): nothing is wrong, and a client must not
            // be able to fill the log with it.
            Err(e) if e.code == Code::NotFound => {
                crate::log_debug!("control change not needed: {}", e.message)
            }
            Err(e) => crate::log_warn!("control change refused: {}", e.message),
            Ok(_) => {}
        }
    }

    /// Hands waiter `op` to the leader, if one is known and reachable.
    pub(super) fn try_propose(&mut self, op: u64, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let link = c.leader.and_then(|l| c.link_to(l));
        let Some((data, timeout)) = c.proposals.due(op, now) else {
            return;
        };
        if c.role == Role::Leader {
            let data = data.to_vec();
            if c.act(Action::Raft(ToRaft::Propose { tag: op, data })) {
                c.proposals.sent(op);
            }
            return;
        }
        let Some(link) = link else {
            return;
        };
        let Ok(entry) = crate::protocol::json_from_bytes::<Value>(data) else {
            return;
        };
        let queued = c.act(Action::Call {
            link,
            out: LinkOut::Call {
                tag: op,
                event: "cluster.command".into(),
                args: json!({ "entry": entry }).to_string(),
                attachments: Vec::new(),
                timeout,
                root: false,
                fenced: false,
            },
        });
        if queued {
            c.proposals.sent(op);
        }
    }

    /// Whatever follows an applied change on this node.
    pub(super) fn after_apply(&mut self, sink: &mut dyn Sink, cmd: &Cmd) {
        match cmd {
            Cmd::Subs(Command::RemoveNode { node, boot })
                if *node == self.fsm.subs.me()
                    && boot.is_none_or(|b| Some(b) == self.cluster.as_ref().map(|c| c.boot)) =>
            {
                // The cluster gave this node up while it was cut off: its
                // clients reconnect and subscribe again.
                crate::log_warn!(
                    "the cluster removed this node's subscriptions; closing its client sockets"
                );
                for (conn, s) in self.sessions.iter().enumerate() {
                    if s.as_ref().is_some_and(|s| s.root) {
                        sink.close(conn);
                    }
                }
            }
            Cmd::Subs(Command::NodeUp { node, boot }) if *node == self.fsm.subs.me() => {
                let mine = self.cluster.as_mut().filter(|c| c.boot == *boot);
                if let Some(c) = mine.filter(|c| !c.caught_up) {
                    // Everything committed before this node started has
                    // been applied: it knows the cluster now, and records
                    // the streams it holds.
                    c.caught_up = true;
                    crate::log_info!("caught up with the cluster");
                    self.announce_streams(sink);
                }
            }
            Cmd::Meta(m) => {
                if let Some(c) = self.cluster.as_mut() {
                    c.capture_dirty = true;
                }
                if matches!(
                    m,
                    MetaCommand::StreamPlace { .. } | MetaCommand::StreamDelete { .. }
                ) {
                    self.hold_stream_groups();
                }
            }
            _ => {}
        }
    }

    /// Offers waiting changes to the leader in operation order, stopping
    /// at the first that cannot go yet, so that no change overtakes an
    /// earlier one of this node.
    pub(super) fn retry_waiters(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        for op in c.proposals.waiting() {
            self.try_propose(op, now);
            let still = self
                .cluster
                .as_ref()
                .is_some_and(|c| c.proposals.is_waiting(op));
            if still {
                break;
            }
        }
    }

    /// An entry of this node came back after a later one of the same life
    /// was applied (it was lost with a leader and offered again): it is
    /// not applied, so that it cannot undo what came after it. Its client
    /// is told to try again; the broker's own changes are made anew.
    pub(super) fn stale_entry(&mut self, sink: &mut dyn Sink, entry: Change) {
        if entry.node != self.fsm.subs.me() {
            return;
        }
        let Some(w) = self
            .cluster
            .as_mut()
            .and_then(|c| c.proposals.take(entry.op))
        else {
            return; // a repeat of an entry already applied
        };
        match w.reply {
            Some(r) => {
                let e = ApiError::new(
                    Code::Unavailable,
                    "the change was lost with a leader; try again",
                );
                self.refuse(sink, &r, &e);
            }
            None => self.submit_internal(sink, entry.cmd),
        }
    }

    /// Answers the client of a change with an error.
    pub(super) fn refuse(&mut self, sink: &mut dyn Sink, r: &ChangeAck, e: &ApiError) {
        self.count_error(e.code);
        send_ack(sink, r.conn, r.nsp, r.ack_id, &e.ack_body());
    }

    pub(super) fn expire_waiters(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        for w in c.proposals.expire(now) {
            match w.reply {
                Some(r) => {
                    let e = ApiError::new(
                        Code::Unavailable,
                        "no cluster leader reachable; the change was not made",
                    );
                    self.refuse(sink, &r, &e);
                }
                None => crate::log_warn!("a control change could not reach a leader in time"),
            }
        }
    }

    /// `cluster.command` from a follower: propose its entry (leader only).
    pub(crate) fn cluster_command(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&serde_json::value::RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let Some(c) = self.cluster.as_mut() else {
            return Err(ApiError::new(
                Code::BadRequest,
                "this node is not in a cluster",
            ));
        };
        let arg = arg.ok_or_else(|| ApiError::new(Code::BadRequest, "missing entry"))?;
        #[derive(serde::Deserialize)]
        struct Req {
            entry: Change,
        }
        let req: Req = serde_json::from_str(arg.get())
            .map_err(|e| ApiError::new(Code::BadRequest, format!("bad entry: {e}")))?;
        if c.role != Role::Leader {
            return Err(ApiError::new(Code::Unavailable, "not the leader"));
        }
        if !c.io.running() {
            return Err(ApiError::new(Code::Unavailable, "raft is not running"));
        }
        let data = req.entry.encode();
        match ack_id {
            Some(ack_id) => {
                if c.proposals.remote_full() {
                    return Err(ApiError::new(
                        Code::Unavailable,
                        "too many proposals waiting",
                    ));
                }
                c.next_tag += 1;
                let tag = Tag::Remote(c.next_tag).raw();
                c.proposals.add_remote(tag, conn, ack_id);
                c.act(Action::Raft(ToRaft::Propose { tag, data }));
                Ok(None)
            }
            None => {
                c.act(Action::Raft(ToRaft::Propose { tag: 0, data }));
                Ok(Some(crate::protocol::errors::OK_BODY.to_string()))
            }
        }
    }
}

/// How long after its `stream.create` was taken a new replicated stream
/// may wait for its group's first leader before the create is answered
/// `unavailable` (the contract's bound is 5 s).
pub(crate) const FIRST_LEADER_WAIT: Duration = Duration::from_millis(4_500);

impl Broker {
    /// The change of `w` (its reply `r`) applied: sent now, except for a
    /// new replicated stream's placement, whose create is acked once the
    /// stream's group has a leader, so that the publishes that follow are
    /// taken at once (docs/PROTOCOL.md, "Replicated streams").
    pub(super) fn answer_applied(
        &mut self,
        sink: &mut dyn Sink,
        cmd: &Cmd,
        r: ChangeAck,
        taken: Instant,
    ) {
        let group = match cmd {
            Cmd::Meta(MetaCommand::StreamPlace { placement, .. })
                if placement.replicas.len() > 1 =>
            {
                placement.group
            }
            _ => {
                send_ack(sink, r.conn, r.nsp, r.ack_id, &r.ok_body);
                return;
            }
        };
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        c.proposals
            .wait_for_leader(r, group, taken + FIRST_LEADER_WAIT);
        let now = sink.now();
        self.answer_created(sink, now);
    }

    /// Acks each create waiting for its group's first leader once this
    /// node knows one; past its deadline, answers `unavailable` (the
    /// stream exists: a repeated create answers like the first).
    pub(super) fn answer_created(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let groups = &self.stream_groups;
        let done = c
            .proposals
            .created_done(now, |g| groups.leader(g).is_some());
        for (reply, led) in done {
            if led {
                send_ack(sink, reply.conn, reply.nsp, reply.ack_id, &reply.ok_body);
            } else {
                let e = ApiError::new(
                    Code::Unavailable,
                    "the stream was created but its replicas have not elected a leader yet; try again",
                );
                self.refuse(sink, &reply, &e);
            }
        }
    }
}
