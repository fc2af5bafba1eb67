//! The [`Broker`]: the port's `Handler` that turns Socket.IO packets into
//! subscriptions, publishes, requests and acks. It holds the sessions and
//! the parts (messaging, streams, cluster glue, monitor) and lends each
//! what it needs for a call; deliveries are made by `messaging.rs`.

use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::access::Admission;
use super::ack::send_ack_with;
use super::cluster::{ChangeAck, Cluster, ClusterSettings};
use super::events::{self, Route};
use super::messaging::{push_json_str, Lent, Messaging};
use super::monitor::{Monitor, View};
use super::requests::{sanitize, REQUEST_TIMEOUT_DEFAULT, REQUEST_TIMEOUT_MAX};
use super::session::{Session, NSP_CONTROL, NSP_ROOT};
use super::streams::{Incoming, Streams};
use crate::cluster::api::{Cmd, Fsm, Links, PeerMessage, RaftNode};
use crate::crypto::token_eq;
use crate::port::{ConnId, Handler, Payload, Request, Response, Sink};
use crate::protocol::errors::{ok_body, raw_text, ApiError, Code, OK_BODY};
use crate::protocol::messages::{self, event_arg, ArgError, PubArg, Sub, Unsub};
use crate::protocol::socketio::{self, Packet, PacketType};
use crate::protocol::subject;
use crate::routing::subs::{Command, SubKey};

/// Room the open packet's maxPayload leaves above `-max-payload` for the
/// event envelope, so an oversized `data` gets an ack instead of a close.
pub const ENVELOPE_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: String,
    pub control_token: Option<String>,
    pub auth_token: Option<String>,
    /// The secret cluster members share (`-cluster-token`, else
    /// `-control-token`): on `/control` it grants the node-to-node events.
    pub cluster_token: Option<String>,
    pub max_payload: usize,
    pub connect_timeout: Duration,
}

