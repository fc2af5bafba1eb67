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
//!   [`Subscription`] handle simply keeps receiving (one refused
//!   `unavailable` or `timeout`, as a node back from a restart answers
//!   until its cluster has a leader, is sent again, up to 30 times); then
//!   it sends the publishes held while down; only then do new calls go
//!   through;
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
//! A link counts as dropped when the socket closes or fails, and also when
//! the server stays silent past its `pingInterval + pingTimeout` (Engine.IO
//! v4 "heartbeat"), which catches a peer that vanished without a word.
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
//! # Pipelining
//!
//! [`Client::call_async`] and [`Client::publish_async`] send an event with
//! an ack id and return a [`PendingAck`] at once, so one thread can keep
//! many acked publishes in flight (the server acks a connection's events
//! in order). At most [`Options::async_acks_max`] of them are outstanding
//! per client; past that the next call blocks until one ends, or fails
//! with [`Error::Timeout`] after the client's timeout. A pending ack ends
//! like a blocking call: with the ack, [`Error::Disconnected`] when the
//! link drops (while reconnecting), [`Error::Closed`], or a timeout.
//!
//! # Bounded queues
//!
//! Each subscription queues at most [`Options::subscription_capacity`]
//! messages (default 65 536) and [`Options::subscription_bytes_max`] bytes
//! (default 64 MiB, counted as received on the wire). When a new message
//! does not fit, the oldest queued ones are dropped and counted
//! ([`Subscription::dropped`]). The background thread never blocks on a slow reader: blocking it would
//! also hold up acks and heartbeats of every other call on the connection,
//! and a single forgotten subscription would stall the whole client. The
//! event queue holds the latest 1 024 events the same way.

mod backoff;
mod dial;
mod inbox;
mod kv;
pub(crate) mod pending;
mod reader;
mod shared;
mod stream;
mod supervisor;
mod wire;

pub use backoff::Reconnect;
pub use dial::http_get;
pub use kv::{BucketConfig, Kv, KvEntry, KvWatch, KvWatchEvent, WatchFrom};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::protocol::socketio::{self, PacketType};
use inbox::{Empty, Inbox};
pub use pending::PendingAck;
use shared::{Phase, Shared, State, SubRoute};
pub use stream::{
    ConsumerConfig, ConsumerInfo, PubAck, SeqPair, StoredMessage, StreamConfig, StreamDelivery,
    StreamInfo, StreamState,
};

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
/// Default of [`Options::subscription_bytes_max`]: 64 MiB.
const SUBSCRIPTION_BYTES_DEFAULT: usize = 64 * 1024 * 1024;
/// Default of [`Options::async_acks_max`].
const ASYNC_ACKS_DEFAULT: usize = 4096;
/// Events kept for [`Client::events`] before the oldest is dropped.
const EVENTS_MAX: usize = 1024;

// ---------------------------------------------------------------------------
// Public types.
// ---------------------------------------------------------------------------

/// Connection options; [`Options::default`] connects to `/` without a token,
/// waits at most 5 s for the handshake and for each ack, does not
/// reconnect, holds no publishes, queues up to 65 536 messages or 64 MiB
/// per subscription and keeps up to 4 096 async acks outstanding.
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
    /// Bytes (as received on the wire) each [`Subscription`] queues before
    /// dropping the oldest; the newest message is always kept.
    pub subscription_bytes_max: usize,
    /// Acks of [`Client::call_async`] / [`Client::publish_async`] awaited
    /// at once (default 4 096). Past it those calls block until one of them
    /// ends, at most `timeout` ([`Error::Timeout`]); 0 counts as 1.
    pub async_acks_max: usize,
    /// Keep each ack's first argument as the JSON text it arrived as (key
    /// order and numbers untouched), for relaying it on; off by default.
    pub raw_acks: bool,
    /// Turns the `host:port` of a URL into the addresses tried in turn:
    /// [`resolve_names`] (the default) asks the system's resolver, so
    /// host names work; [`resolve_ip`] takes only an IP address and looks
    /// nothing up. A program that only ever dials IP addresses (the
    /// broker's links to its peers) starts from
    /// [`Options::resolving_with`]`(resolve_ip)` and so leaves the C
    /// library's resolver out of its binary (docs/PERFORMANCE.md, "Binary
    /// size").
    pub resolve: Resolve,
}

