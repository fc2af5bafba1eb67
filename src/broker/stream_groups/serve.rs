//! A replicated stream's events on this node: publishes and stream
//! events relayed to the group's leader, or served here as ops of the
//! turn's entry (reads through the log, fetches waiting); the answers to
//! `stream.create` of a replicated stream.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// `Some(group)` when a fetch relayed to `node` is to be answered
    /// `unavailable` as soon as this member sees group `group` lose that
    /// leader: `node` leads the group as this member knows it (a
    /// non-member relays to any member, whose own relay watches the
    /// leader). A fetch's relay waits its `expires_ms` plus
    /// [`ENTRY_WAIT`], past the contract's 5 s; every other relay is
    /// answered within [`ENTRY_WAIT`] anyway, and keeps waiting for the
    /// old leader's answer, which tells whether its entry was applied
    /// (an early `unavailable` would leave a publisher retrying one that
    /// was stored).
    fn watched_fetch(&self, op: StreamOp, group: GroupId, node: u64) -> Option<GroupId> {
        let leads = self.stream_groups.leader(group) == Some(node);
        (op == StreamOp::ConsumerFetch && leads).then_some(group)
    }

    /// A publish captured by a replicated stream: `Some(true)` when this
    /// node leads it and the publish joins the turn's entry (its ack
    /// waits for the apply), `Some(false)` when it was relayed to the
    /// leader (which also delivers it), `None` when no replicated stream
    /// captures `subject`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn replicated_publish(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<bool, ApiError>> {
        let c = self.cluster.as_ref()?;
        let me = c.me();
        let fsm = &self.fsm;
        let (group, members) = self.stream_groups.captures.get(fsm.applied, subject, || {
            fsm.streams.values().find_map(|s| {
                let p = s.placement.as_ref().filter(|p| p.replicas.len() > 1)?;
                let subjects = s.config.get("subjects")?.as_array()?;
                subjects
                    .iter()
                    .filter_map(Value::as_str)
                    .any(|f| crate::protocol::subject::matches(f, subject))
                    .then(|| (p.group, p.replicas.clone()))
            })
        })?;
        let route = match self.route(group, &members) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let bytes = match crate::broker::streams::stream_attachment(data, attachments) {
            Ok(Some(b)) => (b, true),
            Ok(None) => (data.as_bytes(), false),
            Err(e) => return Some(Err(e)),
        };
        if let Route::Relay(node) = route {
            if node == me {
                return Some(Err(unavailable("the stream has no leader")));
            }
            if self.stream_groups.held.contains_key(&group) {
                // A member: the turn's publishes go to the leader in one
                // batch; this node delivers the message to subscribers.
                let waiter = ack_id.map(|a| (conn, a));
                let (b, binary) = bytes;
                let term = self.stream_groups.term(group);
                self.stream_groups
                    .batches
                    .add(node, group, term, waiter, subject, headers, b, binary);
                return Some(Ok(true));
            }
            let arg = crate::broker::dispatch::pub_arg(subject, data, reply, headers);
            return Some(
                self.relay(
                    node,
                    None,
                    conn,
                    ack_id,
                    "pub",
                    arg,
                    attachments.to_vec(),
                    ENTRY_WAIT,
                )
                .map(|_| false),
            );
        }
        let item = crate::broker::stream_batches::Item {
            group,
            subject,
            headers,
            data: bytes.0,
            binary: bytes.1,
        };
        Some(
            self.stream_groups
                .take_publish(&item, conn, ack_id, false)
                .map(|()| true),
        )
    }

    /// A stream event naming a replicated stream (`None`: `name` is not
    /// one). Served here on the group's leader, relayed otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn replicated_stream_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        event: &str,
        name: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<Option<String>, ApiError>> {
        let (group, members) = self.placed(name)?;
        if op == StreamOp::StreamCreate {
            // Another replica count is `exists` (`create_replicas`).
            return Some(
                self.create_replicas(arg)
                    .and_then(|_| self.replicated_create_again(name, arg)),
            );
        }
        if op == StreamOp::StreamDelete {
            let cmd = MetaCommand::StreamDelete {
                name: name.to_string(),
            };
            let reply = ack_id.map(|ack_id| crate::broker::cluster::ChangeAck {
                conn,
                nsp: NSP_ROOT,
                ack_id,
                ok_body: OK_BODY.to_string(),
            });
            return Some(self.submit(sink, Cmd::Meta(cmd), reply));
        }
        let route = match self.route(group, &members) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        if let Route::Relay(node) = route {
            // Only a fetch's argument bears on the wait.
            let argv = match op {
                StreamOp::ConsumerFetch => parse::<Value>(arg).unwrap_or(Value::Null),
                _ => Value::Null,
            };
            let timeout = crate::broker::stream_cluster::relay_wait(op, &argv, ENTRY_WAIT);
            let text = arg.map_or("{}", RawValue::get).to_string();
            return Some(self.relay(
                node,
                self.watched_fetch(op, group, node),
                conn,
                ack_id,
                event,
                text,
                attachments.to_vec(),
                timeout,
            ));
        }
        let now = sink.now();
        Some(self.serve(sink, group, op, arg, conn, ack_id, now, false))
    }

    /// `stream.create` of a replicated stream the cluster knows: the same
    /// config again is answered with the stream, another is `exists`.
    fn replicated_create_again(
        &self,
        name: &str,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let known = &self.fsm.streams[name].config;
        let mut fields: Map<String, Value> = parse(arg)?;
        fields.remove("replicas");
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        let mut kf = known.as_object().cloned().unwrap_or_default();
        kf.remove("replicas");
        let known_cfg: StreamConfig = sm::read_config(kf)?;
        if cfg != known_cfg {
            return Err(ApiError::new(
                Code::Exists,
                format!("stream {name:?} exists with another config"),
            ));
        }
        let state = self
            .placed(name)
            .and_then(|(g, _)| self.stream_groups.state(g))
            .unwrap_or_else(|| state_json(&Replica::new(cfg.clone())));
        let body = ok_with(json!({"stream": {"config": cfg, "state": state}}));
        Ok(Some(self.with_cluster_field(name, body)))
    }

    /// The answer to the `stream.create` of a new replicated stream (its
    /// config checked; `replicas` taken out already): an empty stream.
    pub(crate) fn replicated_create_body(
        &self,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let fields: Map<String, Value> = parse(arg)?;
        let mut cfg: StreamConfig = sm::read_config(fields)?;
        cfg.validate()?;
        for (other, s) in &self.fsm.streams {
            let subjects = s.config.get("subjects").and_then(Value::as_array);
            for b in subjects.into_iter().flatten().filter_map(Value::as_str) {
                if let Some(a) = cfg.subjects.iter().find(|a| sm::patterns_overlap(a, b)) {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("subject {a:?} overlaps {b:?} of stream {other:?}"),
                    ));
                }
            }
        }
        let state = state_json(&Replica::new(cfg.clone()));
        Ok(Some(ok_with(
            json!({"stream": {"config": cfg, "state": state}}),
        )))
    }

    /// A replicated stream's event on its leader.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve(
        &mut self,
        sink: &mut dyn Sink,
        group: GroupId,
        op: StreamOp,
        arg: Option<&RawValue>,
        conn: ConnId,
        ack_id: Option<u64>,
        now: Instant,
        applied: bool,
    ) -> Result<Option<String>, ApiError> {
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return Err(unavailable("the stream is not held here"));
        };
        let reads = matches!(
            op,
            StreamOp::StreamInfo
                | StreamOp::StreamGet
                | StreamOp::ConsumerInfo
                | StreamOp::ConsumerList
                | StreamOp::ConsumerCreate
        );
        if reads && !h.core.serving() {
            return Err(unavailable(
                "the stream's new leader is catching up; try again",
            ));
        }
        let pure_read = reads && op != StreamOp::ConsumerCreate;
        if pure_read && !applied {
            // Through the log (a no-op entry), so that a leader cut off
            // from its group never answers from a state it lost.
            let Some(ack_id) = ack_id else {
                return Ok(None);
            };
            let read = Reply::Read {
                conn,
                ack_id,
                op,
                arg: arg.map_or("{}", RawValue::get).to_string(),
                as_of: h.core.applied,
            };
            h.core.take(Op::Expire { now_ms: 0 }, Some(read));
            return Ok(None);
        }
        if h.core.full() {
            return Err(ApiError::new(
                Code::Limit,
                "too many requests are waiting for the stream's replicas",
            ));
        }
        let r = &h.core.replica;
        let reply_ok = |ack_id: Option<u64>| ack_id.map(|ack_id| Reply::Ok { conn, ack_id });
        match op {
            StreamOp::StreamInfo => {
                let body =
                    ok_with(json!({"stream": {"config": r.config(), "state": state_json(r)}}));
                let name = h.name.clone();
                Ok(Some(self.with_cluster_field(&name, body)))
            }
            StreamOp::StreamGet => {
                let req: GetReq = parse(arg)?;
                let seq = match (req.seq, req.last_by_subject.as_deref()) {
                    (Some(seq), _) => seq,
                    (None, Some(subj)) => r
                        .iter()
                        .filter(|(_, m)| &*m.subject == subj)
                        .map(|(s, _)| s)
                        .last()
                        .unwrap_or(0),
                    (None, None) => {
                        return Err(ApiError::new(
                            Code::BadRequest,
                            "stream.get takes seq or last_by_subject",
                        ))
                    }
                };
                let m = msg_of(r, seq).ok_or_else(|| {
                    ApiError::new(Code::NotFound, format!("no message {seq} in the stream"))
                })?;
                let (body, attachments) = crate::broker::stream_out::message_body(seq, &m);
                if attachments.is_empty() {
                    return Ok(Some(body));
                }
                if let Some(ack_id) = ack_id {
                    let head = &mut self.stream_groups.head;
                    send_ack_with(sink, head, "/", conn, ack_id, body.as_bytes(), &attachments);
                }
                Ok(None)
            }
            StreamOp::ConsumerInfo => {
                let req: ConsumerReq = parse(arg)?;
                consumer_json(r, &req.name)
                    .map(|c| Some(ok_with(json!({ "consumer": c }))))
                    .ok_or_else(|| {
                        ApiError::new(Code::NotFound, format!("no consumer {:?}", req.name))
                    })
            }
            StreamOp::ConsumerList => {
                let list: Vec<Value> = r
                    .consumer_names()
                    .iter()
                    .filter_map(|n| consumer_json(r, n))
                    .collect();
                Ok(Some(ok_with(json!({ "consumers": list }))))
            }
            StreamOp::ConsumerCreate => {
                let req: ConsumerCreate = parse(arg)?;
                let mut cfg: ConsumerConfig = sm::read_config(req.config)?;
                cfg.validate()?;
                if let Some(c) = r.consumer(&cfg.name) {
                    if c.cfg == cfg {
                        let info = consumer_json(r, &cfg.name).unwrap_or(Value::Null);
                        return Ok(Some(ok_with(json!({ "consumer": info }))));
                    }
                    return Err(ApiError::new(
                        Code::Exists,
                        format!("consumer {:?} exists with another config", cfg.name),
                    ));
                }
                let config = serde_json::to_string(&cfg)
                    .map_err(|e| ApiError::new(Code::Internal, e.to_string()))?;
                let reply = ack_id.map(|ack_id| Reply::Consumer {
                    conn,
                    ack_id,
                    name: cfg.name,
                });
                h.core.take(Op::ConsumerCreate { config }, reply);
                Ok(None)
            }
            StreamOp::ConsumerDelete => {
                let req: ConsumerReq = parse(arg)?;
                let op = Op::ConsumerDelete { name: req.name };
                h.core.take(op, reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::StreamPurge => {
                let req: PurgeReq = parse(arg)?;
                let op = Op::Purge {
                    filter: req.subject,
                };
                h.core
                    .take(op, ack_id.map(|ack_id| Reply::Purge { conn, ack_id }));
                Ok(None)
            }
            StreamOp::Ack | StreamOp::Nak | StreamOp::Term | StreamOp::Wip => {
                let req: AckReq = parse(arg)?;
                let kind = match op {
                    StreamOp::Ack => AckKind::Ack,
                    StreamOp::Nak => match req.delay_ms.unwrap_or(0) {
                        0 => AckKind::Nak,
                        ms => AckKind::NakDelay(ms.min(NAK_DELAY_MS_MAX)),
                    },
                    StreamOp::Term => AckKind::Term,
                    _ => AckKind::Wip,
                };
                let op = Op::Acks {
                    consumer: req.consumer,
                    acks: vec![(kind, req.seq)],
                };
                h.core.take(op, reply_ok(ack_id));
                Ok(None)
            }
            StreamOp::ConsumerFetch => {
                let req: FetchReq = parse(arg)?;
                if r.consumer(&req.consumer).is_none() && h.core.serving() {
                    return Err(ApiError::new(
                        Code::NotFound,
                        format!("no consumer {:?}", req.consumer),
                    ));
                }
                if r.consumer(&req.consumer)
                    .is_some_and(|c| c.cfg.deliver_subject.is_some())
                {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        "a push consumer (deliver_subject set) cannot be fetched from",
                    ));
                }
                let Some(ack_id) = ack_id else {
                    return Ok(None);
                };
                let batch = req.batch.unwrap_or(1);
                if batch == 0 || batch > FETCH_BATCH_MAX {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("batch must be 1 to {FETCH_BATCH_MAX}"),
                    ));
                }
                let expires_ms = req.expires_ms.unwrap_or(sm::FETCH_EXPIRES_MS_DEFAULT);
                if expires_ms > sm::FETCH_EXPIRES_MS_MAX {
                    return Err(ApiError::new(
                        Code::BadRequest,
                        format!("expires_ms is at most {}", sm::FETCH_EXPIRES_MS_MAX),
                    ));
                }
                let batch = batch as usize;
                let expires = if req.no_wait == Some(true) {
                    Duration::ZERO
                } else {
                    Duration::from_millis(expires_ms)
                };
                if h.waits.len() >= FETCH_WAITS_MAX {
                    return Err(ApiError::new(Code::Limit, "too many fetches waiting"));
                }
                h.waits.push_back(FetchWait {
                    conn,
                    ack_id,
                    consumer: req.consumer,
                    batch,
                    deadline: now + expires,
                });
                Ok(None)
            }
            StreamOp::StreamCreate | StreamOp::StreamDelete | StreamOp::StreamList => Ok(None),
        }
    }
}
