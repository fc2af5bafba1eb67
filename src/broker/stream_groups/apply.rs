//! The stream groups' turn and their Raft events: each turn's ops
//! proposed as one entry, entries applied and snapshots restored into the
//! replicas, and the requests they settle answered (a push consumer's
//! deliveries sent, reads made).

use super::*;
use crate::broker::Broker;

impl Broker {
    /// At the end of a loop turn: on each group this node leads, the
    /// waiting fetches take their deliveries, and the group's turn ends
    /// (its ops go out as one entry, see [`Group::flush`]); requests
    /// refused meanwhile are answered `unavailable`.
    pub(crate) fn flush_stream_groups(&mut self, sink: &mut dyn Sink) {
        if self.stream_groups.held.is_empty() {
            return;
        }
        let now = sink.now();
        self.catch_up_all(now);
        self.send_batches(sink);
        let Some(c) = self.cluster.as_ref().filter(|c| c.running()) else {
            return;
        };
        let mut out = Settled::default();
        let now_ms = epoch_ms();
        for (&group, h) in self.stream_groups.held.iter_mut() {
            if h.core.leads() {
                plan_fetches(h, now, &mut out.answers);
                plan_pushes(h, &mut self.fsm.subs, &self.remote_push, now);
            }
            let mut done = Vec::new();
            for p in h.core.flush(now, now_ms, &mut done) {
                c.act(Action::Raft(ToRaft::GroupPropose {
                    group,
                    tag: p.tag,
                    data: p.data,
                }));
            }
            for d in done {
                settle(h, d, now, &mut out);
            }
        }
        self.stream_groups.send_settled(sink, out);
    }

