//! How stream messages leave the broker: push deliveries to the
//! subscribers of a consumer's `deliver_subject`, the messages of a
//! `consumer.fetch` answer, and the JSON views of streams, consumers and
//! stored messages that the stream events answer with. Binary `data`
//! leaves as a Socket.IO placeholder in the JSON and its bytes as an
//! attachment (BINARY_EVENT / BINARY_ACK).

use std::rc::Rc;
use std::time::Instant;

use serde_json::{json, Value};

use super::streams::open::{
    after_events, ConsumerSummary, OpenStream, FETCH_BYTES_MAX, PUSH_PER_TURN_MAX,
};
use crate::port::Sink;
use crate::protocol::stream_messages::AckPolicy;
use crate::routing::groups::GroupMode;
use crate::routing::subs::SubTable;
use crate::stream::stream::{Msg, Stream};

/// In a cluster: the nodes push deliveries can reach now, and the
/// deliveries for subscribers on them, handed to the broker to forward.
#[derive(Debug, Default)]
pub struct RemotePush {
    /// Other nodes whose peer link is up.
    pub reachable: Vec<u64>,
    pub out: Vec<PushOut>,
}

/// One push delivery for a subscription on another node.
#[derive(Debug)]
pub struct PushOut {
    pub node: u64,
    /// The subscription: its owner's connection serial and sid.
    pub pick: (u64, String),
    pub subject: String,
    /// `data` as JSON text (a placeholder when binary).
    pub data: String,
    pub headers: Option<String>,
    pub attachments: Vec<Vec<u8>>,
    /// `"stream":…,"consumer":…,"seq":…,"delivered":…`
    pub extra: String,
}

/// Where one push delivery goes.
enum Target {
    Local(u64),
    /// A subscription of another node: (node, serial, sid).
    Remote(u64, u64, String),
}

impl RemotePush {
    /// Whether subscription `key` can take a push now: here, or on a
    /// reachable node.
    fn live(&self, subs: &SubTable, key: u64) -> bool {
        match subs.get(key) {
            Some(s) if s.owner.node == subs.me() => subs.deliverable(key).is_some(),
            Some(s) => self.reachable.contains(&s.owner.node),
            None => false,
        }
    }

    fn target(&self, subs: &SubTable, key: u64) -> Option<Target> {
        let s = subs.get(key)?;
        if s.owner.node == subs.me() {
            return Some(Target::Local(key));
        }
        self.reachable
            .contains(&s.owner.node)
            .then(|| Target::Remote(s.owner.node, s.owner.conn, s.sid.to_string()))
    }
}

/// Push deliveries of one stream's push consumers; true if one of them
/// stopped at its per-turn cap with more to send.
pub(super) fn push_slot(
    sink: &mut dyn Sink,
    subs: &mut SubTable,
    remote: &mut RemotePush,
    slot: &mut OpenStream,
    now: Instant,
    pick: &mut usize,
) -> bool {
    let last_seq = slot.stream.last_seq();
    let any =
        slot.stream.consumers.values().any(|m| {
            m.consumer.cfg.deliver_subject.is_some() && m.consumer.may_have_work(last_seq)
        });
    if !any {
        return false;
    }
    let names: Vec<String> = slot
        .stream
        .consumers
        .iter()
        .filter(|(_, m)| {
            m.consumer.cfg.deliver_subject.is_some() && m.consumer.may_have_work(last_seq)
        })
        .map(|(n, _)| n.clone())
        .collect();
    let mut more = false;
    for name in names {
        more |= push_one(sink, subs, remote, slot, &name, now, pick);
    }
    more
}