/// How [`Options::resolve`] turns `host:port` into socket addresses.
pub type Resolve = fn(&str) -> io::Result<Vec<SocketAddr>>;

/// The default [`Options::resolve`]: an IP address as it is, a host name
/// through the system's resolver (`getaddrinfo`).
pub fn resolve_names(host_port: &str) -> io::Result<Vec<SocketAddr>> {
    Ok(host_port.to_socket_addrs()?.collect())
}

/// An [`Options::resolve`] for IP addresses only (`127.0.0.1:80`,
/// `[::1]:80`): anything else is an error, and no name is looked up.
pub fn resolve_ip(host_port: &str) -> io::Result<Vec<SocketAddr>> {
    host_port.parse().map(|a| vec![a]).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host_port} is not an IP address and port (names are not looked up here)"),
        )
    })
}

impl Default for Options {
    fn default() -> Self {
        Options::resolving_with(resolve_names)
    }
}

impl Options {
    /// The defaults with `resolve` as [`Options::resolve`]. A program that
    /// must leave the system's resolver out of its binary starts from
    /// `Options::resolving_with(resolve_ip)`: through
    /// `..Options::default()` the compiler keeps [`resolve_names`] (and
    /// `getaddrinfo` with it, about 190 KB of a static binary) whenever it
    /// does not inline `default`.
    pub fn resolving_with(resolve: Resolve) -> Options {
        Options {
            token: None,
            namespace: "/".to_string(),
            timeout: Duration::from_secs(5),
            reconnect: None,
            publish_buffer: 0,
            subscription_capacity: SUBSCRIPTION_CAPACITY_DEFAULT,
            subscription_bytes_max: SUBSCRIPTION_BYTES_DEFAULT,
            async_acks_max: ASYNC_ACKS_DEFAULT,
            raw_acks: false,
            resolve,
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
    /// The server acked `{"ok":false,"error":{code,message}}`;
    /// `revision` is a `wrong_revision`'s latest revision of the key.
    Server {
        code: String,
        message: String,
        revision: Option<u64>,
    },
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
            Error::Server { code, message, .. } => write!(f, "server error {code}: {message}"),
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
                Error::Server {
                    code,
                    message,
                    revision,
                },
                Error::Server {
                    code: c2,
                    message: m2,
                    revision: r2,
                },
            ) => code == c2 && message == m2 && revision == r2,
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
    /// Set on a push consumer's delivery: which stream message it is.
    pub stream: Option<StreamDelivery>,
}

impl Message {
    /// The bytes when `data` is exactly one binary attachment (what
    /// [`Client::publish_bytes`] sends).
    pub fn bytes(&self) -> Option<&[u8]> {
        let num = socketio::placeholder_num(&self.data)?;
        self.attachments.get(num).map(Vec::as_slice)
    }

