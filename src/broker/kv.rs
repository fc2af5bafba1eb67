//! The key-value events (docs/PROTOCOL.md §14) on the broker: each is
//! checked (names, rights) where the client is connected, then carried
//! out where the bucket's stream is served: here when this node holds the
//! R1 stream or leads the replicated one, else relayed whole to the node
//! that does (a replicated stream's member relays on to its leader).
//!
//! A write is a publish to `$KV.<bucket>.<key>` with the write's headers:
//! subscribers see it live, and the stream's write rules
//! (`stream/limits.rs`) decide compare-and-set in the step that gives the
//! write its sequence (an R1 store, or the replicated leader's apply).
//! Reads use the stream's per-subject index through
//! [`KvSource`]; a watch is an in-memory
//! consumer of an R1 bucket's stream (`streams/kv.rs`).

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::cluster::Listing;
use super::events::{KvOp, StreamOp};
use super::stream_groups::{Route, ENTRY_WAIT};
use super::streams::kv::{
    kv_at, kv_history, kv_latest, kv_latest_all, kv_state, push_entry, start_watch, KvEntry,
    KvSource, KvState, WatchStart,
};
use super::Broker;
use crate::auth::rights::{Rules, SubDecision};
use crate::cluster::api::GroupId;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_with, ApiError, Code};
use crate::protocol::kv_messages::{self as kvm, BucketReq, CreateReq, KeyReq, KeysReq, WatchReq};
use crate::protocol::messages::PubArg;
use crate::protocol::stream_messages::StreamConfig;
use crate::routing::subs::SID_BYTES_MAX;
use crate::stream::limits::KvOp as WriteOp;
use crate::stream::replica::Replica;

fn parse<'a, T: serde::Deserialize<'a>>(arg: Option<&'a RawValue>) -> Result<T, ApiError> {
    let arg =
        arg.ok_or_else(|| ApiError::new(Code::BadRequest, "the event needs an object argument"))?;
    serde_json::from_str(arg.get())
        .map_err(|e| ApiError::new(Code::BadRequest, format!("bad arguments: {e}")))
}

fn no_bucket(bucket: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no bucket named {bucket:?}"))
}

fn unavailable(why: &str) -> ApiError {
    ApiError::new(Code::Unavailable, why)
}

fn internal(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(Code::Internal, e.to_string())
}

/// `{config, state}` of a bucket.
fn bucket_json(st: &KvState, replicas: u64) -> Value {
    json!({
        "config": kvm::bucket_config(&st.config, replicas),
        "state": {"values": st.values, "bytes": st.bytes, "revision": st.revision},
    })
}

/// Where a bucket's stream is served, seen from this node.
enum Place {
    /// An R1 stream held here.
    Local,
    /// A replicated stream this node leads.
    Leader(GroupId),
    /// Another node serves it.
    Relay(u64),
    /// No such stream.
    Missing,
}

/// A bucket event's key and the subject it stands for.
struct Keyed<'a> {
    req: KeyReq<'a>,
    subject: String,
}