#[allow(clippy::too_many_arguments)]
pub(super) fn push_one(
    sink: &mut dyn Sink,
    subs: &mut SubTable,
    remote: &mut RemotePush,
    slot: &mut OpenStream,
    name: &str,
    now: Instant,
    pick: &mut usize,
) -> bool {
    let stream_name = Rc::clone(&slot.name);
    let Some((msgs, member)) = slot.stream.split(name) else {
        return false;
    };
    let Some(subject) = member.consumer.cfg.deliver_subject.clone() else {
        return false;
    };
    let group = member.consumer.cfg.deliver_group.clone();
    let none = member.consumer.cfg.ack_policy == AckPolicy::None;
    let mut events = Vec::new();
    let mut done = Vec::new();
    let mut sent = 0;
    let mut tail = Vec::new();
    while sent < PUSH_PER_TURN_MAX {
        if !has_targets(subs, remote, &subject, group.as_deref()) {
            break;
        }
        let Some(d) = member.consumer.next(now, &msgs, &mut events) else {
            break;
        };
        let targets = push_targets(subs, remote, &subject, group.as_deref(), pick);
        let Ok(Some(m)) = msgs.get(d.seq) else {
            continue;
        };
        let to = Push {
            stream: &stream_name,
            consumer: name,
            seq: d.seq,
            delivered: d.deliveries,
        };
        send_push(sink, subs, remote, targets, &to, &m, &mut tail);
        if none {
            done.push(d.seq);
        }
        sent += 1;
    }
    let more = sent == PUSH_PER_TURN_MAX;
    if !events.is_empty() || !done.is_empty() {
        after_events(slot, name, &events, &done);
        slot.touched = true;
    }
    more
}

/// One push delivery: whose message and its counts.
pub(super) struct Push<'a> {
    pub stream: &'a str,
    pub consumer: &'a str,
    pub seq: u64,
    pub delivered: u64,
}

/// Sends message `m` as push delivery `to` to `targets`; `tail` is a
/// reused buffer.
fn send_push(
    sink: &mut dyn Sink,
    subs: &mut SubTable,
    remote: &mut RemotePush,
    targets: Vec<Target>,
    to: &Push<'_>,
    m: &Msg,
    tail: &mut Vec<u8>,
) {
    tail.clear();
    tail.extend_from_slice(b",\"subject\":");
    push_str(tail, &m.subject);
    tail.extend_from_slice(b",\"data\":");
    push_data(tail, m, 0);
    if let Some(h) = &m.headers {
        tail.extend_from_slice(b",\"headers\":");
        tail.extend_from_slice(h.as_bytes());
    }
    tail.extend_from_slice(b",\"stream\":");
    push_str(tail, to.stream);
    tail.extend_from_slice(b",\"consumer\":");
    push_str(tail, to.consumer);
    tail.extend_from_slice(
        format!(",\"seq\":{},\"delivered\":{}}}]", to.seq, to.delivered).as_bytes(),
    );
    // Several local subscribers hold one copy of the tail.
    let shared = super::messaging::share(tail, targets.len());
    for t in targets {
        let key = match t {
            Target::Local(key) => key,
            Target::Remote(node, serial, sid) => {
                let mut data = Vec::new();
                push_data(&mut data, m, 0);
                let mut extra = b"\"stream\":".to_vec();
                push_str(&mut extra, to.stream);
                extra.extend_from_slice(b",\"consumer\":");
                push_str(&mut extra, to.consumer);
                extra.extend_from_slice(
                    format!(",\"seq\":{},\"delivered\":{}", to.seq, to.delivered).as_bytes(),
                );
                remote.out.push(PushOut {
                    node,
                    pick: (serial, sid),
                    subject: m.subject.to_string(),
                    data: String::from_utf8_lossy(&data).into_owned(),
                    headers: m.headers.as_deref().map(str::to_string),
                    attachments: if m.binary {
                        vec![m.data.to_vec()]
                    } else {
                        Vec::new()
                    },
                    extra: String::from_utf8_lossy(&extra).into_owned(),
                });
                continue;
            }
        };
        let Some(s) = subs.target(key) else {
            continue;
        };
        let conn = s.conn;
        let head: &[u8] = if m.binary {
            // A BINARY_EVENT with one attachment: `51-["msg",{…`.
            b"51-[\"msg\",{\"sid\":"
        } else {
            b"2[\"msg\",{\"sid\":"
        };
        let queued = match &shared {
            Some(tail) => sink.send_text_shared(conn, &[head, s.sid_json.as_bytes()], tail),
            None => sink.send_text(conn, &[head, s.sid_json.as_bytes(), tail]),
        };
        if queued && m.binary {
            sink.send_binary(conn, &m.data);
        }
        if let Some(end) = subs.delivered(key) {
            subs.ended.push(end);
        }
    }
}

