//! `/metrics` read by a strict Prometheus text-format parser
//! (prometheus_client's, in .venv; scripts/test-deps.sh installs it), with
//! counters that move after traffic and the labelled families present.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Broker;
use gombus::client::Client;
use serde_json::{json, Value};

fn python() -> String {
    let py = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    assert!(
        std::path::Path::new(py).exists(),
        "{py} is missing: run scripts/test-deps.sh (installs prometheus_client)"
    );
    py.to_string()
}

fn get(addr: &str, path: &str) -> String {
    common::http_exchange(addr, path).expect("GET")
}

/// The exposition parsed strictly: `name{labels}` -> value.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let resp = get(addr, "/metrics");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let mut child = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/metrics/check_metrics.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused /metrics: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut samples = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        let mut labels: Vec<(String, String)> = s["labels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        labels.sort();
        let key = if labels.is_empty() {
            s["name"].as_str().unwrap().to_string()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{}{{{}}}", s["name"].as_str().unwrap(), l.join(","))
        };
        samples.insert(key, s["value"].as_f64().unwrap());
    }
    samples
}

fn val(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("no sample {key}; have {:?}", m.keys()))
}

#[test]
fn metrics_parse_strictly_and_counters_move() {
    let b = Broker::start(&[]);
    let before = scrape(&b.addr);
    for name in [
        "gombus_messages_in_total",
        "gombus_messages_out_total",
        "gombus_bytes_in_total",
        "gombus_bytes_out_total",
        "gombus_slow_consumers_total",
        "gombus_connections",
        "gombus_subscriptions",
        "gombus_raft_term",
        "gombus_raft_commit_index",
        "gombus_raft_applied_index",
        "gombus_raft_leader",
        "gombus_errors_total{code=no_responders}",
        "gombus_raft_peer_reachable{peer=test}",
    ] {
        val(&before, name);
    }
    assert_eq!(val(&before, "gombus_info{node_id=test,version=0.1.0}"), 1.0);
    assert_eq!(val(&before, "gombus_raft_leader"), 1.0);
    assert_eq!(val(&before, "gombus_subscriptions"), 0.0);

    let c = Client::connect(&b.addr).unwrap();
    let sub = c.subscribe("m.>").unwrap();
    for i in 0..50 {
        c.publish("m.x", json!({"i": i})).unwrap();
    }
    for _ in 0..50 {
        sub.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    let err = c
        .request("nobody.home", 1, Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(err.code(), Some("no_responders"));

    // A stream with five messages and a consumer that took two, acked one.
    c.call(
        "stream.create",
        json!({"name": "M", "subjects": ["stored.>"]}),
    )
    .unwrap();
    for i in 0..5 {
        c.publish_acked("stored.x", json!(i)).unwrap();
    }
    c.call("consumer.create", json!({"stream": "M", "name": "c"}))
        .unwrap();
    let got = c
        .call(
            "consumer.fetch",
            json!({"stream": "M", "consumer": "c", "batch": 2}),
        )
        .unwrap();
    assert_eq!(got["messages"].as_array().unwrap().len(), 2);
    c.call("ack", json!({"stream": "M", "consumer": "c", "seq": 1}))
        .unwrap();

    let after = scrape(&b.addr);
    assert_eq!(val(&before, "gombus_streams"), 0.0);
    assert_eq!(val(&after, "gombus_streams"), 1.0);
    assert_eq!(val(&after, "gombus_stream_messages{stream=M}"), 5.0);
    assert!(val(&after, "gombus_stream_bytes{stream=M}") >= 5.0);
    assert_eq!(val(&after, "gombus_stream_last_seq{stream=M}"), 5.0);
    assert_eq!(val(&after, "gombus_stream_consumers{stream=M}"), 1.0);
    assert_eq!(
        val(&after, "gombus_consumer_pending{consumer=c,stream=M}"),
        3.0
    );
    assert_eq!(
        val(&after, "gombus_consumer_ack_pending{consumer=c,stream=M}"),
        1.0
    );
    assert_eq!(
        val(&after, "gombus_consumer_redelivered{consumer=c,stream=M}"),
        0.0
    );
    let moved = |k: &str| val(&after, k) - val(&before, k);
    // 50 plain publishes and 5 into the stream.
    assert_eq!(moved("gombus_messages_in_total"), 55.0);
    assert_eq!(moved("gombus_messages_out_total"), 50.0);
    assert!(moved("gombus_bytes_in_total") >= 50.0 * 7.0);
    assert!(moved("gombus_bytes_out_total") >= 50.0 * 7.0);
    assert!(moved("gombus_socket_bytes_in_total") > 0.0);
    assert_eq!(moved("gombus_errors_total{code=no_responders}"), 1.0);
    assert_eq!(val(&after, "gombus_subscriptions"), 1.0);
    assert!(val(&after, "gombus_connections") >= 1.0);
    assert!(val(&after, "gombus_uptime_seconds") >= val(&before, "gombus_uptime_seconds"));
}
