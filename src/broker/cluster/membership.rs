//! Members added and removed while the cluster runs: `cluster.add` and
//! `cluster.remove` on `/control` (proposed to the Raft core on the
//! leader, relayed to the leader from any other node, and answered once
//! the change has taken effect), and what this node does as the
//! configuration changes: learn the members' names, open peer links to
//! new members, and leave (closing its clients) once it is removed
//! (docs/PROTOCOL.md, "Membership changes").

use super::super::session::NSP_CONTROL;
use super::parts::member_changes::{ASK_EVERY, REMOVE_WAIT};
use super::*;
use crate::broker::Broker;
use crate::cluster::api::members::{self, MemberInfo};
use crate::cluster::api::ChangeError;

/// A removed node closes its clients this long after it learns of its
/// removal, so that the answer to the change (and what is queued on its
/// sockets) goes out first.
const LEAVE_GRACE: Duration = Duration::from_millis(200);
/// How long `cluster.add` waits for the new node to catch up and vote.
const ADD_WAIT: Duration = Duration::from_secs(60);
/// How long `cluster.remove` waits for the replicas on the node to move
/// to other nodes before it removes the node (see `stream_moves.rs`).
const MOVE_WAIT: Duration = Duration::from_secs(60);

#[derive(serde::Deserialize)]
struct AddReq {
    id: String,
    raft_addr: String,
    addr: String,
}

#[derive(serde::Deserialize)]
struct RemoveReq {
    id: String,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

impl Broker {
    /// `cluster.add {id, raft_addr, addr}`.
    pub(crate) fn cluster_add(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&serde_json::value::RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let req: AddReq = crate::protocol::messages::parse_arg(arg)?;
        crate::config::validate_node_id(&req.id).map_err(|e| bad(format!("id: {e}")))?;
        let raft = crate::config::parse_member_addr(&req.raft_addr, false)
            .map_err(|e| bad(format!("raft_addr: {e}")))?;
        let http = crate::config::parse_member_addr(&req.addr, true)
            .map_err(|e| bad(format!("addr: {e}")))?;
        let info = MemberInfo {
            name: req.id.clone(),
            raft,
            http: Some(http),
        };
        let c = self.cluster_mut()?;
        if let Some(conf) = c.view.as_ref().map(configuration) {
            members::check_add(&conf, members::joined_id(&req.id), &info).map_err(bad)?;
        }
        let args = json!({"id": req.id, "raft_addr": raft.to_string(), "addr": http.to_string()});
        let id = members::joined_id(&req.id);
        self.member_change(
            conn,
            ack_id,
            "cluster.add",
            args,
            What::Add(id),
            move |tag| ToRaft::Add { tag, id, info },
        )
    }

    /// `cluster.remove {id}`.
    pub(crate) fn cluster_remove(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&serde_json::value::RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let req: RemoveReq = crate::protocol::messages::parse_arg(arg)?;
        let c = self.cluster_mut()?;
        let id = c
            .id_of(&req.id)
            .ok_or_else(|| bad(format!("node {} is not a member", req.id)))?;
        let args = json!({"id": req.id});
        self.member_change(
            conn,
            ack_id,
            "cluster.remove",
            args,
            What::Remove(id),
            move |tag| ToRaft::Remove { tag, id },
        )
    }

    fn cluster_mut(&mut self) -> Result<&mut Cluster, ApiError> {
        self.cluster
            .as_mut()
            .ok_or_else(|| bad("this node does not run in cluster mode"))
    }

    /// Proposes the change on the leader, or relays it to the leader.
    fn member_change(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        event: &str,
        args: Value,
        what: What,
        to_raft: impl FnOnce(u64) -> ToRaft,
    ) -> Result<Option<String>, ApiError> {
        let now = Instant::now();
        let (holds, stuck) = match what {
            What::Remove(id) => (self.holds_replicas(id), self.replica_stuck_on(id)),
            _ => (false, None),
        };
        if let Some(name) = stuck {
            return Err(bad(format!(
                "removing the node would leave stream {name:?} with one replica; add a node first"
            )));
        }
        let c = self.cluster_mut()?;
        if let Some(why) = c.not_serving() {
            return Err(ApiError::new(
                Code::Unavailable,
                format!("this node is {why}"),
            ));
        }
        let wait = match what {
            What::Add(_) => ADD_WAIT,
            _ => REMOVE_WAIT + MOVE_WAIT,
        };
        let tag = c.tag(Tag::Member);
        let mut moving = None;
        if c.role == Role::Leader {
            if !c.io.running() {
                return Err(ApiError::new(Code::Unavailable, "raft is not running"));
            }
            match what {
                // Its replicas move first; the removal is proposed once
                // no stream is placed on it (`answer_changes`).
                What::Remove(_) if holds => {
                    if c.changes.moving_under_way() {
                        return Err(ApiError::new(
                            Code::Unavailable,
                            "a membership change is under way",
                        ));
                    }
                    moving = Some(now);
                }
                _ => {
                    c.act(Action::Raft(to_raft(tag)));
                }
            }
        } else {
            let unreachable = || ApiError::new(Code::Unavailable, "no leader is reachable");
            let leader = c.leader.ok_or_else(unreachable)?;
            let link = c.link_to(leader).ok_or_else(unreachable)?;
            let timeout = wait + Duration::from_secs(1);
            let queued = c.call_link(
                link,
                LinkOut::control(tag, event, args.to_string(), timeout),
            );
            if !queued {
                return Err(unreachable());
            }
        }
        // A relayed change is answered by the leader (or the link's
        // timeout) before its own deadline.
        let (what, wait) = if c.role == Role::Leader {
            (what, wait)
        } else {
            (What::Relayed, wait + Duration::from_secs(3))
        };
        c.changes.add(tag, conn, ack_id, what, now + wait, moving);
        Ok(None)
    }

