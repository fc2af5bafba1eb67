//! Seeded fuzzing of every decoder the crate exposes, on the stable
//! toolchain (the engine is in `fuzz_support`). One `#[test]` per target;
//! each starts from a corpus of valid samples (encoded by the crate itself
//! where it has an encoder) and checks, for every input:
//! - no panic;
//! - no allocation beyond `ALLOC_FACTOR` × input + `ALLOC_BASE` bytes on the
//!   decoding thread while it runs (a counting global allocator measures the
//!   peak of live bytes; the disk targets state their own bound);
//! - where the codec is symmetric, decode(encode(x)) == x for every decoded
//!   x (byte-exact encode(decode(b)) == b where the format is canonical);
//! - for the stream store and the Raft log on disk: a damaged file gives a
//!   refusal or a cut tail, never a message or entry that was not written.
//!
//! `make test` runs each target for about a second with seed 1;
//! `make fuzz SECS=600` runs them in release with a fresh seed. Every
//! failure prints the input as hex and the command that replays it; files
//! under `tests/fuzz/regressions/<target>/` are replayed by every run.

mod fuzz_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};

use fuzz_support::{assert_clean, run};
use gombus::cluster::raft_msg::{
    self, Beat, BeatAck, Body, Entry, EntryKind, HardState, Member, Membership, Message, Snapshot,
};
use gombus::cluster::{forward, raft_log};
use gombus::net::{http, polling, ws};
use gombus::protocol::stream_messages as sm;
use gombus::protocol::{engineio, messages, socketio};
use gombus::storage::record;
use gombus::stream::{index, segment};

// ---------------------------------------------------------------------------
// Allocation accounting: live bytes on this thread since `measure` began.

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// While an input runs: the live bytes past which an allocation is
    /// refused, so a decoder that trusts a huge length stops the process
    /// at once ("memory allocation of N bytes failed") instead of driving
    /// the machine into swap.
    static CAP: Cell<isize> = const { Cell::new(isize::MAX) };
}

/// The hard cap while an input runs (the stated bounds are far below it).
const HARD_CAP: isize = 512 << 20;

fn over_cap(size: usize) -> bool {
    let live = LIVE.try_with(Cell::get).unwrap_or(0);
    let cap = CAP.try_with(Cell::get).unwrap_or(isize::MAX);
    live.saturating_add(size as isize) > cap
}

