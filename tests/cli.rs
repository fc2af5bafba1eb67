//! The `gombus` binary against a real broker: pub/sub, req/reply, server
//! and cluster commands, `--json` output parsed and checked, benchmarks,
//! and bad arguments or failures exiting non-zero with a message.
//!
//! Stream and consumer commands run against the broker's streams.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use serde_json::{json, Value};

const RUN_LIMIT: Duration = Duration::from_secs(30);

fn gombus() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gombus"));
    // The tests say everything on the command line.
    c.env_remove("GOMBUS_URL")
        .env_remove("GOMBUS_TOKEN")
        .env_remove("GOMBUS_CONTROL_TOKEN");
    c
}

/// Starts `gombus ARGS` with no stdin and both outputs piped.
fn spawn(args: &[&str]) -> Child {
    gombus()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads `from` to its end on a thread of its own.
fn read_all(mut from: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut s = Vec::new();
        let _ = from.read_to_end(&mut s);
        s
    })
}

/// Runs `gombus ARGS` to completion (bounded) and returns its output.
fn run(args: &[&str]) -> Output {
    let mut child = spawn(args);
    let out_t = read_all(child.stdout.take().unwrap());
    let err_t = read_all(child.stderr.take().unwrap());
    let status = wait_bounded(&mut child, RUN_LIMIT)
        .unwrap_or_else(|| panic!("gombus {args:?} still running after {RUN_LIMIT:?}"));
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs and expects success; returns stdout.
fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "gombus {args:?} failed ({:?}):\n{}",
        o.status,
        stderr(&o)
    );
    stdout(&o)
}

/// A long-running `gombus` (sub, reply), killed on drop, with its stderr
/// lines forwarded so the test can wait for "subscribed".
struct Background {
    child: Child,
    err_lines: mpsc::Receiver<String>,
}

impl Background {
    fn start(args: &[&str], ready: &str) -> Background {
        let mut child = spawn(args);
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let bg = Background {
            child,
            err_lines: rx,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match bg.err_lines.recv_timeout(left) {
                Ok(line) if line.contains(ready) => return bg,
                Ok(_) => {}
                Err(e) => panic!("gombus {args:?} never printed {ready:?}: {e}"),
            }
        }
    }

