//! Flow control: a publisher that outruns a subscriber which reads slowly
//! but steadily is paused until the subscriber catches up, instead of the
//! subscriber being cut off as a slow consumer. Raw sockets on both sides,
//! so the publisher can write far faster than the subscriber reads.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Broker;

/// Messages published, each about 1 KiB: far more than the subscriber's
/// queue bound (1 MiB) plus what the kernel's socket buffers can hold.
const MESSAGES: usize = 16_000;
/// The subscriber reads this many bytes per read call: slow, but steady.
const SLOW_READ_BYTES: usize = 32;
const WAIT: Duration = Duration::from_secs(60);

/// A masked client text frame (RFC 6455 §5.2, §5.3).
fn client_frame(out: &mut Vec<u8>, text: &[u8]) {
    const MASK: [u8; 4] = [0x11, 0x22, 0x33, 0x44];
    out.push(0x81);
    let n = text.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else {
        assert!(n < 65536);
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
    out.extend_from_slice(&MASK);
    out.extend(text.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
}

/// A raw WebSocket with a reader that takes `chunk` bytes per read call.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
    chunk: usize,
}

impl Raw {
    fn open(addr: &str, chunk: usize) -> Raw {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let req = format!(
            "GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).expect("upgrade");
        let mut raw = Raw {
            stream,
            buf: Vec::new(),
            chunk,
        };
        let end = loop {
            if let Some(p) = raw.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            raw.fill();
        };
        assert!(raw.buf.starts_with(b"HTTP/1.1 101"), "no upgrade");
        raw.buf.drain(..end);
        let open = raw.next_text();
        assert!(open.starts_with("0{"), "{open}");
        raw.send("40");
        let connected = raw.next_text();
        assert!(connected.starts_with("40{"), "{connected}");
        raw
    }

    fn fill(&mut self) {
        let mut chunk = vec![0u8; self.chunk];
        let n = self.stream.read(&mut chunk).expect("read");
        assert!(n > 0, "the broker closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    fn send(&mut self, text: &str) {
        let mut frame = Vec::new();
        client_frame(&mut frame, text.as_bytes());
        self.stream.write_all(&frame).expect("send");
    }

    /// The next text frame from the server (unmasked, unfragmented here).
    fn next_text(&mut self) -> String {
        loop {
            if self.buf.len() >= 2 {
                let (len, head) = match self.buf[1] & 0x7f {
                    126 if self.buf.len() >= 4 => {
                        (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
                    }
                    127 => panic!("unexpectedly large frame"),
                    126 => (usize::MAX, 0),
                    n => (n as usize, 2),
                };
                if len != usize::MAX && self.buf.len() >= head + len {
                    let opcode = self.buf[0] & 0x0f;
                    let payload = self.buf[head..head + len].to_vec();
                    self.buf.drain(..head + len);
                    assert_eq!(opcode, 1, "expected a text frame");
                    let text = String::from_utf8(payload).expect("utf-8");
                    if text == "2" {
                        self.send("3");
                        continue;
                    }
                    return text;
                }
            }
            self.fill();
        }
    }
}

#[test]
fn a_fast_publisher_is_paced_to_a_slow_subscriber() {
    let broker = Broker::start(&["-max-pending=1MiB"]);
    let mut sub = Raw::open(&broker.addr, SLOW_READ_BYTES);
    sub.send(r#"421["sub",{"subject":"bulk","sid":"s"}]"#);
    assert_eq!(sub.next_text(), r#"431[{"ok":true,"sid":"s"}]"#);

    let mut publisher = Raw::open(&broker.addr, 4096);
    let filler = "x".repeat(1000);
    let mut frames = Vec::with_capacity(MESSAGES * 1100);
    for i in 0..MESSAGES {
        let event = format!(r#"42["pub",{{"subject":"bulk","data":"{i:08}{filler}"}}]"#);
        client_frame(&mut frames, event.as_bytes());
    }
    let deadline = Instant::now() + WAIT;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            // All of it at once: the kernel takes it as the broker reads.
            publisher.stream.write_all(&frames).expect("publish");
            publisher.send(r#"429["ping",{}]"#);
            assert_eq!(publisher.next_text(), r#"439[{"ok":true}]"#);
        });
        for i in 0..MESSAGES {
            assert!(Instant::now() < deadline, "only {i} messages in {WAIT:?}");
            let msg = sub.next_text();
            let expected = format!(r#"42["msg",{{"sid":"s","subject":"bulk","data":"{i:08}"#);
            assert!(
                msg.starts_with(&expected),
                "message {i}: {}",
                &msg[..msg.len().min(80)]
            );
        }
    });
    // The subscriber was never cut off.
    sub.send(r#"425["ping",{}]"#);
    assert_eq!(sub.next_text(), r#"435[{"ok":true}]"#);
}

/// Non-reading subscribers to the global outbound budget test.
const IDLE_SUBSCRIBERS: usize = 40;
/// Messages published there, each 8000 bytes of data: about 7 MiB to every
/// subscriber, more than a non-reading socket's kernel buffers take (about
/// 4 MB on loopback) but less than that plus its own bound (4 MiB), so
/// only the global budget can cut them.
const BUDGET_MESSAGES: usize = 900;
/// The publisher waits for an ack after this many messages.
const BUDGET_BATCH: usize = 16;

/// What became of a subscriber that did not read.
#[derive(Debug, PartialEq)]
enum Fate {
    Cut,
    Served,
}

impl Raw {
    /// Asks for a ping ack, then reads what is queued: the connection was
    /// cut if it ends (or the ask fails) before the ack arrives.
    fn fate(&mut self) -> Fate {
        let mut frame = Vec::new();
        client_frame(&mut frame, br#"427["ping",{}]"#);
        if self.stream.write_all(&frame).is_err() {
            return Fate::Cut;
        }
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Fate::Cut,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Fate::Cut,
                Err(e) => panic!("reading a subscriber: {e}"),
            }
            // Whole frames are dropped from the front; the ack is the last.
            loop {
                if self.buf.len() < 4 {
                    break;
                }
                let (len, head) = match self.buf[1] & 0x7f {
                    126 => (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4),
                    127 => panic!("unexpectedly large frame"),
                    n => (n as usize, 2),
                };
                if self.buf.len() < head + len {
                    break;
                }
                let is_ack = &self.buf[head..head + len] == br#"437[{"ok":true}]"#;
                self.buf.drain(..head + len);
                if is_ack {
                    return Fate::Served;
                }
            }
        }
    }
}

/// The value of the broker's slow-consumer counter in `/metrics`.
fn slow_consumers(addr: &str) -> u64 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).expect("GET /metrics");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read /metrics");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            name.contains("slow")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .map_or_else(
            || panic!("no slow-consumer metric in:\n{body}"),
            |v| v as u64,
        )
}

#[test]
fn many_subscribers_that_never_read_are_cut_at_the_global_budget() {
    let broker = Broker::start(&["-max-pending=4MiB", "-max-pending-total=8MiB"]);
    let subscribe = |raw: &mut Raw| {
        raw.send(r#"421["sub",{"subject":"bulk","sid":"s"}]"#);
        assert_eq!(raw.next_text(), r#"431[{"ok":true,"sid":"s"}]"#);
    };
    let mut idle: Vec<Raw> = (0..IDLE_SUBSCRIBERS)
        .map(|_| {
            let mut raw = Raw::open(&broker.addr, 4096);
            subscribe(&mut raw);
            raw
        })
        .collect();
    let mut reader = Raw::open(&broker.addr, 64 * 1024);
    subscribe(&mut reader);
    let mut publisher = Raw::open(&broker.addr, 4096);
    let slow_before = slow_consumers(&broker.addr);
    let rss_before = broker.rss_kb();
    assert!(rss_before > 0, "cannot read the broker's memory");

    let filler = "x".repeat(8000 - 8);
    let deadline = Instant::now() + WAIT;
    let mut rss_peak = rss_before;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0..BUDGET_MESSAGES {
                assert!(Instant::now() < deadline, "only {i} messages in {WAIT:?}");
                let msg = reader.next_text();
                let expected = format!(r#"42["msg",{{"sid":"s","subject":"bulk","data":"{i:08}"#);
                assert!(
                    msg.starts_with(&expected),
                    "message {i}: {}",
                    &msg[..msg.len().min(80)]
                );
            }
        });
        for batch in 0..BUDGET_MESSAGES / BUDGET_BATCH + 1 {
            let mut frames = Vec::new();
            let first = batch * BUDGET_BATCH;
            for i in first..(first + BUDGET_BATCH).min(BUDGET_MESSAGES) {
                let event = format!(r#"42["pub",{{"subject":"bulk","data":"{i:08}{filler}"}}]"#);
                client_frame(&mut frames, event.as_bytes());
            }
            client_frame(&mut frames, br#"429["ping",{}]"#);
            publisher.stream.write_all(&frames).expect("publish");
            assert_eq!(publisher.next_text(), r#"439[{"ok":true}]"#);
            rss_peak = rss_peak.max(broker.rss_kb());
        }
    });

    // Without the budget the idle subscribers would queue about 3 MB each
    // (120 MB in all); with it the queues stay near 8 MiB in all.
    let grown_mib = rss_peak.saturating_sub(rss_before) / 1024;
    assert!(
        grown_mib < 48,
        "the broker grew by {grown_mib} MiB (from {rss_before} KiB)"
    );
    let fates: Vec<Fate> = idle.iter_mut().map(Raw::fate).collect();
    let cut = fates.iter().filter(|f| **f == Fate::Cut).count() as u64;
    assert!(
        cut >= 30,
        "only {cut} of {IDLE_SUBSCRIBERS} idle subscribers were cut"
    );
    let counted = slow_consumers(&broker.addr) - slow_before;
    assert_eq!(counted, cut, "slow consumers counted in /metrics");

    // The reader was never cut, and a new client is served.
    reader.send(r#"425["ping",{}]"#);
    assert_eq!(reader.next_text(), r#"435[{"ok":true}]"#);
    let mut fresh = Raw::open(&broker.addr, 4096);
    subscribe(&mut fresh);
    fresh.send(r#"426["ping",{}]"#);
    assert_eq!(fresh.next_text(), r#"436[{"ok":true}]"#);
}