fn count(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get() + delta;
        l.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now);
            }
        });
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && over_cap(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes a decoder may hold per byte of input, on top of `ALLOC_BASE`.
/// Decoded values take a few times their encoding (a `String` per subject,
/// a `Vec` per attachment, serde's maps); 64× is far above that and far
/// below what trusting a length field would cost.
const ALLOC_FACTOR: usize = 64;
const ALLOC_BASE: usize = 1 << 20;

/// Runs `f` and fails if the peak of bytes live on this thread during it
/// exceeds `limit`.
fn within(limit: usize, f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    struct Uncap;
    impl Drop for Uncap {
        fn drop(&mut self) {
            CAP.with(|c| c.set(isize::MAX));
        }
    }
    CAP.with(|c| c.set(start.saturating_add(HARD_CAP)));
    let uncap = Uncap;
    let r = f();
    drop(uncap);
    let peak = (PEAK.with(Cell::get) - start).max(0) as usize;
    if peak > limit {
        return Err(format!(
            "allocated {peak} bytes at peak, over the bound {limit}"
        ));
    }
    r
}

fn bound(input: &[u8]) -> usize {
    ALLOC_FACTOR * input.len() + ALLOC_BASE
}

/// Text decoders see the input as UTF-8, invalid sequences replaced.
fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

fn samples(list: &[&str]) -> Vec<Vec<u8>> {
    list.iter().map(|s| s.as_bytes().to_vec()).collect()
}

// ---------------------------------------------------------------------------
// HTTP and the WebSocket handshake.

/// The head `parse_request` would read back as `r`.
fn encode_request(r: &http::Request) -> Vec<u8> {
    let mut out = format!("{} {}", r.method, r.path);
    if !r.query.is_empty() {
        out.push('?');
        out.push_str(&r.query);
    }
    out.push_str(&format!(" HTTP/1.{}\r\n", r.minor));
    for (k, v) in &r.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

#[test]
fn http_request() {
    let corpus = samples(&[
        "GET /socket.io/?EIO=4&transport=polling HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        "POST /socket.io/?EIO=3&transport=polling&sid=abc HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n4hello",
        "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n",
        "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ]);
    let out = run("http_request", &corpus, 20_000, 512, &mut |input| {
        within(bound(input), || {
            let mut rest = input;
            for _ in 0..8 {
                let (req, used) = match http::parse_request(rest) {
                    Ok(Some(x)) => x,
                    Ok(None) | Err(_) => return Ok(()),
                };
                ensure(used <= rest.len() && used <= http::HEAD_BYTES_MAX, || {
                    format!("used {used} of {} bytes", rest.len())
                })?;
                ensure(req.headers.len() <= http::HEADERS_MAX, || {
                    "too many headers".into()
                })?;
                let _ = (
                    req.keep_alive(),
                    req.query_param("EIO"),
                    req.query_param("sid"),
                );
                let _ = engineio::parse_query(&req.query, &[3, 4]);
                if let Ok(n) = req.body_len() {
                    rest = &rest[used..];
                    rest = &rest[n.min(rest.len())..];
                } else {
                    rest = &rest[used..];
                }
                if let Some(key) = req.header("Sec-WebSocket-Key") {
                    let accept = ws::accept_key(key);
                    ensure(accept.len() == 28, || format!("accept key {accept:?}"))?;
                    let _ = req.header_has_token("Connection", "upgrade");
                }
                // The head re-encoded reads back as the same request.
                let again = encode_request(&req);
                match http::parse_request(&again) {
                    Ok(Some((back, n))) if back == req && n == again.len() => {}
                    other => return Err(format!("re-encoded head read back as {other:?}")),
                }
            }
            Ok(())
        })
    });
    assert_clean("http_request", &out);
}

// ---------------------------------------------------------------------------
// WebSocket frames from a client.

fn client_frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) {
    out.push((if fin { 0x80 } else { 0 }) | opcode);
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n < 65536 {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

#[derive(Debug, PartialEq, Eq)]
enum Got {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong,
    Close,
}

/// Feeds `chunks` in order to one decoder as a connection would (keeping
/// the undecoded tail); the events, or the error that ended it.
fn ws_decode(chunks: &[&[u8]], max: usize) -> (Vec<Got>, Option<ws::WsError>, usize) {
    let mut d = ws::Decoder::default();
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        let r = d.decode(&mut buf, max, &mut |e| {
            got.push(match e {
                ws::WsEvent::Text(t) => Got::Text(t.to_string()),
                ws::WsEvent::Binary(b) => Got::Binary(b.to_vec()),
                ws::WsEvent::Ping(b) => Got::Ping(b.to_vec()),
                ws::WsEvent::Pong => Got::Pong,
                ws::WsEvent::Close => Got::Close,
            });
            ws::Flow::Continue
        });
        match r {
            Ok(n) => {
                buf.drain(..n);
            }
            Err(e) => return (got, Some(e), d.held()),
        }
    }
    (got, None, d.held())
}

#[test]
fn ws_frames() {
    let m = [0x12, 0x34, 0x56, 0x78];
    let mut corpus = Vec::new();
    let mut one = Vec::new();
    client_frame(&mut one, true, 1, b"42[\"pub\",{\"subject\":\"a\"}]", m);
    client_frame(&mut one, true, 9, b"ping", m);
    corpus.push(one);
    let mut frag = Vec::new();
    client_frame(&mut frag, false, 1, b"42[\"a\",", m);
    client_frame(&mut frag, true, 10, b"", m);
    client_frame(&mut frag, false, 0, b"1,", m);
    client_frame(&mut frag, true, 0, b"2]", m);
    client_frame(&mut frag, true, 8, &1000u16.to_be_bytes(), m);
    corpus.push(frag);
    let mut big = Vec::new();
    client_frame(&mut big, true, 2, &[7u8; 300], m);
    corpus.push(big);
    const MAX: usize = 1024;
    let out = run("ws_frames", &corpus, 4096, 128, &mut |input| {
        within(bound(input), || {
            let (whole, err, held) = ws_decode(&[input], MAX);
            ensure(held <= MAX, || format!("holds {held} bytes"))?;
            // Cut anywhere, the same events come out (and the same error).
            let cut = fuzz_support::fnv1a(input) as usize % (input.len() + 1);
            let (split, err2, _) = ws_decode(&[&input[..cut], &input[cut..]], MAX);
            ensure(whole == split && err == err2, || {
                format!("cut at {cut}: {whole:?}/{err:?} vs {split:?}/{err2:?}")
            })
        })
    });
    assert_clean("ws_frames", &out);
}

// ---------------------------------------------------------------------------
// Engine.IO packets and polling payloads.

#[test]
fn engineio_packet() {
    let corpus = samples(&[
        "0{\"sid\":\"x\",\"upgrades\":[],\"pingInterval\":25000,\"pingTimeout\":20000,\"maxPayload\":1000000}",
        "1",
        "2probe",
        "3",
        "42[\"pub\",{\"subject\":\"a\",\"data\":1}]",
        "5",
        "6",
        "EIO=4&transport=websocket&sid=abc",
        "EIO=3&transport=polling&t=123",
    ]);
    let out = run("engineio_packet", &corpus, 4096, 128, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            let _ = engineio::parse_query(&t, &[3, 4]);
            let Ok(p) = engineio::decode(&t) else {
                return Ok(());
            };
            if let engineio::Packet::Open(json) = &p {
                // The client reads the server's open packet with this.
                let _ = engineio::decode_open(json);
            }
            let again = match &p {
                engineio::Packet::Open(s) => format!("0{s}"),
                engineio::Packet::Close => "1".into(),
                engineio::Packet::Ping(s) => format!("2{s}"),
                engineio::Packet::Pong(s) => format!("3{s}"),
                engineio::Packet::Message(s) => format!("4{s}"),
                engineio::Packet::Upgrade => "5".into(),
                engineio::Packet::Noop => "6".into(),
            };
            let back = engineio::decode(&again);
            ensure(back.as_ref() == Ok(&p), || {
                format!("{p:?} came back as {back:?}")
            })
        })
    });
    assert_clean("engineio_packet", &out);
}

fn polling_target(name: &str, eio: u8) {
    let mut corpus = Vec::new();
    for parts in [
        &["40", "42[\"sub\",{\"subject\":\"a.*\"}]", "2"][..],
        &["4héllo ☃ 𝄞", "3probe"][..],
        &["1"][..],
    ] {
        let mut out = Vec::new();
        for p in parts {
            polling::push_text(&mut out, eio, p.as_bytes(), &[]);
        }
        polling::push_binary(&mut out, eio, &[0, 1, 2, 255, 254]);
        corpus.push(out);
    }
    let out = run(name, &corpus, 4096, 128, &mut |input| {
        within(bound(input), || {
            let Ok(items) = polling::decode(input, eio) else {
                return Ok(());
            };
            // Re-encoded, the same packets come back (a text packet always
            // has its type character, so empty ones are not encodable).
            if items.iter().any(|i| matches!(i, polling::Item::Text(""))) {
                return Ok(());
            }
            let mut out = Vec::new();
            for item in &items {
                match item {
                    polling::Item::Text(t) => polling::push_text(&mut out, eio, t.as_bytes(), &[]),
                    polling::Item::Binary(b) => polling::push_binary(&mut out, eio, b),
                }
            }
            let back = polling::decode(&out, eio);
            ensure(back.as_ref() == Ok(&items), || {
                format!("{items:?} came back as {back:?}")
            })?;
            for item in &items {
                if let polling::Item::Text(t) = item {
                    if let Ok(engineio::Packet::Message(m)) = engineio::decode(t) {
                        let _ = socketio::decode(m);
                    }
                }
            }
            Ok(())
        })
    });
    assert_clean(name, &out);
}

#[test]
fn polling_payload_v4() {
    polling_target("polling_payload_v4", 4);
}

#[test]
fn polling_payload_v3() {
    polling_target("polling_payload_v3", 3);
}

#[test]
fn base64() {
    let corpus = samples(&[
        "",
        "AA==",
        "AAE=",
        "AAEC",
        "aGVsbG8gd29ybGQ",
        "////",
        "b4AAEC",
    ]);
    let out = run("base64", &corpus, 4096, 64, &mut |input| {
        within(bound(input), || {
            let Some(bytes) = polling::base64_decode(input) else {
                return Ok(());
            };
            let mut again = Vec::new();
            polling::base64_encode(&bytes, &mut again);
            ensure(again.len() == polling::base64_len(bytes.len()), || {
                "length".into()
            })?;
            let back = polling::base64_decode(&again);
            ensure(back.as_ref() == Some(&bytes), || {
                format!("{bytes:?} came back as {back:?}")
            })
        })
    });
    assert_clean("base64", &out);
}

// ---------------------------------------------------------------------------
// Socket.IO packets.

#[test]
fn socketio_packet() {
    let corpus = samples(&[
        "0",
        "0{\"token\":\"secret\"}",
        "0/control,{\"token\":\"t\"}",
        "1",
        "1/control,",
        "2[\"pub\",{\"subject\":\"a.b\",\"data\":\"x\"}]",
        "27[\"request\",{\"subject\":\"svc\",\"timeout_ms\":500}]",
        "2/control,12[\"group.set\",{\"queue\":\"q\",\"mode\":\"broadcast\"}]",
        "31[{\"ok\":true}]",
        "4{\"message\":\"no\"}",
        "51-[\"pub\",{\"subject\":\"bin\",\"data\":{\"_placeholder\":true,\"num\":0}}]",
        "52-3[\"pub\",{\"subject\":\"b\",\"data\":[{\"_placeholder\":true,\"num\":0},{\"_placeholder\":true,\"num\":1}]}]",
        "61-9[{\"_placeholder\":true,\"num\":0}]",
    ]);
    let out = run("socketio_packet", &corpus, 8192, 256, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            let Ok(p) = socketio::decode(&t) else {
                return Ok(());
            };
            ensure(p.attachments <= socketio::ATTACHMENTS_MAX, || {
                "attachments".into()
            })?;
            let again = socketio::encode(p.kind, p.attachments, p.nsp, p.id, p.data);
            let again = String::from_utf8(again).map_err(|e| e.to_string())?;
            let back = socketio::decode(&again);
            ensure(back.as_ref() == Ok(&p), || {
                format!("{p:?} came back as {back:?}")
            })?;
            if p.kind.is_binary() {
                let _ = socketio::placeholders_valid(p.data, p.attachments);
                let mut r = socketio::Reassembly::default();
                r.start(&t, p.attachments);
                for k in 0..p.attachments + 1 {
                    match r.push(&input[..k.min(input.len())], 1 << 16) {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) => {}
                    }
                }
            }
            if let Ok(e) = socketio::parse_event(p.data) {
                let fast = socketio::event_name(p.data);
                ensure(fast.as_deref() == Some(&*e.name), || {
                    format!("event_name {fast:?} but parse_event {:?}", e.name)
                })?;
            }
            Ok(())
        })
    });
    assert_clean("socketio_packet", &out);
}