    /// Waits (bounded) for the process to end; its status and stdout.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let mut out = self.child.stdout.take().unwrap();
        let status = wait_bounded(&mut self.child, RUN_LIMIT).expect("background gombus hung");
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        (status, s)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gombus kv`: a bucket, a put, a stale compare-and-set refused, a get,
/// the keys, and a watch printing the latest value then new writes.
#[test]
fn kv_commands_and_a_watch() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    ok(&["-s", s, "kv", "add", "cfg", "--history", "3"]);
    let put: Value = serde_json::from_str(
        ok(&["-s", s, "kv", "put", "cfg", "a.b", r#"{"x":1}"#, "--json"]).trim(),
    )
    .unwrap();
    let rev = put["revision"].as_u64().unwrap();
    let stale = run(&["-s", s, "kv", "put", "cfg", "a.b", "2", "--revision", "99"]);
    assert_eq!(stale.status.code(), Some(1));
    assert!(
        stderr(&stale).contains("wrong_revision"),
        "{}",
        stderr(&stale)
    );
    let got: Value =
        serde_json::from_str(&ok(&["-s", s, "kv", "get", "cfg", "a.b", "--json"])).unwrap();
    assert_eq!(got[0]["value"], json!({"x": 1}));
    assert_eq!(got[0]["revision"], rev);
    assert_eq!(ok(&["-s", s, "kv", "keys", "cfg"]).trim(), "a.b");
    let watch = Background::start(
        &["-s", s, "kv", "watch", "cfg", "--count", "2", "--json"],
        "watching cfg",
    );
    ok(&["-s", s, "kv", "put", "cfg", "a.c", "3"]);
    ok(&["-s", s, "kv", "del", "cfg", "a.b"]);
    let (status, out) = watch.finish();
    assert!(status.success());
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["key"].as_str().unwrap(), l["op"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        vec![("a.b", "put"), ("a.c", "put"), ("a.b", "delete")],
        "{out}"
    );
}

#[test]
fn pub_sub_round_trip_as_json_lines() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let sub = Background::start(
        &["-s", s, "sub", "orders.>", "--count", "3", "--json"],
        "subscribed to orders.>",
    );
    let out = ok(&[
        "-s",
        s,
        "pub",
        "orders.new",
        r#"{"id":7}"#,
        "--header",
        "trace:abc",
        "--json",
    ]);
    let ack: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ack["published"], 1);
    assert_eq!(ack["subject"], "orders.new");
    ok(&["-s", s, "pub", "orders.bulk", "item {{n}}", "--count", "2"]);
    let (status, out) = sub.finish();
    assert!(status.success());
    let msgs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(msgs.len(), 3, "{out}");
    assert_eq!(msgs[0]["subject"], "orders.new");
    assert_eq!(msgs[0]["data"], json!({"id": 7}));
    assert_eq!(msgs[0]["headers"], json!({"trace": "abc"}));
    assert_eq!(msgs[1]["data"], "item 1");
    assert_eq!(msgs[2]["data"], "item 2");
}

#[test]
fn sub_prints_text_lines_and_queue_groups_share() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let plain = Background::start(
        &["-s", s, "sub", "t.*", "--count", "1"],
        "subscribed to t.*",
    );
    ok(&["-s", s, "pub", "t.x", "hello"]);
    let (status, out) = plain.finish();
    assert!(status.success());
    assert_eq!(out.trim(), "[#1] t.x hello");

    let q1 = Background::start(
        &[
            "-s", s, "sub", "work", "--queue", "w", "--count", "2", "--json",
        ],
        "queue w",
    );
    let q2 = Background::start(
        &[
            "-s", s, "sub", "work", "--queue", "w", "--count", "2", "--json",
        ],
        "queue w",
    );
    ok(&["-s", s, "pub", "work", "job {{n}}", "--count", "4"]);
    let (s1, o1) = q1.finish();
    let (s2, o2) = q2.finish();
    assert!(s1.success() && s2.success());
    let mut jobs: Vec<String> = o1
        .lines()
        .chain(o2.lines())
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["data"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    jobs.sort();
    assert_eq!(jobs, ["job 1", "job 2", "job 3", "job 4"]);
}

#[test]
fn req_reply_round_trip() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let responder = Background::start(
        &[
            "-s",
            s,
            "reply",
            "svc.time",
            r#"{"now":123}"#,
            "--count",
            "2",
            "--json",
        ],
        "answering requests on svc.time",
    );
    let out = ok(&["-s", s, "req", "svc.time", "what time", "--json"]);
    let reply: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(reply["data"], json!({"now": 123}));
    assert!(reply["took_ms"].as_f64().unwrap() >= 0.0);
    let out = ok(&["-s", s, "req", "svc.time", "again"]);
    assert_eq!(out.trim(), r#"{"now":123}"#);
    let (status, out) = responder.finish();
    assert!(status.success());
    let seen: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen[0]["data"], "what time");
    assert!(seen[0]["reply"].as_str().unwrap().starts_with("_INBOX."));
    assert_eq!(seen[1]["data"], "again");

    // Nobody listening: the broker's no_responders, exit 1.
    let o = run(&["-s", s, "req", "svc.none", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no_responders"), "{}", stderr(&o));
}

#[test]
fn server_info_and_cluster_status_with_control_token() {
    let b = Broker::start(&["-control-token=ctl-secret"]);
    let s = b.addr.as_str();
    let out = ok(&[
        "-s",
        s,
        "--control-token",
        "ctl-secret",
        "server",
        "info",
        "--json",
    ]);
    let info: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["node_id"], "test");
    assert!(info["connections"].as_u64().unwrap() >= 1);
    assert!(info["uptime_ms"].is_u64());
    assert!(info.get("ok").is_none());

    let text = ok(&["-s", s, "--control-token", "ctl-secret", "server", "info"]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("node_id:") && l.ends_with("test")),
        "{text}"
    );

    let out = ok(&[
        "-s",
        s,
        "cluster",
        "status",
        "--json",
        "--control-token=ctl-secret",
    ]);
    let st: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["leader"], "test");
    assert_eq!(st["peers"][0]["id"], "test");

    // The token from the environment works too; a wrong one is refused.
    let o = gombus()
        .args(["-s", s, "server", "info", "--json"])
        .env("GOMBUS_CONTROL_TOKEN", "ctl-secret")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["-s", s, "--control-token", "wrong", "server", "info"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unauthorized"), "{}", stderr(&o));
}

#[test]
fn second_server_is_tried_when_the_first_is_down() {
    let b = Broker::start(&[]);
    // Nothing listens there once the probe let it go.
    let dead = format!("127.0.0.1:{}", common::free_port());
    let both = format!("{dead},{}", b.addr);
    let out = ok(&["-s", &both, "pub", "a", "1", "--json"]);
    assert!(out.contains("\"published\":1"), "{out}");
    let o = run(&["-s", &dead, "pub", "a", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for (args, needle) in [
        (&[][..], "no command"),
        (&["frobnicate"][..], "unknown command"),
        (&["pub", "only.subject"][..], "missing arguments"),
        (&["sub", "a", "b"][..], "unexpected argument"),
        (&["sub", "a", "--bogus"][..], "bogus"),
        (&["pub", "a", "1", "--count", "lots"][..], "--count"),
        (&["pub", "a", "1", "--header", "novalue"][..], "--header"),
        (&["req", "a", "1", "--timeout", "soon"][..], "--timeout"),
        (&["stream", "explode"][..], "unknown stream subcommand"),
        (&["stream", "add", "S"][..], "--subjects is required"),
        (
            &[
                "stream",
                "add",
                "S",
                "--subjects",
                "a",
                "--retention",
                "forever",
            ][..],
            "--retention",
        ),
        (&["stream", "get", "S"][..], "--seq N or --last"),
        (
            &["consumer", "add", "S", "C", "--ack", "maybe"][..],
            "--ack",
        ),
        (&["bench", "warp"][..], "unknown workload"),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("--help"), "{args:?}: {err}");
    }
}

#[test]
fn help_for_every_command() {
    let top = ok(&["--help"]);
    for cmd in [
        "pub",
        "sub",
        "req",
        "reply",
        "stream add",
        "consumer next",
        "server info",
        "cluster status",
        "bench",
    ] {
        assert!(top.contains(cmd), "{cmd}");
        let mut args: Vec<&str> = cmd.split(' ').collect();
        args.push("--help");
        let text = ok(&args);
        assert!(text.starts_with(&format!("Usage: gombus {cmd}")), "{text}");
    }
    assert!(ok(&["stream"]).contains("Subcommands:"));
}

/// Parses `gombus … --json` output that must succeed.
fn ok_json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
fn stream_and_consumer_commands() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let created = ok_json(&[
        "-s",
        s,
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--max-msgs",
        "100",
        "--max-msgs-per-subject",
        "5",
        "--max-age",
        "1h",
        "--json",
    ]);
    assert_eq!(created["stream"]["config"]["name"], "ORDERS");
    assert_eq!(created["stream"]["config"]["max_msgs"], 100);
    assert_eq!(created["stream"]["config"]["max_msgs_per_subject"], 5);
    assert_eq!(created["stream"]["config"]["max_age_ms"], 3_600_000);
    // A different config under the same name: the broker's `exists`.
    let o = run(&["-s", s, "stream", "add", "ORDERS", "--subjects", "other"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("exists"), "{}", stderr(&o));

    let ack = ok_json(&["-s", s, "pub", "orders.new", r#"{"id":1}"#, "--json"]);
    assert_eq!(
        (ack["stream"].as_str(), ack["seq"].as_u64()),
        (Some("ORDERS"), Some(1))
    );
    let text = ok(&["-s", s, "pub", "orders.new", "second"]);
    assert_eq!(
        text.trim(),
        "published message to orders.new (stream ORDERS seq 2)"
    );

    let list = ok_json(&["-s", s, "stream", "ls", "--json"]);
    assert_eq!(list["streams"].as_array().unwrap().len(), 1);
    let table = ok(&["-s", s, "stream", "ls"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("ORDERS"))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>()[..3],
        ["ORDERS", "orders.>", "2"]
    );
    let info = ok_json(&["-s", s, "stream", "info", "ORDERS", "--json"]);
    assert_eq!(info["stream"]["state"]["messages"], 2);
    assert_eq!(info["stream"]["state"]["last_seq"], 2);
    let got = ok_json(&["-s", s, "stream", "get", "ORDERS", "--seq", "1", "--json"]);
    assert_eq!(got["message"]["data"], json!({"id": 1}));
    let last = ok_json(&[
        "-s",
        s,
        "stream",
        "get",
        "ORDERS",
        "--last",
        "orders.new",
        "--json",
    ]);
    assert_eq!(last["message"]["seq"], 2);
    assert_eq!(last["message"]["data"], "second");

    let c = ok_json(&[
        "-s", s, "consumer", "add", "ORDERS", "worker", "--ack", "explicit", "--json",
    ]);
    assert_eq!(c["consumer"]["name"], "worker");
    let cl = ok_json(&["-s", s, "consumer", "ls", "ORDERS", "--json"]);
    assert_eq!(cl["consumers"].as_array().unwrap().len(), 1);
    let fetched = ok(&[
        "-s", s, "consumer", "next", "ORDERS", "worker", "--count", "2", "--json",
    ]);
    let msgs: Vec<Value> = fetched
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(msgs.len(), 2, "{fetched}");
    assert_eq!(
        (msgs[0]["seq"].as_u64(), msgs[1]["seq"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(msgs[0]["data"], json!({"id": 1}));
    // Both were acked: nothing pending, the ack floor at 2.
    let ci = ok_json(&["-s", s, "consumer", "info", "ORDERS", "worker", "--json"]);
    assert_eq!(ci["consumer"]["num_pending"], 0);
    assert_eq!(ci["consumer"]["num_ack_pending"], 0);
    assert_eq!(ci["consumer"]["ack_floor"]["stream_seq"], 2);
    let o = run(&["-s", s, "consumer", "next", "ORDERS", "worker", "--no-wait"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no message"), "{}", stderr(&o));

    let purged = ok_json(&["-s", s, "stream", "purge", "ORDERS", "--json"]);
    assert_eq!(purged["purged"], 2);
    assert!(
        ok(&["-s", s, "consumer", "rm", "ORDERS", "worker"]).contains("deleted consumer worker")
    );
    assert!(ok(&["-s", s, "stream", "rm", "ORDERS"]).contains("deleted stream ORDERS"));
    let o = run(&["-s", s, "stream", "info", "ORDERS"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not_found"), "{}", stderr(&o));
    assert_eq!(ok(&["-s", s, "stream", "ls"]).trim(), "no streams");
}

#[test]
fn bench_stream_publishes_acked_into_a_stream_it_removes_after() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let r = ok_json(&["-s", s, "bench", "stream", "--msgs", "300", "--json"]);
    assert_eq!(r["rows"][0]["role"], "publish (acked)");
    assert_eq!(r["rows"][0]["msgs"], 300);
    assert!(r["rows"][0]["latency_us"]["p50"].as_u64().is_some());
    let list = ok_json(&["-s", s, "stream", "ls", "--json"]);
    assert_eq!(list["streams"], json!([]));
}

#[test]
fn bench_stream_pipelines_acked_publishes_within_its_window() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let r = ok_json(&[
        "-s", s, "bench", "stream", "--msgs", "2000", "--window", "64", "--json",
    ]);
    assert_eq!(
        (r["msgs"].as_u64(), r["window"].as_u64()),
        (Some(2000), Some(64))
    );
    let row = &r["rows"][0];
    assert_eq!(row["role"], "publish (acked)");
    assert_eq!(
        (row["msgs"].as_u64(), row["acked"].as_u64()),
        (Some(2000), Some(2000))
    );
    let lat = &row["latency_us"];
    assert!(lat["p50"].as_u64().unwrap() <= lat["max"].as_u64().unwrap());
    let o = run(&["-s", s, "bench", "stream", "--window", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--window"), "{}", stderr(&o));
}

#[test]
fn bench_workloads_report_as_json() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    for (workload, extra, received) in [
        ("pub", &["--acked"][..], None),
        ("fanout", &["--subs", "3"][..], Some(3 * 500)),
        ("queue", &["--subs", "3", "--pubs", "2"][..], Some(500)),
        ("reqrep", &["--subs", "2"][..], None),
    ] {
        let mut args = vec![
            "-s", s, "bench", workload, "--msgs", "500", "--size", "64", "--json",
        ];
        args.extend_from_slice(extra);
        let out = ok(&args);
        let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(r["workload"], workload);
        let rows = r["rows"].as_array().unwrap();
        assert_eq!(rows[0]["msgs"], 500, "{workload}");
        assert!(rows[0]["msgs_per_sec"].as_f64().unwrap() > 0.0);
        match received {
            Some(n) => {
                assert_eq!(rows[1]["role"], "receive");
                assert_eq!(rows[1]["msgs"], n, "{workload}");
                assert!(rows[1]["latency_us"]["p99"].as_u64().is_some());
            }
            None => {
                // Acked publishes and requests: round-trip latencies.
                let lat = &rows[0]["latency_us"];
                assert!(lat["p50"].as_u64().unwrap() <= lat["p99"].as_u64().unwrap());
                assert!(lat["p99"].as_u64().unwrap() <= lat["max"].as_u64().unwrap());
            }
        }
    }
    let table = ok(&["-s", s, "bench", "sub", "--msgs", "200"]);
    assert!(
        table.contains("MSGS/S") && table.contains("P99 us"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("receive") && l.contains("200")),
        "{table}"
    );
}

#[test]
fn bench_subscribe_times_each_sub_and_unsub_and_leaves_none_behind() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let r = ok_json(&[
        "-s",
        s,
        "bench",
        "subscribe",
        "--msgs",
        "200",
        "--subs",
        "2",
        "--json",
    ]);
    assert_eq!(
        (r["workload"].as_str(), r["msgs"].as_u64()),
        (Some("subscribe"), Some(200))
    );
    for (row, role) in r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["subscribe", "unsubscribe"])
    {
        assert_eq!(row["role"], role);
        assert_eq!(row["msgs"], 200, "{role}");
        let lat = &row["latency_us"];
        assert!(lat["p50"].as_u64().unwrap() <= lat["p99"].as_u64().unwrap());
        assert!(lat["p99"].as_u64().unwrap() <= lat["max"].as_u64().unwrap());
    }
    // Every subscription was removed again.
    let info = ok_json(&["-s", s, "server", "info", "--json"]);
    assert_eq!(info["subscriptions"], 0, "{info}");
    let table = ok(&["-s", s, "bench", "subscribe", "--msgs", "20"]);
    assert!(
        table.contains("bench subscribe: 20 subscribes")
            && table
                .lines()
                .any(|l| l.starts_with("unsubscribe") && l.contains("20")),
        "{table}"
    );
    let o = run(&["-s", s, "bench", "subscribe", "--subs", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn bench_sub_server_connects_subscribers_there_and_keeps_counts_exact() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    // Round-robin over a list; warm-ups are not counted as deliveries.
    let list = format!("{s},{s}");
    let r = ok_json(&[
        "-s",
        s,
        "bench",
        "fanout",
        "--msgs",
        "500",
        "--subs",
        "3",
        "--sub-server",
        &list,
        "--json",
    ]);
    assert_eq!(r["sub_servers"], json!([s, s]));
    assert_eq!(r["rows"][1]["msgs"], 1500, "{r}");
    // Subscribers, not publishers, go to --sub-server: with nothing
    // listening there the run fails on connecting to it.
    let o = run(&[
        "-s",
        s,
        "bench",
        "queue",
        "--msgs",
        "10",
        "--sub-server",
        "127.0.0.1:1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("127.0.0.1:1"), "{}", stderr(&o));
    let o = run(&["-s", s, "bench", "sub", "--sub-server", ","]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--sub-server"), "{}", stderr(&o));
}

/// `--token` names the user under `-users` (docs/PROTOCOL.md §11): a
/// responder that may only answer requests serves `gombus req`, and a
/// command outside a user's rights fails with `forbidden` and a hint.
#[test]
fn token_names_the_user_under_a_users_file() {
    let users = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/users/users.json");
    let b = Broker::start(&[&format!("-users={users}")]);
    let s = b.addr.as_str();
    let responder = Background::start(
        &[
            "-s",
            s,
            "--token",
            "tok-service",
            "reply",
            "svc.cli",
            "\"pong\"",
            "--count",
            "1",
        ],
        "answering requests on svc.cli",
    );
    let out = ok(&["-s", s, "--token", "tok-admin", "req", "svc.cli", "ping"]);
    assert_eq!(out.trim(), "pong");
    let (status, _) = responder.finish();
    assert!(status.success());
    let o = run(&["-s", s, "--token", "tok-service", "pub", "svc.cli", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("forbidden"), "{}", stderr(&o));
    assert!(stderr(&o).contains("--token"), "{}", stderr(&o));
    let o = run(&["-s", s, "pub", "svc.cli", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unauthorized"), "{}", stderr(&o));
}

#[test]
fn ack_nak_term_and_wip_settle_messages_fetched_elsewhere() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    ok(&["-s", s, "stream", "add", "JOBS", "--subjects", "jobs.>"]);
    ok(&["-s", s, "consumer", "add", "JOBS", "w", "--ack-wait", "1m"]);
    for n in 1..=3 {
        ok(&["-s", s, "pub", "jobs.x", &n.to_string()]);
    }
    let fetched = ok(&[
        "-s", s, "consumer", "next", "JOBS", "w", "--count", "3", "--no-ack", "--json",
    ]);
    assert_eq!(fetched.lines().count(), 3, "{fetched}");
    let info = |what: &str| {
        ok_json(&["-s", s, "consumer", "info", "JOBS", "w", "--json"])["consumer"][what].clone()
    };
    assert_eq!(info("num_ack_pending"), 3);

    // Each command is a connection of its own, not the fetching one.
    assert_eq!(
        ok(&["-s", s, "consumer", "ack", "JOBS", "w", "1"]).trim(),
        "acked message 1 of consumer w on stream JOBS"
    );
    assert_eq!(info("ack_floor")["stream_seq"], 1);
    ok(&["-s", s, "consumer", "wip", "JOBS", "w", "2"]);
    ok(&["-s", s, "consumer", "term", "JOBS", "w", "3"]);
    assert_eq!(info("num_ack_pending"), 1, "3 terminated, 2 still pending");
    ok(&["-s", s, "consumer", "nak", "JOBS", "w", "2"]);
    // Handed back: the next fetch gets 2 again, delivered twice.
    let again = ok_json(&[
        "-s", s, "consumer", "next", "JOBS", "w", "--no-ack", "--json",
    ]);
    assert_eq!(
        (&again["seq"], &again["delivered"]),
        (&json!(2), &json!(2)),
        "{again}"
    );
    // With --delay it stays back: nothing to fetch at once.
    ok(&[
        "-s", s, "consumer", "nak", "JOBS", "w", "2", "--delay", "1m",
    ]);
    let o = run(&["-s", s, "consumer", "next", "JOBS", "w", "--no-wait"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));

    // A seq never delivered is the broker's not_found; a bad SEQ is usage.
    let o = run(&["-s", s, "consumer", "ack", "JOBS", "w", "99"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not_found"), "{}", stderr(&o));
    let o = run(&["-s", s, "consumer", "ack", "JOBS", "w", "two"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("SEQ"), "{}", stderr(&o));
    let o = run(&[
        "-s", s, "consumer", "ack", "JOBS", "w", "1", "--delay", "1s",
    ]);
    assert_eq!(o.status.code(), Some(2), "--delay is nak's alone");
}

#[test]
fn group_modes_set_and_listed_on_control() {
    let b = Broker::start(&["-control-token=ctl"]);
    let s = b.addr.as_str();
    let ctl = |args: &[&str]| -> Vec<String> {
        ["-s", s, "--control-token", "ctl"]
            .iter()
            .chain(args)
            .map(|a| a.to_string())
            .collect()
    };
    let run_ctl = |args: &[&str]| {
        let full = ctl(args);
        run(&full.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let ok_ctl = |args: &[&str]| {
        let o = run_ctl(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    assert!(ok_ctl(&["group", "ls"]).contains("no queue group rules"));
    assert_eq!(
        ok_ctl(&["group", "set", "jobs", "broadcast"]).trim(),
        "queue group jobs: broadcast"
    );
    let list: Value = serde_json::from_str(&ok_ctl(&["group", "ls", "--json"])).unwrap();
    assert_eq!(
        list["groups"],
        json!([{"queue": "jobs", "mode": "broadcast"}])
    );
    let table = ok_ctl(&["group", "ls"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().eq(["jobs", "broadcast"])),
        "{table}"
    );
    assert_eq!(
        run_ctl(&["group", "set", "jobs", "sometimes"])
            .status
            .code(),
        Some(2)
    );
    let o = run(&["-s", s, "group", "ls"]);
    assert_eq!(o.status.code(), Some(1), "no control token");
}

#[test]
fn server_health_metrics_and_rtt() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let health = ok_json(&["-s", s, "server", "health", "--json"]);
    assert_eq!(health["code"], 200, "{health}");
    assert_eq!(health["health"], json!({"status": "ok"}));
    assert!(ok(&["-s", s, "server", "health"]).contains("200"));
    let metrics = ok(&["-s", s, "server", "metrics"]);
    assert!(
        metrics.lines().any(|l| l.starts_with("gombus_info")),
        "{metrics}"
    );
    let rtt = ok_json(&["-s", s, "rtt", "--json"]);
    assert!(rtt["rtt_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{rtt}");
    // The second address answers when the first is down.
    let down = "127.0.0.1:1";
    let both = format!("{down},{s}");
    ok(&["-s", &both, "server", "health"]);
    let o = run(&["-s", down, "server", "health"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn stream_add_takes_replicas() {
    let b = Broker::start(&[]);
    let s = b.addr.as_str();
    let one = ok_json(&[
        "-s",
        s,
        "stream",
        "add",
        "R1",
        "--subjects",
        "r1",
        "--replicas",
        "1",
        "--json",
    ]);
    assert_eq!(one["stream"]["config"]["name"], "R1");
    // The broker read the field: three copies need a cluster.
    let o = run(&[
        "-s",
        s,
        "stream",
        "add",
        "R3",
        "--subjects",
        "r3",
        "--replicas",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("needs a cluster"), "{}", stderr(&o));
}

/// Where each request field of the contract is given on the command line:
/// (event, field, command, how): `how` is a flag (`--name`), `ARG` for a
/// positional argument of the command, or `client` for what the CLI's
/// client fills in itself (a subscription's sid). An event without fields
/// is listed with the field "".
const FIELD_FLAGS: &[(&str, &str, &str, &str)] = &[
    ("sub", "subject", "sub", "ARG"),
    ("sub", "queue", "sub", "--queue"),
    ("sub", "sid", "sub", "client"),
    ("sub", "max", "sub", "--count"),
    ("unsub", "sid", "sub", "client"),
    ("unsub", "after", "sub", "--count"),
    ("pub", "subject", "pub", "ARG"),
    ("pub", "data", "pub", "ARG"),
    ("pub", "reply", "pub", "--reply"),
    ("pub", "headers", "pub", "--header"),
    ("request", "subject", "req", "ARG"),
    ("request", "data", "req", "ARG"),
    ("request", "headers", "req", "--header"),
    ("request", "timeout_ms", "req", "--timeout"),
    ("ping", "", "rtt", "ARG"),
    ("group.set", "queue", "group set", "ARG"),
    ("group.set", "mode", "group set", "ARG"),
    ("group.list", "", "group ls", "ARG"),
    ("server.info", "", "server info", "ARG"),
    ("cluster.status", "", "cluster status", "ARG"),
    ("cluster.add", "id", "cluster add", "ARG"),
    ("cluster.add", "raft_addr", "cluster add", "ARG"),
    ("cluster.add", "addr", "cluster add", "ARG"),
    ("cluster.remove", "id", "cluster remove", "ARG"),
    ("stream.create", "name", "stream add", "ARG"),
    ("stream.create", "subjects", "stream add", "--subjects"),
    ("stream.create", "retention", "stream add", "--retention"),
    ("stream.create", "max_msgs", "stream add", "--max-msgs"),
    (
        "stream.create",
        "max_msgs_per_subject",
        "stream add",
        "--max-msgs-per-subject",
    ),
    ("stream.create", "max_bytes", "stream add", "--max-bytes"),
    ("stream.create", "max_age_ms", "stream add", "--max-age"),
    (
        "stream.create",
        "max_msg_size",
        "stream add",
        "--max-msg-size",
    ),
    ("stream.create", "discard", "stream add", "--discard"),
    (
        "stream.create",
        "duplicate_window_ms",
        "stream add",
        "--dupe-window",
    ),
    ("stream.create", "replicas", "stream add", "--replicas"),
    ("stream.info", "name", "stream info", "ARG"),
    ("stream.list", "", "stream ls", "ARG"),
    ("stream.delete", "name", "stream rm", "ARG"),
    ("stream.purge", "name", "stream purge", "ARG"),
    ("stream.purge", "subject", "stream purge", "--subject"),
    ("stream.get", "name", "stream get", "ARG"),
    ("stream.get", "seq", "stream get", "--seq"),
    ("stream.get", "last_by_subject", "stream get", "--last"),
    ("consumer.create", "stream", "consumer add", "ARG"),
    ("consumer.create", "name", "consumer add", "ARG"),
    (
        "consumer.create",
        "filter_subject",
        "consumer add",
        "--filter",
    ),
    (
        "consumer.create",
        "deliver_policy",
        "consumer add",
        "--deliver",
    ),
    (
        "consumer.create",
        "opt_start_seq",
        "consumer add",
        "--start-seq",
    ),
    ("consumer.create", "ack_policy", "consumer add", "--ack"),
    (
        "consumer.create",
        "ack_wait_ms",
        "consumer add",
        "--ack-wait",
    ),
    (
        "consumer.create",
        "max_deliver",
        "consumer add",
        "--max-deliver",
    ),
    (
        "consumer.create",
        "max_ack_pending",
        "consumer add",
        "--max-ack-pending",
    ),
    (
        "consumer.create",
        "deliver_subject",
        "consumer add",
        "--deliver-subject",
    ),
    (
        "consumer.create",
        "deliver_group",
        "consumer add",
        "--deliver-group",
    ),
    ("consumer.info", "stream", "consumer info", "ARG"),
    ("consumer.info", "name", "consumer info", "ARG"),
    ("consumer.list", "stream", "consumer ls", "ARG"),
    ("consumer.delete", "stream", "consumer rm", "ARG"),
    ("consumer.delete", "name", "consumer rm", "ARG"),
    ("consumer.fetch", "stream", "consumer next", "ARG"),
    ("consumer.fetch", "consumer", "consumer next", "ARG"),
    ("consumer.fetch", "batch", "consumer next", "--count"),
    ("consumer.fetch", "expires_ms", "consumer next", "--expires"),
    ("consumer.fetch", "no_wait", "consumer next", "--no-wait"),
    ("ack", "stream", "consumer ack", "ARG"),
    ("ack", "consumer", "consumer ack", "ARG"),
    ("ack", "seq", "consumer ack", "ARG"),
    ("nak", "stream", "consumer nak", "ARG"),
    ("nak", "consumer", "consumer nak", "ARG"),
    ("nak", "seq", "consumer nak", "ARG"),
    ("nak", "delay_ms", "consumer nak", "--delay"),
    ("term", "stream", "consumer term", "ARG"),
    ("term", "consumer", "consumer term", "ARG"),
    ("term", "seq", "consumer term", "ARG"),
    ("wip", "stream", "consumer wip", "ARG"),
    ("wip", "consumer", "consumer wip", "ARG"),
    ("wip", "seq", "consumer wip", "ARG"),
    ("GET /healthz", "", "server health", "ARG"),
    ("GET /metrics", "", "server metrics", "ARG"),
];

/// Node-to-node events (contract section 9), not for people, and the
/// key-value events, whose commands are `gombus kv …`.
fn not_for_the_cli(event: &str) -> bool {
    event.starts_with("kv.")
        || [
            "cluster.command",
            "cluster.forward",
            "cluster.members",
            "cluster.catchup",
            "cluster.publish",
        ]
        .contains(&event)
}

/// The top-level field names of `{a, b?, c[]}` argument lists.
fn field_names(args: &[&String]) -> Vec<String> {
    let mut fields: Vec<String> = Vec::new();
    for a in args {
        let inner = a.trim_start_matches('{').trim_end_matches('}');
        for f in inner.split(',') {
            let f = f.trim().trim_end_matches('?').trim_end_matches("[]");
            if !f.is_empty() && !fields.iter().any(|g| g == f) {
                fields.push(f.to_string());
            }
        }
    }
    fields
}

/// Every request event of docs/PROTOCOL.md's tables with its argument
/// fields: a row whose first cell names events in backticks and holds their
/// arguments as `{…}` beside them or in the second cell (`ping`'s
/// "anything" has none), and the HTTP reads of section 8. A row that
/// restricts a field to some of its events (`delay_ms`: `nak` only) gives
/// the field to those alone.
fn contract_requests() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md"))
        .expect("read docs/PROTOCOL.md");
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.trim_end_matches(" |").split(" | ").collect();
        if !line.starts_with("| `") || cells.len() < 2 {
            continue;
        }
        let first = ticked(cells[0].trim_start_matches("| "));
        let second = ticked(cells[1]);
        let events: Vec<&String> = first
            .iter()
            .filter(|t| {
                t.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_')
            })
            .collect();
        // `/control`'s table has the arguments beside the event and the
        // answer in the second cell; the others have them in the second.
        let in_first: Vec<&String> = first.iter().filter(|t| t.starts_with('{')).collect();
        let args = if in_first.is_empty() {
            second.iter().filter(|t| t.starts_with('{')).collect()
        } else {
            in_first
        };
        let is_ping = events.iter().any(|e| *e == "ping") && cells[1].trim() == "anything";
        if events.is_empty() || (args.is_empty() && !is_ping) {
            continue;
        }
        let fields = field_names(&args);
        for e in events {
            // "(`delay_ms`: `nak` only)": the field is not the others'.
            let fields: Vec<String> = fields
                .iter()
                .filter(|f| {
                    let only = format!("(`{f}`: `");
                    match cells[1].split_once(&only) {
                        Some((_, rest)) => rest.starts_with(&format!("{e}` only)")),
                        None => true,
                    }
                })
                .cloned()
                .collect();
            match out.iter_mut().find(|(name, _)| name == e) {
                Some((_, known)) => {
                    for f in fields {
                        if !known.contains(&f) {
                            known.push(f);
                        }
                    }
                }
                None => out.push((e.clone(), fields)),
            }
        }
    }
    for path in ["/healthz", "/metrics"] {
        assert!(
            doc.contains(&format!("`GET {path}`")),
            "section 8 no longer lists GET {path}"
        );
        out.push((format!("GET {path}"), Vec::new()));
    }
    out
}

