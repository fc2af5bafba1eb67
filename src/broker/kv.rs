//! The key-value events (docs/PROTOCOL.md §14) on the broker: each is
//! checked (names, rights) and carried out on the bucket's stream with
//! the stream machinery. A write is a publish to `$KV.<bucket>.<key>`
//! (so subscribers see it live and the stream's write rules decide
//! compare-and-set), reads use the stream's per-subject index, a watch
//! is an in-memory consumer (`streams/kv.rs`). In a cluster an event for
//! a bucket held by another node is relayed there whole.

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::events::{KvOp, StreamOp};
use super::streams::{push_entry, KvEntry, KvState, WatchStart};
use super::Broker;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code};
use crate::protocol::kv_messages::{self as kvm, BucketReq, CreateReq, KeyReq, KeysReq, WatchReq};
use crate::protocol::messages::PubArg;
use crate::protocol::socketio;
use crate::stream::limits::KvOp as WriteOp;

fn parse<'a, T: serde::Deserialize<'a>>(arg: Option<&'a RawValue>) -> Result<T, ApiError> {
    let arg =
        arg.ok_or_else(|| ApiError::new(Code::BadRequest, "the event needs an object argument"))?;
    serde_json::from_str(arg.get())
        .map_err(|e| ApiError::new(Code::BadRequest, format!("bad arguments: {e}")))
}

fn not_found(what: String) -> ApiError {
    ApiError::new(Code::NotFound, what)
}

/// `{config, state}` of a bucket.
fn bucket_json(st: &KvState) -> Value {
    json!({
        "config": kvm::bucket_config(&st.config, 1),
        "state": {"values": st.values, "bytes": st.bytes, "revision": st.revision},
    })
}

