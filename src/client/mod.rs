//! The Rust client of gombus: a blocking Socket.IO v5 client (Engine.IO v4
//! over WebSocket, no TLS) that speaks the broker's events.
//!
//! One [`Client`] is one Socket.IO connection to one namespace at a time. A
//! background thread owns the read half of the TCP stream: it answers
//! Engine.IO pings, hands acks to the call waiting for them (one channel per
//! call, so a round trip has no polling delay) and pushes `msg` deliveries
//! into the queue of their [`Subscription`]. Callers write whole frames under
//! a mutex on the other half of the stream.
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
//!
//! # Reconnecting
//!
//! [`Client::connect`] and [`Client::connect_with`] keep one connection:
//! when it drops, the client is closed and calls fail with
//! [`Error::Closed`]. With [`Options::reconnect`] set (as
//! [`Client::connect_any`] does), the client survives that:
//!
//! - it connects to the first address of its list that answers, and after a
//!   drop tries the *next* address each time (a cluster: any node will do),
//!   waiting a capped exponential backoff with jitter before each attempt;
//!   by default 50 ms doubling to 2 s, each wait drawn from `[d/2, d]`,
//!   retrying forever ([`Reconnect`]);
//! - after the handshake it re-sends every live subscription under the same
//!   sid (queue group and the deliveries left of a `max` included), so a
//!   [`Subscription`] handle simply keeps receiving; then it sends the
//!   publishes held while down; only then do new calls go through;
//! - calls waiting for an ack when the link dropped fail with
//!   [`Error::Disconnected`] (the server may or may not have acted on them);
//!   calls made while down fail fast with [`Error::Reconnecting`], except
//!   publishes when [`Options::publish_buffer`] is non-zero: up to that many
//!   are held and sent after the reconnect ([`Error::BufferFull`] past it);
//! - [`Client::events`] reports [`Event::Disconnected`],
//!   [`Event::Reconnected`] (once the server acked every re-sent
//!   subscription), [`Event::ResubscribeFailed`] and, once, the final
//!   [`Event::Closed`].
//!
//! Messages published while a subscriber is disconnected are not delivered
//! to it: the broker keeps no state for a connection that is gone.
//!
//! ```no_run
//! use std::time::Duration;
//! use gombus::client::{Client, Event, Options, Reconnect};
//!
//! # fn main() -> Result<(), gombus::client::Error> {
//! let opts = Options {
//!     reconnect: Some(Reconnect::default()),
//!     publish_buffer: 1000,
//!     ..Options::default()
//! };
//! let client = Client::connect_any_with(&["127.0.0.1:4001", "127.0.0.1:4002"], opts)?;
//! let events = client.events();
//! let sub = client.queue_subscribe("jobs.*", "workers")?;
//! if let Ok(Event::Disconnected { url, reason }) = events.recv_timeout(Duration::from_secs(1)) {
//!     eprintln!("lost {url}: {reason}; reconnecting");
//! }
//! # drop(sub);
//! # Ok(())
//! # }
//! ```
//!
//! # Bounded queues
//!
//! Each subscription queues at most [`Options::subscription_capacity`]
//! messages (default 65 536). When a new message finds the queue full, the
//! oldest queued one is dropped and counted ([`Subscription::dropped`]).
//! The background thread never blocks on a slow reader: blocking it would
//! also hold up acks and heartbeats of every other call on the connection,
//! and a single forgotten subscription would stall the whole client. The
//! event queue holds the latest 1 024 events the same way.

mod backoff;
mod dial;
mod inbox;
mod reader;
mod supervisor;
mod wire;

pub use backoff::Reconnect;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::OpCode;

use inbox::{Empty, Inbox};
use wire::{MaskRng, SioKind};

/// Largest WebSocket message the client accepts from the server, in bytes.
const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Size of the reader thread's read buffer, in bytes.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest a clean close waits for the server to close its side.
const CLOSE_WAIT_MAX: Duration = Duration::from_secs(2);
/// WebSocket close status "normal closure" (RFC 6455 §7.4.1).
const CLOSE_NORMAL: u16 = 1000;
/// Default of [`Options::subscription_capacity`], in messages.
const SUBSCRIPTION_CAPACITY_DEFAULT: usize = 65_536;
/// Events kept for [`Client::events`] before the oldest is dropped.
const EVENTS_MAX: usize = 1024;

// ---------------------------------------------------------------------------
// Public types.
// ---------------------------------------------------------------------------

