//! The [`Broker`]: the `net::Handler` that turns Socket.IO packets into
//! subscriptions, publishes, requests and acks. A delivery is encoded once
//! (the part after the subscriber's sid) and copied into each subscriber's
//! outbound buffer; nothing is allocated per subscriber.

use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::groups::GroupMode;
use super::history::History;
use super::metrics::Metrics;
use super::requests::{Pending, Requests, REQUEST_TIMEOUT_DEFAULT, REQUEST_TIMEOUT_MAX};
use super::session::{token_eq, Session, NSP_CONTROL, NSP_ROOT};
use super::streams::{Incoming, Streams};
use super::subject;
use super::subs::{Command, SubKey, SubTable};
use crate::net::{ConnId, Handler, Io, Payload, Request, Response};
use crate::protocol::errors::{ok_body, raw_text, ApiError, Code, OK_BODY};
use crate::protocol::messages::{self, event_arg, ArgError, Pub, Sub, Unsub};
use crate::protocol::socketio::{self, Kind, Packet};

/// Room the open packet's maxPayload leaves above `-max-payload` for the
/// event envelope, so an oversized `data` gets an ack instead of a close.
pub const ENVELOPE_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: String,
    pub control_token: Option<String>,
    pub auth_token: Option<String>,
    pub max_payload: usize,
    pub connect_timeout: Duration,
}

pub struct Broker {
    pub(crate) cfg: BrokerConfig,
    pub(crate) started: Instant,
    pub(crate) sessions: Vec<Option<Session>>,
    pub(crate) subs: SubTable,
    requests: Requests,
    pub(crate) metrics: Metrics,
    /// Per-second traffic samples for the dashboard.
    pub(crate) history: History,
    pub(crate) streams: Streams,
    /// Reused buffer for the shared part of a delivery.
    tail: Vec<u8>,
    /// Reused buffer for ack headers.
    ack_head: Vec<u8>,
    rng: u64,
}

/// What a root-namespace event answers: `{ok:true}`, another body now, or
/// an ack later (a request).
enum Answer {
    Ok,
    Now(String),
    Later,
}

impl Broker {
    pub fn new(cfg: BrokerConfig) -> Broker {
        let rng = crate::net::server::random_seed();
        let requests = Requests::new(&format!(
            "{}.{:x}",
            sanitize(&cfg.node_id),
            rng & 0xffff_ffff
        ));
        Broker {
            cfg,
            started: Instant::now(),
            sessions: Vec::new(),
            subs: SubTable::new(),
            requests,
            metrics: Metrics::default(),
            history: History::new(Instant::now()),
            streams: Streams::default(),
            tail: Vec::with_capacity(1024),
            ack_head: Vec::with_capacity(32),
            rng,
        }
    }

    /// Opens the streams under `<data>/streams` (recovering what is there)
    /// with the given fsync policy. Until this succeeds, stream events are
    /// refused with `unavailable`.
    pub fn open_streams(
        &mut self,
        data: &std::path::Path,
        policy: crate::stream::sync::SyncPolicy,
        segment_bytes: u64,
    ) -> Result<(), String> {
        self.streams = Streams::open(data, policy, segment_bytes)?;
        Ok(())
    }

    fn session(&mut self, conn: ConnId) -> Option<&mut Session> {
        self.sessions.get_mut(conn)?.as_mut()
    }

    fn random_id(&mut self) -> String {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        format!("{:016x}", z ^ (z >> 31))
    }

    fn on_text(&mut self, io: &mut Io<'_>, conn: ConnId, text: &str) {
        let Some(session) = self.session(conn) else {
            return;
        };
        if session.attachments.pending() {
            // Text while attachments are awaited breaks the packet format.
            return io.close(conn);
        }
        let packet = match socketio::decode(text) {
            Ok(p) => p,
            Err(_) => return io.close(conn),
        };
        if packet.kind.is_binary() && packet.attachments > 0 {
            session.attachments.start(text, packet.attachments);
            return;
        }
        self.on_packet(io, conn, &packet, &[]);
    }

