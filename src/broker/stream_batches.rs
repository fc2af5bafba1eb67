//! Publishes to a replicated stream taken on a member that does not lead
//! it: what one loop turn brings in for each leader goes there as one
//! `cluster.publish` call (its messages as one attachment), as the leader
//! puts what one turn brings in into one entry. The member delivers each
//! message to core subscribers itself, as it does any publish; only the
//! storing is the leader's, and each publisher's ack waits for its slot
//! in the leader's answer.
//!
//! On the leader each message of a batch joins the turn's entry like a
//! publish of its own, answered under a slot number in place of a
//! client's ack id ([`SLOT`] set); [`StreamGroups::answer`] gathers the
//! slots and answers the call once every one is known.
//!
//! A relayed publish is executed only where it cannot overtake a later
//! publish of its connection (docs/PROTOCOL.md, "Replicated streams"):
//! - each item carries the term of the leader the member sent it to, and
//!   the leader takes it only while it leads in that term. Entries of a
//!   term come before those of every later term in the group's log, and
//!   the member sends later publishes to a leader of that term or a later
//!   one, so an item that waited in a link while the group elected
//!   another leader (or this one again) is answered `unavailable`, not
//!   stored behind the publishes sent after it;
//! - the call is fenced ([`LinkOut::fenced`]): a batch left in a peer
//!   connection the member gave up on (its publishers answered
//!   `unavailable`) that arrives after a batch sent over a newer
//!   connection is refused whole.
//!
//! A batch item: u64 group, u64 term, u32 subject length, subject, u8
//! flags (1 binary, 2 headers), [u32 headers length, headers], u32 data
//! length, data (JSON text, or the attachment's bytes when binary).
//! Integers are little-endian; every length is checked against the bytes
//! present. The call's argument is `{from, link}`: the member's node id
//! and its connection's number.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ack::send_ack;
use super::session::{NSP_CONTROL, NSP_ROOT};
use super::stream_groups::{StreamGroups, ENTRY_WAIT};
use super::Broker;
use crate::cluster::api::CallError;
#[cfg(doc)]
use crate::cluster::api::LinkOut;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};

/// Most bytes of messages in one batch (a larger message goes alone):
/// under the peer's `maxPayload`, `-max-payload` plus 64 KiB or more.
pub const BATCH_BYTES_MAX: usize = 512 << 10;
/// Marks an ack id that is a batch's slot: batch number << 24 | item.
pub const SLOT: u64 = 1 << 63;
/// Most items in one batch.
const ITEMS_MAX: usize = 1 << 24;
/// How long a batch's call may take: its entry's bound and the way back.
const BATCH_WAIT: Duration = Duration::from_millis(ENTRY_WAIT.as_millis() as u64 + 500);

const BINARY: u8 = 1;
const HEADERS: u8 = 2;

/// One batch on its way to a leader: its items and who waits for each.
#[derive(Default)]
struct Batch {
    body: Vec<u8>,
    waiters: Vec<Option<(ConnId, u64)>>,
}

/// A batch the leader is answering: the member's call and each slot's
/// answer (the body of a publish's ack) once known.
struct Answering {
    conn: ConnId,
    ack_id: Option<u64>,
    results: Vec<Option<String>>,
    left: usize,
}

/// Batches of both sides.
#[derive(Default)]
pub(crate) struct Batches {
    /// This turn's batch for each leader, and full ones to send.
    open: HashMap<u64, Batch>,
    full: Vec<(u64, Batch)>,
    /// Sent, by call tag.
    sent: HashMap<u64, Vec<Option<(ConnId, u64)>>>,
    /// On a leader: batches being answered, by number.
    answering: HashMap<u64, Answering>,
    next: u64,
    /// On a leader: the highest connection number taken from each member.
    fences: HashMap<u64, u64>,
}

