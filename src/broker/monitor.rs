//! The [`Monitor`]: the broker's observing side. It owns the traffic and
//! error counters, the per-second history and the start time, and answers
//! what reads them: the HTTP endpoints (`/healthz`, `/metrics`, and the
//! dashboard's `/` and `/api/info` in `dashboard.rs`), and `server.info`
//! and `cluster.status` on `/control`. What it shows of the other parts it
//! reads through a `View` the broker hands it for the one call.

use std::time::Instant;

use serde_json::{json, Value};

use super::access::Access;
use super::cluster::Cluster;
use super::history::{Counters, History};
use super::metrics::Metrics;
use super::streams::Streams;
use crate::cluster::api::{Fsm, Role};
use crate::port::{Request, Response, Sink};
use crate::protocol::errors::Code;

mod families;

/// What the monitor reads of the rest of the broker, borrowed for one call.
pub(crate) struct View<'a> {
    /// This node's id (`-node-id`).
    pub node_id: &'a str,
    /// `-control-token`, which the dashboard asks for.
    pub control_token: Option<&'a str>,
    /// The control state: subscriptions and the applied index.
    pub fsm: &'a Fsm,
    pub streams: &'a Streams,
    /// Set in cluster mode.
    pub cluster: Option<&'a Cluster>,
    pub access: &'a Access,
}

/// Counters, history and start time; see the module doc.
#[derive(Debug)]
pub struct Monitor {
    started: Instant,
    counters: Metrics,
    history: History,
}

impl Monitor {
    pub fn new(now: Instant) -> Monitor {
        Monitor {
            started: now,
            counters: Metrics::default(),
            history: History::new(now),
        }
    }

    /// One message of `size` payload bytes came in (publish or request).
    #[inline]
    pub fn count_in(&mut self, size: usize) {
        self.counters.msgs_in += 1;
        self.counters.bytes_in += size as u64;
    }

    /// One message of `size` payload bytes went to `sent` subscribers.
    #[inline]
    pub fn count_out(&mut self, sent: usize, size: usize) {
        self.counters.msgs_out += sent as u64;
        self.counters.bytes_out += (sent * size) as u64;
    }

    /// One `request` event.
    #[inline]
    pub fn count_request(&mut self) {
        self.counters.requests += 1;
    }

    /// One refusal with `code`.
    pub fn count_error(&mut self, code: Code) {
        self.counters.count_error(code);
    }

    /// Samples the traffic counters once a second (called every turn).
    pub fn sample(&mut self, now: Instant) {
        let m = &self.counters;
        self.history.sample(
            now,
            Counters {
                msgs_in: m.msgs_in,
                msgs_out: m.msgs_out,
                bytes_in: m.bytes_in,
                bytes_out: m.bytes_out,
            },
        );
    }

    /// When the next history sample is due.
    pub fn next_sample(&self) -> Instant {
        self.history.next_at()
    }

    pub(crate) fn counters(&self) -> &Metrics {
        &self.counters
    }

    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    /// Milliseconds since the broker started.
    pub(crate) fn uptime_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Answers the broker's HTTP requests: the dashboard, `/healthz` and
    /// `/metrics`; 404 for any other path.
    pub(crate) fn http(&self, view: &View<'_>, sink: &mut dyn Sink, req: &Request) -> Response {
        if let Some(r) = self.dashboard_http(view, sink, req) {
            return r;
        }
        let known = matches!(req.path.as_str(), "/healthz" | "/metrics");
        if known && req.method != "GET" && req.method != "HEAD" {
            let mut r = Response::json(405, r#"{"error":"method not allowed"}"#);
            r.headers.push(("Allow".into(), "GET".into()));
            return r;
        }
        match req.path.as_str() {
            "/healthz" => match view.cluster {
                Some(c) if c.not_serving().is_some() => Response::json(
                    503,
                    format!(r#"{{"status":"{}"}}"#, c.not_serving().unwrap_or_default()),
                ),
                Some(c) if c.leader().is_none() => Response::json(503, r#"{"status":"no leader"}"#),
                // Until then it does not know the cluster's subscriptions.
                Some(c) if !c.caught_up() => Response::json(503, r#"{"status":"catching up"}"#),
                _ => Response::json(200, r#"{"status":"ok"}"#),
            },
            "/metrics" => {
                let uptime = sink
                    .now()
                    .saturating_duration_since(self.started)
                    .as_secs_f64();
                let families = self.families(view);
                let mut body =
                    self.counters
                        .render_all(sink.stats(), view.fsm.subs.len(), uptime, &families);
                view.streams.render_metrics(&mut body);
                Response::new(200, "text/plain; version=0.0.4; charset=utf-8", body)
            }
            _ => Response::json(404, r#"{"error":"not found"}"#),
        }
    }

    /// `server.info`'s answer.
    pub(crate) fn server_info(&self, view: &View<'_>, sink: &dyn Sink) -> Value {
        let mut info = json!({
            "node_id": view.node_id,
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_ms": self.uptime_ms(sink.now()),
            "connections": sink.stats().sessions_open,
            "subscriptions": view.fsm.subs.len(),
            "streams": view.streams.len(),
        });
        if view.cluster.is_some() {
            info["cluster"] = cluster_status(view);
        }
        info
    }
}

/// `{node_id, leader, term, commit_index, applied_index, peers}`: a
/// single node is a cluster of one that leads itself.
pub(crate) fn cluster_status(view: &View<'_>) -> Value {
    let node_id = view.node_id;
    let Some(c) = view.cluster else {
        return json!({
            "node_id": node_id,
            "leader": node_id,
            "term": 0,
            "commit_index": 0,
            "applied_index": 0,
            "peers": [{"id": node_id, "state": "leader", "match_index": 0, "voter": true}],
        });
    };
    // Read fresh rather than the loop's copy (up to VIEW_EVERY old), so
    // that term and commit index are never older than the leader the
    // Raft thread has already reported.
    let raft = c.fresh_view();
    let leader = c.leader();
    let peers: Vec<Value> = c
        .node_ids()
        .map(|id| {
            let p = raft
                .as_ref()
                .and_then(|v| v.peers.iter().find(|p| p.id == id));
            let state = if id == c.me() {
                role_name(raft.as_ref().map_or(Role::Follower, |v| v.role))
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
                "reachable": id == c.me() || (c.reachable(id) && p.is_some_and(|p| p.heard)),
                "voter": c.is_voter(id),
            })
        })
        .collect();
    json!({
        "node_id": node_id,
        "leader": leader.and_then(|l| c.name_of(l)),
        "term": raft.as_ref().map_or(c.term(), |v| v.term),
        "commit_index": raft.as_ref().map_or(0, |v| v.commit),
        "applied_index": view.fsm.applied,
        "peers": peers,
    })
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Candidate | Role::PreCandidate => "candidate",
        Role::Follower => "follower",
    }
}
