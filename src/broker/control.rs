//! The `/control` namespace: queue-group rules, server info and cluster
//! status for operators (answered by the monitor), membership changes
//! (`cluster.add`, `cluster.remove`, in `cluster/membership.rs`), and the node-to-node
//! events of peer nodes (`cluster.command`, `cluster.forward`), which need
//! the cluster token.

use serde_json::json;
use serde_json::value::RawValue;

use super::cluster::ChangeAck;
use super::events::{self, Route};
use super::monitor::cluster_status;
use super::session::NSP_CONTROL;
use super::Broker;
use crate::cluster::api::Cmd;
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
            Some(
                Route::ClusterCommand
                | Route::ClusterForward
                | Route::ClusterMembers
                | Route::ClusterCatchup
                | Route::ClusterPublish,
            ) if !peer => Err(ApiError::new(
                Code::Unauthorized,
                format!("{name} is for cluster members: it needs the cluster token"),
            )),
            Some(Route::ClusterMembers) => Ok(Some(self.cluster_members())),
            Some(Route::ClusterCommand) => self.cluster_command(conn, ack_id, arg),
            Some(Route::ClusterForward) => self.cluster_forward(sink, attachments),
            Some(Route::ClusterCatchup) => self.cluster_catchup(sink, conn, ack_id, arg),
            Some(Route::ClusterPublish) => {
                self.cluster_publish(sink, conn, ack_id, arg, attachments)
            }
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
            Some(Route::ServerInfo) => Ok(ok_with(self.server_info(sink))),
            Some(Route::ClusterStatus) => Ok(ok_with(cluster_status(&self.view()))),
            Some(Route::ClusterAdd) => return self.cluster_add(conn, ack_id, arg),
            Some(Route::ClusterRemove) => return self.cluster_remove(conn, ack_id, arg),
            _ => Err(events::unknown(NSP_CONTROL, name)),
        };
        answer.map(Some)
    }
}