impl Batches {
    /// Adds a publish for stream group `group` to this turn's batch for
    /// `leader`, its leader in term `term` as this member knows it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        leader: u64,
        group: u64,
        term: u64,
        waiter: Option<(ConnId, u64)>,
        subject: &str,
        headers: Option<&str>,
        data: &[u8],
        binary: bool,
    ) {
        let item =
            8 + 8 + 4 + subject.len() + 1 + headers.map_or(0, |h| 4 + h.len()) + 4 + data.len();
        let b = self.open.entry(leader).or_default();
        if !b.waiters.is_empty()
            && (b.body.len() + item > BATCH_BYTES_MAX || b.waiters.len() >= ITEMS_MAX)
        {
            let full = std::mem::take(b);
            self.full.push((leader, full));
        }
        let b = self.open.entry(leader).or_default();
        let out = &mut b.body;
        out.extend_from_slice(&group.to_le_bytes());
        out.extend_from_slice(&term.to_le_bytes());
        put(out, subject.as_bytes());
        out.push((u8::from(binary) * BINARY) | (u8::from(headers.is_some()) * HEADERS));
        if let Some(h) = headers {
            put(out, h.as_bytes());
        }
        put(out, data);
        b.waiters.push(waiter);
    }

    /// Whether a batch member `from` sent over its connection number
    /// `link` may be taken: not when one came over a newer connection of
    /// that member already (this one was left in a connection given up).
    fn admit(&mut self, from: u64, link: u64) -> bool {
        let newest = self.fences.entry(from).or_insert(link);
        if link < *newest {
            return false;
        }
        *newest = link;
        true
    }

    /// Socket `conn` closed: nothing is answered on it any more.
    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        let forget = |ws: &mut Vec<Option<(ConnId, u64)>>| {
            for w in ws.iter_mut().filter(|w| w.is_some_and(|(c, _)| c == conn)) {
                *w = None;
            }
        };
        for b in self.open.values_mut() {
            forget(&mut b.waiters);
        }
        for (_, b) in &mut self.full {
            forget(&mut b.waiters);
        }
        for ws in self.sent.values_mut() {
            forget(ws);
        }
        self.answering.retain(|_, a| a.conn != conn);
    }
}

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// One decoded batch item, borrowing from its batch.
#[derive(Debug, PartialEq, Eq)]
pub struct Item<'a> {
    pub group: u64,
    pub subject: &'a str,
    pub headers: Option<&'a str>,
    pub data: &'a [u8],
    pub binary: bool,
}

/// Decodes a batch into (term, item) pairs; `None` if it is malformed
/// anywhere.
pub fn decode(mut b: &[u8]) -> Option<Vec<(u64, Item<'_>)>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (b.get(..n)?, b.get(n..)?);
        *b = rest;
        Some(head)
    }
    fn bytes<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize;
        take(b, n)
    }
    let mut items = Vec::new();
    while !b.is_empty() {
        let group = u64::from_le_bytes(take(&mut b, 8)?.try_into().ok()?);
        let term = u64::from_le_bytes(take(&mut b, 8)?.try_into().ok()?);
        let subject = std::str::from_utf8(bytes(&mut b)?).ok()?;
        let flags = *take(&mut b, 1)?.first()?;
        if flags & !(BINARY | HEADERS) != 0 {
            return None;
        }
        let headers = if flags & HEADERS != 0 {
            Some(std::str::from_utf8(bytes(&mut b)?).ok()?)
        } else {
            None
        };
        let data = bytes(&mut b)?;
        items.push((
            term,
            Item {
                group,
                subject,
                headers,
                data,
                binary: flags & BINARY != 0,
            },
        ));
    }
    Some(items)
}

/// A batch call's argument.
#[derive(Deserialize, Default)]
struct BatchArg {
    /// The member's node id.
    from: Option<u64>,
    /// Its connection's number.
    link: Option<u64>,
}

/// The leader's answer to a batch.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    results: Vec<&'a RawValue>,
}