/// A replicated stream's push delivery of `m` (already accepted by its
/// delivery entry) to the subscribers of `subject` (one of `group`);
/// false if none could take it.
#[allow(clippy::too_many_arguments)]
pub(super) fn push_accepted(
    sink: &mut dyn Sink,
    subs: &mut SubTable,
    remote: &mut RemotePush,
    subject: &str,
    group: Option<&str>,
    to: &Push<'_>,
    m: &Msg,
    pick: &mut usize,
) -> bool {
    let targets = push_targets(subs, remote, subject, group, pick);
    if targets.is_empty() {
        return false;
    }
    let mut tail = Vec::new();
    send_push(sink, subs, remote, targets, to, m, &mut tail);
    true
}

/// Whether a push delivery on `subject` (to `group`) would reach anyone.
pub(super) fn has_targets(
    subs: &mut SubTable,
    remote: &RemotePush,
    subject: &str,
    group: Option<&str>,
) -> bool {
    let m = subs.matches(subject);
    let live = |keys: &[u64]| keys.iter().any(|&k| remote.live(subs, k));
    match group {
        Some(g) => m.groups.iter().any(|q| &*q.queue == g && live(&q.members)),
        None => live(&m.plain) || m.groups.iter().any(|q| live(&q.members)),
    }
}

/// Who gets a push delivery on `subject`: with a group, one member of it;
/// without, every plain subscriber and one member per queue group.
fn push_targets(
    subs: &mut SubTable,
    remote: &RemotePush,
    subject: &str,
    group: Option<&str>,
    pick: &mut usize,
) -> Vec<Target> {
    let m = subs.matches(subject);
    let mut keys = Vec::new();
    let mut one_of = |members: &[u64], out: &mut Vec<u64>| {
        let live: Vec<u64> = members
            .iter()
            .copied()
            .filter(|&k| remote.live(subs, k))
            .collect();
        if !live.is_empty() {
            *pick = pick.wrapping_add(1);
            out.push(live[*pick % live.len()]);
        }
    };
    match group {
        Some(g) => {
            if let Some(q) = m.groups.iter().find(|q| &*q.queue == g) {
                one_of(&q.members, &mut keys);
            }
        }
        None => {
            keys.extend(m.plain.iter().copied().filter(|&k| remote.live(subs, k)));
            for q in &m.groups {
                if subs.group_mode(&q.queue) == GroupMode::Broadcast {
                    keys.extend(q.members.iter().copied());
                } else {
                    one_of(&q.members, &mut keys);
                }
            }
        }
    }
    keys.into_iter()
        .filter_map(|k| remote.target(subs, k))
        .collect()
}

pub(super) fn stream_json(s: &Stream) -> Value {
    let st = s.state();
    json!({
        "stream": {
            "config": s.cfg,
            "state": {
                "messages": st.messages,
                "bytes": st.bytes,
                "first_seq": st.first_seq,
                "last_seq": st.last_seq,
                "consumer_count": st.consumer_count,
            }
        }
    })
}

pub(super) fn consumer_json(s: &Stream, name: &str) -> Value {
    let Some(m) = s.consumers.get(name) else {
        return json!({});
    };
    let c = &m.consumer;
    let d = c.delivered();
    let f = c.ack_floor();
    let n = ConsumerSummary::of(s, name, c);
    json!({
        "consumer": {
            "stream": s.cfg.name,
            "name": name,
            "config": c.cfg,
            "delivered": {"stream_seq": d.stream_seq, "consumer_seq": d.consumer_seq},
            "ack_floor": {"stream_seq": f.stream_seq, "consumer_seq": f.consumer_seq},
            "num_pending": n.num_pending,
            "num_ack_pending": n.num_ack_pending,
            "num_redelivered": n.num_redelivered,
        }
    })
}

/// Appends a message's `data`: its JSON text as published, or for binary
/// data the placeholder of attachment `num`.
pub(super) fn push_data(out: &mut Vec<u8>, m: &Msg, num: usize) {
    if m.binary {
        out.extend_from_slice(format!("{{\"_placeholder\":true,\"num\":{num}}}").as_bytes());
    } else {
        out.extend_from_slice(&m.data);
    }
}

