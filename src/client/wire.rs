//! Pure codecs the client needs: the HTTP upgrade exchange, WebSocket frames
//! (RFC 6455), Engine.IO v4 packets and Socket.IO v5 packets. Nothing here
//! touches a socket or a clock, so every helper is unit tested on exact wire
//! strings.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io::Cursor;

use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

/// Largest HTTP upgrade response head the client accepts, in bytes.
pub(crate) const UPGRADE_RESPONSE_BYTES_MAX: usize = 16 * 1024;

/// A wire-level decoding failure; the connection cannot continue after one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError(pub(crate) String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn wire_err(message: impl Into<String>) -> WireError {
    WireError(message.into())
}

// ---------------------------------------------------------------------------
// Addresses and the HTTP upgrade (RFC 6455 §4.1).
// ---------------------------------------------------------------------------

/// Where to connect: `host:port` for the TCP socket and the request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host_port: String,
    pub(crate) request_path: String,
}

/// Accepts `host:port`, `ws://host:port` and `ws://host:port/path/`; the
/// Engine.IO query (`EIO=4&transport=websocket`) is always appended.
pub(crate) fn parse_target(addr: &str) -> Result<Target, WireError> {
    let rest = addr
        .strip_prefix("ws://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr);
    if addr.starts_with("wss://") || addr.starts_with("https://") {
        return Err(wire_err("TLS is not supported by this client"));
    }
    let (host_port, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    if host_port.is_empty() || !host_port.contains(':') {
        return Err(wire_err(format!("address {addr:?} lacks host:port")));
    }
    // A caller-supplied query is dropped: the client speaks exactly EIO=4
    // over WebSocket.
    let path = path.split('?').next().unwrap_or("");
    let path = if path.is_empty() || path == "/" {
        "/socket.io/"
    } else {
        path
    };
    Ok(Target {
        host_port: host_port.to_string(),
        request_path: format!("{path}?EIO=4&transport=websocket"),
    })
}

/// The HTTP/1.1 upgrade request for `target` with the given
/// `Sec-WebSocket-Key`.
pub(crate) fn upgrade_request(target: &Target, key: &str) -> String {
    format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {}\r\n\r\n",
        target.request_path, target.host_port, key
    )
}

/// Checks a buffered upgrade response. `Ok(None)` while the head is not
/// complete; `Ok(Some(head_len))` once it is a valid `101` whose
/// `Sec-WebSocket-Accept` matches `expected_accept`. Bytes after `head_len`
/// already belong to the WebSocket stream.
pub(crate) fn check_upgrade_response(
    buf: &[u8],
    expected_accept: &str,
) -> Result<Option<usize>, WireError> {
    let Some(end) = find_subslice(buf, b"\r\n\r\n") else {
        if buf.len() > UPGRADE_RESPONSE_BYTES_MAX {
            return Err(wire_err("upgrade response head too large"));
        }
        return Ok(None);
    };
    let head =
        std::str::from_utf8(&buf[..end]).map_err(|_| wire_err("upgrade response is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let status = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") || status != "101" {
        return Err(wire_err(format!(
            "server refused the upgrade: {status_line:?}"
        )));
    }
    let accept = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("sec-websocket-accept")
            .then(|| value.trim())
    });
    match accept {
        Some(value) if value == expected_accept => Ok(Some(end + 4)),
        Some(value) => Err(wire_err(format!("bad Sec-WebSocket-Accept {value:?}"))),
        None => Err(wire_err("upgrade response lacks Sec-WebSocket-Accept")),
    }
}

fn find_subslice(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

// ---------------------------------------------------------------------------
// WebSocket frames (RFC 6455 §5).
// ---------------------------------------------------------------------------

/// A complete WebSocket message (fragments already joined) or control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WsMessage {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong,
    Close,
}

/// Incremental frame decoder whose state survives partial reads: feed bytes
/// with [`FrameDecoder::push`], take messages with [`FrameDecoder::next`].
#[derive(Debug)]
pub(crate) struct FrameDecoder {
    buf: Vec<u8>,
    /// First unconsumed byte of `buf`; the buffer is compacted lazily.
    start: usize,
    /// A fragmented data message being joined: its opcode and bytes so far.
    fragments: Option<(Data, Vec<u8>)>,
    message_bytes_max: usize,
}