    /// The Raft core took the change at `index`, or refused it.
    pub(super) fn member_proposed(
        &mut self,
        sink: &mut dyn Sink,
        tag: u64,
        result: Result<u64, ChangeError>,
    ) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        match result {
            Ok(index) => c.changes.proposed(tag, index),
            Err(e) => {
                let Some(p) = c.changes.take(tag) else {
                    return;
                };
                let name = |id: u64| c.name_of(id).unwrap_or("?").to_string();
                let err = match e {
                    ChangeError::NotLeader(_) => ApiError::new(
                        Code::Unavailable,
                        "leadership moved while the change was proposed; try again",
                    ),
                    ChangeError::UnderWay => {
                        ApiError::new(Code::Unavailable, "a membership change is under way")
                    }
                    ChangeError::Duplicate(id) => match p.what() {
                        What::Add(_) => bad(
                            "the node, its id or one of its addresses is a member already"
                                .to_string(),
                        ),
                        _ => bad(format!("node {} is a member already", name(id))),
                    },
                    ChangeError::Unknown(id) => bad(format!("node {} is not a member", name(id))),
                    ChangeError::LastVoter => {
                        bad("removing it would leave the cluster without a voter")
                    }
                };
                if let Some((conn, ack_id)) = p.answer_to() {
                    send_ack(sink, conn, NSP_CONTROL, ack_id, &err.ack_body());
                }
            }
        }
    }

