//! The stream and consumer management events (docs/PROTOCOL.md §5):
//! `stream.create`, `.info`, `.list`, `.delete`, `.purge`, `.get`, and
//! `consumer.create`, `.info`, `.list`, `.delete`, on the registry that
//! `streams.rs` owns.

use super::*;

impl Streams {
    pub(super) fn stream_create(
        &mut self,
        fields: Result<serde_json::Map<String, Value>, ApiError>,
    ) -> Result<Value, ApiError> {
        // In a cluster `replicas` was taken out already (`replicated.rs`).
        let mut fields = fields?;
        crate::cluster::api::placement::take_replicas(&mut fields, 1, false)?;
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        if let Some(why) = self.broken.get(&cfg.name) {
            return Err(ApiError::new(
                Code::Internal,
                format!("stream {:?} could not be recovered: {why}", cfg.name),
            ));
        }
        if let Some(slot) = self.set.get(&cfg.name) {
            if slot.stream.cfg == cfg {
                return Ok(stream_json(&slot.stream));
            }
            return Err(ApiError::new(
                Code::Exists,
                format!("stream {:?} exists with another config", cfg.name),
            ));
        }
        for other in self.set.values() {
            for a in &cfg.subjects {
                if let Some(b) = other
                    .stream
                    .cfg
                    .subjects
                    .iter()
                    .find(|b| sm::patterns_overlap(a, b))
                {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!(
                            "subject {a:?} overlaps {b:?} of stream {:?}",
                            other.stream.cfg.name
                        ),
                    ));
                }
            }
        }
        if self.set.len() >= STREAMS_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {STREAMS_MAX} streams"),
            ));
        }
        let root = self
            .root
            .as_ref()
            .ok_or_else(|| internal("no data directory"))?;
        let dir = root.join(&cfg.name);
        // A leftover directory of a deleted stream must not come back.
        let _ = std::fs::remove_dir_all(&dir);
        let mut snap = Snapshot {
            gen: 0,
            config: cfg.clone(),
            last_seq: 0,
            consumers: Vec::new(),
        };
        let meta = MetaLog::create(&dir, &mut snap).map_err(internal)?;
        let stream =
            Stream::open(cfg.clone(), &dir, self.store_opts(), epoch_ms()).map_err(internal)?;
        let meta_key = self.register(meta.file());
        let slot = OpenStream {
            id: 0,
            name: Rc::from(cfg.name.as_str()),
            stream,
            meta,
            meta_key,
            touched: false,
            due: None,
            push_waiting: false,
        };
        let v = stream_json(&slot.stream);
        self.add(slot);
        Ok(v)
    }

    pub(super) fn stream_info(&mut self, name: &str) -> Result<Option<Value>, ApiError> {
        Ok(Some(stream_json(&self.slot(name)?.stream)))
    }

    pub(super) fn stream_list(&self) -> Result<Option<Value>, ApiError> {
        let list: Vec<Value> = self
            .set
            .values()
            .map(|s| stream_json(&s.stream)["stream"].take())
            .collect();
        Ok(Some(json!({ "streams": list })))
    }

    pub(super) fn stream_delete(
        &mut self,
        sink: &mut dyn Sink,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        if self.broken.contains_key(name) {
            return Err(self
                .slot(name)
                .err()
                .unwrap_or_else(|| not_found("stream", name)));
        }
        let slot = self
            .set
            .remove(name)
            .ok_or_else(|| not_found("stream", name))?;
        for p in &slot.stream.cfg.subjects {
            self.capture.remove(p, None, slot.id);
        }
        self.by_id.remove(&slot.id);
        if let (Some(s), Some(k)) = (&self.syncer, slot.meta_key) {
            // Retired, not forgotten: a round already counting on it still
            // runs (and so completes) before its descriptor is dropped.
            s.retire(k);
        }
        let dir = self.root.as_ref().map(|r| r.join(name));
        drop(slot);
        if let Some(dir) = dir {
            std::fs::remove_dir_all(&dir).map_err(internal)?;
        }
        // Acks waiting on the deleted stream's files have nothing left to
        // wait for: they are answered now, and so are fetches waiting on it.
        self.end_waits(sink, |w| &*w.stream == name);
        let mut now = Vec::new();
        self.held.retain_mut(|(_, h)| {
            let gone = &*h.stream == name;
            if gone {
                now.push(std::mem::replace(h, Held::placeholder()));
            }
            !gone
        });
        self.unflushed.retain_mut(|h| {
            let gone = &*h.stream == name;
            if gone {
                now.push(std::mem::replace(h, Held::placeholder()));
            }
            !gone
        });
        for h in now {
            self.answer(sink, &h, None);
        }
        Ok(Some(json!({})))
    }

    pub(super) fn stream_purge(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        r: PurgeReq,
        _now: Instant,
    ) -> Result<(), ApiError> {
        if let Some(f) = &r.subject {
            crate::protocol::subject::validate_pattern(f)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {f:?}")))?;
        }
        let slot = self.slot(&r.name)?;
        let purged = slot.stream.purge(r.subject.as_deref())?;
        forget_missing(slot);
        slot.touched = true;
        if let Some(ack_id) = ack_id {
            let stream = Rc::clone(&slot.name);
            let body = ok_with(json!({ "purged": purged }));
            self.unflushed.push(Held {
                conn,
                ack_id,
                stream,
                reply: AckBody::Body(body),
            });
        }
        Ok(())
    }

    /// The ack body, the message's `data` and `headers` as published; a
    /// binary `data` is answered here, as a BINARY_ACK (then `None`).
    pub(super) fn stream_get(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        r: GetReq,
    ) -> Result<Option<String>, ApiError> {
        let slot = self.slot(&r.name)?;
        let found = match (r.seq, &r.last_by_subject) {
            (Some(seq), None) => slot.stream.get(seq)?.map(|m| (seq, m)),
            (None, Some(subj)) => slot.stream.last_by_subject(subj)?,
            _ => {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "stream.get takes seq or last_by_subject",
                ))
            }
        };
        let (seq, m) = found.ok_or_else(|| ApiError::new(Code::NotFound, "no such message"))?;
        let (body, attachments) = message_body(seq, &m);
        if attachments.is_empty() {
            return Ok(Some(body));
        }
        if let Some(ack_id) = ack_id {
            send_ack_with(
                sink,
                &mut self.head,
                "/",
                conn,
                ack_id,
                body.as_bytes(),
                &attachments,
            );
        }
        Ok(None)
    }

    // ---- consumers -------------------------------------------------------

    pub(super) fn consumer_create(&mut self, r: ConsumerCreate) -> Result<Option<Value>, ApiError> {
        let mut cfg: ConsumerConfig = sm::read_config(r.config)?;
        cfg.validate()?;
        let syncer = self.syncer.clone();
        let slot = self.slot(&r.stream)?;
        let stream = &mut slot.stream;
        if let Some(m) = stream.consumers.get(&cfg.name) {
            if m.consumer.cfg == cfg {
                return Ok(Some(consumer_json(stream, &cfg.name)));
            }
            return Err(ApiError::new(
                Code::Exists,
                format!("consumer {:?} exists with another config", cfg.name),
            ));
        }
        if stream.consumers.len() >= CONSUMERS_PER_STREAM_MAX {
            return Err(ApiError::new(
                Code::Limit,
                format!("at most {CONSUMERS_PER_STREAM_MAX} consumers per stream"),
            ));
        }
        if stream.cfg.retention == Retention::Workqueue {
            let mine = cfg.filter_subject.as_deref().unwrap_or(">");
            let clash = stream.consumers.values().any(|m| {
                let theirs = m.consumer.cfg.filter_subject.as_deref().unwrap_or(">");
                sm::patterns_overlap(mine, theirs)
            });
            if clash {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "a workqueue stream takes one consumer per subject (filters overlap)",
                ));
            }
        }
        let start = start_seq(stream, &cfg);
        let name = cfg.name.clone();
        let since = stream.last_seq();
        stream.consumers.insert(
            name.clone(),
            Member {
                consumer: Consumer::new(cfg, start),
                since,
            },
        );
        if let Err(e) = save(slot, syncer.as_deref()) {
            slot.stream.consumers.remove(&name);
            return Err(e);
        }
        slot.touched = true;
        Ok(Some(consumer_json(&slot.stream, &name)))
    }

    pub(super) fn consumer_info(
        &mut self,
        stream: &str,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let slot = self.slot(stream)?;
        if !slot.stream.consumers.contains_key(name) {
            return Err(not_found("consumer", name));
        }
        let mut v = consumer_json(&slot.stream, name);
        let stream_name = Rc::clone(&slot.name);
        let waiting = self
            .waits
            .iter()
            .filter(|w| w.stream == stream_name && w.consumer == name)
            .count();
        v["consumer"]["num_waiting"] = waiting.into();
        Ok(Some(v))
    }

    pub(super) fn consumer_list(&mut self, stream: &str) -> Result<Option<Value>, ApiError> {
        let slot = self.slot(stream)?;
        let list: Vec<Value> = slot
            .stream
            .consumers
            .keys()
            .map(|n| consumer_json(&slot.stream, n)["consumer"].take())
            .collect();
        Ok(Some(json!({ "consumers": list })))
    }

    pub(super) fn consumer_delete(
        &mut self,
        sink: &mut dyn Sink,
        stream: &str,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let syncer = self.syncer.clone();
        let slot = self.slot(stream)?;
        let gone = slot
            .stream
            .consumers
            .remove(name)
            .ok_or_else(|| not_found("consumer", name))?;
        if let Err(e) = save(slot, syncer.as_deref()) {
            slot.stream.consumers.insert(name.to_string(), gone);
            return Err(e);
        }
        if slot.stream.cfg.retention == Retention::Interest {
            let done: Vec<u64> = slot
                .stream
                .seqs()
                .into_iter()
                .filter(|&s| slot.stream.done_with(s))
                .collect();
            remove_seqs(slot, &done);
        }
        slot.touched = true;
        let stream_name = Rc::clone(&slot.name);
        self.end_waits(sink, |w| w.stream == stream_name && w.consumer == name);
        Ok(Some(json!({})))
    }
}
