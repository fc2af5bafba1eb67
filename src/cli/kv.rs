//! `kv add|put|get|del|purge|ls|keys|history|watch|rm`: the key-value events of
//! the contract's section 14, each one call through the client's
//! [`Kv`](crate::client::Kv) handle.

use serde_json::{json, Value};

use super::args::Parsed;
use super::commands::parse_data;
use super::output::{self, Failure};
use super::{connect, Namespace, Run};
use crate::client::{BucketConfig, Client, KvEntry, KvWatchEvent, Payload, WatchFrom};

pub fn kv(p: &Parsed) -> Result<(), Run> {
    let sub = p.command.path[1];
    let client = connect(&p.global, Namespace::Root)?;
    let r = run(p, &client, sub);
    let _ = client.close();
    r
}

fn failed(what: &str) -> impl Fn(crate::client::Error) -> Failure + '_ {
    move |e| Failure::call(what, &e)
}

fn run(p: &Parsed, client: &Client, sub: &str) -> Result<(), Run> {
    let arg = |i: usize| p.args[i].as_str();
    let json = p.global.json;
    match sub {
        "add" => {
            let cfg = BucketConfig {
                bucket: arg(0).to_string(),
                history: p.opt_u64("history")?,
                ttl_ms: p.opt_duration("ttl")?.map(|d| d.as_millis() as u64),
                max_bytes: p.opt_size("max-bytes")?,
                max_value_size: p.opt_size("max-value-size")?,
                replicas: p.opt_u64("replicas")?,
            };
            let b = client.kv_create(&cfg).map_err(failed("kv.create"))?;
            show_bucket(&b, json);
        }
        "ls" => {
            let list = client.kv_list().map_err(failed("kv.list"))?;
            if json {
                output::json_pretty(&json!(list));
            } else if list.is_empty() {
                println!("no buckets");
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|b| {
                        let (c, st) = (&b["config"], &b["state"]);
                        ["bucket", "history"]
                            .iter()
                            .map(|k| output::plain(&c[k]))
                            .chain(
                                ["values", "bytes", "revision"]
                                    .iter()
                                    .map(|k| output::plain(&st[k])),
                            )
                            .collect()
                    })
                    .collect();
                output::table(&["BUCKET", "HISTORY", "VALUES", "BYTES", "REVISION"], &rows);
            }
        }
        "rm" => {
            client
                .kv_delete_bucket(arg(0))
                .map_err(failed("kv.delete_bucket"))?;
            println!("deleted bucket {}", arg(0));
        }
        "put" | "del" | "purge" => {
            let kv = client.kv(arg(0));
            let key = arg(1);
            let rev = match sub {
                "put" => {
                    let value = Payload::Json(parse_data(arg(2)));
                    match p.opt_u64("revision")? {
                        Some(r) => kv.update(key, value, r),
                        None => kv.put(key, value),
                    }
                    .map_err(failed("kv.put"))?
                }
                "del" => kv
                    .delete(key, p.opt_u64("revision")?)
                    .map_err(failed("kv.delete"))?,
                _ => kv.purge(key).map_err(failed("kv.purge"))?,
            };
            if json {
                output::json_line(&json!({ "revision": rev }));
            } else {
                println!("{key} revision {rev}");
            }
        }
        "get" => {
            let e = client
                .kv(arg(0))
                .get_at(arg(1), p.opt_u64("revision")?)
                .map_err(failed("kv.get"))?
                .ok_or_else(|| Failure(format!("no value for key {:?}", arg(1))))?;
            show_entries(&[e], json);
        }
        "watch" => watch(p, client, arg(0))?,
        "history" => {
            let list = client
                .kv(arg(0))
                .history(arg(1))
                .map_err(failed("kv.history"))?;
            show_entries(&list, json);
        }
        _ => {
            let keys = client
                .kv(arg(0))
                .keys(p.opt("filter").as_deref())
                .map_err(failed("kv.keys"))?;
            if json {
                output::json_pretty(&json!(keys));
            } else {
                for k in keys {
                    println!("{k}");
                }
            }
        }
    }
    Ok(())
}

/// `kv watch`: prints each event until `--count` new writes (or the
/// connection ends).
fn watch(p: &Parsed, client: &Client, bucket: &str) -> Result<(), Run> {
    let from = match (p.flag("history"), p.flag("updates-only")) {
        (true, true) => {
            let msg = "give at most one of --history and --updates-only";
            return Err(p.usage_error(msg.into()).into());
        }
        (true, false) => WatchFrom::History,
        (false, true) => WatchFrom::UpdatesOnly,
        _ => WatchFrom::Latest,
    };
    let count = p.opt_u64("count")?;
    let key = p.opt("key");
    let w = client
        .kv(bucket)
        .watch(key.as_deref(), from)
        .map_err(failed("kv.watch"))?;
    eprintln!("watching {bucket}");
    let mut live = false;
    let mut seen = 0;
    for event in w.iter() {
        match event {
            KvWatchEvent::CaughtUp => {
                live = true;
                if !p.global.json {
                    println!("-- caught up --");
                }
            }
            KvWatchEvent::Entry(e) => {
                show_line(&e, p.global.json);
                if live {
                    seen += 1;
                }
            }
        }
        if count.is_some_and(|n| seen >= n) {
            break;
        }
    }
    Ok(())
}

fn show_line(e: &KvEntry, json: bool) {
    if json {
        return output::json_line(&entry_json(e));
    }
    println!("{} @{} {} {}", e.key, e.revision, e.op, value_text(e));
}

fn show_bucket(b: &Value, json: bool) {
    if json {
        return output::json_pretty(b);
    }
    let (c, st) = (&b["config"], &b["state"]);
    println!("bucket {}", output::plain(&c["bucket"]));
    for k in [
        "history",
        "ttl_ms",
        "max_bytes",
        "max_value_size",
        "replicas",
    ] {
        println!("  {:<15} {}", format!("{k}:"), output::plain(&c[k]));
    }
    for k in ["values", "bytes", "revision"] {
        println!("  {:<15} {}", format!("{k}:"), output::plain(&st[k]));
    }
}

fn value_text(e: &KvEntry) -> String {
    match &e.value {
        Some(Payload::Json(v)) => v.to_string(),
        Some(Payload::Bytes(b)) => format!("<{} bytes>", b.len()),
        None => String::new(),
    }
}

fn entry_json(e: &KvEntry) -> Value {
    let value = match &e.value {
        Some(Payload::Json(v)) => v.clone(),
        Some(Payload::Bytes(b)) => json!({ "bytes": b.len() }),
        None => Value::Null,
    };
    json!({"key": e.key, "revision": e.revision, "op": e.op, "time": e.time_ms, "value": value})
}

fn show_entries(list: &[KvEntry], json: bool) {
    if json {
        let v: Vec<Value> = list.iter().map(entry_json).collect();
        return output::json_pretty(&json!(v));
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                e.key.clone(),
                e.revision.to_string(),
                e.op.clone(),
                value_text(e),
            ]
        })
        .collect();
    output::table(&["KEY", "REVISION", "OP", "VALUE"], &rows);
}