impl StreamGroups {
    /// Sends the ack of a publish, or, for a slot of a batch, keeps it
    /// until the batch's every slot is known and then answers the batch.
    pub(crate) fn answer(&mut self, sink: &mut dyn Sink, conn: ConnId, ack_id: u64, body: String) {
        if ack_id & SLOT == 0 {
            send_ack(sink, conn, NSP_ROOT, ack_id, &body);
            return;
        }
        let (batch, slot) = (
            (ack_id & !SLOT) >> 24,
            (ack_id & (ITEMS_MAX as u64 - 1)) as usize,
        );
        let Some(a) = self.batches.answering.get_mut(&batch) else {
            return;
        };
        if let Some(r) = a.results.get_mut(slot).filter(|r| r.is_none()) {
            *r = Some(body);
            a.left -= 1;
        }
        if a.left == 0 {
            if let Some(a) = self.batches.answering.remove(&batch) {
                answer_batch(sink, &a);
            }
        }
    }
}

fn answer_batch(sink: &mut dyn Sink, a: &Answering) {
    let Some(ack_id) = a.ack_id else {
        return;
    };
    let mut body = String::from(r#"[{"ok":true,"results":["#);
    for (i, r) in a.results.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(r.as_deref().unwrap_or("null"));
    }
    body.push_str("]}]");
    send_ack(sink, a.conn, NSP_CONTROL, ack_id, &body);
}

