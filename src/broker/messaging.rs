//! Core messaging: the [`Messaging`] component owns the request inboxes
//! and their deadlines (`requests.rs`) and the reused buffers a delivery is
//! encoded into, and runs the delivery path: match, one member per
//! load-balanced group, encode once, queue to each subscriber (the part
//! after the sid shared by every queue, written with `writev`), forward
//! batches for other nodes' subscribers. The subscription table and group
//! rules it delivers by belong to the control state (`cluster/fsm.rs`,
//! changed only through its one apply path); the broker lends them, with
//! the sessions, the rights and the cluster glue, for each call in a
//! `Lent`.

use std::time::Instant;

use super::access::Access;
use super::ack::{send_ack, send_ack_with};
use super::cluster::Cluster;
use super::requests::{Pending, Requests, REQUEST_TIMEOUT_DEFAULT};
use super::session::Session;
use crate::cluster::api::PeerMessage;
use crate::port::{ConnId, Shared, Sink};
use crate::protocol::errors::ApiError;
use crate::protocol::socketio::{self, PacketType};
use crate::routing::groups::GroupMode;
use crate::routing::subs::{SubKey, SubTable};

/// What a delivery reads and changes of the other parts, borrowed for one
/// call: the subscriptions (delivered counts, group picks), the sessions
/// and rights (the gate), and in a cluster the forward batches.
pub(crate) struct Lent<'a> {
    pub subs: &'a mut SubTable,
    pub sessions: &'a mut [Option<Session>],
    pub access: &'a Access,
    pub cluster: Option<&'a mut Cluster>,
}

/// Request inboxes and the delivery buffers; see the module doc.
#[derive(Debug)]
pub struct Messaging {
    requests: Requests,
    /// Reused buffer for the shared part of a delivery.
    tail: Vec<u8>,
    /// Reused list of this node's subscriptions a delivery goes to.
    targets: Vec<SubKey>,
}

impl Messaging {
    /// `inbox_prefix` makes this node's request inboxes unique
    /// (`_INBOX.<prefix>.`).
    pub fn new(inbox_prefix: &str) -> Messaging {
        Messaging {
            requests: Requests::new(inbox_prefix),
            tail: Vec::with_capacity(1024),
            targets: Vec::new(),
        }
    }

    /// Opens a request inbox whose answer acks `ack_id` on `conn` until
    /// `deadline`; `None` when the connection has too many open.
    pub fn open_request(&mut self, conn: ConnId, ack_id: u64, deadline: Instant) -> Option<String> {
        self.requests.open(conn, ack_id, deadline)
    }

    /// An inbox for a request nobody waits on.
    pub fn unanswered_inbox(&mut self) -> String {
        self.requests.unanswered_inbox()
    }

    /// Forgets an open request (it reached nobody).
    pub fn cancel_request(&mut self, inbox: &str) {
        self.requests.take(inbox);
    }

    /// Whether `subject` is one of this node's inboxes; if a request waits
    /// on it, the message is its answer, sent as the requester's ack.
    pub fn answer_inbox(
        &mut self,
        sink: &mut dyn Sink,
        subject: &str,
        data: &str,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> bool {
        if !self.requests.may_be_inbox(subject) {
            return false;
        }
        if let Some(pending) = self.requests.take(subject) {
            answer_request(sink, &pending, subject, data, headers, attachments);
        }
        true
    }

    /// A socket left `/`: its waiting requests go.
    pub fn drop_conn(&mut self, conn: ConnId) {
        self.requests.drop_conn(conn);
    }

    /// Answers `timeout` to every request past its deadline; returns how
    /// many.
    pub fn expire_requests(&mut self, sink: &mut dyn Sink) -> usize {
        if self.requests.is_empty() {
            return 0;
        }
        let expired = self.requests.expired(sink.now());
        for p in &expired {
            let e = ApiError::new(crate::protocol::errors::Code::Timeout, "no reply in time");
            send_ack(sink, p.conn, "/", p.ack_id, &e.ack_body());
        }
        expired.len()
    }

    /// The next request deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.requests.next_deadline()
    }

