//! A small bench of the two transports against a running broker: one
//! publisher and one subscriber, both on HTTP long-polling or both on
//! WebSocket. Throughput: `MSGS` fire-and-forget publishes of 128 bytes
//! (polling: 100 packets per POST), timed until the subscriber has them
//! all. Latency: 1000 publishes one at a time, from the publish leaving to
//! the delivery arriving, p50 and p99.
//!
//! ```text
//! cargo run --release --example polling_bench -- 127.0.0.1:8080 [MSGS]
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tungstenite::{Message, WebSocket};

const SIZE: usize = 128;
const BATCH: usize = 100;
const LATENCY_ROUNDS: usize = 1000;

/// A keep-alive HTTP connection speaking Engine.IO polling for one sid.
struct Http {
    stream: TcpStream,
    target: String,
    buf: Vec<u8>,
}

impl Http {
    fn new(addr: &str, sid: &str) -> Http {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Http {
            stream,
            target: format!("/socket.io/?EIO=4&transport=polling&sid={sid}"),
            buf: Vec::new(),
        }
    }

    fn exchange(&mut self, method: &str, target: &str, body: &[u8]) -> String {
        let mut req = format!(
            "{method} {target} HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.stream.write_all(&req).expect("write");
        let mut chunk = [0u8; 65536];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("Content-Length");
                if self.buf.len() >= end + 4 + len {
                    let body =
                        String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).to_string();
                    self.buf.drain(..end + 4 + len);
                    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                    return body;
                }
            }
            let n = self.stream.read(&mut chunk).expect("read");
            assert!(n > 0, "connection closed during {method} {target}");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn get(&mut self) -> String {
        let t = self.target.clone();
        self.exchange("GET", &t, b"")
    }

    fn post(&mut self, body: &str) {
        let t = self.target.clone();
        assert_eq!(self.exchange("POST", &t, body.as_bytes()), "ok");
    }
}

/// Opens a polling session joined to `/`; returns the GET and POST sides.
fn polling_client(addr: &str) -> (Http, Http) {
    let mut h = Http::new(addr, "");
    let open = h.exchange("GET", "/socket.io/?EIO=4&transport=polling", b"");
    let sid = serde_json::from_str::<serde_json::Value>(&open[1..]).expect("open")["sid"]
        .as_str()
        .expect("sid")
        .to_string();
    let mut getter = Http::new(addr, &sid);
    let mut poster = Http::new(addr, &sid);
    poster.post("40");
    assert!(getter.get().starts_with("40"));
    (getter, poster)
}

fn ws_client(addr: &str) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let url = format!("ws://{addr}/socket.io/?EIO=4&transport=websocket");
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).expect("upgrade");
    ws.read().expect("open");
    ws.send(Message::text("40")).expect("send");
    ws.read().expect("connect");
    ws
}

fn pub_event(i: usize) -> String {
    let data = format!("{i:0>width$}", width = SIZE);
    format!(r#"42["pub",{{"subject":"bench.x","data":"{data}"}}]"#)
}

/// Counts `msg` deliveries in a payload or frame.
fn count_msgs(text: &str) -> usize {
    text.matches("42[\"msg\"").count()
}

enum Side {
    Polling(Http, Http),
    Ws(WebSocket<TcpStream>),
}

impl Side {
    fn open(addr: &str, polling: bool) -> Side {
        if polling {
            let (g, p) = polling_client(addr);
            Side::Polling(g, p)
        } else {
            Side::Ws(ws_client(addr))
        }
    }

    fn subscribe(&mut self) {
        let sub = r#"421["sub",{"subject":"bench.>"}]"#;
        match self {
            Side::Polling(g, p) => {
                p.post(sub);
                while !g.get().contains("431[") {}
            }
            Side::Ws(ws) => {
                ws.send(Message::text(sub)).expect("send");
                while !matches!(ws.read().expect("ack"), Message::Text(t) if t.starts_with("431["))
                {
                }
            }
        }
    }

    fn publish(&mut self, events: &[String]) {
        match self {
            Side::Polling(_, p) => p.post(&events.join("\x1e")),
            Side::Ws(ws) => {
                for e in events {
                    ws.write(Message::text(e.as_str())).expect("write");
                }
                ws.flush().expect("flush");
            }
        }
    }

    /// Deliveries in the next GET answer or frame (pings answered).
    fn receive(&mut self) -> usize {
        match self {
            Side::Polling(g, p) => {
                let body = g.get();
                if body.split('\x1e').any(|t| t == "2") {
                    p.post("3");
                }
                count_msgs(&body)
            }
            Side::Ws(ws) => match ws.read().expect("read") {
                Message::Text(t) if t.as_str() == "2" => {
                    ws.send(Message::text("3")).expect("pong");
                    0
                }
                Message::Text(t) => count_msgs(t.as_str()),
                _ => 0,
            },
        }
    }
}

fn run(addr: &str, polling: bool, msgs: usize) {
    let name = if polling { "polling" } else { "websocket" };
    let mut sub = Side::open(addr, polling);
    sub.subscribe();
    let mut publisher = Side::open(addr, polling);
    let (tx, rx) = mpsc::channel::<Instant>();
    let total = msgs + LATENCY_ROUNDS;
    // The receiver reports once when the bulk part is in, then once per
    // latency message.
    let receiver = std::thread::spawn(move || {
        let mut seen = 0;
        let mut bulk_done = false;
        while seen < total {
            let n = sub.receive();
            if n == 0 {
                continue;
            }
            seen += n;
            let now = Instant::now();
            if bulk_done {
                for _ in 0..n {
                    let _ = tx.send(now);
                }
            } else if seen >= msgs {
                bulk_done = true;
                let _ = tx.send(now);
            }
        }
    });
    let started = Instant::now();
    let mut sent = 0;
    while sent < msgs {
        let n = BATCH.min(msgs - sent);
        let batch: Vec<String> = (sent..sent + n).map(pub_event).collect();
        publisher.publish(&batch);
        sent += n;
    }
    let done = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("bulk delivered");
    let bulk = done.saturating_duration_since(started);
    let mut lat = Vec::with_capacity(LATENCY_ROUNDS);
    for i in 0..LATENCY_ROUNDS {
        let t0 = Instant::now();
        publisher.publish(&[pub_event(i)]);
        let at = rx.recv_timeout(Duration::from_secs(10)).expect("delivery");
        lat.push(at.saturating_duration_since(t0));
    }
    receiver.join().expect("receiver");
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
    println!(
        "{name:>9}: {msgs} msgs in {bulk:?}: {:.0} msg/s; publish-to-delivery latency p50 {:?} p99 {:?}",
        msgs as f64 / bulk.as_secs_f64(),
        p(0.5),
        p(0.99)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let msgs: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    run(&addr, true, msgs);
    run(&addr, false, msgs);
}
