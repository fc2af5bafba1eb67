//! The conformance fixture (examples/conformance.rs) checked the way the
//! official Engine.IO v4 and Socket.IO v5 suites check a server, over
//! WebSocket and HTTP long-polling (PROTOCOL.md §8), with our own raw
//! clients: tungstenite for WebSocket sessions, a bare `TcpStream` for
//! HTTP (polling requests and the handshake error answers).
//!
//! Every wait has a deadline; nothing sleeps to synchronise. Timings are
//! checked only where the spec gives them (heartbeat, connect timeout), with
//! slack for a loaded machine.

#[path = "../examples/conformance.rs"]
mod fixture;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::{Error as WsError, Message, WebSocket};

use fixture::{CONNECT_TIMEOUT, MESSAGE_BYTES_MAX, PING_INTERVAL, PING_TIMEOUT};

/// Bound on any single expected frame or HTTP answer.
const WAIT: Duration = Duration::from_secs(3);
/// What a deadline from the spec may be overrun by on a busy machine.
const SLACK: Duration = Duration::from_millis(700);
/// How early the loop may act on a deadline (its timer granularity).
const EARLY: Duration = Duration::from_millis(2);

const ENGINE: &str = "/engine.io/";
const SOCKET: &str = "/socket.io/";

/// One fixture for the whole test binary, on a port of its own.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        match fixture::start(any) {
            Ok((addr, _thread)) => addr,
            Err(e) => panic!("the conformance fixture did not start: {e}"),
        }
    })
}

// ---------------------------------------------------------------------------
// A raw Engine.IO client over tungstenite.

/// What one read gave before its deadline.
#[derive(Debug, PartialEq)]
enum Frame {
    Text(String),
    Binary(Vec<u8>),
    /// A close frame, or the connection ended.
    Closed,
    TimedOut,
}

struct Peer {
    ws: WebSocket<TcpStream>,
    /// The Engine.IO open packet, `0{…}`.
    open: String,
}

impl Peer {
    /// Upgrades at `path` and reads the open packet.
    fn open(path: &str) -> Peer {
        let addr = server();
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(WAIT)).expect("read timeout");
        stream.set_write_timeout(Some(WAIT)).expect("write timeout");
        let url = format!("ws://{addr}{path}?EIO=4&transport=websocket");
        let (ws, _) = tungstenite::client(url.as_str(), stream)
            .unwrap_or_else(|e| panic!("upgrade at {url}: {e}"));
        let mut peer = Peer {
            ws,
            open: String::new(),
        };
        match peer.next(Instant::now() + WAIT) {
            Frame::Text(t) if t.starts_with('0') => peer.open = t,
            other => panic!("expected the open packet at {path}, got {other:?}"),
        }
        peer
    }

    /// Opens `/socket.io/`, joins `nsp` (`40…`) and checks the answer and
    /// the `auth` emit; returns the peer ready for events.
    fn joined(nsp: &str) -> Peer {
        let mut peer = Peer::open(SOCKET);
        peer.send(&format!("40{}", nsp_prefix(nsp)));
        peer.expect_connect(nsp);
        peer.expect(&format!("42{}[\"auth\",{{}}]", nsp_prefix(nsp)));
        peer
    }

    fn send(&mut self, text: &str) {
        self.ws
            .send(Message::text(text))
            .unwrap_or_else(|e| panic!("send {text:?}: {e}"));
    }

    fn send_binary(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::binary(bytes.to_vec()))
            .unwrap_or_else(|e| panic!("send {} binary bytes: {e}", bytes.len()));
    }

    /// The next frame, Engine.IO pings included.
    fn next(&mut self, deadline: Instant) -> Frame {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Frame::TimedOut;
            }
            if self.ws.get_ref().set_read_timeout(Some(left)).is_err() {
                return Frame::Closed;
            }
            match self.ws.read() {
                Ok(Message::Text(t)) => return Frame::Text(t.as_str().to_string()),
                Ok(Message::Binary(b)) => return Frame::Binary(b.to_vec()),
                Ok(Message::Close(_)) => return Frame::Closed,
                // WebSocket-level ping/pong: tungstenite answers on its own.
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Err(WsError::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    return Frame::TimedOut;
                }
                Err(_) => return Frame::Closed,
            }
        }
    }

    /// The next frame that is not an Engine.IO ping; pings are answered, as
    /// a client would, so the heartbeat never ends the session.
    fn next_app(&mut self, deadline: Instant) -> Frame {
        loop {
            match self.next(deadline) {
                Frame::Text(t) if t == "2" => {
                    // The peer may be gone already; the next read says so.
                    let _ = self.ws.send(Message::text("3"));
                }
                other => return other,
            }
        }
    }

    /// The next non-ping frame must be exactly `text`.
    fn expect(&mut self, text: &str) {
        let got = self.next_app(Instant::now() + WAIT);
        assert_eq!(got, Frame::Text(text.to_string()), "expected {text:?}");
    }

    fn expect_binary(&mut self, bytes: &[u8]) {
        let got = self.next_app(Instant::now() + WAIT);
        assert_eq!(got, Frame::Binary(bytes.to_vec()));
    }

    /// The CONNECT answer for `nsp`: `40[nsp,]{"sid":"…"}` and nothing else.
    fn expect_connect(&mut self, nsp: &str) {
        let head = format!("40{}", nsp_prefix(nsp));
        let text = match self.next_app(Instant::now() + WAIT) {
            Frame::Text(t) if t.starts_with(&head) => t,
            other => panic!("expected the CONNECT answer {head}{{…}}, got {other:?}"),
        };
        let body: Value = serde_json::from_str(&text[head.len()..])
            .unwrap_or_else(|e| panic!("CONNECT answer {text:?}: {e}"));
        let keys: Vec<&String> = body
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["sid"], "CONNECT answer {text:?}");
        assert!(
            body["sid"].as_str().is_some_and(|s| !s.is_empty()),
            "sid in {text:?}"
        );
    }

    /// The server must close the session before `deadline`; pings are
    /// answered meanwhile and any other frame is a failure.
    fn expect_closed_by(&mut self, deadline: Instant, why: &str) {
        match self.next_app(deadline) {
            Frame::Closed => {}
            other => panic!("{why}: expected the session to close, got {other:?}"),
        }
    }
}

