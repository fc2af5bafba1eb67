//! The Rust client of gombus: a blocking Socket.IO v5 client (Engine.IO v4
//! over WebSocket, no TLS) that speaks the broker's events.
//!
//! One [`Client`] is one Socket.IO connection to one namespace. A background
//! reader thread owns the read half of the TCP stream: it answers Engine.IO
//! pings, hands acks to the call waiting for them (one channel per call, so a
//! round trip has no polling delay) and pushes `msg` deliveries into the
//! channel of their [`Subscription`]. Callers write whole frames under a
//! mutex on the other half of the stream.
//!
//! ```no_run
//! use std::time::Duration;
//! use gombus::client::Client;
//!
//! # fn main() -> Result<(), gombus::client::Error> {
//! let client = Client::connect("127.0.0.1:8080")?;
//! let sub = client.subscribe("orders.*")?;
//! client.publish("orders.new", serde_json::json!({"id": 7}))?;
//! let msg = sub.recv_timeout(Duration::from_secs(1))?;
//! assert_eq!(msg.subject, "orders.new");
//!
//! // Bytes travel as a Socket.IO binary attachment and come back as bytes.
//! client.publish_bytes("blobs.raw", &[0, 1, 2])?;
//! client.close()
//! # }
//! ```

mod stream;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::OpCode;

pub use stream::{
    ConsumerConfig, ConsumerInfo, PubAck, SeqPair, StoredMessage, StreamConfig, StreamDelivery,
    StreamInfo, StreamState,
};
use wire::{EioPacket, FrameDecoder, MaskRng, SioKind, WsMessage};

/// Largest WebSocket message the client accepts from the server, in bytes.
const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Size of the reader thread's read buffer, in bytes.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest a clean close waits for the server to close its side.
const CLOSE_WAIT_MAX: Duration = Duration::from_secs(2);
/// WebSocket close status "normal closure" (RFC 6455 §7.4.1).
const CLOSE_NORMAL: u16 = 1000;

// ---------------------------------------------------------------------------
// Public types.
// ---------------------------------------------------------------------------

/// Connection options; [`Options::default`] connects to `/` without a token
/// and waits at most 5 s for the handshake and for each ack.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sent as the CONNECT auth payload `{"token": …}` when set.
    pub token: Option<String>,
    /// The Socket.IO namespace, `/` for messaging or `/control`.
    pub namespace: String,
    /// Bound on connecting and on waiting for any ack.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            namespace: "/".to_string(),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Everything a client call can fail with.
#[derive(Debug)]
pub enum Error {
    /// The socket failed.
    Io(io::Error),
    /// The HTTP upgrade or the Engine.IO open exchange failed.
    Handshake(String),
    /// The server answered the Socket.IO CONNECT with CONNECT_ERROR; the
    /// string is its `message` (e.g. `unauthorized`).
    ConnectRefused(String),
    /// The server acked `{"ok":false,"error":{code,message}}`.
    Server { code: String, message: String },
    /// No ack (or message) arrived in time.
    Timeout,
    /// The connection is closed.
    Closed,
    /// The peer broke the wire format, or a request could not be encoded.
    Protocol(String),
}

impl Error {
    /// The contract's error code for a [`Error::Server`], e.g. `not_found`.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "i/o error: {e}"),
            Error::Handshake(m) => write!(f, "handshake failed: {m}"),
            Error::ConnectRefused(m) => write!(f, "connection refused by server: {m}"),
            Error::Server { code, message } => write!(f, "server error {code}: {message}"),
            Error::Timeout => f.write_str("timed out"),
            Error::Closed => f.write_str("connection closed"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Equality for tests: I/O errors compare by kind.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Error::Io(a), Error::Io(b)) => a.kind() == b.kind(),
            (Error::Handshake(a), Error::Handshake(b)) => a == b,
            (Error::ConnectRefused(a), Error::ConnectRefused(b)) => a == b,
            (
                Error::Server { code, message },
                Error::Server {
                    code: c2,
                    message: m2,
                },
            ) => code == c2 && message == m2,
            (Error::Timeout, Error::Timeout) => true,
            (Error::Closed, Error::Closed) => true,
            (Error::Protocol(a), Error::Protocol(b)) => a == b,
            _ => false,
        }
    }
}