// ---------------------------------------------------------------------------
// The JSON arguments of every event, as the broker reads them.

fn read<'a, T: serde::Deserialize<'a>>(arg: &'a str) -> Option<T> {
    serde_json::from_str(arg).ok()
}

fn stream_fields(arg: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    read(arg)
}

#[test]
fn event_args() {
    let corpus = samples(&[
        r#"["pub",{"subject":"orders.eu","data":{"id":1,"x":[1,2,3]},"reply":"_INBOX.1","headers":{"k":"v"}}]"#,
        r#"["sub",{"subject":"orders.*","queue":"workers","sid":7,"max":10}]"#,
        r#"["sub",{"subject":"a.>","sid":"s-1"}]"#,
        r#"["unsub",{"sid":"s-1","after":3}]"#,
        r#"["request",{"subject":"svc.echo","data":"hi","timeout_ms":1000,"headers":null}]"#,
        r#"["group.set",{"queue":"workers","mode":"broadcast"}]"#,
        r#"["stream.create",{"name":"ORDERS","subjects":["orders.>"],"retention":"limits","max_msgs":100,"max_bytes":65536,"max_age_ms":60000,"max_msg_size":1024,"discard":"old","duplicate_window_ms":1000}]"#,
        r#"["stream.info",{"name":"ORDERS"}]"#,
        r#"["stream.purge",{"name":"ORDERS","subject":"orders.eu"}]"#,
        r#"["stream.get",{"name":"ORDERS","seq":18446744073709551615}]"#,
        r#"["stream.get",{"name":"ORDERS","last_by_subject":"orders.eu"}]"#,
        r#"["consumer.create",{"stream":"ORDERS","name":"c1","filter_subject":"orders.eu","deliver_policy":"all","ack_policy":"explicit","ack_wait_ms":30000,"max_deliver":5,"max_ack_pending":1000}]"#,
        r#"["consumer.info",{"stream":"ORDERS","name":"c1"}]"#,
        r#"["consumer.list",{"stream":"ORDERS"}]"#,
        r#"["consumer.fetch",{"stream":"ORDERS","consumer":"c1","batch":10,"expires_ms":5000,"no_wait":false}]"#,
        r#"["ack",{"stream":"ORDERS","consumer":"c1","seq":1}]"#,
        r#"["nak",{"stream":"ORDERS","consumer":"c1","seq":2,"delay_ms":100}]"#,
    ]);
    let out = run("event_args", &corpus, 70_000, 0, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            if let Ok(p) = messages::event_arg::<messages::Pub>(&t) {
                let _ = gombus::protocol::subject::validate_subject(&p.subject);
                let _ = messages::check_headers(p.headers);
            }
            if let Ok(s) = messages::event_arg::<messages::Sub>(&t) {
                let _ = gombus::protocol::subject::validate_pattern(&s.subject);
                let _ = s.sid.map(messages::SidValue::into_string);
            }
            if let Ok(u) = messages::event_arg::<messages::Unsub>(&t) {
                let _ = u.sid.into_string();
            }
            if let Ok(r) = messages::event_arg::<messages::Request>(&t) {
                let _ = messages::check_headers(r.headers);
            }
            let Ok(ev) = socketio::parse_event(&t) else {
                return Ok(());
            };
            let arg = ev.args.first().copied();
            let _ = messages::parse_arg::<messages::GroupSet>(arg);
            let Some(a) = arg.map(|a| a.get()) else {
                return Ok(());
            };
            if let Some(fields) = stream_fields(a) {
                if let Ok(mut c) = sm::read_config::<sm::StreamConfig>(fields) {
                    let _ = c.validate();
                }
            }
            if let Some(cc) = read::<sm::ConsumerCreate>(a) {
                let _ = sm::check_name("stream", &cc.stream);
                if let Ok(mut c) = sm::read_config::<sm::ConsumerConfig>(cc.config) {
                    let _ = c.validate();
                }
            }
            if let Some(r) = read::<sm::NameReq>(a) {
                let _ = sm::check_name("stream", &r.name);
            }
            let _ = read::<sm::PurgeReq>(a);
            let _ = read::<sm::GetReq>(a);
            let _ = read::<sm::StreamReq>(a);
            let _ = read::<sm::ConsumerReq>(a);
            let _ = read::<sm::FetchReq>(a);
            let _ = read::<sm::AckReq>(a);
            Ok(())
        })
    });
    assert_clean("event_args", &out);
}

