//! Socket.IO v5 codec: packet types, namespaces, ack ids, binary attachment
//! counts and placeholders (Socket.IO v5 protocol, "Packet format").
//!
//! Decoding borrows from the input and allocates nothing; encoding appends to
//! a caller's buffer so deliveries can be assembled without copies.

use serde_json::value::RawValue;

use super::stream_messages::FETCH_BATCH_MAX;

/// The largest ack id accepted: JavaScript clients count with doubles, so
/// ids stay exact integers (2^53 - 1).
pub const ACK_ID_MAX: u64 = (1 << 53) - 1;
/// Attachments one binary packet may announce to a server (the contract's
/// limit on input; more closes the connection).
pub const ATTACHMENTS_MAX: usize = 64;
/// Attachments a client accepts in one packet from a server. The most a
/// server sends is a `consumer.fetch` answer: one attachment per binary
/// message, at most [`FETCH_BATCH_MAX`] messages.
pub const ATTACHMENTS_FROM_SERVER_MAX: usize = FETCH_BATCH_MAX as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketType {
    Connect = 0,
    Disconnect = 1,
    Event = 2,
    Ack = 3,
    ConnectError = 4,
    BinaryEvent = 5,
    BinaryAck = 6,
}

impl PacketType {
    fn from_byte(b: u8) -> Option<PacketType> {
        Some(match b {
            b'0' => PacketType::Connect,
            b'1' => PacketType::Disconnect,
            b'2' => PacketType::Event,
            b'3' => PacketType::Ack,
            b'4' => PacketType::ConnectError,
            b'5' => PacketType::BinaryEvent,
            b'6' => PacketType::BinaryAck,
            _ => return None,
        })
    }

    pub fn is_binary(self) -> bool {
        matches!(self, PacketType::BinaryEvent | PacketType::BinaryAck)
    }
}

/// A decoded packet; `data` is the JSON text after the header (may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    pub kind: PacketType,
    pub attachments: usize,
    pub nsp: &'a str,
    pub id: Option<u64>,
    pub data: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SioError {
    UnknownType,
    BadAttachments,
    BadAckId,
    BadPayload,
}

impl std::fmt::Display for SioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SioError::UnknownType => "unknown Socket.IO packet type",
            SioError::BadAttachments => "bad attachment count",
            SioError::BadAckId => "bad ack id",
            SioError::BadPayload => "payload does not fit the packet type",
        })
    }
}

impl std::error::Error for SioError {}

/// Decodes the header of a packet and checks that its payload has the shape
/// its type requires (CONNECT: absent or an object; DISCONNECT: absent;
/// EVENT: an array starting with a string; ACK: an array; CONNECT_ERROR: an
/// object). The JSON itself is checked by whoever reads it. At most
/// [`ATTACHMENTS_MAX`] attachments: this is the server's decoder.
pub fn decode(text: &str) -> Result<Packet<'_>, SioError> {
    decode_with(text, ATTACHMENTS_MAX)
}

/// [`decode`] with another bound on the attachment count; a client passes
/// [`ATTACHMENTS_FROM_SERVER_MAX`].
pub fn decode_with(text: &str, attachments_max: usize) -> Result<Packet<'_>, SioError> {
    let b = text.as_bytes();
    let kind = b
        .first()
        .and_then(|&c| PacketType::from_byte(c))
        .ok_or(SioError::UnknownType)?;
    let mut i = 1;
    let mut attachments = 0;
    if kind.is_binary() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start || i - start > decimal_len(attachments_max) || b.get(i) != Some(&b'-') {
            return Err(SioError::BadAttachments);
        }
        attachments = text[start..i]
            .parse::<usize>()
            .map_err(|_| SioError::BadAttachments)?;
        if attachments > attachments_max {
            return Err(SioError::BadAttachments);
        }
        i += 1;
    }
    let mut nsp = "/";
    if b.get(i) == Some(&b'/') {
        let end = text[i..].find(',').map_or(b.len(), |p| i + p);
        nsp = &text[i..end];
        i = (end + 1).min(b.len());
    }
    let mut id = None;
    let start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i > start {
        let v = text[start..i]
            .parse::<u64>()
            .map_err(|_| SioError::BadAckId)?;
        if v > ACK_ID_MAX {
            return Err(SioError::BadAckId);
        }
        id = Some(v);
    }
    let data = &text[i..];
    let first = data.as_bytes().first().copied();
    let shape_ok = match kind {
        PacketType::Connect => first.is_none() || first == Some(b'{'),
        PacketType::Disconnect => first.is_none(),
        PacketType::Event | PacketType::BinaryEvent => first == Some(b'['),
        PacketType::Ack | PacketType::BinaryAck => first == Some(b'[') && id.is_some(),
        PacketType::ConnectError => first == Some(b'{'),
    };
    if !shape_ok || (id.is_some() && matches!(kind, PacketType::Connect | PacketType::Disconnect)) {
        return Err(SioError::BadPayload);
    }
    Ok(Packet {
        kind,
        attachments,
        nsp,
        id,
        data,
    })
}

