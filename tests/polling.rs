//! HTTP long-polling against the broker: Socket.IO over polling next to
//! WebSocket clients (binary attachments both ways), and the edge cases a
//! polling client can cause (concurrent GETs, an oversized POST, an unknown
//! sid, a session left to expire, a client that vanishes mid-long-poll, a
//! session that never polls while messages pile up). After each, the
//! `gombus_polling_sessions` gauge in /metrics must come back down: no case
//! leaks a session. Contract: docs/PROTOCOL.md §1, §3, §4.
//!
//! Then hostile clients of the HTTP and WebSocket transports and of the
//! stream events: floods of heartbeat packets, of WebSocket pings and of
//! upgrade probes, pipelined requests never read, input piled up behind a
//! held GET, payloads of countless tiny packets, slow heads and bodies,
//! competing probes, 100 000 abandoned handshakes, absurd numbers in stream
//! events, fetch waits and streams past their caps. Each checks that the
//! broker's RSS stays bounded where memory is at stake, that a fresh client
//! is served and that a subscriber that was there all along still gets
//! what is published to it.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Broker;
use serde_json::Value;
use tungstenite::{Message, WebSocket};

const WAIT: Duration = Duration::from_secs(5);
const PING_INTERVAL_MS: u64 = 300;
const PING_TIMEOUT_MS: u64 = 200;
/// How long a session may outlive its heartbeat on a busy machine.
const SLACK: Duration = Duration::from_secs(2);

