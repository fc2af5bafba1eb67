//! The conformance fixture: a server built from gombus's own transport (the
//! `net` event loop and the `protocol` codecs) that behaves as the "Test
//! suite" sections of the Engine.IO v4 and Socket.IO v5 protocol specs ask
//! (PROTOCOL.md §8), so the official suites check the transport without the
//! broker on top.
//!
//! - `/engine.io/`: every message is echoed back, text as text, binary as
//!   binary.
//! - `/socket.io/`: namespaces `/` and `/custom` (any other gets a
//!   CONNECT_ERROR); on connection the server emits `auth` with the
//!   handshake's payload, a moment later (see [`AUTH_EMIT_DELAY`]); event
//!   `message` is answered with `message-back` and the same arguments
//!   (attachments included); event `message-with-ack` is acked with its own
//!   arguments; an invalid packet closes the connection, as does joining no
//!   namespace within the connect timeout.
//!
//! Heartbeat 300 ms / 200 ms, maxPayload 1000000, connect timeout 1000 ms,
//! CORS `*`. Run it with
//!
//! ```text
//! cargo run --release --example conformance [ADDR]   # default 127.0.0.1:3000
//! ```
//!
//! then, in each suite's `test-suite/` directory, `npm ci && npx mocha
//! test-suite.js` (scripts/conformance.sh does all of it). The same handler
//! backs tests/conformance.rs, which includes this file as a module.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

pub use gombus::net::server::Settings;
use gombus::net::server::{Server, IN_BYTES_MAX, POLLING_SESSIONS_MAX};
use gombus::port::{ConnId, Handler, Payload, Request, Response, Sink};
use gombus::protocol::socketio::{self, Packet, PacketType, Reassembly};
use serde_json::value::RawValue;

/// The values the suites expect (their `PING_INTERVAL`, `PING_TIMEOUT`,
/// the open packet's `maxPayload`, and the spec's connect timeout).
pub const PING_INTERVAL: Duration = Duration::from_millis(300);
pub const PING_TIMEOUT: Duration = Duration::from_millis(200);
pub const MESSAGE_BYTES_MAX: usize = 1_000_000;
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long the `auth` emit waits after the CONNECT answer. The suites'
/// client (ws 8.5) fires every message of one socket read in the same
/// tick, before the test listens for the next one, so two packets that
/// arrive together lose the second. Anything the client sends meanwhile
/// sends the pending emit first, so the order never changes.
pub const AUTH_EMIT_DELAY: Duration = Duration::from_millis(10);
const _: () = assert!(AUTH_EMIT_DELAY.as_millis() < PING_INTERVAL.as_millis());
/// Room for an echo of the largest message plus what is already queued.
const OUT_BYTES_MAX: usize = 4 * MESSAGE_BYTES_MAX;
const _: () = assert!(OUT_BYTES_MAX >= 2 * MESSAGE_BYTES_MAX);
/// Outbound bytes queued across all of the fixture's connections.
const OUT_TOTAL_MAX: usize = 64 * OUT_BYTES_MAX;

const DEFAULT_ADDR: &str = "127.0.0.1:3000";

/// The endpoint indexes handed to the event loop.
const ENDPOINT_ENGINE: u8 = 0;
const ENDPOINT_SOCKET: u8 = 1;

const NSP_ROOT: &str = "/";
const NSP_CUSTOM: &str = "/custom";

/// The Engine.IO settings every session of the fixture gets.
pub fn settings() -> Settings {
    Settings {
        ping_interval: PING_INTERVAL,
        ping_timeout: PING_TIMEOUT,
        message_bytes_max: MESSAGE_BYTES_MAX,
        out_bytes_max: OUT_BYTES_MAX,
        out_total_max: OUT_TOTAL_MAX,
        cors_origin: Some("*".to_string()),
        allow_eio3: false,
        polling_sessions_max: POLLING_SESSIONS_MAX,
        in_bytes_max: IN_BYTES_MAX,
    }
}

/// Binds `addr` (port 0 for any) and runs the fixture on its own thread;
/// returns the bound address. The thread runs until the process exits.
#[allow(dead_code)] // Used by tests/conformance.rs, not by `main`.
pub fn start(addr: SocketAddr) -> std::io::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    start_with(addr, settings())
}

/// [`start`] with other settings (tests of the transport's own bounds).
#[allow(dead_code)] // Used by tests/conformance.rs, not by `main`.
pub fn start_with(
    addr: SocketAddr,
    settings: Settings,
) -> std::io::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let mut server = Server::bind(addr, settings, Fixture::default())?;
    let bound = server.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("conformance-fixture".to_string())
        .spawn(move || server.run())?;
    Ok((bound, handle))
}