#[test]
fn every_request_field_of_the_contract_has_a_flag() {
    let requests = contract_requests();
    // The walk found the tables: a few known rows are there.
    for (known, field) in [
        ("sub", "max"),
        ("stream.create", "replicas"),
        ("consumer.create", "deliver_group"),
        ("cluster.add", "raft_addr"),
        ("nak", "delay_ms"),
        ("group.set", "mode"),
    ] {
        assert!(
            requests
                .iter()
                .any(|(e, f)| e == known && f.iter().any(|g| g == field)),
            "{known}.{field} not found in docs/PROTOCOL.md's tables: {requests:?}"
        );
    }
    assert!(
        requests
            .iter()
            .any(|(e, f)| e == "ack" && !f.iter().any(|g| g == "delay_ms")),
        "delay_ms is nak's alone: {requests:?}"
    );
    let mut missing = Vec::new();
    let mut help_of = std::collections::HashMap::new();
    for (event, fields) in &requests {
        if not_for_the_cli(event) {
            continue;
        }
        let wanted: Vec<&str> = if fields.is_empty() {
            vec![""]
        } else {
            fields.iter().map(String::as_str).collect()
        };
        for field in wanted {
            let Some(&(_, _, command, how)) = FIELD_FLAGS
                .iter()
                .find(|(e, f, _, _)| e == event && *f == field)
            else {
                missing.push(format!("{event} {field}: no CLI mapping"));
                continue;
            };
            let help = help_of.entry(command).or_insert_with(|| {
                let mut args: Vec<&str> = command.split(' ').collect();
                args.push("--help");
                ok(&args)
            });
            let usage = help.lines().next().unwrap_or("");
            let found = match how {
                "ARG" => usage.starts_with(&format!("Usage: gombus {command} ")),
                "client" => true,
                flag => help
                    .lines()
                    .any(|l| l.split_whitespace().any(|w| w == flag)),
            };
            if !found {
                missing.push(format!("{event} {field}: `gombus {command}` lacks {how}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "contract fields without a CLI flag:\n{}",
        missing.join("\n")
    );
}