/// The key-value events' arguments: bucket and key checks, the bucket's
/// stream config, and the write headers read back by the stream's rules.
#[test]
fn kv_args() {
    use gombus::protocol::kv_messages as kvm;
    use gombus::stream::limits;
    let corpus = samples(&[
        r#"{"bucket":"cfg","history":5,"ttl_ms":60000,"max_bytes":65536,"max_value_size":1024,"replicas":3}"#,
        r#"{"bucket":"cfg","key":"site.eu/x=1","value":{"on":true},"revision":7}"#,
        r#"{"bucket":"cfg","key":"a.b","revision":0}"#,
        r#"{"bucket":"cfg","filter":"site.*"}"#,
        r#"{"bucket":"cfg","key":"site.>","updates_only":true,"include_history":false,"sid":"w1"}"#,
    ]);
    let out = run("kv_args", &corpus, 20_000, 0, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            if let Some(c) = read::<kvm::CreateReq>(&t) {
                if let Ok(mut fields) = c.stream_create(1 << 20) {
                    // The broker takes `replicas` out first (placement).
                    fields.remove("replicas");
                    let mut cfg = sm::read_config::<sm::StreamConfig>(fields)
                        .map_err(|e| format!("a checked bucket's stream config: {e}"))?;
                    cfg.validate()
                        .map_err(|e| format!("a checked bucket's stream: {e}"))?;
                    let shown = kvm::bucket_config(&cfg, 1);
                    ensure(shown["bucket"] == c.bucket.as_str(), || format!("{shown}"))?;
                }
            }
            if let Some(k) = read::<kvm::KeyReq>(&t) {
                if kvm::check_bucket(&k.bucket).is_ok() && kvm::check_key(&k.key).is_ok() {
                    let subject = kvm::subject_of(&k.bucket, &k.key);
                    ensure(kvm::key_of(&k.bucket, &subject) == Some(&*k.key), || {
                        format!("key {:?} of {subject:?}", k.key)
                    })?;
                    ensure(kvm::check_key_filter(&k.key).is_ok(), || k.key.clone())?;
                }
                for op in [None, Some("DEL"), Some("PURGE")] {
                    let h = kvm::write_headers(op, k.revision);
                    let asks = limits::asks_of(h.as_deref());
                    let want = match op {
                        None => limits::KvOp::Put,
                        Some("DEL") => limits::KvOp::Delete,
                        _ => limits::KvOp::Purge,
                    };
                    ensure(asks.op == want && asks.expected == k.revision, || {
                        format!("{h:?} read back as {asks:?}")
                    })?;
                }
            }
            if let Some(k) = read::<kvm::KeysReq>(&t) {
                let _ = k.filter.as_deref().map(kvm::check_key_filter);
            }
            if let Some(w) = read::<kvm::WatchReq>(&t) {
                let _ = w.key.as_deref().map(kvm::check_key_filter);
            }
            let _ = limits::asks_of(Some(&t));
            Ok(())
        })
    });
    assert_clean("kv_args", &out);
}

