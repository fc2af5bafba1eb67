//! `stream add|info|ls|rm|purge|get` and
//! `consumer add|info|ls|rm|next|ack|nak|term|wip`, each one event of the
//! contract's streams section sent with `Client::call`.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::args::Parsed;
use super::commands::strip_ok;
use super::output::{self, Failure};
use super::{connect, connect_timeout, Namespace, Run};
use crate::client::Client;

/// Default wait of `consumer next` for a first message.
const NEXT_EXPIRES_DEFAULT: Duration = Duration::from_secs(5);

fn call(client: &Client, event: &str, args: Value) -> Result<Value, Failure> {
    client
        .call(event, args)
        .map(strip_ok)
        .map_err(|e| Failure::call(event, &e))
}

/// Connects, sends one event and closes. With `--json` the ack is printed
/// here and `None` comes back; else the caller prints it.
fn call_once(p: &Parsed, event: &str, args: Value) -> Result<Option<Value>, Run> {
    let client = connect(&p.global, Namespace::Root)?;
    let ack = call(&client, event, args)?;
    let _ = client.close();
    if p.global.json {
        output::json_pretty(&ack);
        return Ok(None);
    }
    Ok(Some(ack))
}

/// Copies option `opt` into `obj[key]` as a number.
fn put_u64(p: &Parsed, obj: &mut Map<String, Value>, opt: &str, key: &str) -> Result<(), Run> {
    if let Some(v) = p.opt_u64(opt)? {
        obj.insert(key.into(), json!(v));
    }
    Ok(())
}

fn put_ms(p: &Parsed, obj: &mut Map<String, Value>, opt: &str, key: &str) -> Result<(), Run> {
    if let Some(d) = p.opt_duration(opt)? {
        obj.insert(key.into(), json!(d.as_millis() as u64));
    }
    Ok(())
}

fn put_size(p: &Parsed, obj: &mut Map<String, Value>, opt: &str, key: &str) -> Result<(), Run> {
    if let Some(v) = p.opt_size(opt)? {
        obj.insert(key.into(), json!(v));
    }
    Ok(())
}

/// Copies a string option after checking it is one of `allowed`.
fn put_choice(
    p: &Parsed,
    obj: &mut Map<String, Value>,
    opt: &str,
    key: &str,
    allowed: &[&str],
) -> Result<(), Run> {
    if let Some(v) = p.opt(opt) {
        if !allowed.contains(&v.as_str()) {
            return Err(p
                .usage_error(format!(
                    "--{opt}: {v:?} is not one of {}",
                    allowed.join(", ")
                ))
                .into());
        }
        obj.insert(key.into(), json!(v));
    }
    Ok(())
}

pub fn stream(p: &Parsed) -> Result<(), Run> {
    let sub = p.command.path[1];
    let args = match sub {
        "add" => stream_config(p)?,
        "ls" => json!({}),
        "purge" => match p.opt("subject") {
            Some(s) => json!({"name": p.args[0], "subject": s}),
            None => json!({"name": p.args[0]}),
        },
        "get" => match (p.opt_u64("seq")?, p.opt("last")) {
            (Some(seq), None) => json!({"name": p.args[0], "seq": seq}),
            (None, Some(s)) => json!({"name": p.args[0], "last_by_subject": s}),
            _ => {
                return Err(p
                    .usage_error("give exactly one of --seq N or --last SUBJECT".into())
                    .into())
            }
        },
        _ => json!({"name": p.args[0]}),
    };
    let event = match sub {
        "add" => "stream.create",
        "info" => "stream.info",
        "ls" => "stream.list",
        "rm" => "stream.delete",
        "purge" => "stream.purge",
        _ => "stream.get",
    };
    let Some(ack) = call_once(p, event, args)? else {
        return Ok(());
    };
    match sub {
        "add" | "info" => print_stream(&ack["stream"]),
        "ls" => print_streams(&ack["streams"]),
        "rm" => println!("deleted stream {}", p.args[0]),
        "purge" => println!(
            "purged {} messages from stream {}",
            output::plain(&ack["purged"]),
            p.args[0]
        ),
        _ => {
            let m = &ack["message"];
            for k in ["seq", "subject", "time"] {
                println!("{:<8} {}", format!("{k}:"), output::plain(&m[k]));
            }
            if let Some(h) = m.get("headers").filter(|h| !h.is_null()) {
                println!("headers: {h}");
            }
            println!("data:    {}", m["data"]);
        }
    }
    Ok(())
}