/// Appends a stored message as a JSON object, `data` and `headers`
/// inlined exactly as they were published (never re-encoded, so big
/// numbers, key order and every other detail of the JSON come back as
/// they went in): `{seq, subject, data, headers?, time, delivered?}`.
/// Binary `data` becomes a placeholder numbered after the attachments
/// already in `attachments`, and its bytes join them.
pub(super) fn push_message(
    out: &mut Vec<u8>,
    attachments: &mut Vec<Vec<u8>>,
    seq: u64,
    m: &Msg,
    delivered: Option<u64>,
) {
    out.extend_from_slice(format!("{{\"seq\":{seq},\"subject\":").as_bytes());
    push_str(out, &m.subject);
    out.extend_from_slice(b",\"data\":");
    push_data(out, m, attachments.len());
    if m.binary {
        attachments.push(m.data.to_vec());
    }
    if let Some(h) = &m.headers {
        out.extend_from_slice(b",\"headers\":");
        out.extend_from_slice(h.as_bytes());
    }
    out.extend_from_slice(format!(",\"time\":{}", m.time_ms).as_bytes());
    if let Some(d) = delivered {
        out.extend_from_slice(format!(",\"delivered\":{d}").as_bytes());
    }
    out.push(b'}');
}

/// The `stream.get` ack: `[{"ok":true,"message":{…}}]`, and the bytes
/// of its `data` when that is binary.
pub(super) fn message_body(seq: u64, m: &Msg) -> (String, Vec<Vec<u8>>) {
    let mut out = Vec::with_capacity(m.data.len() + 128);
    let mut attachments = Vec::new();
    out.extend_from_slice(b"[{\"ok\":true,\"message\":");
    push_message(&mut out, &mut attachments, seq, m, None);
    out.extend_from_slice(b"}]");
    (String::from_utf8(out).unwrap_or_default(), attachments)
}

/// Up to `batch` deliveries of consumer `name` as JSON objects joined by
/// commas into `body`, the bytes of binary ones into `attachments`;
/// returns how many.
pub(super) fn take_batch(
    slot: &mut OpenStream,
    name: &str,
    batch: usize,
    now: Instant,
    body: &mut Vec<u8>,
    attachments: &mut Vec<Vec<u8>>,
) -> usize {
    body.clear();
    attachments.clear();
    let mut binary_bytes = 0;
    let Some((msgs, member)) = slot.stream.split(name) else {
        return 0;
    };
    let none = member.consumer.cfg.ack_policy == AckPolicy::None;
    let mut events = Vec::new();
    let mut done = Vec::new();
    let mut n = 0;
    while n < batch && body.len() + binary_bytes < FETCH_BYTES_MAX {
        let Some(d) = member.consumer.next(now, &msgs, &mut events) else {
            break;
        };
        let Ok(Some(m)) = msgs.get(d.seq) else {
            continue;
        };
        if n > 0 {
            body.push(b',');
        }
        push_message(body, attachments, d.seq, &m, Some(d.deliveries));
        if m.binary {
            binary_bytes += m.data.len();
        }
        if none {
            done.push(d.seq);
        }
        n += 1;
    }
    if !events.is_empty() || !done.is_empty() {
        after_events(slot, name, &events, &done);
        slot.touched = true;
    }
    n
}

/// `[{"ok":true,"messages":[…]}]` around messages joined by `take_batch`.
pub(super) fn fetch_body(messages: &[u8]) -> String {
    let mut out = String::with_capacity(messages.len() + 32);
    out.push_str("[{\"ok\":true,\"messages\":[");
    out.push_str(std::str::from_utf8(messages).unwrap_or(""));
    out.push_str("]}]");
    out
}

/// Appends the ack body of a publish stored in `stream` at `seq`
/// (`[{"ok":true,"stream":…,"seq":…}]`, with `"duplicate":true` when the
/// `Msg-Id` had been seen), the same for R1 and replicated streams.
pub(super) fn push_stored(out: &mut Vec<u8>, stream: &str, seq: u64, duplicate: bool) {
    out.extend_from_slice(b"[{\"ok\":true,\"stream\":");
    push_str(out, stream);
    out.extend_from_slice(b",\"seq\":");
    crate::protocol::socketio::push_decimal(out, seq);
    if duplicate {
        out.extend_from_slice(b",\"duplicate\":true");
    }
    out.extend_from_slice(b"}]");
}

/// Appends `s` as a JSON string literal.
pub(super) fn push_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(Value::from(s).to_string().as_bytes());
    }
}
