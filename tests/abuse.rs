//! Hostile clients never hurt others. Raw WebSocket clients break the
//! Engine.IO / Socket.IO framing, send events the broker does not know, vanish
//! mid-frame or never read, all against one broker; a well-behaved client and
//! a control client must still work at the end, and the broker's memory must
//! stay bounded. Contract: docs/PROTOCOL.md §2 (error acks versus
//! closing one connection) and §4 (slow consumers).
//!
//! A second broker faces a seeded driver for `ABUSE_FUZZ_SECS` (default 8):
//! round after round, mutated Socket.IO packets over WebSocket with
//! Engine.IO 3 and 4, mutated raw WebSocket frames, mutated HTTP requests
//! and mutated v3/v4 polling payloads (the mutation engine of
//! `tests/fuzz_support`). Each must be answered as the contract says (an
//! ack, an HTTP status, or that one connection closed), a well-behaved
//! client is checked after every round, and at the end no connection
//! leaks and descriptors and memory stay within stated bounds.
//! `ABUSE_FUZZ_SEED` replays a run.
//!
//! Every wait has a deadline; nothing sleeps to synchronise. Each case
//! returns a `Result`, so one run reports every case that failed, not only
//! the first.

mod common;
mod fuzz_support;

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Error as WsError, Message, WebSocket};

/// Bound on any single expected event (an ack, a delivery, a close).
const WAIT: Duration = Duration::from_secs(5);
/// Bound for the slow-consumer case to settle after the flood.
const FLOOD_SETTLE: Duration = Duration::from_secs(15);
const CONTROL_TOKEN: &str = "secret";
/// The broker's default `pingInterval + pingTimeout` (25 s + 20 s): a client
/// that never reads is closed by the heartbeat after this anyway.
const HEARTBEAT_CUT: Duration = Duration::from_secs(45);

/// `-max-pending` for the broker under test: small, so the slow consumer
/// trips it early.
const MAX_PENDING_ARG: &str = "-max-pending=1MiB";
const FLOOD_MSG_BYTES: usize = 4096;
const FLOOD_MSG_COUNT: usize = 10_240; // 10,240 x 4 KiB = 40 MiB of data.
/// Pubs per `ping` barrier from the (reading) publisher. Its own deliveries
/// then never queue more than this many messages (256 KiB) at the broker,
/// far below `-max-pending`, so it is never mistaken for a slow consumer.
const FLOOD_BATCH_COUNT: usize = 64;
const _: () = assert!(FLOOD_BATCH_COUNT * FLOOD_MSG_BYTES * 4 <= 1024 * 1024);

/// Bound on the broker's RSS growth during the flood. A broker that honours
/// `-max-pending=1MiB` holds at most ~1 MiB for the non-reader, one batch
/// (256 KiB) for the publisher, per-connection read/write buffers of a few
/// hundred KiB and allocator slack: a few MiB. One that queued without bound
/// would hold the ~42 MB of encoded `msg` events minus what the kernel's
/// socket buffers absorb (at most ~4 MiB send buffer plus the never-read
/// receive window): about 35 MiB. 16 MiB sits between the two with margin on
/// both sides.
const RSS_GROWTH_MAX_KB: u64 = 16 * 1024;

// ---------------------------------------------------------------------------
// A raw Engine.IO v4 / Socket.IO v5 client over tungstenite.

/// One Socket.IO packet as received (Engine.IO message `4…`).
#[derive(Debug)]
struct Packet {
    kind: u8,
    namespace: String,
    id: Option<u64>,
    body: Value,
}

/// Parses `<type>[/<nsp>,][<id>]<json>`; None when it is not that shape.
fn parse_packet(text: &str) -> Option<Packet> {
    let kind = *text.as_bytes().first()?;
    let mut rest = text.get(1..)?;
    let mut namespace = String::from("/");
    if rest.starts_with('/') {
        let comma = rest.find(',')?;
        namespace = rest.get(..comma)?.to_string();
        rest = rest.get(comma + 1..)?;
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let id = if digits > 0 {
        rest.get(..digits)?.parse().ok()
    } else {
        None
    };
    let rest = rest.get(digits..)?;
    let body = if rest.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(rest).ok()?
    };
    Some(Packet {
        kind,
        namespace,
        id,
        body,
    })
}

/// What a read returned within its deadline.
#[derive(Debug)]
enum Inbound {
    Packet(Packet),
    /// Text we could not parse, or a binary frame: kept for error messages.
    Other(String),
    Closed(String),
    TimedOut,
}

/// What a connection delivered before it closed.
struct Closing {
    packets: usize,
    acks: Vec<String>,
}

struct Raw {
    ws: WebSocket<TcpStream>,
    namespace: String,
    next_id: u64,
    /// `msg` deliveries read while waiting for something else.
    inbox: VecDeque<Value>,
    closed: Option<String>,
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(16 << 20))
        .max_frame_size(Some(16 << 20))
        .max_write_buffer_size(16 << 20)
}

/// Shortens what a failure message quotes: a flood message is 4 KiB.
fn clip(text: String) -> String {
    const QUOTE_CHARS_MAX: usize = 160;
    match text.char_indices().nth(QUOTE_CHARS_MAX) {
        Some((cut, _)) => format!("{}…({} bytes)", &text[..cut], text.len()),
        None => text,
    }
}