/// The `pub` hand scanner against the serde path it stands in for: where
/// it answers, the serde path reads the same fields.
#[test]
fn pub_scan() {
    let corpus = samples(&[
        r#"["pub",{"subject":"bench.fanout","data":"0000000042xxxxxxxxxxxxxxxxxxxxxx"}]"#,
        r#"["pub",{"subject":"orders.eu","data":{"id":1,"x":[1,2.5e-3,-0,true,false,null]},"reply":"_INBOX.1","headers":{"k":"v"}}]"#,
        r#" [ "pub" , { "headers" : null , "reply" : null , "subject" : "s" , "data" : null , "z" : [ { } ] } , "more" , 1 ] "#,
        r#"["pub",{"subject":"a","data":"\u00e9\ud800\n\"q\" \\ \/","other":{"k":"\t"}}]"#,
        r#"["pub",{"subject":"a.b","data":1,"data":2}]"#,
        r#"["pub",["a.b",1,"r.x",{},5]]"#,
    ]);
    let out = run("pub_scan", &corpus, 4_096, 0, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            let Some(scanned) = gombus::protocol::pub_scan::scan_pub(&t) else {
                return Ok(());
            };
            match messages::event_arg::<messages::Pub>(&t) {
                Ok(p) => {
                    let p = messages::PubArg::from(p);
                    ensure(p == scanned, || {
                        format!("the scanner read {scanned:?}, serde {p:?}")
                    })
                }
                Err(e) => Err(format!(
                    "the scanner read {scanned:?}, serde refused: {e:?}"
                )),
            }
        })
    });
    assert_clean("pub_scan", &out);
}

// ---------------------------------------------------------------------------
// Cluster codecs.

/// A configuration of a seed member and a node added by name, with the
/// runtime's member data.
fn conf_membership() -> Membership {
    Membership {
        members: vec![
            Member {
                id: 1,
                voter: true,
                data: br#"{"name":"n1","raft":"127.0.0.1:9091","http":"127.0.0.1:8081"}"#.to_vec(),
            },
            Member {
                id: gombus::cluster::members::joined_id("n4"),
                voter: false,
                data: br#"{"name":"n4","raft":"127.0.0.1:9094"}"#.to_vec(),
            },
        ],
    }
}

fn conf_sample() -> Vec<u8> {
    let mut out = Vec::new();
    raft_msg::encode_membership(&mut out, &conf_membership());
    out
}

fn raft_samples() -> Vec<Message> {
    let e = |i: u64, d: &[u8]| Entry {
        term: 3,
        index: i,
        kind: if d.is_empty() {
            EntryKind::Noop
        } else {
            EntryKind::Command
        },
        data: d.to_vec(),
    };
    let bodies = vec![
        Body::PreVote {
            last_index: 9,
            last_term: 2,
        },
        Body::PreVoteResp { granted: true },
        Body::Vote {
            last_index: 1,
            last_term: 1,
        },
        Body::VoteResp { granted: false },
        Body::Append {
            prev_index: 4,
            prev_term: 2,
            entries: vec![e(5, b""), e(6, b"sub a.b"), e(7, &[0, 255, 1])],
            commit: 5,
            epoch: 2,
        },
        Body::AppendResp {
            ok: true,
            index: 7,
            hint_index: 0,
            hint_term: 0,
            epoch: 1,
            voter: true,
        },
        // A node that may not vote yet says so with a tag of its own.
        Body::AppendResp {
            ok: false,
            index: 7,
            hint_index: 3,
            hint_term: 2,
            epoch: 4,
            voter: false,
        },
        Body::Heartbeat {
            commit: 7,
            commit_term: 3,
            read_seq: 11,
        },
        Body::HeartbeatResp {
            read_seq: 11,
            epoch: 2,
        },
        Body::Snapshot {
            snapshot: Snapshot {
                index: 7,
                term: 3,
                data: b"{\"subs\":[]}".to_vec(),
            },
        },
        Body::Propose {
            seq: 2,
            data: b"pub".to_vec(),
        },
        Body::ProposeResp { seq: 2, index: 8 },
        // Membership changes: a configuration entry, the hand-over, and a
        // snapshot with the configuration at its index.
        Body::Append {
            prev_index: 7,
            prev_term: 3,
            entries: vec![Entry {
                term: 3,
                index: 8,
                kind: EntryKind::Config,
                data: conf_sample(),
            }],
            commit: 7,
            epoch: 1,
        },
        Body::TransferVote {
            last_index: 8,
            last_term: 3,
        },
        Body::TimeoutNow,
        Body::ConfSnapshot {
            snapshot: Snapshot {
                index: 8,
                term: 3,
                data: b"{}".to_vec(),
            },
            config: conf_membership(),
        },
        Body::SnapshotChunk {
            index: 8,
            snap_term: 3,
            offset: 0,
            total: 5,
            data: b"state".to_vec(),
        },
    ];
    // The control group's messages, the same in a stream group (whose
    // group id goes in front), and the coalesced heartbeats.
    let mut out: Vec<Message> = Vec::new();
    for group in [0, 42] {
        out.extend(bodies.iter().cloned().map(|body| Message {
            group,
            from: 1,
            to: 2,
            term: 3,
            body,
        }));
    }
    let beat = |group: u64, commit: u64| Beat {
        group,
        term: 3,
        commit,
        commit_term: 3,
        read_seq: 0,
    };
    out.push(Message {
        group: 0,
        from: 1,
        to: 2,
        term: 0,
        body: Body::Beats {
            beats: vec![beat(1, 7), beat(300, 1 << 20)],
        },
    });
    out.push(Message {
        group: 0,
        from: 2,
        to: 1,
        term: 0,
        body: Body::BeatsResp {
            acks: vec![
                BeatAck {
                    group: 1,
                    term: 3,
                    read_seq: 0,
                    epoch: 1,
                },
                BeatAck {
                    group: 300,
                    term: 3,
                    read_seq: 9,
                    epoch: 1 << 33,
                },
            ],
        },
    });
    out
}

