//! Opening one connection of the Rust client: TCP, the HTTP upgrade
//! (RFC 6455 §4.1), the Engine.IO open packet and the Socket.IO CONNECT,
//! all bounded by the connect timeout. The result is a socket ready for
//! the reader, with any bytes that arrived behind the handshake.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::OpCode;

use super::wire::{self, FrameDecoder, MaskRng, WsMessage};
use super::{Error, Options, Resolve, MESSAGE_BYTES_MAX};
use crate::protocol::engineio::{self, Opened};
use crate::protocol::socketio::{self, PacketType, ATTACHMENTS_FROM_SERVER_MAX};

/// A connection that finished its handshake.
pub(crate) struct Dialed {
    /// The address it was opened with, as the caller gave it.
    pub(crate) url: String,
    pub(crate) stream: TcpStream,
    /// Holds any frames that arrived right behind the CONNECT ack.
    pub(crate) decoder: FrameDecoder,
    pub(crate) rng: MaskRng,
    pub(crate) open: Opened,
}

/// Connects to `url` and joins `opts.namespace`. `watch` sees the socket
/// as soon as TCP connects, so the caller can cut a handshake short.
pub(crate) fn dial(
    url: &str,
    opts: &Options,
    watch: impl FnOnce(&TcpStream),
) -> Result<Dialed, Error> {
    let target = wire::parse_target(url).map_err(|e| Error::Handshake(e.0))?;
    let deadline = Instant::now() + opts.timeout;
    let stream = tcp_connect(&target.host_port, opts.resolve, opts.timeout)?;
    watch(&stream);
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(opts.timeout))?;
    let mut handshake = Handshake {
        stream,
        decoder: FrameDecoder::new(MESSAGE_BYTES_MAX),
        deadline,
        rng: MaskRng::new(),
    };
    handshake.upgrade(&target)?;
    let open = handshake.await_open()?;
    handshake.join_namespace(opts)?;
    let Handshake {
        stream,
        decoder,
        rng,
        ..
    } = handshake;
    stream.set_read_timeout(None)?;
    Ok(Dialed {
        url: url.to_string(),
        stream,
        decoder,
        rng,
        open,
    })
}

struct Handshake {
    stream: TcpStream,
    decoder: FrameDecoder,
    deadline: Instant,
    rng: MaskRng,
}

impl Handshake {
    /// Reads more bytes, bounded by the connect deadline.
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(buf) {
                Ok(0) => return Err(Error::Handshake("server closed the connection".into())),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout)
                }
                Err(e) => return Err(Error::Io(e)),
            }
        }
    }

    fn upgrade(&mut self, target: &wire::Target) -> Result<(), Error> {
        let key = tungstenite::handshake::client::generate_key();
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        self.stream
            .write_all(wire::upgrade_request(target, &key).as_bytes())?;
        let mut head = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = self.read_some(&mut chunk)?;
            head.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
            let checked =
                wire::check_upgrade_response(&head, &accept).map_err(|e| Error::Handshake(e.0))?;
            if let Some(head_len) = checked {
                self.decoder.push(head.get(head_len..).unwrap_or(&[]));
                return Ok(());
            }
        }
    }

    /// The next text frame, answering WebSocket pings on the way.
    fn next_text(&mut self) -> Result<String, Error> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.decoder.next().map_err(|e| Error::Handshake(e.0))? {
                Some(WsMessage::Text(text)) => return Ok(text),
                Some(WsMessage::Ping(payload)) => self.send(wire::pong_opcode(), &payload)?,
                Some(WsMessage::Close) => {
                    return Err(Error::Handshake("server closed the WebSocket".into()))
                }
                Some(WsMessage::Binary(_) | WsMessage::Pong) => {}
                None => {
                    let n = self.read_some(&mut chunk)?;
                    self.decoder.push(chunk.get(..n).unwrap_or(&[]));
                }
            }
        }
    }

    fn send(&mut self, opcode: OpCode, payload: &[u8]) -> Result<(), Error> {
        let mut out = Vec::new();
        wire::encode_frame(&mut out, opcode, payload, self.rng.next_mask());
        self.stream.write_all(&out)?;
        Ok(())
    }

    fn await_open(&mut self) -> Result<Opened, Error> {
        let text = self.next_text()?;
        match engineio::decode(&text).map_err(|e| Error::Handshake(e.to_string()))? {
            engineio::Packet::Open(json) => {
                engineio::decode_open(json).map_err(|e| Error::Handshake(e.to_string()))
            }
            _ => Err(Error::Handshake(format!(
                "expected the Engine.IO open packet, got {text:?}"
            ))),
        }
    }

    fn join_namespace(&mut self, opts: &Options) -> Result<(), Error> {
        let auth = match &opts.token {
            Some(token) => json!({ "token": token }).to_string(),
            None => String::new(),
        };
        let connect =
            socketio::encode_message(PacketType::Connect, 0, &opts.namespace, None, &auth);
        self.send(wire::text_opcode(), connect.as_bytes())?;
        loop {
            let text = self.next_text()?;
            let packet = engineio::decode(&text).map_err(|e| Error::Handshake(e.to_string()))?;
            let body = match packet {
                engineio::Packet::Ping(_) => {
                    self.send(wire::text_opcode(), b"3")?;
                    continue;
                }
                engineio::Packet::Close => {
                    return Err(Error::Handshake("server sent close".into()))
                }
                engineio::Packet::Message(body) => body,
                _ => continue,
            };
            let sio = socketio::decode_with(body, ATTACHMENTS_FROM_SERVER_MAX)
                .map_err(|e| Error::Handshake(e.to_string()))?;
            if sio.nsp != opts.namespace {
                continue;
            }
            match sio.kind {
                PacketType::Connect => return Ok(()),
                PacketType::ConnectError => {
                    let message = serde_json::from_str::<Value>(sio.data)
                        .ok()
                        .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
                        .unwrap_or_else(|| sio.data.to_string());
                    let _ = self.stream.shutdown(Shutdown::Both);
                    return Err(Error::ConnectRefused(message));
                }
                _ => continue,
            }
        }
    }
}

/// A plain HTTP GET of `path` on the server `url` names (the broker's
/// `/healthz` and `/metrics`, contract section 8), bounded by `timeout`:
/// the status code and the body.
pub fn http_get(url: &str, path: &str, timeout: Duration) -> Result<(u16, String), Error> {
    let target = wire::parse_target(url).map_err(|e| Error::Handshake(e.0))?;
    let mut stream = tcp_connect(&target.host_port, super::resolve_names, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.host_port
    )?;
    let mut text = Vec::new();
    stream.read_to_end(&mut text)?;
    let text = String::from_utf8_lossy(&text);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Protocol("an HTTP answer without its header end".into()))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Protocol(format!("not an HTTP status line: {head:.40}")))?;
    Ok((code, body.to_string()))
}

fn tcp_connect(host_port: &str, resolve: Resolve, timeout: Duration) -> Result<TcpStream, Error> {
    let mut last = None;
    for addr in resolve(host_port)? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => Error::Io(e),
        None => Error::Handshake(format!("{host_port} resolves to no address")),
    })
}
