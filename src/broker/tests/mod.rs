//! In-process tests of the broker core: a [`Broker`] driven through the
//! port's `Handler` calls with synthetic connections, its actions caught
//! by a [`Recorder`] sink. No sockets, no processes; the clock is the
//! recorder's, moved by hand.
//!
//! - [`messaging`]: pub/sub, wildcards, queue groups, request/reply, slow
//!   consumers, connection timers and closes.
//! - [`streams`]: captured publishes acked only once the fsync round that
//!   covers them is reported.
//! - [`cluster`]: what a cluster member hands to Raft and forwards toward
//!   its peers, and what it delivers from a peer's forward.

mod cluster;
mod messaging;
mod streams;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Broker, BrokerConfig};
use crate::port::{ConnId, Handler, NetStats, Payload, Shared, Sink};

/// One action the core took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// An Engine.IO message packet (its text after the `4`); `shared`
    /// when part of it was queued by reference.
    Text {
        conn: ConnId,
        text: String,
        shared: bool,
    },
    Binary {
        conn: ConnId,
        bytes: Vec<u8>,
    },
    Close(ConnId),
    Timer(ConnId, Option<Instant>),
}

/// A synthetic connection as the recorder keeps it.
struct Conn {
    open: bool,
    eio: u8,
    /// Bytes "queued" so far (nothing drains them) and the bound past
    /// which the connection is cut as a slow consumer, as the loop does.
    queued: usize,
    bound: usize,
}

/// A [`Sink`] that records every action and plays the loop's part for
/// open connections, Engine.IO versions and the outbound bound.
pub(super) struct Recorder {
    pub now: Instant,
    pub stats: NetStats,
    conns: HashMap<ConnId, Conn>,
    pub actions: Vec<Action>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            now: Instant::now(),
            stats: NetStats::default(),
            conns: HashMap::new(),
            actions: Vec::new(),
        }
    }

    /// Whether `conn` can take `len` more bytes; past its bound it is cut
    /// (no longer open) and counted as a slow consumer.
    fn room(&mut self, conn: ConnId, len: usize) -> bool {
        let Some(c) = self.conns.get_mut(&conn).filter(|c| c.open) else {
            return false;
        };
        if c.queued + len > c.bound {
            c.open = false;
            self.stats.slow_consumers += 1;
            return false;
        }
        c.queued += len;
        true
    }
}

impl Sink for Recorder {
    fn now(&self) -> Instant {
        self.now
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }

    fn is_open(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.open)
    }

    fn eio(&self, conn: ConnId) -> u8 {
        self.conns.get(&conn).map_or(4, |c| c.eio)
    }

    fn send_text(&mut self, conn: ConnId, parts: &[&[u8]]) -> bool {
        let bytes = parts.concat();
        if !self.room(conn, bytes.len() + 1) {
            return false;
        }
        self.actions.push(Action::Text {
            conn,
            text: String::from_utf8(bytes).unwrap(),
            shared: false,
        });
        true
    }

    fn send_text_shared(&mut self, conn: ConnId, parts: &[&[u8]], shared: &Shared) -> bool {
        let mut bytes = parts.concat();
        bytes.extend_from_slice(shared);
        if !self.room(conn, bytes.len() + 1) {
            return false;
        }
        self.actions.push(Action::Text {
            conn,
            text: String::from_utf8(bytes).unwrap(),
            shared: true,
        });
        true
    }

    fn send_binary(&mut self, conn: ConnId, bytes: &[u8]) -> bool {
        if !self.room(conn, bytes.len()) {
            return false;
        }
        self.actions.push(Action::Binary {
            conn,
            bytes: bytes.to_vec(),
        });
        true
    }

    fn close(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.open = false;
        }
        self.actions.push(Action::Close(conn));
    }

    fn set_timer(&mut self, conn: ConnId, at: Option<Instant>) {
        self.actions.push(Action::Timer(conn, at));
    }
}

/// A broker core and the sink its actions go into.
pub(super) struct Core {
    pub broker: Broker,
    pub sink: Recorder,
}

pub(super) fn config() -> BrokerConfig {
    BrokerConfig {
        node_id: "n1".into(),
        control_token: None,
        auth_token: None,
        cluster_token: None,
        max_payload: 1 << 20,
        connect_timeout: Duration::from_secs(45),
    }
}

