//! The NATS client protocol: a pure parser of what the server sends
//! (INFO, MSG, HMSG, PING, PONG, +OK, -ERR) and a blocking connection that
//! speaks CONNECT, SUB, PUB and PING, over plain TCP or over WebSocket
//! (the same byte stream in binary frames, one frame per write, as NATS'
//! own WebSocket clients send it). Replies to this connection's requests
//! come to one wildcard inbox, `_INBOX.<random>.<id>`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::Duration;

use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Bytes, Message, WebSocket};

use crate::conn::{fail, Event};

/// One server operation, with byte ranges into the parsed buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Op {
    /// MSG, or HMSG with `headers` (the header block, `NATS/1.0…`, right
    /// before `payload`).
    Msg {
        subject: Range<usize>,
        reply: Option<Range<usize>>,
        headers: Option<Range<usize>>,
        payload: Range<usize>,
    },
    Ping,
    Pong,
    Ok,
    Err(String),
    Info,
}

/// Parses the first complete operation in `buf`: `Ok(None)` when more bytes
/// are needed, else the operation and how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Op, usize)>, String> {
    let Some(eol) = memchr::memmem::find(buf, b"\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err("control line longer than 64 KiB".into());
        }
        return Ok(None);
    };
    let line = &buf[..eol];
    let next = eol + 2;
    let word_end = line
        .iter()
        .position(|&c| c == b' ' || c == b'\t')
        .unwrap_or(line.len());
    let verb = &line[..word_end];
    let hmsg = verb.eq_ignore_ascii_case(b"HMSG");
    if hmsg || verb.eq_ignore_ascii_case(b"MSG") {
        // At most five fields: subject, sid, [reply,] [header size,] size.
        let mut fields: [Range<usize>; 6] = Default::default();
        let mut count = 0;
        let mut i = word_end;
        while i < line.len() {
            while i < line.len() && (line[i] == b' ' || line[i] == b'\t') {
                i += 1;
            }
            let s = i;
            while i < line.len() && line[i] != b' ' && line[i] != b'\t' {
                i += 1;
            }
            if s < i {
                if count == fields.len() {
                    return Err(format!("bad MSG line {:?}", String::from_utf8_lossy(line)));
                }
                fields[count] = s..i;
                count += 1;
            }
        }
        let sizes = if hmsg { 2 } else { 1 };
        let (subject, reply) = match count - sizes.min(count) {
            2 => (fields[0].clone(), None),
            3 => (fields[0].clone(), Some(fields[2].clone())),
            _ => return Err(format!("bad MSG line {:?}", String::from_utf8_lossy(line))),
        };
        let num = |r: &Range<usize>| -> Result<usize, String> {
            std::str::from_utf8(&line[r.clone()])
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| format!("bad MSG size in {:?}", String::from_utf8_lossy(line)))
        };
        let n = num(&fields[count - 1])?;
        let h = if hmsg { num(&fields[count - 2])? } else { 0 };
        if h > n {
            return Err(format!(
                "header size over total in {:?}",
                String::from_utf8_lossy(line)
            ));
        }
        if buf.len() < next + n + 2 {
            return Ok(None);
        }
        if &buf[next + n..next + n + 2] != b"\r\n" {
            return Err("MSG payload not followed by CRLF".into());
        }
        let op = Op::Msg {
            subject,
            reply,
            headers: hmsg.then_some(next..next + h),
            payload: next + h..next + n,
        };
        return Ok(Some((op, next + n + 2)));
    }
    let op = if verb.eq_ignore_ascii_case(b"PING") {
        Op::Ping
    } else if verb.eq_ignore_ascii_case(b"PONG") {
        Op::Pong
    } else if verb.eq_ignore_ascii_case(b"+OK") {
        Op::Ok
    } else if verb.eq_ignore_ascii_case(b"-ERR") {
        Op::Err(
            String::from_utf8_lossy(&line[word_end..])
                .trim()
                .to_string(),
        )
    } else if verb.eq_ignore_ascii_case(b"INFO") {
        Op::Info
    } else {
        return Err(format!(
            "unknown operation {:?}",
            String::from_utf8_lossy(line)
        ));
    };
    Ok(Some((op, next)))
}