impl FrameDecoder {
    pub(crate) fn new(message_bytes_max: usize) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            fragments: None,
            message_bytes_max,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `Ok(None)` when more bytes are needed.
    pub(crate) fn next(&mut self) -> Result<Option<WsMessage>, WireError> {
        loop {
            let Some((header, payload)) = self.next_frame()? else {
                return Ok(None);
            };
            if let Some(message) = self.assemble(header, payload)? {
                return Ok(Some(message));
            }
        }
    }

    fn next_frame(&mut self) -> Result<Option<(FrameHeader, Vec<u8>)>, WireError> {
        let unread = self.buf.get(self.start..).unwrap_or(&[]);
        let mut cursor = Cursor::new(unread);
        let parsed = FrameHeader::parse(&mut cursor)
            .map_err(|e| wire_err(format!("bad WebSocket frame header: {e}")))?;
        let Some((header, length)) = parsed else {
            return Ok(None);
        };
        let length = usize::try_from(length)
            .ok()
            .filter(|&n| n <= self.message_bytes_max)
            .ok_or_else(|| wire_err("WebSocket frame exceeds the size limit"))?;
        let header_len = usize::try_from(cursor.position())
            .map_err(|_| wire_err("WebSocket header offset overflow"))?;
        let Some(body) = unread.get(header_len..header_len + length) else {
            return Ok(None);
        };
        let mut payload = body.to_vec();
        if let Some(mask) = header.mask {
            apply_mask(&mut payload, mask);
        }
        self.start += header_len + length;
        Ok(Some((header, payload)))
    }

    fn assemble(
        &mut self,
        header: FrameHeader,
        payload: Vec<u8>,
    ) -> Result<Option<WsMessage>, WireError> {
        match header.opcode {
            OpCode::Control(Control::Ping) => Ok(Some(WsMessage::Ping(payload))),
            OpCode::Control(Control::Pong) => Ok(Some(WsMessage::Pong)),
            OpCode::Control(Control::Close) => Ok(Some(WsMessage::Close)),
            OpCode::Control(Control::Reserved(op)) => {
                Err(wire_err(format!("reserved control opcode {op}")))
            }
            OpCode::Data(Data::Continue) => {
                let Some((kind, mut joined)) = self.fragments.take() else {
                    return Err(wire_err("continuation frame without a start"));
                };
                if joined.len() + payload.len() > self.message_bytes_max {
                    return Err(wire_err("WebSocket message exceeds the size limit"));
                }
                joined.extend_from_slice(&payload);
                if header.is_final {
                    finish_message(kind, joined).map(Some)
                } else {
                    self.fragments = Some((kind, joined));
                    Ok(None)
                }
            }
            OpCode::Data(kind) => {
                if self.fragments.is_some() {
                    return Err(wire_err("new data frame inside a fragmented message"));
                }
                if header.is_final {
                    finish_message(kind, payload).map(Some)
                } else {
                    self.fragments = Some((kind, payload));
                    Ok(None)
                }
            }
        }
    }
}

fn finish_message(kind: Data, payload: Vec<u8>) -> Result<WsMessage, WireError> {
    match kind {
        Data::Text => String::from_utf8(payload)
            .map(WsMessage::Text)
            .map_err(|_| wire_err("text frame is not UTF-8")),
        Data::Binary => Ok(WsMessage::Binary(payload)),
        Data::Continue | Data::Reserved(_) => Err(wire_err("unexpected data opcode")),
    }
}

fn apply_mask(bytes: &mut [u8], mask: [u8; 4]) {
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
}

/// Appends one final, masked frame to `out` (client frames must be masked,
/// RFC 6455 §5.3).
pub(crate) fn encode_frame(out: &mut Vec<u8>, opcode: OpCode, payload: &[u8], mask: [u8; 4]) {
    let header = FrameHeader {
        opcode,
        mask: Some(mask),
        ..FrameHeader::default()
    };
    // Formatting into a Vec cannot fail: Vec's Write never errors.
    let _ = header.format(payload.len() as u64, out);
    let at = out.len();
    out.extend_from_slice(payload);
    if let Some(tail) = out.get_mut(at..) {
        apply_mask(tail, mask);
    }
}

