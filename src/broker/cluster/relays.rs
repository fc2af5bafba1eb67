//! Requests relayed to another node (a stream it owns, a publish its
//! stream captures) and answered with that node's answer; a `stream.list`
//! or `kv.list` gathered from every node.

use super::*;
use crate::broker::Broker;

impl Broker {
    #[allow(clippy::too_many_arguments)]
    /// Relays a client's event to node `node` over the peer link's `/`
    /// socket; its answer is relayed back as this event's ack. With
    /// `group` (a fetch's relay), `node` is that stream group's leader as
    /// this node knows it, and the relay is answered `unavailable` as
    /// soon as this node learns the group has another leader or none
    /// ([`Broker::group_leader_moved`]), rather than at its timeout.
    pub(crate) fn relay(
        &mut self,
        node: u64,
        group: Option<GroupId>,
        conn: ConnId,
        ack_id: Option<u64>,
        event: &str,
        arg: String,
        attachments: Vec<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let c = self
            .cluster
            .as_mut()
            .ok_or_else(|| ApiError::new(Code::Internal, "not in a cluster"))?;
        let unreachable = || {
            ApiError::new(
                Code::Unavailable,
                "the node that owns this stream is unreachable",
            )
        };
        let link = c.link_to(node).ok_or_else(unreachable)?;
        if c.relays.relays_full() {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many relayed requests waiting",
            ));
        }
        let tag = c.tag(Tag::Relay);
        let out = LinkOut::control(tag, event, arg, timeout)
            .with_attachments(attachments)
            .on_root();
        let queued = c.call_link(link, out);
        if !queued {
            return Err(unreachable());
        }
        c.relays.open(tag, conn, ack_id, group.map(|g| (g, node)));
        Ok(None)
    }

    /// Stream group `group` now has `leader` (or none) as this node sees
    /// it: a fetch relayed to another node as the group's leader will not
    /// be served there, or its answer may never come (a leader frozen or
    /// cut off); it is answered `unavailable` now, so that a stream
    /// without a reachable leader answers within the contract's 5 s
    /// (docs/PROTOCOL.md, "Replicated streams"), not after its
    /// `expires_ms` and 4.5 s more.
    pub(crate) fn group_leader_moved(
        &mut self,
        sink: &mut dyn Sink,
        group: GroupId,
        leader: Option<u64>,
    ) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let owed = c.relays.leader_moved(group, leader);
        let e = ApiError::new(
            Code::Unavailable,
            "the stream's leader changed or cannot be reached; try again",
        );
        for (conn, ack_id) in owed {
            self.count_error(Code::Unavailable);
            send_ack(sink, conn, NSP_ROOT, ack_id, &e.ack_body());
        }
    }

    /// `stream.list` or `kv.list` in a cluster: this node's entries
    /// (`local`) plus every other node's, asked for over the links.
    pub(crate) fn gather_list(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        listing: Listing,
        local: Vec<Value>,
    ) -> Result<Option<String>, ApiError> {
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let Some(c) = self.cluster.as_mut() else {
            return Err(ApiError::new(Code::Internal, "not in a cluster"));
        };
        let links = c.peers.links_up();
        if c.relays.gathers_full() {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many relayed requests waiting",
            ));
        }
        let mut calls = Vec::new();
        for link in links {
            let tag = c.tag(Tag::Relay);
            let args = r#"{"local":true}"#.to_string();
            let out = LinkOut::control(tag, listing.event(), args, PROPOSE_WAIT).on_root();
            if c.call_link(link, out) {
                calls.push(tag);
            }
        }
        let g = Gather::new(conn, ack_id, listing, local);
        match c.relays.gather(g, calls) {
            Some(g) => Ok(Some(self.gathered_body(g).2)),
            None => Ok(None),
        }
    }

    /// The answer of a gather whose nodes all answered (or failed to): the
    /// asking socket, its ack id, and the entries by name, only those the
    /// socket may see.
    fn gathered_body(&mut self, g: Gather) -> (ConnId, u64, String) {
        let (conn, ack_id, listing, body) = g.finish();
        (conn, ack_id, self.filter_list(conn, body, listing))
    }

    pub(super) fn relay_answered(
        &mut self,
        sink: &mut dyn Sink,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    ) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let ok = result.as_ref().ok().map(|(text, _)| text.as_str());
        match c.relays.answered(tag, ok) {
            Answered::Nobody | Answered::Gathering => {}
            Answered::Gathered(g) => {
                let (conn, ack_id, body) = self.gathered_body(g);
                send_ack(sink, conn, NSP_ROOT, ack_id, &body);
            }
            Answered::Relay { conn, ack_id } => match result {
                Ok((text, attachments)) => relay_ack(sink, conn, ack_id, &text, &attachments),
                Err(e) => {
                    self.count_error(Code::Unavailable);
                    relay_ack(sink, conn, ack_id, &call_error_value(&e), &[]);
                }
            },
        }
    }
}

/// Relays an answer (its first argument's JSON text and attachments) as
/// an ACK.
fn relay_ack(sink: &mut dyn Sink, conn: ConnId, ack_id: u64, value: &str, attachments: &[Vec<u8>]) {
    let body = format!("[{value}]");
    let mut head = Vec::with_capacity(24);
    send_ack_with(
        sink,
        &mut head,
        NSP_ROOT,
        conn,
        ack_id,
        body.as_bytes(),
        attachments,
    );
}
