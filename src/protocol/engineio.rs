//! Engine.IO v4 codec: packet types, the open packet, the handshake query,
//! the HTTP error bodies, and the heartbeat as a pure state machine driven by
//! `now` (Engine.IO v4 protocol, "Packet encoding" and "Heartbeat").

use std::time::{Duration, Instant};

/// One Engine.IO packet received as a text frame (or a polling payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    Open(&'a str),
    Close,
    Ping(&'a str),
    Pong(&'a str),
    Message(&'a str),
    Upgrade,
    Noop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// An empty text packet.
    Empty,
    /// A first character that is no packet type.
    UnknownType(char),
    /// An open packet that is not JSON or lacks `sid`.
    BadOpen(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Empty => write!(f, "empty Engine.IO packet"),
            EngineError::UnknownType(c) => write!(f, "unknown Engine.IO packet type {c:?}"),
            EngineError::BadOpen(why) => write!(f, "bad open packet: {why}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Decodes a text packet: the first character is the type, the rest its data.
#[inline]
pub fn decode(text: &str) -> Result<Packet<'_>, EngineError> {
    let mut chars = text.chars();
    let t = chars.next().ok_or(EngineError::Empty)?;
    let rest = chars.as_str();
    Ok(match t {
        '0' => Packet::Open(rest),
        '1' => Packet::Close,
        '2' => Packet::Ping(rest),
        '3' => Packet::Pong(rest),
        '4' => Packet::Message(rest),
        '5' => Packet::Upgrade,
        '6' => Packet::Noop,
        other => return Err(EngineError::UnknownType(other)),
    })
}

/// What a client takes from the open packet a server sends first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub sid: String,
    pub max_payload: Option<u64>,
    /// `pingInterval + pingTimeout` in milliseconds: the longest the server
    /// may stay silent before the client may call the link dead ("Heartbeat").
    pub silence_max_ms: Option<u64>,
}

/// Reads the JSON of an open packet (the text after its `0`).
pub fn decode_open(json: &str) -> Result<Opened, EngineError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| EngineError::BadOpen(e.to_string()))?;
    let sid = value
        .get("sid")
        .and_then(|v| v.as_str())
        .ok_or_else(|| EngineError::BadOpen("no sid".to_string()))?;
    Ok(Opened {
        sid: sid.to_string(),
        max_payload: value.get("maxPayload").and_then(|v| v.as_u64()),
        silence_max_ms: value
            .get("pingInterval")
            .and_then(|v| v.as_u64())
            .zip(value.get("pingTimeout").and_then(|v| v.as_u64()))
            .map(|(interval, timeout)| interval.saturating_add(timeout)),
    })
}

/// The fields of the open packet the server sends first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenInfo<'a> {
    pub sid: &'a str,
    pub upgrades: &'a [&'a str],
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    pub max_payload: usize,
}

impl OpenInfo<'_> {
    /// `0{"sid":"…","upgrades":[…],"pingInterval":N,"pingTimeout":N,"maxPayload":N}`
    pub fn encode(&self) -> String {
        let upgrades: Vec<String> = self.upgrades.iter().map(|u| format!("\"{u}\"")).collect();
        format!(
            "0{{\"sid\":{},\"upgrades\":[{}],\"pingInterval\":{},\"pingTimeout\":{},\"maxPayload\":{}}}",
            json_string(self.sid),
            upgrades.join(","),
            self.ping_interval.as_millis(),
            self.ping_timeout.as_millis(),
            self.max_payload
        )
    }
}

/// A JSON string literal for `s`.
pub fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Polling,
    WebSocket,
}

/// What the Engine.IO query of a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub eio: u8,
    pub transport: Transport,
    pub sid: Option<String>,
}

/// Engine.IO's HTTP error codes, sent as `{"code":N,"message":"…"}` with 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    UnknownTransport = 0,
    UnknownSid = 1,
    BadHandshakeMethod = 2,
    BadRequest = 3,
    Forbidden = 4,
    UnsupportedProtocolVersion = 5,
}

impl HandshakeError {
    pub fn message(self) -> &'static str {
        match self {
            HandshakeError::UnknownTransport => "Transport unknown",
            HandshakeError::UnknownSid => "Session ID unknown",
            HandshakeError::BadHandshakeMethod => "Bad handshake method",
            HandshakeError::BadRequest => "Bad request",
            HandshakeError::Forbidden => "Forbidden",
            HandshakeError::UnsupportedProtocolVersion => "Unsupported protocol version",
        }
    }

    /// The JSON body of the 400 answer.
    pub fn body(self) -> String {
        format!(
            "{{\"code\":{},\"message\":\"{}\"}}",
            self as u8,
            self.message()
        )
    }
}

