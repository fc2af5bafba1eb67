//! Engine.IO HTTP long-polling, the pure parts: a polling session's state
//! (its held GET, an upgrade in progress), the payload codec (v4: packets
//! joined by the record separator `\x1e`, binary as `b` + base64; v3:
//! `<length>:<packet>` with lengths in UTF-16 units, binary as `b4` +
//! base64), and base64 itself (RFC 4648, with padding).
//!
//! The queue of a polling session is its connection's outbound buffer,
//! already in payload form: a held GET takes it whole as its body, and an
//! upgrade to WebSocket splits it back into packets.

use super::conn::ConnId;

/// The record separator between packets of a v4 payload.
pub const SEPARATOR: u8 = 0x1e;

/// A polling session's transport state.
#[derive(Debug, Default)]
pub struct Polling {
    /// Engine.IO version of the session (3 or 4).
    pub eio: u8,
    /// The GET waiting for packets: its connection and serial.
    pub get: Option<(ConnId, u64)>,
    /// The WebSocket probe that was answered (slot and serial): GETs get a
    /// noop at once until the upgrade completes or that probe goes away.
    pub upgrading: Option<(ConnId, u64)>,
    /// A request (GET, POST or probe) came after the handshake; until then
    /// the session may be evicted to make room for a new one.
    pub used: bool,
}

/// One packet of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<'a> {
    /// A text packet: type character and data (`4hello`, `3`, …).
    Text(&'a str),
    /// A binary message packet's bytes.
    Binary(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// Not UTF-8, a bad length prefix, or bad base64.
    Malformed,
}

/// Appends a text packet (`prefix` + `parts`, e.g. `4` + message) to a
/// queued payload.
pub fn push_text(out: &mut Vec<u8>, eio: u8, prefix: &[u8], parts: &[&[u8]]) {
    if eio == 3 {
        let mut units = utf16_len(prefix);
        for p in parts {
            units += utf16_len(p);
        }
        push_decimal(out, units);
        out.push(b':');
    } else if !out.is_empty() {
        out.push(SEPARATOR);
    }
    out.extend_from_slice(prefix);
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// Appends a binary message packet (base64) to a queued payload.
pub fn push_binary(out: &mut Vec<u8>, eio: u8, bytes: &[u8]) {
    let encoded = base64_len(bytes.len());
    if eio == 3 {
        push_decimal(out, 2 + encoded);
        out.extend_from_slice(b":b4");
    } else {
        if !out.is_empty() {
            out.push(SEPARATOR);
        }
        out.push(b'b');
    }
    base64_encode(bytes, out);
}

/// Splits a payload into its packets.
pub fn decode(body: &[u8], eio: u8) -> Result<Vec<Item<'_>>, PayloadError> {
    packets(body, eio)?.collect()
}

/// The packets of a payload one by one, so a payload of many tiny packets
/// is never held as a list (each item would take several times its
/// bytes); an error ends the iteration.
pub fn packets(body: &[u8], eio: u8) -> Result<Packets<'_>, PayloadError> {
    let text = std::str::from_utf8(body).map_err(|_| PayloadError::Malformed)?;
    Ok(Packets {
        rest: Some(text),
        eio,
    })
}

/// Iterator over a payload's packets (see [`packets`]).
pub struct Packets<'a> {
    /// What is left to split; `None` once done (or failed).
    rest: Option<&'a str>,
    eio: u8,
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<Item<'a>, PayloadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest.take()?;
        if self.eio == 3 {
            if rest.is_empty() {
                return None;
            }
            let result = (|| {
                let (len, after) = rest.split_once(':').ok_or(PayloadError::Malformed)?;
                let units: usize = len.parse().map_err(|_| PayloadError::Malformed)?;
                if units == 0 {
                    return Err(PayloadError::Malformed);
                }
                let end = utf16_offset(after, units).ok_or(PayloadError::Malformed)?;
                Ok((item(&after[..end], b"b4")?, &after[end..]))
            })();
            return Some(result.map(|(packet, after)| {
                self.rest = Some(after);
                packet
            }));
        }
        let (packet, after) = match rest.split_once(SEPARATOR as char) {
            Some((packet, after)) => (packet, Some(after)),
            None => (rest, None),
        };
        let packet = item(packet, b"b");
        if packet.is_ok() {
            self.rest = after;
        }
        Some(packet)
    }
}

fn item<'a>(packet: &'a str, binary_mark: &[u8]) -> Result<Item<'a>, PayloadError> {
    match packet.as_bytes().strip_prefix(binary_mark) {
        Some(b64) => base64_decode(b64)
            .map(Item::Binary)
            .ok_or(PayloadError::Malformed),
        None => Ok(Item::Text(packet)),
    }
}

/// The length of `bytes` (UTF-8) in UTF-16 code units, as JavaScript
/// counts a string; invalid UTF-8 counts byte by byte.
fn utf16_len(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.chars().map(char::len_utf16).sum(),
        Err(_) => bytes.len(),
    }
}

