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
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
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
        "--max-age",
        "1h",
        "--json",
    ]);
    assert_eq!(created["stream"]["config"]["name"], "ORDERS");
    assert_eq!(created["stream"]["config"]["max_msgs"], 100);
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
