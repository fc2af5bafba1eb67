//! The built-in dashboard: `GET /` serves one self-contained page
//! (`dashboard/index.html`, compiled in: HTML, CSS and a little JS, no
//! CDN) that polls `GET /api/info`, the JSON overview the CLI can read
//! too. With `-control-token` set both need the token, as
//! `Authorization: Bearer TOKEN` or `?token=TOKEN`.

use serde_json::{json, Map, Value};

use super::monitor::{cluster_status, Monitor, View};
use super::streams::StreamSummary;
use crate::crypto::token_eq;
use crate::port::{Request, Response, Sink};
use crate::protocol::errors::Code;

/// The page, compiled into the binary.
const PAGE: &str = include_str!("dashboard/index.html");

impl Monitor {
    /// Answers `/`, `/index.html` and `/api/info`; `None` for other paths.
    pub(crate) fn dashboard_http(
        &self,
        view: &View<'_>,
        sink: &mut dyn Sink,
        req: &Request,
    ) -> Option<Response> {
        let page = matches!(req.path.as_str(), "/" | "/index.html");
        if !page && req.path != "/api/info" {
            return None;
        }
        if req.method != "GET" && req.method != "HEAD" {
            let mut r = Response::json(405, r#"{"error":"method not allowed"}"#);
            r.headers.push(("Allow".into(), "GET".into()));
            return Some(r);
        }
        if !dashboard_authorized(view, req) {
            let mut r = Response::json(
                401,
                r#"{"error":"unauthorized: give the control token as Authorization: Bearer TOKEN or ?token=TOKEN"}"#,
            );
            r.headers
                .push(("WWW-Authenticate".into(), "Bearer realm=\"gombus\"".into()));
            return Some(r);
        }
        let mut r = if page {
            Response::new(200, "text/html; charset=utf-8", PAGE)
        } else {
            Response::json(200, self.api_info(view, sink).to_string())
        };
        r.headers.push(("Cache-Control".into(), "no-store".into()));
        Some(r)
    }

    /// The overview behind the dashboard, as JSON.
    pub(crate) fn api_info(&self, view: &View<'_>, sink: &mut dyn Sink) -> Value {
        let streams: Vec<Value> = view.streams.overview().iter().map(stream_view).collect();
        let net = sink.stats();
        let now = self.history().current();
        let history: Vec<Value> = self
            .history()
            .rates()
            .map(|r| json!([r.at_ms, r.msgs_in, r.msgs_out, r.bytes_in, r.bytes_out]))
            .collect();
        let mut errors = Map::new();
        let m = self.counters();
        for (code, n) in Code::ALL.iter().zip(m.errors.iter()) {
            errors.insert(code.as_str().to_string(), json!(n));
        }
        json!({
            "node_id": view.node_id,
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_ms": self.uptime_ms(sink.now()),
            "connections": net.sessions_open,
            "tcp_connections": net.connections_open,
            "connections_total": net.connections_total,
            "subscriptions": view.fsm.subs.len(),
            "slow_consumers": net.slow_consumers,
            "messages": {"in": m.msgs_in, "out": m.msgs_out},
            "bytes": {"in": m.bytes_in, "out": m.bytes_out},
            "requests": m.requests,
            "errors": errors,
            "rates": {
                "msgs_in": now.msgs_in,
                "msgs_out": now.msgs_out,
                "bytes_in": now.bytes_in,
                "bytes_out": now.bytes_out,
            },
            "history": {
                "columns": ["at_ms", "msgs_in", "msgs_out", "bytes_in", "bytes_out"],
                "rows": history,
            },
            "streams": streams,
            // A single node has no cluster section.
            "cluster": if view.cluster.is_some() {
                cluster_status(view)
            } else {
                Value::Null
            },
        })
    }
}

fn dashboard_authorized(view: &View<'_>, req: &Request) -> bool {
    let Some(expected) = view.control_token else {
        return true;
    };
    let bearer = req
        .header("authorization")
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let given = bearer.or_else(|| req.query_param("token").map(percent_decode));
    given.is_some_and(|g| token_eq(g.as_bytes(), expected.as_bytes()))
}

/// One stream of `/api/info`'s `streams`: its state and its consumers'
/// counts, from [`Streams::overview`](super::streams::Streams::overview)
/// (the same figures `stream.list` and `consumer.list` report).
fn stream_view(s: &StreamSummary) -> Value {
    let consumers: Vec<Value> = s
        .consumers
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "num_pending": c.num_pending,
                "num_ack_pending": c.num_ack_pending,
                "num_redelivered": c.num_redelivered,
            })
        })
        .collect();
    json!({
        "name": s.name,
        "subjects": s.subjects,
        "messages": s.state.messages,
        "bytes": s.state.bytes,
        "first_seq": s.state.first_seq,
        "last_seq": s.state.last_seq,
        "consumers": consumers,
    })
}

/// Decodes `%XX` escapes and `+` in a query value.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_tokens_are_decoded() {
        assert_eq!(percent_decode("a%2Fb%3D"), "a/b=");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
        assert_eq!(percent_decode("end%4"), "end%4");
        assert_eq!(percent_decode("x+y"), "x y");
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(PAGE.contains("/api/info"));
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"));
        assert!(!PAGE.contains("<script src"));
    }
}
