//! A short run of the whole suite against gombus alone: every workload
//! with small counts, a fresh peer per group, stopped by PID. Proves the
//! Socket.IO client, the driver (ports, start, stop, cluster readiness)
//! and the report agree with a real broker: every row must be exactly
//! once, in order, with a rate and server CPU figures, and the table must
//! list each workload. The broker is `$GOMBUS_BIN`, else the repository's
//! `bin/broker` (`make build`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn broker() -> PathBuf {
    let p = std::env::var_os("GOMBUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bin/broker"));
    assert!(
        p.is_file(),
        "no broker at {} (run `make build` or set GOMBUS_BIN)",
        p.display()
    );
    p
}

#[test]
fn every_workload_against_gombus() {
    let out = std::env::temp_dir().join(format!("gombus-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let res = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("suite")
        .env("GOMBUS_BIN", broker())
        .env("GOMBUS_BENCH_OUT", &out)
        .env("PEERS", "gombus")
        .env("WORKLOADS", "fanout queue reqrep stream kv conns fanout3")
        .env("RUNS", "1")
        .env("FANOUT_MSGS", "2000")
        .env("QUEUE_MSGS", "2000")
        .env("REQREP_MSGS", "200")
        .env("STREAM_MSGS", "2000")
        .env("KV_MSGS", "2000")
        .env("KV_KEYS", "50")
        .env("KV_WATCH_MSGS", "500")
        .env("KV_WATCH_RATE", "1000")
        .env("CLUSTER_MSGS", "2000")
        .env("CONNS", "100")
        .env("SIZE", "64")
        .env("PIN", "none")
        .output()
        .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(
        res.status.success(),
        "loadgen failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let text = std::fs::read_to_string(out.join("results.jsonl")).expect("results.jsonl");
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "fanout", "queue", "reqrep", "stream", "kv-put", "kv-get", "kv-watch", "conns",
            "fanout3"
        ]
    );
    for r in &rows {
        assert_eq!(r["ok"], Value::Bool(true), "{r}");
        assert_eq!(r["peer"], "gombus");
        assert_eq!(r["lost"], 0, "{r}");
        assert!(r["elapsed_s"].as_f64().unwrap() > 0.0, "{r}");
        // Present, but null for phases too short for CPU ticks to say much.
        assert!(r.get("server_cpu_us_per_msg").is_some(), "{r}");
    }
    assert!(rows[0]["deliveries_per_s"].as_f64().unwrap() > 0.0);
    assert!(rows[2]["p99_us"].as_u64().unwrap() >= rows[2]["p50_us"].as_u64().unwrap());
    assert!(rows[3]["acked_per_s"].as_f64().unwrap() > 0.0);
    assert!(rows[4]["acked_per_s"].as_f64().unwrap() > 0.0);
    assert!(rows[5]["acked_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[5]["keys"], 50);
    // Every watched put came once, in order, each with its latency.
    assert_eq!(rows[6]["received"], 500, "{}", rows[6]);
    assert!(rows[6]["p99_us"].as_u64().unwrap() >= rows[6]["p50_us"].as_u64().unwrap());
    assert!(rows[7]["bytes_per_conn"].as_f64().is_some());
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md");
    for w in [
        "| fanout | gombus | 1 |",
        "| queue |",
        "| stream |",
        "| kv-put |",
        "| kv-get |",
        "| kv-watch |",
        "| conns |",
        "| fanout3 |",
    ] {
        assert!(table.contains(w), "{w} missing from\n{table}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