pub(crate) fn text_opcode() -> OpCode {
    OpCode::Data(Data::Text)
}

pub(crate) fn binary_opcode() -> OpCode {
    OpCode::Data(Data::Binary)
}

pub(crate) fn close_opcode() -> OpCode {
    OpCode::Control(Control::Close)
}

pub(crate) fn pong_opcode() -> OpCode {
    OpCode::Control(Control::Pong)
}

/// A small xorshift64* generator for frame masks, seeded from the process's
/// random hash keys. Masks only need to be unpredictable to intermediaries,
/// not cryptographically strong.
#[derive(Debug)]
pub(crate) struct MaskRng(u64);

impl MaskRng {
    pub(crate) fn new() -> Self {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(0x9e37_79b9_7f4a_7c15);
        MaskRng(hasher.finish() | 1)
    }

    pub(crate) fn next_mask(&mut self) -> [u8; 4] {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        let bytes = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_be_bytes();
        [bytes[0], bytes[1], bytes[2], bytes[3]]
    }
}

// ---------------------------------------------------------------------------
// Engine.IO v4 packets.
// ---------------------------------------------------------------------------

/// An Engine.IO packet carried in a text frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EioPacket<'a> {
    Open(&'a str),
    Close,
    Ping,
    Pong,
    Message(&'a str),
    Upgrade,
    Noop,
}

pub(crate) fn parse_eio(text: &str) -> Result<EioPacket<'_>, WireError> {
    let mut chars = text.chars();
    let kind = chars
        .next()
        .ok_or_else(|| wire_err("empty Engine.IO packet"))?;
    let rest = chars.as_str();
    match kind {
        '0' => Ok(EioPacket::Open(rest)),
        '1' => Ok(EioPacket::Close),
        '2' => Ok(EioPacket::Ping),
        '3' => Ok(EioPacket::Pong),
        '4' => Ok(EioPacket::Message(rest)),
        '5' => Ok(EioPacket::Upgrade),
        '6' => Ok(EioPacket::Noop),
        other => Err(wire_err(format!("unknown Engine.IO packet type {other:?}"))),
    }
}

/// The fields of the open packet the client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenInfo {
    pub(crate) sid: String,
    pub(crate) max_payload: Option<u64>,
    /// `pingInterval + pingTimeout` in milliseconds: the longest the server
    /// may stay silent before the client may call the link dead (Engine.IO
    /// v4 "heartbeat").
    pub(crate) silence_max_ms: Option<u64>,
}

pub(crate) fn parse_open(json: &str) -> Result<OpenInfo, WireError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| wire_err(format!("bad open packet: {e}")))?;
    let sid = value
        .get("sid")
        .and_then(|v| v.as_str())
        .ok_or_else(|| wire_err("open packet lacks sid"))?;
    Ok(OpenInfo {
        sid: sid.to_string(),
        max_payload: value.get("maxPayload").and_then(|v| v.as_u64()),
        silence_max_ms: value
            .get("pingInterval")
            .and_then(|v| v.as_u64())
            .zip(value.get("pingTimeout").and_then(|v| v.as_u64()))
            .map(|(interval, timeout)| interval.saturating_add(timeout)),
    })
}

// ---------------------------------------------------------------------------
// Socket.IO v5 packets.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SioKind {
    Connect,
    Disconnect,
    Event,
    Ack,
    ConnectError,
    BinaryEvent,
    BinaryAck,
}

impl SioKind {
    fn from_char(c: char) -> Option<SioKind> {
        Some(match c {
            '0' => SioKind::Connect,
            '1' => SioKind::Disconnect,
            '2' => SioKind::Event,
            '3' => SioKind::Ack,
            '4' => SioKind::ConnectError,
            '5' => SioKind::BinaryEvent,
            '6' => SioKind::BinaryAck,
            _ => return None,
        })
    }