#[allow(dead_code)] // The test binary includes this file as a module.
fn main() -> std::io::Result<()> {
    let arg = std::env::args().nth(1);
    let text = arg.as_deref().unwrap_or(DEFAULT_ADDR);
    let addr: SocketAddr = text.parse().map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("bad address {text:?}: {e}"),
        )
    })?;
    let mut server = Server::bind(addr, settings(), Fixture::default())?;
    eprintln!("conformance fixture listening on {}", server.local_addr()?);
    server.run()
}

/// One Engine.IO session's state.
#[derive(Debug, Default)]
struct Session {
    /// Whether the session is on `/socket.io/` (else it is an echo).
    socket_io: bool,
    /// Until a namespace is joined the connect timeout applies.
    awaiting_connect: bool,
    root: bool,
    custom: bool,
    /// The `auth` emit waiting for [`AUTH_EMIT_DELAY`].
    auth_due: Option<Vec<u8>>,
    /// A binary packet's attachments still to come.
    attachments: Reassembly,
}

impl Session {
    fn joined(&self, nsp: &str) -> bool {
        match nsp {
            NSP_ROOT => self.root,
            NSP_CUSTOM => self.custom,
            _ => false,
        }
    }

    fn set_joined(&mut self, nsp: &str, joined: bool) {
        match nsp {
            NSP_ROOT => self.root = joined,
            NSP_CUSTOM => self.custom = joined,
            _ => {}
        }
    }
}

/// The fixture's [`Handler`]: sessions by connection id.
#[derive(Debug, Default)]
pub struct Fixture {
    sessions: Vec<Option<Session>>,
    /// Counter behind the Socket.IO session ids (unique per fixture).
    sids_issued: u64,
}

impl Fixture {
    fn session(&mut self, conn: ConnId) -> Option<&mut Session> {
        self.sessions.get_mut(conn)?.as_mut()
    }

    fn on_text(&mut self, io: &mut dyn Sink, conn: ConnId, text: &str) {
        let Some(session) = self.session(conn) else {
            return;
        };
        if session.attachments.pending() {
            // Text while attachments are awaited breaks the packet format.
            return io.close(conn);
        }
        let Ok(packet) = socketio::decode(text) else {
            return io.close(conn);
        };
        if packet.kind.is_binary() && packet.attachments > 0 {
            session.attachments.start(text, packet.attachments);
            return;
        }
        self.on_packet(io, conn, &packet, &[]);
    }

    fn on_binary(&mut self, io: &mut dyn Sink, conn: ConnId, bytes: &[u8]) {
        let Some(session) = self.session(conn) else {
            return;
        };
        // A binary frame nobody announced is an error too (push says so).
        match session.attachments.push(bytes, MESSAGE_BYTES_MAX) {
            Ok(None) => {}
            Ok(Some((text, parts))) => match socketio::decode(&text) {
                Ok(packet) => self.on_packet(io, conn, &packet, &parts),
                Err(_) => io.close(conn),
            },
            Err(_) => io.close(conn),
        }
    }

    /// Sends the `auth` emit if it is still waiting.
    fn send_auth_due(&mut self, io: &mut dyn Sink, conn: ConnId) {
        if let Some(emit) = self.session(conn).and_then(|s| s.auth_due.take()) {
            io.send_text(conn, &[&emit]);
        }
    }

    fn on_packet(
        &mut self,
        io: &mut dyn Sink,
        conn: ConnId,
        p: &Packet<'_>,
        attachments: &[Vec<u8>],
    ) {
        self.send_auth_due(io, conn);
        match p.kind {
            PacketType::Connect => self.connect(io, conn, p),
            PacketType::Disconnect => {
                if let Some(session) = self.session(conn) {
                    session.set_joined(p.nsp, false);
                }
            }
            PacketType::Event | PacketType::BinaryEvent => self.event(io, conn, p, attachments),
            // The fixture asks for no acks; stray ones are ignored.
            PacketType::Ack | PacketType::BinaryAck => {}
            // Only servers send CONNECT_ERROR.
            PacketType::ConnectError => io.close(conn),
        }
    }

