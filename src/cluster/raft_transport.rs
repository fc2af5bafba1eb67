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
//! With a cluster secret, every connection first runs the handshake of
//! [`raft_auth`]: the dialer sends nothing of Raft until the acceptor has
//! proven it holds the secret, and the acceptor reads no Raft frame until
//! the dialer has. A proven inbound connection is bound to the node it
//! proved to be, and a message on it naming another sender is dropped and
//! counted. Without a secret there is no handshake and an inbound
//! connection is bound to the sender of its first message.
//!
//! Accepted connections that are not bound to a member yet wait in a pool
//! of their own ([`TransportConfig::inbound_max`] slots; the oldest is
//! closed to make room, one that has not even said hello first), and with
//! a secret each has [`TransportConfig::handshake_timeout`] to prove
//! itself. Bound connections are held apart, one per member, so no number
//! of strangers can push a member's connection out.
//!
//! A stream group's snapshot kept in a file ([`Transport::send_snapshot_file`])
//! goes out as [`Body::SnapshotChunk`] pieces read from the file only while
//! the peer's queue is short, then the message naming it: the file is
//! never in memory whole, and heartbeats queued behind it wait for little.
//!
//! Readiness is a hint: sockets are read and written until `WouldBlock`.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::raft_auth::{self, ClusterKey, Frame, Role, Transcript, NONCE_BYTES};
use super::raft_msg::{self, Body, GroupId, Message, NodeId};
use crate::storage::record;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const PEER_BASE: usize = 1_000;
const INBOUND_BASE: usize = 1_000_000;
/// One log line of a kind (per peer, or per kind of refusal) at most this
/// often; the lines left out are counted in the next one.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A snapshot file goes out in pieces of this size...
const PIECE_BYTES: u64 = 256 << 10;
/// ...queued only while fewer bytes than this wait for the peer.
const PIECES_BELOW: usize = 1 << 20;
/// Most bytes, and most frames, handed to one write of a peer's socket.
const WRITE_BYTES: usize = 1 << 20;
const WRITE_SLICES: usize = 64;
/// Most bytes of pieces queued in one flush of one peer.
const PIECES_PER_FLUSH: usize = 8 << 20;
/// A snapshot sent whole to a peer is not sent again this soon (the core
/// asks again while the peer has not answered yet).
const RESEND_AFTER: Duration = Duration::from_secs(2);
/// Most snapshot files going to one peer at once.
const TRANSFERS_MAX: usize = 8;

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
    /// Most accepted connections held at once that are not bound to a
    /// member yet (the oldest is closed to make room). Members' own
    /// connections, one each, are held apart. With `frame_bytes_max`, this
    /// bounds inbound buffers.
    pub inbound_max: usize,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// The cluster secret. With it every connection must prove itself
    /// ([`raft_auth`]) before any message is acted on; without it there
    /// is no handshake.
    pub secret: Option<ClusterKey>,
    /// How long a connection has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Members' names for log lines (a member without one shows as its
    /// number).
    pub names: BTreeMap<NodeId, String>,
    /// Take connections and messages from nodes that are not in `peers`
    /// (with a secret, still only once they proved they hold it): a node
    /// waiting to be added does not know the members yet, and learns
    /// them from what the leader sends it.
    pub open: bool,
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
            secret: None,
            handshake_timeout: Duration::from_secs(2),
            names: BTreeMap::new(),
            open: false,
        }
    }

    fn name(&self, id: NodeId) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("node {id}"))
    }
}

const _: () = assert!(64 << 20 <= record::BODY_BYTES_MAX);

/// Counters, for logs, metrics and tests.
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
    /// Messages naming another sender than the member their connection
    /// is bound to (dropped).
    pub rejected_sender: u64,
    /// Outbound connections made (and, with a secret, proven).
    pub connects: u64,
    /// Handshakes completed, inbound and outbound.
    pub handshakes: u64,
    /// Handshakes refused because a proof did not verify (the dialer's,
    /// or, on our own connections, the acceptor's).
    pub refused_proof: u64,
    /// Handshakes refused at the hello: not a handshake, or naming a
    /// stranger or another node.
    pub refused_hello: u64,
    /// Handshakes not completed in time.
    pub refused_timeout: u64,
    /// Accepted connections not yet bound, closed to make room.
    pub evicted: u64,
}

