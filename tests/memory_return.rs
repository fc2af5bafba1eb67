//! Memory comes back after a burst: connections that each send most of a
//! WebSocket frame make the broker hold past 200 MB of input, and a client
//! connects while they are there; once they are gone, the broker's
//! resident memory must fall back within twice its idle baseline plus
//! 16 MiB, within 30 s (docs/DESIGN.md, Memory bounds). What the allocator
//! keeps of freed memory is otherwise the host's loss.
//!
//! Every wait is a bounded polling loop on /proc/PID/status.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::raw_ws::Ws;
use common::Broker;

/// Bytes a connection's frame announces, and the part of it it sends.
const FRAME_BYTES: usize = 100_000;
const SENT_BYTES: usize = 60_000;
/// Bound on the burst's connections (up to 300 MB of input; the burst
/// stops at `BURST_RSS_KB`).
const HOLDERS_MAX: usize = 5000;
/// The burst is over once the broker holds this much.
const BURST_RSS_KB: u64 = 200 * 1024;
const SETTLE: Duration = Duration::from_secs(30);
const SLACK_KB: u64 = 16 * 1024;

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
    fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
}

/// Linux's RLIMIT_NOFILE.
const RLIMIT_NOFILE: i32 = 7;

/// Raises this process's open-file limit to its hard limit (the broker
/// started next inherits it) and returns the new soft limit.
fn raise_fd_limit() -> u64 {
    let mut lim = RLimit { cur: 0, max: 0 };
    // SAFETY: plain libc calls on a struct laid out as `struct rlimit`.
    unsafe {
        if getrlimit(RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        let raised = RLimit {
            cur: lim.max,
            max: lim.max,
        };
        if setrlimit(RLIMIT_NOFILE, &raised) == 0 {
            lim.cur = lim.max;
        }
    }
    lim.cur
}

/// Waits (bounded) until `cond` holds; false if it never did.
fn wait_for(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A WebSocket session (raw handshake) that has sent `SENT_BYTES` of a
/// text frame announced as `FRAME_BYTES`, and waits.
fn partial_frame(addr: &str) -> TcpStream {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(
        b"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\n\
          Upgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .expect("handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).expect("101"),
            1,
            "closed in the handshake"
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "), "{head:?}");
    // A masked text frame, 64-bit length; the mask is zero, so the
    // payload goes as is.
    let mut frame = vec![0x81, 0x80 | 127];
    frame.extend_from_slice(&(FRAME_BYTES as u64).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend(std::iter::repeat_n(b'4', SENT_BYTES));
    s.write_all(&frame).expect("frame");
    s
}

fn sessions(addr: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body.lines()
        .find_map(|l| l.strip_prefix("gombus_sessions "))
        .and_then(|v| v.trim().parse().ok())
        .expect("gombus_sessions")
}

#[test]
fn resident_memory_comes_back_after_a_burst() {
    // Each burst connection is a socket here and one in the broker.
    let fds = raise_fd_limit();
    assert!(
        fds >= HOLDERS_MAX as u64 + 256,
        "this test needs an open-file limit of {} (the hard limit is {fds})",
        HOLDERS_MAX + 256
    );
    let broker = Broker::start(&[]);
    let addr = broker.addr.clone();
    let mut publisher = Ws::join(&addr);
    // Idle baseline: the broker with one client, after one round trip.
    let ack = publisher.call("pub", r#"{"subject":"warm.up","data":1}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    let baseline = broker.rss_kb();
    assert!(baseline > 0, "cannot read the broker's VmRSS");
    // The burst: connections that each send most of a large frame and
    // wait, so the broker holds their input.
    let mut held = Vec::new();
    let mut peak = 0;
    while held.len() < HOLDERS_MAX && peak < BURST_RSS_KB {
        held.push(partial_frame(&addr));
        if held.len() % 64 == 0 {
            peak = peak.max(broker.rss_kb());
        }
    }
    wait_for(Duration::from_secs(5), || broker.rss_kb() >= BURST_RSS_KB);
    peak = peak.max(broker.rss_kb());
    assert!(
        peak >= BURST_RSS_KB,
        "the burst reached only {peak} KiB with {} connections (baseline {baseline} KiB)",
        held.len()
    );
    // A client that comes and stays while the burst is on: what it holds
    // sits above the burst's memory in the heap.
    let mut stayer = Ws::join(&addr);
    for i in 0..64 {
        let ack = stayer.call(
            "sub",
            &format!("{{\"subject\":\"stay.{i}\",\"sid\":\"s{i}\"}}"),
        );
        assert_eq!(ack["ok"], true, "{ack}");
    }
    // The burst ends: the connections go.
    drop(held);
    assert!(
        wait_for(Duration::from_secs(10), || sessions(&addr) == 2),
        "the burst's connections are still open"
    );
    let limit = 2 * baseline + SLACK_KB;
    let ended = Instant::now();
    let mut last = 0;
    let back = wait_for(SETTLE, || {
        last = broker.rss_kb();
        last <= limit
    });
    assert!(
        back,
        "RSS {last} KiB {:?} after the burst (peak {peak} KiB, baseline {baseline} KiB, \
         limit {limit} KiB)",
        ended.elapsed()
    );
    // Still serving.
    let ack = publisher.call("ping", "{}");
    assert_eq!(ack["ok"], true, "{ack}");
    eprintln!(
        "baseline {baseline} KiB, peak {peak} KiB, back to {last} KiB after {:?}",
        ended.elapsed()
    );
}
