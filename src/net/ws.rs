//! WebSocket framing (RFC 6455) over tungstenite's frame-header codec:
//! header parse and format come from tungstenite; unmasking, fragment
//! reassembly, control frames and the size bounds live here so that a
//! connection keeps no buffer while idle and a delivery is written straight
//! into the connection's outbound bytes.

use std::io::Cursor;

use tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

/// One complete message or control frame from the peer.
#[derive(Debug, PartialEq, Eq)]
pub enum WsEvent<'a> {
    Text(&'a str),
    Binary(&'a [u8]),
    Ping(&'a [u8]),
    Pong,
    Close,
}

/// What makes the connection close, with the close code to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsError {
    /// RFC 6455 §7.4.1 1002: a frame breaks the protocol.
    Protocol(&'static str),
    /// 1009: a frame or message over the size bound.
    TooBig,
    /// 1007: a text message that is not UTF-8.
    BadUtf8,
}

impl WsError {
    pub fn close_code(self) -> u16 {
        let code = match self {
            WsError::Protocol(_) => CloseCode::Protocol,
            WsError::TooBig => CloseCode::Size,
            WsError::BadUtf8 => CloseCode::Invalid,
        };
        code.into()
    }
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WsError::Protocol(what) => write!(f, "WebSocket protocol error: {what}"),
            WsError::TooBig => write!(f, "WebSocket message too big"),
            WsError::BadUtf8 => write!(f, "WebSocket text is not UTF-8"),
        }
    }
}

/// Whether the caller wants more events from the same buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Per-connection decoder state: only a fragmented message in progress.
#[derive(Debug, Default)]
pub struct Decoder {
    frag: Vec<u8>,
    frag_kind: Option<Data>,
}

impl Decoder {
    /// Bytes of a fragmented message held until its last fragment.
    pub fn held(&self) -> usize {
        self.frag.len()
    }

    /// Decodes whole frames from `buf` (unmasking in place) and hands each
    /// message to `on_event`. Returns the bytes consumed; the rest is a
    /// partial frame to keep until more arrives. `message_max` bounds a
    /// frame and a reassembled message.
    pub fn decode(
        &mut self,
        buf: &mut [u8],
        message_max: usize,
        on_event: &mut dyn FnMut(WsEvent<'_>) -> Flow,
    ) -> Result<usize, WsError> {
        let mut pos = 0;
        loop {
            let mut cur = Cursor::new(&buf[pos..]);
            let (header, len) = match FrameHeader::parse(&mut cur) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(pos),
                Err(_) => return Err(WsError::Protocol("bad frame header")),
            };
            let head_len = cur.position() as usize;
            if len > message_max as u64 {
                return Err(WsError::TooBig);
            }
            let len = len as usize;
            if buf.len() - pos - head_len < len {
                return Ok(pos);
            }
            let start = pos + head_len;
            pos = start + len;
            let payload = &mut buf[start..pos];
            let Some(mask) = header.mask else {
                return Err(WsError::Protocol("client frame not masked"));
            };
            if header.rsv1 || header.rsv2 || header.rsv3 {
                return Err(WsError::Protocol("reserved bits set"));
            }
            unmask(payload, mask);
            if self.frame(&header, payload, message_max, on_event)? == Flow::Stop {
                return Ok(pos);
            }
        }
    }