/// The byte offset in `s` after `units` UTF-16 code units, if `s` has them.
fn utf16_offset(s: &str, units: usize) -> Option<usize> {
    let mut seen = 0;
    for (i, c) in s.char_indices() {
        if seen == units {
            return Some(i);
        }
        seen += c.len_utf16();
    }
    (seen == units).then_some(s.len())
}

fn push_decimal(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(n.to_string().as_bytes());
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Characters of the padded base64 form of `n` bytes.
pub fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Appends the padded base64 form of `bytes`.
pub fn base64_encode(bytes: &[u8], out: &mut Vec<u8>) {
    out.reserve(base64_len(bytes.len()));
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let v = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
        out.extend_from_slice(&[
            B64[(v >> 18) as usize & 63],
            B64[(v >> 12) as usize & 63],
            B64[(v >> 6) as usize & 63],
            B64[v as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let v = u32::from(a) << 16;
            out.extend_from_slice(&[B64[(v >> 18) as usize], B64[(v >> 12) as usize & 63]]);
            out.extend_from_slice(b"==");
        }
        [a, b] => {
            let v = (u32::from(a) << 16) | (u32::from(b) << 8);
            out.extend_from_slice(&[
                B64[(v >> 18) as usize],
                B64[(v >> 12) as usize & 63],
                B64[(v >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

fn b64_value(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    } as u32)
}

/// Decodes padded base64 (padding may be left out); `None` if malformed.
pub fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let body = match text {
        [rest @ .., b'=', b'='] => rest,
        [rest @ .., b'='] => rest,
        _ => text,
    };
    if body.len() % 4 == 1 || (text.len() != body.len() && !text.len().is_multiple_of(4)) {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    let mut chunks = body.chunks_exact(4);
    for c in &mut chunks {
        let mut v = 0u32;
        for &b in c {
            v = (v << 6) | b64_value(b)?;
        }
        out.extend_from_slice(&[(v >> 16) as u8, (v >> 8) as u8, v as u8]);
    }
    let rem = chunks.remainder();
    let mut v = 0u32;
    for &b in rem {
        v = (v << 6) | b64_value(b)?;
    }
    match rem.len() {
        0 => {}
        2 => {
            if v & 0xf != 0 {
                return None;
            }
            out.push((v >> 4) as u8);
        }
        3 => {
            if v & 0x3 != 0 {
                return None;
            }
            out.extend_from_slice(&[(v >> 10) as u8, (v >> 2) as u8]);
        }
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(bytes: &[u8]) -> String {
        let mut out = Vec::new();
        base64_encode(bytes, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, coded) in vectors {
            assert_eq!(enc(plain.as_bytes()), coded);
            assert_eq!(base64_len(plain.len()), coded.len());
            assert_eq!(base64_decode(coded.as_bytes()).unwrap(), plain.as_bytes());
        }
        assert_eq!(enc(&[1, 2, 3, 4]), "AQIDBA==");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(base64_decode(enc(&all).as_bytes()).unwrap(), all);
        assert_eq!(enc(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn base64_refuses_malformed_text() {
        for bad in [
            "Zg=", "Z", "Zm9v!", "Zh==", "Zm9=", "=", "Zg==Zg==", "Zm9vY",
        ] {
            assert_eq!(base64_decode(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(base64_decode(b"Zg").unwrap(), b"f");
    }

    #[test]
    fn v4_payloads_join_with_the_separator() {
        let mut out = Vec::new();
        push_text(&mut out, 4, b"4", &[b"hel", b"lo"]);
        push_binary(&mut out, 4, &[1, 2, 3, 4]);
        push_text(&mut out, 4, b"2", &[]);
        assert_eq!(out, b"4hello\x1ebAQIDBA==\x1e2");
        assert_eq!(
            decode(&out, 4).unwrap(),
            vec![
                Item::Text("4hello"),
                Item::Binary(vec![1, 2, 3, 4]),
                Item::Text("2")
            ]
        );
        assert_eq!(decode(b"4test1\x1e4test2", 4).unwrap().len(), 2);
        assert_eq!(decode(b"bAQ!", 4), Err(PayloadError::Malformed));
        assert_eq!(decode(b"\xff", 4), Err(PayloadError::Malformed));
    }

    #[test]
    fn v3_payloads_count_utf16_units() {
        let mut out = Vec::new();
        push_text(&mut out, 3, b"4", &["é€😀".as_bytes()]);
        push_text(&mut out, 3, b"2", &[]);
        push_binary(&mut out, 3, &[1, 2, 3, 4]);
        // "4é€😀" is 1 + 1 + 1 + 2 UTF-16 units.
        assert_eq!(out, "5:4é€😀1:210:b4AQIDBA==".as_bytes());
        assert_eq!(
            decode(&out, 3).unwrap(),
            vec![
                Item::Text("4é€😀"),
                Item::Text("2"),
                Item::Binary(vec![1, 2, 3, 4])
            ]
        );
        for bad in ["5:4ab", "x:4", "2", "0:", "1:😀"] {
            assert_eq!(
                decode(bad.as_bytes(), 3),
                Err(PayloadError::Malformed),
                "{bad}"
            );
        }
    }
}
