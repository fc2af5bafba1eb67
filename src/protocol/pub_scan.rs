//! A hand scanner for the argument of a `pub` event, the one request on the
//! publish hot path: it reads `["pub",{"subject":…,"data":…,…},…]` in one
//! pass without serde, and slices `data` and `headers` out of the packet
//! as raw JSON text.
//!
//! It answers only where its answer is exactly the serde path's
//! ([`super::messages::event_arg`] reading a [`super::messages::Pub`]), and
//! gives up (`None`) on everything else, so that the caller asks the serde
//! path and every outcome (the values read, an error's code and message,
//! whether the connection closes) stays as it was. It gives up on: an
//! argument that is not an object (the array form, a missing argument), a
//! missing `subject`, a key given twice, a key, `subject` or `reply` holding
//! a backslash escape or of the wrong type, broken JSON anywhere in the
//! packet, and values nested deeper than [`MAX_DEPTH`].
//!
//! What it reads but does not keep (the event name, unknown keys, the
//! arguments after the first) and the raw `data` and `headers` are checked
//! by the rules serde_json applies to a value it skips: the JSON grammar
//! with its four whitespace bytes, no control characters inside strings,
//! escapes among `\" \\ \/ \b \f \n \r \t \uXXXX` (four hex digits, whatever
//! code point they name). As in the serde path, `null` for `data`, `reply`
//! or `headers` is the same as leaving it out.

use std::borrow::Cow;

use super::messages::PubArg;

/// How deep a skipped value may nest before the scanner leaves it to the
/// serde path (which has no such limit for skipped values); it bounds the
/// scanner's recursion.
pub const MAX_DEPTH: u32 = 64;

/// Reads a whole `pub` event packet `[name, argument, …]`; `None` when the
/// serde path must decide (see the module's documentation).
pub fn scan_pub(packet: &str) -> Option<PubArg<'_>> {
    let mut s = Scanner {
        src: packet,
        b: packet.as_bytes(),
        i: 0,
    };
    s.ws();
    s.eat(b'[')?;
    s.ws();
    s.value(MAX_DEPTH)?;
    s.ws();
    s.eat(b',')?;
    s.ws();
    let arg = s.pub_object()?;
    loop {
        s.ws();
        match s.next()? {
            b']' => break,
            b',' => {
                s.ws();
                s.value(MAX_DEPTH)?;
            }
            _ => return None,
        }
    }
    s.ws();
    (s.i == s.b.len()).then_some(arg)
}

/// A key of the `pub` object.
enum Key {
    Subject,
    Data,
    Reply,
    Headers,
    Other,
}