    fn as_char(self) -> char {
        match self {
            SioKind::Connect => '0',
            SioKind::Disconnect => '1',
            SioKind::Event => '2',
            SioKind::Ack => '3',
            SioKind::ConnectError => '4',
            SioKind::BinaryEvent => '5',
            SioKind::BinaryAck => '6',
        }
    }

    fn is_binary(self) -> bool {
        matches!(self, SioKind::BinaryEvent | SioKind::BinaryAck)
    }
}

/// A Socket.IO packet borrowed from the Engine.IO message text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SioPacket<'a> {
    pub(crate) kind: SioKind,
    pub(crate) attachments: usize,
    pub(crate) namespace: &'a str,
    pub(crate) ack_id: Option<u64>,
    /// The JSON text after the header, possibly empty.
    pub(crate) payload: &'a str,
}

/// Upper bound on attachments of one packet, so a hostile count cannot make
/// the client reserve unbounded memory.
pub(crate) const ATTACHMENTS_MAX: usize = 1024;

/// Parses `<type>[<n>-][/<nsp>,][<id>][<json>]` (Socket.IO v5 "encoding").
pub(crate) fn parse_sio(text: &str) -> Result<SioPacket<'_>, WireError> {
    let mut chars = text.chars();
    let kind = chars
        .next()
        .and_then(SioKind::from_char)
        .ok_or_else(|| wire_err(format!("bad Socket.IO packet type in {text:?}")))?;
    let mut rest = chars.as_str();
    let mut attachments = 0;
    if kind.is_binary() {
        let (count, after) = rest
            .split_once('-')
            .ok_or_else(|| wire_err("binary packet lacks its attachment count"))?;
        attachments = count
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= ATTACHMENTS_MAX)
            .ok_or_else(|| wire_err(format!("bad attachment count {count:?}")))?;
        rest = after;
    }
    let mut namespace = "/";
    if rest.starts_with('/') {
        match rest.split_once(',') {
            Some((nsp, after)) => {
                namespace = nsp;
                rest = after;
            }
            None => {
                namespace = rest;
                rest = "";
            }
        }
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let mut ack_id = None;
    if digits > 0 {
        let (id, after) = rest.split_at(digits);
        ack_id = Some(
            id.parse::<u64>()
                .map_err(|_| wire_err(format!("bad ack id {id:?}")))?,
        );
        rest = after;
    }
    Ok(SioPacket {
        kind,
        attachments,
        namespace,
        ack_id,
        payload: rest,
    })
}

/// Encodes a Socket.IO packet inside an Engine.IO message (leading `4`).
pub(crate) fn encode_sio(
    kind: SioKind,
    attachments: usize,
    namespace: &str,
    ack_id: Option<u64>,
    payload: &str,
) -> String {
    let mut out = String::with_capacity(payload.len() + namespace.len() + 16);
    out.push('4');
    out.push(kind.as_char());
    if kind.is_binary() {
        out.push_str(&attachments.to_string());
        out.push('-');
    }
    if namespace != "/" {
        out.push_str(namespace);
        out.push(',');
    }
    if let Some(id) = ack_id {
        out.push_str(&id.to_string());
    }
    out.push_str(payload);
    out
}

/// `{"_placeholder":true,"num":n}`: where attachment `n` sits in a payload.
pub(crate) fn placeholder(num: usize) -> serde_json::Value {
    serde_json::json!({ "_placeholder": true, "num": num })
}