    /// Sends a message to every matching subscription (one member per
    /// load-balanced group); returns the deliveries made. In a cluster,
    /// subscriptions of other nodes are reached through forward batches
    /// (one per node and turn), each counted as one delivery.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver(
        &mut self,
        mut lent: Lent<'_>,
        sink: &mut dyn Sink,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        attachments: &[Vec<u8>],
        until: Option<Instant>,
    ) -> usize {
        let m = lent.subs.matches(subject);
        if m.is_empty() {
            return 0;
        }
        let me = lent.subs.me();
        let cluster = lent.cluster.as_deref();
        // Nodes out of reach get nothing (it would be dropped), so a
        // request whose only responders are there gets no_responders.
        let reachable = |n: u64| cluster.is_some_and(|c| c.reachable(n));
        // Other nodes to forward to: (node, to its plain subscribers,
        // its picked group members).
        let mut remote: RemoteTargets = Vec::new();
        let mut local = std::mem::take(&mut self.targets);
        local.clear();
        for &key in &m.plain {
            match lent.subs.get(key).map(|s| s.owner.node) {
                Some(n) if n == me => local.push(key),
                Some(n) if reachable(n) => mark_plain(&mut remote, n),
                _ => {}
            }
        }
        for g in &m.groups {
            if lent.subs.group_mode(&g.queue) == GroupMode::Broadcast {
                for &key in &g.members {
                    match lent.subs.get(key).map(|s| s.owner.node) {
                        Some(n) if n == me => local.push(key),
                        Some(n) if reachable(n) => mark_plain(&mut remote, n),
                        _ => {}
                    }
                }
            }
        }
        let out_parts = self.encode_delivery(subject, data, reply, headers, None, attachments);
        let tail = std::mem::take(&mut self.tail);
        let out = Out {
            head: &out_parts,
            tail: &tail,
            shared: share(&tail, local.len() + m.groups.len()),
            attachments,
            subject,
            reply,
            until,
        };
        let mut sent = 0;
        for &key in &local {
            sent += usize::from(Self::send_to(&mut lent, sink, key, &out));
        }
        for g in &m.groups {
            if lent.subs.group_mode(&g.queue) == GroupMode::Broadcast {
                continue;
            }
            let n = g.members.len();
            let start = lent.subs.groups.pick(n);
            // A member that cannot take it (closing, or on a node out of
            // reach) passes it on.
            for i in 0..n {
                let key = g.members[(start + i) % n];
                let Some(s) = lent.subs.get(key) else {
                    continue;
                };
                let node = s.owner.node;
                if node == me {
                    if Self::send_to(&mut lent, sink, key, &out) {
                        sent += 1;
                        break;
                    }
                } else if lent.cluster.as_deref().is_some_and(|c| c.reachable(node)) {
                    let pick = (s.owner.conn, s.sid.to_string());
                    match remote.iter_mut().find(|r| r.0 == node) {
                        Some(r) => r.2.push(pick),
                        None => remote.push((node, false, vec![pick])),
                    }
                    break;
                }
            }
        }
        self.tail = tail;
        self.targets = local;
        if !remote.is_empty() {
            if let Some(c) = lent.cluster.as_deref_mut() {
                for (node, plain, picks) in &remote {
                    c.forward_delivery(
                        *node,
                        &PeerMessage {
                            subject,
                            reply,
                            data,
                            headers,
                            extra: None,
                            attachments: attachments.to_vec(),
                            plain: *plain,
                            picks: picks.iter().map(|(c, s)| (*c, s.as_str())).collect(),
                        },
                    );
                }
                sent += remote.len();
            }
        }
        sent
    }

    /// Delivers to the given subscriptions of this node (a message a peer
    /// forwarded); returns the deliveries made.
    pub(crate) fn deliver_to(
        &mut self,
        mut lent: Lent<'_>,
        sink: &mut dyn Sink,
        keys: &[SubKey],
        m: &PeerMessage<'_>,
    ) -> usize {
        let attachments = &m.attachments;
        let head =
            self.encode_delivery(m.subject, m.data, m.reply, m.headers, m.extra, attachments);
        let tail = std::mem::take(&mut self.tail);
        let out = Out {
            head: &head,
            tail: &tail,
            shared: share(&tail, keys.len()),
            attachments,
            subject: m.subject,
            reply: m.reply,
            until: None,
        };
        let mut sent = 0;
        for &key in keys {
            sent += usize::from(Self::send_to(&mut lent, sink, key, &out));
        }
        self.tail = tail;
        sent
    }

    /// Writes the part of a delivery after the subscriber's sid into
    /// `self.tail`; returns the part before it.
    fn encode_delivery(
        &mut self,
        subject: &str,
        data: &str,
        reply: Option<&str>,
        headers: Option<&str>,
        extra: Option<&str>,
        attachments: &[Vec<u8>],
    ) -> std::borrow::Cow<'static, [u8]> {
        const MSG_HEAD: &[u8] = b"2[\"msg\",{\"sid\":";
        let head = if attachments.is_empty() {
            std::borrow::Cow::Borrowed(MSG_HEAD)
        } else {
            let mut binary_head = Vec::new();
            socketio::write_header(
                &mut binary_head,
                PacketType::BinaryEvent,
                attachments.len(),
                "/",
                None,
            );
            binary_head.extend_from_slice(&MSG_HEAD[1..]);
            std::borrow::Cow::Owned(binary_head)
        };
        let tail = &mut self.tail;
        tail.clear();
        tail.extend_from_slice(b",\"subject\":");
        push_json_str(tail, subject);
        tail.extend_from_slice(b",\"data\":");
        tail.extend_from_slice(data.as_bytes());
        if let Some(r) = reply {
            tail.extend_from_slice(b",\"reply\":");
            push_json_str(tail, r);
        }
        if let Some(h) = headers {
            tail.extend_from_slice(b",\"headers\":");
            tail.extend_from_slice(h.as_bytes());
        }
        if let Some(x) = extra {
            tail.push(b',');
            tail.extend_from_slice(x.as_bytes());
        }
        tail.extend_from_slice(b"}]");
        head
    }

    #[inline]
    fn send_to(lent: &mut Lent<'_>, sink: &mut dyn Sink, key: SubKey, out: &Out<'_>) -> bool {
        let Some(s) = lent.subs.target(key) else {
            return false;
        };
        let conn = s.conn;
        // Rights are looked at only while some subscription has cuts, or
        // for a request under a users file (the answer it allows).
        let gated =
            lent.access.cut_sockets > 0 || (out.reply.is_some() && lent.access.users.is_some());
        if gated {
            let now = sink.now();
            let until = out.until.unwrap_or(now + REQUEST_TIMEOUT_DEFAULT);
            let sessions = &mut *lent.sessions;
            if !super::access::gate(sessions, conn, &s.sid, out.subject, out.reply, until, now) {
                return false;
            }
        }
        let queued = match &out.shared {
            Some(tail) => sink.send_text_shared(conn, &[out.head, s.sid_json.as_bytes()], tail),
            None => sink.send_text(conn, &[out.head, s.sid_json.as_bytes(), out.tail]),
        };
        if !queued {
            return false;
        }
        for a in out.attachments {
            sink.send_binary(conn, a);
        }
        if let Some(end) = lent.subs.delivered(key) {
            // Applied (or proposed) at the end of the turn, through the
            // one path; used up, it takes no more deliveries meanwhile.
            lent.subs.ended.push(end);
        }
        true
    }
}