#[test]
fn raft_message() {
    let corpus: Vec<Vec<u8>> = raft_samples()
        .iter()
        .map(|m| {
            let mut out = Vec::new();
            raft_msg::encode(&mut out, m);
            out
        })
        .collect();
    let out = run("raft_message", &corpus, 4096, 256, &mut |input| {
        within(bound(input), || {
            let mut r = raft_msg::Reader::new(input);
            let _ = r.entry();
            let mut r = raft_msg::Reader::new(input);
            let _ = r.snapshot();
            let mut r = raft_msg::Reader::new(input);
            if let Ok(hs) = r.hard_state() {
                let mut again = Vec::new();
                raft_msg::encode_hard_state(&mut again, &hs);
                let back = raft_msg::Reader::new(&again).hard_state();
                ensure(back.as_ref() == Ok(&hs), || {
                    format!("{hs:?} came back as {back:?}")
                })?;
            }
            if let Ok(c) = raft_msg::decode_membership(input) {
                let mut again = Vec::new();
                raft_msg::encode_membership(&mut again, &c);
                ensure(again == input, || format!("{c:?} re-encoded differently"))?;
                for m in &c.members {
                    let _ = gombus::cluster::members::MemberInfo::decode(&m.data);
                }
            }
            let Ok(m) = raft_msg::decode(input) else {
                return Ok(());
            };
            // The encoding is canonical: what decodes re-encodes to itself.
            let mut again = Vec::new();
            raft_msg::encode(&mut again, &m);
            ensure(again == input, || format!("{m:?} re-encoded differently"))
        })
    });
    assert_clean("raft_message", &out);
}

#[test]
fn forward_batch() {
    let msgs = vec![
        forward::PeerMessage {
            subject: "orders.eu",
            reply: Some("_INBOX.x"),
            data: "{\"a\":1}",
            headers: Some("{\"k\":\"v\"}"),
            extra: Some("\"stream\":\"S\",\"seq\":3"),
            attachments: vec![vec![1, 2, 3], vec![]],
            plain: true,
            picks: vec![(7, "s1"), (u64::MAX, "")],
        },
        forward::PeerMessage {
            subject: "a",
            reply: None,
            data: "null",
            headers: None,
            extra: None,
            attachments: vec![],
            plain: false,
            picks: vec![],
        },
    ];
    let mut both = Vec::new();
    for m in &msgs {
        forward::push(&mut both, m);
    }
    let mut first = Vec::new();
    forward::push(&mut first, &msgs[1]);
    let corpus = vec![both, first, vec![forward::BATCH_MAGIC]];
    let out = run("forward_batch", &corpus, 4096, 256, &mut |input| {
        within(bound(input), || {
            let Ok(list) = forward::decode(input) else {
                return Ok(());
            };
            let mut again = Vec::new();
            for m in &list {
                forward::push(&mut again, m);
            }
            if list.is_empty() {
                again.push(forward::BATCH_MAGIC);
            }
            ensure(again == input, || {
                format!("{list:?} re-encoded differently")
            })
        })
    });
    assert_clean("forward_batch", &out);
}

// ---------------------------------------------------------------------------
// Segment records and index files.

