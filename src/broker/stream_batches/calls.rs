//! The batches as peer calls: each turn's batches sent to their
//! leaders, a leader taking a batch into its groups' entries and answering
//! it slot by slot, and each publisher answered from the leader's answer.

use super::*;
use crate::broker::stream_groups::{StreamGroups, ENTRY_WAIT};
use crate::broker::Broker;

/// How long a batch's call may take: its entry's bound and the way back.
const BATCH_WAIT: Duration = Duration::from_millis(ENTRY_WAIT.as_millis() as u64 + 500);

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
                    crate::broker::cluster::Tag::Batch,
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