fn keyed<'a>(bucket: &str, arg: Option<&'a RawValue>) -> Result<Keyed<'a>, ApiError> {
    let req: KeyReq = parse(arg)?;
    kvm::check_key(&req.key)?;
    let subject = kvm::subject_of(bucket, &req.key);
    Ok(Keyed { req, subject })
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
            return self.kv_list(conn, arg, ack_id);
        }
        let BucketReq { bucket: b } = parse(arg)?;
        kvm::check_bucket(&b)?;
        let stream = kvm::stream_name(&b);
        self.kv_rights(sink, conn, op, &b, arg)?;
        let place = self.kv_place(&stream)?;
        if op == KvOp::Create && !matches!(place, Place::Relay(_)) {
            return self.kv_create(sink, conn, arg, ack_id, &place);
        }
        match place {
            Place::Missing => return Err(no_bucket(&b)),
            // A replica here serves a watch (`kv_watch` says when not).
            Place::Relay(_) if op == KvOp::Watch => {
                return self.kv_watch(sink, conn, &b, arg, ack_id);
            }
            Place::Relay(node) => {
                let text = arg.map_or("{}", RawValue::get).to_string();
                return self.relay(
                    node,
                    None,
                    conn,
                    ack_id,
                    name,
                    text,
                    attachments.to_vec(),
                    ENTRY_WAIT,
                );
            }
            Place::Local | Place::Leader(_) => {}
        }
        let reads = matches!(op, KvOp::Info | KvOp::Get | KvOp::History | KvOp::Keys);
        if let Place::Leader(group) = place {
            if reads && !self.stream_groups.kv_read_applied {
                return (self.stream_groups)
                    .kv_read_through_log(group, conn, ack_id, op, name, arg);
            }
        }
        match op {
            KvOp::DeleteBucket => {
                let raw = name_arg(&stream)?;
                self.kv_stream_event(sink, conn, StreamOp::StreamDelete, &raw, ack_id, None)
            }
            KvOp::Info => {
                let replicas = self.kv_replicas(&stream);
                let st = self.kv_read(&place, &stream, kv_state)?;
                Ok(Some(ok_with(
                    json!({ "bucket": bucket_json(&st, replicas) }),
                )))
            }
            KvOp::Put | KvOp::Delete | KvOp::Purge => {
                self.kv_write(sink, conn, op, &place, &b, arg, ack_id, attachments)
            }
            KvOp::Get | KvOp::History => {
                let k = keyed(&b, arg)?;
                let entries = self.kv_read(&place, &stream, |s| match (op, k.req.revision) {
                    (KvOp::History, _) => kv_history(s, &k.subject),
                    (_, None) => Ok(kv_latest(s, &k.subject)?
                        .filter(|e| e.op == WriteOp::Put)
                        .into_iter()
                        .collect()),
                    (_, Some(rev)) => Ok(kv_at(s, rev)?
                        .filter(|e| *e.msg.subject == *k.subject)
                        .into_iter()
                        .collect()),
                })?;
                if entries.is_empty() {
                    let key = &k.req.key;
                    return Err(ApiError::new(
                        Code::NotFound,
                        format!("no value for key {key:?}"),
                    ));
                }
                let one = op == KvOp::Get;
                Ok(entries_answer(sink, conn, ack_id, &b, &entries, one))
            }
            KvOp::Keys => {
                let req: KeysReq = parse(arg)?;
                let filter = req.filter.unwrap_or_else(|| ">".to_string());
                kvm::check_key_filter(&filter)?;
                let rules = self.readable_rules(conn);
                let latest = self.kv_read(&place, &stream, |s| {
                    kv_latest_all(s, &kvm::subject_of(&b, &filter))
                })?;
                let keys: Vec<&str> = latest
                    .iter()
                    .filter(|e| e.op == WriteOp::Put)
                    .filter(|e| {
                        rules
                            .as_ref()
                            .is_none_or(|r| r.allows_subject(&e.msg.subject))
                    })
                    .filter_map(|e| kvm::key_of(&b, &e.msg.subject))
                    .collect();
                Ok(Some(ok_with(json!({ "keys": keys }))))
            }
            KvOp::Watch => self.kv_watch(sink, conn, &b, arg, ack_id),
            KvOp::Create | KvOp::List => Err(internal(&"answered above")),
        }
    }

    /// The rights an event needs (docs/PROTOCOL.md §14), checked on the
    /// node the client is connected to, before anything is relayed.
    fn kv_rights(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: KvOp,
        bucket: &str,
        arg: Option<&RawValue>,
    ) -> Result<(), ApiError> {
        let stream = kvm::stream_name(bucket);
        let raw = name_arg(&stream)?;
        match op {
            KvOp::Create => self.check_stream(conn, "stream.create", Some(&raw)),
            KvOp::DeleteBucket => self.check_stream(conn, "stream.delete", Some(&raw)),
            KvOp::Info => self.check_stream(conn, "stream.info", Some(&raw)),
            KvOp::Put | KvOp::Delete | KvOp::Purge => {
                let k = keyed(bucket, arg)?;
                self.check_publish(conn, "publish to", &k.subject, sink.now())
            }
            KvOp::Get | KvOp::History => {
                let k = keyed(bucket, arg)?;
                self.kv_read_check(conn, &k.subject)
            }
            KvOp::Keys | KvOp::Watch => {
                let filter = match op {
                    KvOp::Keys => parse::<KeysReq>(arg)?.filter,
                    _ => parse::<WatchReq>(arg)?.key,
                };
                let filter = filter.unwrap_or_else(|| ">".to_string());
                kvm::check_key_filter(&filter)?;
                let pattern = kvm::subject_of(bucket, &filter);
                let whole = self.readable_rules(conn).is_none_or(
                    |r| matches!(r.decide_sub(&pattern), SubDecision::Allowed(c) if c.is_empty()),
                );
                match (crate::protocol::subject::has_wildcard(&filter), whole) {
                    (_, true) => Ok(()),
                    (false, false) => self.kv_read_check(conn, &pattern),
                    // Only the keys the user may read are shown; that is
                    // decided here, so the bucket must be served here.
                    (true, false) => match self.kv_place(&stream)? {
                        Place::Relay(_) => Err(ApiError::new(
                            Code::Forbidden,
                            format!("not allowed to read every key of {pattern}"),
                        )),
                        _ => Ok(()),
                    },
                }
            }
            KvOp::List => Ok(()),
        }
    }

    /// Where stream `stream` is served, seen from this node.
    fn kv_place(&self, stream: &str) -> Result<Place, ApiError> {
        if self.streams.holds(stream) {
            return Ok(Place::Local);
        }
        let Some(me) = self.cluster.as_ref().map(|c| c.me()) else {
            return Ok(Place::Missing);
        };
        if let Some((group, members)) = self.placed(stream) {
            return Ok(match self.route(group, &members)? {
                Route::Here => Place::Leader(group),
                Route::Relay(node) => Place::Relay(node),
            });
        }
        Ok(match self.fsm.stream_owner(stream) {
            Some(o) if o != me => Place::Relay(o),
            _ => Place::Missing,
        })
    }

    /// The replica count of a bucket's stream.
    fn kv_replicas(&self, stream: &str) -> u64 {
        self.placed(stream).map_or(1, |(_, m)| m.len() as u64)
    }

    /// Runs `f` over the stream of a bucket served here.
    fn kv_read<T>(
        &mut self,
        place: &Place,
        stream: &str,
        f: impl FnOnce(&dyn KvSource) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        match place {
            Place::Local => f(self.streams.kv_source(stream)?),
            Place::Leader(group) => {
                let h = self
                    .stream_groups
                    .held
                    .get(group)
                    .filter(|h| h.core.serving())
                    .ok_or_else(|| unavailable("the bucket's leader is not serving yet"))?;
                f(&h.core.replica)
            }
            _ => Err(unavailable("the bucket is not served here")),
        }
    }

    /// A stream event made for a bucket event (its rights were checked).
    fn kv_stream_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        arg: &RawValue,
        ack_id: Option<u64>,
        shape: Option<&dyn Fn(&str) -> String>,
    ) -> Result<Option<String>, ApiError> {
        let event = match op {
            StreamOp::StreamCreate => "stream.create",
            _ => "stream.delete",
        };
        let clustered =
            self.clustered_stream_event_as(sink, conn, op, event, Some(arg), ack_id, &[], shape);
        match clustered {
            Some(r) => r,
            None => self.streams.event(sink, conn, op, event, Some(arg), ack_id),
        }
    }

    fn kv_create(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        place: &Place,
    ) -> Result<Option<String>, ApiError> {
        let req: CreateReq = parse(arg)?;
        let fields = req.stream_create(self.cfg.max_payload as u64)?;
        let replicas = req.replicas.unwrap_or(1);
        let raw =
            RawValue::from_string(Value::Object(fields).to_string()).map_err(|e| internal(&e))?;
        if matches!(place, Place::Missing) {
            // A new bucket: answered once the cluster has recorded it (at
            // once on a single node), empty.
            let shape = move |body: &str| new_bucket_body(body, replicas);
            let r = self.kv_stream_event(
                sink,
                conn,
                StreamOp::StreamCreate,
                &raw,
                ack_id,
                Some(&shape),
            )?;
            return Ok(r.map(|b| shape(&b)));
        }
        // The same config again answers the bucket as it is; another is
        // `exists`.
        self.kv_stream_event(sink, conn, StreamOp::StreamCreate, &raw, None, None)?;
        let info = json!({ "bucket": req.bucket }).to_string();
        let info = RawValue::from_string(info).map_err(|e| internal(&e))?;
        self.kv_event(sink, conn, KvOp::Info, "kv.info", Some(&info), ack_id, &[])
    }

    /// `kv.list`. On a single node, its buckets. In a cluster, every
    /// reachable node's, as `stream.list` (docs/PROTOCOL.md §9): this
    /// node's R1 buckets and every replicated one (its state from the
    /// replica held here, zero where none is), each replaced by the entry
    /// of the node holding it or leading its group; asked by a peer
    /// (`{"local":true}`), only the buckets this node holds or leads.
    fn kv_list(
        &mut self,
        conn: ConnId,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
    ) -> Result<Option<String>, ApiError> {
        let from_peer = arg.is_some_and(|a| a.get().contains("\"local\":true"));
        let mut list = Vec::new();
        for name in self.streams.names() {
            if kvm::bucket_of_stream(&name).is_some() {
                let st = kv_state(self.streams.kv_source(&name)?)?;
                list.push(bucket_json(&st, 1));
            }
        }
        let gather = self.cluster.is_some() && !from_peer;
        let replicated: Vec<(String, GroupId, u64)> = self
            .fsm
            .streams
            .keys()
            .filter(|n| kvm::bucket_of_stream(n).is_some())
            .filter_map(|n| self.placed(n).map(|(g, m)| (n.clone(), g, m.len() as u64)))
            .collect();
        for (name, group, replicas) in replicated {
            let held = self.stream_groups.held.get(&group);
            let leads = held.is_some_and(|h| h.core.serving());
            let st = match held {
                Some(h) if leads || (gather && h.opened && !h.lost) => kv_state(&h.core.replica)?,
                _ if gather => {
                    let Some(config) = self
                        .fsm
                        .streams
                        .get(&name)
                        .and_then(|s| placed_config(&s.config))
                    else {
                        continue;
                    };
                    KvState {
                        config,
                        values: 0,
                        bytes: 0,
                        revision: 0,
                    }
                }
                _ => continue,
            };
            list.push(bucket_json(&st, replicas));
        }
        if gather {
            return self.gather_list(conn, ack_id, Listing::Buckets, list);
        }
        Listing::Buckets.sort(&mut list);
        let body = json!([{"ok": true, "buckets": list}]).to_string();
        Ok(Some(self.filter_list(conn, body, Listing::Buckets)))
    }

    /// `kv.put`, `kv.delete`, `kv.purge`: a publish to the key's subject
    /// with the write's headers; acked `{ok, revision}` once stored.
    #[allow(clippy::too_many_arguments)]
    fn kv_write(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: KvOp,
        place: &Place,
        bucket: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        let Keyed { req, subject } = keyed(bucket, arg)?;
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
        let headers = kvm::write_headers(marker, expected);
        if let Place::Leader(group) = place {
            // The leader's apply decides the write, on every replica alike.
            let (bytes, binary) = match super::streams::stream_attachment(data, attachments)? {
                Some(b) => (b, true),
                None => (data.as_bytes(), false),
            };
            let item = super::stream_batches::Item {
                group: *group,
                subject: &subject,
                headers: headers.as_deref(),
                data: bytes,
                binary,
            };
            self.stream_groups.take_publish(&item, conn, ack_id, true)?;
            let h = headers.as_deref();
            self.deliver(sink, &subject, data, None, h, attachments, size, None);
            return Ok(None);
        }
        let p = PubArg {
            subject: subject.as_str().into(),
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
    fn readable_rules(&self, conn: ConnId) -> Option<Rules> {
        let s = self.sessions.get(conn)?.as_ref()?;
        s.rights.as_ref().map(|r| r.rights().subscribe.clone())
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
        let subject = kvm::subject_of(bucket, &filter);
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
        let taken = |c: &str| subs.conn_has_sid(owner, c) || streams.has_watch(conn, c);
        let sid = match req.sid {
            Some(sid) if sid.is_empty() || sid.len() > SID_BYTES_MAX || taken(&sid) => {
                return Err(ApiError::new(
                    Code::BadRequest,
                    format!("sid {sid:?} is in use or not 1 to {SID_BYTES_MAX} bytes"),
                ))
            }
            Some(sid) => sid,
            None => session.assign_sid(taken),
        };
        let rules = self.readable_rules(conn);
        self.streams.watch_room(conn)?;
        let stream = kvm::stream_name(bucket);
        let src: &dyn KvSource = if self.streams.holds(&stream) {
            self.streams.kv_source(&stream)?
        } else {
            self.watchable_replica(&stream).ok_or_else(|| {
                unavailable(
                    "a watch is served by a node holding the bucket's stream \
                     (any replica of a replicated bucket): connect there",
                )
            })?
        };
        let w = start_watch(
            sink, src, conn, ack_id, &sid, &stream, bucket, &subject, start, rules,
        )?;
        // From now on every write of the stream is caught for the watches.
        let tap = match self.streams.tap_of(&stream) {
            Some(t) => Some(t),
            None => self
                .stream_groups
                .held
                .values_mut()
                .find(|h| h.name == stream)
                .map(|h| &mut h.core.replica.tap),
        };
        if let Some(t) = tap {
            t.get_or_insert_with(Vec::new);
        }
        self.streams.add_watch(w);
        Ok(None)
    }

    /// The replica of a replicated stream held here that a watch may read:
    /// one caught up with its group's log, a leader's or a follower's
    /// alike, since every member applies the same entries in order.
    fn watchable_replica(&self, stream: &str) -> Option<&Replica> {
        watchable(&self.stream_groups.held, stream)
    }

    /// Each loop turn, after the stores were written and entries applied:
    /// every watch gets the writes its stream's tap caught, and taps no
    /// watch reads are turned off.
    pub(super) fn serve_kv_watches(&mut self, sink: &mut dyn Sink) {
        let watched = self.streams.watched();
        for name in &watched {
            let tap = match self.streams.tap_of(name) {
                Some(t) => Some(t.replace(Vec::new())),
                None => self
                    .stream_groups
                    .held
                    .values_mut()
                    .find(|h| *h.name == **name && h.opened && !h.lost && h.catchup.is_none())
                    .map(|h| h.core.replica.tap.replace(Vec::new())),
            };
            let stored = tap.map(Option::unwrap_or_default);
            self.streams.feed_watches(sink, name, stored.as_deref());
        }
        self.streams.untap(&watched);
        for h in self.stream_groups.held.values_mut() {
            if h.core.replica.tap.is_some() && !watched.contains(h.name.as_str()) {
                h.core.replica.tap = None;
            }
        }
    }
}

fn watchable<'a>(
    held: &'a std::collections::HashMap<GroupId, super::stream_groups::Held>,
    stream: &str,
) -> Option<&'a Replica> {
    held.values()
        .find(|h| h.name == stream && h.opened && !h.lost && h.catchup.is_none())
        .map(|h| &h.core.replica)
}