fn is_timeout(err: &std::io::Error) -> bool {
    matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Raw {
    /// Upgrades to WebSocket and reads the Engine.IO open packet; joins no
    /// namespace.
    fn open(addr: &str) -> Result<Raw, String> {
        Raw::open_eio(addr, 4)
    }

    /// `open` with Engine.IO version `eio` (3 or 4).
    fn open_eio(addr: &str, eio: u8) -> Result<Raw, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("nodelay: {e}"))?;
        stream
            .set_read_timeout(Some(WAIT))
            .map_err(|e| format!("read timeout: {e}"))?;
        stream
            .set_write_timeout(Some(WAIT))
            .map_err(|e| format!("write timeout: {e}"))?;
        let url = format!("ws://{addr}/socket.io/?EIO={eio}&transport=websocket");
        let (ws, _) =
            tungstenite::client::client_with_config(url.as_str(), stream, Some(ws_config()))
                .map_err(|e| format!("websocket upgrade at {url}: {e}"))?;
        let mut raw = Raw {
            ws,
            namespace: "/".into(),
            next_id: 1,
            inbox: VecDeque::new(),
            closed: None,
        };
        match raw.read_text(Instant::now() + WAIT)? {
            Some(text) if text.starts_with("0{") => Ok(raw),
            other => Err(format!("expected the Engine.IO open packet, got {other:?}")),
        }
    }

    /// `open`, then a Socket.IO CONNECT to `namespace` with `auth`.
    fn connect(addr: &str, namespace: &str, auth: Option<Value>) -> Result<Raw, String> {
        let mut raw = Raw::open(addr)?;
        let prefix = if namespace == "/" {
            String::new()
        } else {
            format!("{namespace},")
        };
        let auth = auth.map(|a| a.to_string()).unwrap_or_default();
        raw.send_text(&format!("40{prefix}{auth}"))?;
        raw.namespace = namespace.to_string();
        match raw.recv(Instant::now() + WAIT)? {
            Inbound::Packet(p) if p.kind == b'0' && p.namespace == namespace => Ok(raw),
            Inbound::Packet(p) if p.kind == b'4' => Err(format!("CONNECT refused: {}", p.body)),
            Inbound::Packet(p) => Err(format!("expected CONNECT to {namespace}, got {p:?}")),
            Inbound::Other(text) => Err(format!("expected CONNECT, got {text:?}")),
            Inbound::Closed(why) => Err(format!("closed before CONNECT: {why}")),
            Inbound::TimedOut => Err(format!("no CONNECT to {namespace} within {WAIT:?}")),
        }
    }

    fn client(addr: &str) -> Result<Raw, String> {
        Raw::connect(addr, "/", None)
    }

    fn send(&mut self, message: Message) -> Result<(), String> {
        self.ws.send(message).map_err(|e| format!("send: {e}"))
    }

    fn send_text(&mut self, text: &str) -> Result<(), String> {
        self.send(Message::text(text))
    }

    /// Reads one WebSocket message before `deadline`, answering Engine.IO
    /// pings on the way. Ok(None) on timeout; Err never hides a close: a
    /// closed connection is `self.closed`, reported by `recv`.
    fn read_message(&mut self, deadline: Instant) -> Result<Option<Message>, String> {
        if self.closed.is_some() {
            return Ok(None);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let tick = left.max(Duration::from_millis(1));
            self.ws
                .get_ref()
                .set_read_timeout(Some(tick))
                .map_err(|e| format!("read timeout: {e}"))?;
            match self.ws.read() {
                Ok(Message::Text(text)) if text.as_str() == "2" => {
                    // Engine.IO v4 heartbeat: the server pings, we pong.
                    self.send_text("3")?;
                }
                Ok(Message::Close(frame)) => {
                    self.closed = Some(format!("close frame {frame:?}"));
                    return Ok(None);
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Ok(message) => return Ok(Some(message)),
                Err(WsError::Io(err)) if is_timeout(&err) => {}
                Err(err) => {
                    self.closed = Some(format!("{err}"));
                    return Ok(None);
                }
            }
        }
    }

    fn read_text(&mut self, deadline: Instant) -> Result<Option<String>, String> {
        Ok(match self.read_message(deadline)? {
            Some(Message::Text(text)) => Some(text.as_str().to_string()),
            Some(other) => Some(format!("{other:?}")),
            None => None,
        })
    }

    fn recv(&mut self, deadline: Instant) -> Result<Inbound, String> {
        let message = self.read_message(deadline)?;
        if let Some(why) = &self.closed {
            return Ok(Inbound::Closed(why.clone()));
        }
        let text = match message {
            None => return Ok(Inbound::TimedOut),
            Some(Message::Text(text)) => text.as_str().to_string(),
            Some(other) => return Ok(Inbound::Other(format!("{other:?}"))),
        };
        if text == "1" {
            self.closed = Some("Engine.IO close packet".into());
            return Ok(Inbound::Closed("Engine.IO close packet".into()));
        }
        match text.strip_prefix('4').and_then(parse_packet) {
            Some(packet) => Ok(Inbound::Packet(packet)),
            None => Ok(Inbound::Other(text)),
        }
    }

    fn prefix(&self) -> String {
        if self.namespace == "/" {
            String::new()
        } else {
            format!("{},", self.namespace)
        }
    }

    /// Emits `event` with one argument and an ack id; returns the ack's
    /// argument. Deliveries read meanwhile go to the inbox.
    fn request(&mut self, event: &str, arg: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let packet = format!("42{}{id}{}", self.prefix(), json!([event, arg]));
        self.send_text(&packet)?;
        self.await_ack(id, &packet)
    }

    fn await_ack(&mut self, id: u64, sent: &str) -> Result<Value, String> {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.recv(deadline)? {
                Inbound::Packet(p) if p.kind == b'3' && p.id == Some(id) => {
                    return match p.body {
                        Value::Array(mut args) if args.len() == 1 => Ok(args.remove(0)),
                        body => Err(format!("ack to {sent} does not carry one argument: {body}")),
                    };
                }
                Inbound::Packet(p) => self.keep(p, sent)?,
                Inbound::Other(text) => {
                    return Err(format!("waiting for the ack to {sent}: got {}", clip(text)))
                }
                Inbound::Closed(why) => {
                    return Err(format!("closed while waiting for the ack to {sent}: {why}"))
                }
                Inbound::TimedOut => return Err(format!("no ack to {sent} within {WAIT:?}")),
            }
        }
    }

    /// Stores a `msg` delivery; anything else while waiting is an error.
    fn keep(&mut self, packet: Packet, waiting_for: &str) -> Result<(), String> {
        match (&packet.kind, &packet.body) {
            (b'2', Value::Array(args))
                if args.first() == Some(&json!("msg")) && args.len() == 2 =>
            {
                self.inbox
                    .push_back(args.get(1).cloned().unwrap_or(Value::Null));
                Ok(())
            }
            _ => Err(format!(
                "waiting for {waiting_for}: unexpected packet {}",
                clip(format!("{packet:?}"))
            )),
        }
    }

    fn next_msg(&mut self) -> Result<Value, String> {
        let deadline = Instant::now() + WAIT;
        while self.inbox.is_empty() {
            match self.recv(deadline)? {
                Inbound::Packet(p) => self.keep(p, "a msg")?,
                Inbound::Other(text) => {
                    return Err(format!("waiting for a msg: got {}", clip(text)))
                }
                Inbound::Closed(why) => {
                    return Err(format!("closed while waiting for a msg: {why}"))
                }
                Inbound::TimedOut => return Err(format!("no msg within {WAIT:?}")),
            }
        }
        self.inbox
            .pop_front()
            .ok_or_else(|| "inbox empty".to_string())
    }

    /// Ok once the connection is closed, with what was read on the way;
    /// Err describing what arrived if it is still open at the deadline.
    fn expect_closed(&mut self, within: Duration) -> Result<Closing, String> {
        let deadline = Instant::now() + within;
        let mut closing = Closing {
            packets: 0,
            acks: Vec::new(),
        };
        let mut first = Vec::new();
        loop {
            let seen = match self.recv(deadline)? {
                Inbound::Closed(_) => return Ok(closing),
                Inbound::TimedOut => {
                    return Err(format!(
                        "still open after {within:?}; first packets read: {first:?}"
                    ));
                }
                Inbound::Packet(p) => {
                    let text = clip(format!("{p:?}"));
                    if p.kind == b'3' {
                        closing.acks.push(text.clone());
                    }
                    text
                }
                Inbound::Other(text) => clip(text),
            };
            closing.packets += 1;
            if first.len() < 3 {
                first.push(seen);
            }
        }
    }

    /// Sends `42N["ping",{}]` and requires `{ok:true}`: the connection is
    /// open and its events are served.
    fn ping(&mut self) -> Result<(), String> {
        expect_ok(&self.request("ping", json!({}))?, "ping")
    }
}

