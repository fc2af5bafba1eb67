//! The `/control` namespace: queue-group rules, server info and cluster
//! status, for operators and (later) peer nodes.

use serde_json::json;
use serde_json::value::RawValue;

use super::groups::GroupMode;
use super::subs::Command;
use super::Broker;
use crate::net::Io;
use crate::protocol::errors::{ok_body, ok_with, ApiError, Code};
use crate::protocol::messages::{parse_arg, GroupSet};

impl Broker {
    /// Answers one `/control` event; the ack body as text.
    pub(crate) fn control_event(
        &mut self,
        io: &Io<'_>,
        name: &str,
        arg: Option<&RawValue>,
    ) -> Result<String, ApiError> {
        match name {
            "group.set" => {
                let req: GroupSet = parse_arg(arg)?;
                let mode = GroupMode::parse(&req.mode).ok_or_else(|| {
                    ApiError::new(
                        Code::BadRequest,
                        "mode must be \"loadbalance\" or \"broadcast\"",
                    )
                })?;
                super::subs::check_queue(&req.queue)?;
                self.subs.apply(Command::GroupSet {
                    queue: req.queue,
                    mode,
                })?;
                Ok(ok_body(""))
            }
            "group.list" => {
                let groups: Vec<_> = self
                    .subs
                    .groups
                    .list()
                    .map(|(q, m)| json!({"queue": q, "mode": m.as_str()}))
                    .collect();
                Ok(ok_with(json!({ "groups": groups })))
            }
            "server.info" => Ok(ok_with(json!({
                "node_id": self.cfg.node_id,
                "version": env!("CARGO_PKG_VERSION"),
                "uptime_ms": io.now().saturating_duration_since(self.started).as_millis() as u64,
                "connections": io.stats().sessions_open,
                "subscriptions": self.subs.len(),
                "streams": self.streams.len(),
            }))),
            "cluster.status" => Ok(ok_with(json!({
                // A single node is a cluster of one that leads itself.
                "node_id": self.cfg.node_id,
                "leader": self.cfg.node_id,
                "term": 0,
                "commit_index": 0,
                "peers": [{"id": self.cfg.node_id, "state": "leader", "match_index": 0}],
            }))),
            other => Err(ApiError::new(
                Code::BadRequest,
                format!("unknown event {other:?} on /control"),
            )),
        }
    }
}
