//! Broker counters and their Prometheus text exposition for `/metrics`.
//!
//! Fixed counters render in [`Metrics::render`]; everything with labels or
//! owned by another part (per-stream figures, the Raft state) is a
//! [`Family`] built by `Monitor::families` (`monitor/families.rs`) from
//! the parts the broker lends it, so a new part adds its figures with a
//! few lines there.

use std::fmt::Write as _;

use crate::port::NetStats;
use crate::protocol::errors::Code;

/// One metric family: name, type, help and its samples (label set, value).
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    /// `(labels, value)`; labels as `[("stream", "ORDERS")]`.
    pub samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind: "gauge",
            help,
            samples: Vec::new(),
        }
    }

    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family {
            kind: "counter",
            ..Family::gauge(name, help)
        }
    }

    /// Adds a sample; returns the family for chaining.
    pub fn with(mut self, labels: Vec<(&'static str, String)>, value: f64) -> Family {
        self.samples.push((labels, value));
        self
    }

    /// The family in the text format; nothing when it has no samples.
    pub fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value) in &self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// A label value with `\`, `"` and newlines escaped, as the format requires.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub msgs_in: u64,
    pub bytes_in: u64,
    pub msgs_out: u64,
    pub bytes_out: u64,
    pub requests: u64,
    pub errors: [u64; Code::ALL.len()],
}

impl Metrics {
    pub fn count_error(&mut self, code: Code) {
        if let Some(i) = Code::ALL.iter().position(|c| *c == code) {
            self.errors[i] += 1;
        }
    }

    /// [`Metrics::render`] followed by `families`: the whole `/metrics`.
    pub fn render_all(
        &self,
        net: &NetStats,
        subscriptions: usize,
        uptime_s: f64,
        families: &[Family],
    ) -> String {
        let mut out = self.render(net, subscriptions, uptime_s);
        for f in families {
            f.render(&mut out);
        }
        out
    }

    /// The text format (version 0.0.4) with HELP and TYPE lines.
    pub fn render(&self, net: &NetStats, subscriptions: usize, uptime_s: f64) -> String {
        let mut out = String::with_capacity(2048);
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        metric(
            "gombus_uptime_seconds",
            "gauge",
            "Seconds since the broker started.",
            format!("{uptime_s:.3}"),
        );
        metric(
            "gombus_connections",
            "gauge",
            "Open TCP connections.",
            net.connections_open.to_string(),
        );
        metric(
            "gombus_sessions",
            "gauge",
            "Open Engine.IO sessions.",
            net.sessions_open.to_string(),
        );
        metric(
            "gombus_polling_sessions",
            "gauge",
            "Open Engine.IO sessions on HTTP long-polling.",
            net.polling_sessions.to_string(),
        );
        metric(
            "gombus_connections_total",
            "counter",
            "TCP connections accepted.",
            net.connections_total.to_string(),
        );
        metric(
            "gombus_subscriptions",
            "gauge",
            "Active subscriptions.",
            subscriptions.to_string(),
        );
        metric(
            "gombus_messages_in_total",
            "counter",
            "Messages published.",
            self.msgs_in.to_string(),
        );
        metric(
            "gombus_bytes_in_total",
            "counter",
            "Payload bytes published.",
            self.bytes_in.to_string(),
        );
        metric(
            "gombus_messages_out_total",
            "counter",
            "Messages delivered to subscribers.",
            self.msgs_out.to_string(),
        );
        metric(
            "gombus_bytes_out_total",
            "counter",
            "Payload bytes delivered to subscribers.",
            self.bytes_out.to_string(),
        );
        metric(
            "gombus_requests_total",
            "counter",
            "Requests made with the request event.",
            self.requests.to_string(),
        );
        metric(
            "gombus_slow_consumers_total",
            "counter",
            "Connections closed for exceeding -max-pending.",
            net.slow_consumers.to_string(),
        );
        metric(
            "gombus_socket_bytes_in_total",
            "counter",
            "Bytes read from sockets.",
            net.bytes_in.to_string(),
        );
        metric(
            "gombus_socket_bytes_out_total",
            "counter",
            "Bytes written to sockets.",
            net.bytes_out.to_string(),
        );
        let _ = writeln!(out, "# HELP gombus_errors_total Requests refused, by error code.\n# TYPE gombus_errors_total counter");
        for (code, n) in Code::ALL.iter().zip(self.errors.iter()) {
            let _ = writeln!(out, "gombus_errors_total{{code=\"{}\"}} {n}", code.as_str());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_has_help_and_type() {
        let mut m = Metrics::default();
        m.count_error(Code::Timeout);
        let fam = Family::gauge("gombus_stream_messages", "Messages stored.")
            .with(vec![("stream", "a\"b\\c\nd".to_string())], 5.0);
        let text = m.render_all(&NetStats::default(), 3, 1.5, &[fam]);
        assert!(
            text.contains("gombus_stream_messages{stream=\"a\\\"b\\\\c\\nd\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("gombus_subscriptions 3\n"));
        assert!(text.contains("gombus_errors_total{code=\"timeout\"} 1\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
    }
}
