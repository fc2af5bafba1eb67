//! The `/control` namespace: queue-group rules, server info and cluster
//! status for operators, and the node-to-node events of peer nodes
//! (`cluster.command`, `cluster.forward`), which need the cluster token.

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::cluster::ChangeAck;
use super::events::{self, Route};
use super::session::NSP_CONTROL;
use super::Broker;
use crate::cluster::fsm::Cmd;
use crate::cluster::raft::Role;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ok_body, ok_with, ApiError, Code};
use crate::protocol::messages::{parse_arg, GroupSet};
use crate::routing::groups::GroupMode;
use crate::routing::subs::Command;

impl Broker {
    /// Answers one `/control` event: the ack body as text, or `None` when
    /// the ack is sent later (a change waiting for the cluster).
    pub(crate) fn control_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        name: &str,
        arg: Option<&RawValue>,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        let peer = self
            .sessions
            .get(conn)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.peer);
        let route = events::find(NSP_CONTROL, name).map(|e| e.route);
        match route {
            // Node-to-node events: only for connections that presented
            // the cluster token (docs/PROTOCOL.md, "Node-to-node trust").
            Some(Route::ClusterCommand | Route::ClusterForward) if !peer => Err(ApiError::new(
                Code::Unauthorized,
                format!("{name} is for cluster members: it needs the cluster token"),
            )),
            Some(Route::ClusterCommand) => self.cluster_command(conn, ack_id, arg),
            Some(Route::ClusterForward) => self.cluster_forward(sink, attachments),
            other => self.control_query(sink, conn, ack_id, other, name, arg),
        }
    }

    fn control_query(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        route: Option<Route>,
        name: &str,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let answer = match route {
            Some(Route::GroupSet) => {
                let req: GroupSet = parse_arg(arg)?;
                let mode = GroupMode::parse(&req.mode).ok_or_else(|| {
                    ApiError::new(
                        Code::BadRequest,
                        "mode must be \"loadbalance\" or \"broadcast\"",
                    )
                })?;
                crate::routing::subs::check_queue(&req.queue)?;
                let cmd = Cmd::Subs(Command::GroupSet {
                    queue: req.queue,
                    mode,
                });
                let reply = ack_id.map(|ack_id| ChangeAck {
                    conn,
                    nsp: NSP_CONTROL,
                    ack_id,
                    ok_body: ok_body(""),
                });
                return self.submit(sink, cmd, reply);
            }
            Some(Route::GroupList) => {
                let groups: Vec<_> = self
                    .fsm
                    .subs
                    .groups
                    .list()
                    .map(|(q, m)| json!({"queue": q, "mode": m.as_str()}))
                    .collect();
                Ok(ok_with(json!({ "groups": groups })))
            }
            Some(Route::ServerInfo) => {
                let mut info = json!({
                    "node_id": self.cfg.node_id,
                    "version": env!("CARGO_PKG_VERSION"),
                    "uptime_ms": sink.now().saturating_duration_since(self.started).as_millis() as u64,
                    "connections": sink.stats().sessions_open,
                    "subscriptions": self.fsm.subs.len(),
                    "streams": self.streams.len(),
                });
                if self.cluster.is_some() {
                    info["cluster"] = self.cluster_status();
                }
                Ok(ok_with(info))
            }
            Some(Route::ClusterStatus) => Ok(ok_with(self.cluster_status())),
            _ => Err(events::unknown(NSP_CONTROL, name)),
        };
        answer.map(Some)
    }

    /// `{node_id, leader, term, commit_index, applied_index, peers}`: a
    /// single node is a cluster of one that leads itself.
    pub(crate) fn cluster_status(&self) -> Value {
        let Some(c) = &self.cluster else {
            return json!({
                "node_id": self.cfg.node_id,
                "leader": self.cfg.node_id,
                "term": 0,
                "commit_index": 0,
                "applied_index": 0,
                "peers": [{"id": self.cfg.node_id, "state": "leader", "match_index": 0}],
            });
        };
        // Read fresh rather than the loop's copy (up to VIEW_EVERY old), so
        // that term and commit index are never older than the leader the
        // Raft thread has already reported.
        let view = c.fresh_view();
        let leader = c.leader();
        let peers: Vec<Value> = (1..=c.names.len() as u64)
            .map(|id| {
                let p = view
                    .as_ref()
                    .and_then(|v| v.peers.iter().find(|p| p.id == id));
                let state = if id == c.me {
                    role_name(view.as_ref().map_or(Role::Follower, |v| v.role))
                } else if leader == Some(id) {
                    "leader"
                } else if !c.reachable(id) || !p.is_some_and(|p| p.heard) {
                    "unreachable"
                } else {
                    "follower"
                };
                json!({
                    "id": c.name_of(id),
                    "state": state,
                    "match_index": p.and_then(|p| p.match_index).unwrap_or(0),
                    "reachable": id == c.me || (c.reachable(id) && p.is_some_and(|p| p.heard)),
                })
            })
            .collect();
        json!({
            "node_id": self.cfg.node_id,
            "leader": leader.and_then(|l| c.name_of(l)),
            "term": view.as_ref().map_or(c.term(), |v| v.term),
            "commit_index": view.as_ref().map_or(0, |v| v.commit),
            "applied_index": self.fsm.applied,
            "peers": peers,
        })
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Candidate | Role::PreCandidate => "candidate",
        Role::Follower => "follower",
    }
}