    fn frame(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
        message_max: usize,
        on_event: &mut dyn FnMut(WsEvent<'_>) -> Flow,
    ) -> Result<Flow, WsError> {
        match header.opcode {
            OpCode::Control(c) => {
                if !header.is_final || payload.len() > 125 {
                    return Err(WsError::Protocol("bad control frame"));
                }
                Ok(match c {
                    Control::Ping => on_event(WsEvent::Ping(payload)),
                    Control::Pong => on_event(WsEvent::Pong),
                    Control::Close => {
                        check_close(payload)?;
                        on_event(WsEvent::Close)
                    }
                    Control::Reserved(_) => return Err(WsError::Protocol("reserved opcode")),
                })
            }
            OpCode::Data(Data::Continue) => {
                let Some(kind) = self.frag_kind else {
                    return Err(WsError::Protocol("continuation without a message"));
                };
                if self.frag.len() + payload.len() > message_max {
                    return Err(WsError::TooBig);
                }
                self.frag.extend_from_slice(payload);
                if !header.is_final {
                    return Ok(Flow::Continue);
                }
                let whole = std::mem::take(&mut self.frag);
                self.frag_kind = None;
                deliver(kind, &whole, on_event)
            }
            OpCode::Data(kind @ (Data::Text | Data::Binary)) => {
                if self.frag_kind.is_some() {
                    return Err(WsError::Protocol("new message inside a fragmented one"));
                }
                if header.is_final {
                    return deliver(kind, payload, on_event);
                }
                self.frag_kind = Some(kind);
                self.frag.extend_from_slice(payload);
                Ok(Flow::Continue)
            }
            OpCode::Data(Data::Reserved(_)) => Err(WsError::Protocol("reserved opcode")),
        }
    }
}

/// A client's close payload (RFC 6455 §5.5.1, §7.4): empty, or a status
/// code a peer may send followed by UTF-8. One byte, or a code that is
/// reserved, unassigned or only for local use (0–999, 1004–1006, 1014,
/// 1015, 1016–2999, 5000 and above), is a protocol error: answered 1002.
fn check_close(payload: &[u8]) -> Result<(), WsError> {
    match payload {
        [] => Ok(()),
        [_] => Err(WsError::Protocol("close payload of one byte")),
        [hi, lo, reason @ ..] => {
            if !CloseCode::from(u16::from_be_bytes([*hi, *lo])).is_allowed() {
                return Err(WsError::Protocol("close code not allowed"));
            }
            std::str::from_utf8(reason).map_err(|_| WsError::BadUtf8)?;
            Ok(())
        }
    }
}

#[inline]
fn deliver(
    kind: Data,
    payload: &[u8],
    on_event: &mut dyn FnMut(WsEvent<'_>) -> Flow,
) -> Result<Flow, WsError> {
    match kind {
        Data::Text => {
            let text = std::str::from_utf8(payload).map_err(|_| WsError::BadUtf8)?;
            Ok(on_event(WsEvent::Text(text)))
        }
        _ => Ok(on_event(WsEvent::Binary(payload))),
    }
}

/// XORs `buf` with the 4-byte masking key (RFC 6455 §5.3).
pub fn unmask(buf: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = buf.chunks_exact_mut(4);
    for c in &mut chunks {
        let v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) ^ word;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i];
    }
}