    fn on_binary(&mut self, io: &mut Io<'_>, conn: ConnId, bytes: &[u8]) {
        let bytes_max = self.cfg.max_payload + ENVELOPE_BYTES;
        let Some(session) = self.session(conn) else {
            return;
        };
        match session.attachments.push(bytes, bytes_max) {
            Ok(None) => {}
            Ok(Some((text, parts))) => match socketio::decode(&text) {
                Ok(packet) => self.on_packet(io, conn, &packet, &parts),
                Err(_) => io.close(conn),
            },
            Err(_) => io.close(conn),
        }
    }

    fn on_packet(
        &mut self,
        io: &mut Io<'_>,
        conn: ConnId,
        p: &Packet<'_>,
        attachments: &[Vec<u8>],
    ) {
        match p.kind {
            Kind::Connect => self.connect(io, conn, p),
            Kind::Disconnect => self.leave(conn, p.nsp),
            Kind::Event | Kind::BinaryEvent => self.event(io, conn, p, attachments),
            // The broker asks clients for no acks; stray ones are ignored.
            Kind::Ack | Kind::BinaryAck => {}
            Kind::ConnectError => io.close(conn),
        }
    }

    fn connect(&mut self, io: &mut Io<'_>, conn: ConnId, p: &Packet<'_>) {
        // Engine.IO v3 clients (Socket.IO v4) send their auth as a query
        // on the namespace: `0/control?token=…,`.
        let legacy_query = match p.nsp.split_once('?') {
            Some((nsp, query)) if io.eio(conn) == 3 => Some((nsp, query)),
            _ => None,
        };
        let p = &Packet {
            nsp: legacy_query.map_or(p.nsp, |(nsp, _)| nsp),
            ..*p
        };
        let token = match p.nsp {
            NSP_ROOT => self.cfg.auth_token.clone(),
            NSP_CONTROL => self.cfg.control_token.clone(),
            other => {
                let body = br#"{"message":"Invalid namespace"}"#;
                let head = socketio::encode(Kind::ConnectError, 0, other, None, "");
                io.send_text(conn, &[&head, body]);
                return;
            }
        };
        if let Some(expected) = token {
            let given_ok = match legacy_query {
                Some((_, query)) => {
                    let given = query_param(query, "token").unwrap_or_default();
                    token_eq(given.as_bytes(), expected.as_bytes())
                }
                None => auth_token_ok(p.data, &expected),
            };
            if !given_ok {
                let head = socketio::encode(Kind::ConnectError, 0, p.nsp, None, "");
                io.send_text(conn, &[&head, br#"{"message":"unauthorized"}"#]);
                return;
            }
        }
        let id = self.random_id();
        let Some(session) = self.session(conn) else {
            return;
        };
        if p.nsp == NSP_ROOT {
            session.root = true;
        } else {
            session.control = true;
        }
        crate::log_debug!("conn {conn} joined {}", p.nsp);
        let body = format!("{{\"sid\":\"{id}\"}}");
        let head = socketio::encode(Kind::Connect, 0, p.nsp, None, "");
        io.send_text(conn, &[&head, body.as_bytes()]);
        io.set_timer(conn, None);
    }

    fn leave(&mut self, conn: ConnId, nsp: &str) {
        let Some(session) = self.session(conn) else {
            return;
        };
        match nsp {
            NSP_ROOT if session.root => {
                session.root = false;
                self.drop_root_state(conn);
            }
            NSP_CONTROL => session.control = false,
            _ => {}
        }
    }

    fn drop_root_state(&mut self, conn: ConnId) {
        let _ = self.subs.apply(Command::RemoveConn { conn });
        self.requests.drop_conn(conn);
    }

    fn event(&mut self, io: &mut Io<'_>, conn: ConnId, p: &Packet<'_>, attachments: &[Vec<u8>]) {
        let Some(name) = socketio::event_name(p.data) else {
            return io.close(conn);
        };
        if p.attachments > 0 && !socketio::placeholders_valid(p.data, p.attachments) {
            return io.close(conn);
        }
        let Some(session) = self.session(conn) else {
            return;
        };
        let (root, control) = (session.root, session.control);
        let result = match p.nsp {
            NSP_ROOT if root => self.root_event(io, conn, &name, p.data, p.id, attachments),
            NSP_CONTROL if control => match socketio::parse_event(p.data) {
                Ok(ev) => self
                    .control_event(io, &ev.name, ev.args.first().copied())
                    .map(Answer::Now)
                    .map_err(ArgError::Api),
                Err(_) => Err(ArgError::Malformed),
            },
            // Events for a namespace the socket has not joined are ignored,
            // as Socket.IO servers do.
            _ => return,
        };
        let body = match result {
            Ok(Answer::Ok) => None,
            Ok(Answer::Now(body)) => Some(body),
            Ok(Answer::Later) => return,
            Err(ArgError::Malformed) => return io.close(conn),
            Err(ArgError::Api(e)) => {
                self.metrics.count_error(e.code);
                Some(e.ack_body())
            }
        };
        let Some(id) = p.id else { return };
        let body = body.as_deref().unwrap_or(OK_BODY);
        self.ack_head.clear();
        socketio::write_header(&mut self.ack_head, Kind::Ack, 0, p.nsp, Some(id));
        io.send_text(conn, &[&self.ack_head, body.as_bytes()]);
    }

    /// A `/` event; `data` is the whole event array, read in one pass.
    fn root_event(
        &mut self,
        io: &mut Io<'_>,
        conn: ConnId,
        name: &str,
        data: &str,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Answer, ArgError> {
        match name {
            "pub" => {
                let p: Pub = event_arg(data)?;
                match self.publish(io, conn, ack_id, &p, attachments)? {
                    true => Ok(Answer::Later),
                    false => Ok(Answer::Ok),
                }
            }
            "sub" => {
                let s: Sub = event_arg(data)?;
                Ok(Answer::Now(self.subscribe(conn, s)?))
            }
            "unsub" => {
                let u: Unsub = event_arg(data)?;
                let sid = u.sid.into_string();
                self.subs.apply(Command::Unsubscribe {
                    conn,
                    sid,
                    after: u.after,
                })?;
                Ok(Answer::Ok)
            }
            "request" => {
                let r: messages::Request = event_arg(data)?;
                Ok(self.request(io, conn, &r, ack_id, attachments)?)
            }
            "ping" => {
                socketio::parse_event(data).map_err(|_| ArgError::Malformed)?;
                Ok(Answer::Ok)
            }
            other => {
                let ev = socketio::parse_event(data).map_err(|_| ArgError::Malformed)?;
                let arg = ev.args.first().copied();
                if let Some(r) = self.streams.event(io, conn, other, arg, ack_id) {
                    return Ok(r?.map_or(Answer::Later, Answer::Now));
                }
                Err(ArgError::Api(ApiError::new(
                    Code::BadRequest,
                    format!("unknown event {other:?}"),
                )))
            }
        }
    }

    fn subscribe(&mut self, conn: ConnId, s: Sub<'_>) -> Result<String, ApiError> {
        let sid = match s.sid {
            Some(v) => v.into_string(),
            None => {
                let subs = &self.subs;
                let session = self.sessions.get_mut(conn).and_then(Option::as_mut);
                match session {
                    Some(sess) => sess.assign_sid(|c| subs.conn_has_sid(conn, c)),
                    None => return Err(ApiError::new(Code::Internal, "no session")),
                }
            }
        };
        let sid_json = serde_json::Value::from(sid.as_str()).to_string();
        let queue = s.queue.map(|q| q.into_owned());
        self.subs.apply(Command::Subscribe {
            conn,
            sid,
            pattern: s.subject.into_owned(),
            queue,
            max: s.max,
        })?;
        Ok(ok_body(&format!("\"sid\":{sid_json}")))
    }

    /// Checks a message's subject, headers and size; returns its size.
    fn check_message(
        &self,
        subject: &str,
        data: &str,
        headers: Option<&RawValue>,
        attachments: &[Vec<u8>],
    ) -> Result<usize, ApiError> {
        subject::validate_subject(subject)
            .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {subject:?}")))?;
        messages::check_headers(headers)?;
        let size = data.len()
            + headers.map_or(0, |h| h.get().len())
            + attachments.iter().map(Vec::len).sum::<usize>();
        if size > self.cfg.max_payload {
            return Err(ApiError::new(
                Code::PayloadTooLarge,
                format!(
                    "payload is {size} bytes, the limit is {}",
                    self.cfg.max_payload
                ),
            ));
        }
        Ok(size)
    }

    /// Delivers a publish; true when a stream captured it and its ack is
    /// held until the message is stored.
    fn publish(
        &mut self,
        io: &mut Io<'_>,
        conn: ConnId,
        ack_id: Option<u64>,
        p: &Pub<'_>,
        attachments: &[Vec<u8>],
    ) -> Result<bool, ApiError> {
        let data = raw_text(p.data);
        let size = self.check_message(&p.subject, data, p.headers, attachments)?;
        if let Some(reply) = &p.reply {
            subject::validate_subject(reply)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("reply: {e}")))?;
        }
        let headers = p.headers.map(RawValue::get).filter(|h| *h != "null");
        let captured = self.streams.captures(&p.subject);
        if let Some(stream) = captured {
            let msg = Incoming {
                subject: &p.subject,
                data,
                headers,
                attachment: super::streams::stream_attachment(data, attachments)?,
            };
            self.streams.publish(stream, conn, ack_id, msg, io.now())?;
        }
        self.metrics.msgs_in += 1;
        self.metrics.bytes_in += size as u64;
        if self.requests.may_be_inbox(&p.subject) {
            if let Some(pending) = self.requests.take(&p.subject) {
                answer_request(io, &pending, &p.subject, data, headers, attachments);
            }
        }
        self.deliver(
            io,
            &p.subject,
            data,
            p.reply.as_deref(),
            headers,
            attachments,
            size,
        );
        Ok(captured.is_some() && ack_id.is_some())
    }

    fn request(
        &mut self,
        io: &mut Io<'_>,
        conn: ConnId,
        r: &messages::Request<'_>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Answer, ApiError> {
        let data = raw_text(r.data);
        let size = self.check_message(&r.subject, data, r.headers, attachments)?;
        self.metrics.requests += 1;
        let no_responders = || {
            ApiError::new(
                Code::NoResponders,
                format!("no subscribers on {:?}", r.subject),
            )
        };
        let inbox = match ack_id {
            // Fire and forget: the request is delivered, and replies to its
            // inbox reach nobody since no ack waits for them.
            None => self.requests.unanswered_inbox(),
            Some(_) if self.subs.matches(&r.subject).is_empty() => return Err(no_responders()),
            Some(ack_id) => {
                let timeout = r
                    .timeout_ms
                    .map_or(REQUEST_TIMEOUT_DEFAULT, Duration::from_millis)
                    .clamp(Duration::from_millis(1), REQUEST_TIMEOUT_MAX);
                self.requests
                    .open(conn, ack_id, io.now() + timeout)
                    .ok_or_else(|| {
                        ApiError::new(Code::Limit, "too many requests waiting on this socket")
                    })?
            }
        };
        self.metrics.msgs_in += 1;
        self.metrics.bytes_in += size as u64;
        let headers = r.headers.map(RawValue::get).filter(|h| *h != "null");
        let sent = self.deliver(
            io,
            &r.subject,
            data,
            Some(&inbox),
            headers,
            attachments,
            size,
        );
        if sent == 0 && ack_id.is_some() {
            // Every match was a connection on its way out.
            self.requests.take(&inbox);
            return Err(no_responders());
        }
        Ok(Answer::Later)
    }

    /// Sends a message to every matching subscription (one member per
    /// load-balanced group); returns the deliveries made.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        io: &mut Io<'_>,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
        size: usize,
    ) -> usize {
        let m = self.subs.matches(subject);
        if m.is_empty() {
            return 0;
        }
        const MSG_HEAD: &[u8] = b"2[\"msg\",{\"sid\":";
        let mut binary_head = Vec::new();
        let head: &[u8] = if attachments.is_empty() {
            MSG_HEAD
        } else {
            socketio::write_header(
                &mut binary_head,
                Kind::BinaryEvent,
                attachments.len(),
                "/",
                None,
            );
            binary_head.extend_from_slice(&MSG_HEAD[1..]);
            &binary_head
        };
        let mut tail = std::mem::take(&mut self.tail);
        tail.clear();
        tail.extend_from_slice(b",\"subject\":");
        push_json_str(&mut tail, subject);
        tail.extend_from_slice(b",\"data\":");
        tail.extend_from_slice(data.as_bytes());
        if let Some(r) = reply {
            tail.extend_from_slice(b",\"reply\":");
            push_json_str(&mut tail, r);
        }
        if let Some(h) = headers {
            tail.extend_from_slice(b",\"headers\":");
            tail.extend_from_slice(h.as_bytes());
        }
        tail.extend_from_slice(b"}]");
        let out = Out {
            head,
            tail: &tail,
            attachments,
        };
        let mut sent = 0;
        for &key in &m.plain {
            sent += usize::from(self.send_to(io, key, &out));
        }
        for g in &m.groups {
            match self.subs.group_mode(&g.queue) {
                GroupMode::Broadcast => {
                    for &key in &g.members {
                        sent += usize::from(self.send_to(io, key, &out));
                    }
                }
                GroupMode::LoadBalance => {
                    let n = g.members.len();
                    let start = self.subs.groups.pick(n);
                    // A member that cannot take it (closing) passes it on.
                    for i in 0..n {
                        if self.send_to(io, g.members[(start + i) % n], &out) {
                            sent += 1;
                            break;
                        }
                    }
                }
            }
        }
        self.metrics.msgs_out += sent as u64;
        self.metrics.bytes_out += (sent * size) as u64;
        self.tail = tail;
        sent
    }

