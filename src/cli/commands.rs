//! The messaging commands (`pub`, `sub`, `req`, `reply`, `rtt`), the
//! `/control` ones (`server info`, `group set|ls`,
//! `cluster status|add|remove`) and the HTTP reads (`server health`,
//! `server metrics`).

use std::collections::BTreeMap;
use std::io::Write as _;

use serde_json::{json, Map, Value};

use super::args::Parsed;
use super::output::{self, Failure};
use super::{connect, connect_timeout, Namespace, Run};
use crate::client::{Message, OutMessage, Payload};

/// DATA as given: JSON when it parses as JSON, else the text as a string.
pub fn parse_data(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// `--header K:V` options as a map.
fn headers(p: &Parsed) -> Result<Option<BTreeMap<String, String>>, Run> {
    let mut map = BTreeMap::new();
    for h in p.matches.opt_strs("header") {
        let Some((k, v)) = h.split_once(':') else {
            return Err(p.usage_error(format!("--header: {h:?} is not K:V")).into());
        };
        if k.trim().is_empty() {
            return Err(p.usage_error(format!("--header: {h:?} has no name")).into());
        }
        map.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok((!map.is_empty()).then_some(map))
}

/// The ack or reply without its `ok` field.
pub fn strip_ok(v: Value) -> Value {
    match v {
        Value::Object(mut m) => {
            m.remove("ok");
            Value::Object(m)
        }
        other => other,
    }
}

/// A delivered message as JSON (one line per message in `--json` mode).
fn message_json(m: &Message) -> Value {
    let mut o = Map::new();
    o.insert("subject".into(), json!(m.subject));
    o.insert("data".into(), m.data.clone());
    if let Some(r) = &m.reply {
        o.insert("reply".into(), json!(r));
    }
    if let Some(h) = &m.headers {
        o.insert("headers".into(), json!(h));
    }
    if let Some(d) = &m.stream {
        o.insert("stream".into(), json!(d.stream));
        o.insert("consumer".into(), json!(d.consumer));
        o.insert("seq".into(), json!(d.seq));
        o.insert("delivered".into(), json!(d.delivered));
    }
    Value::Object(o)
}

/// A delivered message as one line of text.
fn message_text(n: u64, m: &Message) -> String {
    let mut s = format!("[#{n}] {}", m.subject);
    if let Some(r) = &m.reply {
        s.push_str(&format!(" reply={r}"));
    }
    if let Some(h) = &m.headers {
        s.push_str(&format!(" headers={}", json!(h)));
    }
    if let Some(d) = &m.stream {
        s.push_str(&format!(" stream={}#{}", d.stream, d.seq));
    }
    s.push(' ');
    s.push_str(&output::plain(&m.data));
    s
}

fn print_message(p: &Parsed, n: u64, m: &Message) {
    if p.global.json {
        output::json_line(&message_json(m));
    } else {
        println!("{}", message_text(n, m));
    }
    let _ = std::io::stdout().flush();
}

pub fn publish(p: &Parsed) -> Result<(), Run> {
    let subject = &p.args[0];
    let count = p.opt_u64("count")?.unwrap_or(1);
    if count == 0 {
        return Err(p.usage_error("--count: must be at least 1".into()).into());
    }
    let headers = headers(p)?;
    let reply = p.opt("reply");
    let client = connect(&p.global, Namespace::Root)?;
    let mut last_ack = Value::Null;
    for n in 1..=count {
        let text = p.args[1].replace("{{n}}", &n.to_string());
        let mut msg = OutMessage::new(subject, Payload::Json(parse_data(&text)));
        msg.headers = headers.clone();
        msg.reply = reply.clone();
        // Every publish is acked, so errors (bad subject, too large, a
        // stream limit) are reported and nothing is left in flight.
        last_ack = client
            .publish_msg(&msg, true)
            .map_err(|e| Failure::call(&format!("publish to {subject}"), &e))?;
    }
    let mut summary = strip_ok(last_ack);
    if let Value::Object(m) = &mut summary {
        m.insert("subject".into(), json!(subject));
        m.insert("published".into(), json!(count));
    }
    if p.global.json {
        output::json_line(&summary);
    } else {
        let stored = match (summary.get("stream"), summary.get("seq")) {
            (Some(s), Some(q)) => format!(" (stream {} seq {})", output::plain(s), q),
            _ => String::new(),
        };
        let what = if count == 1 {
            "message".to_string()
        } else {
            format!("{count} messages")
        };
        println!("published {what} to {subject}{stored}");
    }
    let _ = client.close();
    Ok(())
}

pub fn subscribe(p: &Parsed) -> Result<(), Run> {
    let subject = &p.args[0];
    let queue = p.opt("queue");
    let count = p.opt_u64("count")?;
    let client = connect(&p.global, Namespace::Root)?;
    let sub = client
        .subscribe_with(subject, queue.as_deref(), count)
        .map_err(|e| Failure::call(&format!("subscribe to {subject}"), &e))?;
    match &queue {
        Some(q) => eprintln!("subscribed to {subject} in queue {q}"),
        None => eprintln!("subscribed to {subject}"),
    }
    let mut n = 0;
    while count.is_none_or(|c| n < c) {
        let m = sub
            .recv()
            .map_err(|e| Failure::call("waiting for messages", &e))?;
        n += 1;
        print_message(p, n, &m);
    }
    let _ = client.close();
    Ok(())
}

pub fn request(p: &Parsed) -> Result<(), Run> {
    let subject = &p.args[0];
    let mut msg = OutMessage::new(subject, Payload::Json(parse_data(&p.args[1])));
    msg.headers = headers(p)?;
    let client = connect(&p.global, Namespace::Root)?;
    let started = std::time::Instant::now();
    let reply = client
        .request_msg(&msg, p.global.timeout)
        .map_err(|e| Failure::call(&format!("request to {subject}"), &e))?;
    let took = started.elapsed();
    if p.global.json {
        let mut v = message_json(&reply);
        v["took_ms"] = json!(took.as_secs_f64() * 1000.0);
        output::json_line(&v);
    } else {
        if let Some(h) = &reply.headers {
            for (k, v) in h {
                println!("{k}: {v}");
            }
        }
        println!("{}", output::plain(&reply.data));
    }
    let _ = client.close();
    Ok(())
}

pub fn reply(p: &Parsed) -> Result<(), Run> {
    let subject = &p.args[0];
    let response = parse_data(&p.args[1]);
    let queue = p.opt("queue");
    let count = p.opt_u64("count")?;
    let client = connect(&p.global, Namespace::Root)?;
    let sub = client
        .subscribe_with(subject, queue.as_deref(), None)
        .map_err(|e| Failure::call(&format!("subscribe to {subject}"), &e))?;
    eprintln!("answering requests on {subject}");
    let mut n = 0;
    while count.is_none_or(|c| n < c) {
        let m = sub
            .recv()
            .map_err(|e| Failure::call("waiting for requests", &e))?;
        let Some(to) = &m.reply else {
            continue; // A plain publish: nobody to answer.
        };
        n += 1;
        print_message(p, n, &m);
        client
            .publish_msg(&OutMessage::new(to, Payload::Json(response.clone())), true)
            .map_err(|e| Failure::call(&format!("reply to {to}"), &e))?;
    }
    let _ = client.close();
    Ok(())
}

/// Sends `event` with no arguments on /control and returns its ack
/// without `ok`.
fn control_call(p: &Parsed, event: &str) -> Result<Value, Run> {
    control_call_with(p, event, json!({}))
}

fn control_call_with(p: &Parsed, event: &str, args: Value) -> Result<Value, Run> {
    let client = connect(&p.global, Namespace::Control)?;
    let ack = client
        .call(event, args)
        .map_err(|e| Failure::call(event, &e))?;
    let _ = client.close();
    Ok(strip_ok(ack))
}

/// `rtt`: one `ping` event and the time its ack took.
pub fn rtt(p: &Parsed) -> Result<(), Run> {
    let client = connect(&p.global, Namespace::Root)?;
    let started = std::time::Instant::now();
    client.ping().map_err(|e| Failure::call("ping", &e))?;
    let took = started.elapsed();
    let _ = client.close();
    let server = client_url(p);
    if p.global.json {
        output::json_line(&json!({"server": server, "rtt_ms": took.as_secs_f64() * 1000.0}));
    } else {
        println!("{server}: rtt {:.3} ms", took.as_secs_f64() * 1000.0);
    }
    Ok(())
}

fn client_url(p: &Parsed) -> &str {
    p.global.servers.first().map_or("", String::as_str)
}

/// `server health` (`/healthz`) and `server metrics` (`/metrics`): an HTTP
/// GET on the first server that answers. `health` fails unless it is 200.
pub fn server_http(p: &Parsed) -> Result<(), Run> {
    let path = match p.command.path[1] {
        "health" => "/healthz",
        _ => "/metrics",
    };
    let mut last = None;
    for server in &p.global.servers {
        match crate::client::http_get(server, path, p.global.timeout) {
            Ok((code, body)) => {
                if path == "/metrics" {
                    print!("{body}");
                } else if p.global.json {
                    let status: Value = serde_json::from_str(&body).unwrap_or(json!(body));
                    output::json_line(&json!({"server": server, "code": code, "health": status}));
                } else {
                    println!("{server}: {code} {}", body.trim());
                }
                if code != 200 {
                    return Err(Failure(format!("{server}{path} answered {code}")).into());
                }
                return Ok(());
            }
            Err(e) => last = Some(Failure::call(&format!("GET {server}{path}"), &e)),
        }
    }
    Err(last
        .unwrap_or_else(|| Failure("no server given".into()))
        .into())
}

/// `group set QUEUE MODE`.
pub fn group_set(p: &Parsed) -> Result<(), Run> {
    let (queue, mode) = (&p.args[0], &p.args[1]);
    if !["loadbalance", "broadcast"].contains(&mode.as_str()) {
        return Err(p
            .usage_error(format!("MODE: {mode:?} is not loadbalance or broadcast"))
            .into());
    }
    control_call_with(p, "group.set", json!({"queue": queue, "mode": mode}))?;
    if p.global.json {
        output::json_line(&json!({"ok": true, "queue": queue, "mode": mode}));
    } else {
        println!("queue group {queue}: {mode}");
    }
    Ok(())
}

/// `group ls`.
pub fn group_list(p: &Parsed) -> Result<(), Run> {
    let ack = control_call(p, "group.list")?;
    if p.global.json {
        output::json_pretty(&ack);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = ack["groups"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .map(|g| vec![output::plain(&g["queue"]), output::plain(&g["mode"])])
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        println!("no queue group rules (every queue load-balances)");
    } else {
        output::table(&["QUEUE", "MODE"], &rows);
    }
    Ok(())
}

pub fn server_info(p: &Parsed) -> Result<(), Run> {
    let info = control_call(p, "server.info")?;
    if p.global.json {
        output::json_pretty(&info);
    } else {
        output::fields(&info);
    }
    Ok(())
}

pub fn cluster_status(p: &Parsed) -> Result<(), Run> {
    let status = control_call(p, "cluster.status")?;
    if p.global.json {
        output::json_pretty(&status);
    } else {
        for k in ["node_id", "leader", "term", "commit_index"] {
            println!("{:<13} {}", format!("{k}:"), output::plain(&status[k]));
        }
        let rows: Vec<Vec<String>> = status["peers"]
            .as_array()
            .map(|peers| {
                peers
                    .iter()
                    .map(|peer| {
                        ["id", "state", "match_index", "voter"]
                            .iter()
                            .map(|k| output::plain(&peer[*k]))
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default();
        println!();
        output::table(&["PEER", "STATE", "MATCH INDEX", "VOTER"], &rows);
    }
    Ok(())
}

/// How long `cluster add` waits at least: the node must catch up first
/// (the broker answers within a minute).
const ADD_WAIT: std::time::Duration = std::time::Duration::from_secs(65);

pub fn cluster_add(p: &Parsed) -> Result<(), Run> {
    let (id, raft_addr, addr) = (&p.args[0], &p.args[1], &p.args[2]);
    let client = connect_timeout(
        &p.global,
        Namespace::Control,
        p.global.timeout.max(ADD_WAIT),
    )?;
    let args = json!({"id": id, "raft_addr": raft_addr, "addr": addr});
    client
        .call("cluster.add", args)
        .map_err(|e| Failure::call("cluster.add", &e))?;
    let _ = client.close();
    if p.global.json {
        output::json_line(&json!({"ok": true, "added": id}));
    } else {
        println!("added {id}: it votes now");
    }
    Ok(())
}

pub fn cluster_remove(p: &Parsed) -> Result<(), Run> {
    let id = &p.args[0];
    let wait = std::time::Duration::from_secs(20);
    let client = connect_timeout(&p.global, Namespace::Control, p.global.timeout.max(wait))?;
    client
        .call("cluster.remove", json!({"id": id}))
        .map_err(|e| Failure::call("cluster.remove", &e))?;
    let _ = client.close();
    if p.global.json {
        output::json_line(&json!({"ok": true, "removed": id}));
    } else {
        println!("removed {id}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_json_when_it_parses() {
        assert_eq!(parse_data("42"), json!(42));
        assert_eq!(parse_data(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(parse_data("hello world"), json!("hello world"));
        assert_eq!(parse_data(r#""quoted""#), json!("quoted"));
    }

    #[test]
    fn message_lines() {
        let m = Message {
            sid: "1".into(),
            subject: "a.b".into(),
            data: json!("hi"),
            reply: None,
            headers: None,
            attachments: vec![],
            stream: None,
        };
        assert_eq!(message_text(3, &m), "[#3] a.b hi");
        assert_eq!(message_json(&m), json!({"subject": "a.b", "data": "hi"}));
    }
}
