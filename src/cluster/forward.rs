//! The batch format of `cluster.forward`: the messages one node passes to
//! another for delivery to that node's sockets, many per Socket.IO event
//! (sent as its one binary attachment). Each message says whether the
//! receiver delivers it to all its matching plain and broadcast-group
//! subscriptions (`plain`), and which of its load-balanced group members
//! the sender picked (`picks`, by connection serial and sid). Pure: bytes
//! in, bytes out. Integers are little-endian; every length is checked
//! against the bytes present.

/// The first byte of every batch (the format's version).
pub const BATCH_MAGIC: u8 = 1;

const PLAIN: u8 = 1;
const REPLY: u8 = 2;
const HEADERS: u8 = 4;
const EXTRA: u8 = 8;

/// One message for another node's subscribers (forwarded in a batch),
/// borrowing from its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMessage<'a> {
    pub subject: &'a str,
    pub reply: Option<&'a str>,
    /// The message's `data` as JSON text.
    pub data: &'a str,
    /// The message's `headers` as JSON text.
    pub headers: Option<&'a str>,
    /// More members of the `msg` object, as JSON text without braces (a
    /// push delivery's `"stream":…,"consumer":…,"seq":…,"delivered":…`).
    pub extra: Option<&'a str>,
    pub attachments: Vec<Vec<u8>>,
    pub plain: bool,
    /// Load-balanced group members picked on this node: (serial, sid).
    pub picks: Vec<(u64, &'a str)>,
}

/// Starts a batch in `out` if it is empty.
fn start(out: &mut Vec<u8>) {
    if out.is_empty() {
        out.push(BATCH_MAGIC);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends one message to the batch in `out`.
pub fn push(out: &mut Vec<u8>, m: &PeerMessage<'_>) {
    start(out);
    let flags = (u8::from(m.plain) * PLAIN)
        | (u8::from(m.reply.is_some()) * REPLY)
        | (u8::from(m.headers.is_some()) * HEADERS)
        | (u8::from(m.extra.is_some()) * EXTRA);
    out.push(flags);
    put_bytes(out, m.subject.as_bytes());
    if let Some(r) = m.reply {
        put_bytes(out, r.as_bytes());
    }
    put_bytes(out, m.data.as_bytes());
    if let Some(h) = m.headers {
        put_bytes(out, h.as_bytes());
    }
    if let Some(x) = m.extra {
        put_bytes(out, x.as_bytes());
    }
    out.extend_from_slice(&(m.attachments.len() as u32).to_le_bytes());
    for a in &m.attachments {
        put_bytes(out, a);
    }
    out.extend_from_slice(&(m.picks.len() as u32).to_le_bytes());
    for (serial, sid) in &m.picks {
        out.extend_from_slice(&serial.to_le_bytes());
        put_bytes(out, sid.as_bytes());
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("batch cut short at byte {}", self.at))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'a str, String> {
        std::str::from_utf8(self.bytes()?).map_err(|_| "text is not UTF-8".to_string())
    }

    /// A count of items that each take at least `min` bytes, checked
    /// against what is left before anything is allocated for them.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.buf.len() - self.at {
            return Err("count larger than the batch".into());
        }
        Ok(n)
    }
}

/// Reads every message of a batch.
pub fn decode(buf: &[u8]) -> Result<Vec<PeerMessage<'_>>, String> {
    match buf.first() {
        Some(&BATCH_MAGIC) => {}
        Some(v) => return Err(format!("unknown batch version {v}")),
        None => return Err("empty batch".into()),
    }
    let mut c = Cursor { buf, at: 1 };
    let mut out = Vec::new();
    while c.at < buf.len() {
        let flags = c.take(1)?[0];
        if flags & !(PLAIN | REPLY | HEADERS | EXTRA) != 0 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let subject = c.str()?;
        let reply = if flags & REPLY != 0 {
            Some(c.str()?)
        } else {
            None
        };
        let data = c.str()?;
        let headers = if flags & HEADERS != 0 {
            Some(c.str()?)
        } else {
            None
        };
        let extra = if flags & EXTRA != 0 {
            Some(c.str()?)
        } else {
            None
        };
        let n = c.count(4)?;
        let mut attachments = Vec::with_capacity(n);
        for _ in 0..n {
            attachments.push(c.bytes()?.to_vec());
        }
        let n = c.count(12)?;
        let mut picks = Vec::with_capacity(n);
        for _ in 0..n {
            let serial = c.u64()?;
            picks.push((serial, c.str()?));
        }
        out.push(PeerMessage {
            subject,
            reply,
            data,
            headers,
            extra,
            attachments,
            plain: flags & PLAIN != 0,
            picks,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<PeerMessage<'static>> {
        vec![
            PeerMessage {
                subject: "a.b",
                reply: None,
                data: r#"{"x":1}"#,
                headers: None,
                extra: None,
                attachments: vec![],
                plain: true,
                picks: vec![],
            },
            PeerMessage {
                subject: "req",
                reply: Some("_INBOX.n1.abc.7"),
                data: r#"{"_placeholder":true,"num":0}"#,
                headers: Some(r#"{"k":"v"}"#),
                extra: Some(r#""stream":"s","seq":4"#),
                attachments: vec![vec![0, 1, 2], vec![]],
                plain: false,
                picks: vec![(1 << 32 | 5, "s1"), (9, "é")],
            },
        ]
    }

    #[test]
    fn batches_round_trip() {
        let mut buf = Vec::new();
        for m in sample() {
            push(&mut buf, &m);
        }
        assert_eq!(buf[0], BATCH_MAGIC);
        assert_eq!(decode(&buf).unwrap(), sample());
    }

    #[test]
    fn every_cut_and_bad_header_is_an_error() {
        let mut buf = Vec::new();
        for m in sample() {
            push(&mut buf, &m);
        }
        let first_len = {
            let mut one = Vec::new();
            push(&mut one, &sample()[0]);
            one.len()
        };
        for cut in 0..buf.len() {
            let r = decode(&buf[..cut]);
            if cut == 1 || cut == first_len {
                // A batch may end after any whole message.
                assert!(r.is_ok(), "cut {cut}");
            } else {
                assert!(r.is_err(), "cut {cut} must fail");
            }
        }
        assert!(decode(&[2]).is_err());
        let mut bad = buf.clone();
        bad[1] = 0x80;
        assert!(decode(&bad).is_err());
        // A huge attachment count is refused before allocating.
        let mut huge = vec![BATCH_MAGIC, 0];
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.push(b'a');
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).unwrap_err().contains("count"));
    }
}