/// Appends an unmasked, final server frame header for a payload of `len`
/// bytes (RFC 6455 §5.2). Written by hand because it runs once per
/// delivery; `header_bytes_match_tungstenite` holds it to tungstenite's
/// `FrameHeader::format` for every length class and opcode.
pub fn write_header(out: &mut Vec<u8>, opcode: OpCode, len: usize) {
    let first = 0x80 | u8::from(opcode);
    if len < 126 {
        out.extend_from_slice(&[first, len as u8]);
    } else if let Ok(short) = u16::try_from(len) {
        let [hi, lo] = short.to_be_bytes();
        out.extend_from_slice(&[first, 126, hi, lo]);
    } else {
        out.extend_from_slice(&[first, 127]);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

pub const TEXT: OpCode = OpCode::Data(Data::Text);
pub const BINARY: OpCode = OpCode::Data(Data::Binary);
pub const PONG: OpCode = OpCode::Control(Control::Pong);
pub const CLOSE: OpCode = OpCode::Control(Control::Close);

/// A close frame with a status code.
pub fn write_close(out: &mut Vec<u8>, code: u16) {
    write_header(out, CLOSE, 2);
    out.extend_from_slice(&code.to_be_bytes());
}

/// The `Sec-WebSocket-Accept` value for a client's key (RFC 6455 §4.2.2).
pub fn accept_key(client_key: &str) -> String {
    tungstenite::handshake::derive_accept_key(client_key.as_bytes())
}

/// Whether a client's `Sec-WebSocket-Key` is what RFC 6455 §4.1 asks for:
/// the base64 of 16 bytes, i.e. 22 base64 characters and `==`.
pub fn is_valid_client_key(key: &str) -> bool {
    let b = key.as_bytes();
    b.len() == 24
        && b[22..] == *b"=="
        && b[..22]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame, as a browser would send it.
    fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
        let n = payload.len();
        if n < 126 {
            out.push(0x80 | n as u8);
        } else if n < 65536 {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    fn collect(
        dec: &mut Decoder,
        buf: &mut [u8],
        max: usize,
    ) -> (Result<usize, WsError>, Vec<String>) {
        let mut seen = Vec::new();
        let r = dec.decode(buf, max, &mut |ev| {
            seen.push(match ev {
                WsEvent::Text(t) => format!("text:{t}"),
                WsEvent::Binary(b) => format!("bin:{b:?}"),
                WsEvent::Ping(p) => format!("ping:{p:?}"),
                WsEvent::Pong => "pong".into(),
                WsEvent::Close => "close".into(),
            });
            Flow::Continue
        });
        (r, seen)
    }

    #[test]
    fn rfc6455_masked_hello() {
        // RFC 6455 §5.7: a single-frame masked text message "Hello".
        let mut frame = vec![
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let (r, seen) = collect(&mut Decoder::default(), &mut frame, 1024);
        assert_eq!(r, Ok(11));
        assert_eq!(seen, vec!["text:Hello"]);
    }

    #[test]
    fn rfc6455_server_frames() {
        // RFC 6455 §5.7: an unmasked "Hello" and a 256-byte binary header.
        let mut out = Vec::new();
        write_header(&mut out, TEXT, 5);
        out.extend_from_slice(b"Hello");
        assert_eq!(out, vec![0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
        let mut out = Vec::new();
        write_header(&mut out, BINARY, 256);
        assert_eq!(out, vec![0x82, 0x7E, 0x01, 0x00]);
        let mut out = Vec::new();
        write_header(&mut out, BINARY, 65536);
        assert_eq!(out, vec![0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn header_bytes_match_tungstenite() {
        for opcode in [TEXT, BINARY, PONG, CLOSE] {
            for len in [
                0,
                1,
                125,
                126,
                127,
                65535,
                65536,
                1 << 20,
                // Past 4 GiB where usize allows (usize::MAX on 32-bit).
                usize::try_from(u64::from(u32::MAX) + 7).unwrap_or(usize::MAX),
            ] {
                let mut ours = Vec::new();
                write_header(&mut ours, opcode, len);
                let header = FrameHeader {
                    is_final: true,
                    rsv1: false,
                    rsv2: false,
                    rsv3: false,
                    opcode,
                    mask: None,
                };
                let mut theirs = Vec::new();
                header.format(len as u64, &mut theirs).unwrap();
                assert_eq!(ours, theirs, "{opcode:?} {len}");
            }
        }
    }

    #[test]
    fn accept_key_from_rfc() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn client_keys_must_be_16_bytes_of_base64() {
        for good in [
            "dGhlIHNhbXBsZSBub25jZQ==",
            "AAECAwQFBgcICQoLDA0ODw==",
            "+/+/+/+/+/+/+/+/+/+/+w==",
        ] {
            assert!(is_valid_client_key(good), "{good}");
        }
        for bad in [
            "",
            "not-base64!!",
            "dGhlIHNhbXBsZSBub25jZQ",       // padding left out
            "dGhlIHNhbXBsZSBub25jZQ=",      // half the padding
            "dGhlIHNhbXBsZSBub25jZXg=",     // 17 bytes
            "dGhlIHNhbXBsZSBub25j",         // 15 bytes
            "dGhlIHNhbXBsZSBub25jZQ==AAAA", // data after the padding
            "dGhlIHNhbXBsZSBub25-ZQ==",     // URL-safe alphabet
            "dGhlIHNhbXBsZSBub25jZ===",     // padding inside the data
            "dGhlIHNhbXBsZSBub25jZQ==\u{e9}",
        ] {
            assert!(!is_valid_client_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn every_cut_keeps_the_partial_frame() {
        let mut whole = client_frame(true, 1, b"42[\"pub\",{}]", [1, 2, 3, 4]);
        whole.extend(client_frame(true, 2, &[9; 300], [5, 6, 7, 8]));
        for cut in 0..whole.len() {
            let mut dec = Decoder::default();
            let mut first = whole[..cut].to_vec();
            let (r, mut seen) = collect(&mut dec, &mut first, 1024);
            let used = r.unwrap();
            let mut rest = whole[used..].to_vec();
            let (r2, seen2) = collect(&mut dec, &mut rest, 1024);
            assert_eq!(r2, Ok(rest.len()), "cut {cut}");
            seen.extend(seen2);
            assert_eq!(seen.len(), 2, "cut {cut}");
            assert_eq!(seen[0], "text:42[\"pub\",{}]");
        }
    }

    #[test]
    fn reassembles_fragments_and_passes_control_frames() {
        let mut buf = client_frame(false, 1, b"Hel", [1, 1, 1, 1]);
        buf.extend(client_frame(true, 9, b"p", [2, 2, 2, 2]));
        buf.extend(client_frame(true, 0, b"lo", [3, 3, 3, 3]));
        buf.extend(client_frame(true, 8, &[3, 232], [4, 4, 4, 4]));
        let (r, seen) = collect(&mut Decoder::default(), &mut buf, 1024);
        assert!(r.is_ok());
        assert_eq!(seen, vec!["ping:[112]", "text:Hello", "close"]);
    }

    #[test]
    fn refuses_protocol_violations() {
        let mut unmasked = vec![0x81, 0x02, b'h', b'i'];
        assert!(matches!(
            collect(&mut Decoder::default(), &mut unmasked, 1024).0,
            Err(WsError::Protocol(_))
        ));
        let mut big = client_frame(true, 2, &[0; 2000], [1, 2, 3, 4]);
        assert_eq!(
            collect(&mut Decoder::default(), &mut big, 1000).0,
            Err(WsError::TooBig)
        );
        let mut bad_utf8 = client_frame(true, 1, &[0xff, 0xfe], [1, 2, 3, 4]);
        assert_eq!(
            collect(&mut Decoder::default(), &mut bad_utf8, 1000).0,
            Err(WsError::BadUtf8)
        );
        let mut stray = client_frame(true, 0, b"x", [1, 2, 3, 4]);
        assert!(matches!(
            collect(&mut Decoder::default(), &mut stray, 1000).0,
            Err(WsError::Protocol(_))
        ));
        let mut rsv = client_frame(true, 1, b"x", [1, 2, 3, 4]);
        rsv[0] |= 0x40;
        assert!(matches!(
            collect(&mut Decoder::default(), &mut rsv, 1000).0,
            Err(WsError::Protocol(_))
        ));
        let mut frag_over = client_frame(false, 1, &[b'a'; 600], [1, 2, 3, 4]);
        frag_over.extend(client_frame(true, 0, &[b'a'; 600], [1, 2, 3, 4]));
        assert_eq!(
            collect(&mut Decoder::default(), &mut frag_over, 1000).0,
            Err(WsError::TooBig)
        );
    }

    #[test]
    fn close_payloads_follow_rfc_6455() {
        let close = |payload: &[u8]| {
            let mut buf = client_frame(true, 8, payload, [9, 8, 7, 6]);
            collect(&mut Decoder::default(), &mut buf, 1000)
                .0
                .map(|_| ())
        };
        for ok in [
            0u16, 1000, 1001, 1002, 1003, 1007, 1011, 1012, 1013, 3000, 4999,
        ] {
            let payload = if ok == 0 {
                vec![]
            } else {
                ok.to_be_bytes().to_vec()
            };
            assert_eq!(close(&payload), Ok(()), "{ok}");
        }
        for bad in [
            0u16, 999, 1004, 1005, 1006, 1014, 1015, 1016, 2999, 5000, 65535,
        ] {
            assert!(
                matches!(close(&bad.to_be_bytes()), Err(WsError::Protocol(_))),
                "{bad}"
            );
        }
        assert!(matches!(close(&[3]), Err(WsError::Protocol(_))));
        let mut bad_reason = 1000u16.to_be_bytes().to_vec();
        bad_reason.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(close(&bad_reason), Err(WsError::BadUtf8));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut s: u64 = 42;
        for _ in 0..5000 {
            let len = (s % 64) as usize;
            let mut buf: Vec<u8> = (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            let _ = collect(&mut Decoder::default(), &mut buf, 1000);
            s = s.wrapping_add(1);
        }
    }
}
