//! The WebSocket opening handshake as RFC 6455 §4.2.1 wants it checked
//! (docs/PROTOCOL.md section 1), from outside with raw requests: a key
//! that is not the base64 of 16 bytes, or no key, gets 400 with the
//! Engine.IO error body; a version other than 13, or none, gets 426 with
//! `Sec-WebSocket-Version: 13`. Both on a direct WebSocket connection and
//! on the upgrade of a polling session, for Engine.IO 4 and 3; a valid key
//! still gets 101 with the right accept value.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Broker;

const GOOD_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// RFC 6455's example answer to `GOOD_KEY`.
const GOOD_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
const BAD_REQUEST: &str = r#"{"code":3,"message":"Bad request"}"#;

/// Sends raw bytes and reads the whole answer (the server closes after it).
fn exchange(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(request.as_bytes()).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends an upgrade request and reads until the end of the response head
/// (a 101 keeps the connection open, so no read to the end).
fn upgrade_head(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    s.write_all(request.as_bytes()).expect("write");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    let mut chunk = [0u8; 1024];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(Instant::now() < deadline, "no response head: {out:?}");
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An upgrade request for `target` with the given extra header lines.
fn request(target: &str, headers: &[&str]) -> String {
    let mut r = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    );
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r
}

/// Opens a polling session with Engine.IO version `eio`; its sid.
fn polling_sid(addr: &str, eio: u8) -> String {
    let answer = exchange(
        addr,
        &format!("GET /socket.io/?EIO={eio}&transport=polling HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let after = answer
        .split_once(r#""sid":""#)
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no sid in {answer}"));
    after.split('"').next().unwrap_or_default().to_string()
}

/// The four ways to reach the WebSocket transport: direct and as the
/// upgrade of a polling session, in Engine.IO 4 and 3.
fn targets(addr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for eio in [4, 3] {
        out.push(format!("/socket.io/?EIO={eio}&transport=websocket"));
        let sid = polling_sid(addr, eio);
        out.push(format!(
            "/socket.io/?EIO={eio}&transport=websocket&sid={sid}"
        ));
    }
    out
}

#[test]
fn keys_that_are_not_16_bytes_of_base64_get_400() {
    let b = Broker::start(&[]);
    for target in targets(&b.addr) {
        for key in [
            Some("not-base64!!"),
            Some("dGhlIHNhbXBsZSBub25jZXg="), // 17 bytes
            Some("dGhlIHNhbXBsZSBub25j"),     // 15 bytes
            Some("dGhlIHNhbXBsZSBub25jZQ"),   // no padding
            Some(""),
            None,
        ] {
            let key_line = key.map(|k| format!("Sec-WebSocket-Key: {k}"));
            let mut headers = vec!["Sec-WebSocket-Version: 13"];
            headers.extend(key_line.as_deref());
            let answer = exchange(&b.addr, &request(&target, &headers));
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{target} key {key:?}: {answer}"
            );
            assert!(
                answer.contains("Content-Type: application/json\r\n"),
                "{target} key {key:?}: {answer}"
            );
            assert!(
                answer.ends_with(BAD_REQUEST),
                "{target} key {key:?}: {answer}"
            );
        }
    }
    assert!(exchange(&b.addr, "GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn versions_other_than_13_get_426_naming_13() {
    let b = Broker::start(&[]);
    let key = format!("Sec-WebSocket-Key: {GOOD_KEY}");
    for target in targets(&b.addr) {
        for version in [Some("8"), Some("14"), Some("13, 8"), Some(""), None] {
            let version_line = version.map(|v| format!("Sec-WebSocket-Version: {v}"));
            let mut headers = vec![key.as_str()];
            headers.extend(version_line.as_deref());
            let answer = exchange(&b.addr, &request(&target, &headers));
            assert!(
                answer.starts_with("HTTP/1.1 426 Upgrade Required\r\n"),
                "{target} version {version:?}: {answer}"
            );
            assert!(
                answer.contains("\r\nSec-WebSocket-Version: 13\r\n"),
                "{target} version {version:?}: {answer}"
            );
            assert!(
                answer.ends_with(BAD_REQUEST),
                "{target} version {version:?}: {answer}"
            );
        }
    }
}

#[test]
fn a_valid_key_still_gets_101_after_refusals() {
    let b = Broker::start(&[]);
    for target in targets(&b.addr) {
        // A refused attempt first: a polling session stays upgradable.
        let refused = exchange(
            &b.addr,
            &request(
                &target,
                &["Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: x"],
            ),
        );
        assert!(refused.starts_with("HTTP/1.1 400 "), "{target}: {refused}");
        let head = upgrade_head(
            &b.addr,
            &request(
                &target,
                &[
                    "Sec-WebSocket-Version: 13",
                    &format!("Sec-WebSocket-Key: {GOOD_KEY}"),
                ],
            ),
        );
        assert!(
            head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
            "{target}: {head}"
        );
        assert!(
            head.contains(&format!("Sec-WebSocket-Accept: {GOOD_ACCEPT}\r\n")),
            "{target}: {head}"
        );
    }
}