struct Scanner<'a> {
    src: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// Skips JSON whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// The text from `from` to the current position. Both ends are next
    /// to an ASCII byte of the JSON grammar, so they are character
    /// boundaries and the slice is never refused.
    fn text(&self, from: usize) -> Option<&'a str> {
        self.src.get(from..self.i)
    }

    /// The `pub` object: `subject` is required, `data`, `reply` and
    /// `headers` optional, other keys skipped.
    fn pub_object(&mut self) -> Option<PubArg<'a>> {
        self.eat(b'{')?;
        let (mut subject, mut data, mut reply, mut headers) = (None, None, None, None);
        let (mut seen_data, mut seen_reply, mut seen_headers) = (false, false, false);
        self.ws();
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            self.eat(b'"')?;
            let key = self.key()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            match key {
                Key::Subject => {
                    if subject.is_some() {
                        return None;
                    }
                    self.eat(b'"')?;
                    subject = Some(self.plain_string()?);
                }
                Key::Data => {
                    if std::mem::replace(&mut seen_data, true) {
                        return None;
                    }
                    data = self.raw_or_null()?;
                }
                Key::Reply => {
                    if std::mem::replace(&mut seen_reply, true) {
                        return None;
                    }
                    reply = match self.peek()? {
                        b'"' => {
                            self.i += 1;
                            Some(self.plain_string()?)
                        }
                        _ => {
                            self.null()?;
                            None
                        }
                    };
                }
                Key::Headers => {
                    if std::mem::replace(&mut seen_headers, true) {
                        return None;
                    }
                    headers = self.raw_or_null()?;
                }
                Key::Other => self.value(MAX_DEPTH)?,
            }
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => break,
                _ => return None,
            }
        }
        Some(PubArg {
            subject: Cow::Borrowed(subject?),
            data,
            reply: reply.map(Cow::Borrowed),
            headers,
        })
    }

    /// The rest of a key (its opening quote is read): one of the four
    /// fields, compared with the closing quote, or another key without
    /// escapes.
    fn key(&mut self) -> Option<Key> {
        let rest = self.b.get(self.i..)?;
        let (word, key): (&[u8], Key) = match rest.first()? {
            b's' => (b"subject\"", Key::Subject),
            b'd' => (b"data\"", Key::Data),
            b'r' => (b"reply\"", Key::Reply),
            b'h' => (b"headers\"", Key::Headers),
            _ => (b"", Key::Other),
        };
        if !word.is_empty() && rest.starts_with(word) {
            self.i += word.len();
            return Some(key);
        }
        // A plain key spelled like one of the four would have matched.
        self.plain_string()?;
        Some(Key::Other)
    }

    /// A value kept as raw text; `null` reads as absent.
    fn raw_or_null(&mut self) -> Option<Option<&'a str>> {
        if self.peek()? == b'n' {
            self.null()?;
            return Some(None);
        }
        let from = self.i;
        self.value(MAX_DEPTH)?;
        Some(Some(self.text(from)?))
    }

    fn null(&mut self) -> Option<()> {
        self.literal(b"null")
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// The rest of a string (its opening quote is read) without escapes or
    /// control characters; `None` when it has either or does not end.
    fn plain_string(&mut self) -> Option<&'a str> {
        let from = self.i;
        let end = find_special(self.b, from);
        if self.b.get(end)? != &b'"' {
            return None;
        }
        self.i = end;
        let s = self.text(from)?;
        self.i = end + 1;
        Some(s)
    }

    /// Skips the rest of a string (its opening quote is read), checking its
    /// escapes.
    fn skip_string(&mut self) -> Option<()> {
        loop {
            self.i = find_special(self.b, self.i);
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    b'u' => {
                        let end = self.i.checked_add(4)?;
                        if !self.b.get(self.i..end)?.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        self.i = end;
                    }
                    _ => return None,
                },
                // A control character.
                _ => return None,
            }
        }
    }

    /// Skips one value (whitespace before it already skipped), checking it.
    fn value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                self.skip_string()
            }
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.i += 1;
                self.ws();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.eat(b'"')?;
                    self.skip_string()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.value(depth)?;
                    self.ws();
                    match self.next()? {
                        b',' => self.ws(),
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.value(depth)?;
                    self.ws();
                    match self.next()? {
                        b',' => self.ws(),
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.null(),
            b'-' => {
                self.i += 1;
                self.number()
            }
            b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A number after its sign: no leading zeros, a fraction and an
    /// exponent each with at least one digit.
    fn number(&mut self) -> Option<()> {
        match self.next()? {
            b'0' => {
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }
}

/// Whether a byte ends a run of plain string bytes: `"`, `\` or a control
/// character.
fn special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The index of the first special byte (see [`special`]) at or after
/// `from`, or `b.len()`; eight bytes at a time.
#[inline]
fn find_special(b: &[u8], from: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut i = from;
    for chunk in b.get(from..).unwrap_or_default().chunks_exact(8) {
        let c = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // The high bit of a byte under 0x20, '"' or '\\' ends up set: one
        // of the subtractions wraps there, and such a byte has its own high
        // bit clear. A borrow may flag bytes above the first such byte too,
        // never below it, so the lowest flag is exact.
        let q = (c ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES);
        let bs = (c ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES);
        let ctrl = c.wrapping_sub(ONES * 0x20);
        let hit = (q | bs | ctrl) & !c & HIGH;
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while b.get(i).is_some_and(|&c| !special(c)) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{event_arg, ArgError, Pub};

    /// The serde path's answer, in a comparable form.
    fn serde_answer(packet: &str) -> Result<PubArg<'_>, String> {
        match event_arg::<Pub>(packet) {
            Ok(p) => Ok(PubArg::from(p)),
            Err(ArgError::Malformed) => Err("malformed".into()),
            Err(ArgError::Api(e)) => Err(format!("{:?}: {}", e.code, e.message)),
        }
    }

    /// The scanner either agrees with the serde path or leaves it to it;
    /// returns whether it answered.
    fn agrees(packet: &str) -> bool {
        let serde = serde_answer(packet);
        match scan_pub(packet) {
            Some(p) => {
                assert_eq!(Ok(&p), serde.as_ref(), "{packet:?}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn reads_what_serde_reads() {
        for packet in [
            r#"["pub",{"subject":"a.b","data":"0000000042xxxx"}]"#,
            r#"["pub",{"subject":"a.b"}]"#,
            r#"["pub",{"subject":"a.b","data":null,"reply":null,"headers":null}]"#,
            r#"["pub",{"subject":"a.b","data":{"x":[1,2,{"y":"z"}],"e":{}},"reply":"r.1","headers":{"k":"v"}}]"#,
            r#"["pub",{"data":[],"headers":{},"reply":"r","subject":"s"}]"#,
            " \t\r\n[ \"pub\" , { \"subject\" : \"a\" , \"data\" : 1.5e-3 } , 1 , [ ] ]\n ",
            r#"["pub",{"subject":"a","data":"esc \" \\ \/ \b \f \n \r \t \u00e9 \ud800 \uDFFF"}]"#,
            r#"["pub",{"subject":"a","data":-0}]"#,
            r#"["pub",{"subject":"a","data":0.0E+10}]"#,
            r#"["pub",{"subject":"a","data":123456789012345678901234567890}]"#,
            r#"["pub",{"subject":"a","data":true,"headers":false}]"#,
            r#"["pub",{"subject":"a","other":{"subject":"b"},"more":[null,true]}]"#,
            r#"["pub",{"subject":"a","data":"é ü 日本 😀"},"extra",{"k":[1]}]"#,
            r#"[{"any":"name"},{"subject":"a"}]"#,
            r#"["pub",{"subject":"","data":""}]"#,
            r#"["pub",{"subject":"日本.x","reply":"ü"}]"#,
        ] {
            assert!(agrees(packet), "the scanner left {packet:?} to serde");
        }
    }

    #[test]
    fn leaves_everything_else_to_serde() {
        let deep = format!(
            r#"["pub",{{"subject":"a","data":{}1{}}}]"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        let deep_ok = format!(
            r#"["pub",{{"subject":"a","data":{}1{}}}]"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        for packet in [
            // Not the object form, or no argument.
            r#"["pub"]"#,
            r#"["pub",["a.b",1,"r.x",{},5]]"#,
            r#"["pub",["a.b"]]"#,
            r#"["pub",5]"#,
            r#"["pub",null]"#,
            r#"["pub","a"]"#,
            r#"{"subject":"a"}"#,
            r#"[]"#,
            r#""pub""#,
            "",
            // Missing, repeated or mistyped fields.
            r#"["pub",{}]"#,
            r#"["pub",{"data":1}]"#,
            r#"["pub",{"subject":"a","subject":"a"}]"#,
            r#"["pub",{"subject":"a","data":1,"data":1}]"#,
            r#"["pub",{"subject":"a","data":null,"data":null}]"#,
            r#"["pub",{"subject":"a","reply":"r","reply":"r"}]"#,
            r#"["pub",{"subject":"a","headers":{},"headers":{}}]"#,
            r#"["pub",{"subject":null}]"#,
            r#"["pub",{"subject":5}]"#,
            r#"["pub",{"subject":["a"]}]"#,
            r#"["pub",{"subject":"a","reply":5}]"#,
            r#"["pub",{"subject":"a","reply":{}}]"#,
            r#"["pub",{"subject":"a","reply":nul}]"#,
            r#"["pub",{"subject":"a","data":nul}]"#,
            r#"["pub",{"subject":"a","data":nulls}]"#,
            // Escapes where the serde path decodes them.
            r#"["pub",{"subject":"a\u002eb"}]"#,
            r#"["pub",{"subject":"a\"b"}]"#,
            r#"["pub",{"subject":"\ud800"}]"#,
            r#"["pub",{"subject":"a","reply":"r\n"}]"#,
            r#"["pub",{"sub\u006aect":"a"}]"#,
            r#"["pub",{"subject":"a","d\u0061ta":1}]"#,
            r#"["pub",{"subject":"a","\ud800":1}]"#,
            // Broken JSON.
            r#"["pub",{"#,
            r#"["pub",{"subject":"a"}] x"#,
            r#"["pub",{"subject":"a"},]"#,
            r#"["pub",{"subject":"a",}]"#,
            r#"["pub",{"subject":"a"}"#,
            r#"["pub",{"subject":"a" "data":1}]"#,
            r#"["pub",{"subject":"a","data":01}]"#,
            r#"["pub",{"subject":"a","data":-}]"#,
            r#"["pub",{"subject":"a","data":1.}]"#,
            r#"["pub",{"subject":"a","data":1e}]"#,
            r#"["pub",{"subject":"a","data":1e+}]"#,
            r#"["pub",{"subject":"a","data":.5}]"#,
            r#"["pub",{"subject":"a","data":+1}]"#,
            r#"["pub",{"subject":"a","data":"\x"}]"#,
            r#"["pub",{"subject":"a","data":"\u12G4"}]"#,
            r#"["pub",{"subject":"a","data":"\u12"}]"#,
            "[\"pub\",{\"subject\":\"a\",\"data\":\"tab\there\"}]",
            "[\"pub\",{\"subject\":\"a\\u0000b\"}]",
            "[\"pub\",{\"subject\":\"a\",\"data\":\"\u{1}\"}]",
            "[\"pub\",{\"subject\":\"a\",\"data\":1}]\u{0b}",
            "[\"pub\",{\"subject\":\"a\",\"data\":1}]\u{a0}",
            r#"["pub",{"subject":"a","data":[1,]}]"#,
            r#"["pub",{"subject":"a","data":{"k"}}]"#,
            r#"["pub",{"subject":"a","data":{1:2}}]"#,
            r#"["pub",{"subject":"a","data":[1 2]}]"#,
            r#"["pub",{"subject":"a","data":tru}]"#,
            r#"["pub",{"subject":"a","data":True}]"#,
            r#"["pub",{"subject":"a","data":"unterminated}]"#,
            r#"["pub" {"subject":"a"}]"#,
            r#"["pub",{"subject":"a"} {}]"#,
            r#"["pub",{"subject":"a"},1,]"#,
            r#"["pub",{"subject":"a"}]]"#,
            r#"[,{"subject":"a"}]"#,
            // Deeper than the scanner goes.
            &deep,
            &deep_ok,
        ] {
            assert!(!agrees(packet), "the scanner read {packet:?}");
        }
    }

    /// Mutants of valid packets (bytes replaced, inserted, removed, with a
    /// bias to JSON's own characters): wherever the scanner answers, serde
    /// answers the same.
    #[test]
    fn agrees_with_serde_on_mutated_packets() {
        let seeds = [
            r#"["pub",{"subject":"a.b","data":"0000000042xxxxxxxxxxxxxxxx"}]"#,
            r#"["pub",{"subject":"orders.eu","data":{"id":1,"x":[1,2.5e3,-0,true,null]},"reply":"_INBOX.1","headers":{"k":"v"}}]"#,
            r#" [ "pub" , { "reply" : null , "subject" : "s" , "headers" : null , "z" : [ { } ] } , "x" ] "#,
            r#"["pub",{"subject":"a","data":"\u00e9\n\"q\"","other":"\\"},{"a":[]}]"#,
        ];
        let alphabet: &[u8] = b"{}[]:,\"\\ \t\n0123456789-+.eEnultrfasjbdpy\x01\x7f";
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let (mut answered, mut total) = (0, 0);
        for seed in seeds {
            for _ in 0..4000 {
                let mut b = seed.as_bytes().to_vec();
                for _ in 0..1 + rand(3) {
                    let at = rand(b.len() + 1);
                    let c = alphabet[rand(alphabet.len())];
                    match rand(3) {
                        0 if at < b.len() => b[at] = c,
                        1 if at < b.len() => {
                            b.remove(at);
                        }
                        _ => b.insert(at, c),
                    }
                }
                let Ok(packet) = String::from_utf8(b) else {
                    continue;
                };
                total += 1;
                answered += usize::from(agrees(&packet));
            }
        }
        // Most mutants break the packet; the scanner still reads the many
        // that stay well-formed.
        assert!(answered * 20 > total, "{answered} of {total}");
    }

    #[test]
    fn finds_special_bytes_at_every_offset() {
        for len in 0..40 {
            for at in 0..=len {
                for special in [b'"', b'\\', 0u8, 0x1f] {
                    let mut b = vec![b'x'; len];
                    b.extend_from_slice("é".as_bytes());
                    if at < len {
                        b[at] = special;
                        // Bytes after it that would trip a borrow.
                        for c in b.iter_mut().skip(at + 1) {
                            *c = 0x21;
                        }
                    }
                    let want = if at < len { at } else { b.len() };
                    for from in 0..=at.min(len) {
                        assert_eq!(find_special(&b, from), want, "{b:?} from {from}");
                    }
                }
            }
        }
        assert_eq!(find_special(&[0x7f, 0x80, 0xff, 0x20, 0x5b, 0x5d], 0), 6);
    }
}