/// How many decimal digits `v` has.
fn decimal_len(v: usize) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// An event's name and arguments, borrowed from the packet's JSON.
#[derive(Debug)]
pub struct Event<'a> {
    pub name: std::borrow::Cow<'a, str>,
    pub args: Vec<&'a RawValue>,
}

/// Parses `["name", arg…]`. An array that does not start with a string is
/// `BadPayload`, as is invalid JSON.
pub fn parse_event(data: &str) -> Result<Event<'_>, SioError> {
    #[derive(serde::Deserialize)]
    struct Raw<'a>(#[serde(borrow)] Vec<&'a RawValue>);
    let Raw(mut all) = serde_json::from_str(data).map_err(|_| SioError::BadPayload)?;
    if all.is_empty() {
        return Err(SioError::BadPayload);
    }
    let head = all.remove(0);
    let name: std::borrow::Cow<'_, str> =
        serde_json::from_str(head.get()).map_err(|_| SioError::BadPayload)?;
    Ok(Event { name, args: all })
}

/// The name of an event packet `["name", …]`, read without parsing the
/// arguments; None when the packet does not start with a string.
pub fn event_name(data: &str) -> Option<std::borrow::Cow<'_, str>> {
    let fast = data
        .strip_prefix("[\"")
        // Byte loops: names are short, and `str::find` or `contains` sets
        // up a searcher that costs more than the name.
        .and_then(|rest| rest.bytes().position(|b| b == b'"').map(|end| &rest[..end]))
        .filter(|name| !name.bytes().any(|b| b == b'\\'));
    match fast {
        Some(name) => Some(std::borrow::Cow::Borrowed(name)),
        // Whitespace or escapes: let the JSON parser read it.
        None => parse_event(data).ok().map(|e| e.name),
    }
}

/// Appends a packet header: type, attachment count, namespace, ack id.
#[inline]
pub fn write_header(
    out: &mut Vec<u8>,
    kind: PacketType,
    attachments: usize,
    nsp: &str,
    id: Option<u64>,
) {
    out.push(b'0' + kind as u8);
    if kind.is_binary() {
        push_decimal(out, attachments as u64);
        out.push(b'-');
    }
    if nsp != "/" {
        out.extend_from_slice(nsp.as_bytes());
        out.push(b',');
    }
    if let Some(id) = id {
        push_decimal(out, id);
    }
}

/// Appends the decimal digits of `v`.
pub fn push_decimal(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(digits[..n].iter().rev());
}

/// A whole packet as a string: header then `data`.
pub fn encode(
    kind: PacketType,
    attachments: usize,
    nsp: &str,
    id: Option<u64>,
    data: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + nsp.len() + 8);
    write_header(&mut out, kind, attachments, nsp, id);
    out.extend_from_slice(data.as_bytes());
    out
}

/// A whole packet inside an Engine.IO message (a leading `4`), as text: the
/// form a client sends.
pub fn encode_message(
    kind: PacketType,
    attachments: usize,
    nsp: &str,
    id: Option<u64>,
    data: &str,
) -> String {
    let mut out = Vec::with_capacity(data.len() + nsp.len() + 9);
    out.push(b'4');
    write_header(&mut out, kind, attachments, nsp, id);
    out.extend_from_slice(data.as_bytes());
    // Only ASCII was added around the `&str`s.
    String::from_utf8(out).unwrap_or_default()
}