/// The stream config the cluster records for a replicated stream (with
/// its `replicas`, which the stream's own config does not carry).
fn placed_config(recorded: &Value) -> Option<StreamConfig> {
    let mut config = recorded.clone();
    config.as_object_mut()?.remove("replicas");
    serde_json::from_value(config).ok()
}

/// `{"name": stream}` as a raw argument.
fn name_arg(stream: &str) -> Result<Box<RawValue>, ApiError> {
    RawValue::from_string(json!({ "name": stream }).to_string()).map_err(|e| internal(&e))
}

/// The `kv.create` answer of a new bucket, from its `stream.create` one.
fn new_bucket_body(stream_body: &str, replicas: u64) -> String {
    let v: Value = serde_json::from_str(stream_body).unwrap_or(Value::Null);
    let cfg = v[0]["stream"]["config"]
        .as_object()
        .cloned()
        .unwrap_or_else(Map::new);
    let Ok(cfg) = serde_json::from_value::<StreamConfig>(Value::Object(cfg)) else {
        return stream_body.to_string();
    };
    let st = KvState {
        config: cfg,
        values: 0,
        bytes: 0,
        revision: 0,
    };
    ok_with(json!({ "bucket": bucket_json(&st, replicas) }))
}

/// An entry answer, `[{ok, entry}]` or `[{ok, entries:[…]}]`: returned as
/// text, or sent here as a BINARY_ACK when a value is bytes.
fn entries_answer(
    sink: &mut dyn Sink,
    conn: ConnId,
    ack_id: Option<u64>,
    bucket: &str,
    entries: &[KvEntry],
    one: bool,
) -> Option<String> {
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
    let body = String::from_utf8(out).unwrap_or_default();
    if attachments.is_empty() {
        return Some(body);
    }
    if let Some(ack_id) = ack_id {
        let mut head = Vec::new();
        let body = body.as_bytes();
        super::ack::send_ack_with(sink, &mut head, "/", conn, ack_id, body, &attachments);
    }
    None
}
