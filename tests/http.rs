//! The hand-rolled HTTP layer and the binary's flags, from outside: raw
//! requests on a socket and the exact status lines and bodies that come
//! back; bad flags exit 2 with a message.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::Broker;

/// Sends raw bytes and reads the whole answer (the server closes after it).
fn exchange(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(addr: &str, target: &str) -> String {
    exchange(
        addr,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

#[test]
fn healthz_metrics_and_unknown_paths() {
    let b = Broker::start(&[]);
    let health = get(&b.addr, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    assert!(health.ends_with("\r\n\r\n{\"status\":\"ok\"}"), "{health}");
    let metrics = get(&b.addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
    assert!(
        metrics.contains("# TYPE gombus_connections gauge\n"),
        "{metrics}"
    );
    assert!(metrics.contains("\ngombus_subscriptions 0\n"), "{metrics}");
    let missing = get(&b.addr, "/nope");
    assert!(
        missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{missing}"
    );
    let post = exchange(
        &b.addr,
        b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(
        post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{post}"
    );
    assert!(post.contains("Allow: GET\r\n"), "{post}");
}

#[test]
fn malformed_and_oversized_heads() {
    let b = Broker::start(&[]);
    let garbage = exchange(&b.addr, b"\x16\x03\x01 hello\r\n\r\n");
    assert!(
        garbage.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{garbage}"
    );
    let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 10_000));
    big.extend_from_slice(b"\r\n\r\n");
    let huge = exchange(&b.addr, &big);
    assert!(huge.starts_with("HTTP/1.1 431 "), "{huge}");
    // The broker still serves after both.
    assert!(get(&b.addr, "/healthz").starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn engine_io_handshake_errors_are_json_400s() {
    let b = Broker::start(&[]);
    let cases = [
        (
            "/socket.io/?EIO=5&transport=websocket",
            r#"{"code":5,"message":"Unsupported protocol version"}"#,
        ),
        (
            "/socket.io/?transport=websocket",
            r#"{"code":5,"message":"Unsupported protocol version"}"#,
        ),
        (
            "/socket.io/?EIO=4&transport=carrier-pigeon",
            r#"{"code":0,"message":"Transport unknown"}"#,
        ),
        (
            "/socket.io/?EIO=4&transport=websocket&sid=nope",
            r#"{"code":1,"message":"Session ID unknown"}"#,
        ),
        // A WebSocket request without the upgrade headers.
        (
            "/socket.io/?EIO=4&transport=websocket",
            r#"{"code":3,"message":"Bad request"}"#,
        ),
    ];
    for (target, body) in cases {
        let answer = get(&b.addr, target);
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{target}: {answer}"
        );
        assert!(
            answer.contains("Content-Type: application/json\r\n"),
            "{target}: {answer}"
        );
        assert!(answer.ends_with(body), "{target}: {answer}");
    }
}

#[test]
fn a_client_that_vanishes_mid_request_harms_nobody() {
    let b = Broker::start(&[]);
    for cut in [1, 10, 30] {
        let mut s = TcpStream::connect(&b.addr).expect("connect");
        s.write_all(&b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"[..cut])
            .expect("write");
        drop(s);
    }
    assert!(get(&b.addr, "/healthz").starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn help_lists_every_flag_and_bad_flags_exit_2() {
    let help = Command::new(common::broker_bin())
        .arg("-help")
        .output()
        .expect("run");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "-addr",
        "-node-id",
        "-data",
        "-control-token",
        "-auth-token",
        "-users",
        "-max-payload",
        "-max-pending",
        "-ping-interval",
        "-ping-timeout",
        "-raft-addr",
        "-raft-peers",
        "-cluster",
        "-bootstrap",
    ] {
        assert!(text.contains(flag), "help lacks {flag}:\n{text}");
    }
    for bad in [
        &["-no-such-flag"][..],
        &["-max-payload=12XB"],
        &["-ping-interval=soon"],
        &["stray"],
    ] {
        let out = Command::new(common::broker_bin())
            .args(bad)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("broker: ") && err.contains("-help"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn head_requests_get_headers_only() {
    let b = Broker::start(&[]);
    let head = exchange(&b.addr, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Length: 15\r\n"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "{head}");
}

#[test]
fn engine_io_errors_carry_the_cors_origin() {
    let b = Broker::start(&["-cors-origin=https://app.example"]);
    for target in [
        "/socket.io/?EIO=9&transport=websocket",
        "/socket.io/?EIO=4&transport=websocket",
    ] {
        let answer = get(&b.addr, target);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{target}: {answer}");
        assert!(
            answer.contains("Access-Control-Allow-Origin: https://app.example\r\n"),
            "{target}: {answer}"
        );
    }
}