/// `{"_placeholder":true,"num":n}`: where attachment `n` sits in a payload.
pub fn placeholder(num: usize) -> serde_json::Value {
    serde_json::json!({ "_placeholder": true, "num": num })
}

/// The attachment index if `value` is a placeholder object.
pub fn placeholder_num(value: &serde_json::Value) -> Option<usize> {
    let object = value.as_object()?;
    if object.get("_placeholder")?.as_bool()? {
        usize::try_from(object.get("num")?.as_u64()?).ok()
    } else {
        None
    }
}

/// Whether a JSON text contains a binary placeholder object; used to check
/// that `num` indices stay below the attachment count.
pub fn placeholders_valid(json: &str, attachments: usize) -> bool {
    fn walk(v: &serde_json::Value, n: usize) -> bool {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("_placeholder") == Some(&serde_json::Value::Bool(true)) {
                    return m
                        .get("num")
                        .and_then(|x| x.as_u64())
                        .is_some_and(|k| (k as usize) < n);
                }
                m.values().all(|x| walk(x, n))
            }
            serde_json::Value::Array(a) => a.iter().all(|x| walk(x, n)),
            _ => true,
        }
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(v) => walk(&v, attachments),
        Err(_) => false,
    }
}

/// A binary packet's text and its attachments, once all have arrived.
pub type Complete = (String, Vec<Vec<u8>>);

/// Collects a binary packet's attachments as they arrive in binary frames.
#[derive(Debug, Default)]
pub struct Reassembly {
    header: Option<String>,
    expected: usize,
    parts: Vec<Vec<u8>>,
    bytes: usize,
}

impl Reassembly {
    /// True while attachments are awaited.
    pub fn pending(&self) -> bool {
        self.header.is_some()
    }

    /// Starts waiting for `expected` attachments after the text packet.
    pub fn start(&mut self, text: &str, expected: usize) {
        self.header = Some(text.to_string());
        self.expected = expected;
        self.parts.clear();
        self.bytes = 0;
    }