/// What carries the protocol's bytes.
enum Carrier {
    Tcp(TcpStream),
    /// A WebSocket and the part of the last frame not yet read.
    Ws(Box<WebSocket<TcpStream>>, Bytes),
}

impl Carrier {
    fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        match self {
            Carrier::Tcp(s) => s.read(into),
            Carrier::Ws(ws, rest) => {
                while rest.is_empty() {
                    match ws.read().map_err(ws_err)? {
                        Message::Binary(b) => *rest = b,
                        Message::Text(t) => *rest = t.into(),
                        Message::Close(_) => return Ok(0),
                        _ => {}
                    }
                }
                let n = into.len().min(rest.len());
                into[..n].copy_from_slice(&rest[..n]);
                *rest = rest.slice(n..);
                Ok(n)
            }
        }
    }

    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Carrier::Tcp(s) => s.write_all(data),
            Carrier::Ws(ws, _) => ws
                .send(Message::Binary(Bytes::copy_from_slice(data)))
                .map_err(ws_err),
        }
    }

    fn socket(&self) -> &TcpStream {
        match self {
            Carrier::Tcp(s) => s,
            Carrier::Ws(ws, _) => ws.get_ref(),
        }
    }
}

fn ws_err(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        other => fail(other.to_string()),
    }
}

/// Appends `n` in decimal without allocating.
fn push_decimal(o: &mut Vec<u8>, mut n: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    o.extend_from_slice(&d[i..]);
}

/// A blocking NATS connection.
pub struct Nats {
    sock: Carrier,
    out: Vec<u8>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    inbox: String,
    /// PINGs of ours awaiting their PONG.
    pongs_due: u64,
}

impl Nats {
    /// Connects, reads INFO, sends CONNECT and waits for the PONG that
    /// confirms it. `small` keeps the read buffer small (idle connections).
    /// With `ws`, over WebSocket at `ws://addr/`.
    pub fn connect(addr: &str, ws: bool, small: bool, timeout: Duration) -> io::Result<Nats> {
        let tcp = crate::conn::tcp(addr, timeout)?;
        let sock = if ws {
            let cfg = if small {
                WebSocketConfig::default()
                    .read_buffer_size(4096)
                    .write_buffer_size(0)
            } else {
                WebSocketConfig::default().write_buffer_size(0)
            };
            let (ws, _) =
                tungstenite::client::client_with_config(format!("ws://{addr}/"), tcp, Some(cfg))
                    .map_err(|e| fail(format!("WebSocket handshake with {addr}: {e}")))?;
            Carrier::Ws(Box::new(ws), Bytes::new())
        } else {
            Carrier::Tcp(tcp)
        };
        let room = if small { 1024 } else { 256 * 1024 };
        let inbox = format!("_INBOX.{:016x}", crate::conn::random_u64());
        let mut c = Nats {
            sock,
            out: Vec::with_capacity(if small { 256 } else { 80 * 1024 }),
            buf: vec![0; room],
            start: 0,
            end: 0,
            inbox,
            pongs_due: 0,
        };
        // INFO comes first.
        loop {
            match c.op()? {
                Op::Info => break,
                Op::Err(e) => return Err(fail(format!("server refused: {e}"))),
                _ => {}
            }
        }
        c.out.extend_from_slice(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":true,\"headers\":true,\
              \"lang\":\"rust\",\"version\":\"0.1\",\"protocol\":1}\r\n",
        );
        c.barrier()?;
        Ok(c)
    }

