//! The client's side of the WebSocket transport, pure: the HTTP upgrade
//! exchange and masked frames (RFC 6455). Engine.IO and Socket.IO packets
//! are [`crate::protocol`]'s codecs, shared with the server. Nothing here
//! touches a socket or a clock, so every helper is unit tested on exact
//! wire strings.

use std::fmt;
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

/// Frame masks from [`crate::rand`], seeded from the kernel. Masks only
/// need to be unpredictable to intermediaries, not cryptographically strong.
#[derive(Debug)]
pub(crate) struct MaskRng(u64);

impl MaskRng {
    pub(crate) fn new() -> Self {
        MaskRng(crate::rand::random_seed())
    }

    pub(crate) fn next_mask(&mut self) -> [u8; 4] {
        let bytes = crate::rand::splitmix64(&mut self.0).to_be_bytes();
        [bytes[0], bytes[1], bytes[2], bytes[3]]
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
}
