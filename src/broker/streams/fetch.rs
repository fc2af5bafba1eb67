//! Pull fetches: `consumer.fetch` answered at once, or waiting (bounded
//! per connection) until messages arrive, it expires, or its consumer is
//! deleted.

use super::*;

impl Streams {
    /// Answers the waiting fetches that `gone` picks with `not_found`:
    /// their consumer or stream was deleted.
    pub(super) fn end_waits(&mut self, sink: &mut dyn Sink, gone: impl Fn(&Wait) -> bool) {
        let mut i = 0;
        while i < self.waits.len() {
            if !gone(&self.waits[i]) {
                i += 1;
                continue;
            }
            let w = self.waits.remove(i);
            let e = not_found("consumer", &w.consumer);
            let e = ApiError::new(
                e.code,
                format!("{}: deleted while the fetch waited", e.message),
            );
            let (head, body) = (&mut self.head, e.ack_body());
            send_ack_with(sink, head, "/", w.conn, w.ack_id, body.as_bytes(), &[]);
        }
    }

    pub(super) fn fetch(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        r: FetchReq,
        now: Instant,
    ) -> Result<Option<String>, ApiError> {
        let batch = r.batch.unwrap_or(1);
        if batch == 0 || batch > FETCH_BATCH_MAX {
            return Err(ApiError::new(
                Code::BadRequest,
                format!("batch must be 1 to {FETCH_BATCH_MAX}"),
            ));
        }
        let expires = r.expires_ms.unwrap_or(sm::FETCH_EXPIRES_MS_DEFAULT);
        if expires > sm::FETCH_EXPIRES_MS_MAX {
            return Err(ApiError::new(
                Code::BadRequest,
                format!("expires_ms is at most {}", sm::FETCH_EXPIRES_MS_MAX),
            ));
        }
        if self.broken.contains_key(&r.stream) {
            // `internal`, as every other event naming it gets.
            return Err(self
                .slot(&r.stream)
                .err()
                .unwrap_or_else(|| not_found("stream", &r.stream)));
        }
        let slot = self
            .set
            .get_mut(&r.stream)
            .ok_or_else(|| not_found("stream", &r.stream))?;
        let Some(member) = slot.stream.consumers.get(&r.consumer) else {
            return Err(not_found("consumer", &r.consumer));
        };
        if member.consumer.cfg.deliver_subject.is_some() {
            return Err(ApiError::new(
                Code::BadRequest,
                "a push consumer (deliver_subject set) cannot be fetched from",
            ));
        }
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let mut body = std::mem::take(&mut self.body);
        let mut attachments = Vec::new();
        let n = take_batch(
            slot,
            &r.consumer,
            batch as usize,
            now,
            &mut body,
            &mut attachments,
        );
        if n > 0 || r.no_wait == Some(true) {
            let out = fetch_body(&body);
            self.body = body;
            if attachments.is_empty() {
                return Ok(Some(out));
            }
            // Binary messages: a BINARY_ACK, sent here.
            send_ack_with(
                sink,
                &mut self.head,
                "/",
                conn,
                ack_id,
                out.as_bytes(),
                &attachments,
            );
            return Ok(None);
        }
        self.body = body;
        if self.waits.iter().filter(|w| w.conn == conn).count() >= WAITS_PER_CONN_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {WAITS_PER_CONN_MAX} fetches may wait per socket"),
            ));
        }
        let stream = Rc::clone(&slot.name);
        self.waits.push(Wait {
            conn,
            ack_id,
            stream,
            consumer: r.consumer,
            batch: batch as usize,
            deadline: now + Duration::from_millis(expires),
        });
        Ok(None)
    }

    pub(super) fn serve_waits(&mut self, sink: &mut dyn Sink, now: Instant) {
        if self.waits.is_empty() {
            return;
        }
        let mut body = std::mem::take(&mut self.body);
        let mut attachments = Vec::new();
        let mut i = 0;
        while i < self.waits.len() {
            let w = &self.waits[i];
            let slot = self.set.get_mut(&*w.stream);
            let n = match slot {
                Some(slot) => {
                    let ready = slot
                        .stream
                        .consumers
                        .get(&w.consumer)
                        .is_some_and(|m| m.consumer.may_have_work(slot.stream.last_seq()));
                    if ready {
                        take_batch(slot, &w.consumer, w.batch, now, &mut body, &mut attachments)
                    } else {
                        0
                    }
                }
                None => 0,
            };
            if n == 0 && w.deadline > now {
                i += 1;
                continue;
            }
            if n == 0 {
                body.clear();
                attachments.clear();
            }
            let w = self.waits.remove(i);
            let text = fetch_body(&body);
            send_ack_with(
                sink,
                &mut self.head,
                "/",
                w.conn,
                w.ack_id,
                text.as_bytes(),
                &attachments,
            );
        }
        self.body = body;
    }
}