/// `/custom` -> `/custom,`; the root namespace has no prefix.
fn nsp_prefix(nsp: &str) -> String {
    if nsp == "/" {
        String::new()
    } else {
        format!("{nsp},")
    }
}

// ---------------------------------------------------------------------------
// Raw HTTP, for the handshake errors.

struct HttpAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends a WebSocket upgrade request for `target` and reads the answer up
/// to the server's close (it answers errors with `Connection: close`).
fn upgrade_request(target: &str) -> HttpAnswer {
    let addr = server();
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: AAECAwQFBgcICQoLDA0ODw==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("write request");
    read_to_close(stream, target)
}

/// One plain HTTP request with `Connection: close`; the answer read to EOF.
fn http_request(method: &str, target: &str, extra_headers: &str, body: &[u8]) -> HttpAnswer {
    let addr = server();
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra_headers}\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).expect("write request");
    read_to_close(stream, target)
}

fn read_to_close(mut stream: TcpStream, target: &str) -> HttpAnswer {
    let deadline = Instant::now() + WAIT;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        assert!(Instant::now() < deadline, "no complete answer for {target}");
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("reading the answer for {target}: {e}"),
        }
    }
    let text = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no blank line in {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    HttpAnswer {
        status,
        headers,
        body: body.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Engine.IO: handshake.

/// An open packet (at `path`) has exactly the five keys of the contract,
/// and the suite's heartbeat and payload settings.
fn assert_open_settings(open: &Value, path: &str) {
    let mut keys: Vec<&String> = open
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    keys.sort();
    assert_eq!(
        keys,
        [
            "maxPayload",
            "pingInterval",
            "pingTimeout",
            "sid",
            "upgrades"
        ],
        "{path}"
    );
    assert_eq!(open["pingInterval"], PING_INTERVAL.as_millis() as u64);
    assert_eq!(open["pingTimeout"], PING_TIMEOUT.as_millis() as u64);
    assert_eq!(open["maxPayload"], MESSAGE_BYTES_MAX as u64);
}

#[test]
fn open_packet_carries_the_suite_settings() {
    for path in [ENGINE, SOCKET] {
        let peer = Peer::open(path);
        let open: Value = serde_json::from_str(&peer.open[1..])
            .unwrap_or_else(|e| panic!("open packet {:?}: {e}", peer.open));
        assert_open_settings(&open, path);
        assert!(
            open["sid"].as_str().is_some_and(|s| !s.is_empty()),
            "{path}"
        );
        assert_eq!(open["upgrades"], serde_json::json!([]), "{path}");
        assert_eq!(
            (PING_INTERVAL.as_millis(), PING_TIMEOUT.as_millis()),
            (300, 200),
            "the suites hard-code these"
        );
    }
}

#[test]
fn bad_eio_and_bad_transport_get_400_with_engine_io_bodies() {
    let version = r#"{"code":5,"message":"Unsupported protocol version"}"#;
    let transport = r#"{"code":0,"message":"Transport unknown"}"#;
    let cases = [
        ("?transport=websocket", version),
        ("?EIO=abc&transport=websocket", version),
        ("?EIO=4", transport),
        ("?EIO=4&transport=abc", transport),
    ];
    for path in [ENGINE, SOCKET] {
        for (query, body) in cases {
            let target = format!("{path}{query}");
            let answer = upgrade_request(&target);
            assert_eq!(answer.status, 400, "{target}");
            assert_eq!(answer.body, body, "{target}");
            assert_eq!(
                answer.header("Content-Type"),
                Some("application/json"),
                "{target}"
            );
            assert_eq!(
                answer.header("Access-Control-Allow-Origin"),
                Some("*"),
                "{target}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Engine.IO: messages, heartbeat, close.

#[test]
fn engine_io_echoes_a_text_packet() {
    let mut peer = Peer::open(ENGINE);
    peer.send("4hello");
    peer.expect("4hello");
    peer.send("4€ and \"quotes\"");
    peer.expect("4€ and \"quotes\"");
}

#[test]
fn engine_io_echoes_a_binary_packet() {
    let mut peer = Peer::open(ENGINE);
    peer.send_binary(&[1, 2, 3, 4]);
    peer.expect_binary(&[1, 2, 3, 4]);
}

#[test]
fn engine_io_closes_on_an_invalid_packet() {
    let mut peer = Peer::open(ENGINE);
    peer.send("abc");
    peer.expect_closed_by(Instant::now() + WAIT, "after \"abc\"");
}

#[test]
fn heartbeat_pings_three_times_while_pongs_come_back() {
    for path in [ENGINE, SOCKET] {
        let mut peer = Peer::open(path);
        if path == SOCKET {
            // Joined, so the connect timeout does not end the session.
            peer.send("40");
            peer.expect_connect("/");
            peer.expect("42[\"auth\",{}]");
        }
        for round in 0..3 {
            let got = peer.next(Instant::now() + PING_INTERVAL + SLACK);
            assert_eq!(got, Frame::Text("2".into()), "{path}: ping {round}");
            peer.send("3");
        }
        // Still open: the Engine.IO echo or a Socket.IO event answers.
        if path == ENGINE {
            peer.send("4still here");
            peer.expect("4still here");
        } else {
            peer.send(r#"42["message","still here"]"#);
            peer.expect(r#"42["message-back","still here"]"#);
        }
    }
}

#[test]
fn heartbeat_closes_when_no_pong_comes_back() {
    let started = Instant::now();
    let mut peer = Peer::open(ENGINE);
    let got = peer.next(started + PING_INTERVAL + SLACK);
    assert_eq!(got, Frame::Text("2".into()), "the first ping");
    let got = peer.next(Instant::now() + PING_TIMEOUT + SLACK);
    assert_eq!(got, Frame::Closed, "no pong: the session must close");
    assert!(
        started.elapsed() + EARLY >= PING_INTERVAL + PING_TIMEOUT,
        "closed after {:?}, before the ping timeout ran out",
        started.elapsed()
    );
}

#[test]
fn close_packet_ends_the_session() {
    for path in [ENGINE, SOCKET] {
        let mut peer = Peer::open(path);
        peer.send("1");
        peer.expect_closed_by(Instant::now() + WAIT, path);
    }
}

// ---------------------------------------------------------------------------
// Socket.IO: connect.

#[test]
fn connect_to_the_main_namespace_emits_auth() {
    let _ = Peer::joined("/");
}

#[test]
fn connect_to_the_main_namespace_with_a_payload_emits_it_back() {
    let mut peer = Peer::open(SOCKET);
    peer.send(r#"40{"token":"123"}"#);
    peer.expect_connect("/");
    peer.expect(r#"42["auth",{"token":"123"}]"#);
}

#[test]
fn connect_to_the_custom_namespace_emits_auth() {
    let _ = Peer::joined("/custom");
}

#[test]
fn connect_to_the_custom_namespace_with_a_payload_emits_it_back() {
    let mut peer = Peer::open(SOCKET);
    peer.send(r#"40/custom,{"token":"abc"}"#);
    peer.expect_connect("/custom");
    peer.expect(r#"42/custom,["auth",{"token":"abc"}]"#);
}

#[test]
fn connect_to_an_unknown_namespace_is_refused() {
    // The suite sends the namespace without the trailing comma.
    for packet in ["40/random", "40/random,"] {
        let mut peer = Peer::open(SOCKET);
        peer.send(packet);
        peer.expect(r#"44/random,{"message":"Invalid namespace"}"#);
    }
}

#[test]
fn an_invalid_handshake_closes_the_connection() {
    let mut peer = Peer::open(SOCKET);
    peer.send("4abc");
    peer.expect_closed_by(Instant::now() + WAIT, "after \"4abc\"");
}

#[test]
fn no_handshake_closes_the_connection_after_the_connect_timeout() {
    let started = Instant::now();
    let mut peer = Peer::open(SOCKET);
    // Pings are answered, so only the connect timeout can end the session.
    peer.expect_closed_by(started + CONNECT_TIMEOUT + SLACK, "no CONNECT");
    assert!(
        started.elapsed() + EARLY >= CONNECT_TIMEOUT,
        "closed after {:?}, before the connect timeout",
        started.elapsed()
    );
}

#[test]
fn a_joined_session_outlives_the_connect_timeout() {
    let mut peer = Peer::joined("/");
    let until = Instant::now() + CONNECT_TIMEOUT + PING_INTERVAL;
    assert_eq!(peer.next_app(until), Frame::TimedOut, "nothing but pings");
    peer.send(r#"42["message","late"]"#);
    peer.expect(r#"42["message-back","late"]"#);
}

// ---------------------------------------------------------------------------
// Socket.IO: disconnect.

#[test]
fn disconnect_from_the_main_namespace_keeps_the_session() {
    let mut peer = Peer::joined("/");
    peer.send("41");
    // The suite's check: the next thing to arrive is a ping, not a close.
    let got = peer.next(Instant::now() + PING_INTERVAL + SLACK);
    assert_eq!(got, Frame::Text("2".into()));
    // Events to a namespace left are ignored; joining again works.
    peer.send("3");
    peer.send(r#"42["message","ignored"]"#);
    peer.send("40");
    peer.expect_connect("/");
    peer.expect(r#"42["auth",{}]"#);
}

#[test]
fn connect_then_disconnect_from_the_custom_namespace() {
    let mut peer = Peer::joined("/");
    peer.send("40/custom");
    peer.expect_connect("/custom");
    peer.expect(r#"42/custom,["auth",{}]"#);
    peer.send("41/custom");
    peer.send(r#"42/custom,["message","to custom, ignored"]"#);
    peer.send(r#"42["message","message to main namespace"]"#);
    peer.expect(r#"42["message-back","message to main namespace"]"#);
}

// ---------------------------------------------------------------------------
// Socket.IO: messages and acks.

#[test]
fn message_comes_back_as_message_back() {
    let mut peer = Peer::joined("/");
    peer.send(r#"42["message",1,"2",{"3":[true]}]"#);
    peer.expect(r#"42["message-back",1,"2",{"3":[true]}]"#);
    peer.send(r#"42["message"]"#);
    peer.expect(r#"42["message-back"]"#);
}

#[test]
fn message_in_the_custom_namespace_comes_back_there() {
    let mut peer = Peer::joined("/custom");
    peer.send(r#"42/custom,["message",{"a":null}]"#);
    peer.expect(r#"42/custom,["message-back",{"a":null}]"#);
}

#[test]
fn message_with_attachments_comes_back_with_them() {
    let mut peer = Peer::joined("/");
    peer.send(r#"452-["message",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#);
    peer.send_binary(&[1, 2, 3]);
    peer.send_binary(&[4, 5, 6]);
    peer.expect(
        r#"452-["message-back",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#,
    );
    peer.expect_binary(&[1, 2, 3]);
    peer.expect_binary(&[4, 5, 6]);
}

#[test]
fn message_with_ack_is_acked_with_its_arguments() {
    let mut peer = Peer::joined("/");
    peer.send(r#"42456["message-with-ack",1,"2",{"3":[false]}]"#);
    peer.expect(r#"43456[1,"2",{"3":[false]}]"#);
}

#[test]
fn message_with_ack_and_attachments_is_acked_with_them() {
    let mut peer = Peer::joined("/");
    peer.send(
        r#"452-789["message-with-ack",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#,
    );
    peer.send_binary(&[1, 2, 3]);
    peer.send_binary(&[4, 5, 6]);
    peer.expect(r#"462-789[{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#);
    peer.expect_binary(&[1, 2, 3]);
    peer.expect_binary(&[4, 5, 6]);
}

#[test]
fn invalid_packets_close_the_connection() {
    let cases = [
        ("unknown packet type", Message::text("4abc")),
        ("invalid payload format", Message::text("42{}")),
        (
            "invalid ack id",
            Message::text(r#"42abc["message-with-ack",1,"2",{"3":[false]}]"#),
        ),
        ("unannounced attachment", Message::binary(vec![1, 2, 3])),
    ];
    for (what, message) in cases {
        let mut peer = Peer::joined("/");
        peer.ws
            .send(message)
            .unwrap_or_else(|e| panic!("send ({what}): {e}"));
        peer.expect_closed_by(Instant::now() + WAIT, what);
    }
}

// ---------------------------------------------------------------------------
// HTTP long-polling (the suites' "HTTP long-polling" and "upgrade" cases,
// on both endpoints where the Socket.IO suite repeats them).

fn poll_target(path: &str, sid: &str) -> String {
    format!("{path}?EIO=4&transport=polling&sid={sid}")
}

fn poll_get(path: &str, sid: &str) -> HttpAnswer {
    http_request("GET", &poll_target(path, sid), "", b"")
}

fn poll_post(path: &str, sid: &str, body: &str) -> HttpAnswer {
    http_request("POST", &poll_target(path, sid), "", body.as_bytes())
}

/// Opens a polling session with a handshake GET; returns its sid and the
/// open packet's fields.
fn poll_open(path: &str) -> (String, Value) {
    let answer = http_request("GET", &format!("{path}?EIO=4&transport=polling"), "", b"");
    assert_eq!(answer.status, 200, "handshake at {path}: {}", answer.body);
    assert!(answer.body.starts_with('0'), "open packet: {}", answer.body);
    let open: Value = serde_json::from_str(&answer.body[1..])
        .unwrap_or_else(|e| panic!("open packet {:?}: {e}", answer.body));
    let sid = open["sid"].as_str().expect("sid").to_string();
    (sid, open)
}

/// The long-poll GET answers `expected` (pings are answered, as a client
/// would, and polled past).
fn poll_expect(path: &str, sid: &str, expected: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no {expected:?} in time");
        let answer = poll_get(path, sid);
        assert_eq!(answer.status, 200, "GET: {}", answer.body);
        if answer.body == "2" {
            assert_eq!(poll_post(path, sid, "3").status, 200);
            continue;
        }
        assert_eq!(answer.body, expected);
        return;
    }
}

/// A plain TCP connection to `addr` whose reads give up after `WAIT`.
fn connect_waiting(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream
}

/// A WebSocket asking to upgrade session `sid` (no open packet comes).
fn probe_socket(path: &str, sid: &str) -> WebSocket<TcpStream> {
    let addr = server();
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    let url = format!("ws://{addr}{path}?EIO=4&transport=websocket&sid={sid}");
    let (ws, _) = tungstenite::client(url.as_str(), stream)
        .unwrap_or_else(|e| panic!("upgrade at {url}: {e}"));
    ws
}

#[test]
fn polling_handshake_opens_a_session_that_may_upgrade() {
    for path in [ENGINE, SOCKET] {
        let (sid, open) = poll_open(path);
        assert!(!sid.is_empty());
        assert_open_settings(&open, path);
        assert_eq!(open["upgrades"], serde_json::json!(["websocket"]), "{path}");
    }
}

#[test]
fn polling_handshake_errors_get_400_with_engine_io_bodies() {
    let cases = [
        ("GET", "?transport=polling", 5),
        ("GET", "?EIO=abc&transport=polling", 5),
        ("GET", "?EIO=4", 0),
        ("GET", "?EIO=4&transport=abc", 0),
        ("POST", "?EIO=4&transport=polling", 2),
        ("PUT", "?EIO=4&transport=polling", 2),
        ("GET", "?EIO=4&transport=polling&sid=unknown", 1),
        ("POST", "?EIO=4&transport=polling&sid=unknown", 1),
    ];
    for path in [ENGINE, SOCKET] {
        for (method, query, code) in cases {
            let target = format!("{path}{query}");
            let answer = http_request(method, &target, "", b"");
            assert_eq!(answer.status, 400, "{method} {target}");
            let body: Value = serde_json::from_str(&answer.body).expect("JSON body");
            assert_eq!(body["code"], code, "{method} {target}: {}", answer.body);
            assert!(body["message"].is_string());
        }
    }
}

#[test]
fn polling_echoes_one_several_and_binary_packets() {
    for payload in [
        "4hello",
        "4test1\x1e4test2\x1e4test3",
        "4hello\x1ebAQIDBA==",
    ] {
        let (sid, _) = poll_open(ENGINE);
        let answer = poll_post(ENGINE, &sid, payload);
        assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
        poll_expect(ENGINE, &sid, payload);
    }
}

#[test]
fn a_held_get_is_answered_when_a_packet_arrives() {
    let (sid, _) = poll_open(ENGINE);
    let getter = {
        let sid = sid.clone();
        std::thread::spawn(move || poll_get(ENGINE, &sid))
    };
    // The echo answers whichever GET is waiting, before or after the POST.
    assert_eq!(poll_post(ENGINE, &sid, "4late").body, "ok");
    let answer = getter.join().expect("GET thread");
    assert_eq!(answer.status, 200);
    if answer.body == "2" {
        assert_eq!(poll_post(ENGINE, &sid, "3").status, 200);
        poll_expect(ENGINE, &sid, "4late");
    } else {
        assert_eq!(answer.body, "4late");
    }
}

#[test]
fn polling_takes_large_posts_sent_in_one_write() {
    let (sid, _) = poll_open(ENGINE);
    // Well past the 8 KiB head bound, in one write with its head.
    let big = format!("4{}", "y".repeat(300_000));
    let payload = format!("{big}\x1e4after");
    assert_eq!(poll_post(ENGINE, &sid, &payload).body, "ok");
    poll_expect(ENGINE, &sid, &payload);
}

#[test]
fn polling_closes_the_session_upon_an_invalid_packet() {
    for path in [ENGINE, SOCKET] {
        let (sid, _) = poll_open(path);
        assert_eq!(poll_post(path, &sid, "abc").status, 400);
        assert_eq!(poll_get(path, &sid).status, 400, "the session is gone");
    }
}

#[test]
fn polling_closes_the_session_upon_duplicate_gets() {
    let (sid, _) = poll_open(ENGINE);
    let gets: Vec<_> = (0..2)
        .map(|_| {
            let sid = sid.clone();
            std::thread::spawn(move || poll_get(ENGINE, &sid))
        })
        .collect();
    let mut answers: Vec<(u16, String)> = gets
        .into_iter()
        .map(|t| {
            let a = t.join().expect("GET thread");
            (a.status, a.body)
        })
        .collect();
    answers.sort();
    // Whichever came second is refused; the held one gets the close packet.
    assert_eq!(answers[0], (200, "1".to_string()), "{answers:?}");
    assert_eq!(answers[1].0, 400, "{answers:?}");
    assert_eq!(poll_get(ENGINE, &sid).status, 400);
}

#[test]
fn polling_heartbeat_pings_while_pongs_come_back() {
    for path in [ENGINE, SOCKET] {
        let (sid, _) = poll_open(path);
        for round in 0..3 {
            let started = Instant::now();
            let answer = poll_get(path, &sid);
            assert_eq!((answer.status, answer.body.as_str()), (200, "2"), "{round}");
            assert!(started.elapsed() < PING_INTERVAL + SLACK);
            assert_eq!(poll_post(path, &sid, "3").status, 200);
        }
    }
}

#[test]
fn polling_session_closes_upon_ping_timeout() {
    for path in [ENGINE, SOCKET] {
        let started = Instant::now();
        let (sid, _) = poll_open(path);
        let deadline = started + PING_INTERVAL + PING_TIMEOUT + SLACK;
        let answer = poll_get(path, &sid);
        assert_eq!(answer.body, "2", "the ping");
        // No pong: the next GET is held until the session ends.
        let answer = poll_get(path, &sid);
        assert!(
            answer.status == 400 || answer.body == "1",
            "{}",
            answer.body
        );
        assert_eq!(poll_get(path, &sid).status, 400);
        assert!(Instant::now() < deadline, "closed too late");
        assert!(
            started.elapsed() + EARLY >= PING_INTERVAL + PING_TIMEOUT,
            "too early"
        );
    }
}

#[test]
fn polling_close_packet_ends_the_session_and_the_concurrent_get_gets_a_noop() {
    // The suite sends the GET and the close POST at once; whichever the
    // server sees first, the GET gets the `6` noop and the session is gone.
    for _ in 0..20 {
        let (sid, _) = poll_open(SOCKET);
        let (written_tx, written_rx) = std::sync::mpsc::channel();
        let getter = {
            let sid = sid.clone();
            std::thread::spawn(move || {
                written_tx.send(()).expect("signal");
                poll_get(SOCKET, &sid)
            })
        };
        written_rx.recv().expect("GET thread started");
        assert_eq!(poll_post(SOCKET, &sid, "1").status, 200);
        let answer = getter.join().expect("GET thread");
        assert_eq!((answer.status, answer.body.as_str()), (200, "6"));
        assert_eq!(poll_get(SOCKET, &sid).status, 400);
    }
}

#[test]
fn polling_close_packet_before_the_get_still_gives_the_get_a_noop_once() {
    for path in [ENGINE, SOCKET] {
        let (sid, _) = poll_open(path);
        assert_eq!(poll_post(path, &sid, "1").status, 200);
        let answer = poll_get(path, &sid);
        assert_eq!((answer.status, answer.body.as_str()), (200, "6"));
        let again = poll_get(path, &sid);
        assert_eq!(again.status, 400, "{}", again.body);
        assert_eq!(poll_post(path, &sid, "4hello").status, 400);
    }
}

#[test]
fn upgrade_from_polling_to_websocket() {
    for path in [ENGINE, SOCKET] {
        let (sid, _) = poll_open(path);
        let mut ws = probe_socket(path, &sid);
        ws.send(Message::text("2probe")).expect("send probe");
        let got = ws.read().expect("probe answer");
        assert_eq!(got, Message::text("3probe"));
        let answer = poll_get(path, &sid);
        assert_eq!((answer.status, answer.body.as_str()), (200, "6"), "noop");
        ws.send(Message::text("5")).expect("send upgrade");
        if path == ENGINE {
            ws.send(Message::text("4hello")).expect("send");
            loop {
                match ws.read().expect("echo") {
                    Message::Text(t) if t.as_str() == "2" => {
                        ws.send(Message::text("3")).expect("pong")
                    }
                    other => {
                        assert_eq!(other, Message::text("4hello"));
                        break;
                    }
                }
            }
        }
        assert_eq!(poll_get(path, &sid).status, 400, "polling after upgrade");
    }
}

#[test]
fn packets_queued_for_polling_move_to_the_websocket() {
    let (sid, _) = poll_open(ENGINE);
    assert_eq!(poll_post(ENGINE, &sid, "4queued\x1ebAQID").body, "ok");
    let mut ws = probe_socket(ENGINE, &sid);
    ws.send(Message::text("2probe")).expect("send probe");
    ws.send(Message::text("5")).expect("send upgrade");
    assert_eq!(ws.read().expect("probe answer"), Message::text("3probe"));
    let mut got = Vec::new();
    while got.len() < 2 {
        match ws.read().expect("frame") {
            Message::Text(t) if t.as_str() == "2" => ws.send(Message::text("3")).expect("pong"),
            Message::Text(t) => got.push(Message::text(t.as_str())),
            Message::Binary(b) => got.push(Message::binary(b.to_vec())),
            _ => {}
        }
    }
    assert_eq!(
        got,
        [Message::text("4queued"), Message::binary(vec![1, 2, 3])]
    );
}

#[test]
fn probe_and_upgrade_in_one_write_still_answer_the_probe() {
    let (sid, _) = poll_open(ENGINE);
    let addr = server();
    let mut stream = connect_waiting(addr);
    let upgrade = format!(
        "GET {ENGINE}?EIO=4&transport=websocket&sid={sid} HTTP/1.1\r\nHost: x\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: AAECAwQFBgcICQoLDA0ODw==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    // The upgrade request, `2probe` and `5` as masked frames, one write.
    let mut bytes = upgrade.into_bytes();
    for text in ["2probe", "5"] {
        bytes.push(0x81);
        bytes.push(0x80 | text.len() as u8);
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        bytes.extend_from_slice(text.as_bytes());
    }
    stream.write_all(&bytes).expect("write");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + WAIT;
    let probe_frame = [&[0x81u8, 6][..], b"3probe"].concat();
    while !raw.windows(probe_frame.len()).any(|w| w == probe_frame) {
        assert!(Instant::now() < deadline, "no 3probe in {raw:?}");
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "closed without 3probe: {raw:?}");
        raw.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(poll_get(ENGINE, &sid).status, 400, "upgraded");
}

#[test]
fn a_second_websocket_for_an_upgraded_session_is_closed() {
    let (sid, _) = poll_open(ENGINE);
    let mut ws = probe_socket(ENGINE, &sid);
    ws.send(Message::text("2probe")).expect("send probe");
    ws.send(Message::text("5")).expect("send upgrade");
    assert_eq!(ws.read().expect("probe answer"), Message::text("3probe"));
    let mut second = probe_socket(ENGINE, &sid);
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "the second socket stayed open");
        match second.read() {
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    ws.send(Message::text("4still here")).expect("send");
    loop {
        match ws.read().expect("echo") {
            Message::Text(t) if t.as_str() == "2" => ws.send(Message::text("3")).expect("pong"),
            other => break assert_eq!(other, Message::text("4still here")),
        }
    }
}

#[test]
fn socket_io_over_polling_connects_and_echoes_with_attachments() {
    let (sid, _) = poll_open(SOCKET);
    assert_eq!(poll_post(SOCKET, &sid, "40").body, "ok");
    let deadline = Instant::now() + WAIT;
    let mut got = String::new();
    while !got.contains("[\"auth\"") {
        assert!(Instant::now() < deadline, "no auth emit: {got:?}");
        let answer = poll_get(SOCKET, &sid);
        assert_eq!(answer.status, 200);
        got.push_str(&answer.body);
        got.push('\x1e');
    }
    assert!(got.starts_with("40{\"sid\":"), "{got:?}");
    let event = "451-[\"message\",{\"_placeholder\":true,\"num\":0}]\x1ebAQID";
    assert_eq!(poll_post(SOCKET, &sid, event).body, "ok");
    poll_expect(
        SOCKET,
        &sid,
        "451-[\"message-back\",{\"_placeholder\":true,\"num\":0}]\x1ebAQID",
    );
}

#[test]
fn oversized_posts_are_refused_with_413() {
    let (sid, _) = poll_open(ENGINE);
    // The head announces one byte more than maxPayload; the server answers
    // without waiting for the body.
    let addr = server();
    let mut stream = connect_waiting(addr);
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        poll_target(ENGINE, &sid),
        MESSAGE_BYTES_MAX + 1
    );
    stream.write_all(head.as_bytes()).expect("write");
    let answer = read_to_close(stream, "oversized POST");
    assert_eq!(answer.status, 413);
    // The session itself is unharmed.
    assert_eq!(poll_post(ENGINE, &sid, "4small").body, "ok");
    poll_expect(ENGINE, &sid, "4small");
}

#[test]
fn polling_keeps_the_connection_alive_between_requests() {
    let (sid, _) = poll_open(ENGINE);
    let addr = server();
    let mut stream = connect_waiting(addr);
    let target = poll_target(ENGINE, &sid);
    let post = format!("POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n4hello");
    let get = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
    for (request, body) in [(post, "ok"), (get, "4hello")] {
        stream.write_all(request.as_bytes()).expect("write");
        let mut raw = Vec::new();
        let mut chunk = [0u8; 1024];
        let deadline = Instant::now() + WAIT;
        let text = loop {
            assert!(Instant::now() < deadline, "no answer");
            let n = stream.read(&mut chunk).expect("read");
            assert!(n > 0, "the server closed a keep-alive connection");
            raw.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&raw).to_string();
            if text.ends_with(body) {
                break text;
            }
        };
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Connection: keep-alive\r\n"), "{text}");
    }
}

#[test]
fn cors_answers_name_the_origin_and_allow_credentials() {
    let answer = http_request(
        "GET",
        &format!("{ENGINE}?EIO=4&transport=polling"),
        "Origin: http://app.example\r\n",
        b"",
    );
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("Access-Control-Allow-Origin"),
        Some("http://app.example")
    );
    assert_eq!(
        answer.header("Access-Control-Allow-Credentials"),
        Some("true")
    );
    let preflight = http_request(
        "OPTIONS",
        &format!("{ENGINE}?EIO=4&transport=polling"),
        "Origin: http://app.example\r\nAccess-Control-Request-Headers: content-type\r\n",
        b"",
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(
        preflight.header("Access-Control-Allow-Headers"),
        Some("content-type")
    );
}

#[test]
fn polling_sessions_are_capped() {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = fixture::Settings {
        polling_sessions_max: 2,
        ..fixture::settings()
    };
    let (addr, _thread) = fixture::start_with(any, settings).expect("fixture");
    let handshake = |addr: SocketAddr| {
        let mut s = connect_waiting(addr);
        let req =
            format!("GET {ENGINE}?EIO=4&transport=polling HTTP/1.1\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).expect("write");
        read_to_close(s, "handshake")
    };
    let sid_of = |answer: &HttpAnswer| {
        assert_eq!(answer.status, 200, "{}", answer.body);
        let open: Value = serde_json::from_str(&answer.body[1..]).expect("open packet");
        open["sid"].as_str().expect("sid").to_string()
    };
    // A POST uses a session; the status of the answer.
    let post = |addr: SocketAddr, sid: &str| {
        let mut s = connect_waiting(addr);
        let req = format!(
            "POST {} HTTP/1.1\r\nConnection: close\r\nContent-Length: 1\r\n\r\n6",
            poll_target(ENGINE, sid)
        );
        s.write_all(req.as_bytes()).expect("write");
        read_to_close(s, "post").status
    };
    let first = sid_of(&handshake(addr));
    let second = sid_of(&handshake(addr));
    assert_eq!(post(addr, &first), 200);
    // At the cap, the oldest session never used makes room.
    let third = sid_of(&handshake(addr));
    assert_eq!(post(addr, &second), 400, "the unused session was kept");
    assert_eq!(post(addr, &third), 200);
    // With every session in use, a handshake is refused.
    let fourth = handshake(addr);
    assert_eq!(fourth.status, 503, "{}", fourth.body);
    assert_eq!(post(addr, &first), 200);
    // WebSocket sessions are not polling sessions.
    let stream = TcpStream::connect(addr).expect("connect");
    let url = format!("ws://{addr}{ENGINE}?EIO=4&transport=websocket");
    assert!(tungstenite::client(url.as_str(), stream).is_ok());
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let (sid, _) = poll_open(ENGINE);
    let addr = server();
    let mut stream = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n4x",
        poll_target(ENGINE, &sid)
    );
    stream.write_all(req.as_bytes()).expect("write");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    while !raw.ends_with(b"ok") {
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "closed before the answer");
        raw.extend_from_slice(&chunk[..n]);
    }
    let answered = Instant::now();
    // Nothing more is sent: the server closes once the idle time is over.
    match stream.read(&mut chunk) {
        Ok(0) => {}
        other => panic!("expected the close, got {other:?}"),
    }
    let idle = answered.elapsed();
    assert!(
        idle + Duration::from_millis(50) >= PING_INTERVAL + PING_TIMEOUT,
        "{idle:?}"
    );
    assert!(idle < PING_INTERVAL + PING_TIMEOUT + SLACK, "{idle:?}");
}

#[test]
fn pipelined_requests_behind_a_held_get_are_answered_in_turn() {
    let (sid, _) = poll_open(ENGINE);
    let addr = server();
    let mut stream = connect_waiting(addr);
    let get = format!(
        "GET {} HTTP/1.1\r\nHost: x\r\n\r\n",
        poll_target(ENGINE, &sid)
    );
    // Two GETs in one write: the first is held until the ping, the second
    // waits behind it on the same connection.
    stream
        .write_all(format!("{get}{get}").as_bytes())
        .expect("write");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut answers = 0;
    let deadline = Instant::now() + WAIT;
    while answers < 2 {
        assert!(Instant::now() < deadline, "answers so far: {answers}");
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "closed");
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw).to_string();
        let now = text.matches("HTTP/1.1 200 OK").count();
        if now > answers && text.ends_with("\r\n\r\n2") {
            answers = now;
            // Each answer is a ping; the pong goes on another connection.
            assert_eq!(poll_post(ENGINE, &sid, "3").status, 200);
        }
    }
}

#[test]
fn input_held_across_connections_is_bounded() {
    // Each connection may hold most of one message; together they may not
    // hold more than the loop's input budget.
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = fixture::Settings {
        in_bytes_max: 3 * MESSAGE_BYTES_MAX,
        // No heartbeat ends a connection during the test.
        ping_interval: Duration::from_secs(60),
        ping_timeout: Duration::from_secs(60),
        ..fixture::settings()
    };
    let (addr, _thread) = fixture::start_with(any, settings).expect("fixture");
    let mut socks = Vec::new();
    // Ten connections each send all but the last byte of a largest frame.
    for _ in 0..10 {
        let mut s = connect_waiting(addr);
        let head = format!(
            "GET {ENGINE}?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        let mut raw = head.into_bytes();
        raw.extend_from_slice(&[0x81, 0x80 | 127]);
        raw.extend_from_slice(&(MESSAGE_BYTES_MAX as u64).to_be_bytes());
        raw.extend_from_slice(&[0, 0, 0, 0]);
        raw.extend(std::iter::repeat_n(b'x', MESSAGE_BYTES_MAX - 1));
        // The broker may close while the bytes are still being written.
        let _ = s.write_all(&raw);
        socks.push(s);
    }
    // At most three stay open (the first ones): the others are closed
    // (1013 after the open packet, or a reset), each within the bound.
    let mut closed = 0;
    for s in socks.iter_mut().rev() {
        let mut all = Vec::new();
        let mut chunk = [0u8; 4096];
        let ended = loop {
            match s.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    break false
                }
                Err(e) => panic!("read: {e}"),
            }
            // A close frame with 1013.
            if all.windows(4).any(|w| w == [0x88, 2, 0x03, 0xf5]) {
                break true;
            }
        };
        closed += usize::from(ended);
        if closed >= 7 {
            break;
        }
    }
    assert!(closed >= 7, "only {closed} of 10 closed");
    // A newcomer is still served.
    let stream = TcpStream::connect(addr).expect("connect");
    let url = format!("ws://{addr}{ENGINE}?EIO=4&transport=websocket");
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).expect("upgrade");
    let open = ws.read().expect("open packet");
    assert!(
        matches!(&open, Message::Text(t) if t.starts_with('0')),
        "{open:?}"
    );
}
