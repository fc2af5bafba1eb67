//! The read side of one link of the Rust client: decodes WebSocket frames,
//! answers Engine.IO pings, hands acks to their waiters and `msg`
//! deliveries to their subscriptions, and says why the link ended.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use super::shared::{Link, ReceivedAck, Shared};
use super::wire::{self, FrameDecoder, WsMessage};
use super::{Message, CLOSE_NORMAL, READ_CHUNK_BYTES};
use crate::protocol::engineio;
use crate::protocol::socketio::{self, PacketType, ATTACHMENTS_FROM_SERVER_MAX};

/// A binary packet whose attachments are still arriving.
struct PartialBinary {
    kind: PacketType,
    ack_id: Option<u64>,
    args: Value,
    raw: Option<String>,
    expected: usize,
    attachments: Vec<Vec<u8>>,
    /// Bytes on the wire so far: the packet text and its attachments.
    bytes: usize,
}

/// The reader must stop, and why: the peer closed, went silent, or broke
/// the wire format (which the Socket.IO spec answers by closing).
struct Stop(String);

fn stop(reason: impl Into<String>) -> Stop {
    Stop(reason.into())
}

/// The read half of a link, as the handshake left it.
pub(crate) struct ReadHalf {
    pub(crate) stream: TcpStream,
    pub(crate) decoder: FrameDecoder,
    /// How long the server may stay silent before the link counts as dead
    /// (its `pingInterval + pingTimeout`); `None` waits forever.
    pub(crate) silence_max: Option<Duration>,
}

pub(crate) struct Reader<'a> {
    shared: &'a Shared,
    link: &'a Link,
    half: ReadHalf,
    partial: Option<PartialBinary>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(shared: &'a Shared, link: &'a Link, half: ReadHalf) -> Self {
        Reader {
            shared,
            link,
            half,
            partial: None,
        }
    }

    /// Reads until the link ends; returns why it ended.
    pub(crate) fn run(mut self) -> String {
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        if let Err(e) = self.half.stream.set_read_timeout(self.half.silence_max) {
            return format!("cannot arm the heartbeat timeout: {e}");
        }
        loop {
            loop {
                match self.half.decoder.next() {
                    Ok(Some(message)) => {
                        if let Err(Stop(reason)) = self.on_message(message) {
                            return reason;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return format!("bad frame from the server: {e}"),
                }
            }
            match self.half.stream.read(&mut chunk) {
                Ok(0) => return "the server closed the connection".to_string(),
                Ok(n) => self.half.decoder.push(chunk.get(..n).unwrap_or(&[])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return "no heartbeat from the server in pingInterval + pingTimeout".to_string()
                }
                Err(e) => return format!("read failed: {e}"),
            }
        }
    }

    fn on_message(&mut self, message: WsMessage) -> Result<(), Stop> {
        match message {
            WsMessage::Text(text) => self.on_text(&text),
            WsMessage::Binary(bytes) => self.on_binary(bytes),
            WsMessage::Ping(payload) => {
                // RFC 6455 §5.5.3: answer with the same application data.
                let _ = self
                    .link
                    .writer()
                    .send_control(wire::pong_opcode(), &payload);
                Ok(())
            }
            WsMessage::Pong => Ok(()),
            WsMessage::Close => {
                // RFC 6455 §5.5.1: echo the close unless we started it.
                let _ = self.link.writer().send_close(CLOSE_NORMAL);
                Err(stop("the server closed the WebSocket"))
            }
        }
    }

    fn on_text(&mut self, text: &str) -> Result<(), Stop> {
        match engineio::decode(text).map_err(|e| stop(format!("bad Engine.IO packet: {e}")))? {
            // Engine.IO v4 "heartbeat": the server pings, the client pongs.
            engineio::Packet::Ping(_) => {
                let _ = self.link.send("3", &[]);
                self.shared.pongs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            engineio::Packet::Close => Err(stop("the server closed the Engine.IO session")),
            engineio::Packet::Message(body) => self.on_socket_io(body),
            engineio::Packet::Open(_)
            | engineio::Packet::Pong(_)
            | engineio::Packet::Upgrade
            | engineio::Packet::Noop => Ok(()),
        }
    }

    fn on_socket_io(&mut self, body: &str) -> Result<(), Stop> {
        let packet = socketio::decode_with(body, ATTACHMENTS_FROM_SERVER_MAX)
            .map_err(|e| stop(format!("bad Socket.IO packet: {e}")))?;
        if packet.nsp != self.shared.opts.namespace {
            return Ok(());
        }
        match packet.kind {
            PacketType::Disconnect => Err(stop("the server disconnected the namespace")),
            PacketType::ConnectError => Err(stop("the server refused the namespace")),
            PacketType::Connect => Ok(()),
            PacketType::Event
            | PacketType::Ack
            | PacketType::BinaryEvent
            | PacketType::BinaryAck => {
                let args: Value = serde_json::from_str(packet.data)
                    .map_err(|e| stop(format!("bad packet arguments: {e}")))?;
                let is_ack = matches!(packet.kind, PacketType::Ack | PacketType::BinaryAck);
                let raw = if is_ack && self.shared.opts.raw_acks {
                    first_arg_text(packet.data)
                } else {
                    None
                };
                if packet.attachments == 0 {
                    self.dispatch(packet.kind, packet.id, (args, raw), Vec::new(), body.len());
                } else {
                    self.partial = Some(PartialBinary {
                        kind: packet.kind,
                        ack_id: packet.id,
                        args,
                        raw,
                        expected: packet.attachments,
                        attachments: Vec::new(),
                        bytes: body.len(),
                    });
                }
                Ok(())
            }
        }
    }

    fn on_binary(&mut self, bytes: Vec<u8>) -> Result<(), Stop> {
        let Some(mut partial) = self.partial.take() else {
            // An attachment nobody announced breaks the Socket.IO format.
            return Err(stop("a binary attachment nobody announced"));
        };
        partial.bytes = partial.bytes.saturating_add(bytes.len());
        partial.attachments.push(bytes);
        if partial.attachments.len() < partial.expected {
            self.partial = Some(partial);
        } else {
            self.dispatch(
                partial.kind,
                partial.ack_id,
                (partial.args, partial.raw),
                partial.attachments,
                partial.bytes,
            );
        }
        Ok(())
    }

    /// Routes one complete packet that took `bytes` on the wire.
    fn dispatch(
        &self,
        kind: PacketType,
        ack_id: Option<u64>,
        (args, raw): (Value, Option<String>),
        attachments: Vec<Vec<u8>>,
        bytes: usize,
    ) {
        let Value::Array(mut args) = args else {
            return;
        };
        match kind {
            PacketType::Ack | PacketType::BinaryAck => {
                let Some(id) = ack_id else { return };
                let value = if args.is_empty() {
                    Value::Null
                } else {
                    args.swap_remove(0)
                };
                self.shared.acked(
                    id,
                    ReceivedAck {
                        value,
                        attachments,
                        raw,
                    },
                );
            }
            PacketType::Event | PacketType::BinaryEvent => {
                if args.first().and_then(Value::as_str) != Some("msg") || args.len() < 2 {
                    return;
                }
                let arg = args.swap_remove(1);
                let Some(message) = Message::from_event(arg, attachments) else {
                    return;
                };
                self.shared.deliver(message, bytes);
            }
            _ => {}
        }
    }
}

/// The JSON text of the first element of an argument array, as sent.
fn first_arg_text(payload: &str) -> Option<String> {
    let args: Vec<&serde_json::value::RawValue> = serde_json::from_str(payload).ok()?;
    args.first().map(|a| a.get().to_string())
}