fn broker(extra: &[&str]) -> Broker {
    let mut args = vec![
        format!("-ping-interval={PING_INTERVAL_MS}ms"),
        format!("-ping-timeout={PING_TIMEOUT_MS}ms"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Broker::start(&args)
}

struct Answer {
    status: u16,
    body: String,
}

/// One request with `Connection: close`, read to EOF.
fn request(addr: &str, method: &str, target: &str, body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut raw = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    s.write_all(&raw).expect("write");
    read_answer(s)
}

fn read_answer(mut s: TcpStream) -> Answer {
    let mut raw = Vec::new();
    let deadline = Instant::now() + WAIT;
    let mut chunk = [0u8; 8192];
    loop {
        assert!(Instant::now() < deadline, "no complete answer");
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    Answer {
        status,
        body: body.to_string(),
    }
}

fn target(sid: &str) -> String {
    format!("/socket.io/?EIO=4&transport=polling&sid={sid}")
}

fn open(addr: &str) -> String {
    let a = request(addr, "GET", "/socket.io/?EIO=4&transport=polling", b"");
    assert_eq!(a.status, 200, "{}", a.body);
    let open: Value = serde_json::from_str(&a.body[1..]).expect("open packet");
    assert_eq!(open["upgrades"], serde_json::json!(["websocket"]));
    open["sid"].as_str().expect("sid").to_string()
}

fn post(addr: &str, sid: &str, body: &str) -> Answer {
    request(addr, "POST", &target(sid), body.as_bytes())
}

fn get(addr: &str, sid: &str) -> Answer {
    request(addr, "GET", &target(sid), b"")
}

/// A gauge or counter from /metrics.
fn metric(addr: &str, name: &str) -> u64 {
    let a = request(addr, "GET", "/metrics", b"");
    a.body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// Waits (bounded) until `name` reads `want`.
fn wait_metric(addr: &str, name: &str, want: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = metric(addr, name);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {got}, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn expiry() -> Duration {
    Duration::from_millis(PING_INTERVAL_MS + PING_TIMEOUT_MS) + SLACK
}

/// A Socket.IO client on polling: joins `/` and collects what GETs bring,
/// answering pings.
struct Poller {
    addr: String,
    sid: String,
    /// Packets received and not yet taken.
    inbox: Vec<String>,
}

impl Poller {
    fn join(addr: &str) -> Poller {
        let sid = open(addr);
        assert_eq!(post(addr, &sid, "40").body, "ok");
        let mut p = Poller {
            addr: addr.to_string(),
            sid,
            inbox: Vec::new(),
        };
        let connect = p.next(|t| t.starts_with("40"));
        assert!(connect.starts_with("40{\"sid\":"), "{connect}");
        p
    }

    fn send(&self, payload: &str) {
        assert_eq!(post(&self.addr, &self.sid, payload).body, "ok");
    }

    /// The first packet (polling as needed) that `pick` accepts.
    fn next(&mut self, pick: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.inbox.iter().position(|t| pick(t)) {
                return self.inbox.remove(i);
            }
            assert!(
                Instant::now() < deadline,
                "no such packet: {:?}",
                self.inbox
            );
            let a = get(&self.addr, &self.sid);
            assert_eq!(a.status, 200, "{}", a.body);
            for packet in a.body.split('\x1e') {
                if packet == "2" {
                    self.send("3");
                } else {
                    self.inbox.push(packet.to_string());
                }
            }
        }
    }

    /// Emits `event` with `arg` and ack id `id`; returns the ack's argument.
    fn call(&mut self, id: u64, event: &str, arg: &str) -> Value {
        self.send(&format!("42{id}[\"{event}\",{arg}]"));
        let head = format!("43{id}[");
        let ack = self.next(|t| t.starts_with(&head));
        let args: Value = serde_json::from_str(&ack[head.len() - 1..]).expect("ack JSON");
        args[0].clone()
    }
}

/// A Socket.IO client on WebSocket, joined to `/`.
fn ws_join(addr: &str) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let url = format!("ws://{addr}/socket.io/?EIO=4&transport=websocket");
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).expect("upgrade");
    let open = ws_next(&mut ws);
    assert!(matches!(&open, Message::Text(t) if t.starts_with('0')));
    ws.send(Message::text("40")).expect("send");
    let connect = ws_next(&mut ws);
    assert!(matches!(&connect, Message::Text(t) if t.starts_with("40")));
    ws
}

/// The next frame that is not an Engine.IO ping (pings are answered).
fn ws_next(ws: &mut WebSocket<TcpStream>) -> Message {
    loop {
        match ws.read().expect("read") {
            Message::Text(t) if t.as_str() == "2" => ws.send(Message::text("3")).expect("pong"),
            Message::Ping(_) | Message::Pong(_) => {}
            other => return other,
        }
    }
}

#[test]
fn polling_and_websocket_clients_exchange_text_and_bytes() {
    let b = broker(&[]);
    let mut poller = Poller::join(&b.addr);
    let mut ws = ws_join(&b.addr);
    assert_eq!(metric(&b.addr, "gombus_polling_sessions"), 1);

    // WebSocket subscriber, polling publisher with a binary attachment.
    ws.send(Message::text(r#"421["sub",{"subject":"mix.*","sid":"w"}]"#))
        .expect("send");
    assert_eq!(
        ws_next(&mut ws),
        Message::text(r#"431[{"ok":true,"sid":"w"}]"#)
    );
    poller.send(
        "451-1[\"pub\",{\"subject\":\"mix.bin\",\"data\":{\"_placeholder\":true,\"num\":0}}]\x1ebAAEC/w==",
    );
    let ack = poller.next(|t| t.starts_with("431["));
    assert_eq!(ack, r#"431[{"ok":true}]"#);
    let Message::Text(head) = ws_next(&mut ws) else {
        panic!("expected the msg head");
    };
    assert!(head.as_str().starts_with("451-[\"msg\","), "{head}");
    assert!(head.as_str().contains(r#""subject":"mix.bin""#), "{head}");
    assert_eq!(ws_next(&mut ws), Message::binary(vec![0, 1, 2, 255]));

    // Polling subscriber (wildcard), WebSocket publisher: text, then bytes.
    let ack = poller.call(2, "sub", r#"{"subject":"back.>","sid":"p"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    ws.send(Message::text(
        r#"422["pub",{"subject":"back.a.b","data":{"n":1}}]"#,
    ))
    .expect("send");
    let msg = poller.next(|t| t.starts_with("42[\"msg\""));
    let args: Value = serde_json::from_str(&msg[2..]).expect("msg JSON");
    assert_eq!(
        args[1],
        serde_json::json!({"sid":"p","subject":"back.a.b","data":{"n":1}})
    );
    ws.send(Message::text(
        r#"451-3["pub",{"subject":"back.bin","data":{"_placeholder":true,"num":0}}]"#,
    ))
    .expect("send");
    ws.send(Message::binary(vec![9, 8, 7])).expect("send");
    let head = poller.next(|t| t.starts_with("451-[\"msg\""));
    assert!(head.contains(r#""subject":"back.bin""#), "{head}");
    let attachment = poller.next(|t| t.starts_with('b'));
    assert_eq!(attachment, "bCQgH", "base64 of [9, 8, 7]");

    // Request/reply with the requester on polling.
    let _ = poller.call(4, "request", r#"{"subject":"nobody","data":1}"#);
    let ack = poller.call(5, "ping", "{}");
    assert_eq!(ack["ok"], true);
}

#[test]
fn concurrent_gets_end_the_session_and_leak_nothing() {
    let b = broker(&[]);
    let sid = open(&b.addr);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (addr, sid) = (b.addr.clone(), sid.clone());
            std::thread::spawn(move || get(&addr, &sid))
        })
        .collect();
    let mut got: Vec<(u16, String)> = threads
        .into_iter()
        .map(|t| {
            let a = t.join().expect("thread");
            (a.status, a.body)
        })
        .collect();
    got.sort();
    assert_eq!(got[0], (200, "1".to_string()), "{got:?}");
    assert_eq!(got[1].0, 400, "{got:?}");
    wait_metric(&b.addr, "gombus_polling_sessions", 0, WAIT);
    wait_metric(&b.addr, "gombus_sessions", 0, WAIT);
}

#[test]
fn an_oversized_post_gets_413_and_the_session_lives_on() {
    let b = broker(&["-max-payload=1000"]);
    let sid = open(&b.addr);
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
        target(&sid)
    );
    s.write_all(head.as_bytes()).expect("write");
    assert_eq!(read_answer(s).status, 413);
    assert_eq!(post(&b.addr, &sid, "40").status, 200);
    assert_eq!(metric(&b.addr, "gombus_polling_sessions"), 1);
    // Left alone, it expires.
    wait_metric(&b.addr, "gombus_polling_sessions", 0, expiry());
}

#[test]
fn an_unknown_sid_is_refused_with_code_1() {
    let b = broker(&[]);
    for method in ["GET", "POST"] {
        let a = request(&b.addr, method, &target("nope"), b"40");
        assert_eq!(a.status, 400);
        assert_eq!(a.body, r#"{"code":1,"message":"Session ID unknown"}"#);
    }
    assert_eq!(metric(&b.addr, "gombus_polling_sessions"), 0);
}

#[test]
fn abandoned_sessions_expire_after_the_heartbeat() {
    let b = broker(&[]);
    let started = Instant::now();
    for _ in 0..20 {
        let sid = open(&b.addr);
        assert_eq!(post(&b.addr, &sid, "40").status, 200);
    }
    assert_eq!(metric(&b.addr, "gombus_polling_sessions"), 20);
    wait_metric(&b.addr, "gombus_polling_sessions", 0, expiry());
    assert!(
        started.elapsed() >= Duration::from_millis(PING_INTERVAL_MS + PING_TIMEOUT_MS),
        "expired before pingInterval + pingTimeout"
    );
    wait_metric(&b.addr, "gombus_sessions", 0, WAIT);
}

#[test]
fn a_client_that_vanishes_mid_long_poll_leaks_nothing() {
    let b = broker(&[]);
    let baseline = metric(&b.addr, "gombus_connections");
    let sid = open(&b.addr);
    // A GET that will be held (nothing is queued), then the client is gone.
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", target(&sid));
    s.write_all(req.as_bytes()).expect("write");
    drop(s);
    wait_metric(&b.addr, "gombus_polling_sessions", 0, expiry());
    wait_metric(&b.addr, "gombus_sessions", 0, WAIT);
    // Only the /metrics request's own connection is open.
    wait_metric(&b.addr, "gombus_connections", baseline, WAIT);
}

#[test]
fn a_session_that_never_polls_is_cut_as_a_slow_consumer() {
    // The default heartbeat: the publisher is paused (backpressure) while
    // the receiver lags, longer than the short test heartbeat allows.
    let b = Broker::start(&["-max-pending=65536"]);
    let mut idle = Poller::join(&b.addr);
    let ack = idle.call(1, "sub", r#"{"subject":"flood"}"#);
    assert_eq!(ack["ok"], true);
    let mut ws = ws_join(&b.addr);
    let data = "x".repeat(4096);
    let before = metric(&b.addr, "gombus_slow_consumers_total");
    // Enough messages to pass the 64 KiB bound while nobody polls.
    for i in 0..40 {
        let event = format!(r#"42["pub",{{"subject":"flood","data":"{data}{i}"}}]"#);
        ws.send(Message::text(event)).expect("send");
    }
    ws.send(Message::text(r#"4299["ping",{}]"#)).expect("send");
    assert_eq!(ws_next(&mut ws), Message::text(r#"4399[{"ok":true}]"#));
    wait_metric(&b.addr, "gombus_polling_sessions", 0, WAIT);
    assert!(metric(&b.addr, "gombus_slow_consumers_total") > before);
    assert_eq!(get(&b.addr, &idle.sid).status, 400);
}

#[test]
fn eio3_sessions_use_v3_payloads_and_client_pings() {
    let b = broker(&[]);
    let a = request(&b.addr, "GET", "/socket.io/?EIO=3&transport=polling", b"");
    assert_eq!(a.status, 200);
    // `<length>:<packet>` framing; the open packet, then the implicit
    // CONNECT to `/` that Socket.IO v4 servers send.
    let (len, rest) = a.body.split_once(':').expect("length prefix");
    let len: usize = len.parse().expect("length");
    let open = &rest[..len];
    assert!(open.starts_with("0{"), "{open}");
    let sid = serde_json::from_str::<Value>(&open[1..]).expect("open JSON")["sid"]
        .as_str()
        .expect("sid")
        .to_string();
    let connect = &rest[len..];
    assert!(
        connect.starts_with("2:40") || connect.is_empty(),
        "{connect}"
    );
    let target = format!("/socket.io/?EIO=3&transport=polling&sid={sid}");
    let mut got = connect.to_string();
    if got.is_empty() {
        got = request(&b.addr, "GET", &target, b"").body;
    }
    assert!(got.starts_with("2:40"), "{got}");
    // A v3 client pings; the server answers with a pong. The session
    // outlives pingInterval + pingTimeout while pings keep coming.
    let started = Instant::now();
    let expiry_at = Duration::from_millis(PING_INTERVAL_MS + PING_TIMEOUT_MS);
    while started.elapsed() < expiry_at * 2 {
        let a = request(&b.addr, "POST", &target, b"1:2");
        assert_eq!((a.status, a.body.as_str()), (200, "ok"));
        let a = request(&b.addr, "GET", &target, b"");
        assert_eq!((a.status, a.body.as_str()), (200, "1:3"));
    }
    // An event with an ack in v3 framing, with a multi-byte character
    // (lengths count UTF-16 units).
    let event = r#"421["pub",{"subject":"é.x","data":"😀"}]"#;
    let units: usize = event.chars().map(char::len_utf16).sum();
    let body = format!("{units}:{event}");
    assert_eq!(
        request(&b.addr, "POST", &target, body.as_bytes()).body,
        "ok"
    );
    let a = request(&b.addr, "GET", &target, b"");
    assert_eq!(a.body, "16:431[{\"ok\":true}]");
    // Without pings it expires.
    wait_metric(&b.addr, "gombus_polling_sessions", 0, expiry());
}

#[test]
fn eio3_is_refused_when_disabled() {
    let b = broker(&["-allow-eio3=false"]);
    let a = request(&b.addr, "GET", "/socket.io/?EIO=3&transport=polling", b"");
    assert_eq!(a.status, 400);
    assert_eq!(
        a.body,
        r#"{"code":5,"message":"Unsupported protocol version"}"#
    );
    let on = broker(&[]);
    let a = request(&on.addr, "GET", "/socket.io/?EIO=3&transport=polling", b"");
    assert_eq!(a.status, 200);
}

/// A seeded xorshift64* generator, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

#[test]
fn garbage_payloads_end_only_their_own_session() {
    let b = broker(&[]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut good = Poller::join(&b.addr);
    let pieces = [
        "4",
        "40",
        "42[\"pub\",{}]",
        "451-[\"pub\",{\"_placeholder\":true,\"num\":0}]",
        "b",
        "bAQID",
        "b!!",
        "\x1e",
        "2",
        "3",
        "5",
        "6",
        "1",
        "0{}",
        "9",
        "",
        "é",
        "12:",
        "43[]",
        "42",
        "[",
        "\u{0}",
    ];
    for round in 0..200 {
        let sid = open(&b.addr);
        let eio3 = round % 5 == 0;
        let mut body = String::new();
        for _ in 0..(1 + rng.next() % 6) {
            body.push_str(rng.pick(&pieces));
        }
        let target = if eio3 {
            format!("/socket.io/?EIO=3&transport=polling&sid={sid}")
        } else {
            target(&sid)
        };
        let a = request(&b.addr, "POST", &target, body.as_bytes());
        assert!(
            a.status == 200 || a.status == 400,
            "round {round}: {} for {body:?}",
            a.status
        );
        if round % 20 == 0 {
            // A well-behaved neighbour is never disturbed.
            let ack = good.call(round, "ping", "{}");
            assert_eq!(ack["ok"], true, "round {round}");
        }
    }
    assert!(request(&b.addr, "GET", "/healthz", b"").status == 200);
    // Whatever the garbage left open expires; only the good session stays
    // (it keeps answering pings).
    let deadline = Instant::now() + expiry() + SLACK;
    loop {
        let ack = good.call(9999, "ping", "{}");
        assert_eq!(ack["ok"], true);
        if metric(&b.addr, "gombus_polling_sessions") == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "garbage sessions did not expire");
    }
}

/// A well-behaved WebSocket client still gets answers and a victim
/// subscriber still gets what is published to it: whatever the abuse did,
/// it hurt nobody else.
fn others_unharmed(addr: &str, victim: &mut WebSocket<TcpStream>, tag: &str) {
    let mut fresh = ws_join(addr);
    fresh
        .send(Message::text(r#"427["ping",{}]"#))
        .expect("send");
    assert_eq!(ws_next(&mut fresh), Message::text(r#"437[{"ok":true}]"#));
    let event = format!(r#"428["pub",{{"subject":"victim","data":"{tag}"}}]"#);
    fresh.send(Message::text(event)).expect("send");
    assert_eq!(ws_next(&mut fresh), Message::text(r#"438[{"ok":true}]"#));
    let Message::Text(msg) = ws_next(victim) else {
        panic!("the victim got no message");
    };
    assert!(msg.as_str().contains(&format!("\"{tag}\"")), "{msg}");
}

/// A victim that keeps answering the heartbeat (for short heartbeats):
/// subscribed before this returns, it reads in a thread until a message
/// carrying `tag` arrives; publish it with [`fresh_publishes`].
fn victim_reading(addr: &str, tag: &'static str) -> std::thread::JoinHandle<()> {
    let mut ws = victim(addr);
    std::thread::spawn(move || loop {
        if let Message::Text(msg) = ws_next(&mut ws) {
            if msg.as_str().contains(&format!("\"{tag}\"")) {
                return;
            }
        }
    })
}

/// A fresh WebSocket client is served and publishes `tag` to `victim`.
fn fresh_publishes(addr: &str, tag: &str) {
    let mut fresh = ws_join(addr);
    fresh
        .send(Message::text(r#"427["ping",{}]"#))
        .expect("send");
    assert_eq!(ws_next(&mut fresh), Message::text(r#"437[{"ok":true}]"#));
    let event = format!(r#"428["pub",{{"subject":"victim","data":"{tag}"}}]"#);
    fresh.send(Message::text(event)).expect("send");
    assert_eq!(ws_next(&mut fresh), Message::text(r#"438[{"ok":true}]"#));
}

/// A WebSocket subscriber on subject `victim`.
fn victim(addr: &str) -> WebSocket<TcpStream> {
    let mut ws = ws_join(addr);
    ws.send(Message::text(
        r#"421["sub",{"subject":"victim","sid":"v"}]"#,
    ))
    .expect("send");
    assert_eq!(
        ws_next(&mut ws),
        Message::text(r#"431[{"ok":true,"sid":"v"}]"#)
    );
    ws
}

/// Resident memory (KiB) once it stops moving for a moment, bounded.
fn rss_settled(b: &Broker) -> u64 {
    let deadline = Instant::now() + WAIT;
    let mut last = b.rss_kb();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = b.rss_kb();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[test]
fn a_flood_of_heartbeat_packets_does_not_grow_memory() {
    // Each pong (and each client ping) moves the heartbeat's deadline; the
    // loop must not keep one timer per packet until the old deadlines pass.
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let mut ws = ws_join(&b.addr);
    let before = rss_settled(&b);
    // Masked text frames "3" and "2" with a zero mask, written raw.
    const FRAMES: usize = 400_000;
    let mut raw = Vec::with_capacity(FRAMES * 7);
    for i in 0..FRAMES {
        let packet = if i % 2 == 0 { b'3' } else { b'2' };
        raw.extend_from_slice(&[0x81, 0x81, 0, 0, 0, 0, packet]);
    }
    // The pongs to the pings come back: read them while writing.
    let mut reader = ws.get_ref().try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0usize;
        reader
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    ws.get_mut().write_all(&raw).expect("flood");
    // A request after the flood: once answered, all of it was handled.
    ws.get_mut()
        .write_all(&[0x81, 0x80 | 15, 0, 0, 0, 0])
        .and_then(|()| ws.get_mut().write_all(br#"429["ping",{}]"#))
        .expect("write");
    let echoed = drain.join().expect("drain");
    assert!(echoed >= FRAMES / 2 * 3, "pongs read: {echoed} bytes");
    let after = rss_settled(&b);
    others_unharmed(&b.addr, &mut v, "after-heartbeat-flood");
    let grown = after.saturating_sub(before);
    eprintln!("heartbeat flood: RSS {before} KiB -> {after} KiB");
    assert!(grown < 6 * 1024, "RSS grew by {grown} KiB");
}

#[test]
fn pipelined_requests_whose_answers_are_never_read_are_cut() {
    // OPTIONS (a CORS preflight) is answered on a kept-alive connection; a
    // client that pipelines them and never reads must not make the broker
    // buffer the answers without bound.
    let b = Broker::start(&["-cors-origin=*", "-max-pending=65536"]);
    let mut v = victim(&b.addr);
    let before = rss_settled(&b);
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    let one = b"OPTIONS /socket.io/ HTTP/1.1\r\nHost: x\r\n\r\n";
    let batch: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(one.len() * 10_000)
        .collect();
    let started = Instant::now();
    let mut sent = 0usize;
    // About 40 MB of answers if all were made; the broker closes first.
    while sent < 100 && started.elapsed() < Duration::from_secs(10) {
        if s.write_all(&batch).is_err() {
            break;
        }
        sent += 1;
    }
    let after = rss_settled(&b);
    eprintln!("pipelined flood: RSS {before} KiB -> {after} KiB after {sent} batches");
    assert!(sent < 100, "the broker kept taking pipelined requests");
    others_unharmed(&b.addr, &mut v, "after-pipelining");
    let grown = after.saturating_sub(before);
    assert!(grown < 8 * 1024, "RSS grew by {grown} KiB");
    assert!(metric(&b.addr, "gombus_slow_consumers_total") >= 1);
}

/// Reads HTTP answers from `s` until `count` arrived or the peer closed;
/// their status codes and bodies.
fn read_answers(s: &mut TcpStream, count: usize) -> (Vec<(u16, String)>, bool) {
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let deadline = Instant::now() + WAIT;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 65536];
    let mut answers = Vec::new();
    loop {
        // Take the complete answers in `raw`.
        while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if raw.len() < end + 4 + len {
                break;
            }
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let body = String::from_utf8_lossy(&raw[end + 4..end + 4 + len]).to_string();
            raw.drain(..end + 4 + len);
            answers.push((status, body));
        }
        if answers.len() >= count {
            return (answers, false);
        }
        assert!(
            Instant::now() < deadline,
            "{} answers, the last {:?}",
            answers.len(),
            answers.last()
        );
        match s.read(&mut chunk) {
            Ok(0) => return (answers, true),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (answers, true),
            Err(e) => panic!("read: {e} after {} answers", answers.len()),
        }
    }
}

#[test]
fn requests_pipelined_after_a_full_size_body_are_all_answered() {
    // The input buffer must not drop bytes that arrive with the end of a
    // body as large as -max-payload (here many times the bound in one
    // write).
    let b = Broker::start(&["-cors-origin=*", "-max-payload=1000"]);
    let sid = open(&b.addr);
    // The bound on a body: -max-payload plus 64 KiB for the envelope.
    let body: String = "6\x1e".repeat(33_267) + "6";
    assert_eq!(body.len(), 1000 + 65_536 - 1);
    let mut raw = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        target(&sid),
        body.len()
    )
    .into_bytes();
    const PIPELINED: usize = 1500;
    for _ in 0..PIPELINED {
        raw.extend_from_slice(b"OPTIONS /socket.io/ HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    s.write_all(&raw).expect("write");
    let (answers, closed) = read_answers(&mut s, PIPELINED + 1);
    assert!(!closed, "closed after {} answers", answers.len());
    assert_eq!(answers[0], (200, "ok".to_string()));
    assert!(
        answers[1..].iter().all(|(status, _)| *status == 204),
        "{:?}",
        answers.iter().find(|(status, _)| *status != 204)
    );
}

#[test]
fn input_piled_up_behind_a_held_get_closes_that_connection() {
    // A held GET keeps the requests behind it waiting; more of them than a
    // request may take is a client to cut, not input to buffer (or drop).
    let b = Broker::start(&["-cors-origin=*", "-max-payload=1000"]);
    let mut v = victim(&b.addr);
    let sid = open(&b.addr);
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    let mut raw = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", target(&sid)).into_bytes();
    for _ in 0..2_000 {
        raw.extend_from_slice(b"OPTIONS /socket.io/ HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    // The broker may close while the bytes are still being written.
    let _ = s.write_all(&raw);
    let (answers, closed) = read_answers(&mut s, 1);
    assert!(closed, "the connection stayed open: {answers:?}");
    assert!(answers.is_empty(), "{answers:?}");
    // The session itself lives on: a GET on a fresh connection is served.
    assert_eq!(post(&b.addr, &sid, "6").body, "ok");
    others_unharmed(&b.addr, &mut v, "after-piled-input");
}

/// Writes `frame` `count` times to `s` (the broker may close meanwhile);
/// how many writes of 1000 frames went through.
fn flood(s: &mut TcpStream, frame: &[u8], count: usize) -> usize {
    let batch: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 1000)
        .collect();
    let started = Instant::now();
    let mut sent = 0;
    while sent < count / 1000 && started.elapsed() < WAIT {
        if s.write_all(&batch).is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

/// A masked (zero mask) WebSocket ping frame with 125 bytes of payload.
fn ws_ping_frame() -> Vec<u8> {
    let mut frame = vec![0x89, 0x80 | 125, 0, 0, 0, 0];
    frame.extend_from_slice(&[b'p'; 125]);
    frame
}

#[test]
fn websocket_pings_whose_pongs_are_never_read_are_bounded() {
    // Each WebSocket ping is answered with a pong; a client that pings
    // and never reads is a slow consumer like any other.
    let b = Broker::start(&["-max-pending=65536"]);
    let mut v = victim(&b.addr);
    let before = rss_settled(&b);
    let ws = ws_join(&b.addr);
    let mut s = ws.get_ref().try_clone().expect("clone");
    // 1 million pings: about 130 MB of pongs if all were queued.
    let sent = flood(&mut s, &ws_ping_frame(), 1_000_000);
    let after = rss_settled(&b);
    eprintln!("ping flood: RSS {before} KiB -> {after} KiB after {sent}k pings");
    assert!(sent < 1000, "the broker kept taking pings");
    others_unharmed(&b.addr, &mut v, "after-ping-flood");
    let grown = after.saturating_sub(before);
    assert!(grown < 8 * 1024, "RSS grew by {grown} KiB");
    assert!(metric(&b.addr, "gombus_slow_consumers_total") >= 1);
}

#[test]
fn upgrade_probes_whose_answers_are_never_read_are_bounded() {
    // A probe answers each `2probe` with `3probe`; repeated without
    // reading, that must not queue without bound either.
    let b = Broker::start(&["-max-pending=65536"]);
    let mut v = victim(&b.addr);
    let before = rss_settled(&b);
    let sid = open(&b.addr);
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    let head = format!(
        "GET /socket.io/?EIO=4&transport=websocket&sid={sid} HTTP/1.1\r\nHost: x\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write");
    let mut probe = vec![0x81, 0x80 | 6, 0, 0, 0, 0];
    probe.extend_from_slice(b"2probe");
    let sent = flood(&mut s, &probe, 10_000_000);
    let after = rss_settled(&b);
    eprintln!("probe flood: RSS {before} KiB -> {after} KiB after {sent}k probes");
    assert!(sent < 10_000, "the broker kept taking probes");
    others_unharmed(&b.addr, &mut v, "after-probe-flood");
    let grown = after.saturating_sub(before);
    assert!(grown < 8 * 1024, "RSS grew by {grown} KiB");
}

#[test]
fn payloads_of_countless_tiny_packets_stay_bounded() {
    // The largest POST a session may send, all of it one-byte packets
    // (noops and pongs), again and again.
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let sid = open(&b.addr);
    let before = rss_settled(&b);
    // -max-payload (1 MiB) plus the 64 KiB envelope, less one byte.
    let mut body = "6\x1e3\x1e".repeat((1 << 20) / 4 + 16_383);
    body.push('6');
    for _ in 0..10 {
        let a = post(&b.addr, &sid, &body);
        assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    }
    let after = rss_settled(&b);
    eprintln!("tiny packets: RSS {before} KiB -> {after} KiB");
    others_unharmed(&b.addr, &mut v, "after-tiny-packets");
    let grown = after.saturating_sub(before);
    assert!(grown < 8 * 1024, "RSS grew by {grown} KiB");
    assert_eq!(post(&b.addr, &sid, "6").body, "ok");
}

/// Emits `event` with `arg` (raw JSON) and ack id `id`; the ack's argument.
fn ws_call(ws: &mut WebSocket<TcpStream>, id: u64, event: &str, arg: &str) -> Value {
    ws.send(Message::text(format!("42{id}[\"{event}\",{arg}]")))
        .expect("send");
    let head = format!("43{id}[");
    loop {
        let Message::Text(t) = ws_next(ws) else {
            continue;
        };
        if let Some(rest) = t.as_str().strip_prefix(&head[..head.len() - 1]) {
            let args: Value = serde_json::from_str(rest).expect("ack JSON");
            return args[0].clone();
        }
    }
}

/// `ws_call` whose ack must be ok.
fn ws_ok(ws: &mut WebSocket<TcpStream>, id: u64, event: &str, arg: &str) {
    let ack = ws_call(ws, id, event, arg);
    assert_eq!(ack["ok"], true, "{ack}");
}

/// A joined WebSocket client that has created stream `S` on `s.>` (id 1).
fn ws_stream_s(addr: &str) -> WebSocket<TcpStream> {
    let mut ws = ws_join(addr);
    ws_ok(
        &mut ws,
        1,
        "stream.create",
        r#"{"name":"S","subjects":["s.>"]}"#,
    );
    ws
}

/// Reads acks until `count` have come; returns how many were ok and how
/// many were not, each of which `refused` checks (it gets the ack's args).
fn count_acks(ws: &mut WebSocket<TcpStream>, count: u64, refused: impl Fn(&Value)) -> (u64, u64) {
    let (mut ok, mut not_ok) = (0, 0);
    while ok + not_ok < count {
        let Message::Text(t) = ws_next(ws) else {
            continue;
        };
        let Some(rest) = t.as_str().strip_prefix("43") else {
            continue;
        };
        let start = rest.find('[').expect("ack args");
        let args: Value = serde_json::from_str(&rest[start..]).expect("ack JSON");
        if args[0]["ok"] == true {
            ok += 1;
        } else {
            refused(&args);
            not_ok += 1;
        }
    }
    (ok, not_ok)
}

#[test]
fn stream_events_with_absurd_numbers_get_clear_errors() {
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let mut ws = ws_stream_s(&b.addr);
    ws_ok(
        &mut ws,
        2,
        "consumer.create",
        r#"{"stream":"S","name":"c"}"#,
    );
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let cases: Vec<(&str, String)> = vec![
        ("stream.create", r#"{"name":"T","subjects":["t"],"max_msgs":-1}"#.into()),
        ("stream.create", r#"{"name":"T","subjects":["t"],"max_msgs":1.5}"#.into()),
        ("stream.create", r#"{"name":"T","subjects":["t"],"max_bytes":1e300}"#.into()),
        ("stream.create", format!(r#"{{"name":"T","subjects":["t"],"x":{deep}}}"#)),
        ("stream.create", r#"{"name":"T","subjects":["t"],"duplicate_window_ms":18446744073709551615}"#.into()),
        ("consumer.fetch", r#"{"stream":"S","consumer":"c","batch":18446744073709551615}"#.into()),
        ("consumer.fetch", r#"{"stream":"S","consumer":"c","batch":-5}"#.into()),
        ("consumer.fetch", r#"{"stream":"S","consumer":"c","batch":2.5}"#.into()),
        ("consumer.fetch", r#"{"stream":"S","consumer":"c","expires_ms":1e20}"#.into()),
        ("consumer.fetch", r#"{"stream":"S","consumer":"c","expires_ms":18446744073709551615}"#.into()),
        ("consumer.create", r#"{"stream":"S","name":"d","ack_wait_ms":18446744073709551615}"#.into()),
        ("consumer.create", r#"{"stream":"S","name":"d","max_ack_pending":-1}"#.into()),
        ("consumer.create", r#"{"stream":"S","name":"d","opt_start_seq":18446744073709551615,"deliver_policy":"by_start_seq"}"#.into()),
        ("ack", r#"{"stream":"S","consumer":"c","seq":18446744073709551615}"#.into()),
        ("ack", r#"{"stream":"S","consumer":"c","seq":-1}"#.into()),
        ("nak", r#"{"stream":"S","consumer":"c","seq":1,"delay_ms":18446744073709551615}"#.into()),
    ];
    for (i, (event, arg)) in cases.iter().enumerate() {
        let id = 100 + i as u64;
        let ack = ws_call(&mut ws, id, event, arg);
        let shown: String = arg.chars().take(120).collect();
        assert!(
            ack["ok"] == true || ack["error"]["code"].is_string(),
            "{event} {shown}: {ack}"
        );
        eprintln!("{event} {shown} -> {ack}");
    }
    others_unharmed(&b.addr, &mut v, "after-stream-numbers");
}

#[test]
fn a_consumer_with_the_largest_ack_wait_delivers_without_crashing() {
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let mut ws = ws_stream_s(&b.addr);
    let ack = ws_call(
        &mut ws,
        2,
        "consumer.create",
        r#"{"stream":"S","name":"d","ack_wait_ms":18446744073709551615}"#,
    );
    let created = ack["ok"] == true;
    assert!(created || ack["error"]["code"] == "bad_request", "{ack}");
    ws_ok(&mut ws, 3, "pub", r#"{"subject":"s.x","data":1}"#);
    if created {
        ws_ok(
            &mut ws,
            4,
            "consumer.fetch",
            r#"{"stream":"S","consumer":"d","batch":1,"expires_ms":1000}"#,
        );
        ws_ok(
            &mut ws,
            5,
            "nak",
            r#"{"stream":"S","consumer":"d","seq":1}"#,
        );
    }
    others_unharmed(&b.addr, &mut v, "after-ack-wait");
}

#[test]
fn fetch_waits_past_the_per_socket_cap_are_refused() {
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let mut ws = ws_stream_s(&b.addr);
    ws_ok(
        &mut ws,
        2,
        "consumer.create",
        r#"{"stream":"S","name":"c"}"#,
    );
    const FETCHES: u64 = 200;
    for id in 0..FETCHES {
        let event = format!(
            r#"42{}["consumer.fetch",{{"stream":"S","consumer":"c","batch":1,"expires_ms":300}}]"#,
            1000 + id
        );
        ws.send(Message::text(event)).expect("send");
    }
    let (ok, refused) = count_acks(&mut ws, FETCHES, |args| {
        assert!(args[0]["error"]["code"].is_string(), "{args}");
    });
    eprintln!("fetch waits: {ok} answered, {refused} refused");
    assert!(refused >= FETCHES - 64, "{refused} refused");
    others_unharmed(&b.addr, &mut v, "after-fetch-waits");
}

/// Writes `bytes` one at a time, `gap` apart, until done or the peer
/// closes; the pace of a slowloris client, not a synchronisation.
fn trickle(mut s: TcpStream, bytes: Vec<u8>, gap: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for b in bytes {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(gap);
        }
    })
}

/// Waits (bounded by `within`) for the peer to close `s`; how long it took.
fn closed_within(s: &mut TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return started.elapsed(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("still open after {:?}: {e}", started.elapsed()),
        }
    }
}

#[test]
fn slow_heads_and_bodies_are_cut_at_the_idle_deadline() {
    // A head or a body that arrives a byte at a time never earns more than
    // the idle time (pingInterval + pingTimeout) from the last answer.
    let b = broker(&[]);
    let v = victim_reading(&b.addr, "after-slow-clients");
    let sid = open(&b.addr);
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        target(&sid),
        "a".repeat(4000)
    );
    let body_first = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n",
        target(&sid)
    );
    let mut threads = Vec::new();
    let mut socks = Vec::new();
    for (i, prefix) in [String::new(), body_first].into_iter().enumerate() {
        let mut s = TcpStream::connect(&b.addr).expect("connect");
        s.write_all(prefix.as_bytes()).expect("write");
        let rest = if i == 0 {
            head.clone().into_bytes()
        } else {
            vec![b'6'; 4000]
        };
        threads.push(trickle(
            s.try_clone().expect("clone"),
            rest,
            Duration::from_millis(10),
        ));
        socks.push(s);
    }
    for s in &mut socks {
        let took = closed_within(s, expiry() + SLACK);
        assert!(took <= expiry(), "cut only after {took:?}");
    }
    for t in threads {
        t.join().expect("trickle");
    }
    // A body that never comes, then the client goes: nothing stays.
    let baseline = metric(&b.addr, "gombus_connections");
    for _ in 0..50 {
        let mut s = TcpStream::connect(&b.addr).expect("connect");
        let req = format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n6\x1e6",
            target(&sid)
        );
        s.write_all(req.as_bytes()).expect("write");
    }
    wait_metric(&b.addr, "gombus_connections", baseline, WAIT);
    fresh_publishes(&b.addr, "after-slow-clients");
    v.join().expect("the victim got its message");
}

/// A WebSocket that asks to take over polling session `sid`.
fn ws_probe(addr: &str, sid: &str) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let url = format!("ws://{addr}/socket.io/?EIO=4&transport=websocket&sid={sid}");
    tungstenite::client(url.as_str(), stream)
        .expect("upgrade")
        .0
}

/// Whether the broker ends `ws` (a close frame or EOF) within the bound.
fn ends(ws: &mut WebSocket<TcpStream>) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match ws.read() {
            Ok(Message::Close(_)) => return true,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn competing_probes_on_one_session_leave_it_whole() {
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let mut poller = Poller::join(&b.addr);
    let sid = poller.sid.clone();
    // A probe that answers its 3probe with garbage gives polling back.
    let mut bad = ws_probe(&b.addr, &sid);
    bad.send(Message::text("2probe")).expect("send");
    assert_eq!(ws_next(&mut bad), Message::text("3probe"));
    bad.send(Message::text("hello")).expect("send");
    assert!(ends(&mut bad), "a bad probe was not closed");
    let ack = poller.call(1, "ping", "{}");
    assert_eq!(ack["ok"], true);
    // Two probes at once: the first to send `5` takes the session.
    let mut a = ws_probe(&b.addr, &sid);
    let mut c = ws_probe(&b.addr, &sid);
    a.send(Message::text("2probe")).expect("send");
    assert_eq!(ws_next(&mut a), Message::text("3probe"));
    c.send(Message::text("2probe")).expect("send");
    assert_eq!(ws_next(&mut c), Message::text("3probe"));
    c.send(Message::text("5")).expect("send");
    c.send(Message::text(r#"422["ping",{}]"#)).expect("send");
    assert_eq!(ws_next(&mut c), Message::text(r#"432[{"ok":true}]"#));
    a.send(Message::text("5")).expect("send");
    assert!(ends(&mut a), "the losing probe was not closed");
    // Later probes and polls on the upgraded sid are turned away.
    let mut late = ws_probe(&b.addr, &sid);
    assert!(
        ends(&mut late),
        "a probe of an upgraded session stayed open"
    );
    assert_eq!(get(&b.addr, &sid).status, 400);
    c.send(Message::text(r#"423["ping",{}]"#)).expect("send");
    assert_eq!(ws_next(&mut c), Message::text(r#"433[{"ok":true}]"#));
    others_unharmed(&b.addr, &mut v, "after-probes");
}

#[test]
fn handshakes_never_used_cannot_lock_others_out_of_polling() {
    // One client opens more polling sessions than the broker keeps (the
    // cap is 100 000) and never uses them; a well-behaved client that
    // comes next still gets a session.
    const HANDSHAKES: usize = 101_000;
    let b = Broker::start(&[]);
    let mut v = victim(&b.addr);
    let before = rss_settled(&b);
    let mut s = TcpStream::connect(&b.addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let one = b"GET /socket.io/?EIO=4&transport=polling HTTP/1.1\r\nHost: x\r\n\r\n";
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
    let mut buf = vec![0u8; 1 << 20];
    let mut answered = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Answers are counted by their status lines; a refusal (503) closes
    // the connection and ends the flood.
    'flood: for _ in 0..HANDSHAKES / 1000 {
        if s.write_all(&batch).is_err() {
            break;
        }
        let mut got = 0;
        while got < 1000 {
            assert!(Instant::now() < deadline, "{answered} handshakes answered");
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break 'flood,
                Ok(n) => got += buf[..n].windows(8).filter(|w| w == b"HTTP/1.1").count(),
            }
        }
        answered += got;
    }
    let after = rss_settled(&b);
    eprintln!("{answered} handshakes: RSS {before} KiB -> {after} KiB");
    let sessions = metric(&b.addr, "gombus_polling_sessions");
    assert!(sessions <= 100_000, "{sessions} polling sessions");
    let mut good = Poller::join(&b.addr);
    let ack = good.call(1, "ping", "{}");
    assert_eq!(ack["ok"], true);
    others_unharmed(&b.addr, &mut v, "after-handshakes");
}

#[test]
fn streams_past_the_cap_are_refused_with_limit() {
    let b = Broker::start(&["-sync=none", "-segment-size=64KiB"]);
    let mut v = victim(&b.addr);
    let mut ws = ws_join(&b.addr);
    // Creating a stream makes its directory and files: on a busy machine
    // the acks may be far apart.
    ws.get_mut()
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let started = Instant::now();
    // All creates go out at once; their acks are counted after.
    const CREATES: u64 = 1_010;
    for i in 0..CREATES {
        let event = format!(
            r#"42{}["stream.create",{{"name":"S{i}","subjects":["s{i}.>"]}}]"#,
            1000 + i
        );
        ws.send(Message::text(event)).expect("send");
    }
    let (ok, limited) = count_acks(&mut ws, CREATES, |args| {
        assert_eq!(args[0]["error"]["code"], "limit", "{args}");
    });
    eprintln!(
        "streams: {ok} created, {limited} refused in {:?}",
        started.elapsed()
    );
    assert_eq!((ok, limited), (1_000, 10));
    // The dashboard's overview and /metrics still answer, in bounded size.
    for path in ["/api/info", "/metrics"] {
        let at = Instant::now();
        let a = request(&b.addr, "GET", path, b"");
        eprintln!("{path}: {} bytes in {:?}", a.body.len(), at.elapsed());
        assert_eq!(a.status, 200, "{path}");
        assert!(a.body.len() < 4 << 20, "{path}: {} bytes", a.body.len());
    }
    others_unharmed(&b.addr, &mut v, "after-streams");
}

#[test]
fn another_probe_going_away_leaves_an_upgrade_under_way() {
    let b = Broker::start(&[]);
    let poller = Poller::join(&b.addr);
    let sid = poller.sid.clone();
    let mut other = ws_probe(&b.addr, &sid);
    let mut probe = ws_probe(&b.addr, &sid);
    probe.send(Message::text("2probe")).expect("send");
    assert_eq!(ws_next(&mut probe), Message::text("3probe"));
    // A probe that never answered `2probe` breaks off.
    other.send(Message::text("hello")).expect("send");
    assert!(ends(&mut other), "the bad probe was not closed");
    // The upgrade is still under way: a GET gets a noop at once.
    let a = get(&b.addr, &sid);
    assert_eq!((a.status, a.body.as_str()), (200, "6"));
    probe.send(Message::text("5")).expect("send");
    probe
        .send(Message::text(r#"421["ping",{}]"#))
        .expect("send");
    assert_eq!(ws_next(&mut probe), Message::text(r#"431[{"ok":true}]"#));
}