/// Reads `EIO`, `transport` and `sid` from a query string. `supported`
/// lists the Engine.IO versions this server speaks.
pub fn parse_query(query: &str, supported: &[u8]) -> Result<Handshake, HandshakeError> {
    let mut eio = None;
    let mut transport = None;
    let mut sid = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "EIO" => eio = Some(v),
            "transport" => transport = Some(v),
            "sid" => sid = Some(v.to_string()),
            _ => {}
        }
    }
    let eio = match eio.and_then(|v| v.parse::<u8>().ok()) {
        Some(v) if supported.contains(&v) => v,
        _ => return Err(HandshakeError::UnsupportedProtocolVersion),
    };
    let transport = match transport {
        Some("polling") => Transport::Polling,
        Some("websocket") => Transport::WebSocket,
        _ => return Err(HandshakeError::UnknownTransport),
    };
    Ok(Handshake {
        eio,
        transport,
        sid,
    })
}

/// What the heartbeat wants done now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Nothing is due.
    Idle,
    /// Send a ping packet `2`.
    SendPing,
    /// The peer missed its pong: close the session.
    TimedOut,
}

/// Engine.IO v4 heartbeat: the server pings every `interval`; a pong must
/// arrive within `timeout` of the ping. Engine.IO v3 turns it around (the
/// passive form): the client pings, and a session that sends no ping for
/// `interval + timeout` is closed.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    interval: Duration,
    timeout: Duration,
    next_ping: Instant,
    pong_due: Option<Instant>,
    passive: bool,
}

impl Heartbeat {
    pub fn new(now: Instant, interval: Duration, timeout: Duration) -> Heartbeat {
        Heartbeat {
            interval,
            timeout,
            next_ping: now + interval,
            pong_due: None,
            passive: false,
        }
    }

    /// The v3 form: the client must ping within `interval + timeout`.
    pub fn passive(now: Instant, interval: Duration, timeout: Duration) -> Heartbeat {
        Heartbeat {
            interval,
            timeout,
            next_ping: now + interval,
            pong_due: Some(now + interval + timeout),
            passive: true,
        }
    }

    /// The client pinged: a passive heartbeat waits a full period again.
    pub fn on_ping(&mut self, now: Instant) {
        if self.passive {
            self.pong_due = Some(now + self.interval + self.timeout);
        }
    }

    /// A pong arrived: the next ping is due one interval from now.
    pub fn on_pong(&mut self, now: Instant) {
        if self.passive {
            return;
        }
        if self.pong_due.take().is_some() {
            self.next_ping = now + self.interval;
        }
    }

    /// Advances to `now`; the caller sends a ping on `SendPing`.
    pub fn poll(&mut self, now: Instant) -> Beat {
        if let Some(due) = self.pong_due {
            return if now >= due {
                Beat::TimedOut
            } else {
                Beat::Idle
            };
        }
        if now >= self.next_ping {
            self.pong_due = Some(now + self.timeout);
            return Beat::SendPing;
        }
        Beat::Idle
    }

