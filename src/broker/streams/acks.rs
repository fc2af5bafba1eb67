//! Acks both ways: the consumer acks clients send (`ack`, `nak`, `term`,
//! `wip`), and the acks of captured publishes held until the write (and
//! the fsync round, under `-sync=always`) that makes them true, released
//! when the fsync thread reports; the final round at shutdown.

use super::*;

impl Streams {
    pub(super) fn ack_event(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        event: &str,
        r: AckReq,
        now: Instant,
    ) -> Result<(), ApiError> {
        let slot = self.slot(&r.stream)?;
        let member = slot
            .stream
            .consumers
            .get_mut(&r.consumer)
            .ok_or_else(|| not_found("consumer", &r.consumer))?;
        let c = &mut member.consumer;
        let mut events = Vec::new();
        let mut done = Vec::new();
        match event {
            "ack" => done = c.ack(r.seq, &mut events)?,
            "nak" => {
                let delay = r.delay_ms.unwrap_or(0).min(NAK_DELAY_MS_MAX);
                c.nak(r.seq, Duration::from_millis(delay), now)?;
            }
            "term" => {
                if c.term(r.seq, &mut events)? {
                    done.push(r.seq);
                }
            }
            _ => c.wip(r.seq, now)?,
        }
        after_events(slot, &r.consumer, &events, &done);
        slot.touched = true;
        if let Some(ack_id) = ack_id {
            let stream = Rc::clone(&slot.name);
            self.unflushed.push(Held {
                conn,
                ack_id,
                stream,
                reply: AckBody::Ok,
            });
        }
        Ok(())
    }

    /// The fsync thread finished a round (it calls the loop's waker after
    /// each): release what it covered.
    pub fn woken(&mut self, sink: &mut dyn Sink) {
        self.hear_syncer();
        self.release(sink);
    }

    /// Takes in the fsync rounds completed so far.
    pub(super) fn hear_syncer(&mut self) {
        if let Some(s) = &self.syncer {
            self.synced = self.synced.max(s.done());
        }
    }

    /// The broker is stopping (before any client is told): writes what
    /// the last turn left (messages before the cursor logs naming them),
    /// runs a final fsync round over every stream file whatever `-sync`
    /// says (none under `-sync=none`), waiting at most `within` for it, and
    /// then sends every held ack that round covers, so a publisher whose
    /// message is now durable hears so before its DISCONNECT. Acks still
    /// held after `within` are not sent: their messages were written and
    /// the round goes on (the fsync thread finishes it when the syncer is
    /// dropped), but their publishers are never told.
    /// An fsync failure answers them with `internal` instead.
    pub fn shutdown(&mut self, sink: &mut dyn Sink, within: Duration) {
        if self.root.is_none() {
            return;
        }
        let t0 = Instant::now();
        if self.down.is_none() {
            let now = sink.now();
            self.flush_all(now, self.wall.ms_at(now));
        }
        let synced = self
            .syncer
            .as_ref()
            .map_or(Ok(true), |s| s.sync_now(within));
        let held = self.held.len();
        self.hear_syncer();
        self.release(sink);
        let sent = held - self.held.len();
        let ms = t0.elapsed().as_millis();
        match synced {
            Ok(true) if self.policy == SyncPolicy::Never => crate::log_info!(
                "shutting down: streams written (not fsynced: -sync=none), {sent} held acks sent"
            ),
            Ok(true) => crate::log_info!(
                "shutting down: streams written and synced in {ms} ms, {sent} held acks sent"
            ),
            Ok(false) => crate::log_warn!(
                "shutting down: the final fsync did not finish within {} ms; {} held acks are not sent",
                within.as_millis(),
                self.held.len()
            ),
            Err(e) => crate::log_error!(
                "shutting down: streams could not be synced ({e}); {sent} held acks answered"
            ),
        }
    }

    /// A connection went away: its held acks and waiting fetches go too.
    pub fn closed(&mut self, conn: ConnId) {
        self.unflushed.retain(|h| h.conn != conn);
        self.held.retain(|(_, h)| h.conn != conn);
        self.waits.retain(|w| w.conn != conn);
        self.watches.retain(|w| w.conn != conn);
    }

    pub(super) fn flush_all(&mut self, now: Instant, now_ms: u64) {
        let mut failed = None;
        for slot in self.set.values_mut() {
            if !slot.touched {
                continue;
            }
            slot.touched = false;
            plan_slot(slot, now, now_ms);
            // Messages are written before the cursors that refer to them.
            if let Err(e) = slot
                .stream
                .flush()
                .map(|t| self.ticket = self.ticket.max(t))
            {
                failed = Some(e.to_string());
            }
            if slot.meta.wants_compaction() {
                if let Err(e) = save(slot, self.syncer.as_deref()) {
                    failed = Some(e.message);
                }
            }
            match slot.meta.flush() {
                Ok(true) => {
                    if let (Some(s), Some(k)) = (&self.syncer, slot.meta_key) {
                        self.ticket = self.ticket.max(s.dirty(k));
                    }
                }
                Ok(false) => {}
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if let Some(f) = failed {
            crate::log_error!("streams: write failed: {f}");
            self.down = Some(format!("write failed: {f}"));
        }
        let t = self.ticket;
        self.held.extend(self.unflushed.drain(..).map(|h| (t, h)));
    }

    pub(super) fn release(&mut self, sink: &mut dyn Sink) {
        let failure = self.syncer.as_ref().and_then(|s| s.failure());
        let failure = failure.or_else(|| self.down.clone());
        while let Some((t, _)) = self.held.front() {
            let covered = !self.policy.acks_wait() || self.syncer.is_none() || *t <= self.synced;
            if !covered && failure.is_none() {
                break;
            }
            let Some((_, h)) = self.held.pop_front() else {
                break;
            };
            let error = if covered { None } else { failure.as_deref() };
            self.answer(sink, &h, error);
        }
    }

    /// Sends one held ack: its reply, or `internal` when what it confirms
    /// could not be made durable.
    pub(super) fn answer(&mut self, sink: &mut dyn Sink, h: &Held, error: Option<&str>) {
        self.body.clear();
        match (error, &h.reply) {
            (Some(f), _) => {
                let e = ApiError::new(Code::Internal, format!("not stored: {f}"));
                self.body.extend_from_slice(e.ack_body().as_bytes());
            }
            (None, AckBody::Ok) => self.body.extend_from_slice(OK_BODY.as_bytes()),
            (None, AckBody::Body(b)) => self.body.extend_from_slice(b.as_bytes()),
            (None, AckBody::Stored { seq, duplicate }) => {
                push_stored(&mut self.body, &h.stream, *seq, *duplicate)
            }
        }
        send_ack_with(sink, &mut self.head, "/", h.conn, h.ack_id, &self.body, &[]);
    }
}
