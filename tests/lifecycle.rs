//! The broker process's lifecycle from outside: SIGTERM under load ends it
//! with status 0 within 5 s after telling clients goodbye, every stream
//! message acked before it is there after a restart, and (once the final
//! fsync finishes in time) every message there was acked; flags can come
//! from GOMBUS_* environment variables (flags winning); the start-up config
//! line shows no secrets; `-log-level` filters lines.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::{Client, Error, Options};
use serde_json::{json, Value};

/// Polls `cond` until it holds or `limit` passes.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    cond()
}

#[test]
fn sigterm_under_load_exits_zero_within_5s_and_disconnects_clients() {
    let mut broker = Broker::start(&[]);
    let receiver = Client::connect(&broker.addr).unwrap();
    let sub = receiver.subscribe("load.>").unwrap();
    let control = Client::connect_with(
        &broker.addr,
        Options {
            namespace: "/control".into(),
            ..Options::default()
        },
    )
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut publishers = Vec::new();
    for i in 0..4 {
        let addr = broker.addr.clone();
        let stop = Arc::clone(&stop);
        let sent = Arc::clone(&sent);
        publishers.push(thread::spawn(move || {
            let c = Client::connect(&addr).unwrap();
            let subject = format!("load.{i}");
            while !stop.load(Ordering::Relaxed) {
                if c.publish(&subject, json!({"n": i, "pad": "x".repeat(200)}))
                    .is_err()
                {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Load is flowing: the subscriber has seen messages.
    assert!(sub.recv_timeout(Duration::from_secs(5)).is_ok());
    assert!(wait_for(Duration::from_secs(5), || sent
        .load(Ordering::Relaxed)
        > 1000));

    let t0 = Instant::now();
    let status = broker.terminate(Duration::from_secs(5));
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let status = status.unwrap_or_else(|| {
        panic!(
            "still running 5 s after SIGTERM; log:\n{}",
            broker.recent_log()
        )
    });
    assert!(status.success(), "exit status {status:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // Both namespaces were told, so the clients see their sockets end.
    assert!(wait_for(Duration::from_secs(3), || receiver.is_closed()));
    assert!(wait_for(Duration::from_secs(3), || control.is_closed()));
    assert!(matches!(
        control.call("server.info", json!({})),
        Err(Error::Closed | Error::Io(_))
    ));
    for p in publishers {
        p.join().unwrap();
    }
    let log = broker.recent_log();
    assert!(log.contains("shutting down"), "{log}");
    assert!(
        log.lines().last().unwrap_or("").ends_with("stopped"),
        "{log}"
    );
}

/// A raw WebSocket client that joins `/`, subscribes to `subject` and then
/// never reads again, so the broker's queue for it only grows.
fn stalled_subscriber(addr: &str, subject: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    // Read until the 101 head and the open packet have arrived.
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(5).any(|w| w == b"\"sid\"") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed during the handshake");
        seen.extend_from_slice(&buf[..n]);
    }
    // Masked text frames with a zero mask key: the payload goes as is.
    let mut frame = |text: &str| {
        let mut f = vec![0x81, 0x80 | text.len() as u8, 0, 0, 0, 0];
        f.extend_from_slice(text.as_bytes());
        s.write_all(&f).unwrap();
    };
    frame("40");
    frame(&format!("42[\"sub\",{{\"subject\":\"{subject}\"}}]"));
    s
}

#[test]
fn sigterm_is_bounded_even_with_a_client_that_stopped_reading() {
    let mut broker = Broker::start(&[]);
    let _stalled = stalled_subscriber(&broker.addr, "flood");
    let publisher = Client::connect(&broker.addr).unwrap();
    let pad = "y".repeat(16 * 1024);
    // The stalled client's sub is on another connection, so wait
    // (bounded) until the broker reports it.
    let control = Client::connect_with(
        &broker.addr,
        Options {
            namespace: "/control".into(),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(wait_for(Duration::from_secs(5), || control
        .call("server.info", json!({}))
        .is_ok_and(|i| i["subscriptions"] == 1)));
    // About 32 MiB queued for a reader that never reads.
    for _ in 0..2048 {
        publisher.publish("flood", &pad).unwrap();
    }
    publisher.ping().unwrap();
    let t0 = Instant::now();
    let status = broker.terminate(Duration::from_secs(5));
    let took = t0.elapsed();
    let status = status.unwrap_or_else(|| panic!("still running 5 s after SIGTERM"));
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    eprintln!("stopped in {took:?} with a stalled client");
}

#[test]
fn sigterm_under_stream_load_keeps_every_acked_message() {
    let mut broker = Broker::start(&[]);
    let admin = Client::connect(&broker.addr).unwrap();
    admin
        .call(
            "stream.create",
            json!({"name": "LOAD", "subjects": ["load.>"]}),
        )
        .unwrap();
    let acked = Arc::new(std::sync::Mutex::new(Vec::<(u64, Value)>::new()));
    let mut publishers = Vec::new();
    for p in 0..4u64 {
        let addr = broker.addr.clone();
        let acked = Arc::clone(&acked);
        publishers.push(thread::spawn(move || {
            let c = Client::connect(&addr).unwrap();
            for n in 0u64.. {
                let data = json!({"p": p, "n": n});
                // The broker going away ends the loop with an error.
                let Ok(ack) = c.publish_acked(&format!("load.{p}"), &data) else {
                    break;
                };
                let seq = ack["seq"].as_u64().expect("a stream ack carries seq");
                acked.lock().unwrap().push((seq, data));
            }
        }));
    }
    assert!(wait_for(Duration::from_secs(10), || acked
        .lock()
        .unwrap()
        .len()
        >= 200));
    let t0 = Instant::now();
    let status = broker.terminate(Duration::from_secs(5));
    let took = t0.elapsed();
    let status = status.unwrap_or_else(|| panic!("still running 5 s after SIGTERM"));
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    for p in publishers {
        p.join().unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    // Whether the final fsync round finished in time (then every held ack
    // it covered went out before the DISCONNECT), from the log's last lines.
    assert!(wait_for(Duration::from_secs(3), || broker
        .recent_log()
        .lines()
        .any(|l| l.ends_with(" stopped"))));
    let log = broker.recent_log();
    let synced = log.contains("shutting down: streams written and synced");
    assert!(
        synced || log.contains("the final fsync did not finish"),
        "no word on the final fsync:\n{log}"
    );

    broker.restart(&[]);
    let c = Client::connect(&broker.addr).unwrap();
    let info = c.call("stream.info", json!({"name": "LOAD"})).unwrap();
    let state = &info["stream"]["state"];
    assert!(
        state["messages"].as_u64().unwrap() >= acked.len() as u64,
        "{info}"
    );
    for (seq, data) in &acked {
        let got = c
            .call("stream.get", json!({"name": "LOAD", "seq": seq}))
            .unwrap_or_else(|e| panic!("acked seq {seq} is gone after restart: {e}"));
        assert_eq!(&got["message"]["data"], data, "seq {seq}");
    }
    // What is there but was never acked: each publisher had at most one
    // publish in flight, and once the final fsync finished its ack (if the
    // message was stored) went out ahead of the DISCONNECT, so then none.
    let acked_seqs: std::collections::HashSet<u64> = acked.iter().map(|(s, _)| *s).collect();
    let (first, last) = (
        state["first_seq"].as_u64().unwrap(),
        state["last_seq"].as_u64().unwrap(),
    );
    let mut unacked = Vec::new();
    for seq in (first..=last).filter(|s| !acked_seqs.contains(s)) {
        let got = c
            .call("stream.get", json!({"name": "LOAD", "seq": seq}))
            .unwrap();
        unacked.push(got["message"]["data"].clone());
    }
    for p in 0..4u64 {
        let n = acked.iter().filter(|(_, d)| d["p"] == p).count() as u64;
        let extra: Vec<&Value> = unacked.iter().filter(|d| d["p"] == p).collect();
        // Only the publish that was in flight can be there unacked.
        assert!(
            extra.is_empty() || extra == [&json!({"p": p, "n": n})],
            "publisher {p}: {n} acked, also stored: {extra:?}"
        );
    }
    if synced {
        assert!(
            unacked.is_empty(),
            "stored but never acked although the final fsync finished: {unacked:?}\n{}",
            broker.recent_log()
        );
    }
    eprintln!(
        "{} acked messages all present after SIGTERM and restart; {} stored unacked; {}",
        acked.len(),
        unacked.len(),
        log.lines()
            .find(|l| l.contains("shutting down: streams") || l.contains("final fsync"))
            .unwrap_or("")
    );
}

/// One HTTP/1.1 request on a fresh connection; the response body.
fn http_body(addr: &str, method: &str, target: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: text/plain;charset=UTF-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[test]
fn sigterm_tells_a_long_polling_client_through_its_held_get() {
    let mut broker = Broker::start(&[]);
    let addr = broker.addr.clone();
    let open = http_body(&addr, "GET", "/socket.io/?EIO=4&transport=polling", "");
    let sid = open
        .split("\"sid\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no sid in {open:?}"))
        .to_string();
    let target = format!("/socket.io/?EIO=4&transport=polling&sid={sid}");
    assert_eq!(http_body(&addr, "POST", &target, "40"), "ok");
    let joined = http_body(&addr, "GET", &target, "");
    assert!(joined.starts_with("40{"), "{joined}");
    // A GET that the broker holds until it has something to say.
    let held = {
        let (addr, target) = (addr.clone(), target.clone());
        thread::spawn(move || http_body(&addr, "GET", &target, ""))
    };
    // Wait (bounded) until the broker has the GET's connection: open TCP
    // connections are then the held GET and the scrape asking.
    let tcp_open = || {
        http_body(&addr, "GET", "/metrics", "")
            .lines()
            .find_map(|l| l.strip_prefix("gombus_connections "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(wait_for(Duration::from_secs(5), || tcp_open() >= 2));
    let status = broker
        .terminate(Duration::from_secs(5))
        .expect("exit within 5 s");
    assert!(status.success(), "{status:?}");
    let last = held.join().unwrap();
    // Socket.IO DISCONNECT on `/`, then Engine.IO close, in one payload
    // (packets separated by the record separator 0x1e).
    let packets: Vec<&str> = last.split('\u{1e}').collect();
    assert!(packets.contains(&"41"), "{last:?}");
    assert_eq!(packets.last(), Some(&"1"), "{last:?}");
}

#[test]
fn sigint_also_stops_cleanly() {
    let mut broker = Broker::start(&[]);
    let client = Client::connect(&broker.addr).unwrap();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &broker.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(wait_for(Duration::from_secs(5), || client.is_closed()));
    // The process is gone or going; a SIGTERM now finds it exited with 0
    // (kill of an exited-but-unreaped child still succeeds).
    let status = broker.terminate(Duration::from_secs(5)).unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn env_vars_set_flags_and_flags_win() {
    let broker = Broker::start_with_env(
        &[],
        &[
            ("GOMBUS_CONTROL_TOKEN", "s3cret-from-env"),
            ("GOMBUS_MAX_PAYLOAD", "1KiB"),
            // The harness passes -node-id=test: the flag wins.
            ("GOMBUS_NODE_ID", "from-env"),
        ],
    );
    let no_token = Client::connect_with(
        &broker.addr,
        Options {
            namespace: "/control".into(),
            ..Options::default()
        },
    );
    assert_eq!(
        no_token.unwrap_err(),
        Error::ConnectRefused("unauthorized".into())
    );
    let control = Client::connect_with(
        &broker.addr,
        Options {
            namespace: "/control".into(),
            token: Some("s3cret-from-env".into()),
            ..Options::default()
        },
    )
    .unwrap();
    let info = control.call("server.info", json!({})).unwrap();
    assert_eq!(info["node_id"], "test");

    let client = Client::connect(&broker.addr).unwrap();
    let err = client.publish_acked("big", "x".repeat(2000)).unwrap_err();
    assert_eq!(err.code(), Some("payload_too_large"));
    client.publish_acked("small", "x".repeat(500)).unwrap();

    // The config line names every setting but never the token itself.
    let log = broker.recent_log();
    let config = log
        .lines()
        .find(|l| l.contains(" config "))
        .unwrap_or_else(|| panic!("no config line in:\n{log}"));
    assert!(config.contains("control_token=set"), "{config}");
    assert!(config.contains("max_payload=1KiB"), "{config}");
    assert!(config.contains("node_id=test"), "{config}");
    assert!(!log.contains("s3cret-from-env"), "{log}");
}

#[test]
fn bad_env_value_is_refused_with_the_variable_named() {
    let out = std::process::Command::new(common::broker_bin())
        .arg("-addr=127.0.0.1:0")
        .env("GOMBUS_PING_INTERVAL", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GOMBUS_PING_INTERVAL"), "{err}");
}

#[test]
fn log_level_filters_lines() {
    let quiet = Broker::start(&[]);
    let debug = Broker::start(&["-log-level=debug"]);
    for b in [&quiet, &debug] {
        let c = Client::connect(&b.addr).unwrap();
        c.ping().unwrap();
        c.close().unwrap();
    }
    assert!(wait_for(Duration::from_secs(5), || debug
        .recent_log()
        .contains(" closed")));
    let log = debug.recent_log();
    assert!(
        log.lines()
            .any(|l| l.contains(" debug ") && l.contains("joined /")),
        "{log}"
    );
    // Every line: an RFC 3339 UTC timestamp, then the level.
    for line in log.lines() {
        let mut parts = line.split_whitespace();
        let ts = parts.next().unwrap_or("");
        assert!(ts.len() == 24 && ts.ends_with('Z'), "{line}");
        assert!(
            matches!(parts.next(), Some("error" | "warn" | "info" | "debug")),
            "{line}"
        );
    }
    assert!(
        !quiet.recent_log().contains(" debug "),
        "{}",
        quiet.recent_log()
    );
}
