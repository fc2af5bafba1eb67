//! A raw Engine.IO (v3 or v4) / Socket.IO client over WebSocket for tests
//! that send exactly the packets they mean, valid or not. Every read has a
//! deadline.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::{Message, WebSocket};

/// Bound on any single expected packet.
pub const WAIT: Duration = Duration::from_secs(5);

pub struct Ws {
    ws: WebSocket<TcpStream>,
    eio: u8,
    next_id: u64,
    /// Socket.IO packets received and not yet taken.
    pub inbox: Vec<String>,
}

impl Ws {
    /// Opens the session; for v3 also takes the implicit `40` join.
    pub fn open(addr: &str, eio: u8) -> Ws {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let url = format!("ws://{addr}/socket.io/?EIO={eio}&transport=websocket");
        let (ws, _) = tungstenite::client(url.as_str(), stream).expect("upgrade");
        let mut c = Ws {
            ws,
            eio,
            next_id: 1,
            inbox: Vec::new(),
        };
        let open = c.read_raw(Instant::now() + WAIT).expect("open packet");
        assert!(open.starts_with("0{"), "open packet: {open}");
        if eio == 3 {
            let join = c.next(|p| p.starts_with('0'));
            assert_eq!(join, "0", "Engine.IO v3 joins / at once");
        }
        c
    }

    /// `open` then (v4) a CONNECT to `/`.
    pub fn join(addr: &str) -> Ws {
        let mut c = Ws::open(addr, 4);
        c.connect();
        c
    }

    /// Sends a CONNECT to `/` (`40`) and waits for the broker's answer
    /// (CONNECT or CONNECT_ERROR).
    pub fn connect(&mut self) -> String {
        self.send("0");
        self.next(|p| p.starts_with('0') || p.starts_with('4'))
    }

    /// Sends one Socket.IO packet (inside an Engine.IO message `4…`).
    pub fn send(&mut self, packet: &str) {
        self.ws
            .send(Message::text(format!("4{packet}")))
            .expect("send");
    }

    /// One Engine.IO text message (without answering anything), or None
    /// once `deadline` passed.
    pub fn read_raw(&mut self, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.ws
                .get_ref()
                .set_read_timeout(Some(left))
                .expect("read timeout");
            match self.ws.read() {
                Ok(Message::Text(t)) => return Some(t.to_string()),
                Ok(Message::Close(f)) => panic!("closed by the broker: {f:?}"),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    return None;
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The first Socket.IO packet `pick` accepts, reading as needed.
    pub fn next(&mut self, pick: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.inbox.iter().position(|p| pick(p)) {
                return self.inbox.remove(i);
            }
            let text = self
                .read_raw(deadline)
                .unwrap_or_else(|| panic!("no such packet; have {:?}", self.inbox));
            match text.as_str() {
                "2" if self.eio == 4 => self.ws.send(Message::text("3")).expect("pong"),
                t => {
                    if let Some(p) = t.strip_prefix('4') {
                        self.inbox.push(p.to_string());
                    }
                }
            }
        }
    }

    /// Emits `event` with `arg` on `/` and waits for its ack's argument.
    pub fn call(&mut self, event: &str, arg: &str) -> Value {
        self.call_raw("", &format!("[\"{event}\",{arg}]"))
    }

    /// Emits the event array `data` (as is) on namespace prefix `nsp`
    /// (`""` for `/`, `"/control,"`) and waits for its ack's argument.
    pub fn call_raw(&mut self, nsp: &str, data: &str) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&format!("2{nsp}{id}{data}"));
        let head = format!("3{nsp}{id}[");
        let ack = self.next(|p| p.starts_with(&head));
        let args: Value = serde_json::from_str(&ack[head.len() - 1..]).expect("ack JSON");
        args[0].clone()
    }

    /// Takes every `msg` delivery received so far as (sid, data).
    pub fn take_msgs(&mut self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        self.inbox.retain(|p| {
            let Some(body) = p.strip_prefix("2[\"msg\",") else {
                return true;
            };
            let v: Value = serde_json::from_str(&format!("[{body}")).expect("msg JSON");
            let m = &v[0];
            out.push((
                m["sid"].as_str().unwrap_or_default().to_string(),
                m["data"].clone(),
            ));
            false
        });
        out
    }

    /// Sends a WebSocket close and drops the connection.
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}