fn expect_ok(ack: &Value, what: &str) -> Result<(), String> {
    if ack.get("ok") == Some(&Value::Bool(true)) {
        Ok(())
    } else {
        Err(format!("{what}: expected {{ok:true}}, got {ack}"))
    }
}

fn expect_code(ack: &Value, code: &str, what: &str) -> Result<(), String> {
    let ok_false = ack.get("ok") == Some(&Value::Bool(false));
    let got = ack.pointer("/error/code").and_then(Value::as_str);
    if ok_false && got == Some(code) {
        Ok(())
    } else {
        Err(format!("{what}: expected error code {code:?}, got {ack}"))
    }
}

fn subscribe(raw: &mut Raw, subject: &str) -> Result<String, String> {
    let ack = raw.request("sub", json!({ "subject": subject }))?;
    expect_ok(&ack, &format!("sub {subject}"))?;
    ack.get("sid")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("sub {subject}: ack without a string sid: {ack}"))
}

/// A small seeded generator (xorshift64*), so a failing run can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next().to_le_bytes()[0]).collect()
    }
}

// ---------------------------------------------------------------------------
// The cases. Each one opens its own hostile connection(s).

/// (a), (b), (d): a frame that breaks the Engine.IO or Socket.IO format
/// closes that connection, and nothing is acked on it.
fn case_closes_on(addr: &str, frame: &str) -> Result<(), String> {
    let mut raw = Raw::client(addr)?;
    raw.send_text(frame)?;
    let closing = raw
        .expect_closed(WAIT)
        .map_err(|e| format!("sent {frame:?}, expected the connection closed: {e}"))?;
    if closing.acks.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "sent {frame:?}: closed, but acked first: {:?}",
            closing.acks
        ))
    }
}