/// Log lines of one kind: at most one per [`LOG_EVERY`].
#[derive(Default)]
struct Limiter {
    next: Option<Instant>,
    quiet: u64,
}

impl Limiter {
    /// `Some(lines left out since the last one)` when a line may go out.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.next.is_some_and(|n| now < n) {
            self.quiet += 1;
            return None;
        }
        self.next = Some(now + LOG_EVERY);
        Some(std::mem::take(&mut self.quiet))
    }
}

fn more(quiet: u64) -> String {
    if quiet == 0 {
        String::new()
    } else {
        format!(" ({quiet} more like it left out)")
    }
}

struct Peer {
    addr: SocketAddr,
    token: Token,
    stream: Option<TcpStream>,
    /// The TCP connection is established.
    connected: bool,
    /// Frames may go out: the peer has proven itself (or no secret).
    proven: bool,
    /// Our nonce of the handshake under way, the acceptor's hello read so
    /// far, and when the attempt is given up.
    nonce: [u8; NONCE_BYTES],
    hello: Vec<u8>,
    deadline: Instant,
    /// Encoded frames not yet written, oldest first; `head_written` bytes
    /// of the first are already out.
    queue: VecDeque<Vec<u8>>,
    head_written: usize,
    queued_bytes: usize,
    next_dial: Instant,
    backoff: Duration,
    log: Limiter,
    /// Snapshot files going out, one per group, oldest first.
    transfers: VecDeque<Transfer>,
    /// Snapshots (group, index) sent whole, and when.
    sent_whole: Vec<(GroupId, u64, Instant)>,
}

/// A snapshot file on its way to a peer: the pieces from `offset` on,
/// then `last`, the message naming the file.
struct Transfer {
    file: File,
    size: u64,
    offset: u64,
    index: u64,
    last: Message,
}

/// Where an accepted connection stands.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// Waiting for the dialer's hello (with a secret).
    Hello,
    /// Our hello and proof went out; waiting for the dialer's proof.
    Proof(Transcript),
    /// No secret: not bound yet; its first message binds it.
    Open,
    /// Bound to this member; its messages are read.
    Member(NodeId),
}

struct Inbound {
    stream: TcpStream,
    addr: SocketAddr,
    buf: Vec<u8>,
    stage: Stage,
    /// With a secret: closed if still unproven then.
    deadline: Instant,
}

impl Inbound {
    fn bound(&self) -> Option<NodeId> {
        match self.stage {
            Stage::Member(id) => Some(id),
            _ => None,
        }
    }
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
    /// The inbound connection each member is bound to.
    bound: BTreeMap<NodeId, Token>,
    next_inbound: usize,
    stats: TransportStats,
    scratch: Vec<u8>,
    log_proof: Limiter,
    log_hello: Limiter,
    /// The token the next peer added by [`Transport::set_peers`] gets.
    next_peer: usize,
}

fn new_peer(addr: SocketAddr, token: Token, now: Instant, backoff: Duration) -> Peer {
    Peer {
        addr,
        token,
        stream: None,
        connected: false,
        proven: false,
        nonce: [0; NONCE_BYTES],
        hello: Vec::new(),
        deadline: now,
        queue: VecDeque::new(),
        head_written: 0,
        queued_bytes: 0,
        next_dial: now,
        backoff,
        log: Limiter::default(),
        transfers: VecDeque::new(),
        sent_whole: Vec::new(),
    }
}

/// The snapshot a message carries: (index, term).
fn snapshot_of(m: &Message) -> Option<(u64, u64)> {
    match &m.body {
        Body::Snapshot { snapshot } | Body::ConfSnapshot { snapshot, .. } => {
            Some((snapshot.index, snapshot.term))
        }
        _ => None,
    }
}