    fn send_to(&mut self, io: &mut Io<'_>, key: SubKey, out: &Out<'_>) -> bool {
        let Some(s) = self.subs.deliverable(key) else {
            return false;
        };
        let conn = s.conn;
        if !io.send_text(conn, &[out.head, s.sid_json.as_bytes(), out.tail]) {
            return false;
        }
        for a in out.attachments {
            io.send_binary(conn, a);
        }
        if let Some(end) = self.subs.delivered(key) {
            // Cannot fail: the subscription exists.
            let _ = self.subs.apply(end);
        }
        true
    }
}

/// The parts of one delivery shared by every subscriber.
struct Out<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    attachments: &'a [Vec<u8>],
}

/// Acks a waiting request with the reply published to its inbox.
fn answer_request(
    io: &mut Io<'_>,
    p: &Pending,
    inbox: &str,
    data: &str,
    headers: Option<&str>,
    attachments: &[Vec<u8>],
) {
    let kind = if attachments.is_empty() {
        Kind::Ack
    } else {
        Kind::BinaryAck
    };
    let mut head = Vec::with_capacity(24);
    socketio::write_header(&mut head, kind, attachments.len(), "/", Some(p.ack_id));
    let mut body = Vec::with_capacity(data.len() + inbox.len() + 48);
    body.extend_from_slice(b"[{\"ok\":true,\"subject\":");
    push_json_str(&mut body, inbox);
    body.extend_from_slice(b",\"data\":");
    body.extend_from_slice(data.as_bytes());
    if let Some(h) = headers {
        body.extend_from_slice(b",\"headers\":");
        body.extend_from_slice(h.as_bytes());
    }
    body.extend_from_slice(b"}]");
    if io.send_text(p.conn, &[&head, &body]) {
        for a in attachments {
            io.send_binary(p.conn, a);
        }
    }
}