/// Connection options; [`Options::default`] connects to `/` without a token,
/// waits at most 5 s for the handshake and for each ack, does not
/// reconnect, holds no publishes and queues up to 65 536 messages per
/// subscription.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sent as the CONNECT auth payload `{"token": …}` when set.
    pub token: Option<String>,
    /// The Socket.IO namespace, `/` for messaging or `/control`.
    pub namespace: String,
    /// Bound on connecting and on waiting for any ack.
    pub timeout: Duration,
    /// Reconnect after the connection drops; `None` closes the client.
    pub reconnect: Option<Reconnect>,
    /// Publishes held while reconnecting, sent once connected again.
    /// 0 (the default) fails them at once with [`Error::Reconnecting`]. An
    /// acked publish still waits at most `timeout` for its ack; one that
    /// times out while held is sent all the same.
    pub publish_buffer: usize,
    /// Messages each [`Subscription`] queues before dropping the oldest.
    pub subscription_capacity: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            namespace: "/".to_string(),
            timeout: Duration::from_secs(5),
            reconnect: None,
            publish_buffer: 0,
            subscription_capacity: SUBSCRIPTION_CAPACITY_DEFAULT,
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
    /// The connection dropped while this call waited for its ack; the
    /// server may or may not have acted on it. The client is reconnecting.
    Disconnected,
    /// The client is reconnecting and this call cannot wait for it (every
    /// call but a publish, and publishes when no buffer is configured).
    Reconnecting,
    /// The client is reconnecting and the publish buffer is full.
    BufferFull,
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
            Error::Disconnected => f.write_str("connection lost while waiting for the ack"),
            Error::Reconnecting => f.write_str("not connected: reconnecting"),
            Error::BufferFull => f.write_str("not connected: the publish buffer is full"),
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
            (Error::Disconnected, Error::Disconnected) => true,
            (Error::Reconnecting, Error::Reconnecting) => true,
            (Error::BufferFull, Error::BufferFull) => true,
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

/// Something that happened to the client's connection; see
/// [`Client::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The link to `url` ended; with [`Options::reconnect`] set the client
    /// is now reconnecting, else it is closed.
    Disconnected { url: String, reason: String },
    /// Connected again, to `url`, on the `attempts`-th attempt. Reported
    /// once the server has acked every re-sent subscription (and the held
    /// publishes are sent), so what is published anywhere after this event
    /// reaches the subscriptions.
    Reconnected { url: String, attempts: u32 },
    /// The server refused subscription `sid` on reconnect; its
    /// [`Subscription`] is closed.
    ResubscribeFailed { sid: String, error: String },
    /// The client is closed for good; the last event.
    Closed { reason: String },
}

/// The client's [`Event`]s, in order. Every handle from [`Client::events`]
/// reads the same queue, which keeps the latest 1 024 events.
#[derive(Debug, Clone)]
pub struct Events {
    inbox: Arc<Inbox<Event>>,
}

impl Events {
    /// Waits at most `timeout` for the next event; [`Error::Closed`] once
    /// [`Event::Closed`] was received.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, Error> {
        self.inbox
            .recv(Some(Instant::now() + timeout))
            .map_err(empty_error)
    }

    /// The next event if one is queued.
    pub fn try_recv(&self) -> Result<Option<Event>, Error> {
        self.inbox.try_recv().map_err(empty_error)
    }

    /// Events as they come, until the client is closed.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        std::iter::from_fn(|| self.inbox.recv(None).ok())
    }

    /// Events dropped because nobody read them in time.
    pub fn dropped(&self) -> u64 {
        self.inbox.dropped()
    }
}

fn empty_error(empty: Empty) -> Error {
    match empty {
        Empty::Timeout => Error::Timeout,
        Empty::Closed => Error::Closed,
    }
}
// ---------------------------------------------------------------------------
// Shared state between callers and the background thread.
// ---------------------------------------------------------------------------

/// An ack as received: its single argument and any attachments.
#[derive(Debug)]
pub(crate) struct Reply {
    value: Value,
    attachments: Vec<Vec<u8>>,
}

/// Who waits for an ack.
#[derive(Debug)]
enum Waiter {
    /// A caller blocked on its reply (or on the error that ends the wait).
    Call(SyncSender<Result<Reply, Error>>),
    /// The background thread's re-`sub` of this sid after a reconnect.
    Resub(String),
}

/// What the client remembers of a live subscription so it can re-send it.
#[derive(Debug)]
struct SubRoute {
    subject: String,
    queue: Option<String>,
    /// Deliveries left before the server ends it (`max`, `unsub after`).
    left: Option<u64>,
    inbox: Arc<Inbox<Message>>,
}