    pub fn inbox(&self) -> &str {
        &self.inbox
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
        }
        let n = self.sock.read(&mut self.buf[self.end..])?;
        if n == 0 {
            return Err(fail("server closed the connection"));
        }
        self.end += n;
        Ok(())
    }

    /// The next operation, reading as needed; keep-alive PINGs are answered
    /// here. MSG payload ranges are absolute in `self.buf`.
    fn op(&mut self) -> io::Result<Op> {
        loop {
            match parse(&self.buf[self.start..self.end]).map_err(fail)? {
                Some((op, used)) => {
                    let base = self.start;
                    self.start += used;
                    match op {
                        Op::Ping => {
                            self.out.extend_from_slice(b"PONG\r\n");
                            self.flush()?;
                        }
                        Op::Ok => {}
                        Op::Msg {
                            subject,
                            reply,
                            headers,
                            payload,
                        } => {
                            let sh = |r: Range<usize>| r.start + base..r.end + base;
                            return Ok(Op::Msg {
                                subject: sh(subject),
                                reply: reply.map(sh),
                                headers: headers.map(sh),
                                payload: sh(payload),
                            });
                        }
                        other => return Ok(other),
                    }
                }
                None => self.fill()?,
            }
        }
    }

    /// The next message or barrier answer.
    pub fn next(&mut self) -> io::Result<Event<'_>> {
        loop {
            match self.op()? {
                Op::Pong => {
                    if self.pongs_due > 0 {
                        self.pongs_due -= 1;
                        return Ok(Event::Pong);
                    }
                }
                Op::Err(e) => return Err(fail(format!("-ERR {e}"))),
                Op::Msg {
                    subject,
                    reply,
                    headers,
                    payload,
                } => {
                    let subj = &self.buf[subject];
                    let pre = self.inbox.as_bytes();
                    if subj.len() > pre.len() + 1
                        && subj.starts_with(pre)
                        && subj[pre.len()] == b'.'
                    {
                        let id = std::str::from_utf8(&subj[pre.len() + 1..])
                            .ok()
                            .and_then(|t| t.parse().ok());
                        if let Some(id) = id {
                            // `raw`: the headers too, if any.
                            let from = headers.map_or(payload.start, |h| h.start);
                            return Ok(Event::Ack {
                                id,
                                data: &self.buf[payload.clone()],
                                raw: &self.buf[from..payload.end],
                            });
                        }
                    }
                    let reply = reply.map(|r| &self.buf[r]);
                    let from = headers.map_or(payload.start, |h| h.start);
                    return Ok(Event::Msg {
                        data: &self.buf[payload.clone()],
                        reply,
                        raw: &self.buf[from..payload.end],
                    });
                }
                Op::Info | Op::Ping | Op::Ok => {}
            }
        }
    }

    pub fn sub(&mut self, subject: &str, queue: Option<&str>, sid: u64) {
        let q = queue.map(|q| format!("{q} ")).unwrap_or_default();
        self.out
            .extend_from_slice(format!("SUB {subject} {q}{sid}\r\n").as_bytes());
    }

    /// Appends one PUB; `reply_id` makes the reply subject this
    /// connection's inbox with that id.
    pub fn publish(
        &mut self,
        subject: &str,
        reply: Option<&[u8]>,
        reply_id: Option<u64>,
        data: &[u8],
    ) {
        let o = &mut self.out;
        o.extend_from_slice(b"PUB ");
        o.extend_from_slice(subject.as_bytes());
        if let Some(r) = reply {
            o.push(b' ');
            o.extend_from_slice(r);
        }
        if let Some(id) = reply_id {
            o.push(b' ');
            o.extend_from_slice(self.inbox.as_bytes());
            o.push(b'.');
            push_decimal(o, id);
        }
        o.push(b' ');
        push_decimal(o, data.len() as u64);
        o.extend_from_slice(b"\r\n");
        o.extend_from_slice(data);
        o.extend_from_slice(b"\r\n");
    }

    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.sock.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends PING (with anything buffered) without waiting.
    pub fn ping(&mut self) -> io::Result<()> {
        self.out.extend_from_slice(b"PING\r\n");
        self.pongs_due += 1;
        self.flush()
    }

    /// PING and wait for its PONG: the server has handled everything before.
    pub fn barrier(&mut self) -> io::Result<()> {
        self.ping()?;
        loop {
            if let Event::Pong = self.next()? {
                return Ok(());
            }
        }
    }

    pub fn socket(&self) -> &TcpStream {
        self.sock.socket()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(buf: &[u8], r: &Range<usize>) -> String {
        String::from_utf8_lossy(&buf[r.clone()]).into_owned()
    }

    #[test]
    fn msg_with_and_without_reply() {
        let buf = b"MSG a.b 7 5\r\nhello\r\nMSG x 1 _INBOX.z.3 2\r\nhi\r\nPING\r\n";
        let (op, n) = parse(buf).unwrap().unwrap();
        match op {
            Op::Msg {
                subject,
                reply,
                payload,
                ..
            } => {
                assert_eq!(text(buf, &subject), "a.b");
                assert_eq!(reply, None);
                assert_eq!(text(buf, &payload), "hello");
            }
            o => panic!("{o:?}"),
        }
        let (op, m) = parse(&buf[n..]).unwrap().unwrap();
        match op {
            Op::Msg {
                reply: Some(r),
                payload,
                ..
            } => {
                assert_eq!(text(&buf[n..], &r), "_INBOX.z.3");
                assert_eq!(text(&buf[n..], &payload), "hi");
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(parse(&buf[n + m..]).unwrap(), Some((Op::Ping, 6)));
    }

    #[test]
    fn msg_with_headers() {
        let head = "NATS/1.0\r\nNats-Sequence: 42\r\n\r\n";
        let buf = format!(
            "HMSG $KV.b.k 1 _INBOX.z.3 {} {}\r\n{head}v1\r\nHMSG a 2 {} {}\r\n{head}\r\n",
            head.len(),
            head.len() + 2,
            head.len(),
            head.len()
        );
        let buf = buf.as_bytes();
        let (op, n) = parse(buf).unwrap().unwrap();
        match op {
            Op::Msg {
                subject,
                reply: Some(r),
                headers: Some(h),
                payload,
            } => {
                assert_eq!(text(buf, &subject), "$KV.b.k");
                assert_eq!(text(buf, &r), "_INBOX.z.3");
                assert_eq!(text(buf, &h), head);
                assert_eq!(text(buf, &payload), "v1");
            }
            o => panic!("{o:?}"),
        }
        match parse(&buf[n..]).unwrap().unwrap().0 {
            Op::Msg {
                reply: None,
                headers: Some(h),
                payload,
                ..
            } => {
                assert_eq!(h.len(), head.len());
                assert!(payload.is_empty());
            }
            o => panic!("{o:?}"),
        }
        assert!(parse(b"HMSG a 1 5 3\r\nabc\r\n").is_err());
    }

    #[test]
    fn decimals() {
        let mut v = Vec::new();
        for n in [0, 7, 128, u64::MAX] {
            v.clear();
            push_decimal(&mut v, n);
            assert_eq!(v, n.to_string().as_bytes());
        }
    }

    #[test]
    fn partial_input_waits_for_more() {
        assert_eq!(parse(b"MSG a 1 10\r\n0123").unwrap(), None);
        assert_eq!(parse(b"PIN").unwrap(), None);
        assert_eq!(parse(b"").unwrap(), None);
    }

    #[test]
    fn other_operations_and_errors() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Some((Op::Ok, 5)));
        assert_eq!(parse(b"pong\r\n").unwrap(), Some((Op::Pong, 6)));
        assert_eq!(parse(b"INFO {\"x\":1}\r\n").unwrap(), Some((Op::Info, 14)));
        assert_eq!(
            parse(b"-ERR 'Unknown Protocol Operation'\r\n").unwrap(),
            Some((Op::Err("'Unknown Protocol Operation'".into()), 35))
        );
        assert!(parse(b"MSG a 1 2 3 4\r\n").is_err());
        assert!(parse(b"MSG a 1 zz\r\n").is_err());
        assert!(parse(b"MSG a 1 2\r\nabXY").is_err());
        assert!(parse(b"HELLO\r\n").is_err());
    }
}