/// (c), (e): a well-formed event the broker cannot serve gets `bad_request`
/// and the connection stays open; without an ack id nothing comes back.
fn case_unknown_events(addr: &str) -> Result<(), String> {
    let mut raw = Raw::client(addr)?;
    raw.send_text(r#"421["nope",{}]"#)?;
    let ack = raw.await_ack(1, r#"421["nope",{}]"#)?;
    expect_code(&ack, "bad_request", r#"421["nope",{}]"#)?;

    // No ack id: nothing at all may arrive before the next ping's ack.
    raw.send_text(r#"42["nope",{}]"#)?;
    raw.send_text(r#"422["ping",{}]"#)?;
    let ack = raw.await_ack(2, r#"422["ping",{}] after 42["nope",{}]"#)?;
    expect_ok(&ack, "ping after an unknown event without ack id")?;

    raw.send_text(r#"423["pub"]"#)?;
    let ack = raw.await_ack(3, r#"423["pub"]"#)?;
    expect_code(&ack, "bad_request", r#"423["pub"] (no argument)"#)?;

    raw.next_id = 4;
    raw.ping()
        .map_err(|e| format!("after the error acks the connection must stay open: {e}"))?;
    if !raw.inbox.is_empty() {
        return Err(clip(format!("unexpected deliveries: {:?}", raw.inbox)));
    }
    Ok(())
}

/// (f): a binary frame with no BINARY_EVENT announcing it is an attachment
/// nobody expects: it breaks the Socket.IO format, so the connection closes.
fn case_random_binary(addr: &str, seed: u64) -> Result<(), String> {
    let mut rng = XorShift(seed);
    let mut raw = Raw::client(addr)?;
    for round in 0..8 {
        let len = usize::try_from(rng.next() % 2048).unwrap_or(0) + 1;
        let bytes = rng.bytes(len);
        if raw.send(Message::binary(bytes)).is_err() {
            // Already closed by the broker after an earlier frame: fine.
            if round == 0 {
                return Err("could not send the first binary frame".into());
            }
            break;
        }
    }
    raw.expect_closed(WAIT).map(|_| ()).map_err(|e| {
        format!("random binary frames (seed {seed:#x}): expected the connection closed: {e}")
    })
}

/// (g): a client that joins `/`, writes part of a WebSocket frame and
/// disappears. `partial` is written raw on the TCP stream.
fn case_vanish_mid_frame(addr: &str, partial: &[u8]) -> Result<(), String> {
    let mut raw = Raw::client(addr)?;
    raw.ws.flush().map_err(|e| format!("flush: {e}"))?;
    let stream = raw.ws.get_mut();
    stream
        .write_all(partial)
        .map_err(|e| format!("write partial frame: {e}"))?;
    stream
        .flush()
        .map_err(|e| format!("flush partial frame: {e}"))?;
    drop(raw);
    Ok(())
}

/// (h): a subscriber that never reads while another client publishes
/// ~40 MiB to its subject. Returns a description of what happened.
fn case_slow_consumer(addr: &str, broker: &common::Broker) -> Result<String, String> {
    let rss_start_kb = broker.rss_kb();
    let started = Instant::now();
    let mut sleeper = Raw::client(addr)?;
    subscribe(&mut sleeper, "flood")?;

    let mut publisher = Raw::client(addr)?;
    subscribe(&mut publisher, "flood")?;
    let filler = "x".repeat(FLOOD_MSG_BYTES - 8);
    let mut rss_max_kb = rss_start_kb;
    let mut received = 0usize;
    for seq in 0..FLOOD_MSG_COUNT {
        // Fire and forget (no ack id); the ping below is the barrier.
        let pub_event = json!(["pub", { "subject": "flood", "data": format!("{seq:08}{filler}") }]);
        publisher.send_text(&format!("42{pub_event}"))?;
        if (seq + 1) % FLOOD_BATCH_COUNT == 0 {
            publisher
                .ping()
                .map_err(|e| format!("publisher, after {} pubs: {e}", seq + 1))?;
            received += check_flood_order(&mut publisher, received)?;
            rss_max_kb = rss_max_kb.max(broker.rss_kb());
        }
    }
    publisher.ping()?;
    while received < FLOOD_MSG_COUNT {
        let msg = publisher
            .next_msg()
            .map_err(|e| format!("publisher got {received} of its own msgs: {e}"))?;
        publisher.inbox.push_front(msg);
        received += check_flood_order(&mut publisher, received)?;
    }
    rss_max_kb = rss_max_kb.max(broker.rss_kb());

    let closing = sleeper.expect_closed(FLOOD_SETTLE).map_err(|e| {
        format!("the non-reader was not disconnected as a slow consumer after {FLOOD_MSG_COUNT} x {FLOOD_MSG_BYTES} B: {e}")
    })?;
    let read = closing.packets;
    let elapsed = started.elapsed();
    if elapsed >= HEARTBEAT_CUT {
        // The heartbeat alone would have closed it by now: inconclusive.
        return Err(format!("the flood took {elapsed:?}, so the non-reader's close may be the heartbeat's, not the slow-consumer cut"));
    }
    if read >= FLOOD_MSG_COUNT {
        return Err(format!(
            "the non-reader got all {read} msgs, then was closed: no slow-consumer cut"
        ));
    }
    let growth_kb = rss_max_kb.saturating_sub(rss_start_kb);
    if growth_kb > RSS_GROWTH_MAX_KB {
        return Err(format!(
            "broker RSS grew by {growth_kb} KiB during the flood (start {rss_start_kb} KiB, max {rss_max_kb} KiB), bound {RSS_GROWTH_MAX_KB} KiB"
        ));
    }
    slow_consumers_counted(addr)?;
    Ok(format!(
        "non-reader closed after {read} buffered packets in {elapsed:?}; RSS start {rss_start_kb} KiB, max {rss_max_kb} KiB"
    ))
}

/// PROTOCOL.md §4 and §7: the slow-consumer cut is counted in `/metrics`.
/// The metric's exact name is the broker's; any sample whose name mentions
/// `slow` with a value of at least 1 counts.
fn slow_consumers_counted(addr: &str) -> Result<(), String> {
    let body = match common::try_http_get(addr, "/metrics") {
        Ok((200, body)) => body,
        Ok((code, _)) => return Err(format!("GET /metrics: status {code}")),
        Err(e) => return Err(format!("GET /metrics on {addr}: {e}")),
    };
    let counted = body
        .lines()
        .filter(|line| !line.starts_with('#'))
        .any(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next().unwrap_or("");
            let value = fields
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            name.contains("slow") && value >= 1.0
        });
    if counted {
        Ok(())
    } else {
        Err(format!(
            "GET /metrics shows no slow-consumer sample >= 1:\n{body}"
        ))
    }
}

/// Checks the publisher's own flood deliveries in its inbox arrive in
/// publish order (PROTOCOL.md §4); returns how many it consumed.
fn check_flood_order(publisher: &mut Raw, already: usize) -> Result<usize, String> {
    let mut count = 0;
    while let Some(msg) = publisher.inbox.pop_front() {
        let data = msg.get("data").and_then(Value::as_str).unwrap_or("");
        let want = format!("{:08}", already + count);
        if !data.starts_with(&want) || data.len() != FLOOD_MSG_BYTES {
            let head = data.get(..16).unwrap_or(data);
            return Err(format!(
                "flood msg #{} out of order or altered: data starts {head:?}",
                already + count
            ));
        }
        count += 1;
    }
    Ok(count)
}

/// The well-behaved client, checked last: a pub/sub round trip and a ping.
fn check_good_client(good: &mut Raw, sid: &str) -> Result<(), String> {
    good.ping()?;
    expect_ok(
        &good.request(
            "pub",
            json!({ "subject": "good.check", "data": { "still": "here" } }),
        )?,
        "pub good.check",
    )?;
    let msg = good.next_msg()?;
    let want = json!({ "sid": sid, "subject": "good.check", "data": { "still": "here" } });
    let got =
        json!({ "sid": msg.get("sid"), "subject": msg.get("subject"), "data": msg.get("data") });
    if got != want {
        return Err(clip(format!("expected {want}, got {msg}")));
    }
    Ok(())
}

/// Every hostile connection is gone: the broker counts no more connections
/// than the two well-behaved ones still open. Polled with a deadline, since
/// the broker learns of a vanished peer asynchronously.
fn check_no_leaked_connections(control: &mut Raw) -> Result<(), String> {
    const LIVE_CONNECTIONS_MAX: u64 = 2;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = control.request("server.info", json!({}))?;
        expect_ok(&info, "server.info")?;
        let connections = info.get("connections").and_then(Value::as_u64);
        match connections {
            Some(n) if n <= LIVE_CONNECTIONS_MAX => return Ok(()),
            Some(_) if Instant::now() < deadline => continue,
            _ => {
                return Err(format!(
                    "server.info still counts {connections:?} connections (at most {LIVE_CONNECTIONS_MAX} open): {info}"
                ))
            }
        }
    }
}

/// Records a case's outcome, then checks that the well-behaved client is
/// still served (its ping also answers the broker's heartbeat on the way).
fn run_case(
    failures: &mut Vec<String>,
    good: &mut Raw,
    name: &str,
    outcome: Result<String, String>,
) {
    if let Err(err) = good.ping() {
        eprintln!("case {name}: the well-behaved client was hurt: {err}");
        failures.push(format!("{name}: the well-behaved client was hurt: {err}"));
    }
    match outcome {
        Ok(note) if note.is_empty() => eprintln!("case {name}: ok"),
        Ok(note) => eprintln!("case {name}: ok ({note})"),
        Err(err) => {
            eprintln!("case {name}: FAILED: {err}");
            failures.push(format!("{name}: {err}"));
        }
    }
}

fn done(result: Result<(), String>) -> Result<String, String> {
    result.map(|()| String::new())
}

#[test]
fn hostile_clients_never_hurt_others() {
    let broker =
        common::Broker::start(&[MAX_PENDING_ARG, &format!("-control-token={CONTROL_TOKEN}")]);
    let addr = broker.addr.to_string();
    let mut good = Raw::client(&addr).unwrap_or_else(|e| panic!("well-behaved client: {e}"));
    let good_sid =
        subscribe(&mut good, "good.>").unwrap_or_else(|e| panic!("well-behaved client: {e}"));
    let mut failures = Vec::new();

    for frame in ["xyz", "4abc", "42{}", r#"42abc["x"]"#] {
        run_case(
            &mut failures,
            &mut good,
            &format!("(a) garbage {frame:?}"),
            done(case_closes_on(&addr, frame)),
        );
    }
    run_case(
        &mut failures,
        &mut good,
        "(b) invalid JSON",
        done(case_closes_on(&addr, r#"42["pub",{"#)),
    );
    run_case(
        &mut failures,
        &mut good,
        "(c)+(e) unknown or argument-less events",
        done(case_unknown_events(&addr)),
    );
    run_case(
        &mut failures,
        &mut good,
        "(d) huge ack id",
        done(case_closes_on(
            &addr,
            r#"4299999999999999999999999["ping",{}]"#,
        )),
    );
    run_case(
        &mut failures,
        &mut good,
        "(f) random binary frames",
        done(case_random_binary(&addr, 0x9E37_79B9_7F4A_7C15)),
    );
    // Text frame, masked, 16-bit length announced but not sent.
    run_case(
        &mut failures,
        &mut good,
        "(g) vanish in frame header",
        done(case_vanish_mid_frame(&addr, &[0x81, 0xFE, 0x01])),
    );
    // Text frame of 100 bytes, mask sent, 10 payload bytes sent.
    let mut torn = vec![0x81, 0x80 | 100, 1, 2, 3, 4];
    torn.extend_from_slice(&[b'4'; 10]);
    run_case(
        &mut failures,
        &mut good,
        "(g) vanish in frame payload",
        done(case_vanish_mid_frame(&addr, &torn)),
    );
    run_case(
        &mut failures,
        &mut good,
        "(h) slow consumer",
        case_slow_consumer(&addr, &broker),
    );

    let still_served = done(check_good_client(&mut good, &good_sid));
    run_case(
        &mut failures,
        &mut good,
        "well-behaved client still served",
        still_served,
    );
    let control = Raw::connect(&addr, "/control", Some(json!({ "token": CONTROL_TOKEN })));
    let leaks = control.and_then(|mut control| check_no_leaked_connections(&mut control));
    run_case(
        &mut failures,
        &mut good,
        "no leaked connections",
        done(leaks),
    );

    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The seeded hostile driver: mutated packets, frames, HTTP requests and
// polling payloads over real sockets, both transports, Engine.IO 3 and 4.

/// How long the driver runs (`ABUSE_FUZZ_SECS`, default 8 s).
fn driver_secs() -> f64 {
    std::env::var("ABUSE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8.0)
}

/// The driver's seed (`ABUSE_FUZZ_SEED`, default 1).
fn driver_seed() -> u64 {
    std::env::var("ABUSE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Valid Engine.IO messages carrying Socket.IO packets, for mutation.
const PACKETS: &[&str] = &[
    r#"42["pub",{"subject":"fz.a","data":{"n":1},"headers":{"k":"v"}}]"#,
    r#"421["sub",{"subject":"fz.*","queue":"q","sid":"s1","max":3}]"#,
    r#"422["unsub",{"sid":"s1","after":1}]"#,
    r#"423["request",{"subject":"fz.none","data":"x","timeout_ms":50}]"#,
    r#"424["ping",{}]"#,
    r#"425["stream.create",{"name":"FZ","subjects":["fz.s.>"],"max_msgs":10}]"#,
    r#"426["stream.get",{"name":"FZ","seq":1}]"#,
    r#"427["consumer.create",{"stream":"FZ","name":"c","ack_policy":"explicit"}]"#,
    r#"428["consumer.fetch",{"stream":"FZ","consumer":"c","batch":2,"no_wait":true}]"#,
    r#"429["ack",{"stream":"FZ","consumer":"c","seq":1}]"#,
    r#"4510["stream.info",{"name":"FZ"}]"#,
    r#"451-11["pub",{"subject":"fz.b","data":{"_placeholder":true,"num":0}}]"#,
    r#"40/control,{"token":"nope"}"#,
    r#"43[{"ok":true}]"#,
];

/// A probe that needs an answer: `ping` with an ack id no mutated packet
/// in the corpus uses.
const PROBE_ID: u64 = 987_654;

/// Sends mutated packets over a WebSocket session of Engine.IO `eio`,
/// then a probe. The broker must close the connection or answer the
/// probe, unless a packet left the namespace (PROTOCOL.md §2: events for a
/// namespace the socket has not joined are ignored).
fn drive_ws_packets(
    addr: &str,
    eio: u8,
    rng: &mut fuzz_support::Rng,
) -> Result<&'static str, String> {
    let mut raw = Raw::open_eio(addr, eio)?;
    if eio == 4 {
        raw.send_text("40")?;
    }
    // v4: the CONNECT answer; v3: the broker's own `40`.
    match raw.recv(Instant::now() + WAIT)? {
        Inbound::Packet(p) if p.kind == b'0' => {}
        other => {
            return Err(format!(
                "EIO={eio}: no CONNECT: {}",
                clip(format!("{other:?}"))
            ))
        }
    }
    let corpus: Vec<Vec<u8>> = PACKETS.iter().map(|p| p.as_bytes().to_vec()).collect();
    let mut sent = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let mut p = rng.pick(&corpus).clone();
        if rng.one_in(2) {
            fuzz_support::mutate_rounds(rng, &corpus, &mut p, 80_000, 1);
        } else {
            fuzz_support::mutate(rng, &corpus, &mut p, 80_000);
        }
        let text = String::from_utf8_lossy(&p).into_owned();
        let binary = rng.one_in(8);
        let sent_ok = if binary {
            raw.send(Message::binary(p))
        } else {
            raw.send_text(&text)
        };
        if sent_ok.is_err() {
            break; // closed by the broker already
        }
        sent.push(text);
    }
    let left_namespace = sent
        .iter()
        .any(|t| t.starts_with("41") || t.starts_with('1'));
    if raw
        .send_text(&format!("42{PROBE_ID}[\"ping\",{{}}]"))
        .is_err()
    {
        return Ok("closed");
    }
    let deadline = Instant::now() + WAIT;
    loop {
        match raw.recv(deadline)? {
            Inbound::Closed(_) => return Ok("closed"),
            Inbound::Packet(p) if p.kind == b'3' && p.id == Some(PROBE_ID) => {
                return Ok("probe answered")
            }
            Inbound::Packet(_) | Inbound::Other(_) => {}
            Inbound::TimedOut if left_namespace => return Ok("namespace left"),
            Inbound::TimedOut => {
                return Err(format!(
                    "EIO={eio}: neither closed nor answered the probe within {WAIT:?} after {}",
                    clip(format!("{sent:?}"))
                ))
            }
        }
    }
}

/// A masked client frame.
fn masked_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// Writes mutated WebSocket frames raw on a joined connection, then ends
/// the stream: the broker must close the connection.
fn drive_ws_frames(addr: &str, rng: &mut fuzz_support::Rng) -> Result<&'static str, String> {
    let mut raw = Raw::client(addr)?;
    raw.ws.flush().map_err(|e| format!("flush: {e}"))?;
    let mut frames = vec![
        masked_frame(true, 1, PACKETS[0].as_bytes()),
        masked_frame(false, 1, b"42[\"pub\","),
        masked_frame(true, 0, b"{\"subject\":\"fz\"}]"),
        masked_frame(true, 9, b"hi"),
        masked_frame(true, 2, &[1, 2, 3]),
        masked_frame(true, 8, &1000u16.to_be_bytes()),
    ];
    let joined: Vec<u8> = frames.concat();
    frames.push(joined);
    let mut bytes = rng.pick(&frames).clone();
    fuzz_support::mutate(rng, &frames, &mut bytes, 80_000);
    let stream = raw.ws.get_mut();
    let _ = stream.write_all(&bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    read_to_close(stream, WAIT).map(|_| "closed")
}

/// Reads until the peer closes; Err if it is still open at the deadline.
fn read_to_close(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "still open {within:?} after the client's end of stream; read {} bytes: {}",
                got.len(),
                clip(String::from_utf8_lossy(&got).into_owned())
            ));
        }
        let _ = stream.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {}
            // A reset is a close too.
            Err(_) => return Ok(got),
        }
    }
}

/// One raw HTTP exchange: the bytes, end of stream, everything answered.
fn http_exchange(addr: &str, request: &[u8]) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_write_timeout(Some(WAIT))
        .map_err(|e| format!("write timeout: {e}"))?;
    // The broker may close before reading it all (a head too large).
    let _ = stream.write_all(request);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    read_to_close(&mut stream, WAIT)
}

/// The status of an HTTP answer, `None` for no answer at all; Err for
/// bytes that are not an HTTP/1.1 answer.
fn http_status(answer: &[u8]) -> Result<Option<u16>, String> {
    if answer.is_empty() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(answer);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("not an HTTP answer: {}", clip(text.into_owned())))
}

/// The sid of a polling handshake's answer, if it is one.
fn handshake_sid(answer: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(answer);
    let (_, body) = text.split_once("\r\n\r\n")?;
    let json = &body[body.find("0{")? + 1..];
    let end = json.find('}')? + 1;
    let v: Value = serde_json::from_str(&json[..end]).ok()?;
    v.get("sid")?.as_str().map(str::to_string)
}

/// Ends a polling session (Engine.IO close packet) so it does not linger.
fn close_polling(addr: &str, eio: u8, sid: &str) -> Result<(), String> {
    let body = if eio == 3 { "1:1" } else { "1" };
    let req = format!(
        "POST /socket.io/?EIO={eio}&transport=polling&sid={sid} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = http_exchange(addr, req.as_bytes())?;
    match http_status(&answer)? {
        Some(200 | 400) => Ok(()),
        other => Err(format!("closing polling session {sid}: status {other:?}")),
    }
}

/// Mutated HTTP requests (handshakes on both transports and versions,
/// POSTs, plain GETs): an HTTP answer or a close, never a hang.
fn drive_http(addr: &str, rng: &mut fuzz_support::Rng) -> Result<String, String> {
    let reqs: Vec<Vec<u8>> = [
        "GET /socket.io/?EIO=4&transport=polling HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        "GET /socket.io/?EIO=3&transport=polling&b64=1 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n".to_string(),
        "GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".to_string(),
        "GET /socket.io/?EIO=3&transport=websocket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".to_string(),
        "POST /socket.io/?EIO=4&transport=polling&sid=nosuch HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n40".to_string(),
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        "GET /metrics HTTP/1.0\r\n\r\n".to_string(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    let mut req = rng.pick(&reqs).clone();
    fuzz_support::mutate(rng, &reqs, &mut req, 80_000);
    let answer = http_exchange(addr, &req)?;
    let status = http_status(&answer).map_err(|e| {
        format!(
            "request {}: {e}",
            clip(String::from_utf8_lossy(&req).into_owned())
        )
    })?;
    if status == Some(200) {
        if let Some(sid) = handshake_sid(&answer) {
            let eio = if String::from_utf8_lossy(&req).contains("EIO=3") {
                3
            } else {
                4
            };
            close_polling(addr, eio, &sid)?;
        }
    }
    Ok(match status {
        None => "closed unanswered".into(),
        Some(code) => code.to_string(),
    })
}

/// A polling session of Engine.IO `eio` that POSTs a mutated payload: 200
/// or 400 (the session closed), then the session is closed.
fn drive_polling(addr: &str, eio: u8, rng: &mut fuzz_support::Rng) -> Result<&'static str, String> {
    let hs = format!("GET /socket.io/?EIO={eio}&transport=polling HTTP/1.1\r\nHost: x\r\n\r\n");
    let answer = http_exchange(addr, hs.as_bytes())?;
    let sid = handshake_sid(&answer).ok_or_else(|| {
        format!(
            "EIO={eio} handshake: {}",
            clip(String::from_utf8_lossy(&answer).into_owned())
        )
    })?;
    let payloads: Vec<Vec<u8>> = [&PACKETS[..4], &PACKETS[4..8], &PACKETS[8..]]
        .iter()
        .map(|group| {
            let mut out = Vec::new();
            if eio == 4 {
                gombus::net::polling::push_text(&mut out, eio, b"40", &[]);
            }
            for p in group.iter() {
                gombus::net::polling::push_text(&mut out, eio, p.as_bytes(), &[]);
            }
            gombus::net::polling::push_binary(&mut out, eio, &[1, 2, 3]);
            out
        })
        .collect();
    let mut body = rng.pick(&payloads).clone();
    fuzz_support::mutate(rng, &payloads, &mut body, 80_000);
    let mut req = format!(
        "POST /socket.io/?EIO={eio}&transport=polling&sid={sid} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain;charset=UTF-8\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let answer = http_exchange(addr, &req)?;
    let status = match http_status(&answer)? {
        Some(200) => "200",
        Some(400) => "400",
        Some(413) => "413",
        other => {
            return Err(format!(
                "EIO={eio} POST of {}: status {other:?}",
                clip(String::from_utf8_lossy(&body).into_owned())
            ))
        }
    };
    close_polling(addr, eio, &sid)?;
    Ok(status)
}

/// Open descriptors of a process.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Bound on the broker's RSS growth over the driver's run: each hostile
/// connection is closed or finished before the next, so what stays is
/// allocator slack, a few streams and the metrics; an unbounded buffer
/// fed by 80 KB inputs would pass it within seconds.
const DRIVER_RSS_GROWTH_MAX_KB: u64 = 32 * 1024;
/// Descriptors the broker may hold over its count before the run, once
/// every hostile connection is gone (the stream files the mutated
/// `stream.create` packets may have opened).
const DRIVER_FDS_EXTRA_MAX: usize = 16;

#[test]
fn seeded_hostile_driver_never_hurts_others() {
    let seed = driver_seed();
    let secs = driver_secs();
    let broker = common::Broker::start(&[&format!("-control-token={CONTROL_TOKEN}")]);
    let addr = broker.addr.to_string();
    let mut good = Raw::client(&addr).unwrap_or_else(|e| panic!("well-behaved client: {e}"));
    let good_sid =
        subscribe(&mut good, "good.>").unwrap_or_else(|e| panic!("well-behaved client: {e}"));
    let mut control = Raw::connect(&addr, "/control", Some(json!({ "token": CONTROL_TOKEN })))
        .unwrap_or_else(|e| panic!("control client: {e}"));
    let fds_start = fd_count(broker.pid());
    let rss_start_kb = broker.rss_kb();
    let mut rss_max_kb = rss_start_kb;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut failures = Vec::new();
    let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
    let mut round: u64 = 0;
    let mut last_control = Instant::now();
    while Instant::now() < deadline && failures.len() < 5 {
        let mut rng = fuzz_support::Rng::new(seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let kind = rng.below(6);
        let (name, result) = match kind {
            0 => (
                "ws EIO=4 packets",
                drive_ws_packets(&addr, 4, &mut rng).map(String::from),
            ),
            1 => (
                "ws EIO=3 packets",
                drive_ws_packets(&addr, 3, &mut rng).map(String::from),
            ),
            2 => (
                "ws frames",
                drive_ws_frames(&addr, &mut rng).map(String::from),
            ),
            3 => ("http requests", drive_http(&addr, &mut rng)),
            4 => (
                "polling EIO=4 payload",
                drive_polling(&addr, 4, &mut rng).map(String::from),
            ),
            _ => (
                "polling EIO=3 payload",
                drive_polling(&addr, 3, &mut rng).map(String::from),
            ),
        };
        match result {
            Ok(how) => *outcomes.entry(format!("{name}: {how}")).or_default() += 1,
            Err(e) => failures.push(format!(
                "round {round} ({name}; replay: ABUSE_FUZZ_SEED={seed}): {e}"
            )),
        }
        if let Err(e) = check_good_client(&mut good, &good_sid) {
            failures.push(format!(
                "round {round}: the well-behaved client was hurt: {e}"
            ));
            break;
        }
        rss_max_kb = rss_max_kb.max(broker.rss_kb());
        // The control client answers the broker's heartbeat as it reads.
        if last_control.elapsed() > Duration::from_secs(5) {
            let info = control.request("server.info", json!({}));
            if let Err(e) = info.and_then(|i| expect_ok(&i, "server.info")) {
                failures.push(format!("round {round}: the control client was hurt: {e}"));
                break;
            }
            last_control = Instant::now();
        }
        round += 1;
    }
    eprintln!(
        "hostile driver: seed {seed}, {round} rounds in {secs}s; RSS {rss_start_kb} -> max {rss_max_kb} KiB"
    );
    for (what, n) in &outcomes {
        eprintln!("  {what}: {n}");
    }
    if let Err(e) = check_no_leaked_connections(&mut control) {
        failures.push(e);
    }
    // Closed connections free their descriptors as the loop learns of it.
    let fd_deadline = Instant::now() + WAIT;
    let mut fds = fd_count(broker.pid());
    while fds > fds_start + DRIVER_FDS_EXTRA_MAX && Instant::now() < fd_deadline {
        // A round trip lets the loop run before the next count.
        let info = control.request("server.info", json!({}));
        if let Err(e) = info.and_then(|i| expect_ok(&i, "server.info")) {
            failures.push(format!("control client: {e}"));
            break;
        }
        fds = fd_count(broker.pid());
    }
    if fds > fds_start + DRIVER_FDS_EXTRA_MAX {
        failures.push(format!(
            "the broker holds {fds} descriptors, {fds_start} before the run (bound +{DRIVER_FDS_EXTRA_MAX})"
        ));
    }
    let growth = rss_max_kb.saturating_sub(rss_start_kb);
    if growth > DRIVER_RSS_GROWTH_MAX_KB {
        failures.push(format!(
            "broker RSS grew by {growth} KiB (bound {DRIVER_RSS_GROWTH_MAX_KB} KiB)"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} failure(s) (seed {seed}):\n{}\nbroker log:\n{}",
        failures.len(),
        failures.join("\n"),
        broker.recent_log()
    );
}