/// Rewrites every record head's crc so that mutated bodies pass the check
/// and reach the decoders behind it (lengths are taken as they are).
fn refix_crcs(file: &mut [u8]) {
    let mut at = 0;
    while at + record::HEAD_BYTES <= file.len() {
        let len = u32::from_le_bytes([file[at], file[at + 1], file[at + 2], file[at + 3]]) as usize;
        let start = at + record::HEAD_BYTES;
        let end = start.saturating_add(len).min(file.len());
        let crc = crc32fast::hash(&file[start..end]);
        file[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

fn segment_corpus() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    segment::put_head(&mut out, 1);
    segment::put_msg(
        &mut out,
        &segment::MsgRef {
            seq: 1,
            time_ms: 1_700_000_000_000,
            subject: "orders.eu",
            headers: Some("{\"k\":\"v\"}"),
            data: b"{\"id\":1}",
            binary: false,
        },
    );
    segment::put_msg(
        &mut out,
        &segment::MsgRef {
            seq: 2,
            time_ms: 1_700_000_000_001,
            subject: "b",
            headers: None,
            data: &[0, 1, 2, 3],
            binary: true,
        },
    );
    segment::put_remove(&mut out, &[1, 2]);
    segment::put_floor(&mut out, 3);
    segment::put_synced(&mut out, 77);
    segment::put_truncate(&mut out, 2);
    segment::put_span(&mut out, 9);
    vec![out]
}

#[test]
fn segment_records() {
    let corpus = segment_corpus();
    let out = run("segment_records", &corpus, 4096, 512, &mut |input| {
        let mut fixed = input.to_vec();
        refix_crcs(&mut fixed);
        within(bound(input), || {
            for file in [input, &fixed[..]] {
                let (bodies, end, _) = record::scan(file);
                ensure(end <= file.len(), || format!("scan ended at {end}"))?;
                for body in bodies {
                    let Ok(rec) = segment::decode(body) else {
                        continue;
                    };
                    if let segment::Rec::Remove(seqs) = &rec {
                        let _ = seqs.iter().count();
                    }
                    if let segment::Rec::Msg(m) = &rec {
                        let mut again = Vec::new();
                        segment::put_msg(&mut again, m);
                        let back = record::read(&again, 0)
                            .ok()
                            .flatten()
                            .map(|(b, _)| segment::decode(b));
                        ensure(back == Some(Ok(rec.clone())), || {
                            format!("{rec:?} came back as {back:?}")
                        })?;
                    }
                }
            }
            Ok(())
        })
    });
    assert_clean("segment_records", &out);
}

fn index_corpus() -> Vec<Vec<u8>> {
    let s = index::Summary {
        seg_len: 4096,
        last_off: 4000,
        last_crc: 0xdead_beef,
        first_seq: 10,
        synced: 2048,
        span: 0,
        subjects: vec!["orders.eu".into(), "b".into()],
        msgs: vec![
            index::IdxMsg {
                seq: 10,
                off: 16,
                len: 40,
                subj: 0,
                time_ms: 5,
            },
            index::IdxMsg {
                seq: 12,
                off: 56,
                len: 30,
                subj: 1,
                time_ms: 6,
            },
        ],
        ops: vec![
            index::PlacedOp {
                after: 1,
                op: index::Op::Remove(10),
            },
            index::PlacedOp {
                after: 2,
                op: index::Op::Floor(11),
            },
            index::PlacedOp {
                after: 2,
                op: index::Op::Truncate(12),
            },
        ],
    };
    vec![index::encode(&s).expect("small index")]
}

#[test]
fn index_file() {
    let corpus = index_corpus();
    let out = run("index_file", &corpus, 4096, 512, &mut |input| {
        let mut fixed = input.to_vec();
        refix_crcs(&mut fixed);
        within(bound(input), || {
            for file in [input, &fixed[..]] {
                let Some(s) = index::decode(file) else {
                    continue;
                };
                // Canonical: what decodes re-encodes to the same file.
                let again = index::encode(&s);
                ensure(again.as_deref() == Some(file), || {
                    format!("{s:?} re-encoded differently")
                })?;
            }
            Ok(())
        })
    });
    assert_clean("index_file", &out);
}

// ---------------------------------------------------------------------------
// Files on disk: the Raft log and state, the stream store.

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        // tmpfs when there is one: these targets write and fsync files for
        // every input.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let p = base.join(format!(
            "gombus-fuzz-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    /// Empties the directory and writes `files` into it.
    fn fill(&self, files: &[(String, Vec<u8>)]) {
        let _ = fs::remove_dir_all(&self.0);
        fs::create_dir_all(&self.0).unwrap();
        for (name, bytes) in files {
            fs::write(self.0.join(name), bytes).unwrap();
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A directory's files: name and content.
type Files = Vec<(String, Vec<u8>)>;

fn read_dir_files(dir: &Path) -> Files {
    let mut v: Files = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Inputs for a directory of files: byte 0 picks the file, byte 1 whether
/// the crcs are fixed up after the mutation (bit 0), the rest is the
/// file's new content.
fn file_corpus(files: &[(String, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut corpus = Vec::new();
    for (k, (_, bytes)) in files.iter().enumerate() {
        for mode in [0u8, 1] {
            let mut input = vec![k as u8, mode];
            input.extend_from_slice(bytes);
            corpus.push(input);
        }
    }
    corpus
}

/// The template's files with one replaced as `input` says; the index of
/// the replaced file and whether its crcs were fixed up.
fn apply_file_input(template: &[(String, Vec<u8>)], input: &[u8]) -> Option<(Files, usize, bool)> {
    let [k, mode, content @ ..] = input else {
        return None;
    };
    let k = *k as usize % template.len();
    let refix = mode & 1 == 1;
    let mut files = template.to_vec();
    files[k].1 = content.to_vec();
    if refix {
        refix_crcs(&mut files[k].1);
    }
    Some((files, k, refix))
}

fn raft_entries() -> Vec<Entry> {
    (1..=6)
        .map(|i| Entry {
            term: 1 + i / 3,
            index: i,
            kind: if i == 1 {
                EntryKind::Noop
            } else {
                EntryKind::Command
            },
            data: format!("command {i}").into_bytes(),
        })
        .collect()
}

#[test]
fn raft_log_files() {
    let scratch = Scratch::new("raftlog-template");
    let dir = scratch.0.join("raft");
    {
        let mut st = raft_log::StateFile::open(&dir).unwrap();
        st.save(&HardState {
            term: 3,
            vote: Some(2),
            epoch: 4,
        })
        .unwrap();
        let mut log = raft_log::DurableLog::open(&dir).unwrap();
        use raft_log::LogStore;
        let entries = raft_entries();
        log.append(1, &entries).unwrap();
        log.save_snapshot(&Snapshot {
            index: 2,
            term: 1,
            data: b"snap".to_vec(),
        })
        .unwrap();
    }
    let template = read_dir_files(&dir);
    let originals = raft_entries();
    let corpus = file_corpus(&template);
    let work = Scratch::new("raftlog");
    let out = run("raft_log_files", &corpus, 4096, 0, &mut |input| {
        let Some((files, k, refix)) = apply_file_input(&template, input) else {
            return Ok(());
        };
        work.fill(&files);
        // Disk targets: the file is read whole, plus the store's own state.
        within(bound(input) + (4 << 20), || {
            let _ = raft_log::StateFile::open(&work.0).and_then(|s| s.load());
            let Ok(mut log) = raft_log::DurableLog::open(&work.0) else {
                return Ok(());
            };
            use raft_log::LogStore;
            let Ok(loaded) = log.load() else {
                return Ok(());
            };
            if refix || files[k].0 != "log" {
                return Ok(());
            }
            // A damaged log (crcs left as they were) loses a tail at most:
            // every entry loaded is one that was written.
            for e in &loaded.entries {
                let ok = originals.iter().any(|o| o == e);
                ensure(ok, || format!("loaded an entry never written: {e:?}"))?;
            }
            Ok(())
        })
    });
    assert_clean("raft_log_files", &out);
}

fn store_payload(i: u64) -> Vec<u8> {
    format!("payload {i} ")
        .repeat((i % 5 + 1) as usize)
        .into_bytes()
}

#[test]
fn stream_store_files() {
    use gombus::stream::store::{Options, Store};
    let opts = Options {
        segment_bytes: 400,
        ..Options::default()
    };
    const N: u64 = 30;
    let removed = [4u64, 9, 17];
    let scratch = Scratch::new("store-template");
    let mut written = Vec::new();
    {
        let (mut s, _) = Store::open(&scratch.0, opts.clone()).unwrap();
        for i in 1..=N {
            let subject = format!("orders.{}", i % 3);
            let headers = (i % 4 == 0).then_some("{\"k\":\"v\"}");
            let seq = s
                .append(&subject, headers, &store_payload(i), i % 2 == 0, 1000 + i)
                .unwrap();
            written.push((
                seq,
                subject,
                headers.map(str::to_string),
                store_payload(i),
                i % 2 == 0,
                1000 + i,
            ));
        }
        for r in removed {
            s.remove(r).unwrap();
        }
        s.flush().unwrap();
    }
    // A second open writes the index files of sealed segments.
    drop(Store::open(&scratch.0, opts.clone()).unwrap());
    let template = read_dir_files(&scratch.0);
    assert!(
        template.iter().any(|(n, _)| n.ends_with(".idx")),
        "no index files"
    );
    // The removals were written last: into the active (last) segment.
    let removals_file = &template
        .iter()
        .rfind(|(n, _)| n.ends_with(".seg"))
        .expect("segments")
        .0;
    let corpus = file_corpus(&template);
    let work = Scratch::new("store");
    let out = run("stream_store_files", &corpus, 8192, 0, &mut |input| {
        let Some((files, k, refix)) = apply_file_input(&template, input) else {
            return Ok(());
        };
        work.fill(&files);
        // The store keeps a read cache and a write buffer of a few MiB.
        within(bound(input) + (16 << 20), || {
            let Ok((store, report)) = Store::open(&work.0, opts.clone()) else {
                return Ok(()); // refused
            };
            // A segment whose crcs were forged can serve forged data; any
            // other damage must never serve a message that was not written
            // under that seq, nor one that was removed unless the removal
            // may have been in a lost tail: recovery cut one, or the file
            // holding the removal records was damaged (one that ends at a
            // record boundary is a file whose last writes never happened;
            // the state is then the one before the removal).
            let forged_segment = refix && files[k].0.ends_with(".seg");
            let removals_lost = !report.cuts.is_empty() || files[k].0 == *removals_file;
            for seq in 1..=N + 2 {
                let got = match store.get(seq) {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => continue,
                };
                if forged_segment {
                    continue;
                }
                let Some(w) = written.iter().find(|w| w.0 == seq) else {
                    return Err(format!("served seq {seq}, never written"));
                };
                let same = got.subject == w.1
                    && got.headers == w.2
                    && got.data == w.3
                    && got.binary == w.4
                    && got.time_ms == w.5;
                ensure(same, || {
                    format!("seq {seq} served as {got:?}, written as {w:?}")
                })?;
                ensure(refix || removals_lost || !removed.contains(&seq), || {
                    format!("removed seq {seq} served again")
                })?;
            }
            Ok(())
        })
    });
    assert_clean("stream_store_files", &out);
}

#[test]
fn stream_meta_files() {
    use gombus::stream::consumer::Event;
    use gombus::stream::meta::{MetaLog, Snapshot as MetaSnap};
    let scratch = Scratch::new("meta-template");
    {
        let mut snap: MetaSnap = serde_json::from_value(serde_json::json!({
            "gen": 0,
            "config": {"name": "ORDERS", "subjects": ["orders.>"], "max_msgs": 100},
            "last_seq": 9,
            "consumers": [{
                "config": {"name": "c1", "filter_subject": "orders.eu", "ack_policy": "all"},
                "since": 0, "next_seq": 4, "consumer_seq": 3,
                "pending": [[1, 1], [2, 3]]
            }]
        }))
        .unwrap();
        let mut log = MetaLog::create(&scratch.0, &mut snap).unwrap();
        log.push("c1", Event::Delivered(3));
        log.push("c1", Event::Done(1));
        log.push("c1", Event::DoneUpTo(2));
        log.flush().unwrap();
    }
    let template = read_dir_files(&scratch.0);
    assert_eq!(template.len(), 2, "{template:?}");
    let corpus = file_corpus(&template);
    let work = Scratch::new("meta");
    let out = run("stream_meta_files", &corpus, 8192, 0, &mut |input| {
        let Some((files, _, _)) = apply_file_input(&template, input) else {
            return Ok(());
        };
        work.fill(&files);
        within(bound(input) + (4 << 20), || {
            if let Ok((snap, events, _log)) = MetaLog::open(&work.0) {
                let _ = (snap.consumers.len(), events.len());
            }
            Ok(())
        })
    });
    assert_clean("stream_meta_files", &out);
}

// ---------------------------------------------------------------------------
// The users file (docs/PROTOCOL.md §11).

/// Every input either parses into users whose rights answer without
/// panicking, or is refused with a line inside the text; a duplicate-token
/// refusal never repeats the token (every token of the corpus starts with
/// `tok-`, no user name does).
#[test]
fn users_file() {
    let corpus = samples(&[
        include_str!("users/users.json"),
        r#"{"users":[{"name":"a","token":"tok-a","publish":{"allow":["a.*"],"deny":["a.b"]},"subscribe":{"allow":[">"],"deny":["x.>"]},"allow_responses":true,"streams":["*"],"stream_admin":true}]}"#,
        r#"{"users":[]}"#,
        "{\"users\": [\n {\"name\": \"a\", \"token\": \"tok-1\"},\n {\"name\": \"b\", \"token\": \"tok-2\", \"streams\": [\"S\"]}\n]}",
    ]);
    let out = run("users_file", &corpus, 8_000, 0, &mut |input| {
        let t = text(input);
        within(bound(input), || {
            let lines = t.lines().count().max(1);
            match gombus::auth::Users::parse(&t) {
                Ok(users) => {
                    for u in users.iter() {
                        let r = &u.rights;
                        let _ = r.publish.allows_subject("a.b");
                        let _ = r.subscribe.decide_sub("a.>");
                        ensure(users.find("\u{0}no such token").is_none(), || {
                            "an odd token matched".into()
                        })?;
                    }
                    Ok(())
                }
                Err(e) => {
                    ensure(e.line >= 1 && e.line <= lines + 1, || {
                        format!("line {} outside 1..={}", e.line, lines + 1)
                    })?;
                    let dup = e.message.contains("same token");
                    ensure(!dup || !e.message.contains("tok-"), || {
                        format!("a token was repeated: {e}")
                    })
                }
            }
        })
    });
    assert_clean("users_file", &out);
}