    /// When `poll` next has something to do.
    pub fn deadline(&self) -> Instant {
        self.pong_due.unwrap_or(self.next_ping)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_spec_packets() {
        assert_eq!(decode("4hello"), Ok(Packet::Message("hello")));
        assert_eq!(decode("2"), Ok(Packet::Ping("")));
        assert_eq!(decode("2probe"), Ok(Packet::Ping("probe")));
        assert_eq!(decode("3probe"), Ok(Packet::Pong("probe")));
        assert_eq!(decode("1"), Ok(Packet::Close));
        assert_eq!(decode("5"), Ok(Packet::Upgrade));
        assert_eq!(decode("6"), Ok(Packet::Noop));
        assert_eq!(decode("4"), Ok(Packet::Message("")));
        assert_eq!(decode("4€"), Ok(Packet::Message("€")));
        assert_eq!(decode(""), Err(EngineError::Empty));
        assert_eq!(decode("7"), Err(EngineError::UnknownType('7')));
        assert_eq!(decode("x"), Err(EngineError::UnknownType('x')));
    }

    #[test]
    fn encodes_the_open_packet_as_the_spec_shows() {
        let open = OpenInfo {
            sid: "lv_VI97HAXpY6yYWAAAC",
            upgrades: &["websocket"],
            ping_interval: Duration::from_millis(25000),
            ping_timeout: Duration::from_millis(20000),
            max_payload: 1000000,
        };
        assert_eq!(
            open.encode(),
            r#"0{"sid":"lv_VI97HAXpY6yYWAAAC","upgrades":["websocket"],"pingInterval":25000,"pingTimeout":20000,"maxPayload":1000000}"#
        );
        let ws_only = OpenInfo {
            upgrades: &[],
            ..open
        };
        assert!(ws_only.encode().contains(r#""upgrades":[],"#));
    }

    #[test]
    fn parses_handshake_queries() {
        let h = parse_query("EIO=4&transport=websocket", &[4]).unwrap();
        assert_eq!(
            h,
            Handshake {
                eio: 4,
                transport: Transport::WebSocket,
                sid: None
            }
        );
        let h = parse_query("EIO=4&transport=polling&sid=abc&t=N8hyd6w", &[4]).unwrap();
        assert_eq!(h.sid.as_deref(), Some("abc"));
        assert_eq!(h.transport, Transport::Polling);
        for bad_version in [
            "transport=websocket",
            "EIO=abc&transport=websocket",
            "EIO=3&transport=websocket",
            "EIO=&transport=websocket",
        ] {
            assert_eq!(
                parse_query(bad_version, &[4]),
                Err(HandshakeError::UnsupportedProtocolVersion),
                "{bad_version}"
            );
        }
        for bad_transport in ["EIO=4", "EIO=4&transport=abc", "EIO=4&transport="] {
            assert_eq!(
                parse_query(bad_transport, &[4]),
                Err(HandshakeError::UnknownTransport),
                "{bad_transport}"
            );
        }
        assert_eq!(
            parse_query("EIO=3&transport=polling", &[3, 4]).map(|h| h.eio),
            Ok(3)
        );
    }

    #[test]
    fn error_bodies_match_engine_io_servers() {
        assert_eq!(
            HandshakeError::UnknownTransport.body(),
            r#"{"code":0,"message":"Transport unknown"}"#
        );
        assert_eq!(
            HandshakeError::UnknownSid.body(),
            r#"{"code":1,"message":"Session ID unknown"}"#
        );
        assert_eq!(
            HandshakeError::UnsupportedProtocolVersion.body(),
            r#"{"code":5,"message":"Unsupported protocol version"}"#
        );
    }

    #[test]
    fn heartbeat_pings_then_times_out_without_pong() {
        let t0 = Instant::now();
        let (iv, to) = (Duration::from_millis(300), Duration::from_millis(200));
        let mut hb = Heartbeat::new(t0, iv, to);
        assert_eq!(hb.poll(t0), Beat::Idle);
        assert_eq!(hb.deadline(), t0 + iv);
        assert_eq!(hb.poll(t0 + iv), Beat::SendPing);
        assert_eq!(hb.deadline(), t0 + iv + to);
        assert_eq!(hb.poll(t0 + iv + to - Duration::from_millis(1)), Beat::Idle);
        assert_eq!(hb.poll(t0 + iv + to), Beat::TimedOut);
    }

    #[test]
    fn passive_heartbeat_waits_for_client_pings() {
        let t0 = Instant::now();
        let (iv, to) = (Duration::from_millis(300), Duration::from_millis(200));
        let mut hb = Heartbeat::passive(t0, iv, to);
        assert_eq!(hb.poll(t0 + iv), Beat::Idle);
        assert_eq!(hb.deadline(), t0 + iv + to);
        let t1 = t0 + Duration::from_millis(400);
        hb.on_ping(t1);
        hb.on_pong(t1);
        assert_eq!(hb.poll(t0 + iv + to), Beat::Idle);
        assert_eq!(hb.deadline(), t1 + iv + to);
        assert_eq!(hb.poll(t1 + iv + to), Beat::TimedOut);
    }

    #[test]
    fn heartbeat_pong_schedules_the_next_ping() {
        let t0 = Instant::now();
        let (iv, to) = (Duration::from_millis(300), Duration::from_millis(200));
        let mut hb = Heartbeat::new(t0, iv, to);
        assert_eq!(hb.poll(t0 + iv), Beat::SendPing);
        let t1 = t0 + iv + Duration::from_millis(50);
        hb.on_pong(t1);
        assert_eq!(hb.deadline(), t1 + iv);
        assert_eq!(hb.poll(t1 + iv), Beat::SendPing);
        // An unsolicited pong does not push the schedule.
        let mut hb2 = Heartbeat::new(t0, iv, to);
        hb2.on_pong(t0 + Duration::from_millis(10));
        assert_eq!(hb2.deadline(), t0 + iv);
    }

    /// The open packet as a client reads it: sid, maxPayload, and the
    /// silence allowed (pingInterval + pingTimeout).
    #[test]
    fn open_packet_decodes_for_a_client() {
        let text = "0{\"sid\":\"abc\",\"upgrades\":[],\"pingInterval\":25000,\
                    \"pingTimeout\":20000,\"maxPayload\":1000000}";
        let Ok(Packet::Open(json)) = decode(text) else {
            panic!("not an open packet")
        };
        let open = decode_open(json).unwrap();
        assert_eq!(open.sid, "abc");
        assert_eq!(open.max_payload, Some(1_000_000));
        assert_eq!(open.silence_max_ms, Some(45_000));
        let bare = decode_open("{\"sid\":\"x\"}").unwrap();
        assert_eq!((bare.max_payload, bare.silence_max_ms), (None, None));
        assert!(matches!(decode_open("{}"), Err(EngineError::BadOpen(_))));
        assert!(matches!(decode_open("nope"), Err(EngineError::BadOpen(_))));
    }
}
