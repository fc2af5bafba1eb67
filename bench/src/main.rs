//! `loadgen`: the gombus benchmark's load generator and driver.
//!
//! ```text
//! loadgen suite                  every run, peer and workload (settings from the environment)
//! loadgen run WORKLOAD --proto sio|nats|nats-ws --addr HOST:PORT [options]
//! loadgen report FILE.jsonl...   the table of medians of earlier results
//! ```
//!
//! `run` drives one workload against a peer that is already up and prints
//! its JSON line; it exits 1 if messages were lost, copied or reordered.

mod conn;
mod cpu;
mod nats;
mod payload;
mod report;
mod sio;
mod suite;
mod work;

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

const USAGE: &str = "usage:
  loadgen suite
  loadgen run fanout|queue|reqrep|stream|stream3|kv|conns --proto sio|nats|nats-ws --addr HOST:PORT
              [--sub-addr HOST:PORT,...] (stream3: the other nodes) [--server-pid PID,...] [--msgs N] [--size S]
              [--subs K] [--window W] [--batch B] [--conns C] [--keys K] [--warm]
              [--watch-msgs N] [--watch-rate R] (kv)
  loadgen report FILE.jsonl...
The suite's settings (RUNS, PEERS, WORKLOADS, *_MSGS, SIZE, ...) are described
in docs/PERFORMANCE.md.";

fn usage(msg: &str) -> ExitCode {
    eprintln!("loadgen: {msg}\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("suite") => suite(),
        Some("run") => run(&args[1..]),
        Some("report") => report(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => usage("expected suite, run or report"),
    }
}

fn suite() -> ExitCode {
    let set = match suite::Settings::from_env() {
        Ok(s) => s,
        Err(e) => return usage(&e),
    };
    let rows = match suite::run(&set) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let table = report::table(&rows);
    let path = set.out.join("table.md");
    if let Err(e) = std::fs::write(&path, &table) {
        eprintln!("loadgen: {}: {e}", path.display());
    }
    println!("\n{table}\nresults: {}", set.out.display());
    if rows.iter().all(|r| r["ok"] == Value::Bool(true)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(args: &[String]) -> ExitCode {
    let Some(workload) = args.first() else {
        return usage("run needs a workload");
    };
    let mut s = work::Spec {
        proto: conn::Proto::Sio,
        pub_addr: String::new(),
        sub_addrs: Vec::new(),
        msgs: 100_000,
        size: 128,
        subs: 4,
        window: 256,
        batch: 128,
        conns: 1000,
        keys: 10_000,
        watch_msgs: 10_000,
        watch_rate: 2000,
        server_pids: Vec::new(),
        nodes: Vec::new(),
        warm: false,
    };
    let mut i = 1;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--warm" {
            s.warm = true;
            i += 1;
            continue;
        }
        let Some(v) = args.get(i + 1) else {
            return usage(&format!("{flag} needs a value"));
        };
        let num = || {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} needs a number"))
        };
        let r: Result<(), String> = (|| {
            match flag {
                "--proto" => {
                    s.proto = match v.as_str() {
                        "sio" => conn::Proto::Sio,
                        "nats" => conn::Proto::Nats,
                        "nats-ws" => conn::Proto::NatsWs,
                        _ => return Err("--proto is sio, nats or nats-ws".into()),
                    }
                }
                "--addr" => s.pub_addr = v.clone(),
                "--sub-addr" => s.sub_addrs = v.split(',').map(String::from).collect(),
                "--server-pid" => {
                    s.server_pids = v
                        .split(',')
                        .map(|p| p.parse().map_err(|_| "--server-pid takes PIDs".to_string()))
                        .collect::<Result<_, _>>()?
                }
                "--msgs" => s.msgs = num()?,
                "--size" => s.size = num()?.max(payload::DIGITS as u64) as usize,
                "--subs" => s.subs = num()?,
                "--window" => s.window = num()?,
                "--batch" => s.batch = num()?.max(1),
                "--conns" => s.conns = num()?,
                "--keys" => s.keys = num()?.max(1),
                "--watch-msgs" => s.watch_msgs = num()?,
                "--watch-rate" => s.watch_rate = num()?.max(1),
                _ => return Err(format!("unknown option {flag}")),
            }
            Ok(())
        })();
        if let Err(e) = r {
            return usage(&e);
        }
        i += 2;
    }
    if s.pub_addr.is_empty() {
        return usage("--addr is required");
    }
    if s.sub_addrs.is_empty() {
        s.sub_addrs = vec![s.pub_addr.clone()];
    }
    if workload == "conns" {
        if let Err(e) = work::check_conns_limit(s.conns) {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    }
    // stream3: the cluster's nodes are --addr (n1) and then --sub-addr.
    s.nodes = std::iter::once(s.pub_addr.clone())
        .chain(s.sub_addrs.iter().filter(|a| **a != s.pub_addr).cloned())
        .collect();
    let out = match workload.as_str() {
        "fanout" => work::fanout(&s, false, "fanout"),
        "queue" => work::fanout(&s, true, "queue"),
        "reqrep" => work::reqrep(&s),
        "stream" => work::stream(&s),
        "stream3" | "kv" => match workload.as_str() {
            "kv" => work::kv(&s),
            _ => work::stream3(&s, Duration::from_secs(30)),
        }
        .map(|rows| {
            // One line per row; the last one decides like a single row.
            for r in &rows[..rows.len().saturating_sub(1)] {
                println!("{r}");
            }
            let all_ok = rows.iter().all(|r| r["ok"] == Value::Bool(true));
            let mut last = rows.last().cloned().unwrap_or(Value::Null);
            if !all_ok {
                last["ok"] = Value::Bool(false);
            }
            last
        }),
        "conns" => work::conns(&s),
        other => return usage(&format!("unknown workload {other}")),
    };
    match out {
        Ok(row) => {
            println!("{row}");
            if row["ok"] == Value::Bool(true) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("loadgen: {workload}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn report(files: &[String]) -> ExitCode {
    if files.is_empty() {
        return usage("report needs result files");
    }
    let mut rows = Vec::new();
    for f in files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("loadgen: {f}: {e}");
                return ExitCode::FAILURE;
            }
        };
        rows.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
        );
    }
    print!("{}", report::table(&rows));
    ExitCode::SUCCESS
}