    /// What the Raft thread says about stream group `group`.
    pub(crate) fn on_group(&mut self, sink: &mut dyn Sink, group: GroupId, event: GroupEvent) {
        if let GroupEvent::Settled { members } = event {
            self.group_settled(sink, group, &members);
            return;
        }
        let now = sink.now();
        let me = self.cluster.as_ref().map_or(0, |c| c.me());
        if !self.stream_groups.held.contains_key(&group) {
            return;
        }
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let mut done = Vec::new();
        let mut out = Settled::default();
        match event {
            GroupEvent::Restore { index, data, file } => {
                if h.installed.take() == Some(index) {
                    // Held already: the catch-up built it.
                } else if let Some(lost) = restore(h, index, &data, file, now) {
                    if lost {
                        h.lost = true;
                        if let Some(c) = self.cluster.as_ref() {
                            c.act(Action::Raft(ToRaft::GroupLost { group }));
                        }
                    }
                }
            }
            GroupEvent::Arrived { index, data, file } => {
                self.snapshot_arrived(group, index, &data, file, now);
                return;
            }
            GroupEvent::Apply {
                index, ref data, ..
            } if (h.lost && index > 1) || h.catchup.is_some() => {
                // The replica is not whole: the group's core is started
                // again without its log, or waits for it to be. An entry
                // past the snapshot being fetched (a leader whose log
                // covers it fed the core meanwhile) is noted: it comes
                // again once the replica is whole.
                if let Some(cu) = h.catchup.as_mut() {
                    cu.skipped(index, data.len());
                }
            }
            GroupEvent::ReplayFailed { index } => {
                crate::log_warn!(
                    "stream {:?}: the entries after {index} are no longer in its log; \
                     fetching again",
                    h.name
                );
                h.lost = true;
                if let Some(c) = self.cluster.as_ref() {
                    c.act(Action::Raft(ToRaft::GroupLost { group }));
                }
            }
            GroupEvent::Apply {
                index,
                term,
                data,
                at,
            } => {
                if h.lost {
                    // The core that lost its log is fed the leader's log
                    // from its start (the leader took no snapshot yet)
                    // rather than a snapshot: the replica is built again
                    // from that log.
                    h.lost = false;
                    h.opened = false;
                    h.core.applied = 0;
                    h.core.replica = Replica::new(h.core.replica.config().clone());
                }
                if !h.opened {
                    // A log applied from its start: the files of an
                    // earlier run go.
                    h.opened = true;
                    if let Some((dir, segment_bytes, log)) = &h.store {
                        match Payloads::open_in(dir, *segment_bytes, log.as_deref()) {
                            Ok(p) => h.core.replica.set_payloads(p),
                            Err(e) => crate::log_error!("{}: {e}", dir.display()),
                        }
                    }
                }
                if let Err(e) = h
                    .core
                    .apply_at(index, term, &data, at, now, &mut done, None)
                {
                    crate::log_error!("stream {:?}: entry {index}: {e}", h.name);
                }
            }
            GroupEvent::Proposed { tag, result } => {
                h.core.proposed(tag, result.ok(), &mut done);
            }
            GroupEvent::Status(s) => {
                if h.core.status(s.role == Role::Leader, s.term, s.leader) {
                    for w in std::mem::take(&mut h.waits) {
                        let body = unavailable("the stream's leader changed").ack_body();
                        out.answers.push((w.conn, w.ack_id, body));
                    }
                }
                if s.leader == Some(me) {
                    crate::log_info!("stream {:?}: leading its group in term {}", h.name, s.term);
                }
            }
            GroupEvent::WantSnapshot => {
                self.snapshot_now(group);
            }
            // Taken above.
            GroupEvent::Settled { .. } => {}
        }
        if let Some(h) = self.stream_groups.held.get_mut(&group) {
            for d in done {
                settle(h, d, now, &mut out);
            }
        }
        if !out.pushes.is_empty() {
            self.push_delivered(sink, group, std::mem::take(&mut out.pushes));
        }
        for (conn, ack_id, op, arg, as_of) in std::mem::take(&mut out.reads) {
            self.stream_groups.lag_as_of = Some(as_of);
            let raw = RawValue::from_string(arg).ok();
            let r = self.serve(
                sink,
                group,
                op,
                raw.as_deref(),
                conn,
                Some(ack_id),
                now,
                true,
            );
            match r {
                Ok(Some(body)) => out.answers.push((conn, ack_id, body)),
                Ok(None) => {}
                Err(e) => out.answers.push((conn, ack_id, e.ack_body())),
            }
            self.stream_groups.lag_as_of = None;
        }
        for (conn, ack_id, op, event, arg) in std::mem::take(&mut out.kv_reads) {
            self.stream_groups.kv_read_applied = true;
            let raw = RawValue::from_string(arg).ok();
            let r = self.kv_event(sink, conn, op, &event, raw.as_deref(), Some(ack_id), &[]);
            self.stream_groups.kv_read_applied = false;
            match r {
                Ok(Some(body)) => out.answers.push((conn, ack_id, body)),
                Ok(None) => {}
                Err(e) => out.answers.push((conn, ack_id, e.ack_body())),
            }
        }
        self.stream_groups.send_settled(sink, out);
    }

    /// Sends the deliveries a push consumer's entry accepted to its
    /// `deliver_subject`. A delivery no subscriber takes any more (it
    /// left since) is due again after `ack_wait`, as on one node.
    fn push_delivered(
        &mut self,
        sink: &mut dyn Sink,
        group: GroupId,
        pushes: Vec<(String, Vec<(u64, u64)>)>,
    ) {
        let Some(h) = self.stream_groups.held.get(&group) else {
            return;
        };
        for (name, list) in pushes {
            let Some(c) = h.core.replica.consumer(&name) else {
                continue;
            };
            let Some(subject) = c.cfg.deliver_subject.as_deref() else {
                continue;
            };
            let deliver_group = c.cfg.deliver_group.as_deref();
            for (seq, delivered) in list {
                let Some(m) = msg_of(&h.core.replica, seq) else {
                    continue;
                };
                let to = Push {
                    stream: &h.name,
                    consumer: &name,
                    seq,
                    delivered,
                };
                push_accepted(
                    sink,
                    &mut self.fsm.subs,
                    &mut self.remote_push,
                    subject,
                    deliver_group,
                    &to,
                    &m,
                    &mut self.stream_groups.pick,
                );
            }
        }
        self.forward_pushes();
    }
}
