//! Two protocol edges checked on raw sockets (docs/PROTOCOL.md §1):
//!
//! - A WebSocket close frame with a status code a peer must not send
//!   (RFC 6455 §7.4: 0–999, 1004–1006, 1014, 1015, 1016–2999, 5000 and
//!   above) or a one-byte payload (§5.5.1) is a protocol error: the broker
//!   answers close 1002, not 1000. A valid code is answered 1000.
//! - A request head with bare-LF line endings gets a prompt 400 rather than
//!   waiting for the idle cut.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Broker;

const WAIT: Duration = Duration::from_secs(5);

/// Reads until `done` accepts what arrived, EOF, or `WAIT` passes.
fn read_until(s: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !done(&got) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    got
}

/// A WebSocket session after the handshake, with what followed the 101.
fn ws_open(addr: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(
        b"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\n\
          Upgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .expect("write");
    let got = read_until(&mut s, |b| b.windows(4).any(|w| w == b"\r\n\r\n"));
    let end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("101 head")
        + 4;
    assert!(
        got.starts_with(b"HTTP/1.1 101 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    (s, got[end..].to_vec())
}

/// A masked client frame.
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x11, 0x22, 0x33, 0x44];
    let mut out = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// The server frames (unmasked) in `buf`, as (opcode, payload); stops at
/// a partial frame.
fn frames(buf: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while buf.len() >= pos + 2 {
        let opcode = buf[pos] & 0x0f;
        let (len, head) = match buf[pos + 1] & 0x7f {
            126 if buf.len() >= pos + 4 => {
                (u16::from_be_bytes([buf[pos + 2], buf[pos + 3]]) as usize, 4)
            }
            126 | 127 => break,
            n => (n as usize, 2),
        };
        if buf.len() < pos + head + len {
            break;
        }
        out.push((opcode, buf[pos + head..pos + head + len].to_vec()));
        pos += head + len;
    }
    out
}

/// Sends a close frame with `payload` and returns the code of the
/// broker's close frame (None if none came).
fn close_answer(addr: &str, payload: &[u8]) -> Option<u16> {
    let (mut s, mut got) = ws_open(addr);
    s.write_all(&frame(0x8, payload)).expect("write close");
    let has_close = |b: &[u8]| frames(b).iter().any(|(op, _)| *op == 0x8);
    if !has_close(&got) {
        let more = read_until(&mut s, |b| {
            let mut all = got.clone();
            all.extend_from_slice(b);
            has_close(&all)
        });
        got.extend(more);
    }
    frames(&got)
        .into_iter()
        .find(|(op, _)| *op == 0x8)
        .and_then(|(_, p)| p.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])))
}

#[test]
fn invalid_close_codes_and_a_one_byte_close_are_answered_1002() {
    let broker = Broker::start(&[]);
    let mut wrong = Vec::new();
    for code in [
        0u16, 999, 1004, 1005, 1006, 1014, 1015, 1016, 2000, 2999, 5000, 65535,
    ] {
        let got = close_answer(&broker.addr, &code.to_be_bytes());
        if got != Some(1002) {
            wrong.push(format!("close {code}: answered {got:?}"));
        }
    }
    let got = close_answer(&broker.addr, &[0x03]);
    if got != Some(1002) {
        wrong.push(format!("one-byte close: answered {got:?}"));
    }
    for code in [1000u16, 1001, 3000, 4999] {
        let got = close_answer(&broker.addr, &code.to_be_bytes());
        if got != Some(1000) {
            wrong.push(format!("valid close {code}: answered {got:?}"));
        }
    }
    let got = close_answer(&broker.addr, &[]);
    if got != Some(1000) {
        wrong.push(format!("empty close: answered {got:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_bare_lf_request_head_gets_a_prompt_400() {
    let broker = Broker::start(&[]);
    for head in [
        &b"GET / HTTP/1.1\nHost: x\n\n"[..],
        b"GET /healthz HTTP/1.1\nHost: x\n\n",
        b"GET /socket.io/?EIO=4&transport=polling HTTP/1.1\r\nHost: x\n\n",
    ] {
        let started = Instant::now();
        let mut s = TcpStream::connect(&broker.addr).expect("connect");
        s.write_all(head).expect("write");
        let got = read_until(&mut s, |b| b.windows(4).any(|w| w == b"\r\n\r\n"));
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 400 "),
            "{:?}: answered {text:?} after {:?}",
            String::from_utf8_lossy(head),
            started.elapsed()
        );
    }
    // A well-formed request on a fresh connection is served as ever.
    let mut s = TcpStream::connect(&broker.addr).expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let got = read_until(&mut s, |_| false);
    assert!(
        got.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}