impl Broker {
    /// A `kv.*` event; `Ok(None)` when its ack was sent or goes out later.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kv_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: KvOp,
        name: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        if op == KvOp::List {
            return self.kv_list(conn);
        }
        let bucket: BucketReq = parse(arg)?;
        kvm::check_bucket(&bucket.bucket)?;
        let b = bucket.bucket;
        let stream = kvm::stream_name(&b);
        if let Some(r) = self.kv_elsewhere(conn, &stream, name, arg, ack_id, attachments) {
            return r;
        }
        match op {
            KvOp::Create => self.kv_create(sink, conn, arg),
            KvOp::DeleteBucket => {
                self.kv_admin_check(conn, "stream.delete", &stream)?;
                self.kv_state_of(&b)?;
                let arg = json!({ "name": stream }).to_string();
                let raw = RawValue::from_string(arg).map_err(|e| internal(&e))?;
                self.kv_stream_event(sink, conn, StreamOp::StreamDelete, &raw, ack_id)
            }
            KvOp::Info => {
                self.kv_use_check(conn, &stream)?;
                let st = self.kv_state_of(&b)?;
                Ok(Some(ok_with(json!({ "bucket": bucket_json(&st) }))))
            }
            KvOp::Put | KvOp::Delete | KvOp::Purge => {
                self.kv_write(sink, conn, op, &b, arg, ack_id, attachments)
            }
            KvOp::Get => self.kv_read(sink, conn, &b, arg, ack_id, false),
            KvOp::History => self.kv_read(sink, conn, &b, arg, ack_id, true),
            KvOp::Keys => self.kv_keys(conn, &b, arg),
            KvOp::Watch => self.kv_watch(sink, conn, &b, arg, ack_id),
            KvOp::List => unreachable!("answered above"),
        }
    }

    /// In a cluster: an event for a bucket whose stream another node
    /// holds is relayed there (`None`: it is served here).
    fn kv_elsewhere(
        &mut self,
        conn: ConnId,
        stream: &str,
        event: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<Option<String>, ApiError>> {
        let me = self.cluster.as_ref()?.me();
        if self.streams.holds(stream) {
            return None;
        }
        let record = self.fsm.streams.get(stream)?;
        if record
            .placement
            .as_ref()
            .is_some_and(|p| p.replicas.len() > 1)
        {
            return Some(Err(ApiError::new(
                Code::Unavailable,
                "buckets with replicas are not served yet",
            )));
        }
        let owner = self.fsm.stream_owner(stream).filter(|&o| o != me)?;
        let text = arg.map_or("{}", RawValue::get).to_string();
        Some(self.relay(
            owner,
            None,
            conn,
            ack_id,
            event,
            text,
            attachments.to_vec(),
            super::cluster::PROPOSE_WAIT,
        ))
    }

    fn kv_admin_check(&mut self, conn: ConnId, event: &str, stream: &str) -> Result<(), ApiError> {
        let arg = json!({ "name": stream }).to_string();
        let raw = RawValue::from_string(arg).map_err(|e| internal(&e))?;
        self.check_stream(conn, event, Some(&raw))
    }

    fn kv_use_check(&mut self, conn: ConnId, stream: &str) -> Result<(), ApiError> {
        self.kv_admin_check(conn, "stream.info", stream)
    }

    /// A stream event made for a bucket event, as a client's would be.
    fn kv_stream_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        arg: &RawValue,
        ack_id: Option<u64>,
    ) -> Result<Option<String>, ApiError> {
        let event = match op {
            StreamOp::StreamCreate => "stream.create",
            _ => "stream.delete",
        };
        if let Some(r) = self.clustered_stream_event(sink, conn, op, event, Some(arg), ack_id, &[])
        {
            return r;
        }
        self.streams.event(sink, conn, op, event, Some(arg), ack_id)
    }

    fn kv_state_of(&mut self, bucket: &str) -> Result<KvState, ApiError> {
        let stream = kvm::stream_name(bucket);
        if !self.streams.holds(&stream) {
            return Err(not_found(format!("no bucket named {bucket:?}")));
        }
        self.streams.kv_state(&stream)
    }

    fn kv_create(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let req: CreateReq = parse(arg)?;
        let stream = kvm::stream_name(&req.bucket);
        self.kv_admin_check(conn, "stream.create", &stream)?;
        if req.replicas.is_some_and(|r| r > 1) {
            return Err(ApiError::new(
                Code::Unavailable,
                "buckets with replicas are not served yet",
            ));
        }
        let fields = req.stream_create(self.cfg.max_payload as u64)?;
        let raw =
            RawValue::from_string(Value::Object(fields).to_string()).map_err(|e| internal(&e))?;
        if self.cluster.is_some() {
            // Created here, then recorded by the cluster; the answer is
            // the bucket as it stands now.
            self.kv_stream_event(sink, conn, StreamOp::StreamCreate, &raw, None)?;
        } else {
            self.streams.event(
                sink,
                conn,
                StreamOp::StreamCreate,
                "stream.create",
                Some(&raw),
                None,
            )?;
        }
        let st = self.kv_state_of(&req.bucket)?;
        Ok(Some(ok_with(json!({ "bucket": bucket_json(&st) }))))
    }

    fn kv_list(&mut self, conn: ConnId) -> Result<Option<String>, ApiError> {
        let mut list = Vec::new();
        for name in self.streams.names() {
            let Some(bucket) = kvm::bucket_of_stream(&name).map(str::to_string) else {
                continue;
            };
            if self.kv_use_check(conn, &name).is_err() {
                continue;
            }
            list.push(bucket_json(&self.kv_state_of(&bucket)?));
        }
        Ok(Some(ok_with(json!({ "buckets": list }))))
    }

    /// `kv.put`, `kv.delete`, `kv.purge`: a publish to the key's subject
    /// with the write's headers; acked `{ok, revision}` once stored.
    #[allow(clippy::too_many_arguments)]
    fn kv_write(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: KvOp,
        bucket: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        let req: KeyReq = parse(arg)?;
        kvm::check_key(&req.key)?;
        let stream = kvm::stream_name(bucket);
        if !self.streams.holds(&stream) {
            return Err(not_found(format!("no bucket named {bucket:?}")));
        }
        let subject = kvm::subject_of(bucket, &req.key);
        let (marker, expected, data) = match op {
            KvOp::Put => (None, req.revision, req.value.map_or("null", RawValue::get)),
            KvOp::Delete => (Some("DEL"), req.revision, "null"),
            _ => (Some("PURGE"), None, "null"),
        };
        if op == KvOp::Put && req.value.is_none() {
            return Err(ApiError::new(Code::BadRequest, "kv.put needs a value"));
        }
        let attachments = if op == KvOp::Put { attachments } else { &[] };
        let size = data.len() + attachments.iter().map(Vec::len).sum::<usize>();
        if size > self.cfg.max_payload {
            return Err(ApiError::new(
                Code::PayloadTooLarge,
                format!(
                    "value is {size} bytes, the limit is {}",
                    self.cfg.max_payload
                ),
            ));
        }
        self.check_publish(conn, "publish to", &subject, sink.now())?;
        let headers = kvm::write_headers(marker, expected);
        let p = PubArg {
            subject: subject.into(),
            data: Some(data),
            reply: None,
            headers: headers.as_deref(),
        };
        match self.publish_checked(sink, conn, ack_id, &p, attachments, size, true)? {
            true => Ok(None),
            false => Err(internal(&"the bucket's stream did not take the write")),
        }
    }

    /// Checks that the socket may read `subject` (`subscribe` on it).
    fn kv_read_check(&mut self, conn: ConnId, subject: &str) -> Result<(), ApiError> {
        match self.readable_rules(conn) {
            Some(r) if !r.allows_subject(subject) => Err(ApiError::new(
                Code::Forbidden,
                format!("not allowed to read {subject}"),
            )),
            _ => Ok(()),
        }
    }

    /// The socket's `subscribe` rules, `None` with every right.
    fn readable_rules(&self, conn: ConnId) -> Option<crate::auth::rights::Rules> {
        let s = self.sessions.get(conn)?.as_ref()?;
        s.rights.as_ref().map(|r| r.rights().subscribe.clone())
    }

    /// Sends (or returns) an entry answer: `[{ok, <field>: …}]`.
    fn kv_entries_answer(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        bucket: &str,
        entries: &[KvEntry],
        one: bool,
    ) -> Result<Option<String>, ApiError> {
        let mut out = Vec::new();
        let mut attachments = Vec::new();
        out.extend_from_slice(if one {
            b"[{\"ok\":true,\"entry\":".as_slice()
        } else {
            b"[{\"ok\":true,\"entries\":[".as_slice()
        });
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let key = kvm::key_of(bucket, &e.msg.subject).unwrap_or("");
            push_entry(&mut out, &mut attachments, None, key, e);
        }
        out.extend_from_slice(if one { b"}]".as_slice() } else { b"]}]" });
        let body = String::from_utf8(out).map_err(|e| internal(&e))?;
        if attachments.is_empty() {
            return Ok(Some(body));
        }
        if let Some(ack_id) = ack_id {
            let mut head = Vec::new();
            socketio::write_header(
                &mut head,
                socketio::PacketType::BinaryAck,
                attachments.len(),
                "/",
                Some(ack_id),
            );
            if sink.send_text(conn, &[&head, body.as_bytes()]) {
                for a in &attachments {
                    sink.send_binary(conn, a);
                }
            }
        }
        Ok(None)
    }

    /// `kv.get` (`history` false) and `kv.history` (true).
    fn kv_read(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        bucket: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        history: bool,
    ) -> Result<Option<String>, ApiError> {
        let req: KeyReq = parse(arg)?;
        kvm::check_key(&req.key)?;
        let subject = kvm::subject_of(bucket, &req.key);
        self.kv_read_check(conn, &subject)?;
        self.kv_state_of(bucket).map(drop)?;
        let stream = kvm::stream_name(bucket);
        let entries = match (history, req.revision) {
            (true, _) => self.streams.kv_history(&stream, &subject)?,
            (false, None) => self
                .streams
                .kv_latest(&stream, &subject)?
                .filter(|e| e.op == WriteOp::Put)
                .into_iter()
                .collect(),
            (false, Some(rev)) => self
                .streams
                .kv_at(&stream, rev)?
                .filter(|e| *e.msg.subject == *subject)
                .into_iter()
                .collect(),
        };
        if entries.is_empty() {
            return Err(not_found(format!("no value for key {:?}", req.key)));
        }
        self.kv_entries_answer(sink, conn, ack_id, bucket, &entries, !history)
    }

    fn kv_keys(
        &mut self,
        conn: ConnId,
        bucket: &str,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let req: KeysReq = parse(arg)?;
        let filter = req.filter.unwrap_or_else(|| ">".to_string());
        kvm::check_key_filter(&filter)?;
        self.kv_state_of(bucket).map(drop)?;
        let rules = self.readable_rules(conn);
        let latest = self
            .streams
            .kv_latest_all(&kvm::stream_name(bucket), &kvm::subject_of(bucket, &filter))?;
        let keys: Vec<&str> = latest
            .iter()
            .filter(|e| e.op == WriteOp::Put)
            .filter(|e| {
                rules
                    .as_ref()
                    .is_none_or(|r| r.allows_subject(&e.msg.subject))
            })
            .filter_map(|e| kvm::key_of(bucket, &e.msg.subject))
            .collect();
        Ok(Some(ok_with(json!({ "keys": keys }))))
    }

    fn kv_watch(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        bucket: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
    ) -> Result<Option<String>, ApiError> {
        let req: WatchReq = parse(arg)?;
        let filter = req.key.unwrap_or_else(|| ">".to_string());
        kvm::check_key_filter(&filter)?;
        let subject = kvm::subject_of(bucket, &filter);
        if !crate::protocol::subject::has_wildcard(&filter) {
            self.kv_read_check(conn, &subject)?;
        }
        self.kv_state_of(bucket).map(drop)?;
        let start = match (req.updates_only, req.include_history) {
            (Some(true), _) => WatchStart::UpdatesOnly,
            (_, Some(true)) => WatchStart::History,
            _ => WatchStart::Latest,
        };
        let owner = self.owner(conn).ok_or_else(|| internal(&"no session"))?;
        let subs = &self.fsm.subs;
        let streams = &self.streams;
        let session = self
            .sessions
            .get_mut(conn)
            .and_then(Option::as_mut)
            .ok_or_else(|| internal(&"no session"))?;
        let sid = session.assign_sid(|c| subs.conn_has_sid(owner, c) || streams.has_watch(conn, c));
        let rules = self.readable_rules(conn);
        self.streams.kv_watch(
            sink,
            conn,
            ack_id,
            &sid,
            &kvm::stream_name(bucket),
            bucket,
            &subject,
            start,
            rules,
        )?;
        Ok(None)
    }
}

fn internal(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(Code::Internal, e.to_string())
}
