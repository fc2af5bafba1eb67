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
        if c.relays.len() >= RELAYS_MAX {
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
        c.relays.insert(
            tag,
            Relay {
                conn,
                ack_id,
                group: group.map(|g| (g, node)),
            },
        );
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
        let moved: Vec<u64> = c
            .relays
            .iter()
            .filter(|(_, r)| {
                r.group
                    .is_some_and(|(g, n)| g == group && Some(n) != leader)
            })
            .map(|(&tag, _)| tag)
            .collect();
        let gone: Vec<Relay> = moved.iter().filter_map(|t| c.relays.remove(t)).collect();
        let e = ApiError::new(
            Code::Unavailable,
            "the stream's leader changed or cannot be reached; try again",
        );
        for r in gone {
            if let Some(ack_id) = r.ack_id {
                self.count_error(Code::Unavailable);
                send_ack(sink, r.conn, NSP_ROOT, ack_id, &e.ack_body());
            }
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
        let links: Vec<usize> = (0..c.link_node.len())
            .filter(|&l| c.link_node[l].is_some())
            .collect();
        if c.gathers.len() >= RELAYS_MAX {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many relayed requests waiting",
            ));
        }
        c.next_tag += 1;
        let gid = c.next_tag;
        let mut g = Gather {
            conn,
            ack_id,
            left: 0,
            listing,
            entries: local,
        };
        for link in links {
            let tag = c.tag(Tag::Relay);
            let args = r#"{"local":true}"#.to_string();
            let out = LinkOut::control(tag, listing.event(), args, PROPOSE_WAIT).on_root();
            let queued = c.call_link(link, out);
            if queued {
                g.left += 1;
                c.gather_of.insert(tag, gid);
            }
        }
        if g.left == 0 {
            return Ok(Some(self.gathered_body(g)));
        }
        c.gathers.insert(gid, g);
        Ok(None)
    }

    /// The answer of a gather whose nodes all answered (or failed to): its
    /// entries by name, only those the asking socket may see.
    fn gathered_body(&mut self, mut g: Gather) -> String {
        let listing = g.listing;
        g.entries
            .sort_by(|a, b| listing.name(a).cmp(&listing.name(b)));
        let body = json!([{"ok": true, listing.field(): g.entries}]).to_string();
        self.filter_list(g.conn, body, listing)
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
        if let Some(gid) = c.gather_of.remove(&tag) {
            let Some(g) = c.gathers.get_mut(&gid) else {
                return;
            };
            g.left -= 1;
            if let Ok((text, _)) = &result {
                let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
                let listing = g.listing;
                if let Some(list) = v.get(listing.field()).and_then(Value::as_array) {
                    for entry in list {
                        merge_entry(listing, &mut g.entries, entry.clone());
                    }
                }
            }
            if g.left == 0 {
                if let Some(g) = c.gathers.remove(&gid) {
                    let (conn, ack_id) = (g.conn, g.ack_id);
                    let body = self.gathered_body(g);
                    send_ack(sink, conn, NSP_ROOT, ack_id, &body);
                }
            }
            return;
        }
        let Some(r) = c.relays.remove(&tag) else {
            return;
        };
        let Some(ack_id) = r.ack_id else {
            return;
        };
        match result {
            Ok((text, attachments)) => relay_ack(sink, r.conn, ack_id, &text, &attachments),
            Err(e) => {
                self.count_error(Code::Unavailable);
                relay_ack(sink, r.conn, ack_id, &call_error_value(&e), &[]);
            }
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

/// Adds a peer's entry to a gathered list. A name listed already is a
/// replicated stream (or bucket) this node knows only as a member or
/// bystander; the peer that sent it leads the stream's group (a peer
/// lists only those, see `stream_cluster.rs` and `kv.rs`), so its entry
/// replaces this node's own.
fn merge_entry(listing: Listing, entries: &mut Vec<Value>, entry: Value) {
    let key = listing.name(&entry).map(str::to_string);
    match entries
        .iter_mut()
        .find(|s| key.is_some() && listing.name(s).map(str::to_string) == key)
    {
        Some(known) => *known = entry,
        None => entries.push(entry),
    }
}