    /// CONNECT: answer with a sid, then emit `auth` with the payload
    /// (Socket.IO v5 test suite, "connect").
    fn connect(&mut self, io: &mut dyn Sink, conn: ConnId, p: &Packet<'_>) {
        if p.nsp != NSP_ROOT && p.nsp != NSP_CUSTOM {
            let head = socketio::encode(PacketType::ConnectError, 0, p.nsp, None, "");
            io.send_text(conn, &[&head, br#"{"message":"Invalid namespace"}"#]);
            return;
        }
        let auth = if p.data.is_empty() {
            "{}"
        } else if serde_json::from_str::<&RawValue>(p.data).is_ok() {
            p.data
        } else {
            return io.close(conn);
        };
        self.sids_issued += 1;
        let sid = format!("{{\"sid\":\"fixture-{:x}\"}}", self.sids_issued);
        let Some(session) = self.session(conn) else {
            return;
        };
        session.set_joined(p.nsp, true);
        session.awaiting_connect = false;
        let mut emit = socketio::encode(PacketType::Event, 0, p.nsp, None, "[\"auth\",");
        emit.extend_from_slice(auth.as_bytes());
        emit.push(b']');
        session.auth_due = Some(emit);
        let head = socketio::encode(PacketType::Connect, 0, p.nsp, None, "");
        io.send_text(conn, &[&head, sid.as_bytes()]);
        io.set_timer(conn, Some(io.now() + AUTH_EMIT_DELAY));
    }

    /// EVENT / BINARY_EVENT: `message` comes back as `message-back`,
    /// `message-with-ack` is acked with its arguments.
    fn event(&mut self, io: &mut dyn Sink, conn: ConnId, p: &Packet<'_>, attachments: &[Vec<u8>]) {
        let Ok(ev) = socketio::parse_event(p.data) else {
            return io.close(conn);
        };
        if p.attachments > 0 && !socketio::placeholders_valid(p.data, p.attachments) {
            return io.close(conn);
        }
        // Events for a namespace the socket is not in are ignored, as
        // Socket.IO servers do.
        if !self.session(conn).is_some_and(|s| s.joined(p.nsp)) {
            return;
        }
        let binary = !attachments.is_empty();
        let mut head = Vec::with_capacity(32);
        match (&*ev.name, p.id) {
            ("message", _) => {
                let kind = if binary {
                    PacketType::BinaryEvent
                } else {
                    PacketType::Event
                };
                socketio::write_header(&mut head, kind, attachments.len(), p.nsp, None);
                head.extend_from_slice(b"[\"message-back\"");
                if !ev.args.is_empty() {
                    head.push(b',');
                }
            }
            ("message-with-ack", Some(id)) => {
                let kind = if binary {
                    PacketType::BinaryAck
                } else {
                    PacketType::Ack
                };
                socketio::write_header(&mut head, kind, attachments.len(), p.nsp, Some(id));
                head.push(b'[');
            }
            _ => return,
        }
        let args = join_args(&ev.args);
        if io.send_text(conn, &[&head, args.as_bytes(), b"]"]) {
            for a in attachments {
                io.send_binary(conn, a);
            }
        }
    }
}

/// The arguments' JSON texts, comma-separated, as they arrived.
fn join_args(args: &[&RawValue]) -> String {
    let texts: Vec<&str> = args.iter().map(|a| a.get()).collect();
    texts.join(",")
}

impl Handler for Fixture {
    fn endpoint(&self, path: &str) -> Option<u8> {
        match path {
            "/engine.io/" | "/engine.io" => Some(ENDPOINT_ENGINE),
            "/socket.io/" | "/socket.io" => Some(ENDPOINT_SOCKET),
            _ => None,
        }
    }

    fn http(&mut self, _io: &mut dyn Sink, _req: &Request) -> Response {
        Response::json(404, r#"{"error":"not found"}"#)
    }

    fn opened(&mut self, io: &mut dyn Sink, conn: ConnId, endpoint: u8) {
        if self.sessions.len() <= conn {
            self.sessions.resize_with(conn + 1, || None);
        }
        let socket_io = endpoint == ENDPOINT_SOCKET;
        self.sessions[conn] = Some(Session {
            socket_io,
            awaiting_connect: socket_io,
            ..Session::default()
        });
        if socket_io {
            io.set_timer(conn, Some(io.now() + CONNECT_TIMEOUT));
        }
    }

    fn message(&mut self, io: &mut dyn Sink, conn: ConnId, payload: Payload<'_>) {
        let Some(session) = self.session(conn) else {
            return;
        };
        match (session.socket_io, payload) {
            (false, Payload::Text(t)) => {
                io.send_text(conn, &[t.as_bytes()]);
            }
            (false, Payload::Binary(b)) => {
                io.send_binary(conn, b);
            }
            (true, Payload::Text(t)) => self.on_text(io, conn, t),
            (true, Payload::Binary(b)) => self.on_binary(io, conn, b),
        }
    }

    fn closed(&mut self, _io: &mut dyn Sink, conn: ConnId) {
        if let Some(slot) = self.sessions.get_mut(conn) {
            *slot = None;
        }
    }

    fn timer(&mut self, io: &mut dyn Sink, conn: ConnId) {
        self.send_auth_due(io, conn);
        // The connect timeout: no namespace joined in time.
        if self.session(conn).is_some_and(|s| s.awaiting_connect) {
            io.close(conn);
        }
    }

    fn tick(&mut self, _io: &mut dyn Sink) {}

    fn next_deadline(&self) -> Option<std::time::Instant> {
        None
    }
}
