//! Socket.IO v5 over Engine.IO v4, straight over WebSocket (no polling
//! phase): the blocking client side of the messaging events gombus and the
//! relay speak (`sub`, `pub`, `request`, `ping`, `stream.create`, `msg`).
//! Received frames are not parsed as JSON: the fields a benchmark needs
//! (`data`, `reply`, an ack's id) are found by substring search, which
//! works because bench bodies hold neither quotes nor escapes.

use std::io;
use std::net::TcpStream;
use std::time::Duration;

use memchr::memmem;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Bytes, Message, WebSocket};

use crate::conn::{fail, Event};

/// Ack ids at or above this belong to barriers.
const BARRIER_IDS: u64 = 1 << 52;

pub struct Sio {
    ws: WebSocket<TcpStream>,
    /// The frame the last event points into.
    cur: Bytes,
    pending: usize,
    barrier_id: u64,
    barriers_due: u64,
}

fn ws_err(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        other => fail(other.to_string()),
    }
}

/// The JSON string value after `key` (e.g. `"data":"`), up to its closing quote.
pub fn string_field<'a>(frame: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let at = memmem::find(frame, key)? + key.len();
    let len = memchr::memchr(b'"', &frame[at..])?;
    Some(&frame[at..at + len])
}

/// A `43<id>[…]` ack's id and the rest of the frame.
pub fn parse_ack(frame: &[u8]) -> Option<(u64, &[u8])> {
    let digits = frame
        .get(2..)?
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if !frame.starts_with(b"43") || digits == 0 || digits > 19 {
        return None;
    }
    let id = std::str::from_utf8(&frame[2..2 + digits])
        .ok()?
        .parse()
        .ok()?;
    Some((id, &frame[2 + digits..]))
}

impl Sio {
    /// Opens the WebSocket, reads the Engine.IO open packet and joins `/`.
    pub fn connect(addr: &str, small: bool, timeout: Duration) -> io::Result<Sio> {
        let sock = crate::conn::tcp(addr, timeout)?;
        let cfg = if small {
            WebSocketConfig::default()
                .read_buffer_size(4096)
                .write_buffer_size(0)
        } else {
            WebSocketConfig::default().write_buffer_size(64 * 1024)
        };
        let url = format!("ws://{addr}/socket.io/?EIO=4&transport=websocket");
        let (ws, _) = tungstenite::client::client_with_config(url, sock, Some(cfg))
            .map_err(|e| fail(format!("WebSocket handshake with {addr}: {e}")))?;
        let mut c = Sio {
            ws,
            cur: Bytes::new(),
            pending: 0,
            barrier_id: BARRIER_IDS,
            barriers_due: 0,
        };
        let open = c.frame()?;
        if !open.starts_with(b"0{") {
            return Err(fail(format!(
                "expected the Engine.IO open packet, got {:?}",
                String::from_utf8_lossy(&open)
            )));
        }
        // GOMBUS_BENCH_TOKEN names a user of the broker's -users file (or
        // its -auth-token): the CONNECT carries it as `{"token":…}`.
        let connect = match std::env::var("GOMBUS_BENCH_TOKEN") {
            Ok(t) if !t.is_empty() => format!("40{}", serde_json::json!({ "token": t })),
            _ => "40".to_string(),
        };
        c.text(connect)?;
        c.flush()?;
        loop {
            let f = c.frame()?;
            if f.starts_with(b"40") {
                return Ok(c);
            }
            if f.starts_with(b"44") {
                return Err(fail(format!(
                    "CONNECT refused: {}",
                    String::from_utf8_lossy(&f)
                )));
            }
        }
    }

    /// The next text frame, answering Engine.IO pings on the way.
    fn frame(&mut self) -> io::Result<Bytes> {
        loop {
            match self.ws.read().map_err(ws_err)? {
                Message::Text(t) => {
                    let b: Bytes = t.into();
                    match b.as_ref() {
                        b"2" => {
                            self.text("3".to_string())?;
                            self.flush()?;
                        }
                        b"1" => return Err(fail("the server closed the Engine.IO session")),
                        _ => return Ok(b),
                    }
                }
                Message::Close(_) => return Err(fail("the server closed the WebSocket")),
                _ => {}
            }
        }
    }