/// Other nodes a delivery goes to: (node, to its plain subscribers, its
/// picked group members as (serial, sid)).
type RemoteTargets = Vec<(u64, bool, Vec<(u64, String)>)>;

/// Notes that `node` gets the message for its plain subscribers.
fn mark_plain(remote: &mut RemoteTargets, node: u64) {
    match remote.iter_mut().find(|r| r.0 == node) {
        Some(r) => r.1 = true,
        None => remote.push((node, true, Vec::new())),
    }
}

/// The parts of one delivery shared by every subscriber.
struct Out<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    /// `tail` as one allocation the subscribers' queues hold by reference,
    /// when it goes to more than one.
    shared: Option<Shared>,
    attachments: &'a [Vec<u8>],
    /// The subject and reply subject, for the rights gate.
    subject: &'a str,
    reply: Option<&'a str>,
    /// Until when the request being delivered may be answered.
    until: Option<Instant>,
}

/// A tail shorter than this is copied to each subscriber: the shared copy
/// costs an allocation per publish and an atomic count per subscriber,
/// which measured no cheaper than copying a 128-byte message to four
/// subscribers (a 2 KiB one took 45 % less broker CPU per delivery
/// shared). A queued reference (32 bytes) is then also small next to the
/// bytes `-max-pending` counts for it.
const SHARE_BYTES_MIN: usize = 512;

/// The shared copy of a delivery's tail for `targets` subscribers, when
/// sharing saves copies (one subscriber, or a short tail, is copied).
pub(super) fn share(tail: &[u8], targets: usize) -> Option<Shared> {
    (targets > 1 && tail.len() >= SHARE_BYTES_MIN).then(|| Shared::from(tail))
}

/// Acks a waiting request with the reply published to its inbox.
fn answer_request(
    sink: &mut dyn Sink,
    p: &Pending,
    inbox: &str,
    data: &str,
    headers: Option<&str>,
    attachments: &[Vec<u8>],
) {
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
    let mut head = Vec::with_capacity(24);
    send_ack_with(sink, &mut head, "/", p.conn, p.ack_id, &body, attachments);
}

/// Appends `s` as a JSON string literal, escaping only when needed.
pub(super) fn push_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(serde_json::Value::from(s).to_string().as_bytes());
    }
}