/// A delivered message (or a request's reply).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The subscription it was delivered to; empty for a request's reply.
    pub sid: String,
    pub subject: String,
    /// The JSON `data`. Binary attachments stay in it as Socket.IO
    /// placeholders `{"_placeholder":true,"num":n}`; see [`Message::bytes`].
    pub data: Value,
    pub reply: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    /// The binary attachments, indexed by the placeholders' `num`.
    pub attachments: Vec<Vec<u8>>,
    /// Set on a push consumer's delivery: which stream message it is.
    pub stream: Option<StreamDelivery>,
}

impl Message {
    /// The bytes when `data` is exactly one binary attachment (what
    /// [`Client::publish_bytes`] sends).
    pub fn bytes(&self) -> Option<&[u8]> {
        let num = wire::placeholder_num(&self.data)?;
        self.attachments.get(num).map(Vec::as_slice)
    }

    /// Parses a `msg` event argument; `None` if `sid` or `subject` is missing.
    fn from_event(arg: Value, attachments: Vec<Vec<u8>>) -> Option<Message> {
        let Value::Object(mut fields) = arg else {
            return None;
        };
        let sid = take_string(&mut fields, "sid")?;
        let subject = take_string(&mut fields, "subject")?;
        Some(Message {
            sid,
            subject,
            data: fields.remove("data").unwrap_or(Value::Null),
            reply: take_string(&mut fields, "reply"),
            headers: take_headers(&mut fields),
            attachments,
            stream: stream::delivery(&fields),
        })
    }
}

/// What a message carries: JSON, or raw bytes sent as a binary attachment.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Json(Value),
    Bytes(Vec<u8>),
}

/// A message to publish or request with every optional field.
#[derive(Debug, Clone, PartialEq)]
pub struct OutMessage {
    pub subject: String,
    pub data: Payload,
    pub reply: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

impl OutMessage {
    pub fn new(subject: &str, data: Payload) -> Self {
        OutMessage {
            subject: subject.to_string(),
            data,
            reply: None,
            headers: None,
        }
    }

    pub fn with_reply(mut self, reply: &str) -> Self {
        self.reply = Some(reply.to_string());
        self
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_string(), value.to_string());
        self
    }

    /// The event argument and its attachments.
    fn encode(&self) -> (Value, Vec<Vec<u8>>) {
        let (data, attachments) = match &self.data {
            Payload::Json(v) => (v.clone(), Vec::new()),
            Payload::Bytes(b) => (wire::placeholder(0), vec![b.clone()]),
        };
        let mut arg = json!({ "subject": self.subject, "data": data });
        if let Some(reply) = &self.reply {
            arg["reply"] = json!(reply);
        }
        if let Some(headers) = &self.headers {
            arg["headers"] = json!(headers);
        }
        (arg, attachments)
    }
}