/// The `stream.create` arguments from `stream add`'s options.
fn stream_config(p: &Parsed) -> Result<Value, Run> {
    let Some(subjects) = p.opt("subjects") else {
        return Err(p.usage_error("--subjects is required".into()).into());
    };
    let subjects: Vec<&str> = subjects
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if subjects.is_empty() {
        return Err(p.usage_error("--subjects: no subject given".into()).into());
    }
    let mut o = Map::new();
    o.insert("name".into(), json!(p.args[0]));
    o.insert("subjects".into(), json!(subjects));
    put_choice(
        p,
        &mut o,
        "retention",
        "retention",
        &["limits", "workqueue", "interest"],
    )?;
    put_u64(p, &mut o, "max-msgs", "max_msgs")?;
    put_u64(p, &mut o, "max-msgs-per-subject", "max_msgs_per_subject")?;
    put_size(p, &mut o, "max-bytes", "max_bytes")?;
    put_ms(p, &mut o, "max-age", "max_age_ms")?;
    put_size(p, &mut o, "max-msg-size", "max_msg_size")?;
    put_choice(p, &mut o, "discard", "discard", &["old", "new"])?;
    put_ms(p, &mut o, "dupe-window", "duplicate_window_ms")?;
    put_u64(p, &mut o, "replicas", "replicas")?;
    Ok(Value::Object(o))
}

fn print_stream(s: &Value) {
    let c = &s["config"];
    let st = &s["state"];
    println!("stream {}", output::plain(&c["name"]));
    println!("  subjects:   {}", subjects_text(&c["subjects"]));
    println!("  retention:  {}", output::plain(&c["retention"]));
    println!("  messages:   {}", output::plain(&st["messages"]));
    println!("  bytes:      {}", output::plain(&st["bytes"]));
    println!(
        "  sequences:  {}..{}",
        output::plain(&st["first_seq"]),
        output::plain(&st["last_seq"])
    );
    println!("  consumers:  {}", output::plain(&st["consumer_count"]));
}

fn subjects_text(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(output::plain).collect::<Vec<_>>().join(","))
        .unwrap_or_else(|| output::plain(v))
}

/// Prints `list` as a table with one row per entry (`row` makes it), or
/// `empty` when there is none (or `list` is not an array).
fn print_list(list: &Value, header: &[&str], empty: &str, row: impl Fn(&Value) -> Vec<String>) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .map(|a| a.iter().map(row).collect())
        .unwrap_or_default();
    if rows.is_empty() {
        println!("{empty}");
    } else {
        output::table(header, &rows);
    }
}

/// An entry's `config` when it has one, else the entry itself.
fn config_of(entry: &Value) -> &Value {
    if entry.get("config").is_some() {
        &entry["config"]
    } else {
        entry
    }
}

fn print_streams(list: &Value) {
    let header = ["NAME", "SUBJECTS", "MESSAGES", "BYTES", "CONSUMERS"];
    print_list(list, &header, "no streams", |s| {
        // Entries are `{stream: {config, state}}`, `{config, state}` or
        // names.
        let s = s.get("stream").unwrap_or(s);
        let c = config_of(s);
        let st = &s["state"];
        vec![
            output::plain(c.get("name").unwrap_or(c)),
            subjects_text(&c["subjects"]),
            output::plain(&st["messages"]),
            output::plain(&st["bytes"]),
            output::plain(&st["consumer_count"]),
        ]
    });
}

pub fn consumer(p: &Parsed) -> Result<(), Run> {
    let sub = p.command.path[1];
    match sub {
        "next" => return next(p),
        "ack" | "nak" | "term" | "wip" => return settle(p, sub),
        _ => {}
    }
    let stream = &p.args[0];
    let (event, args) = match sub {
        "add" => ("consumer.create", consumer_config(p)?),
        "info" => (
            "consumer.info",
            json!({"stream": stream, "name": p.args[1]}),
        ),
        "ls" => ("consumer.list", json!({"stream": stream})),
        _ => (
            "consumer.delete",
            json!({"stream": stream, "name": p.args[1]}),
        ),
    };
    let Some(ack) = call_once(p, event, args)? else {
        return Ok(());
    };
    match sub {
        "add" | "info" => print_consumer(&ack["consumer"]),
        "ls" => print_consumers(&ack["consumers"]),
        _ => println!("deleted consumer {} of stream {stream}", p.args[1]),
    }
    Ok(())
}

fn consumer_config(p: &Parsed) -> Result<Value, Run> {
    let mut o = Map::new();
    o.insert("stream".into(), json!(p.args[0]));
    o.insert("name".into(), json!(p.args[1]));
    if let Some(f) = p.opt("filter") {
        o.insert("filter_subject".into(), json!(f));
    }
    put_choice(
        p,
        &mut o,
        "deliver",
        "deliver_policy",
        &["all", "new", "last", "by_start_seq"],
    )?;
    put_u64(p, &mut o, "start-seq", "opt_start_seq")?;
    put_choice(p, &mut o, "ack", "ack_policy", &["explicit", "none", "all"])?;
    put_ms(p, &mut o, "ack-wait", "ack_wait_ms")?;
    put_u64(p, &mut o, "max-deliver", "max_deliver")?;
    put_u64(p, &mut o, "max-ack-pending", "max_ack_pending")?;
    if let Some(s) = p.opt("deliver-subject") {
        o.insert("deliver_subject".into(), json!(s));
    }
    if let Some(g) = p.opt("deliver-group") {
        o.insert("deliver_group".into(), json!(g));
    }
    Ok(Value::Object(o))
}