    /// Parses a `msg` event argument; `None` if `sid` or `subject` is missing.
    fn from_event(arg: Value, attachments: Vec<Vec<u8>>) -> Option<Message> {
        let Value::Object(mut fields) = arg else {
            return None;
        };
        let sid = take_string(&mut fields, "sid")?;
        let Some(subject) = take_string(&mut fields, "subject") else {
            // A bucket watch's delivery: its fields are the data.
            let bucket = fields.get("bucket")?.as_str()?;
            let subject = match fields.get("key").and_then(Value::as_str) {
                Some(key) => format!("$KV.{bucket}.{key}"),
                None => format!("$KV.{bucket}"),
            };
            return Some(Message {
                sid,
                subject,
                data: Value::Object(fields),
                reply: None,
                headers: None,
                attachments,
                stream: None,
            });
        };
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

impl From<Value> for Payload {
    fn from(v: Value) -> Payload {
        Payload::Json(v)
    }
}

impl From<Vec<u8>> for Payload {
    fn from(b: Vec<u8>) -> Payload {
        Payload::Bytes(b)
    }
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
            Payload::Bytes(b) => (socketio::placeholder(0), vec![b.clone()]),
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
    Some(crate::maps::map_of(map.into_iter().filter_map(
        |(k, v)| match v {
            Value::String(s) => Some((k, s)),
            _ => None,
        },
    )))
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
            async_acks: 0,
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
            slots: Condvar::new(),
            next_sid: AtomicU64::new(1),
            pongs: AtomicU64::new(0),
            events: Arc::new(Inbox::new(EVENTS_MAX, usize::MAX)),
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
        self.open_route(subject, queue, max, None)
    }

    /// A subscription, or with `watch` a bucket watch (its `kv.watch`
    /// argument, `sid` filled in here), routed before it is asked for.
    pub(super) fn open_route(
        &self,
        subject: &str,
        queue: Option<&str>,
        max: Option<u64>,
        mut watch: Option<Value>,
    ) -> Result<Subscription, Error> {
        let sid = self
            .shared
            .next_sid
            .fetch_add(1, Ordering::Relaxed)
            .to_string();
        if let Some(w) = watch.as_mut() {
            w["sid"] = json!(sid);
        }
        let opts = &self.shared.opts;
        let inbox = Arc::new(Inbox::new(
            opts.subscription_capacity,
            opts.subscription_bytes_max,
        ));
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
                watch: watch.clone(),
                resub_tries: 0,
            };
            state.subs.insert(sid.clone(), route);
        }
        let asked = match watch {
            Some(w) => self.call("kv.watch", w),
            None => self.call("sub", sub_arg(&sid, subject, queue, max)),
        };
        if let Err(e) = asked {
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
            .emit(event, args, &[], Some(self.shared.opts.timeout), false)?
            .ok_or_else(|| Error::Protocol(format!("{event} without ack")))?;
        Ok(reply.value)
    }

    /// [`Client::call`], also returning the ack's binary attachments (a
    /// BINARY_ACK's), indexed by the placeholders' `num`.
    pub fn call_with_attachments(
        &self,
        event: &str,
        args: Value,
    ) -> Result<(Value, Vec<Vec<u8>>), Error> {
        let reply = self
            .shared
            .emit(event, args, &[], Some(self.shared.opts.timeout), false)?
            .ok_or_else(|| Error::Protocol(format!("{event} without ack")))?;
        Ok((reply.value, reply.attachments))
    }

    /// [`Client::call`] sending `attachments` (binary frames) with the
    /// event; the placeholders in `args` number them.
    pub fn call_sending(
        &self,
        event: &str,
        args: Value,
        attachments: &[Vec<u8>],
    ) -> Result<Value, Error> {
        let reply = self
            .shared
            .emit(
                event,
                args,
                attachments,
                Some(self.shared.opts.timeout),
                false,
            )?
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
            let text = socketio::encode_message(
                PacketType::Disconnect,
                0,
                &shared.opts.namespace,
                None,
                "",
            );
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
/// [`Options::subscription_capacity`] messages and
/// [`Options::subscription_bytes_max`] bytes (the oldest are dropped past
/// that, see [`Subscription::dropped`]). Survives reconnects under the same sid.
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

    #[test]
    fn resolve_ip_takes_addresses_and_looks_up_no_name() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(resolve_ip("127.0.0.1:8080").unwrap(), vec![v4]);
        assert_eq!(resolve_ip("[::1]:9").unwrap(), vec![v6]);
        for name in ["localhost:8080", "example.com:80", "127.0.0.1", ""] {
            let e = resolve_ip(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
        // The default still looks names up.
        let local = resolve_names("localhost:8080").unwrap();
        assert!(!local.is_empty() && local.iter().all(|a| a.ip().is_loopback()));
        assert_eq!(resolve_names("127.0.0.1:8080").unwrap(), vec![v4]);
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