/// Encodes `m` as a frame at the end of `p`'s queue.
fn push_frame(p: &mut Peer, m: &Message) -> usize {
    let mut frame = Vec::new();
    let start = record::begin(&mut frame);
    raft_msg::encode(&mut frame, m);
    record::finish(&mut frame, start);
    let n = frame.len();
    p.queued_bytes += n;
    p.queue.push_back(frame);
    n
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Writes a handshake frame whole, at once. A fresh connection's send
/// buffer takes a hundred bytes; if it does not, the attempt fails.
fn write_now(s: &mut TcpStream, bytes: &[u8]) -> bool {
    let mut at = 0;
    while at < bytes.len() {
        match s.write(&bytes[at..]) {
            Ok(0) => return false,
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
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
        let peers: BTreeMap<NodeId, Peer> =
            crate::maps::map_of(cfg.peers.iter().enumerate().map(|(i, (&id, &addr))| {
                (
                    id,
                    new_peer(addr, Token(PEER_BASE + i), now, cfg.backoff_min),
                )
            }));
        let next_peer = peers.len();
        Ok(Transport {
            cfg,
            poll,
            events: Events::with_capacity(256),
            listener,
            waker,
            peers,
            inbound: BTreeMap::new(),
            bound: BTreeMap::new(),
            next_inbound: 0,
            stats: TransportStats::default(),
            scratch: vec![0; 64 << 10],
            log_proof: Limiter::default(),
            log_hello: Limiter::default(),
            next_peer,
        })
    }

    /// Makes `peers` (every other member and its Raft address) the nodes
    /// this transport dials and accepts, as the configuration changes: a
    /// new member is dialled at once, a departed one's connections are
    /// closed and its queue dropped, a moved one is dialled at its new
    /// address from the next dial on.
    pub fn set_peers(
        &mut self,
        peers: BTreeMap<NodeId, SocketAddr>,
        names: BTreeMap<NodeId, String>,
    ) {
        let gone: Vec<NodeId> = self
            .peers
            .keys()
            .filter(|id| !peers.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            // What is queued for it (the heartbeat telling it its removal
            // committed) goes out now if the socket takes it.
            self.flush(id);
            if let Some(mut p) = self.peers.remove(&id) {
                if let Some(mut s) = p.stream.take() {
                    let _ = self.poll.registry().deregister(&mut s);
                }
            }
            if let Some(t) = self.bound.remove(&id) {
                self.close_inbound(t);
            }
        }
        let now = Instant::now();
        for (&id, &addr) in &peers {
            match self.peers.get_mut(&id) {
                Some(p) => p.addr = addr,
                None => {
                    // Tokens of peers stay below the inbound ones.
                    let token = Token(PEER_BASE + self.next_peer % (INBOUND_BASE - PEER_BASE));
                    self.next_peer += 1;
                    let p = new_peer(addr, token, now, self.cfg.backoff_min);
                    self.peers.insert(id, p);
                }
            }
        }
        self.cfg.peers = peers;
        self.cfg.names.extend(names);
    }

    /// Where `peer` is dialled, if it is a peer.
    pub fn peer_addr(&self, peer: NodeId) -> Option<SocketAddr> {
        self.cfg.peers.get(&peer).copied()
    }

    pub fn is_open(&self) -> bool {
        self.cfg.open
    }

    /// See [`TransportConfig::open`].
    pub fn set_open(&mut self, open: bool) {
        self.cfg.open = open;
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

    /// Whether the connection to `peer` is up (and, with a secret, the
    /// peer has proven itself on it).
    pub fn is_connected(&self, peer: NodeId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.proven)
    }

    /// Accepted connections not bound to a member (yet).
    pub fn unbound_inbound(&self) -> usize {
        self.inbound
            .values()
            .filter(|c| c.bound().is_none())
            .count()
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

    /// Sends the snapshot message `m` (a [`Body::Snapshot`] or
    /// [`Body::ConfSnapshot`] of a stream group) whose state is in `file`
    /// (`size` bytes): the file in pieces, then `m`. A snapshot of the
    /// same group and index already on its way, or sent whole a moment
    /// ago, is not sent again; one of another index replaces it.
    pub fn send_snapshot_file(&mut self, m: &Message, file: File, size: u64) {
        let Some((index, _)) = snapshot_of(m) else {
            return;
        };
        let Some(p) = self.peers.get_mut(&m.to) else {
            self.stats.misaddressed += 1;
            return;
        };
        let now = Instant::now();
        p.sent_whole
            .retain(|&(_, _, at)| now.duration_since(at) < RESEND_AFTER);
        let same = |g: GroupId, i: u64| g == m.group && i == index;
        if p.transfers.iter().any(|t| same(t.last.group, t.index))
            || p.sent_whole.iter().any(|&(g, i, _)| same(g, i))
        {
            return;
        }
        p.transfers.retain(|t| t.last.group != m.group);
        if p.transfers.len() >= TRANSFERS_MAX {
            self.stats.dropped_full += 1;
            return;
        }
        p.transfers.push_back(Transfer {
            file,
            size,
            offset: 0,
            index,
            last: m.clone(),
        });
        self.stats.sent += 1;
    }

    /// Queues pieces of the snapshot files going to `id` while its queue
    /// is short, at most `budget` bytes; how many were queued.
    fn queue_pieces(&mut self, id: NodeId, budget: usize) -> usize {
        let Some(p) = self.peers.get_mut(&id) else {
            return 0;
        };
        let mut queued = 0;
        while p.proven && p.queued_bytes < PIECES_BELOW && queued < budget {
            let Some(t) = p.transfers.front_mut() else {
                break;
            };
            if t.offset < t.size {
                let n = PIECE_BYTES.min(t.size - t.offset) as usize;
                let mut data = vec![0; n];
                if let Err(e) = t.file.read_exact_at(&mut data, t.offset) {
                    crate::log_error!(
                        "stream group {}: reading its snapshot at {}: {e}",
                        t.last.group,
                        t.index
                    );
                    p.transfers.pop_front();
                    continue;
                }
                let (index, snap_term) = snapshot_of(&t.last).unwrap_or_default();
                let piece = Message {
                    group: t.last.group,
                    from: t.last.from,
                    to: t.last.to,
                    term: t.last.term,
                    body: Body::SnapshotChunk {
                        index,
                        snap_term,
                        offset: t.offset,
                        total: t.size,
                        data,
                    },
                };
                t.offset += n as u64;
                queued += push_frame(p, &piece);
                continue;
            }
            let Some(t) = p.transfers.pop_front() else {
                break;
            };
            queued += push_frame(p, &t.last);
            p.sent_whole.push((t.last.group, t.index, Instant::now()));
        }
        queued
    }

    /// One turn: waits at most `timeout` for I/O, then accepts, reads
    /// (appending whole messages to `inbox`), dials and writes.
    pub fn poll(&mut self, timeout: Duration, inbox: &mut Vec<Message>) -> io::Result<()> {
        let now = Instant::now();
        self.expire(now);
        self.dial_due(now);
        self.flush_all();
        let wait = self
            .peers
            .values()
            .filter(|p| p.stream.is_none())
            .map(|p| p.next_dial)
            .chain(self.handshake_deadlines())
            .map(|t| t.saturating_duration_since(now))
            .min()
            .map_or(timeout, |d| d.min(timeout));
        // Pieces to queue and room for them: do not sleep.
        let pieces_due = self
            .peers
            .values()
            .any(|p| p.proven && !p.transfers.is_empty() && p.queued_bytes < PIECES_BELOW);
        let wait = if pieces_due { Duration::ZERO } else { wait };
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
        let now = Instant::now();
        self.expire(now);
        self.dial_due(now);
        self.flush_all();
        Ok(())
    }

    /// When handshakes under way must be done by (with a secret).
    fn handshake_deadlines(&self) -> Vec<Instant> {
        if self.cfg.secret.is_none() {
            return Vec::new();
        }
        let inbound = self
            .inbound
            .values()
            .filter(|c| c.bound().is_none())
            .map(|c| c.deadline);
        let outbound = self
            .peers
            .values()
            .filter(|p| p.stream.is_some() && !p.proven)
            .map(|p| p.deadline);
        inbound.chain(outbound).collect()
    }

    /// Closes the connections whose handshake ran out of time.
    fn expire(&mut self, now: Instant) {
        if self.cfg.secret.is_none() {
            return;
        }
        let late: Vec<Token> = self
            .inbound
            .iter()
            .filter(|(_, c)| c.bound().is_none() && c.deadline <= now)
            .map(|(&t, _)| t)
            .collect();
        for t in late {
            if let Some(c) = self.inbound.get(&t) {
                crate::log_debug!(
                    "raft: closed a connection from {} that did not prove itself in {:?}",
                    c.addr,
                    self.cfg.handshake_timeout
                );
            }
            self.stats.refused_timeout += 1;
            self.close_inbound(t);
        }
        let late: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.stream.is_some() && !p.proven && p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.stats.refused_timeout += 1;
            let what = if self.peers.get(&id).is_some_and(|p| p.connected) {
                "did not complete the handshake"
            } else {
                "could not be reached"
            };
            self.peer_log(
                id,
                &format!("{what} within {:?}", self.cfg.handshake_timeout),
            );
            self.drop_peer_conn(id);
        }
    }

    /// A log line about peer `id`, at most one per [`LOG_EVERY`].
    fn peer_log(&mut self, id: NodeId, what: &str) {
        let name = self.cfg.name(id);
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if let Some(quiet) = p.log.allow(Instant::now()) {
            crate::log_warn!("raft: peer {name} at {}: {what}{}", p.addr, more(quiet));
        }
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
                Ok((mut stream, addr)) => {
                    self.make_room();
                    // Tokens only grow, so the map's order is age.
                    let token = Token(INBOUND_BASE + self.next_inbound);
                    self.next_inbound += 1;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, token, Interest::READABLE)
                        .is_ok()
                    {
                        let _ = stream.set_nodelay(true);
                        let stage = if self.cfg.secret.is_some() {
                            Stage::Hello
                        } else {
                            Stage::Open
                        };
                        self.inbound.insert(
                            token,
                            Inbound {
                                stream,
                                addr,
                                buf: Vec::new(),
                                stage,
                                deadline: Instant::now() + self.cfg.handshake_timeout,
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

    /// Keeps unbound connections under `inbound_max` before one more is
    /// taken: the oldest that has not said hello goes first, else the
    /// oldest. Bound (members') connections are never touched.
    fn make_room(&mut self) {
        if self.unbound_inbound() < self.cfg.inbound_max.max(1) {
            return;
        }
        let silent = self
            .inbound
            .iter()
            .find(|(_, c)| matches!(c.stage, Stage::Hello | Stage::Open));
        let victim = silent
            .or_else(|| self.inbound.iter().find(|(_, c)| c.bound().is_none()))
            .map(|(&t, _)| t);
        if let Some(t) = victim {
            self.stats.evicted += 1;
            self.close_inbound(t);
        }
    }

    fn close_inbound(&mut self, t: Token) {
        if let Some(mut c) = self.inbound.remove(&t) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if let Some(id) = c.bound() {
                if self.bound.get(&id) == Some(&t) {
                    self.bound.remove(&id);
                }
            }
        }
    }

    /// Binds inbound connection `t` to member `id`; a connection bound to
    /// it before (the member reconnected) is closed.
    fn bind_member(&mut self, t: Token, id: NodeId) {
        if let Some(c) = self.inbound.get_mut(&t) {
            c.stage = Stage::Member(id);
        }
        if let Some(old) = self.bound.insert(id, t) {
            if old != t {
                self.close_inbound(old);
            }
        }
    }

    /// Reads until `WouldBlock`. While a connection proves itself, only
    /// the bytes of the handshake frame due are read; after that, whole
    /// frames are decoded as they complete (so the buffer never holds
    /// more than one frame and one read).
    fn read_inbound(&mut self, t: Token, inbox: &mut Vec<Message>) {
        loop {
            let Some(conn) = self.inbound.get_mut(&t) else {
                return;
            };
            let due = match conn.stage {
                Stage::Hello => raft_auth::DIALER_HELLO_BYTES,
                Stage::Proof(_) => raft_auth::DIALER_PROOF_BYTES,
                Stage::Open | Stage::Member(_) => return self.read_messages(t, inbox),
            };
            let need = raft_auth::framed(due) - conn.buf.len();
            match conn.stream.read(&mut self.scratch[..need]) {
                Ok(0) => return self.close_inbound(t),
                Ok(n) => conn.buf.extend_from_slice(&self.scratch[..n]),
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.close_inbound(t),
            }
            match raft_auth::read_frame(&conn.buf, due) {
                Ok(None) => {}
                Ok(Some(frame)) => {
                    conn.buf.clear();
                    self.on_handshake(t, frame);
                }
                Err(e) => {
                    let addr = conn.addr;
                    self.refuse_hello(t, addr, &e.to_string());
                    return;
                }
            }
        }
    }

    /// Closes `t` for a hello that is not one this node accepts.
    fn refuse_hello(&mut self, t: Token, addr: SocketAddr, why: &str) {
        self.stats.refused_hello += 1;
        if let Some(quiet) = self.log_hello.allow(Instant::now()) {
            crate::log_warn!(
                "raft: closed a connection from {addr}: {why} (a node without the cluster \
                 token or with other -raft-peers, or not a node at all){}",
                more(quiet)
            );
        }
        self.close_inbound(t);
    }

    /// The acceptor's side of a handshake frame.
    fn on_handshake(&mut self, t: Token, frame: Frame) {
        let Some(key) = self.cfg.secret.clone() else {
            return self.close_inbound(t);
        };
        let me = self.cfg.id;
        let Some(conn) = self.inbound.get_mut(&t) else {
            return;
        };
        let addr = conn.addr;
        match (conn.stage, frame) {
            (
                Stage::Hello,
                Frame::DialerHello {
                    dialer,
                    acceptor,
                    nonce,
                },
            ) => {
                if acceptor != me {
                    let why = format!("its hello is for node {acceptor}, this is node {me}");
                    return self.refuse_hello(t, addr, &why);
                }
                if dialer == me || !(self.cfg.open || self.cfg.peers.contains_key(&dialer)) {
                    let why = format!("its hello names node {dialer}, not a member");
                    return self.refuse_hello(t, addr, &why);
                }
                let mut mine = [0u8; NONCE_BYTES];
                if let Err(e) = crate::crypto::random_bytes(&mut mine) {
                    crate::log_error!("raft: no random bytes for a handshake: {e}");
                    return self.close_inbound(t);
                }
                let tr = Transcript {
                    dialer,
                    acceptor: me,
                    dialer_nonce: nonce,
                    acceptor_nonce: mine,
                };
                let proof = raft_auth::proof(&key, Role::Acceptor, &tr);
                let mut out =
                    Vec::with_capacity(raft_auth::framed(raft_auth::ACCEPTOR_HELLO_BYTES));
                raft_auth::encode_acceptor_hello(&mut out, me, dialer, &mine, &proof);
                if !write_now(&mut conn.stream, &out) {
                    return self.close_inbound(t);
                }
                conn.stage = Stage::Proof(tr);
            }
            (Stage::Proof(tr), Frame::DialerProof { proof }) => {
                if !raft_auth::check(&key, Role::Dialer, &tr, &proof) {
                    self.stats.refused_proof += 1;
                    if let Some(quiet) = self.log_proof.allow(Instant::now()) {
                        crate::log_warn!(
                            "raft: a connection from {addr} claiming to be {} failed its proof \
                             (cluster tokens differ, or a replay); closed{}",
                            self.cfg.name(tr.dialer),
                            more(quiet)
                        );
                    }
                    return self.close_inbound(t);
                }
                self.stats.handshakes += 1;
                self.bind_member(t, tr.dialer);
            }
            _ => self.refuse_hello(t, addr, &raft_auth::Refused::Unexpected.to_string()),
        }
    }

    /// Reads Raft frames on a bound (or, without a secret, still open)
    /// connection until `WouldBlock`.
    fn read_messages(&mut self, t: Token, inbox: &mut Vec<Message>) {
        let Some(conn) = self.inbound.get_mut(&t) else {
            return;
        };
        let mut sender = conn.bound();
        let close = loop {
            match conn.stream.read(&mut self.scratch) {
                Ok(0) => break true,
                Ok(n) => conn.buf.extend_from_slice(&self.scratch[..n]),
                Err(e) if would_block(&e) => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break true,
            }
            if !decode_frames(
                &self.cfg,
                &mut self.stats,
                &mut conn.buf,
                inbox,
                &mut sender,
            ) {
                break true;
            }
        };
        let newly = match (conn.stage, sender) {
            (Stage::Open, Some(id)) => Some(id),
            _ => None,
        };
        if close {
            self.close_inbound(t);
        } else if let Some(id) = newly {
            self.bind_member(t, id);
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
                        p.proven = false;
                        p.hello.clear();
                        p.deadline = now + self.cfg.handshake_timeout;
                    } else {
                        schedule_dial(p, now, self.cfg.backoff_max);
                    }
                }
                Err(_) => schedule_dial(p, now, self.cfg.backoff_max),
            }
        }
    }

    fn on_peer_event(&mut self, id: NodeId, readable: bool, writable: bool) {
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
                    if !self.start_handshake(id) {
                        return;
                    }
                }
                (Ok(None), Err(e)) if e.kind() == io::ErrorKind::NotConnected => {}
                _ => {
                    self.drop_peer_conn(id);
                    return;
                }
            }
        }
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if readable && p.connected && !p.proven {
            self.read_acceptor_hello(id);
        } else if readable {
            // Peers never write on this connection once it is proven:
            // readable means closed (or misbehaving). Either way, start
            // over.
            let mut b = [0u8; 64];
            let s = p.stream.as_mut().map(|s| s.read(&mut b));
            match s {
                Some(Err(e)) if would_block(&e) => {}
                _ => {
                    self.drop_peer_conn(id);
                    return;
                }
            }
        }
        self.flush(id);
    }

    /// The connection to `id` is up: without a secret it is ready; with
    /// one, our hello goes out. False if the connection was dropped.
    fn start_handshake(&mut self, id: NodeId) -> bool {
        let me = self.cfg.id;
        let backoff_min = self.cfg.backoff_min;
        let Some(p) = self.peers.get_mut(&id) else {
            return false;
        };
        if self.cfg.secret.is_none() {
            p.proven = true;
            p.backoff = backoff_min;
            self.stats.connects += 1;
            return true;
        }
        if let Err(e) = crate::crypto::random_bytes(&mut p.nonce) {
            crate::log_error!("raft: no random bytes for a handshake: {e}");
            self.drop_peer_conn(id);
            return false;
        }
        let mut out = Vec::with_capacity(raft_auth::framed(raft_auth::DIALER_HELLO_BYTES));
        raft_auth::encode_dialer_hello(&mut out, me, id, &p.nonce);
        let sent = p.stream.as_mut().is_some_and(|s| write_now(s, &out));
        if !sent {
            self.drop_peer_conn(id);
        }
        sent
    }

    /// Reads the acceptor's hello on our connection to `id`, checks its
    /// proof and, if it holds, sends ours: the connection is ready.
    fn read_acceptor_hello(&mut self, id: NodeId) {
        let Some(key) = self.cfg.secret.clone() else {
            return;
        };
        let me = self.cfg.id;
        let due = raft_auth::ACCEPTOR_HELLO_BYTES;
        let frame = loop {
            let Some(p) = self.peers.get_mut(&id) else {
                return;
            };
            let Some(s) = p.stream.as_mut() else {
                return;
            };
            let mut b = [0u8; raft_auth::framed(raft_auth::ACCEPTOR_HELLO_BYTES)];
            let need = b.len() - p.hello.len();
            match s.read(&mut b[..need]) {
                Ok(0) => {
                    self.stats.refused_hello += 1;
                    self.peer_log(
                        id,
                        "closed the connection before proving itself: it refused our hello \
                         (does it run with a cluster token, and the same -raft-peers?)",
                    );
                    return self.drop_peer_conn(id);
                }
                Ok(n) => p.hello.extend_from_slice(&b[..n]),
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.peer_log(id, &format!("handshake failed: {e}"));
                    return self.drop_peer_conn(id);
                }
            }
            match raft_auth::read_frame(&p.hello, due) {
                Ok(None) => {}
                Ok(Some(f)) => break f,
                Err(e) => {
                    self.stats.refused_hello += 1;
                    self.peer_log(id, &format!("answered our hello with {e}"));
                    return self.drop_peer_conn(id);
                }
            }
        };
        let Frame::AcceptorHello {
            acceptor,
            dialer,
            nonce,
            proof,
        } = frame
        else {
            self.stats.refused_hello += 1;
            self.peer_log(id, "answered our hello out of turn");
            return self.drop_peer_conn(id);
        };
        if acceptor != id || dialer != me {
            self.stats.refused_hello += 1;
            let what = format!("answers as node {acceptor} to node {dialer}: other -raft-peers?");
            self.peer_log(id, &what);
            return self.drop_peer_conn(id);
        }
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let tr = Transcript {
            dialer: me,
            acceptor: id,
            dialer_nonce: p.nonce,
            acceptor_nonce: nonce,
        };
        if !raft_auth::check(&key, Role::Acceptor, &tr, &proof) {
            self.stats.refused_proof += 1;
            self.peer_log(
                id,
                "its proof does not verify: cluster tokens differ? (nothing is sent to it)",
            );
            return self.drop_peer_conn(id);
        }
        let mut out = Vec::with_capacity(raft_auth::framed(raft_auth::DIALER_PROOF_BYTES));
        raft_auth::encode_dialer_proof(&mut out, &raft_auth::proof(&key, Role::Dialer, &tr));
        if !p.stream.as_mut().is_some_and(|s| write_now(s, &out)) {
            return self.drop_peer_conn(id);
        }
        p.proven = true;
        p.hello.clear();
        p.backoff = self.cfg.backoff_min;
        self.stats.connects += 1;
        self.stats.handshakes += 1;
    }

    /// Closes the connection to `id` and schedules a new dial.
    fn drop_peer_conn(&mut self, id: NodeId) {
        let max = self.cfg.backoff_max;
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if let Some(mut s) = p.stream.take() {
            let _ = self.poll.registry().deregister(&mut s);
        }
        p.connected = false;
        p.proven = false;
        p.hello.clear();
        // A frame cut in the middle is resent whole on the new connection.
        p.head_written = 0;
        schedule_dial(p, Instant::now(), max);
    }

    /// Writes what is queued for every peer now, as far as the sockets
    /// take it, instead of at the next [`Transport::poll`]: for messages
    /// that should be on their way before the caller blocks (a leader's
    /// Appends before its own log's fsync).
    pub fn flush_all(&mut self) {
        let ids: Vec<NodeId> = self.peers.keys().copied().collect();
        for id in ids {
            self.flush(id);
        }
    }

    /// Writes queued frames to `id`, and the pieces of snapshot files
    /// going to it as the queue empties, until done, `WouldBlock`, or
    /// [`PIECES_PER_FLUSH`] bytes of pieces.
    fn flush(&mut self, id: NodeId) {
        let mut budget = PIECES_PER_FLUSH;
        loop {
            let queued = self.queue_pieces(id, budget);
            self.write_queue(id);
            budget = budget.saturating_sub(queued);
            let drained = self.peers.get(&id).is_some_and(|p| p.queue.is_empty());
            if queued == 0 || budget == 0 || !drained {
                return;
            }
        }
    }

    /// Writes queued frames to `id` until done or `WouldBlock`, several
    /// frames per write.
    fn write_queue(&mut self, id: NodeId) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if !p.proven {
            return;
        }
        let Some(s) = p.stream.as_mut() else {
            return;
        };
        let mut failed = false;
        while !p.queue.is_empty() {
            // Up to WRITE_BYTES of frames in one writev, read where they
            // are: a frame the socket takes in parts is never copied again
            // (gathering it into one buffer copied its rest at every try,
            // so a large Append cost its size squared over the socket's
            // share of it).
            let mut slices = Vec::with_capacity(WRITE_SLICES.min(p.queue.len()));
            let mut bytes = 0;
            for (i, f) in p.queue.iter().enumerate() {
                let from = if i == 0 { p.head_written } else { 0 };
                let len = f.len() - from;
                if !slices.is_empty() && (bytes + len > WRITE_BYTES || slices.len() == WRITE_SLICES)
                {
                    break;
                }
                slices.push(io::IoSlice::new(&f[from..]));
                bytes += len;
            }
            let wrote = s.write_vectored(&slices);
            drop(slices);
            match wrote {
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
            self.drop_peer_conn(id);
        }
    }
}

/// The next dial after a failure: now + backoff, and the backoff doubles.
fn schedule_dial(p: &mut Peer, now: Instant, max: Duration) {
    p.next_dial = now + p.backoff;
    p.backoff = (p.backoff * 2).min(max);
}

/// Takes every whole frame off the front of `buf` into `inbox`, for the
/// member `sender` the connection is bound to (the first message's sender
/// binds it when it is `None`). False if
/// the stream is bad (a length beyond the bound, a crc mismatch, a body
/// that is not a message): the connection must close.
fn decode_frames(
    cfg: &TransportConfig,
    stats: &mut TransportStats,
    buf: &mut Vec<u8>,
    inbox: &mut Vec<Message>,
    sender: &mut Option<NodeId>,
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
                    Ok(m) if m.to == cfg.id && (cfg.open || cfg.peers.contains_key(&m.from)) => {
                        match *sender {
                            // A connection speaks for one member only.
                            Some(s) if s != m.from => stats.rejected_sender += 1,
                            _ => {
                                *sender = Some(m.from);
                                stats.received += 1;
                                inbox.push(m);
                            }
                        }
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