/// A default bound for a synthetic connection's queue.
const BOUND: usize = 1 << 20;

impl Core {
    pub fn new() -> Core {
        Core::with(Broker::new(config()))
    }

    pub fn with(broker: Broker) -> Core {
        Core {
            broker,
            sink: Recorder::new(),
        }
    }

    /// An Engine.IO session opens on `conn` (v4).
    pub fn open(&mut self, conn: ConnId) {
        self.open_with(conn, 4, BOUND);
    }

    /// An Engine.IO session of version `eio` opens on `conn`, its queue
    /// bounded at `bound` bytes.
    pub fn open_with(&mut self, conn: ConnId, eio: u8, bound: usize) {
        self.sink.conns.insert(
            conn,
            Conn {
                open: true,
                eio,
                queued: 0,
                bound,
            },
        );
        self.broker.opened(&mut self.sink, conn, 0);
    }

    /// Opens `conn` and joins `/`; the CONNECT answer is taken.
    pub fn join(&mut self, conn: ConnId) {
        self.open(conn);
        self.text(conn, "0");
        let got = self.sent(conn);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("0{\"sid\":\""), "{got:?}");
    }

    /// Sets how many more bytes `conn` may queue before it is cut.
    pub fn set_room(&mut self, conn: ConnId, bytes: usize) {
        let c = self.sink.conns.get_mut(&conn).unwrap();
        c.bound = c.queued + bytes;
    }

    /// A text message (a Socket.IO packet) from `conn`.
    pub fn text(&mut self, conn: ConnId, packet: &str) {
        self.broker
            .message(&mut self.sink, conn, Payload::Text(packet));
    }

    /// A binary message (an attachment) from `conn`.
    pub fn binary(&mut self, conn: ConnId, bytes: &[u8]) {
        self.broker
            .message(&mut self.sink, conn, Payload::Binary(bytes));
    }

    /// The end of a loop turn.
    pub fn tick(&mut self) {
        self.broker.tick(&mut self.sink);
    }

    /// A helper thread woke the loop.
    pub fn woken(&mut self) {
        self.broker.woken(&mut self.sink);
    }

    /// The session on `conn` ended.
    pub fn close(&mut self, conn: ConnId) {
        if let Some(c) = self.sink.conns.get_mut(&conn) {
            c.open = false;
        }
        self.broker.closed(&mut self.sink, conn);
    }

    /// `conn`'s timer fired.
    pub fn timer(&mut self, conn: ConnId) {
        self.broker.timer(&mut self.sink, conn);
    }

    pub fn advance(&mut self, d: Duration) {
        self.sink.now += d;
    }

    /// Takes every action recorded so far.
    pub fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.sink.actions)
    }

    /// Takes the text packets sent to `conn`, in order; other actions
    /// stay.
    pub fn sent(&mut self, conn: ConnId) -> Vec<String> {
        let mut out = Vec::new();
        self.sink.actions.retain(|a| match a {
            Action::Text { conn: c, text, .. } if *c == conn => {
                out.push(text.clone());
                false
            }
            _ => true,
        });
        out
    }

    /// Asserts nothing but timers was recorded, and clears them.
    pub fn assert_quiet(&mut self) {
        let left: Vec<_> = self
            .take()
            .into_iter()
            .filter(|a| !matches!(a, Action::Timer(..)))
            .collect();
        assert!(left.is_empty(), "unexpected actions: {left:?}");
    }

    /// Subscribes `conn` to `subject` as `sid` (in `queue`, if given) and
    /// checks the ack.
    pub fn sub(&mut self, conn: ConnId, sid: &str, subject: &str, queue: Option<&str>) {
        let queue = queue.map_or(String::new(), |q| format!(",\"queue\":\"{q}\""));
        self.text(
            conn,
            &format!("29[\"sub\",{{\"subject\":\"{subject}\",\"sid\":\"{sid}\"{queue}}}]"),
        );
        assert_eq!(
            self.sent(conn),
            [format!("39[{{\"ok\":true,\"sid\":\"{sid}\"}}]")]
        );
    }
}

/// The `msg` packet a subscriber gets.
pub(super) fn msg(sid: &str, subject: &str, data: &str) -> String {
    format!("2[\"msg\",{{\"sid\":\"{sid}\",\"subject\":\"{subject}\",\"data\":{data}}}]")
}