fn take_string(fields: &mut serde_json::Map<String, Value>, key: &str) -> Option<String> {
    match fields.remove(key)? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

fn take_headers(fields: &mut serde_json::Map<String, Value>) -> Option<BTreeMap<String, String>> {
    let Value::Object(map) = fields.remove("headers")? else {
        return None;
    };
    Some(
        map.into_iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k, s)),
                _ => None,
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------
// Shared state between callers and the reader thread.
// ---------------------------------------------------------------------------

/// An ack as received: its single argument and any attachments.
#[derive(Debug)]
struct Reply {
    value: Value,
    attachments: Vec<Vec<u8>>,
}

/// Where incoming packets go. Locked briefly; never held across I/O.
#[derive(Debug, Default)]
struct Routes {
    next_ack_id: u64,
    pending: HashMap<u64, SyncSender<Reply>>,
    subs: HashMap<String, Sender<Message>>,
    closed: bool,
}

/// The write half: whole packets (text frame plus attachments) are written
/// under this lock so frames of two callers never interleave.
struct Writer {
    stream: TcpStream,
    rng: MaskRng,
    buf: Vec<u8>,
    /// RFC 6455 §5.5.1: an endpoint sends at most one close frame.
    close_sent: bool,
}

impl Writer {
    fn send_packet(&mut self, text: &str, attachments: &[Vec<u8>]) -> io::Result<()> {
        self.buf.clear();
        let mask = self.rng.next_mask();
        wire::encode_frame(&mut self.buf, wire::text_opcode(), text.as_bytes(), mask);
        for bytes in attachments {
            let mask = self.rng.next_mask();
            wire::encode_frame(&mut self.buf, wire::binary_opcode(), bytes, mask);
        }
        self.stream.write_all(&self.buf)
    }

    /// Sends the WebSocket close frame unless one went out already.
    fn send_close(&mut self, code: u16) -> io::Result<()> {
        if self.close_sent {
            return Ok(());
        }
        self.close_sent = true;
        self.send_control(wire::close_opcode(), &code.to_be_bytes())
    }

    fn send_control(&mut self, opcode: OpCode, payload: &[u8]) -> io::Result<()> {
        self.buf.clear();
        let mask = self.rng.next_mask();
        wire::encode_frame(&mut self.buf, opcode, payload, mask);
        self.stream.write_all(&self.buf)
    }
}

struct Shared {
    namespace: String,
    timeout: Duration,
    /// The server's `maxPayload`: a packet beyond it would close the
    /// connection, so the client refuses to send it.
    max_payload: Option<u64>,
    writer: Mutex<Writer>,
    routes: Mutex<Routes>,
    /// Signalled when `routes.closed` becomes true.
    closed_signal: Condvar,
    /// A third handle on the socket so shutdown never waits for a writer.
    socket: TcpStream,
    next_sid: AtomicU64,
    /// Engine.IO pings answered since the connection opened.
    pongs: AtomicU64,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding the lock leaves plain maps behind; they are
        // still consistent, so keep going.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection closed: waiting calls and subscriptions see
    /// their channels disconnect, which they report as [`Error::Closed`].
    fn mark_closed(&self) {
        let mut routes = self.routes();
        routes.closed = true;
        routes.pending.clear();
        routes.subs.clear();
        drop(routes);
        self.closed_signal.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.routes().closed
    }

    fn wait_closed(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut routes = self.routes();
        while !routes.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            routes = match self.closed_signal.wait_timeout(routes, left) {
                Ok((guard, _)) => guard,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Sends `[event, arg]` with `attachments`; with `ack_wait` set, waits
    /// that long for the ack and checks `ok`.
    fn emit(
        &self,
        event: &str,
        arg: Value,
        attachments: &[Vec<u8>],
        ack_wait: Option<Duration>,
    ) -> Result<Option<Reply>, Error> {
        let payload = serde_json::to_string(&json!([event, arg]))
            .map_err(|e| Error::Protocol(format!("cannot encode {event}: {e}")))?;
        let kind = if attachments.is_empty() {
            SioKind::Event
        } else {
            SioKind::BinaryEvent
        };
        let ack = match ack_wait {
            Some(_) => Some(self.register_ack()?),
            None if self.is_closed() => return Err(Error::Closed),
            None => None,
        };
        let ack_id = ack.as_ref().map(|(id, _)| *id);
        let text = wire::encode_sio(kind, attachments.len(), &self.namespace, ack_id, &payload);
        if let Err(e) = self.check_size(&text, attachments).and_then(|()| {
            self.writer()
                .send_packet(&text, attachments)
                .map_err(|e| self.write_failed(e))
        }) {
            if let Some(id) = ack_id {
                self.routes().pending.remove(&id);
            }
            return Err(e);
        }
        let (Some((id, rx)), Some(wait)) = (ack, ack_wait) else {
            return Ok(None);
        };
        match rx.recv_timeout(wait) {
            Ok(reply) => check_ack(reply).map(Some),
            Err(RecvTimeoutError::Timeout) => {
                self.routes().pending.remove(&id);
                Err(Error::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }

    fn register_ack(&self) -> Result<(u64, Receiver<Reply>), Error> {
        let mut routes = self.routes();
        if routes.closed {
            return Err(Error::Closed);
        }
        let id = routes.next_ack_id;
        routes.next_ack_id = routes.next_ack_id.wrapping_add(1);
        let (tx, rx) = mpsc::sync_channel(1);
        routes.pending.insert(id, tx);
        Ok((id, rx))
    }

    fn check_size(&self, text: &str, attachments: &[Vec<u8>]) -> Result<(), Error> {
        let Some(max) = self.max_payload else {
            return Ok(());
        };
        let too_big = |n: usize| u64::try_from(n).map_or(true, |n| n > max);
        if too_big(text.len()) || attachments.iter().any(|a| too_big(a.len())) {
            return Err(Error::Protocol(format!(
                "packet exceeds the server's maxPayload of {max} bytes"
            )));
        }
        Ok(())
    }

    /// A failed or partial write leaves the peer mid-frame, so the
    /// connection cannot carry another packet: shut it down, which makes
    /// the reader mark it closed.
    fn write_failed(&self, e: io::Error) -> Error {
        let error = self.io_error(e);
        let _ = self.socket.shutdown(Shutdown::Both);
        error
    }

    fn io_error(&self, e: io::Error) -> Error {
        if self.is_closed() {
            Error::Closed
        } else {
            Error::Io(e)
        }
    }
}

fn check_ack(reply: Reply) -> Result<Reply, Error> {
    match reply.value.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(reply),
        Some(false) => {
            let error = reply.value.get("error");
            let field = |key: &str| {
                error
                    .and_then(|e| e.get(key))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            Err(Error::Server {
                code: field("code"),
                message: field("message"),
            })
        }
        None => Err(Error::Protocol(format!(
            "ack without a boolean ok: {}",
            reply.value
        ))),
    }
}

// ---------------------------------------------------------------------------
// The client.
// ---------------------------------------------------------------------------

/// A connection to one namespace of a gombus broker. `Send + Sync`: share
/// it by reference between threads. Dropping it closes the connection.
pub struct Client {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("namespace", &self.shared.namespace)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to namespace `/` of the broker at `addr` (`host:port` or
    /// `ws://host:port[/path/]`) with default [`Options`].
    pub fn connect(addr: &str) -> Result<Client, Error> {
        Client::connect_with(addr, Options::default())
    }

    /// Connects with explicit options: upgrade to WebSocket, read the
    /// Engine.IO open packet, then the Socket.IO CONNECT exchange.
    pub fn connect_with(addr: &str, opts: Options) -> Result<Client, Error> {
        let target = wire::parse_target(addr).map_err(|e| Error::Handshake(e.0))?;
        let deadline = Instant::now() + opts.timeout;
        let stream = tcp_connect(&target.host_port, opts.timeout)?;
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
        handshake.join_namespace(&opts)?;
        let Handshake {
            stream,
            decoder,
            rng,
            ..
        } = handshake;
        stream.set_read_timeout(None)?;
        let shared = Arc::new(Shared {
            namespace: opts.namespace,
            timeout: opts.timeout,
            max_payload: open.max_payload,
            writer: Mutex::new(Writer {
                stream: stream.try_clone()?,
                rng,
                buf: Vec::new(),
                close_sent: false,
            }),
            routes: Mutex::new(Routes::default()),
            closed_signal: Condvar::new(),
            socket: stream.try_clone()?,
            next_sid: AtomicU64::new(1),
            pongs: AtomicU64::new(0),
        });
        let reader_shared = Arc::clone(&shared);
        let reader = thread::Builder::new()
            .name("gombus-client-reader".to_string())
            .spawn(move || Reader::new(reader_shared, stream, decoder).run())?;
        Ok(Client {
            shared,
            reader: Some(reader),
        })
    }

    /// Subscribes to `subject` (wildcards allowed).
    pub fn subscribe(&self, subject: &str) -> Result<Subscription, Error> {
        self.subscribe_with(subject, None, None)
    }

    /// Joins queue group `queue` on `subject`.
    pub fn queue_subscribe(&self, subject: &str, queue: &str) -> Result<Subscription, Error> {
        self.subscribe_with(subject, Some(queue), None)
    }

    /// Subscribes with every option; `max` ends the subscription on the
    /// server after that many deliveries. The client picks the `sid` and
    /// routes deliveries for it before the `sub` is sent, so none is lost.
    pub fn subscribe_with(
        &self,
        subject: &str,
        queue: Option<&str>,
        max: Option<u64>,
    ) -> Result<Subscription, Error> {
        let sid = self
            .shared
            .next_sid
            .fetch_add(1, Ordering::Relaxed)
            .to_string();
        let (tx, rx) = mpsc::channel();
        {
            let mut routes = self.shared.routes();
            if routes.closed {
                return Err(Error::Closed);
            }
            routes.subs.insert(sid.clone(), tx);
        }
        let mut arg = json!({ "subject": subject, "sid": sid });
        if let Some(queue) = queue {
            arg["queue"] = json!(queue);
        }
        if let Some(max) = max {
            arg["max"] = json!(max);
        }
        if let Err(e) = self.call("sub", arg) {
            self.shared.routes().subs.remove(&sid);
            return Err(e);
        }
        Ok(Subscription {
            sid,
            rx,
            shared: Arc::clone(&self.shared),
            active: true,
        })
    }

    /// Publishes JSON `data` without asking for an ack (fire and forget).
    /// Use [`Client::ping`] afterwards to know the server processed it.
    pub fn publish(&self, subject: &str, data: impl serde::Serialize) -> Result<(), Error> {
        let msg = OutMessage::new(subject, Payload::Json(to_json(data)?));
        self.publish_msg(&msg, false).map(|_| ())
    }

    /// Publishes JSON `data` and returns the server's ack object.
    pub fn publish_acked(
        &self,
        subject: &str,
        data: impl serde::Serialize,
    ) -> Result<Value, Error> {
        let msg = OutMessage::new(subject, Payload::Json(to_json(data)?));
        self.publish_msg(&msg, true)
    }

    /// Publishes `bytes` as a binary attachment (fire and forget).
    pub fn publish_bytes(&self, subject: &str, bytes: &[u8]) -> Result<(), Error> {
        let msg = OutMessage::new(subject, Payload::Bytes(bytes.to_vec()));
        self.publish_msg(&msg, false).map(|_| ())
    }

    /// Publishes `msg`; with `acked` it waits for the ack and returns it,
    /// otherwise it returns `Value::Null` once the packet is written.
    pub fn publish_msg(&self, msg: &OutMessage, acked: bool) -> Result<Value, Error> {
        let (arg, attachments) = msg.encode();
        let wait = acked.then_some(self.shared.timeout);
        let reply = self.shared.emit("pub", arg, &attachments, wait)?;
        Ok(reply.map_or(Value::Null, |r| r.value))
    }

    /// Sends a request and waits for the first reply, at most `timeout`
    /// on the server plus the client's ack timeout for the ack to arrive.
    pub fn request(
        &self,
        subject: &str,
        data: impl serde::Serialize,
        timeout: Duration,
    ) -> Result<Message, Error> {
        let msg = OutMessage::new(subject, Payload::Json(to_json(data)?));
        self.request_msg(&msg, timeout)
    }

    /// [`Client::request`] with headers or bytes (`msg.reply` is ignored).
    pub fn request_msg(&self, msg: &OutMessage, timeout: Duration) -> Result<Message, Error> {
        let (mut arg, attachments) = msg.encode();
        if let Some(fields) = arg.as_object_mut() {
            fields.remove("reply");
            let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            fields.insert("timeout_ms".to_string(), json!(millis));
        }
        let wait = timeout.saturating_add(self.shared.timeout);
        let reply = self
            .shared
            .emit("request", arg, &attachments, Some(wait))?
            .ok_or_else(|| Error::Protocol("request without ack".to_string()))?;
        let Value::Object(mut fields) = reply.value else {
            return Err(Error::Protocol("request ack is not an object".to_string()));
        };
        Ok(Message {
            sid: String::new(),
            subject: take_string(&mut fields, "subject").unwrap_or_default(),
            data: fields.remove("data").unwrap_or(Value::Null),
            reply: None,
            stream: None,
            headers: take_headers(&mut fields),
            attachments: reply.attachments,
        })
    }

    /// A flush barrier: returns once the server processed every event this
    /// connection sent before it.
    pub fn ping(&self) -> Result<(), Error> {
        self.call("ping", json!({})).map(|_| ())
    }

    /// Sends any event with an ack id and returns the ack object, e.g.
    /// `server.info` on `/control`. `ok:false` becomes [`Error::Server`].
    pub fn call(&self, event: &str, args: Value) -> Result<Value, Error> {
        let reply = self
            .shared
            .emit(event, args, &[], Some(self.shared.timeout))?
            .ok_or_else(|| Error::Protocol(format!("{event} without ack")))?;
        Ok(reply.value)
    }

    /// Sends any event without an ack id (fire and forget).
    pub fn emit(&self, event: &str, args: Value) -> Result<(), Error> {
        self.shared.emit(event, args, &[], None).map(|_| ())
    }

    /// Ends subscription `sid` on the server after `after` more messages.
    pub fn unsubscribe_after(&self, sid: &str, after: u64) -> Result<(), Error> {
        self.call("unsub", json!({ "sid": sid, "after": after }))
            .map(|_| ())
    }

    /// How many of the server's heartbeat pings this client has answered.
    pub fn heartbeats(&self) -> u64 {
        self.shared.pongs.load(Ordering::Relaxed)
    }

    /// Whether the connection is closed (by either side).
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Closes cleanly: Socket.IO DISCONNECT, then a WebSocket close frame,
    /// then waits briefly for the server to close its side.
    pub fn close(mut self) -> Result<(), Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        let Some(reader) = self.reader.take() else {
            return Ok(());
        };
        let shared = &self.shared;
        let mut result = Ok(());
        if !shared.is_closed() {
            let text = wire::encode_sio(SioKind::Disconnect, 0, &shared.namespace, None, "");
            let mut writer = shared.writer();
            result = writer
                .send_packet(&text, &[])
                .and_then(|()| writer.send_close(CLOSE_NORMAL))
                .map_err(|e| shared.io_error(e));
            drop(writer);
            // Half-close so a server that waits for EOF sees it.
            let _ = shared.socket.shutdown(Shutdown::Write);
            shared.wait_closed(shared.timeout.min(CLOSE_WAIT_MAX));
        }
        let _ = shared.socket.shutdown(Shutdown::Both);
        if reader.join().is_err() && result.is_ok() {
            result = Err(Error::Protocol("client reader thread panicked".to_string()));
        }
        result
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

fn to_json(data: impl serde::Serialize) -> Result<Value, Error> {
    serde_json::to_value(data).map_err(|e| Error::Protocol(format!("data is not JSON: {e}")))
}

fn tcp_connect(host_port: &str, timeout: Duration) -> Result<TcpStream, Error> {
    let mut last = None;
    for addr in host_port.to_socket_addrs()? {
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

// ---------------------------------------------------------------------------
// Subscriptions.
// ---------------------------------------------------------------------------

/// Deliveries of one subscription. The channel behind it is unbounded in
/// this version: a subscriber that never reads lets messages pile up in
/// memory. Dropping it unsubscribes (best effort, without waiting).
#[derive(Debug)]
pub struct Subscription {
    sid: String,
    rx: Receiver<Message>,
    shared: Arc<Shared>,
    active: bool,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The subscription id, as used by `unsub` and in [`Message::sid`].
    pub fn sid(&self) -> &str {
        &self.sid
    }

    /// Blocks until a message arrives or the connection closes.
    pub fn recv(&self) -> Result<Message, Error> {
        self.rx.recv().map_err(|_| Error::Closed)
    }

    /// Waits at most `timeout` for a message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, Error> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => Error::Timeout,
            RecvTimeoutError::Disconnected => Error::Closed,
        })
    }

    /// A message if one is already here, `Ok(None)` if none is.
    pub fn try_recv(&self) -> Result<Option<Message>, Error> {
        match self.rx.try_recv() {
            Ok(m) => Ok(Some(m)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Error::Closed),
        }
    }

    /// Messages as they arrive, until the connection closes.
    pub fn iter(&self) -> impl Iterator<Item = Message> + '_ {
        self.rx.iter()
    }

    /// Unsubscribes and waits for the server's ack.
    pub fn unsubscribe(mut self) -> Result<(), Error> {
        self.active = false;
        self.shared.routes().subs.remove(&self.sid);
        self.shared
            .emit(
                "unsub",
                json!({ "sid": self.sid }),
                &[],
                Some(self.shared.timeout),
            )
            .map(|_| ())
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.active {
            self.shared.routes().subs.remove(&self.sid);
            let _ = self
                .shared
                .emit("unsub", json!({ "sid": self.sid }), &[], None);
        }
    }
}

// ---------------------------------------------------------------------------
// Connecting: upgrade, Engine.IO open, Socket.IO CONNECT.
// ---------------------------------------------------------------------------

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

    fn await_open(&mut self) -> Result<wire::OpenInfo, Error> {
        let text = self.next_text()?;
        match wire::parse_eio(&text).map_err(|e| Error::Handshake(e.0))? {
            EioPacket::Open(json) => wire::parse_open(json).map_err(|e| Error::Handshake(e.0)),
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
        let connect = wire::encode_sio(SioKind::Connect, 0, &opts.namespace, None, &auth);
        self.send(wire::text_opcode(), connect.as_bytes())?;
        loop {
            let text = self.next_text()?;
            let packet = wire::parse_eio(&text).map_err(|e| Error::Handshake(e.0))?;
            let body = match packet {
                EioPacket::Ping => {
                    self.send(wire::text_opcode(), b"3")?;
                    continue;
                }
                EioPacket::Close => return Err(Error::Handshake("server sent close".into())),
                EioPacket::Message(body) => body,
                _ => continue,
            };
            let sio = wire::parse_sio(body).map_err(|e| Error::Handshake(e.0))?;
            if sio.namespace != opts.namespace {
                continue;
            }
            match sio.kind {
                SioKind::Connect => return Ok(()),
                SioKind::ConnectError => {
                    let message = serde_json::from_str::<Value>(sio.payload)
                        .ok()
                        .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
                        .unwrap_or_else(|| sio.payload.to_string());
                    let _ = self.stream.shutdown(Shutdown::Both);
                    return Err(Error::ConnectRefused(message));
                }
                _ => continue,
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The reader thread.
// ---------------------------------------------------------------------------

/// A binary packet whose attachments are still arriving.
struct PartialBinary {
    kind: SioKind,
    ack_id: Option<u64>,
    args: Value,
    expected: usize,
    attachments: Vec<Vec<u8>>,
}

/// The reader must stop: the peer closed, or broke the wire format (which
/// the Socket.IO spec answers by closing the connection).
struct Stop;

struct Reader {
    shared: Arc<Shared>,
    stream: TcpStream,
    decoder: FrameDecoder,
    partial: Option<PartialBinary>,
}

impl Reader {
    fn new(shared: Arc<Shared>, stream: TcpStream, decoder: FrameDecoder) -> Self {
        Reader {
            shared,
            stream,
            decoder,
            partial: None,
        }
    }

    fn run(mut self) {
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        'outer: loop {
            loop {
                match self.decoder.next() {
                    Ok(Some(message)) => {
                        if self.on_message(message).is_err() {
                            break 'outer;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => self.decoder.push(chunk.get(..n).unwrap_or(&[])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.shared.mark_closed();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn on_message(&mut self, message: WsMessage) -> Result<(), Stop> {
        match message {
            WsMessage::Text(text) => self.on_text(&text),
            WsMessage::Binary(bytes) => self.on_binary(bytes),
            WsMessage::Ping(payload) => {
                // RFC 6455 §5.5.3: answer with the same application data.
                let _ = self
                    .shared
                    .writer()
                    .send_control(wire::pong_opcode(), &payload);
                Ok(())
            }
            WsMessage::Pong => Ok(()),
            WsMessage::Close => {
                // RFC 6455 §5.5.1: echo the close unless we started it.
                let _ = self.shared.writer().send_close(CLOSE_NORMAL);
                Err(Stop)
            }
        }
    }

    fn on_text(&mut self, text: &str) -> Result<(), Stop> {
        match wire::parse_eio(text).map_err(|_| Stop)? {
            // Engine.IO v4 "heartbeat": the server pings, the client pongs.
            EioPacket::Ping => {
                let _ = self.shared.writer().send_packet("3", &[]);
                self.shared.pongs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            EioPacket::Close => Err(Stop),
            EioPacket::Message(body) => self.on_socket_io(body),
            EioPacket::Open(_) | EioPacket::Pong | EioPacket::Upgrade | EioPacket::Noop => Ok(()),
        }
    }

    fn on_socket_io(&mut self, body: &str) -> Result<(), Stop> {
        let packet = wire::parse_sio(body).map_err(|_| Stop)?;
        if packet.namespace != self.shared.namespace {
            return Ok(());
        }
        match packet.kind {
            SioKind::Disconnect | SioKind::ConnectError => Err(Stop),
            SioKind::Connect => Ok(()),
            SioKind::Event | SioKind::Ack | SioKind::BinaryEvent | SioKind::BinaryAck => {
                let args: Value = serde_json::from_str(packet.payload).map_err(|_| Stop)?;
                if packet.attachments == 0 {
                    self.dispatch(packet.kind, packet.ack_id, args, Vec::new());
                } else {
                    self.partial = Some(PartialBinary {
                        kind: packet.kind,
                        ack_id: packet.ack_id,
                        args,
                        expected: packet.attachments,
                        attachments: Vec::new(),
                    });
                }
                Ok(())
            }
        }
    }

    fn on_binary(&mut self, bytes: Vec<u8>) -> Result<(), Stop> {
        let Some(mut partial) = self.partial.take() else {
            // An attachment nobody announced breaks the Socket.IO format.
            return Err(Stop);
        };
        partial.attachments.push(bytes);
        if partial.attachments.len() < partial.expected {
            self.partial = Some(partial);
        } else {
            self.dispatch(
                partial.kind,
                partial.ack_id,
                partial.args,
                partial.attachments,
            );
        }
        Ok(())
    }

    fn dispatch(&self, kind: SioKind, ack_id: Option<u64>, args: Value, attachments: Vec<Vec<u8>>) {
        let Value::Array(mut args) = args else {
            return;
        };
        match kind {
            SioKind::Ack | SioKind::BinaryAck => {
                let Some(id) = ack_id else { return };
                let value = if args.is_empty() {
                    Value::Null
                } else {
                    args.swap_remove(0)
                };
                let waiter = self.shared.routes().pending.remove(&id);
                if let Some(tx) = waiter {
                    // The waiter may have timed out already; that is fine.
                    let _ = tx.try_send(Reply { value, attachments });
                }
            }
            SioKind::Event | SioKind::BinaryEvent => {
                if args.first().and_then(Value::as_str) != Some("msg") || args.len() < 2 {
                    return;
                }
                let arg = args.swap_remove(1);
                let Some(message) = Message::from_event(arg, attachments) else {
                    return;
                };
                let mut routes = self.shared.routes();
                if let Some(tx) = routes.subs.get(&message.sid) {
                    if let Err(mpsc::SendError(back)) = tx.send(message) {
                        // The Subscription was dropped; stop routing to it.
                        routes.subs.remove(&back.sid);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(value: Value) -> Reply {
        Reply {
            value,
            attachments: Vec::new(),
        }
    }

    #[test]
    fn acks_map_to_results() {
        assert!(check_ack(reply(json!({"ok": true, "sid": "1"}))).is_ok());
        let refused = check_ack(reply(json!({
            "ok": false,
            "error": {"code": "not_found", "message": "no such sid"}
        })))
        .unwrap_err();
        assert_eq!(refused.code(), Some("not_found"));
        assert_eq!(refused.to_string(), "server error not_found: no such sid");
        assert!(matches!(
            check_ack(reply(json!({"sid": "1"}))),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn msg_events_parse() {
        let arg = json!({
            "sid": "7", "subject": "a.b", "data": {"_placeholder": true, "num": 0},
            "reply": "_INBOX.1", "headers": {"k": "v", "n": 1}
        });
        let msg = Message::from_event(arg, vec![vec![1, 2]]).unwrap();
        assert_eq!((msg.sid.as_str(), msg.subject.as_str()), ("7", "a.b"));
        assert_eq!(msg.reply.as_deref(), Some("_INBOX.1"));
        assert_eq!(msg.bytes(), Some(&[1u8, 2][..]));
        let headers = msg.headers.unwrap();
        assert_eq!(headers.len(), 1, "non-string header values are dropped");
        assert!(Message::from_event(json!({"subject": "a"}), Vec::new()).is_none());
        assert!(Message::from_event(json!([1]), Vec::new()).is_none());
        let plain = Message::from_event(json!({"sid": "1", "subject": "a"}), Vec::new()).unwrap();
        assert_eq!(plain.data, Value::Null);
        assert_eq!(plain.bytes(), None);
    }

    #[test]
    fn out_messages_encode() {
        let msg = OutMessage::new("a", Payload::Json(json!(1)))
            .with_reply("r")
            .with_header("h", "v");
        let (arg, attachments) = msg.encode();
        assert_eq!(
            arg,
            json!({"subject": "a", "data": 1, "reply": "r", "headers": {"h": "v"}})
        );
        assert!(attachments.is_empty());
        let (arg, attachments) = OutMessage::new("b", Payload::Bytes(vec![9])).encode();
        assert_eq!(
            arg,
            json!({"subject": "b", "data": {"_placeholder": true, "num": 0}})
        );
        assert_eq!(attachments, vec![vec![9]]);
    }

    #[test]
    fn errors_compare() {
        assert_eq!(Error::Timeout, Error::Timeout);
        assert_ne!(Error::Timeout, Error::Closed);
        assert_eq!(
            Error::Io(io::ErrorKind::BrokenPipe.into()),
            Error::Io(io::ErrorKind::BrokenPipe.into())
        );
        assert_eq!(Error::Closed.code(), None);
    }
}