/// Appends `s` as a JSON string literal, escaping only when needed.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(serde_json::Value::from(s).to_string().as_bytes());
    }
}

/// Whether a CONNECT payload carries the expected token.
fn auth_token_ok(data: &str, expected: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Auth {
        token: Option<String>,
    }
    let given = serde_json::from_str::<Auth>(data)
        .ok()
        .and_then(|a| a.token)
        .unwrap_or_default();
    token_eq(given.as_bytes(), expected.as_bytes())
}

/// A percent-decoded query parameter (`a=1&token=x%2By`).
fn query_param(query: &str, key: &str) -> Option<String> {
    let raw = query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Keeps a node id usable inside a subject token.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Handler for Broker {
    fn endpoint(&self, path: &str) -> Option<u8> {
        (path == "/socket.io/" || path == "/socket.io").then_some(0)
    }

    fn http(&mut self, io: &mut Io<'_>, req: &Request) -> Response {
        if let Some(r) = self.dashboard_http(io, req) {
            return r;
        }
        let known = matches!(req.path.as_str(), "/healthz" | "/metrics");
        if known && req.method != "GET" && req.method != "HEAD" {
            let mut r = Response::json(405, r#"{"error":"method not allowed"}"#);
            r.headers.push(("Allow".into(), "GET".into()));
            return r;
        }
        match req.path.as_str() {
            "/healthz" => Response::json(200, r#"{"status":"ok"}"#),
            "/metrics" => {
                let uptime = io
                    .now()
                    .saturating_duration_since(self.started)
                    .as_secs_f64();
                let families = self.metric_families();
                let mut body =
                    self.metrics
                        .render_all(io.stats(), self.subs.len(), uptime, &families);
                self.streams.render_metrics(&mut body);
                Response::new(200, "text/plain; version=0.0.4; charset=utf-8", body)
            }
            _ => Response::json(404, r#"{"error":"not found"}"#),
        }
    }

    fn opened(&mut self, io: &mut Io<'_>, conn: ConnId, _endpoint: u8) {
        if self.sessions.len() <= conn {
            self.sessions.resize_with(conn + 1, || None);
        }
        self.sessions[conn] = Some(Session::default());
        io.set_timer(conn, Some(io.now() + self.cfg.connect_timeout));
        if io.eio(conn) == 3 {
            // Socket.IO v4 (Engine.IO v3 clients) joins `/` without a
            // CONNECT and without auth data, so `-auth-token` refuses it.
            if self.cfg.auth_token.is_some() {
                io.send_text(conn, &[br#"4"unauthorized""#]);
                return;
            }
            if let Some(session) = self.session(conn) {
                session.root = true;
            }
            io.send_text(conn, &[b"0"]);
            io.set_timer(conn, None);
        }
    }

    fn message(&mut self, io: &mut Io<'_>, conn: ConnId, payload: Payload<'_>) {
        match payload {
            Payload::Text(t) => self.on_text(io, conn, t),
            Payload::Binary(b) => self.on_binary(io, conn, b),
        }
    }

    fn closed(&mut self, _io: &mut Io<'_>, conn: ConnId) {
        crate::log_debug!("conn {conn} closed");
        self.drop_root_state(conn);
        self.streams.closed(conn);
        if let Some(slot) = self.sessions.get_mut(conn) {
            *slot = None;
        }
    }

    fn timer(&mut self, io: &mut Io<'_>, conn: ConnId) {
        // The connect timeout: no namespace joined in time.
        if self.session(conn).is_some_and(|s| !s.joined_any()) {
            io.close(conn);
        }
    }

    fn tick(&mut self, io: &mut Io<'_>) {
        self.sample_history(io);
        self.streams.tick(io, &mut self.subs);
        if self.requests.is_empty() {
            return;
        }
        for p in self.requests.expired(io.now()) {
            let e = ApiError::new(Code::Timeout, "no reply in time");
            self.metrics.count_error(Code::Timeout);
            let head = socketio::encode(Kind::Ack, 0, "/", Some(p.ack_id), "");
            io.send_text(p.conn, &[&head, e.ack_body().as_bytes()]);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut next = self.history.next_at();
        for d in [self.requests.next_deadline(), self.streams.next_deadline()]
            .into_iter()
            .flatten()
        {
            next = next.min(d);
        }
        Some(next)
    }

    fn shutdown(&mut self, io: &mut Io<'_>) {
        self.shut_down(io);
    }

    fn attach(&mut self, waker: std::sync::Arc<mio::Waker>) {
        self.streams.attach(waker);
    }

    fn woken(&mut self, io: &mut Io<'_>) {
        self.streams.woken(io);
    }
}

#[cfg(test)]
mod tests {
    use super::query_param;

    #[test]
    fn query_params_are_percent_decoded() {
        assert_eq!(query_param("token=abc", "token").as_deref(), Some("abc"));
        assert_eq!(
            query_param("a=1&token=x%2By%20z+w", "token").as_deref(),
            Some("x+y z w")
        );
        assert_eq!(
            query_param("token=%zz%4", "token").as_deref(),
            Some("%zz%4")
        );
        assert_eq!(query_param("tokens=1", "token"), None);
        assert_eq!(query_param("token", "token").as_deref(), Some(""));
    }
}