    /// `cluster.members` (node to node): the configuration with each
    /// member's Raft id and addresses, for a node waiting to be added.
    pub(crate) fn cluster_members(&self) -> String {
        let members: Vec<Value> = self
            .cluster
            .as_ref()
            .and_then(|c| c.view.as_ref())
            .map(|v| {
                v.members
                    .iter()
                    .filter_map(|m| {
                        let info = m.info.as_ref()?;
                        Some(json!({
                            "raft_id": m.id,
                            "id": info.name,
                            "raft_addr": info.raft.to_string(),
                            "addr": info.http.map(|a| a.to_string()),
                            "voter": m.voter,
                        }))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let conf_index = self
            .cluster
            .as_ref()
            .and_then(|c| c.view.as_ref())
            .map_or(0, |v| v.conf_index);
        crate::protocol::errors::ok_with(json!({ "members": members, "conf_index": conf_index }))
    }

    /// While this node waits to be added: ask every peer link who the
    /// members are, once per [`ASK_EVERY`].
    fn ask_members(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if !c
            .changes
            .ask_due(now, c.leader.is_some(), c.member, c.removed)
        {
            return;
        }
        for link in 0..c.peers.link_count() {
            let tag = c.tag(Tag::Member);
            let out = LinkOut::control(tag, "cluster.members", "{}".into(), ASK_EVERY);
            let queued = c.call_link(link, out);
            if queued {
                c.changes.asked(tag);
            }
        }
    }

    /// A peer's `cluster.members` answer: the Raft thread dials them.
    fn members_answered(
        &mut self,
        sink: &mut dyn Sink,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    ) {
        let Ok((text, _)) = result else {
            return;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let mut members = BTreeMap::new();
        for m in v["members"].as_array().into_iter().flatten() {
            let (Some(id), Some(name), Some(raft)) = (
                m["raft_id"].as_u64(),
                m["id"].as_str(),
                m["raft_addr"].as_str().and_then(|a| a.parse().ok()),
            ) else {
                continue;
            };
            let http = m["addr"].as_str().and_then(|a| a.parse().ok());
            let info = MemberInfo {
                name: name.to_string(),
                raft,
                http,
            };
            members.insert(id, info);
        }
        if members.is_empty() {
            return;
        }
        // A configuration newer than this member's that leaves it out:
        // it was removed while it could not hear the leader.
        let newer = v["conf_index"].as_u64().unwrap_or(0);
        let left_out = self.cluster.as_ref().is_some_and(|c| {
            c.member && !c.removed && newer > c.members_index && !members.contains_key(&c.me)
        });
        if left_out {
            if let Some(c) = self.cluster.as_mut() {
                c.removed = true;
            }
            self.leave_cluster(sink);
            return;
        }
        if let Some(c) = self.cluster.as_ref() {
            c.act(Action::Raft(ToRaft::Hint { members }));
        }
    }

    /// The leader's answer to a change relayed to it (or a peer's answer
    /// to `cluster.members`).
    pub(super) fn member_relay_answered(
        &mut self,
        sink: &mut dyn Sink,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    ) {
        if self
            .cluster
            .as_mut()
            .is_some_and(|c| c.changes.ask_answered(tag))
        {
            self.members_answered(sink, result);
            return;
        }
        let Some(p) = self.cluster.as_mut().and_then(|c| c.changes.take(tag)) else {
            return;
        };
        let Some((conn, ack_id)) = p.answer_to() else {
            return;
        };
        let body = match result {
            Ok((text, _)) => format!("[{text}]"),
            Err(e) => ApiError::new(Code::Unavailable, e.message).ack_body(),
        };
        send_ack(sink, conn, NSP_CONTROL, ack_id, &body);
    }

    /// With each fresh view of the Raft thread: follow the configuration
    /// (names, links, whether this node is a member) and answer the
    /// changes that completed or ran out of time.
    pub(super) fn follow_members(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let Some(view) = c.view.clone() else {
            return;
        };
        let mut changed = false;
        if view.conf_index != c.members_index || c.member != view.member {
            c.members_index = view.conf_index;
            c.members = view.members.iter().map(|m| m.id).collect();
            for m in &view.members {
                let Some(info) = &m.info else {
                    continue;
                };
                c.names.insert(m.id, info.name.clone());
                c.inbox_nodes
                    .insert(super::super::requests::sanitize(&info.name), m.id);
                let Some(http) = info.http else {
                    continue;
                };
                if m.id == c.me || c.peers.dials(&http) {
                    continue;
                }
                if c.io.dial(http) {
                    c.peers.add_link(http);
                }
            }
            // Links that came up before their node was known as a member
            // (or that reach a node no longer one).
            let nodes = c
                .peers
                .reached()
                .map(|name| name.and_then(|n| c.id_of(n)))
                .collect();
            c.peers.set_nodes(nodes);
            if view.member && !c.member {
                crate::log_info!("cluster: this node is a member");
            }
            c.member = view.member;
            changed = true;
        }
        // Only once the removal is committed: until then a new leader
        // may still drop it.
        if view.removed && view.commit >= view.conf_index && !c.removed {
            c.removed = true;
            c.changes.leave_at(now + LEAVE_GRACE);
        }
        if changed {
            self.retry_waiters(now);
        }
        self.answer_changes(sink, &view, now);
        let leave = self
            .cluster
            .as_mut()
            .is_some_and(|c| c.changes.time_to_leave(now));
        if leave {
            self.leave_cluster(sink);
        }
        self.ask_members(now);
    }

    /// This node was removed: its clients' connections close so that
    /// they reconnect to a member, and new ones are refused.
    fn leave_cluster(&mut self, sink: &mut dyn Sink) {
        let conns: Vec<ConnId> = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.root))
            .map(|(conn, _)| conn)
            .collect();
        crate::log_warn!(
            "cluster: this node was removed from the cluster; closing {} client connections",
            conns.len()
        );
        for conn in conns {
            sink.close(conn);
        }
    }

    fn answer_changes(&mut self, sink: &mut dyn Sink, view: &View, now: Instant) {
        self.go_on_moving(sink, now);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let leads = c.role == Role::Leader;
        for d in c.changes.done(view, now, leads) {
            let body = match d.error {
                None => crate::protocol::errors::ok_body(""),
                Some(why) => ApiError::new(Code::Unavailable, why).ack_body(),
            };
            send_ack(sink, d.conn, NSP_CONTROL, d.ack_id, &body);
        }
    }
}

impl Broker {
    /// Removals waiting for their node's replicas to move: asks for the
    /// moves not recorded yet, and proposes the removal once no stream
    /// is placed on the node.
    fn go_on_moving(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        for (tag, id, at) in c.changes.moving() {
            if !self.holds_replicas(id) {
                let Some(c) = self.cluster.as_mut() else {
                    return;
                };
                if c.role != Role::Leader {
                    // Leadership moved: the change is answered by its
                    // deadline, and may be asked again of the new leader.
                    continue;
                }
                c.changes.moved(tag, now);
                c.act(Action::Raft(ToRaft::Remove { tag, id }));
                continue;
            }
            if now >= at {
                self.move_replicas_off(sink, id);
                if let Some(c) = self.cluster.as_mut() {
                    c.changes.asked_moves(tag, now);
                }
            }
        }
    }
}

/// The configuration a view shows, as the core's type.
fn configuration(v: &View) -> crate::cluster::api::Membership {
    crate::cluster::api::Membership {
        members: v
            .members
            .iter()
            .map(|m| crate::cluster::api::Member {
                id: m.id,
                voter: m.voter,
                data: m.info.as_ref().map(MemberInfo::encode).unwrap_or_default(),
            })
            .collect(),
    }
}