impl Broker {
    /// At the end of a turn: each batch goes to its leader as one call. A
    /// leader no link reaches answers its publishers `unavailable`.
    pub(crate) fn send_batches(&mut self, sink: &mut dyn Sink) {
        let b = &mut self.stream_groups.batches;
        if b.open.is_empty() && b.full.is_empty() {
            return;
        }
        let mut out = std::mem::take(&mut b.full);
        out.extend(b.open.drain());
        for (leader, batch) in out {
            let tag = self.cluster.as_mut().and_then(|c| {
                let args = format!(r#"{{"from":{}}}"#, c.me());
                c.call_node(
                    leader,
                    super::cluster::Tag::Batch,
                    "cluster.publish",
                    args,
                    vec![batch.body],
                    BATCH_WAIT,
                    true,
                )
            });
            match tag {
                Some(tag) => {
                    self.stream_groups.batches.sent.insert(tag, batch.waiters);
                }
                None => {
                    let e = ApiError::new(Code::Unavailable, "the stream's leader is unreachable");
                    for (conn, ack_id) in batch.waiters.into_iter().flatten() {
                        send_ack(sink, conn, NSP_ROOT, ack_id, &e.ack_body());
                    }
                }
            }
        }
    }

    /// The leader's answer to a batch: each publisher gets its slot.
    pub(crate) fn batch_answered(
        &mut self,
        sink: &mut dyn Sink,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    ) {
        let Some(waiters) = self.stream_groups.batches.sent.remove(&tag) else {
            return;
        };
        // The answer's first argument: `{ok, results}`.
        let answer = result
            .as_ref()
            .ok()
            .and_then(|(text, _)| serde_json::from_str::<Answer<'_>>(text).ok());
        let failed = match &result {
            Err(e) => ApiError::new(Code::Unavailable, e.message.clone()),
            Ok((text, _)) => ApiError::new(
                Code::Unavailable,
                format!("the stream's leader gave no answer: {text}"),
            ),
        };
        for (i, w) in waiters.into_iter().enumerate() {
            let Some((conn, ack_id)) = w else {
                continue;
            };
            match answer.as_ref().and_then(|a| a.results.get(i)) {
                Some(r) => send_ack(sink, conn, NSP_ROOT, ack_id, r.get()),
                None => send_ack(sink, conn, NSP_ROOT, ack_id, &failed.ack_body()),
            }
        }
    }

    /// `cluster.publish` from a member: each message joins the turn's
    /// entry of its stream if this node leads it in the term it was sent
    /// for, and is answered in the batch's slot; one this node cannot take
    /// is answered `unavailable` at once, in its slot. A batch that came
    /// over a connection older than one the member has sent over since is
    /// refused whole (see the module's comment).
    pub(crate) fn cluster_publish(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&RawValue>,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        let body = attachments.first().map_or(&[][..], Vec::as_slice);
        let items = decode(body)
            .ok_or_else(|| ApiError::new(Code::BadRequest, "malformed publish batch"))?;
        let arg: BatchArg = arg
            .map(|a| serde_json::from_str(a.get()))
            .transpose()
            .map_err(|e| ApiError::new(Code::BadRequest, format!("publish batch: {e}")))?
            .unwrap_or_default();
        let b = &mut self.stream_groups.batches;
        if let (Some(from), Some(link)) = (arg.from, arg.link) {
            if !b.admit(from, link) {
                return Err(ApiError::new(
                    Code::Unavailable,
                    "a publish batch from a peer connection since replaced",
                ));
            }
        }
        b.next += 1;
        let batch = b.next;
        let mut results = vec![None; items.len()];
        let mut left = 0;
        for (i, (term, item)) in items.iter().enumerate() {
            let slot = ack_id.map(|_| SLOT | batch << 24 | i as u64);
            if !self.stream_groups.leads_in(item.group, *term) {
                let e = ApiError::new(
                    Code::Unavailable,
                    format!(
                        "the stream's leader changed (sent to its leader of term {})",
                        term
                    ),
                );
                results[i] = Some(e.ack_body());
                continue;
            }
            match self.stream_groups.take_publish(item, conn, slot, false) {
                Ok(()) if slot.is_some() => left += 1,
                Ok(()) => {}
                Err(e) => results[i] = Some(e.ack_body()),
            }
        }
        let a = Answering {
            conn,
            ack_id,
            results,
            left,
        };
        if left == 0 {
            answer_batch(sink, &a);
        } else {
            self.stream_groups.batches.answering.insert(batch, a);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_decodes_as_it_was_made_and_refuses_any_cut() {
        let mut b = Batches::default();
        let w = |n| Some((ConnId::default(), n));
        b.add(2, 7, 3, w(1), "a.b", None, b"\"x\"", false);
        b.add(
            2,
            7,
            4,
            None,
            "a.c",
            Some(r#"{"Msg-Id":"1"}"#),
            &[0, 1, 2],
            true,
        );
        let batch = b.open.remove(&2).unwrap();
        assert_eq!(batch.waiters, vec![w(1), None]);
        let items = decode(&batch.body).unwrap();
        assert_eq!(
            items,
            vec![
                (
                    3,
                    Item {
                        group: 7,
                        subject: "a.b",
                        headers: None,
                        data: b"\"x\"",
                        binary: false
                    }
                ),
                (
                    4,
                    Item {
                        group: 7,
                        subject: "a.c",
                        headers: Some(r#"{"Msg-Id":"1"}"#),
                        data: &[0, 1, 2],
                        binary: true
                    }
                ),
            ]
        );
        // Cut anywhere but between items, it is refused.
        let first = 8 + 8 + 4 + 3 + 1 + 4 + 3;
        assert_eq!(decode(&batch.body[..first]).map(|v| v.len()), Some(1));
        for cut in (1..batch.body.len()).filter(|&c| c != first) {
            assert_eq!(decode(&batch.body[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode(&[]), Some(Vec::new()));
    }

    #[test]
    fn a_batch_from_a_connection_older_than_one_seen_is_refused() {
        let mut b = Batches::default();
        assert!(b.admit(1, 5));
        assert!(b.admit(1, 5), "the same connection goes on");
        assert!(b.admit(1, 7), "a newer connection");
        assert!(!b.admit(1, 5), "left in the connection given up");
        assert!(!b.admit(1, 6));
        assert!(b.admit(2, 3), "each member on its own");
        assert!(b.admit(1, 7));
    }

    #[test]
    fn a_full_batch_is_set_aside_and_a_new_one_begins() {
        let mut b = Batches::default();
        let big = vec![7u8; BATCH_BYTES_MAX / 3];
        for n in 0..3 {
            b.add(1, 5, 1, Some((ConnId::default(), n)), "s", None, &big, true);
        }
        assert_eq!(b.full.len(), 1);
        assert_eq!(b.full[0].1.waiters.len(), 2);
        assert_eq!(b.open[&1].waiters.len(), 1);
        // A message larger than a batch goes alone.
        let huge = vec![7u8; BATCH_BYTES_MAX + 1];
        b.add(1, 5, 1, None, "s", None, &huge, true);
        assert_eq!(b.full.len(), 2);
        assert_eq!(b.open[&1].waiters.len(), 1);
    }
}
