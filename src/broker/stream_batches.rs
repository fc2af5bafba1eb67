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
//! client's ack id ([`SLOT`] set);
//! [`StreamGroups::answer`](super::stream_groups::StreamGroups::answer)
//! (in `calls.rs`) gathers the slots and answers the call once every one
//! is known.
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
//!
//! This file holds `Batches` and the batch format, below the
//! `StreamGroups` and the `Broker` that hold them; the calls (sending,
//! answering, the answers handed back) are in `stream_batches/calls.rs`.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::ack::send_ack;
use super::session::{NSP_CONTROL, NSP_ROOT};
use crate::cluster::api::CallError;
#[cfg(doc)]
use crate::cluster::api::LinkOut;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};

mod calls;

/// Most bytes of messages in one batch (a larger message goes alone):
/// under the peer's `maxPayload`, `-max-payload` plus 64 KiB or more.
pub const BATCH_BYTES_MAX: usize = 512 << 10;
/// Marks an ack id that is a batch's slot: batch number << 24 | item.
pub const SLOT: u64 = 1 << 63;
/// Most items in one batch.
const ITEMS_MAX: usize = 1 << 24;

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