/// A fire-and-forget or acked publish written while the link was down,
/// already encoded (its ack id, if any, is registered in `pending`).
#[derive(Debug)]
struct Held {
    text: String,
    attachments: Vec<Vec<u8>>,
}

/// One open connection: the write half and what its open packet said.
pub(crate) struct Link {
    url: String,
    writer: Mutex<Writer>,
    /// A handle on the socket so shutdown never waits for a writer.
    socket: TcpStream,
    max_payload: Option<u64>,
}

impl Link {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, text: &str, attachments: &[Vec<u8>]) -> io::Result<()> {
        self.writer().send_packet(text, attachments)
    }

    /// A failed or partial write leaves the peer mid-frame, so the link
    /// cannot carry another packet: shutting it down makes its reader stop.
    fn abort(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

/// Where the client is in its life.
enum Phase {
    /// Connected; calls write to this link.
    Up(Arc<Link>),
    /// The link dropped and the background thread is reconnecting.
    Down,
    /// For good: closed by the user, by the server without reconnect, or
    /// reconnecting gave up.
    Closed,
}

/// Everything callers and the background thread share. Locked briefly and
/// never held across socket I/O (lock order: state, then an inbox).
struct State {
    phase: Phase,
    /// `close` was called: never reconnect.
    closing: bool,
    next_ack_id: u64,
    pending: HashMap<u64, Waiter>,
    subs: HashMap<String, SubRoute>,
    /// Publishes made while down, bounded by `Options::publish_buffer`.
    held: VecDeque<Held>,
    /// The last server's `maxPayload`, to check publishes made while down.
    max_payload: Option<u64>,
    /// The socket of a connect attempt in progress, so `close` can cut it.
    dialing: Option<TcpStream>,
    /// Re-sent subscriptions whose ack has not come back yet.
    resubs_unacked: usize,
    /// The [`Event::Reconnected`] to report once they all have.
    announce: Option<Event>,
}

impl State {
    fn register(&mut self, waiter: Waiter) -> u64 {
        let id = self.next_ack_id;
        self.next_ack_id = self.next_ack_id.wrapping_add(1);
        self.pending.insert(id, waiter);
        id
    }

    fn register_call(&mut self) -> (u64, Receiver<Result<Reply, Error>>) {
        let (tx, rx) = mpsc::sync_channel(1);
        (self.register(Waiter::Call(tx)), rx)
    }

    /// Ends every wait for an ack with `error` (a fresh one per caller),
    /// and the wait for re-sent subscriptions with it.
    fn fail_pending(&mut self, error: impl Fn() -> Error) {
        self.resubs_unacked = 0;
        self.announce = None;
        for (_, waiter) in self.pending.drain() {
            if let Waiter::Call(tx) = waiter {
                let _ = tx.try_send(Err(error()));
            }
        }
    }
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

pub(crate) struct Shared {
    opts: Options,
    /// Every address the client may use, tried in turn.
    urls: Vec<String>,
    state: Mutex<State>,
    /// Signalled when the phase changes or `close` is called.
    changed: Condvar,
    next_sid: AtomicU64,
    /// Engine.IO pings answered since the client connected.
    pongs: AtomicU64,
    events: Arc<Inbox<Event>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("namespace", &self.opts.namespace)
            .field("urls", &self.urls)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind; they are
        // still consistent, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_closed(&self) -> bool {
        matches!(self.state().phase, Phase::Closed)
    }

    /// Waits until the phase is [`Phase::Closed`] or `wait` passes.
    fn wait_closed(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut state = self.state();
        while !matches!(state.phase, Phase::Closed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = match self.changed.wait_timeout(state, left) {
                Ok((guard, _)) => guard,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Sends `[event, arg]` with `attachments`; with `ack_wait` set, waits
    /// that long for the ack and checks `ok`. While the client reconnects,
    /// a `holdable` packet goes to the publish buffer if it has room.
    fn emit(
        &self,
        event: &str,
        arg: Value,
        attachments: &[Vec<u8>],
        ack_wait: Option<Duration>,
        holdable: bool,
    ) -> Result<Option<Reply>, Error> {
        let payload = serde_json::to_string(&json!([event, arg]))
            .map_err(|e| Error::Protocol(format!("cannot encode {event}: {e}")))?;
        let kind = if attachments.is_empty() {
            SioKind::Event
        } else {
            SioKind::BinaryEvent
        };
        let namespace = &self.opts.namespace;
        let mut state = self.state();
        let link = match &state.phase {
            Phase::Closed => return Err(Error::Closed),
            Phase::Up(link) => Arc::clone(link),
            Phase::Down if holdable => {
                return self.hold(state, kind, attachments, &payload, ack_wait);
            }
            Phase::Down => return Err(Error::Reconnecting),
        };
        let ack = ack_wait.map(|_| state.register_call());
        drop(state);
        let ack_id = ack.as_ref().map(|(id, _)| *id);
        let text = wire::encode_sio(kind, attachments.len(), namespace, ack_id, &payload);
        let sent = check_size(link.max_payload, &text, attachments).and_then(|()| {
            link.send(&text, attachments).map_err(|e| {
                link.abort();
                self.write_error(e)
            })
        });
        if let Err(e) = sent {
            if let Some(id) = ack_id {
                self.state().pending.remove(&id);
            }
            return Err(e);
        }
        self.await_ack(ack, ack_wait)
    }

    /// Puts a publish made while down in the publish buffer, then waits for
    /// its ack like any call. One that times out there is still sent later.
    fn hold(
        &self,
        mut state: MutexGuard<'_, State>,
        kind: SioKind,
        attachments: &[Vec<u8>],
        payload: &str,
        ack_wait: Option<Duration>,
    ) -> Result<Option<Reply>, Error> {
        if self.opts.publish_buffer == 0 {
            return Err(Error::Reconnecting);
        }
        if state.held.len() >= self.opts.publish_buffer {
            return Err(Error::BufferFull);
        }
        let namespace = &self.opts.namespace;
        let ack = ack_wait.map(|_| state.register_call());
        let ack_id = ack.as_ref().map(|(id, _)| *id);
        let text = wire::encode_sio(kind, attachments.len(), namespace, ack_id, payload);
        if let Err(e) = check_size(state.max_payload, &text, attachments) {
            if let Some(id) = ack_id {
                state.pending.remove(&id);
            }
            return Err(e);
        }
        state.held.push_back(Held {
            text,
            attachments: attachments.to_vec(),
        });
        drop(state);
        self.await_ack(ack, ack_wait)
    }

    fn await_ack(
        &self,
        ack: Option<(u64, Receiver<Result<Reply, Error>>)>,
        wait: Option<Duration>,
    ) -> Result<Option<Reply>, Error> {
        let (Some((id, rx)), Some(wait)) = (ack, wait) else {
            return Ok(None);
        };
        match rx.recv_timeout(wait) {
            Ok(Ok(reply)) => check_ack(reply).map(Some),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                self.state().pending.remove(&id);
                Err(Error::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }

    /// The error for a write that failed: [`Error::Closed`] once closed,
    /// [`Error::Disconnected`] when the client will reconnect, else the
    /// I/O error itself.
    fn write_error(&self, e: io::Error) -> Error {
        match &self.state().phase {
            Phase::Closed => Error::Closed,
            Phase::Up(_) | Phase::Down if self.opts.reconnect.is_some() => Error::Disconnected,
            Phase::Up(_) | Phase::Down => Error::Io(e),
        }
    }

    fn push_event(&self, event: Event) {
        self.events.push(event);
    }

    /// The link ended with `reason`. Calls waiting on it fail, and the
    /// client either starts reconnecting (returns true) or closes for good.
    pub(crate) fn link_lost(&self, link: &Link, reason: &str) -> bool {
        let mut state = self.state();
        if state.closing {
            self.close_for_good(&mut state, "closed by the client");
            return false;
        }
        self.push_event(Event::Disconnected {
            url: link.url.clone(),
            reason: reason.to_string(),
        });
        if self.opts.reconnect.is_none() {
            self.close_for_good(&mut state, reason);
            return false;
        }
        state.fail_pending(|| Error::Disconnected);
        state.phase = Phase::Down;
        drop(state);
        self.changed.notify_all();
        true
    }

    /// Enters [`Phase::Closed`]: every wait and every subscription ends.
    fn close_for_good(&self, state: &mut State, reason: &str) {
        if matches!(state.phase, Phase::Closed) {
            return;
        }
        state.phase = Phase::Closed;
        state.fail_pending(|| Error::Closed);
        state.held.clear();
        for (_, route) in state.subs.drain() {
            route.inbox.close();
        }
        self.push_event(Event::Closed {
            reason: reason.to_string(),
        });
        self.events.close();
        self.changed.notify_all();
    }

    /// Delivers a `msg` to its subscription, counting down its `max`.
    fn deliver(&self, message: Message) {
        let mut state = self.state();
        if let Some(route) = state.subs.get_mut(&message.sid) {
            if let Some(left) = route.left.as_mut() {
                *left = left.saturating_sub(1);
            }
            route.inbox.push(message);
        }
    }

    /// Hands an ack to whoever waits for it.
    fn acked(&self, id: u64, reply: Reply) {
        let waiter = self.state().pending.remove(&id);
        match waiter {
            // The caller may have timed out already; that is fine.
            Some(Waiter::Call(tx)) => {
                let _ = tx.try_send(Ok(reply));
            }
            Some(Waiter::Resub(sid)) => {
                let mut state = self.state();
                if let Err(e) = check_ack(reply) {
                    // The server refused the subscription back: end it
                    // visibly rather than leave its handle waiting forever.
                    if let Some(route) = state.subs.remove(&sid) {
                        route.inbox.close();
                    }
                    self.push_event(Event::ResubscribeFailed {
                        sid,
                        error: e.to_string(),
                    });
                }
                state.resubs_unacked = state.resubs_unacked.saturating_sub(1);
                if state.resubs_unacked == 0 {
                    if let Some(event) = state.announce.take() {
                        self.push_event(event);
                    }
                }
            }
            None => {}
        }
    }
}

fn check_size(max: Option<u64>, text: &str, attachments: &[Vec<u8>]) -> Result<(), Error> {
    let Some(max) = max else {
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
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("namespace", &self.shared.opts.namespace)
            .field("urls", &self.shared.urls)
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
        Client::connect_any_with(&[addr], opts)
    }

    /// Connects to the first of `urls` that answers, and reconnects with
    /// the default [`Reconnect`] policy when the connection drops.
    pub fn connect_any<S: AsRef<str>>(urls: &[S]) -> Result<Client, Error> {
        let opts = Options {
            reconnect: Some(Reconnect::default()),
            ..Options::default()
        };
        Client::connect_any_with(urls, opts)
    }

    /// Tries each of `urls` once, in order, and keeps the first that
    /// completes the handshake; if none does, returns the last error. The
    /// list is also where a reconnect (with `opts.reconnect` set) looks.
    pub fn connect_any_with<S: AsRef<str>>(urls: &[S], opts: Options) -> Result<Client, Error> {
        let urls: Vec<String> = urls.iter().map(|u| u.as_ref().to_string()).collect();
        for url in &urls {
            wire::parse_target(url).map_err(|e| Error::Handshake(e.0))?;
        }
        let mut last = Error::Handshake("no address to connect to".to_string());
        for (index, url) in urls.iter().enumerate() {
            match dial::dial(url, &opts, |_| {}) {
                Ok(dialed) => return Client::start(urls, opts, dialed, index),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start(
        urls: Vec<String>,
        opts: Options,
        dialed: dial::Dialed,
        index: usize,
    ) -> Result<Client, Error> {
        let (link, half) = supervisor::link_up(dialed)?;
        let state = State {
            phase: Phase::Up(Arc::clone(&link)),
            closing: false,
            next_ack_id: 0,
            pending: HashMap::new(),
            subs: HashMap::new(),
            held: VecDeque::new(),
            max_payload: link.max_payload,
            dialing: None,
            resubs_unacked: 0,
            announce: None,
        };
        let shared = Arc::new(Shared {
            opts,
            urls,
            state: Mutex::new(state),
            changed: Condvar::new(),
            next_sid: AtomicU64::new(1),
            pongs: AtomicU64::new(0),
            events: Arc::new(Inbox::new(EVENTS_MAX)),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("gombus-client".to_string())
            .spawn(move || supervisor::run(thread_shared, link, half, index))?;
        Ok(Client {
            shared,
            thread: Some(thread),
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
        let inbox = Arc::new(Inbox::new(self.shared.opts.subscription_capacity));
        {
            let mut state = self.shared.state();
            match state.phase {
                Phase::Closed => return Err(Error::Closed),
                Phase::Down => return Err(Error::Reconnecting),
                Phase::Up(_) => {}
            }
            let route = SubRoute {
                subject: subject.to_string(),
                queue: queue.map(str::to_string),
                left: max,
                inbox: Arc::clone(&inbox),
            };
            state.subs.insert(sid.clone(), route);
        }
        if let Err(e) = self.call("sub", sub_arg(&sid, subject, queue, max)) {
            self.shared.state().subs.remove(&sid);
            if e == Error::Disconnected {
                // A reconnect may have re-sent it already: undo that.
                let _ = self.emit("unsub", json!({ "sid": sid }));
            }
            return Err(e);
        }
        Ok(Subscription {
            sid,
            inbox,
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
        let wait = acked.then_some(self.shared.opts.timeout);
        let reply = self.shared.emit("pub", arg, &attachments, wait, true)?;
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
        let wait = timeout.saturating_add(self.shared.opts.timeout);
        let reply = self
            .shared
            .emit("request", arg, &attachments, Some(wait), false)?
            .ok_or_else(|| Error::Protocol("request without ack".to_string()))?;
        let Value::Object(mut fields) = reply.value else {
            return Err(Error::Protocol("request ack is not an object".to_string()));
        };
        Ok(Message {
            sid: String::new(),
            subject: take_string(&mut fields, "subject").unwrap_or_default(),
            data: fields.remove("data").unwrap_or(Value::Null),
            reply: None,
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
            .emit(event, args, &[], Some(self.shared.opts.timeout), false)?
            .ok_or_else(|| Error::Protocol(format!("{event} without ack")))?;
        Ok(reply.value)
    }

    /// Sends any event without an ack id (fire and forget).
    pub fn emit(&self, event: &str, args: Value) -> Result<(), Error> {
        self.shared.emit(event, args, &[], None, false).map(|_| ())
    }

    /// Ends subscription `sid` on the server after `after` more messages
    /// (a reconnect re-sends it with what is left of them).
    pub fn unsubscribe_after(&self, sid: &str, after: u64) -> Result<(), Error> {
        self.call("unsub", json!({ "sid": sid, "after": after }))?;
        if let Some(route) = self.shared.state().subs.get_mut(sid) {
            route.left = Some(after);
        }
        Ok(())
    }

    /// The client's connection events. Every handle reads one shared queue.
    pub fn events(&self) -> Events {
        Events {
            inbox: Arc::clone(&self.shared.events),
        }
    }

    /// The address of the current connection, `None` while reconnecting
    /// or closed.
    pub fn url(&self) -> Option<String> {
        match &self.shared.state().phase {
            Phase::Up(link) => Some(link.url.clone()),
            Phase::Down | Phase::Closed => None,
        }
    }

    /// Whether calls can go through now (not reconnecting, not closed).
    pub fn is_connected(&self) -> bool {
        matches!(self.shared.state().phase, Phase::Up(_))
    }

    /// How many of the server's heartbeat pings this client has answered.
    pub fn heartbeats(&self) -> u64 {
        self.shared.pongs.load(Ordering::Relaxed)
    }

    /// Whether the client is closed for good: by [`Client::close`], by
    /// the server without reconnect, or after reconnecting gave up.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Closes cleanly: Socket.IO DISCONNECT, then a WebSocket close frame,
    /// then waits briefly for the server to close its side.
    pub fn close(mut self) -> Result<(), Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let shared = &self.shared;
        let link = {
            let mut state = shared.state();
            state.closing = true;
            if let Some(socket) = state.dialing.take() {
                let _ = socket.shutdown(Shutdown::Both);
            }
            match &state.phase {
                Phase::Up(link) => Some(Arc::clone(link)),
                Phase::Down | Phase::Closed => None,
            }
        };
        shared.changed.notify_all();
        let mut result = Ok(());
        if let Some(link) = link {
            let text = wire::encode_sio(SioKind::Disconnect, 0, &shared.opts.namespace, None, "");
            let mut writer = link.writer();
            result = writer
                .send_packet(&text, &[])
                .and_then(|()| writer.send_close(CLOSE_NORMAL))
                .map_err(|e| shared.write_error(e));
            drop(writer);
            // Half-close so a server that waits for EOF sees it.
            let _ = link.socket.shutdown(Shutdown::Write);
            shared.wait_closed(shared.opts.timeout.min(CLOSE_WAIT_MAX));
            link.abort();
        }
        if thread.join().is_err() && result.is_ok() {
            result = Err(Error::Protocol("client thread panicked".to_string()));
        }
        shared.close_for_good(&mut shared.state(), "closed by the client");
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

/// The `sub` argument; the reconnect path sends the same one again.
fn sub_arg(sid: &str, subject: &str, queue: Option<&str>, max: Option<u64>) -> Value {
    let mut arg = json!({ "subject": subject, "sid": sid });
    if let Some(queue) = queue {
        arg["queue"] = json!(queue);
    }
    if let Some(max) = max {
        arg["max"] = json!(max);
    }
    arg
}

// ---------------------------------------------------------------------------
// Subscriptions.
// ---------------------------------------------------------------------------

/// Deliveries of one subscription, queued up to
/// [`Options::subscription_capacity`] (the oldest is dropped past it, see
/// [`Subscription::dropped`]). Survives reconnects under the same sid.
/// Dropping it unsubscribes (best effort, without waiting).
#[derive(Debug)]
pub struct Subscription {
    sid: String,
    inbox: Arc<Inbox<Message>>,
    shared: Arc<Shared>,
    active: bool,
}

impl Subscription {
    /// The subscription id, as used by `unsub` and in [`Message::sid`].
    pub fn sid(&self) -> &str {
        &self.sid
    }

    /// Blocks until a message arrives or the client closes for good.
    pub fn recv(&self) -> Result<Message, Error> {
        self.inbox.recv(None).map_err(empty_error)
    }

    /// Waits at most `timeout` for a message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, Error> {
        self.inbox
            .recv(Some(Instant::now() + timeout))
            .map_err(empty_error)
    }

    /// A message if one is already here, `Ok(None)` if none is.
    pub fn try_recv(&self) -> Result<Option<Message>, Error> {
        self.inbox.try_recv().map_err(empty_error)
    }

    /// Messages as they arrive, until the client closes for good.
    pub fn iter(&self) -> impl Iterator<Item = Message> + '_ {
        std::iter::from_fn(|| self.inbox.recv(None).ok())
    }

    /// Messages dropped because the queue was full when they arrived.
    pub fn dropped(&self) -> u64 {
        self.inbox.dropped()
    }

    /// Messages queued and not yet received.
    pub fn pending(&self) -> usize {
        self.inbox.len()
    }

    /// Unsubscribes and waits for the server's ack. While the client is
    /// reconnecting this only forgets the subscription, which has the same
    /// effect: it is not re-sent.
    pub fn unsubscribe(mut self) -> Result<(), Error> {
        self.active = false;
        self.shared.state().subs.remove(&self.sid);
        let arg = json!({ "sid": self.sid });
        match self
            .shared
            .emit("unsub", arg, &[], Some(self.shared.opts.timeout), false)
        {
            Ok(_) | Err(Error::Reconnecting) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.active {
            self.shared.state().subs.remove(&self.sid);
            let arg = json!({ "sid": self.sid });
            let _ = self.shared.emit("unsub", arg, &[], None, false);
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

    /// A client state with no connection, as while reconnecting.
    fn down(publish_buffer: usize) -> Shared {
        let opts = Options {
            reconnect: Some(Reconnect::default()),
            publish_buffer,
            timeout: Duration::from_millis(50),
            ..Options::default()
        };
        Shared {
            opts,
            urls: vec!["127.0.0.1:1".to_string()],
            state: Mutex::new(State {
                phase: Phase::Down,
                closing: false,
                next_ack_id: 0,
                pending: HashMap::new(),
                subs: HashMap::new(),
                held: VecDeque::new(),
                max_payload: Some(64),
                dialing: None,
                resubs_unacked: 0,
                announce: None,
            }),
            changed: Condvar::new(),
            next_sid: AtomicU64::new(1),
            pongs: AtomicU64::new(0),
            events: Arc::new(Inbox::new(EVENTS_MAX)),
        }
    }

    fn route(shared: &Shared, sid: &str, left: Option<u64>) -> Arc<Inbox<Message>> {
        let inbox = Arc::new(Inbox::new(8));
        let route = SubRoute {
            subject: "a".to_string(),
            queue: None,
            left,
            inbox: Arc::clone(&inbox),
        };
        shared.state().subs.insert(sid.to_string(), route);
        inbox
    }

    #[test]
    fn while_down_only_publishes_are_held_and_only_up_to_the_buffer() {
        let fail_fast = down(0);
        let publish = |shared: &Shared, n: i32| {
            shared.emit("pub", json!({"subject": "a", "data": n}), &[], None, true)
        };
        assert_eq!(publish(&fail_fast, 1).unwrap_err(), Error::Reconnecting);

        let shared = down(2);
        assert!(publish(&shared, 1).unwrap().is_none());
        assert!(publish(&shared, 2).unwrap().is_none());
        assert_eq!(publish(&shared, 3).unwrap_err(), Error::BufferFull);
        let not_publish = shared.emit("ping", json!({}), &[], None, false);
        assert_eq!(not_publish.unwrap_err(), Error::Reconnecting);
        let held: Vec<_> = shared.state().held.iter().map(|h| h.text.clone()).collect();
        assert_eq!(
            held,
            vec![
                r#"42["pub",{"data":1,"subject":"a"}]"#,
                r#"42["pub",{"data":2,"subject":"a"}]"#
            ]
        );
    }

    #[test]
    fn a_held_publish_is_checked_against_the_last_max_payload() {
        let shared = down(4);
        let big = json!({"subject": "a", "data": "x".repeat(100)});
        assert!(matches!(
            shared.emit("pub", big, &[], None, true),
            Err(Error::Protocol(_))
        ));
        assert!(shared.state().held.is_empty());
    }

    #[test]
    fn an_acked_publish_held_while_down_times_out_without_a_leak() {
        let shared = down(4);
        let arg = json!({"subject": "a", "data": 1});
        let wait = Some(Duration::from_millis(20));
        assert_eq!(
            shared.emit("pub", arg, &[], wait, true).unwrap_err(),
            Error::Timeout
        );
        let state = shared.state();
        assert_eq!(state.held.len(), 1);
        assert!(state.held[0].text.starts_with("420[\"pub\""));
        assert!(state.pending.is_empty());
    }

    #[test]
    fn deliveries_count_down_what_is_left_of_max() {
        let shared = down(0);
        let inbox = route(&shared, "1", Some(2));
        let msg = |sid: &str| Message {
            sid: sid.to_string(),
            subject: "a".to_string(),
            data: json!(1),
            reply: None,
            headers: None,
            attachments: Vec::new(),
        };
        shared.deliver(msg("1"));
        shared.deliver(msg("unknown"));
        assert_eq!(shared.state().subs["1"].left, Some(1));
        assert_eq!(inbox.len(), 1);
    }

    #[test]
    fn a_refused_resubscribe_closes_its_subscription_and_says_so() {
        let shared = down(0);
        let inbox = route(&shared, "7", None);
        let kept = route(&shared, "8", None);
        let id = shared.state().register(Waiter::Resub("7".to_string()));
        let ok_id = shared.state().register(Waiter::Resub("8".to_string()));
        let refusal = json!({"ok": false, "error": {"code": "bad_request", "message": "no"}});
        shared.acked(id, reply(refusal));
        shared.acked(ok_id, reply(json!({"ok": true, "sid": "8"})));
        assert_eq!(inbox.recv(None), Err(Empty::Closed));
        assert_eq!(kept.try_recv(), Ok(None));
        assert!(shared.state().pending.is_empty());
        assert_eq!(
            shared.events.try_recv(),
            Ok(Some(Event::ResubscribeFailed {
                sid: "7".to_string(),
                error: "server error bad_request: no".to_string()
            }))
        );
        assert_eq!(shared.events.try_recv(), Ok(None));
    }

    #[test]
    fn reconnected_is_reported_once_every_resubscribe_is_acked() {
        let shared = down(0);
        let ids: Vec<u64> = ["1", "2"]
            .iter()
            .map(|sid| {
                route(&shared, sid, None);
                shared.state().register(Waiter::Resub(sid.to_string()))
            })
            .collect();
        let event = Event::Reconnected {
            url: "u".to_string(),
            attempts: 3,
        };
        {
            let mut state = shared.state();
            state.resubs_unacked = 2;
            state.announce = Some(event.clone());
        }
        shared.acked(ids[0], reply(json!({"ok": true})));
        assert_eq!(shared.events.try_recv(), Ok(None));
        shared.acked(ids[1], reply(json!({"ok": true})));
        assert_eq!(shared.events.try_recv(), Ok(Some(event)));
        // A link lost before the acks came voids the announcement.
        let id = shared.state().register(Waiter::Resub("1".to_string()));
        {
            let mut state = shared.state();
            state.resubs_unacked = 1;
            state.announce = Some(Event::Closed {
                reason: "x".to_string(),
            });
            state.fail_pending(|| Error::Disconnected);
        }
        shared.acked(id, reply(json!({"ok": true})));
        assert_eq!(shared.events.try_recv(), Ok(None));
    }

    #[test]
    fn closing_for_good_ends_every_wait() {
        let shared = down(4);
        let inbox = route(&shared, "1", None);
        let (_, rx) = shared.state().register_call();
        shared.close_for_good(&mut shared.state(), "gave up");
        assert!(matches!(rx.try_recv(), Ok(Err(Error::Closed))));
        assert_eq!(inbox.recv(None), Err(Empty::Closed));
        assert_eq!(
            shared.emit("pub", json!({}), &[], None, true).unwrap_err(),
            Error::Closed
        );
        assert_eq!(
            shared.events.try_recv(),
            Ok(Some(Event::Closed {
                reason: "gave up".to_string()
            }))
        );
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
    fn handles_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Client>();
        shareable::<Subscription>();
        shareable::<Events>();
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