    /// The next delivery, ack or barrier answer.
    pub fn next(&mut self) -> io::Result<Event<'_>> {
        loop {
            let f = self.frame()?;
            if f.starts_with(b"42[\"msg\"") {
                self.cur = f;
                let b = self.cur.as_ref();
                let data = string_field(b, b"\"data\":\"").unwrap_or(b"");
                let reply = string_field(b, b"\"reply\":\"");
                return Ok(Event::Msg {
                    data,
                    reply,
                    raw: b,
                });
            }
            if let Some((id, _)) = parse_ack(&f) {
                if id >= BARRIER_IDS {
                    self.barriers_due = self.barriers_due.saturating_sub(1);
                    return Ok(Event::Pong);
                }
                self.cur = f;
                let raw = &self.cur.as_ref()[2..];
                let data = string_field(raw, b"\"data\":\"").unwrap_or(b"");
                return Ok(Event::Ack { id, data, raw });
            }
            if f.starts_with(b"44") {
                return Err(fail(format!(
                    "connect error: {}",
                    String::from_utf8_lossy(&f)
                )));
            }
        }
    }

    pub fn text(&mut self, s: String) -> io::Result<()> {
        self.pending += s.len();
        self.ws.write(Message::Text(s.into())).map_err(ws_err)
    }

    /// An event `name` with an ack id (or none) and its argument object,
    /// given as JSON text.
    pub fn emit(&mut self, id: Option<u64>, name: &str, arg: &str) -> io::Result<()> {
        let id = id.map(|i| i.to_string()).unwrap_or_default();
        self.text(format!("42{id}[\"{name}\",{arg}]"))
    }

    /// `pub` of a body (as a JSON string) to `subject`.
    pub fn publish(&mut self, subject: &[u8], data: &[u8], id: Option<u64>) -> io::Result<()> {
        let mut s = String::with_capacity(48 + subject.len() + data.len());
        s.push_str("42");
        if let Some(id) = id {
            s.push_str(&id.to_string());
        }
        s.push_str("[\"pub\",{\"subject\":\"");
        s.push_str(std::str::from_utf8(subject).map_err(|_| fail("subject is not UTF-8"))?);
        s.push_str("\",\"data\":\"");
        s.push_str(std::str::from_utf8(data).map_err(|_| fail("body is not UTF-8"))?);
        s.push_str("\"}]");
        self.text(s)
    }

    pub fn buffered(&self) -> usize {
        self.pending
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.pending = 0;
        self.ws.flush().map_err(ws_err)
    }

    /// Sends a `ping` event with a barrier ack id, without waiting.
    pub fn ping(&mut self) -> io::Result<()> {
        self.barrier_id += 1;
        self.barriers_due += 1;
        let id = self.barrier_id;
        self.emit(Some(id), "ping", "{}")?;
        self.flush()
    }

    /// `ping` and wait for its ack: the server has handled every earlier event.
    pub fn barrier(&mut self) -> io::Result<()> {
        self.ping()?;
        loop {
            if let Event::Pong = self.next()? {
                return Ok(());
            }
        }
    }

    /// Sends an event with ack id `id` and waits for that ack, returning its
    /// text (`[{…}]`).
    pub fn call(&mut self, id: u64, name: &str, arg: &str) -> io::Result<String> {
        self.emit(Some(id), name, arg)?;
        self.flush()?;
        loop {
            if let Event::Ack { id: got, raw, .. } = self.next()? {
                if got == id {
                    return Ok(String::from_utf8_lossy(raw).into_owned());
                }
            }
        }
    }

    pub fn socket(&self) -> &TcpStream {
        self.ws.get_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_a_delivery() {
        let f = br#"42["msg",{"sid":"s1","subject":"bench.req","data":"0000000007xx","reply":"_INBOX.n.ab.4"}]"#;
        assert_eq!(string_field(f, b"\"data\":\""), Some(&b"0000000007xx"[..]));
        assert_eq!(
            string_field(f, b"\"reply\":\""),
            Some(&b"_INBOX.n.ab.4"[..])
        );
        assert_eq!(
            string_field(b"42[\"msg\",{\"data\":null}]", b"\"data\":\""),
            None
        );
    }

    #[test]
    fn ack_ids() {
        assert_eq!(
            parse_ack(br#"4317[{"ok":true}]"#),
            Some((17, &br#"[{"ok":true}]"#[..]))
        );
        assert_eq!(parse_ack(b"42[\"msg\"]"), None);
        assert_eq!(parse_ack(b"43[]"), None);
    }
}