pub struct Broker {
    pub(crate) cfg: BrokerConfig,
    /// The time of the last loop turn (`tick`), which deadlines count from.
    turn: Instant,
    pub(crate) sessions: Vec<Option<Session>>,
    /// The control state: subscriptions, group rules, stream metadata.
    pub(crate) fsm: Fsm,
    /// Request inboxes and the delivery path.
    messaging: Messaging,
    /// Set in cluster mode.
    pub(crate) cluster: Option<Cluster>,
    /// This process's boot id: the high half of every connection serial.
    boot: u64,
    next_serial: u64,
    /// Counters, history, and the HTTP and status answers built on them.
    monitor: Monitor,
    pub(crate) streams: Streams,
    /// Reused buffer for ack headers.
    ack_head: Vec<u8>,
    /// Push deliveries for other nodes' subscribers (cluster mode).
    pub(crate) remote_push: super::stream_out::RemotePush,
    /// Users and their rights on `/` (docs/PROTOCOL.md §11).
    pub(crate) access: super::access::Access,
    /// Consumer cursors last replicated (cluster mode).
    pub(crate) cursor_log: super::stream_cluster::CursorLog,
    /// The replicated streams held here (cluster mode).
    pub(crate) stream_groups: super::stream_groups::StreamGroups,
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
        let rng = crate::rand::random_seed();
        let messaging = Messaging::new(&format!(
            "{}.{:x}",
            sanitize(&cfg.node_id),
            rng & 0xffff_ffff
        ));
        Broker {
            cfg,
            turn: Instant::now(),
            sessions: Vec::new(),
            fsm: Fsm::new(1),
            messaging,
            cluster: None,
            boot: (rng >> 32).max(1) & 0xffff_ffff,
            next_serial: 0,
            monitor: Monitor::new(Instant::now()),
            streams: Streams::default(),
            ack_head: Vec::with_capacity(32),
            cursor_log: Default::default(),
            stream_groups: Default::default(),
            remote_push: Default::default(),
            access: Default::default(),
            rng,
        }
    }

    /// Opens the streams under `<data>/streams` (recovering what is there)
    /// with the given fsync policy. Until this succeeds, stream events are
    /// refused with `unavailable`.
    pub fn open_streams(
        &mut self,
        data: &std::path::Path,
        policy: crate::storage::sync::SyncPolicy,
        segment_bytes: u64,
    ) -> Result<(), String> {
        self.streams = Streams::open(data, policy, segment_bytes)?;
        Ok(())
    }

    /// Makes this broker node `settings.raft.id` of a cluster. It serves
    /// once it has its Raft thread and peer links
    /// ([`Broker::run_cluster_with`]).
    pub fn enable_cluster(&mut self, settings: ClusterSettings) {
        self.fsm = Fsm::new(settings.raft.id);
        self.cluster = Some(Cluster::new(settings, self.boot));
    }

    /// Hands a cluster node its Raft thread and peer links: those
    /// [`start_threads`](super::cluster::start_threads) started, or
    /// detached handles an in-process test plays. Nothing without
    /// [`Broker::enable_cluster`].
    pub fn run_cluster_with(&mut self, raft: RaftNode, links: Links) {
        if let Some(c) = self.cluster.as_mut() {
            c.run_with(raft, links);
        }
    }

    /// What the monitor reads of the other parts, for one call.
    pub(crate) fn view(&self) -> View<'_> {
        View {
            node_id: &self.cfg.node_id,
            control_token: self.cfg.control_token.as_deref(),
            fsm: &self.fsm,
            streams: &self.streams,
            cluster: self.cluster.as_ref(),
            access: &self.access,
        }
    }

    /// `server.info`'s answer.
    pub(crate) fn server_info(&self, sink: &dyn Sink) -> serde_json::Value {
        self.monitor.server_info(&self.view(), sink)
    }

    /// Counts a refusal with `code` (the `errors` of `/metrics`).
    pub(crate) fn count_error(&mut self, code: Code) {
        self.monitor.count_error(code);
    }

    fn session(&mut self, conn: ConnId) -> Option<&mut Session> {
        self.sessions.get_mut(conn)?.as_mut()
    }

    fn random_id(&mut self) -> String {
        format!("{:016x}", crate::rand::splitmix64(&mut self.rng))
    }

    fn on_text(&mut self, sink: &mut dyn Sink, conn: ConnId, text: &str) {
        let Some(session) = self.session(conn) else {
            return;
        };
        if session.attachments.pending() {
            // Text while attachments are awaited breaks the packet format.
            return sink.close(conn);
        }
        let packet = match socketio::decode(text) {
            Ok(p) => p,
            Err(_) => return sink.close(conn),
        };
        if packet.kind.is_binary() && packet.attachments > 0 {
            session.attachments.start(text, packet.attachments);
            return;
        }
        self.on_packet(sink, conn, &packet, &[]);
    }

    fn on_binary(&mut self, sink: &mut dyn Sink, conn: ConnId, bytes: &[u8]) {
        let bytes_max = self.cfg.max_payload + ENVELOPE_BYTES;
        let Some(session) = self.session(conn) else {
            return;
        };
        match session.attachments.push(bytes, bytes_max) {
            Ok(None) => {}
            Ok(Some((text, parts))) => match socketio::decode(&text) {
                Ok(packet) => self.on_packet(sink, conn, &packet, &parts),
                Err(_) => sink.close(conn),
            },
            Err(_) => sink.close(conn),
        }
    }

    fn on_packet(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        p: &Packet<'_>,
        attachments: &[Vec<u8>],
    ) {
        match p.kind {
            PacketType::Connect => self.connect(sink, conn, p),
            PacketType::Disconnect => self.leave(sink, conn, p.nsp),
            PacketType::Event | PacketType::BinaryEvent => self.event(sink, conn, p, attachments),
            // The broker asks clients for no acks; stray ones are ignored.
            PacketType::Ack | PacketType::BinaryAck => {}
            PacketType::ConnectError => sink.close(conn),
        }
    }

    fn connect(&mut self, sink: &mut dyn Sink, conn: ConnId, p: &Packet<'_>) {
        // Engine.IO v3 clients (Socket.IO v4) send their auth as a query
        // on the namespace: `0/control?token=…,`.
        let legacy_query = match p.nsp.split_once('?') {
            Some((nsp, query)) if sink.eio(conn) == 3 => Some((nsp, query)),
            _ => None,
        };
        let p = &Packet {
            nsp: legacy_query.map_or(p.nsp, |(nsp, _)| nsp),
            ..*p
        };
        let (token, cluster) = match p.nsp {
            NSP_ROOT => (self.cfg.auth_token.clone(), None),
            NSP_CONTROL => (
                self.cfg.control_token.clone(),
                self.cfg.cluster_token.clone(),
            ),
            other => {
                let body = br#"{"message":"Invalid namespace"}"#;
                let head = socketio::encode(PacketType::ConnectError, 0, other, None, "");
                sink.send_text(conn, &[&head, body]);
                return;
            }
        };
        let given = || match legacy_query {
            Some((_, query)) => query_param(query, "token").unwrap_or_default(),
            None => auth_token(p.data),
        };
        let holds = |expected: &Option<String>| {
            expected
                .as_ref()
                .is_none_or(|e| token_eq(given().as_bytes(), e.as_bytes()))
        };
        // On /control the cluster token also admits (a peer node's link),
        // and only it grants the node-to-node events.
        let peer = p.nsp == NSP_CONTROL && holds(&cluster);
        let mut rights = None;
        let admitted = if p.nsp == NSP_ROOT {
            match self.admit_root(&given()) {
                Admission::Refused => false,
                Admission::All => true,
                Admission::User(r) => {
                    rights = Some(r);
                    true
                }
            }
        } else {
            holds(&token) || (peer && cluster.is_some())
        };
        if !admitted {
            let head = socketio::encode(PacketType::ConnectError, 0, p.nsp, None, "");
            sink.send_text(conn, &[&head, br#"{"message":"unauthorized"}"#]);
            return;
        }
        // A node waiting to be added, or removed, serves no clients: they
        // belong on a member (docs/PROTOCOL.md, "Membership changes").
        let idle = self.cluster.as_ref().and_then(|c| c.not_serving());
        if let (NSP_ROOT, Some(why)) = (p.nsp, idle) {
            let head = socketio::encode(PacketType::ConnectError, 0, p.nsp, None, "");
            let body = format!(r#"{{"message":"unavailable: this node is {why}"}}"#);
            sink.send_text(conn, &[&head, body.as_bytes()]);
            return;
        }
        let id = self.random_id();
        let Some(session) = self.session(conn) else {
            return;
        };
        if p.nsp == NSP_ROOT {
            let again = std::mem::replace(&mut session.root, true);
            if again {
                // A CONNECT to `/` on a socket already in it replaces the
                // socket: everything the old one held goes first, exactly
                // as when it leaves (docs/PROTOCOL.md §2).
                crate::log_debug!("conn {conn} joined / again: replacing its socket");
                self.end_root_socket(sink, conn);
            }
            self.join_root(conn);
            if let Some(s) = self.session(conn) {
                s.rights = rights;
            }
        } else {
            session.control = true;
            session.peer = peer;
        }
        crate::log_debug!("conn {conn} joined {}", p.nsp);
        let body = format!("{{\"sid\":\"{id}\"}}");
        let head = socketio::encode(PacketType::Connect, 0, p.nsp, None, "");
        sink.send_text(conn, &[&head, body.as_bytes()]);
        sink.set_timer(conn, None);
    }

    fn leave(&mut self, sink: &mut dyn Sink, conn: ConnId, nsp: &str) {
        let Some(session) = self.session(conn) else {
            return;
        };
        match nsp {
            NSP_ROOT if session.root => {
                session.root = false;
                self.end_root_socket(sink, conn);
            }
            NSP_CONTROL => session.control = false,
            _ => {}
        }
    }

    /// Gives a socket that joined `/` a fresh serial.
    fn join_root(&mut self, conn: ConnId) {
        self.next_serial += 1;
        let serial = (self.boot << 32) | (self.next_serial & 0xffff_ffff);
        if let Some(s) = self.session(conn) {
            s.serial = serial;
        }
        self.fsm.subs.attach_local(serial, conn);
    }

    /// The owner this socket's subscriptions are made under.
    pub(super) fn owner(&self, conn: ConnId) -> Option<crate::routing::subs::Owner> {
        let serial = self.sessions.get(conn)?.as_ref()?.serial;
        (serial != 0).then(|| self.fsm.subs.local_owner(serial))
    }

    /// Ends this connection's socket in `/` (it left, closed, or joined
    /// again): its waiting requests, stream acks and fetches, relayed
    /// answers and subscriptions go, so nothing meant for it can reach a
    /// later socket on the same connection or slot.
    fn end_root_socket(&mut self, sink: &mut dyn Sink, conn: ConnId) {
        self.end_rights(conn);
        self.messaging.drop_conn(conn);
        self.streams.closed(conn);
        if let Some(c) = self.cluster.as_mut() {
            c.forget_root(conn);
        }
        let Some(owner) = self.owner(conn) else {
            return;
        };
        let subscribed = self.session(conn).is_some_and(|s| {
            s.serial = 0;
            std::mem::take(&mut s.subscribed)
        });
        self.fsm.subs.detach_local(owner.conn);
        if subscribed || self.fsm.subs.has_owner(owner) {
            self.submit_internal(sink, Cmd::Subs(Command::RemoveConn { owner }));
        }
    }

    fn event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        p: &Packet<'_>,
        attachments: &[Vec<u8>],
    ) {
        let Some(name) = socketio::event_name(p.data) else {
            return sink.close(conn);
        };
        if p.attachments > 0 && !socketio::placeholders_valid(p.data, p.attachments) {
            return sink.close(conn);
        }
        let Some(session) = self.session(conn) else {
            return;
        };
        let (root, control) = (session.root, session.control);
        let result = match p.nsp {
            NSP_ROOT if root => self.root_event(sink, conn, &name, p.data, p.id, attachments),
            NSP_CONTROL if control => match socketio::parse_event(p.data) {
                Ok(ev) => self
                    .control_event(
                        sink,
                        conn,
                        p.id,
                        &ev.name,
                        ev.args.first().copied(),
                        attachments,
                    )
                    .map(|b| b.map_or(Answer::Later, Answer::Now))
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
            Err(ArgError::Malformed) => return sink.close(conn),
            Err(ArgError::Api(e)) => {
                self.monitor.count_error(e.code);
                Some(e.ack_body())
            }
        };
        let Some(id) = p.id else { return };
        let body = body.as_deref().unwrap_or(OK_BODY);
        let head = &mut self.ack_head;
        send_ack_with(sink, head, p.nsp, conn, id, body.as_bytes(), &[]);
    }

    /// A `/` event; `data` is the whole event array, read in one pass.
    fn root_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        name: &str,
        data: &str,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Answer, ArgError> {
        let route = events::find(NSP_ROOT, name).map(|e| e.route);
        match route {
            Some(Route::Pub) => {
                let p = messages::read_pub(data)?;
                match self.publish(sink, conn, ack_id, &p, attachments)? {
                    true => Ok(Answer::Later),
                    false => Ok(Answer::Ok),
                }
            }
            Some(Route::Sub) => {
                let s: Sub = event_arg(data)?;
                Ok(self.subscribe(sink, conn, ack_id, s)?)
            }
            Some(Route::Unsub) => {
                let u: Unsub = event_arg(data)?;
                let sid = u.sid.into_string();
                let owner = self.owner(conn).ok_or_else(no_session)?;
                if self.streams.unwatch(conn, &sid) {
                    return Ok(Answer::Ok);
                }
                if !self.fsm.subs.conn_has_sid(owner, &sid) {
                    return Err(ArgError::Api(ApiError::new(
                        Code::NotFound,
                        format!("no subscription with sid {sid:?}"),
                    )));
                }
                let cmd = Cmd::Subs(Command::Unsubscribe {
                    owner,
                    sid,
                    after: u.after,
                });
                let reply = ack_id.map(|ack_id| ChangeAck {
                    conn,
                    nsp: NSP_ROOT,
                    ack_id,
                    ok_body: OK_BODY.to_string(),
                });
                Ok(self
                    .submit(sink, cmd, reply)?
                    .map_or(Answer::Later, Answer::Now))
            }
            Some(Route::Request) => {
                let r: messages::Request = event_arg(data)?;
                Ok(self.request(sink, conn, &r, ack_id, attachments)?)
            }
            Some(Route::Ping) => {
                socketio::parse_event(data).map_err(|_| ArgError::Malformed)?;
                Ok(Answer::Ok)
            }
            Some(Route::Kv(op)) => {
                let ev = socketio::parse_event(data).map_err(|_| ArgError::Malformed)?;
                let arg = ev.args.first().copied();
                let r = self.kv_event(sink, conn, op, name, arg, ack_id, attachments)?;
                Ok(r.map_or(Answer::Later, Answer::Now))
            }
            other => {
                let ev = socketio::parse_event(data).map_err(|_| ArgError::Malformed)?;
                let arg = ev.args.first().copied();
                let Some(Route::Stream(op)) = other else {
                    return Err(ArgError::Api(events::unknown(NSP_ROOT, name)));
                };
                check_not_a_bucket(op, arg)?;
                self.check_stream(conn, name, arg)?;
                if let Some(r) =
                    self.clustered_stream_event(sink, conn, op, name, arg, ack_id, attachments)
                {
                    let r = match r? {
                        Some(body) if name == "stream.list" => {
                            Some(self.filter_stream_list(conn, body))
                        }
                        r => r,
                    };
                    return Ok(r.map_or(Answer::Later, Answer::Now));
                }
                let r = match self.streams.event(sink, conn, op, name, arg, ack_id)? {
                    Some(body) if name == "stream.list" => {
                        Some(self.filter_stream_list(conn, body))
                    }
                    r => r,
                };
                Ok(r.map_or(Answer::Later, Answer::Now))
            }
        }
    }

    fn subscribe(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        s: Sub<'_>,
    ) -> Result<Answer, ApiError> {
        let owner = self.owner(conn).ok_or_else(no_session)?;
        let sid = match s.sid {
            Some(v) => v.into_string(),
            None => {
                let subs = &self.fsm.subs;
                let session = self.sessions.get_mut(conn).and_then(Option::as_mut);
                match session {
                    Some(sess) => sess.assign_sid(|c| subs.conn_has_sid(owner, c)),
                    None => return Err(no_session()),
                }
            }
        };
        let sid_json = serde_json::Value::from(sid.as_str()).to_string();
        let queue = s.queue.map(|q| q.into_owned());
        let pattern = s.subject.into_owned();
        // Refusals need no consensus round.
        self.fsm
            .subs
            .check_subscribe(owner, &sid, &pattern, queue.as_deref())?;
        self.check_subscribe(conn, &sid, &pattern)?;
        if let Some(s) = self.session(conn) {
            s.subscribed = true;
        }
        let cmd = Cmd::Subs(Command::Subscribe {
            owner,
            sid,
            pattern,
            queue,
            max: s.max,
        });
        let reply = ack_id.map(|ack_id| ChangeAck {
            conn,
            nsp: NSP_ROOT,
            ack_id,
            ok_body: ok_body(&format!("\"sid\":{sid_json}")),
        });
        Ok(self
            .submit(sink, cmd, reply)?
            .map_or(Answer::Later, Answer::Now))
    }

    /// Checks a message's subject, headers and size; returns its size.
    fn check_message(
        &self,
        subject: &str,
        data: &str,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> Result<usize, ApiError> {
        subject::validate_subject(subject)
            .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {subject:?}")))?;
        messages::check_headers_text(headers)?;
        let size = data.len()
            + headers.map_or(0, str::len)
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
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        p: &PubArg<'_>,
        attachments: &[Vec<u8>],
    ) -> Result<bool, ApiError> {
        let data = p.data.unwrap_or("null");
        let size = self.check_message(&p.subject, data, p.headers, attachments)?;
        if let Some(reply) = &p.reply {
            subject::validate_subject(reply)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("reply: {e}")))?;
        }
        self.check_publish(conn, "publish to", &p.subject, sink.now())?;
        self.publish_checked(sink, conn, ack_id, p, attachments, size, false)
    }

    /// [`Broker::publish`] once the publish was checked (`size` is its
    /// payload's); with `revision`, a stream of this node acks it as a
    /// bucket write, `{ok, revision}`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish_checked(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        p: &PubArg<'_>,
        attachments: &[Vec<u8>],
        size: usize,
        revision: bool,
    ) -> Result<bool, ApiError> {
        let data = p.data.unwrap_or("null");
        let headers = p.headers.filter(|h| *h != "null");
        let mut captured = self.streams.captures(&p.subject);
        if captured.is_none() {
            // A replicated stream's leader takes it into the turn's entry;
            // another node relays it there.
            let held = self.replicated_publish(
                conn,
                ack_id,
                &p.subject,
                data,
                p.reply.as_deref(),
                headers,
                attachments,
            );
            match held {
                Some(Ok(true)) => captured = Some(u64::MAX),
                Some(Ok(false)) => {
                    self.monitor.count_in(size);
                    return Ok(ack_id.is_some());
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        if captured.is_none() {
            let fsm = &self.fsm;
            let owner = self
                .cluster
                .as_mut()
                .and_then(|c| c.remote_capture(fsm, &p.subject));
            if let Some(owner) = owner {
                // Another node's stream captures it: that node stores and
                // delivers it, and its answer is this publish's ack.
                self.monitor.count_in(size);
                let arg = pub_arg(&p.subject, data, p.reply.as_deref(), headers);
                self.relay(
                    owner,
                    None,
                    conn,
                    ack_id,
                    "pub",
                    arg,
                    attachments.to_vec(),
                    super::cluster::PROPOSE_WAIT,
                )?;
                return Ok(ack_id.is_some());
            }
        }
        if let Some(stream) = captured.filter(|&s| s != u64::MAX) {
            let msg = Incoming {
                subject: &p.subject,
                data,
                headers,
                attachment: super::streams::stream_attachment(data, attachments)?,
            };
            self.streams
                .publish(stream, conn, ack_id, msg, sink.now(), revision)?;
        }
        self.monitor.count_in(size);
        let inbox = self
            .messaging
            .answer_inbox(sink, &p.subject, data, headers, attachments);
        if let Some(c) = self.cluster.as_mut().filter(|_| !inbox) {
            // A reply to a request made on another node goes straight there.
            if let Some(node) = c.inbox_node(&p.subject) {
                c.queue_forward(
                    node,
                    &PeerMessage {
                        subject: &p.subject,
                        reply: p.reply.as_deref(),
                        data,
                        headers,
                        extra: None,
                        attachments: attachments.to_vec(),
                        plain: false,
                        picks: Vec::new(),
                    },
                );
            }
        }
        self.deliver(
            sink,
            &p.subject,
            data,
            p.reply.as_deref(),
            headers,
            attachments,
            size,
            None,
        );
        Ok(captured.is_some() && ack_id.is_some())
    }

    fn request(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        r: &messages::Request<'_>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Result<Answer, ApiError> {
        let data = raw_text(r.data);
        let headers = r.headers.map(RawValue::get);
        let size = self.check_message(&r.subject, data, headers, attachments)?;
        self.check_publish(conn, "request", &r.subject, sink.now())?;
        self.monitor.count_request();
        let no_responders = || {
            ApiError::new(
                Code::NoResponders,
                format!("no subscribers on {:?}", r.subject),
            )
        };
        let mut until = sink.now() + REQUEST_TIMEOUT_DEFAULT;
        let inbox = match ack_id {
            // Fire and forget: the request is delivered, and replies to its
            // inbox reach nobody since no ack waits for them.
            None => self.messaging.unanswered_inbox(),
            Some(_) if self.fsm.subs.matches(&r.subject).is_empty() => return Err(no_responders()),
            Some(ack_id) => {
                let timeout = r
                    .timeout_ms
                    .map_or(REQUEST_TIMEOUT_DEFAULT, Duration::from_millis)
                    .clamp(Duration::from_millis(1), REQUEST_TIMEOUT_MAX);
                until = sink.now() + timeout;
                self.messaging
                    .open_request(conn, ack_id, sink.now() + timeout)
                    .ok_or_else(|| {
                        ApiError::new(Code::Limit, "too many requests waiting on this socket")
                    })?
            }
        };
        self.monitor.count_in(size);
        let headers = headers.filter(|h| *h != "null");
        let sent = self.deliver(
            sink,
            &r.subject,
            data,
            Some(&inbox),
            headers,
            attachments,
            size,
            Some(until),
        );
        if sent == 0 && ack_id.is_some() {
            // Every match was a connection on its way out.
            self.messaging.cancel_request(&inbox);
            return Err(no_responders());
        }
        Ok(Answer::Later)
    }

    /// Sends a message to every matching subscription (see
    /// [`Messaging::deliver`]) and counts the deliveries; `until` is how
    /// long a request being delivered may be answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &mut self,
        sink: &mut dyn Sink,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
        size: usize,
        until: Option<Instant>,
    ) -> usize {
        let lent = Lent {
            subs: &mut self.fsm.subs,
            sessions: &mut self.sessions,
            access: &self.access,
            cluster: self.cluster.as_mut(),
        };
        let sent = self.messaging.deliver(
            lent,
            sink,
            subject,
            data,
            reply,
            headers,
            attachments,
            until,
        );
        self.monitor.count_out(sent, size);
        sent
    }

    /// Delivers to the given subscriptions of this node (a message a peer
    /// forwarded) and counts the deliveries.
    pub(crate) fn deliver_to(
        &mut self,
        sink: &mut dyn Sink,
        keys: &[SubKey],
        m: &PeerMessage<'_>,
        size: usize,
    ) -> usize {
        let lent = Lent {
            subs: &mut self.fsm.subs,
            sessions: &mut self.sessions,
            access: &self.access,
            cluster: self.cluster.as_mut(),
        };
        let sent = self.messaging.deliver_to(lent, sink, keys, m);
        self.monitor.count_out(sent, size);
        sent
    }

    /// If `subject` is one of this node's inboxes, answers the request
    /// waiting on it (if any) with the message; returns whether it is one.
    pub(crate) fn answer_inbox(
        &mut self,
        sink: &mut dyn Sink,
        subject: &str,
        data: &str,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> bool {
        self.messaging
            .answer_inbox(sink, subject, data, headers, attachments)
    }
}

/// A `pub` event's argument as JSON text, from its parts.
pub(crate) fn pub_arg(
    subject: &str,
    data: &str,
    reply: Option<&str>,
    headers: Option<&str>,
) -> String {
    let mut out = Vec::with_capacity(data.len() + subject.len() + 48);
    out.extend_from_slice(b"{\"subject\":");
    push_json_str(&mut out, subject);
    out.extend_from_slice(b",\"data\":");
    out.extend_from_slice(data.as_bytes());
    if let Some(r) = reply {
        out.extend_from_slice(b",\"reply\":");
        push_json_str(&mut out, r);
    }
    if let Some(h) = headers {
        out.extend_from_slice(b",\"headers\":");
        out.extend_from_slice(h.as_bytes());
    }
    out.push(b'}');
    String::from_utf8(out).unwrap_or_default()
}

fn no_session() -> ApiError {
    ApiError::new(Code::Internal, "this socket has not joined /")
}

/// The token a CONNECT payload carries (empty if none).
fn auth_token(data: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Auth {
        token: Option<String>,
    }
    serde_json::from_str::<Auth>(data)
        .ok()
        .and_then(|a| a.token)
        .unwrap_or_default()
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

/// Stream events other than `stream.info`, `.list` and `.get` are refused
/// on a bucket's stream: the bucket events own it (docs/PROTOCOL.md §14).
fn check_not_a_bucket(op: events::StreamOp, arg: Option<&RawValue>) -> Result<(), ApiError> {
    use events::StreamOp::*;
    if matches!(op, StreamInfo | StreamList | StreamGet) {
        return Ok(());
    }
    let Some(field) = op.names_stream_by() else {
        return Ok(());
    };
    let name = arg
        .and_then(|a| serde_json::from_str::<serde_json::Value>(a.get()).ok())
        .and_then(|v| v.get(field)?.as_str().map(str::to_string));
    match name
        .as_deref()
        .and_then(crate::protocol::kv_messages::bucket_of_stream)
    {
        Some(b) => Err(ApiError::new(
            Code::BadRequest,
            format!("stream \"KV_{b}\" holds bucket {b:?}: use the kv events"),
        )),
        None => Ok(()),
    }
}

impl Handler for Broker {
    fn endpoint(&self, path: &str) -> Option<u8> {
        (path == "/socket.io/" || path == "/socket.io").then_some(0)
    }

    fn http(&mut self, sink: &mut dyn Sink, req: &Request) -> Response {
        self.monitor.http(&self.view(), sink, req)
    }

    fn opened(&mut self, sink: &mut dyn Sink, conn: ConnId, _endpoint: u8) {
        if self.sessions.len() <= conn {
            self.sessions.resize_with(conn + 1, || None);
        }
        self.sessions[conn] = Some(Session::default());
        sink.set_timer(conn, Some(sink.now() + self.cfg.connect_timeout));
        if sink.eio(conn) == 3 {
            // Socket.IO v4 (Engine.IO v3 clients) joins `/` without a
            // CONNECT, so its token can only come in the handshake query
            // (socket.io-client 2.x `query: {token}`).
            let given = sink
                .legacy_token(conn)
                .map(|t| query_param(&format!("token={t}"), "token").unwrap_or_default())
                .unwrap_or_default();
            let rights = match self.admit_root(&given) {
                Admission::Refused => {
                    sink.send_text(conn, &[br#"4"unauthorized""#]);
                    return;
                }
                Admission::All => None,
                Admission::User(r) => Some(r),
            };
            if let Some(session) = self.session(conn) {
                session.root = true;
                session.rights = rights;
            }
            self.join_root(conn);
            sink.send_text(conn, &[b"0"]);
            sink.set_timer(conn, None);
        }
    }

    fn message(&mut self, sink: &mut dyn Sink, conn: ConnId, payload: Payload<'_>) {
        match payload {
            Payload::Text(t) => self.on_text(sink, conn, t),
            Payload::Binary(b) => self.on_binary(sink, conn, b),
        }
    }

    fn closed(&mut self, sink: &mut dyn Sink, conn: ConnId) {
        crate::log_debug!("conn {conn} closed");
        self.end_root_socket(sink, conn);
        if let Some(c) = self.cluster.as_mut() {
            c.forget_conn(conn);
        }
        self.stream_groups.forget_conn(conn);
        if let Some(slot) = self.sessions.get_mut(conn) {
            *slot = None;
        }
    }

    fn timer(&mut self, sink: &mut dyn Sink, conn: ConnId) {
        // The connect timeout: no namespace joined in time.
        if self.session(conn).is_some_and(|s| !s.joined_any()) {
            sink.close(conn);
        }
    }

    fn tick(&mut self, sink: &mut dyn Sink) {
        self.turn = sink.now();
        self.monitor.sample(sink.now());
        if let Some(c) = &self.cluster {
            self.remote_push.reachable.clear();
            self.remote_push
                .reachable
                .extend(c.node_ids().filter(|&n| n != c.me() && c.reachable(n)));
        }
        self.streams
            .tick(sink, &mut self.fsm.subs, &mut self.remote_push);
        self.forward_pushes();
        self.cluster_tick(sink);
        self.replicate_cursors(sink);
        self.flush_stream_groups(sink);
        self.serve_kv_watches(sink);
        for _ in 0..self.messaging.expire_requests(sink) {
            self.monitor.count_error(Code::Timeout);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut next = self.monitor.next_sample();
        for d in [self.messaging.next_deadline(), self.streams.next_deadline()]
            .into_iter()
            .flatten()
        {
            next = next.min(d);
        }
        if self.cluster.is_some() {
            // Retries, expiries and the watch on peers run every 50 ms.
            next = next.min(self.turn + Duration::from_millis(50));
        }
        Some(next)
    }

    fn shutdown(&mut self, sink: &mut dyn Sink) {
        self.shut_down(sink);
    }

    fn attach(&mut self, waker: std::sync::Arc<mio::Waker>) -> Result<(), String> {
        self.streams.attach(waker);
        // Without its Raft group the node cannot serve as a member.
        if self.cluster.as_ref().is_some_and(|c| !c.running()) {
            return Err(
                "cluster mode: its Raft thread and peer links were not handed to \
                        the broker (run_cluster_with)"
                    .into(),
            );
        }
        Ok(())
    }

    fn after_output(&mut self) {
        for h in self.stream_groups.held.values_mut() {
            h.core.replica.flush();
        }
    }

    fn woken(&mut self, sink: &mut dyn Sink) {
        self.reload_if_asked(sink);
        self.streams.woken(sink);
        self.cluster_woken(sink);
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