    /// Adds one attachment; returns the text packet and all attachments once
    /// complete. `bytes_max` bounds what one packet may hold in total.
    pub fn push(&mut self, bytes: &[u8], bytes_max: usize) -> Result<Option<Complete>, SioError> {
        if self.header.is_none() {
            return Err(SioError::BadAttachments);
        }
        self.bytes += bytes.len();
        if self.bytes > bytes_max {
            return Err(SioError::BadAttachments);
        }
        self.parts.push(bytes.to_vec());
        if self.parts.len() < self.expected {
            return Ok(None);
        }
        let text = self.header.take().unwrap_or_default();
        Ok(Some((text, std::mem::take(&mut self.parts))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(
        kind: PacketType,
        attachments: usize,
        nsp: &str,
        id: Option<u64>,
        data: &str,
    ) -> Packet<'static> {
        let nsp: &'static str = Box::leak(nsp.to_string().into_boxed_str());
        let data: &'static str = Box::leak(data.to_string().into_boxed_str());
        Packet {
            kind,
            attachments,
            nsp,
            id,
            data,
        }
    }

    #[test]
    fn decodes_spec_examples() {
        // Examples from the Socket.IO v5 protocol document.
        assert_eq!(decode("0"), Ok(pkt(PacketType::Connect, 0, "/", None, "")));
        assert_eq!(
            decode("0/admin,"),
            Ok(pkt(PacketType::Connect, 0, "/admin", None, ""))
        );
        assert_eq!(
            decode(r#"0{"token":"123"}"#),
            Ok(pkt(PacketType::Connect, 0, "/", None, r#"{"token":"123"}"#))
        );
        assert_eq!(
            decode(r#"0/admin,{"sid":"oSO0OpakMV_3jnilAAAA"}"#).map(|p| p.nsp),
            Ok("/admin")
        );
        assert_eq!(
            decode("1/admin,"),
            Ok(pkt(PacketType::Disconnect, 0, "/admin", None, ""))
        );
        assert_eq!(
            decode("1"),
            Ok(pkt(PacketType::Disconnect, 0, "/", None, ""))
        );
        assert_eq!(
            decode(r#"2["hello",1]"#),
            Ok(pkt(PacketType::Event, 0, "/", None, r#"["hello",1]"#))
        );
        assert_eq!(
            decode(r#"2/admin,456["project:delete",123]"#),
            Ok(pkt(
                PacketType::Event,
                0,
                "/admin",
                Some(456),
                r#"["project:delete",123]"#
            ))
        );
        assert_eq!(
            decode("3/admin,456[]"),
            Ok(pkt(PacketType::Ack, 0, "/admin", Some(456), "[]"))
        );
        assert_eq!(
            decode(r#"4{"message":"Not authorized"}"#),
            Ok(pkt(
                PacketType::ConnectError,
                0,
                "/",
                None,
                r#"{"message":"Not authorized"}"#
            ))
        );
        assert_eq!(
            decode(r#"51-["hello",{"_placeholder":true,"num":0}]"#),
            Ok(pkt(
                PacketType::BinaryEvent,
                1,
                "/",
                None,
                r#"["hello",{"_placeholder":true,"num":0}]"#
            ))
        );
        assert_eq!(
            decode(r#"61-/admin,456[{"_placeholder":true,"num":0}]"#),
            Ok(pkt(
                PacketType::BinaryAck,
                1,
                "/admin",
                Some(456),
                r#"[{"_placeholder":true,"num":0}]"#
            ))
        );
        // A namespace with no comma runs to the end (as the compliance suite sends it).
        assert_eq!(decode("0/random").map(|p| p.nsp), Ok("/random"));
        assert_eq!(decode("1/custom").map(|p| p.nsp), Ok("/custom"));
    }

    #[test]
    fn rejects_malformed_packets() {
        assert_eq!(decode(""), Err(SioError::UnknownType));
        assert_eq!(decode("abc"), Err(SioError::UnknownType));
        assert_eq!(decode("7[]"), Err(SioError::UnknownType));
        assert_eq!(decode("2{}"), Err(SioError::BadPayload));
        assert_eq!(decode("2"), Err(SioError::BadPayload));
        assert_eq!(
            decode(r#"2abc["message-with-ack",1]"#),
            Err(SioError::BadPayload)
        );
        assert_eq!(
            decode(r#"299999999999999999999999["ping",{}]"#),
            Err(SioError::BadAckId)
        );
        assert_eq!(
            decode(r#"29007199254740992["ping",{}]"#),
            Err(SioError::BadAckId)
        );
        assert!(decode(r#"29007199254740991["ping",{}]"#).is_ok());
        assert_eq!(decode(r#"5["x"]"#), Err(SioError::BadAttachments));
        assert_eq!(decode(r#"5999-["x"]"#), Err(SioError::BadAttachments));
        assert_eq!(decode(r#"565-["x"]"#), Err(SioError::BadAttachments));
        assert_eq!(decode("0[]"), Err(SioError::BadPayload));
        assert_eq!(decode("1{}"), Err(SioError::BadPayload));
        assert_eq!(decode("3[]"), Err(SioError::BadPayload));
        assert_eq!(decode("01"), Err(SioError::BadPayload));
    }

    #[test]
    fn reads_event_names_without_parsing_arguments() {
        assert_eq!(
            event_name(r#"["pub",{"subject":"a"}]"#).as_deref(),
            Some("pub")
        );
        assert_eq!(event_name(r#"["a\"b",1]"#).as_deref(), Some("a\"b"));
        assert_eq!(event_name("[1]"), None);
        assert_eq!(event_name(r#"[ "x"]"#).as_deref(), Some("x"));
        assert_eq!(event_name(r#"["x"#), None);
    }

    #[test]
    fn parses_events() {
        let e = parse_event(r#"["message",1,"2",{"3":[true]}]"#).unwrap();
        assert_eq!(e.name, "message");
        let args: Vec<&str> = e.args.iter().map(|a| a.get()).collect();
        assert_eq!(args, vec!["1", r#""2""#, r#"{"3":[true]}"#]);
        assert_eq!(parse_event(r#"["pub"]"#).map(|e| e.args.len()).unwrap(), 0);
        assert_eq!(parse_event(r#"["a\"b"]"#).unwrap().name, "a\"b");
        assert!(parse_event("[]").is_err());
        assert!(parse_event("[1]").is_err());
        assert!(parse_event(r#"["pub",{"#).is_err());
        assert!(parse_event("{}").is_err());
    }

    #[test]
    fn encodes_headers() {
        assert_eq!(
            encode(PacketType::Connect, 0, "/", None, r#"{"sid":"x"}"#),
            br#"0{"sid":"x"}"#.to_vec()
        );
        assert_eq!(
            encode(PacketType::Connect, 0, "/control", None, r#"{"sid":"x"}"#),
            br#"0/control,{"sid":"x"}"#.to_vec()
        );
        assert_eq!(
            encode(PacketType::Ack, 0, "/", Some(456), "[1]"),
            b"3456[1]".to_vec()
        );
        assert_eq!(
            encode(PacketType::Ack, 0, "/admin", Some(456), "[]"),
            b"3/admin,456[]".to_vec()
        );
        assert_eq!(
            encode(PacketType::BinaryAck, 2, "/", Some(789), "[]"),
            b"62-789[]".to_vec()
        );
        assert_eq!(
            encode(
                PacketType::ConnectError,
                0,
                "/random",
                None,
                r#"{"message":"Invalid namespace"}"#
            ),
            br#"4/random,{"message":"Invalid namespace"}"#.to_vec()
        );
        let mut v = Vec::new();
        push_decimal(&mut v, 0);
        push_decimal(&mut v, 1234567890);
        assert_eq!(v, b"01234567890");
    }

    #[test]
    fn reassembles_attachments() {
        let mut r = Reassembly::default();
        assert!(r.push(b"x", 100).is_err());
        r.start(
            r#"52-["m",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#,
            2,
        );
        assert!(r.pending());
        assert_eq!(r.push(&[1, 2, 3], 100), Ok(None));
        let (text, parts) = r.push(&[4, 5, 6], 100).unwrap().unwrap();
        assert!(text.starts_with("52-"));
        assert_eq!(parts, vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert!(!r.pending());
        r.start("51-[]", 1);
        assert!(r.push(&[0; 200], 100).is_err());
    }

    #[test]
    fn checks_placeholders() {
        assert!(placeholders_valid(
            r#"["m",{"_placeholder":true,"num":0}]"#,
            1
        ));
        assert!(!placeholders_valid(
            r#"["m",{"_placeholder":true,"num":1}]"#,
            1
        ));
        assert!(!placeholders_valid(r#"["m",{"_placeholder":true}]"#, 1));
        assert!(placeholders_valid(r#"["m",{"a":[1,2]}]"#, 0));
    }

    /// Arbitrary and truncated inputs give errors or packets, never panics.
    #[test]
    fn random_and_truncated_input_never_panics() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || crate::rand::splitmix64(&mut seed);
        let samples = [
            r#"42["pub",{"subject":"a.b","data":1}]"#,
            r#"452-789["message-with-ack",{"_placeholder":true,"num":0},{"_placeholder":true,"num":1}]"#,
            r#"40/control,{"token":"secret"}"#,
            r#"43/admin,456[{"ok":true}]"#,
        ];
        let alphabet = b"0123456789[]{}\",-/:abc_ \\";
        for round in 0..20_000 {
            let text: String = if round % 2 == 0 {
                let s = samples[(next() % samples.len() as u64) as usize];
                let cut = (next() % (s.len() as u64 + 1)) as usize;
                s[..cut].to_string()
            } else {
                let len = (next() % 40) as usize;
                (0..len)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize] as char)
                    .collect()
            };
            let engine = crate::protocol::engineio::decode(&text);
            if let Ok(crate::protocol::engineio::Packet::Message(m)) = engine {
                if let Ok(p) = decode(m) {
                    if matches!(p.kind, PacketType::Event | PacketType::BinaryEvent) {
                        let _ = parse_event(p.data);
                    }
                    let _ = placeholders_valid(p.data, p.attachments);
                }
            }
        }
    }

    /// What a server sends, read the way a client reads it.
    #[test]
    fn server_packets_decode_on_the_client_side() {
        let read = |t| decode_with(t, ATTACHMENTS_FROM_SERVER_MAX).unwrap();
        let p = read("0{\"sid\":\"x\"}");
        assert_eq!(
            (p.kind, p.nsp, p.id, p.data),
            (PacketType::Connect, "/", None, "{\"sid\":\"x\"}")
        );
        let p = read("3/control,12[{\"ok\":true}]");
        assert_eq!(
            (p.kind, p.nsp, p.id, p.data),
            (PacketType::Ack, "/control", Some(12), "[{\"ok\":true}]")
        );
        let p = read("52-/control,7[\"msg\"]");
        assert_eq!(
            (p.kind, p.attachments, p.nsp, p.id),
            (PacketType::BinaryEvent, 2, "/control", Some(7))
        );
        let p = read("1/control");
        assert_eq!(
            (p.kind, p.nsp, p.data),
            (PacketType::Disconnect, "/control", "")
        );
        assert_eq!(
            read("4{\"message\":\"unauthorized\"}").kind,
            PacketType::ConnectError
        );
    }

    /// A fetch answer may carry one attachment per message of a full batch:
    /// a client accepts it, a server never accepts more than 64.
    #[test]
    fn attachment_limits_differ_by_direction() {
        let full = format!("6{ATTACHMENTS_FROM_SERVER_MAX}-7[{{\"ok\":true}}]");
        assert_eq!(decode(&full), Err(SioError::BadAttachments));
        let p = decode_with(&full, ATTACHMENTS_FROM_SERVER_MAX).unwrap();
        assert_eq!(
            (p.kind, p.attachments, p.id),
            (PacketType::BinaryAck, 1000, Some(7))
        );
        let over = format!("6{}-7[{{}}]", ATTACHMENTS_FROM_SERVER_MAX + 1);
        assert_eq!(
            decode_with(&over, ATTACHMENTS_FROM_SERVER_MAX),
            Err(SioError::BadAttachments)
        );
        assert_eq!(decode("564-[\"m\"]").map(|p| p.attachments), Ok(64));
        assert_eq!(decode("565-[\"m\"]"), Err(SioError::BadAttachments));
        assert_eq!(decode("5064-[\"m\"]"), Err(SioError::BadAttachments));
    }

    /// Spec strings for the packets a client writes (with Engine.IO's `4`).
    #[test]
    fn client_packets_encode() {
        assert_eq!(encode_message(PacketType::Connect, 0, "/", None, ""), "40");
        assert_eq!(
            encode_message(
                PacketType::Connect,
                0,
                "/control",
                None,
                "{\"token\":\"t\"}"
            ),
            "40/control,{\"token\":\"t\"}"
        );
        assert_eq!(
            encode_message(PacketType::Event, 0, "/", Some(5), "[\"ping\",{}]"),
            "425[\"ping\",{}]"
        );
        assert_eq!(
            encode_message(PacketType::BinaryEvent, 1, "/", Some(7), "[\"pub\"]"),
            "451-7[\"pub\"]"
        );
        assert_eq!(
            encode_message(PacketType::BinaryEvent, 1, "/control", None, "[]"),
            "451-/control,[]"
        );
        assert_eq!(
            encode_message(PacketType::Disconnect, 0, "/control", None, ""),
            "41/control,"
        );
    }

    #[test]
    fn placeholders_round_trip() {
        assert_eq!(placeholder_num(&placeholder(3)), Some(3));
        assert_eq!(placeholder_num(&serde_json::json!({"num": 1})), None);
        assert_eq!(
            placeholder_num(&serde_json::json!({"_placeholder": false, "num": 1})),
            None
        );
        assert_eq!(placeholder_num(&serde_json::json!("x")), None);
        assert!(placeholders_valid(&placeholder(0).to_string(), 1));
    }
}
