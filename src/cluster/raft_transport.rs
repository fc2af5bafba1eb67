//! Node-to-node Raft transport: TCP on `-raft-addr`, on its own mio
//! `Poll` so it can run on a thread of its own (cluster mode) or be a
//! whole event loop (examples/raft_node.rs).
//!
//! Each node dials every peer once and only writes on that connection;
//! what it accepts it only reads. A frame is one [`record`] (u32 length,
//! u32 crc32, body) whose body is one [`raft_msg`] message. Frames queued
//! for a peer go out together in as few writes as the socket takes
//! (batching). Every peer's queue has a byte bound: past it, new messages
//! for that peer are dropped and counted (Raft retries what matters), so a
//! slow or dead peer never grows memory. A failed or lost connection is
//! dialled again after a backoff that doubles up to a bound.
//!
//! Readiness is a hint: sockets are read and written until `WouldBlock`.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::raft_msg::{self, Message, NodeId};
use crate::storage::record;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const PEER_BASE: usize = 1_000;
const INBOUND_BASE: usize = 1_000_000;

/// Bounds and timings of the transport.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub id: NodeId,
    pub listen: SocketAddr,
    /// Every other member and its Raft address.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Most bytes queued (not yet written) for one peer.
    pub queue_bytes_max: usize,
    /// Largest frame body accepted from a peer.
    pub frame_bytes_max: usize,
    /// Most accepted connections held at once (the oldest is closed to
    /// make room). With `frame_bytes_max`, this bounds inbound buffers.
    pub inbound_max: usize,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl TransportConfig {
    pub fn new(id: NodeId, listen: SocketAddr, peers: BTreeMap<NodeId, SocketAddr>) -> Self {
        TransportConfig {
            id,
            listen,
            peers,
            queue_bytes_max: 8 << 20,
            frame_bytes_max: 64 << 20,
            inbound_max: 16,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

const _: () = assert!(64 << 20 <= record::BODY_BYTES_MAX);

/// Counters, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub sent: u64,
    pub received: u64,
    /// Messages dropped because a peer's queue was full.
    pub dropped_full: u64,
    /// Frames that failed their crc or did not decode (the connection is
    /// closed).
    pub bad_frames: u64,
    /// Messages from unknown senders or for another node.
    pub misaddressed: u64,
    pub connects: u64,
}

struct Peer {
    addr: SocketAddr,
    token: Token,
    stream: Option<TcpStream>,
    connected: bool,
    /// Encoded frames not yet written, oldest first; `head_written` bytes
    /// of the first are already out.
    queue: VecDeque<Vec<u8>>,
    head_written: usize,
    queued_bytes: usize,
    next_dial: Instant,
    backoff: Duration,
}

struct Inbound {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// The transport: a listener, one outbound connection per peer, and the
/// inbound connections peers opened.
pub struct Transport {
    cfg: TransportConfig,
    poll: Poll,
    events: Events,
    listener: TcpListener,
    waker: Arc<Waker>,
    peers: BTreeMap<NodeId, Peer>,
    inbound: BTreeMap<Token, Inbound>,
    next_inbound: usize,
    stats: TransportStats,
    scratch: Vec<u8>,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Transport {
    /// Binds the listener; peers are dialled on the first [`Transport::poll`].
    pub fn bind(cfg: TransportConfig) -> io::Result<Transport> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(cfg.listen)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let now = Instant::now();
        let peers = cfg
            .peers
            .iter()
            .enumerate()
            .map(|(i, (&id, &addr))| {
                let p = Peer {
                    addr,
                    token: Token(PEER_BASE + i),
                    stream: None,
                    connected: false,
                    queue: VecDeque::new(),
                    head_written: 0,
                    queued_bytes: 0,
                    next_dial: now,
                    backoff: cfg.backoff_min,
                };
                (id, p)
            })
            .collect();
        Ok(Transport {
            cfg,
            poll,
            events: Events::with_capacity(256),
            listener,
            waker,
            peers,
            inbound: BTreeMap::new(),
            next_inbound: 0,
            stats: TransportStats::default(),
            scratch: vec![0; 64 << 10],
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Wakes a [`Transport::poll`] in progress (from another thread).
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    pub fn stats(&self) -> TransportStats {
        self.stats
    }

    /// Changes where `peer` is dialled (from the next dial on).
    pub fn set_peer_addr(&mut self, peer: NodeId, addr: SocketAddr) {
        self.cfg.peers.insert(peer, addr);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.addr = addr;
        }
    }

    /// Bytes queued for `peer` and not yet written.
    pub fn queued_bytes(&self, peer: NodeId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.queued_bytes)
    }

    /// Whether the connection to `peer` is up.
    pub fn is_connected(&self, peer: NodeId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.connected)
    }

    /// Queues `m` for its destination; written by the next `poll` (or at
    /// once if the socket takes it). Dropped if the peer is unknown or its
    /// queue is full.
    pub fn send(&mut self, m: &Message) {
        let Some(p) = self.peers.get_mut(&m.to) else {
            self.stats.misaddressed += 1;
            return;
        };
        let mut frame = Vec::new();
        let start = record::begin(&mut frame);
        raft_msg::encode(&mut frame, m);
        record::finish(&mut frame, start);
        // A message larger than the queue's cap (a big snapshot) still goes
        // out when the queue is empty, so a lagging peer can catch up.
        let full = p.queued_bytes > 0 && p.queued_bytes + frame.len() > self.cfg.queue_bytes_max;
        if full || frame.len() > self.cfg.frame_bytes_max {
            self.stats.dropped_full += 1;
            return;
        }
        p.queued_bytes += frame.len();
        p.queue.push_back(frame);
        self.stats.sent += 1;
    }

    /// One turn: waits at most `timeout` for I/O, then accepts, reads
    /// (appending whole messages to `inbox`), dials and writes.
    pub fn poll(&mut self, timeout: Duration, inbox: &mut Vec<Message>) -> io::Result<()> {
        let now = Instant::now();
        self.dial_due(now);
        self.flush_all();
        let wait = self
            .peers
            .values()
            .filter(|p| p.stream.is_none())
            .map(|p| p.next_dial.saturating_duration_since(now))
            .min()
            .map_or(timeout, |d| d.min(timeout));
        match self.poll.poll(&mut self.events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        let tokens: Vec<(Token, bool, bool)> = self
            .events
            .iter()
            .map(|e| {
                (
                    e.token(),
                    e.is_readable() || e.is_read_closed(),
                    e.is_writable() || e.is_error(),
                )
            })
            .collect();
        for (token, readable, writable) in tokens {
            match token {
                LISTENER => self.accept(),
                WAKER => {}
                t if t.0 >= INBOUND_BASE => {
                    if readable {
                        self.read_inbound(t, inbox);
                    }
                }
                t => {
                    if let Some(id) = self.peer_of(t) {
                        self.on_peer_event(id, readable, writable);
                    }
                }
            }
        }
        self.dial_due(Instant::now());
        self.flush_all();
        Ok(())
    }

    fn peer_of(&self, t: Token) -> Option<NodeId> {
        self.peers
            .iter()
            .find(|(_, p)| p.token == t)
            .map(|(&id, _)| id)
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if self.inbound.len() >= self.cfg.inbound_max {
                        // Make room by closing the oldest: a peer that
                        // reconnects must not be locked out by idle ones.
                        if let Some((_, mut old)) = self.inbound.pop_first() {
                            let _ = self.poll.registry().deregister(&mut old.stream);
                        }
                    }
                    // Tokens only grow, so the map's first entry is the oldest.
                    let token = Token(INBOUND_BASE + self.next_inbound);
                    self.next_inbound += 1;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, token, Interest::READABLE)
                        .is_ok()
                    {
                        let _ = stream.set_nodelay(true);
                        self.inbound.insert(
                            token,
                            Inbound {
                                stream,
                                buf: Vec::new(),
                            },
                        );
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Reads until `WouldBlock`, decoding whole frames as they complete
    /// (so the buffer never holds more than one frame and one read).
    fn read_inbound(&mut self, t: Token, inbox: &mut Vec<Message>) {
        let Some(conn) = self.inbound.get_mut(&t) else {
            return;
        };
        let close = loop {
            match conn.stream.read(&mut self.scratch) {
                Ok(0) => break true,
                Ok(n) => conn.buf.extend_from_slice(&self.scratch[..n]),
                Err(e) if would_block(&e) => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break true,
            }
            if !decode_frames(&self.cfg, &mut self.stats, &mut conn.buf, inbox) {
                break true;
            }
        };
        if close {
            if let Some(mut c) = self.inbound.remove(&t) {
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
        }
    }

    fn dial_due(&mut self, now: Instant) {
        let due: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.stream.is_none() && p.next_dial <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            match TcpStream::connect(p.addr) {
                Ok(mut s) => {
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut s, p.token, interest)
                        .is_ok()
                    {
                        let _ = s.set_nodelay(true);
                        p.stream = Some(s);
                        p.connected = false;
                    } else {
                        schedule_dial(p, now, self.cfg.backoff_max);
                    }
                }
                Err(_) => schedule_dial(p, now, self.cfg.backoff_max),
            }
        }
    }

    fn on_peer_event(&mut self, id: NodeId, readable: bool, writable: bool) {
        let max = self.cfg.backoff_max;
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(s) = p.stream.as_mut() else {
            return;
        };
        if !p.connected && writable {
            match (s.take_error(), s.peer_addr()) {
                (Ok(None), Ok(_)) => {
                    p.connected = true;
                    p.backoff = self.cfg.backoff_min;
                    self.stats.connects += 1;
                }
                (Ok(None), Err(e)) if e.kind() == io::ErrorKind::NotConnected => {}
                _ => {
                    self.drop_peer_conn(id, max);
                    return;
                }
            }
        }
        if readable {
            // Peers never write on this connection: readable means closed
            // (or misbehaving). Either way, start over.
            let mut b = [0u8; 64];
            let s = p.stream.as_mut().map(|s| s.read(&mut b));
            match s {
                Some(Err(e)) if would_block(&e) => {}
                _ => {
                    self.drop_peer_conn(id, max);
                    return;
                }
            }
        }
        self.flush(id);
    }

    /// Closes the connection to `id` and schedules a new dial.
    fn drop_peer_conn(&mut self, id: NodeId, max: Duration) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if let Some(mut s) = p.stream.take() {
            let _ = self.poll.registry().deregister(&mut s);
        }
        p.connected = false;
        // A frame cut in the middle is resent whole on the new connection.
        p.head_written = 0;
        schedule_dial(p, Instant::now(), max);
    }

    fn flush_all(&mut self) {
        let ids: Vec<NodeId> = self.peers.keys().copied().collect();
        for id in ids {
            self.flush(id);
        }
    }

    /// Writes queued frames to `id` until done or `WouldBlock`, several
    /// frames per write.
    fn flush(&mut self, id: NodeId) {
        let max = self.cfg.backoff_max;
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if !p.connected {
            return;
        }
        let Some(s) = p.stream.as_mut() else {
            return;
        };
        let mut failed = false;
        while !p.queue.is_empty() {
            // Gather up to 256 KiB of frames into one write.
            let mut batch = Vec::new();
            for (i, f) in p.queue.iter().enumerate() {
                let from = if i == 0 { p.head_written } else { 0 };
                if !batch.is_empty() && batch.len() + f.len() - from > 256 << 10 {
                    break;
                }
                batch.extend_from_slice(&f[from..]);
            }
            match s.write(&batch) {
                Ok(0) => {
                    failed = true;
                    break;
                }
                Ok(mut n) => {
                    while n > 0 {
                        let Some(f) = p.queue.front() else { break };
                        let left = f.len() - p.head_written;
                        if n >= left {
                            n -= left;
                            p.queued_bytes -= f.len();
                            p.queue.pop_front();
                            p.head_written = 0;
                        } else {
                            p.head_written += n;
                            n = 0;
                        }
                    }
                }
                Err(e) if would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.drop_peer_conn(id, max);
        }
    }
}

/// The next dial after a failure: now + backoff, and the backoff doubles.
fn schedule_dial(p: &mut Peer, now: Instant, max: Duration) {
    p.next_dial = now + p.backoff;
    p.backoff = (p.backoff * 2).min(max);
}

/// Takes every whole frame off the front of `buf` into `inbox`. False if
/// the stream is bad (a length beyond the bound, a crc mismatch, a body
/// that is not a message): the connection must close.
fn decode_frames(
    cfg: &TransportConfig,
    stats: &mut TransportStats,
    buf: &mut Vec<u8>,
    inbox: &mut Vec<Message>,
) -> bool {
    let mut at = 0;
    let ok = loop {
        if let Some(head) = buf.get(at..at + 4) {
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if len > cfg.frame_bytes_max {
                break false;
            }
        }
        match record::read(buf, at) {
            Ok(None) | Err(record::Bad::Short) => break true,
            Ok(Some((body, next))) => {
                at = next;
                match raft_msg::decode(body) {
                    Ok(m) if m.to == cfg.id && cfg.peers.contains_key(&m.from) => {
                        stats.received += 1;
                        inbox.push(m);
                    }
                    Ok(_) => stats.misaddressed += 1,
                    Err(_) => break false,
                }
            }
            Err(_) => break false,
        }
    };
    if !ok {
        stats.bad_frames += 1;
    }
    buf.drain(..at);
    ok
}