fn print_consumer(c: &Value) {
    let cfg = &c["config"];
    let name = cfg
        .get("name")
        .map_or_else(|| output::plain(&c["name"]), output::plain);
    println!("consumer {name}");
    for (label, v) in [
        ("stream", c.get("stream").unwrap_or(&cfg["stream"])),
        ("filter", &cfg["filter_subject"]),
        ("ack policy", &cfg["ack_policy"]),
        ("pending", &c["num_pending"]),
        ("ack pending", &c["num_ack_pending"]),
        ("redelivered", &c["num_redelivered"]),
    ] {
        println!("  {:<13} {}", format!("{label}:"), output::plain(v));
    }
    println!(
        "  {:<13} stream {} consumer {}",
        "delivered:",
        output::plain(&c["delivered"]["stream_seq"]),
        output::plain(&c["delivered"]["consumer_seq"])
    );
    println!(
        "  {:<13} stream {} consumer {}",
        "ack floor:",
        output::plain(&c["ack_floor"]["stream_seq"]),
        output::plain(&c["ack_floor"]["consumer_seq"])
    );
}

fn print_consumers(list: &Value) {
    let header = ["NAME", "FILTER", "PENDING", "ACK PENDING"];
    print_list(list, &header, "no consumers", |c| {
        let c = c.get("consumer").unwrap_or(c);
        let cfg = config_of(c);
        vec![
            output::plain(cfg.get("name").unwrap_or(c)),
            output::plain(&cfg["filter_subject"]),
            output::plain(&c["num_pending"]),
            output::plain(&c["num_ack_pending"]),
        ]
    });
}

/// `consumer ack|nak|term|wip STREAM NAME SEQ`: the event of that name
/// for one delivered message.
fn settle(p: &Parsed, event: &str) -> Result<(), Run> {
    let (stream, name) = (&p.args[0], &p.args[1]);
    let Ok(seq) = p.args[2].trim().parse::<u64>() else {
        return Err(p
            .usage_error(format!("SEQ: {:?} is not a whole number", p.args[2]))
            .into());
    };
    let mut args = json!({"stream": stream, "consumer": name, "seq": seq});
    // Only `nak` has --delay (getopts panics on an option it lacks).
    if event == "nak" {
        if let Some(d) = p.opt_duration("delay")? {
            args["delay_ms"] = json!(d.as_millis() as u64);
        }
    }
    if call_once(p, event, args)?.is_some() {
        let done = match event {
            "ack" => "acked",
            "nak" => "handed back",
            "term" => "terminated",
            _ => "extended the ack wait of",
        };
        println!("{done} message {seq} of consumer {name} on stream {stream}");
    }
    Ok(())
}

/// `consumer next`: fetch up to `--count` messages and ack each.
fn next(p: &Parsed) -> Result<(), Run> {
    let (stream, name) = (&p.args[0], &p.args[1]);
    let count = p.opt_u64("count")?.unwrap_or(1);
    if count == 0 {
        return Err(p.usage_error("--count: must be at least 1".into()).into());
    }
    let expires = p.opt_duration("expires")?.unwrap_or(NEXT_EXPIRES_DEFAULT);
    let no_wait = p.flag("no-wait");
    let ack = !p.flag("no-ack");
    // Each fetch may wait `expires` on the server before it is acked.
    let client = connect_timeout(&p.global, Namespace::Root, p.global.timeout + expires)?;
    let mut got = 0u64;
    while got < count {
        let mut args = json!({
            "stream": stream,
            "consumer": name,
            "batch": count - got,
            "expires_ms": expires.as_millis() as u64,
        });
        if no_wait {
            args["no_wait"] = json!(true);
        }
        let reply = call(&client, "consumer.fetch", args)?;
        let messages = reply["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in &messages {
            got += 1;
            if ack {
                let seq = m["seq"].clone();
                call(
                    &client,
                    "ack",
                    json!({"stream": stream, "consumer": name, "seq": seq}),
                )?;
            }
            if p.global.json {
                output::json_line(m);
            } else {
                println!(
                    "[{}] {} {}{}",
                    output::plain(&m["seq"]),
                    output::plain(&m["subject"]),
                    output::plain(&m["data"]),
                    if ack { " (acked)" } else { "" }
                );
            }
        }
    }
    let _ = client.close();
    if got == 0 {
        return Err(Failure(format!(
            "no message from consumer {name} of stream {stream}"
        ))
        .into());
    }
    Ok(())
}