/// The attachment index if `value` is a placeholder object.
pub(crate) fn placeholder_num(value: &serde_json::Value) -> Option<usize> {
    let object = value.as_object()?;
    if object.get("_placeholder")?.as_bool()? {
        usize::try_from(object.get("num")?.as_u64()?).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_forms() {
        let plain = parse_target("127.0.0.1:8080").unwrap();
        assert_eq!(plain.host_port, "127.0.0.1:8080");
        assert_eq!(plain.request_path, "/socket.io/?EIO=4&transport=websocket");
        let ws = parse_target("ws://localhost:9/").unwrap();
        assert_eq!(ws.host_port, "localhost:9");
        assert_eq!(ws.request_path, "/socket.io/?EIO=4&transport=websocket");
        let custom = parse_target("ws://h:1/io/?EIO=3").unwrap();
        assert_eq!(custom.request_path, "/io/?EIO=4&transport=websocket");
        assert!(parse_target("localhost").is_err());
        assert!(parse_target("wss://h:1").is_err());
    }

    #[test]
    fn upgrade_response_checked() {
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let ok = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\
             sec-websocket-accept: {accept}\r\n\r\n"
        );
        let mut bytes = ok.into_bytes();
        bytes.extend_from_slice(b"\x81\x01x");
        let bytes = bytes.as_slice();
        assert_eq!(check_upgrade_response(&bytes[..20], &accept), Ok(None));
        let head = check_upgrade_response(bytes, &accept).unwrap().unwrap();
        assert_eq!(&bytes[head..], b"\x81\x01x");
        let refused = b"HTTP/1.1 400 Bad Request\r\n\r\n";
        assert!(check_upgrade_response(refused, &accept).is_err());
        let wrong = b"HTTP/1.1 101 OK\r\nSec-WebSocket-Accept: nope\r\n\r\n";
        assert!(check_upgrade_response(wrong, &accept).is_err());
    }

    fn server_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![opcode | if fin { 0x80 } else { 0 }];
        if payload.len() < 126 {
            out.push(payload.len() as u8);
        } else {
            out.push(126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decoder_survives_every_split() {
        let mut stream = server_frame(0x1, true, b"0{\"sid\":\"a\"}");
        stream.extend(server_frame(0x2, true, &[0u8; 300]));
        stream.extend(server_frame(0x1, false, b"42[\"m"));
        stream.extend(server_frame(0x9, true, b"hi"));
        stream.extend(server_frame(0x0, true, b"sg\"]"));
        stream.extend(server_frame(0x8, true, b""));
        let expected = vec![
            WsMessage::Text("0{\"sid\":\"a\"}".into()),
            WsMessage::Binary(vec![0u8; 300]),
            WsMessage::Ping(b"hi".to_vec()),
            WsMessage::Text("42[\"msg\"]".into()),
            WsMessage::Close,
        ];
        for cut in 0..=stream.len() {
            let mut decoder = FrameDecoder::new(1 << 20);
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                decoder.push(part);
                while let Some(message) = decoder.next().unwrap() {
                    got.push(message);
                }
            }
            assert_eq!(got, expected, "cut at {cut}");
        }
    }

    #[test]
    fn decoder_enforces_size_limit() {
        let mut decoder = FrameDecoder::new(10);
        decoder.push(&server_frame(0x1, true, b"this is more than ten"));
        assert!(decoder.next().is_err());
    }

    #[test]
    fn encoded_frames_are_masked_and_decodable() {
        let mut out = Vec::new();
        encode_frame(&mut out, text_opcode(), b"42[\"x\"]", [1, 2, 3, 4]);
        assert_eq!(out[0], 0x81);
        assert_eq!(out[1], 0x80 | 7);
        assert_eq!(&out[2..6], &[1, 2, 3, 4]);
        assert_ne!(&out[6..], b"42[\"x\"]");
        let mut decoder = FrameDecoder::new(1024);
        decoder.push(&out);
        assert_eq!(
            decoder.next().unwrap(),
            Some(WsMessage::Text("42[\"x\"]".into()))
        );
        let mut big = Vec::new();
        encode_frame(&mut big, binary_opcode(), &[7u8; 70_000], [9, 9, 9, 9]);
        assert_eq!(big[1], 0x80 | 127);
    }

    #[test]
    fn masks_vary() {
        let mut rng = MaskRng::new();
        let a = rng.next_mask();
        let b = rng.next_mask();
        assert_ne!(a, b);
    }

    #[test]
    fn engine_io_packets() {
        assert_eq!(parse_eio("2").unwrap(), EioPacket::Ping);
        assert_eq!(parse_eio("1").unwrap(), EioPacket::Close);
        assert_eq!(parse_eio("40").unwrap(), EioPacket::Message("0"));
        assert!(parse_eio("").is_err());
        assert!(parse_eio("9").is_err());
        let open = parse_eio(
            "0{\"sid\":\"abc\",\"upgrades\":[],\"pingInterval\":25000,\
             \"pingTimeout\":20000,\"maxPayload\":1000000}",
        )
        .unwrap();
        let EioPacket::Open(json) = open else {
            panic!("not an open packet")
        };
        let info = parse_open(json).unwrap();
        assert_eq!(info.sid, "abc");
        assert_eq!(info.max_payload, Some(1_000_000));
        assert_eq!(info.silence_max_ms, Some(45_000));
        let bare = parse_open("{\"sid\":\"x\"}").unwrap();
        assert_eq!((bare.max_payload, bare.silence_max_ms), (None, None));
    }

    #[test]
    fn socket_io_packets_parse() {
        let p = parse_sio("0{\"sid\":\"x\"}").unwrap();
        assert_eq!(
            (p.kind, p.namespace, p.ack_id, p.payload),
            (SioKind::Connect, "/", None, "{\"sid\":\"x\"}")
        );
        let p = parse_sio("3/control,12[{\"ok\":true}]").unwrap();
        assert_eq!(
            (p.kind, p.namespace, p.ack_id, p.payload),
            (SioKind::Ack, "/control", Some(12), "[{\"ok\":true}]")
        );
        let p = parse_sio("52-/control,7[\"msg\"]").unwrap();
        assert_eq!(
            (p.kind, p.attachments, p.namespace, p.ack_id),
            (SioKind::BinaryEvent, 2, "/control", Some(7))
        );
        let p = parse_sio("1/control").unwrap();
        assert_eq!(
            (p.kind, p.namespace, p.payload),
            (SioKind::Disconnect, "/control", "")
        );
        let p = parse_sio("4{\"message\":\"unauthorized\"}").unwrap();
        assert_eq!(p.kind, SioKind::ConnectError);
        assert!(parse_sio("7").is_err());
        assert!(parse_sio("5x-[]").is_err());
        assert!(parse_sio("5[]").is_err());
        assert!(parse_sio("399999999999999999999999[]").is_err());
    }

    #[test]
    fn socket_io_packets_encode() {
        assert_eq!(encode_sio(SioKind::Connect, 0, "/", None, ""), "40");
        assert_eq!(
            encode_sio(SioKind::Connect, 0, "/control", None, "{\"token\":\"t\"}"),
            "40/control,{\"token\":\"t\"}"
        );
        assert_eq!(
            encode_sio(SioKind::Event, 0, "/", Some(5), "[\"ping\",{}]"),
            "425[\"ping\",{}]"
        );
        assert_eq!(
            encode_sio(SioKind::BinaryEvent, 1, "/", Some(7), "[\"pub\"]"),
            "451-7[\"pub\"]"
        );
        assert_eq!(
            encode_sio(SioKind::BinaryEvent, 1, "/control", None, "[]"),
            "451-/control,[]"
        );
    }

    #[test]
    fn placeholders() {
        assert_eq!(placeholder_num(&placeholder(3)), Some(3));
        assert_eq!(placeholder_num(&serde_json::json!({"num": 1})), None);
        assert_eq!(placeholder_num(&serde_json::json!("x")), None);
    }
}

// The seeded mutation engine of the integration fuzz targets, shared so
// that these crate-private decoders are fuzzed the same way.
#[cfg(test)]
#[path = "../../tests/fuzz_support/mod.rs"]
mod fuzz_support;

/// Seeded fuzzing of the client's decoders (no panic, bounded output,
/// round trips); see `tests/fuzz.rs` for the knobs.
#[cfg(test)]
mod fuzz {
    use super::fuzz_support::{assert_clean, fnv1a, run};
    use super::*;

    fn server_frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8]) {
        out.push((if fin { 0x80 } else { 0 }) | opcode);
        let n = payload.len();
        if n < 126 {
            out.push(n as u8);
        } else {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        out.extend_from_slice(payload);
    }

    /// Every message the decoder yields for `chunks`, or the error.
    fn decode_all(chunks: &[&[u8]], max: usize) -> Result<Vec<WsMessage>, String> {
        let mut d = FrameDecoder::new(max);
        let mut got = Vec::new();
        for c in chunks {
            d.push(c);
            while let Some(m) = d.next().map_err(|e| e.0)? {
                got.push(m);
            }
        }
        Ok(got)
    }

    #[test]
    fn client_frames() {
        let mut a = Vec::new();
        server_frame(&mut a, true, 1, br#"0{"sid":"x","pingInterval":25000}"#);
        server_frame(&mut a, true, 9, b"p");
        server_frame(&mut a, false, 2, &[1, 2, 3]);
        server_frame(&mut a, true, 0, &[4; 200]);
        server_frame(&mut a, true, 8, &1000u16.to_be_bytes());
        let mut b = Vec::new();
        encode_frame(&mut b, text_opcode(), b"42[\"msg\",{}]", [9, 8, 7, 6]);
        const MAX: usize = 1024;
        let out = run("client_frames", &[a, b], 4096, 256, &mut |input| {
            let whole = decode_all(&[input], MAX);
            let cut = fnv1a(input) as usize % (input.len() + 1);
            let split = decode_all(&[&input[..cut], &input[cut..]], MAX);
            if let Ok(msgs) = &whole {
                for m in msgs {
                    let n = match m {
                        WsMessage::Text(t) => t.len(),
                        WsMessage::Binary(b) | WsMessage::Ping(b) => b.len(),
                        WsMessage::Pong | WsMessage::Close => 0,
                    };
                    if n > MAX {
                        return Err(format!("a {n}-byte message passed the {MAX} bound"));
                    }
                }
            }
            if whole != split {
                return Err(format!("cut at {cut}: {whole:?} vs {split:?}"));
            }
            Ok(())
        });
        assert_clean("client_frames", &out);
    }

    #[test]
    fn client_upgrade_response() {
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        let ok = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        );
        let mut ok = ok.into_bytes();
        ok.extend_from_slice(&[0x81, 0x02, b'4', b'0']);
        let refused = "HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}".to_string();
        let corpus = vec![ok, refused.into_bytes()];
        let out = run(
            "client_upgrade_response",
            &corpus,
            20_000,
            256,
            &mut |input| match check_upgrade_response(input, &accept) {
                Ok(Some(n)) if n > input.len() => {
                    Err(format!("head of {n} bytes in {}", input.len()))
                }
                _ => Ok(()),
            },
        );
        assert_clean("client_upgrade_response", &out);
    }

    #[test]
    fn client_packets() {
        let corpus: Vec<Vec<u8>> = [
            r#"0{"sid":"abc","upgrades":[],"pingInterval":25000,"pingTimeout":20000,"maxPayload":1000000}"#,
            "2",
            "40{\"sid\":\"s\"}",
            "42[\"msg\",{\"subject\":\"a\",\"data\":1}]",
            "4312[{\"ok\":true}]",
            "451-[\"msg\",{\"data\":{\"_placeholder\":true,\"num\":0}}]",
            "462-/control,7[{\"_placeholder\":true,\"num\":1}]",
            "44/control,{\"message\":\"unauthorized\"}",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        let out = run("client_packets", &corpus, 8192, 256, &mut |input| {
            let text = String::from_utf8_lossy(input);
            let packet = match parse_eio(&text) {
                Ok(EioPacket::Open(json)) => {
                    let _ = parse_open(json);
                    return Ok(());
                }
                Ok(EioPacket::Message(m)) => m,
                _ => return Ok(()),
            };
            let Ok(p) = parse_sio(packet) else {
                return Ok(());
            };
            if p.attachments > ATTACHMENTS_MAX {
                return Err(format!("{} attachments", p.attachments));
            }
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(p.payload) {
                let _ = placeholder_num(&v);
            }
            // Re-encoded, the packet reads back the same (a payload is JSON,
            // so it never starts with the `/` of a namespace).
            if p.payload.starts_with('/') {
                return Ok(());
            }
            let again = encode_sio(p.kind, p.attachments, p.namespace, p.ack_id, p.payload);
            let back = again.strip_prefix('4').map(parse_sio);
            match back {
                Some(Ok(b)) if b == p => Ok(()),
                other => Err(format!("{p:?} came back as {other:?}")),
            }
        });
        assert_clean("client_packets", &out);
    }
}
