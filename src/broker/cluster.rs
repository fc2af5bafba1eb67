//! Cluster mode inside the broker: control-state changes made on this node
//! ([`Broker::submit`]) are applied at once on a single node, and in a
//! cluster proposed to the Raft leader (locally, or over the leader's peer
//! link as `cluster.command`) and answered when Raft hands them back
//! committed; publishes whose subscribers live on other nodes are batched
//! per node and sent as `cluster.forward`; stream requests for a stream
//! another node owns are relayed to it; and the leader removes the
//! subscriptions of a node that stays unreachable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::session::NSP_ROOT;
use super::Broker;
use crate::cluster::forward::{self, PeerMessage};
use crate::cluster::fsm::{Change, Cmd, MetaCommand};
use crate::cluster::link::{CallError, LinkEvent, LinkOut, Links};
use crate::cluster::node::{FromRaft, NodeConfig, RaftNode, ToRaft, View};
use crate::cluster::raft::Role;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};
use crate::protocol::socketio::{self, PacketType};
use crate::protocol::subject;
use crate::routing::groups::GroupMode;
use crate::routing::sublist::Sublist;
use crate::routing::subs::{Command, SubKey};

/// How long a client's change may wait for a leader before it is refused
/// with `unavailable` (the contract allows 5 s).
pub const PROPOSE_WAIT: Duration = Duration::from_secs(4);
/// How long the broker's own changes (a closed socket's removal, a node's
/// removal) keep being retried.
const INTERNAL_WAIT: Duration = Duration::from_secs(120);
/// Pause between attempts to hand a change to a leader.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// A node whose peer link and Raft connection both stay down this long is
/// declared gone by the leader, which removes its subscriptions.
pub const NODE_GONE_AFTER: Duration = Duration::from_secs(3);
/// How often the loop reads the Raft thread's view of the cluster.
const VIEW_EVERY: Duration = Duration::from_millis(10);
/// Most changes waiting for a leader at once; more are refused.
const WAITERS_MAX: usize = 100_000;
/// Most requests relayed to other nodes and awaiting their answer.
const RELAYS_MAX: usize = 100_000;
/// Tags of proposals made for a peer's `cluster.command`, and of relayed
/// calls, are told apart from this node's own operation numbers by these.
const TAG_REMOTE: u64 = 1 << 62;
const TAG_RELAY: u64 = 1 << 61;

/// How this node takes part in a cluster (from the flags).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Every member's node id, sorted; a member's Raft id is its position + 1.
    pub names: Vec<String>,
    pub raft: NodeConfig,
    /// The other nodes' HTTP addresses (`-cluster`).
    pub peers_http: Vec<SocketAddr>,
}

/// Who gets the answer to a change once it is applied.
#[derive(Debug, Clone)]
pub(crate) struct ChangeAck {
    pub conn: ConnId,
    pub nsp: &'static str,
    pub ack_id: u64,
    /// The ack body on success.
    pub ok_body: String,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Stage {
    /// Not (or no longer) with a leader; retry at `next_try`.
    Waiting,
    /// Handed to a leader; waiting for it to come back committed.
    Sent,
}

struct Waiter {
    data: Vec<u8>,
    reply: Option<ChangeAck>,
    deadline: Instant,
    stage: Stage,
    next_try: Instant,
}

/// A client request relayed to another node, answered with its answer.
struct Relay {
    conn: ConnId,
    ack_id: Option<u64>,
}

/// A `stream.list` gathered from every node.
struct Gather {
    conn: ConnId,
    ack_id: u64,
    left: usize,
    streams: Vec<Value>,
}

pub(crate) struct Cluster {
    pub me: u64,
    pub names: Vec<String>,
    settings: ClusterSettings,
    raft: Option<RaftNode>,
    links: Option<Links>,
    pub view: Option<View>,
    next_view: Instant,
    role: Role,
    term: u64,
    leader: Option<u64>,
    /// Per link: the node it reaches, while it is up.
    link_node: Vec<Option<u64>>,
    /// By operation number: handed to leaders in this order.
    waiters: BTreeMap<u64, Waiter>,
    /// This node's operation numbers: boot id, then a counter.
    next_op: u64,
    /// Proposals made for peers: tag -> the peer's control socket and ack.
    remote: HashMap<u64, (ConnId, u64)>,
    relays: HashMap<u64, Relay>,
    gathers: HashMap<u64, Gather>,
    /// Relay tag -> gather it belongs to.
    gather_of: HashMap<u64, u64>,
    next_tag: u64,
    /// Forward batches being filled this turn, per node.
    batches: BTreeMap<u64, Vec<u8>>,
    /// Batches of this turn already full, in the order they filled.
    full_batches: Vec<(u64, Vec<u8>)>,
    down_since: HashMap<u64, Instant>,
    /// Nodes whose removal this leader proposed and that are still down.
    removing: HashSet<u64>,
    /// Sanitized node id (as in request inboxes) -> node.
    inbox_nodes: HashMap<String, u64>,
    /// Subjects of streams other nodes own -> the owner.
    remote_capture: Sublist<u64>,
    capture_dirty: bool,
    pub forwarded: u64,
    pub forwards_dropped: u64,
    boot: u64,
    /// This node's `NodeUp` was proposed, and (`caught_up`) applied.
    up_proposed: bool,
    caught_up: bool,
}

impl Cluster {
    /// The Raft thread, once started.
    pub(crate) fn raft_node(&self) -> Option<&RaftNode> {
        self.raft.as_ref()
    }

    pub fn new(settings: ClusterSettings, boot: u64) -> Cluster {
        let me = settings.raft.id;
        let inbox_nodes = settings
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| (super::dispatch::sanitize(n), i as u64 + 1))
            .collect();
        Cluster {
            me,
            names: settings.names.clone(),
            link_node: vec![None; settings.peers_http.len()],
            settings,
            raft: None,
            links: None,
            view: None,
            next_view: Instant::now(),
            role: Role::Follower,
            term: 0,
            leader: None,
            waiters: BTreeMap::new(),
            // Operation numbers carry the boot id, so an entry from this
            // node's earlier life, replayed from the log, answers nobody.
            next_op: boot << 32,
            remote: HashMap::new(),
            relays: HashMap::new(),
            gathers: HashMap::new(),
            gather_of: HashMap::new(),
            next_tag: 0,
            batches: BTreeMap::new(),
            full_batches: Vec::new(),
            down_since: HashMap::new(),
            removing: HashSet::new(),
            inbox_nodes,
            remote_capture: Sublist::default(),
            capture_dirty: true,
            forwarded: 0,
            forwards_dropped: 0,
            boot,
            up_proposed: false,
            caught_up: false,
        }
    }

    /// Starts the Raft thread and the peer links; both wake `waker`. The
    /// links log in to the peers' `/control` with the cluster token.
    pub fn start(
        &mut self,
        waker: Arc<mio::Waker>,
        cluster_token: Option<String>,
        auth_token: Option<String>,
    ) -> Result<(), String> {
        if self.settings.raft.secret.is_none() {
            crate::log_warn!(
                "cluster: neither -cluster-token nor -control-token is set: any host that \
                 reaches the Raft port {} can take part in the cluster",
                self.settings.raft.listen
            );
        }
        self.raft = Some(RaftNode::start(
            self.settings.raft.clone(),
            Arc::clone(&waker),
        )?);
        self.links = Some(Links::start(
            &self.settings.peers_http,
            cluster_token,
            auth_token,
            waker,
        ));
        Ok(())
    }

    pub fn name_of(&self, node: u64) -> Option<&str> {
        self.names
            .get((node as usize).checked_sub(1)?)
            .map(String::as_str)
    }

    pub fn leader(&self) -> Option<u64> {
        self.leader
    }

    /// Since start, this node has applied what was committed before it
    /// started (and announced itself).
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// The Raft thread's view as it is now (the loop's copy in `view` may
    /// be up to `VIEW_EVERY` old).
    pub fn fresh_view(&self) -> Option<View> {
        self.raft
            .as_ref()
            .map(RaftNode::view)
            .or_else(|| self.view.clone())
    }

    /// The link that reaches `node`, if it is up.
    fn link_to(&self, node: u64) -> Option<usize> {
        self.link_node.iter().position(|n| *n == Some(node))
    }

    /// Whether deliveries to `node` can go out now.
    /// Its peer link is up and, as far as this node can tell (a leader
    /// hears every follower), it answers.
    pub fn reachable(&self, node: u64) -> bool {
        if node == self.me {
            return true;
        }
        let heard = self
            .view
            .as_ref()
            .and_then(|v| v.peers.iter().find(|p| p.id == node))
            .is_none_or(|p| p.heard);
        heard && self.link_to(node).is_some()
    }

    fn tag(&mut self, kind: u64) -> u64 {
        self.next_tag += 1;
        kind | self.next_tag
    }

    /// Forgets what waits for `conn`'s socket in `/` (it ended): replies
    /// to its changes, and relayed stream events and gathers.
    pub fn forget_root(&mut self, conn: ConnId) {
        for w in self.waiters.values_mut() {
            if w.reply
                .as_ref()
                .is_some_and(|r| r.conn == conn && r.nsp == super::session::NSP_ROOT)
            {
                w.reply = None;
            }
        }
        self.relays.retain(|_, r| r.conn != conn);
        self.gathers.retain(|_, g| g.conn != conn);
    }

    /// Socket `conn` closed: nothing waiting is answered on it any more
    /// (its slot may be reused by another socket).
    pub fn forget_conn(&mut self, conn: ConnId) {
        for w in self.waiters.values_mut() {
            if w.reply.as_ref().is_some_and(|r| r.conn == conn) {
                w.reply = None;
            }
        }
        self.remote.retain(|_, (c, _)| *c != conn);
        self.relays.retain(|_, r| r.conn != conn);
        self.gathers.retain(|_, g| g.conn != conn);
    }

    /// Appends a message to the batch for `node`; a batch that reached
    /// the link's event size is closed and a new one begun.
    pub fn queue_forward(&mut self, node: u64, m: &PeerMessage<'_>) {
        let open = self.batches.entry(node).or_default();
        if open.len() >= crate::cluster::link::EMIT_BYTES_MAX {
            let full = std::mem::take(open);
            self.full_batches.push((node, full));
        }
        forward::push(self.batches.entry(node).or_default(), m);
    }

    /// The forward batches of this turn, per node in the order they
    /// filled: what the turn sends toward each peer.
    pub fn take_batches(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut batches = std::mem::take(&mut self.full_batches);
        batches.extend(std::mem::take(&mut self.batches));
        batches
    }

    /// Which node owns the stream capturing `subject`, if another does.
    pub fn remote_capture(&mut self, fsm: &crate::cluster::fsm::Fsm, subject: &str) -> Option<u64> {
        if self.capture_dirty {
            self.capture_dirty = false;
            self.remote_capture = Sublist::default();
            for s in fsm.streams.values().filter(|s| s.owner != self.me) {
                let subjects = s.config.get("subjects").and_then(Value::as_array);
                for p in subjects.into_iter().flatten().filter_map(Value::as_str) {
                    if subject::validate_pattern(p).is_ok() {
                        self.remote_capture.insert(p, None, s.owner);
                    }
                }
            }
        }
        if self.remote_capture.is_empty() {
            return None;
        }
        let m = self.remote_capture.matches(subject);
        m.plain.first().copied()
    }

    /// The node whose request inbox `subject` is, if another node's.
    pub fn inbox_node(&self, subject: &str) -> Option<u64> {
        let rest = subject.strip_prefix("_INBOX.")?;
        let name = rest.split('.').next()?;
        self.inbox_nodes
            .get(name)
            .copied()
            .filter(|&n| n != self.me)
    }
}

/// The answer to a Socket.IO event, written as an ACK.
pub(crate) fn send_ack(sink: &mut dyn Sink, conn: ConnId, nsp: &str, ack_id: u64, body: &str) {
    let head = socketio::encode(PacketType::Ack, 0, nsp, Some(ack_id), "");
    sink.send_text(conn, &[&head, body.as_bytes()]);
}

/// Relays an answer (its first argument's JSON text and attachments) as
/// an ACK.
fn relay_ack(sink: &mut dyn Sink, conn: ConnId, ack_id: u64, value: &str, attachments: &[Vec<u8>]) {
    let kind = if attachments.is_empty() {
        PacketType::Ack
    } else {
        PacketType::BinaryAck
    };
    let mut head = Vec::with_capacity(24);
    socketio::write_header(&mut head, kind, attachments.len(), NSP_ROOT, Some(ack_id));
    let body = format!("[{value}]");
    if sink.send_text(conn, &[&head, body.as_bytes()]) {
        for a in attachments {
            sink.send_binary(conn, a);
        }
    }
}

fn call_error_value(e: &CallError) -> String {
    json!({"ok": false, "error": {"code": e.code, "message": e.message}}).to_string()
}

impl Broker {
    /// Applies a control-state change: at once on a single node (the
    /// answer is returned), or through Raft in a cluster (`Ok(None)`: the
    /// reply, if any, is sent when the change comes back applied).
    pub(crate) fn submit(
        &mut self,
        sink: &mut dyn Sink,
        cmd: Cmd,
        reply: Option<ChangeAck>,
    ) -> Result<Option<String>, ApiError> {
        let Some(c) = self.cluster.as_mut() else {
            self.fsm.apply(&cmd)?;
            self.after_apply(sink, &cmd);
            return Ok(reply.map(|r| r.ok_body));
        };
        if reply.is_some() && c.waiters.len() >= WAITERS_MAX {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many changes waiting for the cluster",
            ));
        }
        c.next_op += 1;
        let op = c.next_op;
        let entry = Change {
            node: c.me,
            op,
            cmd,
        };
        let wait = if reply.is_some() {
            PROPOSE_WAIT
        } else {
            INTERNAL_WAIT
        };
        let now = sink.now();
        c.waiters.insert(
            op,
            Waiter {
                data: entry.encode(),
                reply,
                deadline: now + wait,
                stage: Stage::Waiting,
                next_try: now,
            },
        );
        self.retry_waiters(now);
        Ok(None)
    }

    /// A change made by the broker itself (no client waits for it).
    pub(crate) fn submit_internal(&mut self, sink: &mut dyn Sink, cmd: Cmd) {
        match self.submit(sink, cmd, None) {
            // What it would end is gone already (a socket's own unsub or
            // close came first): nothing is wrong, and a client must not
            // be able to fill the log with it.
            Err(e) if e.code == Code::NotFound => {
                crate::log_debug!("control change not needed: {}", e.message)
            }
            Err(e) => crate::log_warn!("control change refused: {}", e.message),
            Ok(_) => {}
        }
    }

    /// Hands waiter `op` to the leader, if one is known and reachable.
    fn try_propose(&mut self, op: u64, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let link = c.leader.and_then(|l| c.link_to(l));
        let Some(w) = c.waiters.get_mut(&op) else {
            return;
        };
        if w.stage != Stage::Waiting || w.next_try > now {
            return;
        }
        w.next_try = now + RETRY_EVERY;
        if c.role == Role::Leader {
            if let Some(r) = &c.raft {
                w.stage = Stage::Sent;
                r.send(ToRaft::Propose {
                    tag: op,
                    data: w.data.clone(),
                });
            }
            return;
        }
        let Some(link) = link else {
            return;
        };
        let Ok(entry) = serde_json::from_slice::<Value>(&w.data) else {
            return;
        };
        let timeout = w.deadline.saturating_duration_since(now);
        w.stage = Stage::Sent;
        let queued = c.links.as_ref().is_some_and(|l| {
            l.call(
                link,
                LinkOut::Call {
                    tag: op,
                    event: "cluster.command".into(),
                    args: json!({ "entry": entry }).to_string(),
                    attachments: Vec::new(),
                    timeout,
                    root: false,
                },
            )
        });
        if !queued {
            w.stage = Stage::Waiting;
        }
    }

    /// Whatever follows an applied change on this node.
    fn after_apply(&mut self, sink: &mut dyn Sink, cmd: &Cmd) {
        match cmd {
            Cmd::Subs(Command::RemoveNode { node, boot })
                if *node == self.fsm.subs.me()
                    && boot.is_none_or(|b| Some(b) == self.cluster.as_ref().map(|c| c.boot)) =>
            {
                // The cluster gave this node up while it was cut off: its
                // clients reconnect and subscribe again.
                crate::log_warn!(
                    "the cluster removed this node's subscriptions; closing its client sockets"
                );
                for (conn, s) in self.sessions.iter().enumerate() {
                    if s.as_ref().is_some_and(|s| s.root) {
                        sink.close(conn);
                    }
                }
            }
            Cmd::Subs(Command::NodeUp { node, boot }) if *node == self.fsm.subs.me() => {
                let mine = self.cluster.as_mut().filter(|c| c.boot == *boot);
                if let Some(c) = mine.filter(|c| !c.caught_up) {
                    // Everything committed before this node started has
                    // been applied: it knows the cluster now, and records
                    // the streams it holds.
                    c.caught_up = true;
                    crate::log_info!("caught up with the cluster");
                    self.announce_streams(sink);
                }
            }
            Cmd::Meta(m) => {
                if let Some(c) = self.cluster.as_mut() {
                    c.capture_dirty = true;
                }
                if matches!(m, MetaCommand::StreamPlace { .. }) {
                    self.hold_stream_groups();
                }
            }
            _ => {}
        }
    }

    /// Drains what the Raft thread and the links reported.
    pub(crate) fn cluster_woken(&mut self, sink: &mut dyn Sink) {
        while let Some(msg) = self
            .cluster
            .as_ref()
            .and_then(|c| c.raft.as_ref())
            .and_then(RaftNode::try_recv)
        {
            self.on_raft(sink, msg);
        }
        while let Some(ev) = self
            .cluster
            .as_ref()
            .and_then(|c| c.links.as_ref())
            .and_then(Links::try_recv)
        {
            self.on_link(sink, ev);
        }
    }

    fn on_raft(&mut self, sink: &mut dyn Sink, msg: FromRaft) {
        match msg {
            FromRaft::Restore { index, data } => {
                if let Err(e) = self.fsm.restore(&data) {
                    crate::log_error!("cannot load the cluster snapshot at {index}: {e}");
                }
                self.fsm.applied = index;
                if let Some(c) = self.cluster.as_mut() {
                    c.capture_dirty = true;
                }
                self.hold_stream_groups();
            }
            FromRaft::Apply { index, data } => {
                if data.is_empty() {
                    self.fsm.applied = index;
                    return;
                }
                let entry = match Change::decode(&data) {
                    Ok(e) => e,
                    Err(e) => {
                        crate::log_error!("skipping committed entry {index}: {e}");
                        self.fsm.applied = index;
                        return;
                    }
                };
                let result = self.fsm.apply_entry(&entry);
                self.fsm.applied = index;
                if result.as_ref().is_err_and(|e| e.stale) {
                    self.stale_entry(sink, entry);
                    return;
                }
                let result = result.map_err(|e| e.error);
                self.after_apply(sink, &entry.cmd);
                let me = self.fsm.subs.me();
                if entry.node != me {
                    return;
                }
                let Some(w) = self
                    .cluster
                    .as_mut()
                    .and_then(|c| c.waiters.remove(&entry.op))
                else {
                    return;
                };
                match (w.reply, result) {
                    (Some(r), Ok(())) => send_ack(sink, r.conn, r.nsp, r.ack_id, &r.ok_body),
                    (Some(r), Err(e)) => self.refuse(sink, &r, &e),
                    (None, _) => {}
                }
            }
            FromRaft::Proposed { tag, result } => {
                let Some(c) = self.cluster.as_mut() else {
                    return;
                };
                if tag & TAG_REMOTE != 0 {
                    if let Some((conn, ack_id)) = c.remote.remove(&tag) {
                        let body = match result {
                            Ok(index) => format!("[{{\"ok\":true,\"index\":{index}}}]"),
                            Err(e) => ApiError::new(Code::Unavailable, e.to_string()).ack_body(),
                        };
                        send_ack(sink, conn, "/control", ack_id, &body);
                    }
                } else if result.is_err() {
                    if let Some(w) = c.waiters.get_mut(&tag) {
                        w.stage = Stage::Waiting;
                    }
                }
            }
            FromRaft::Status(s) => {
                let name = |n: Option<u64>| {
                    self.cluster
                        .as_ref()
                        .and_then(|c| n.and_then(|n| c.name_of(n)))
                        .unwrap_or("none")
                        .to_string()
                };
                crate::log_info!(
                    "raft: {:?} in term {}, leader {}",
                    s.role,
                    s.term,
                    name(s.leader)
                );
                if let Some(c) = self.cluster.as_mut() {
                    c.role = s.role;
                    c.term = s.term;
                    c.leader = s.leader;
                    // Whatever was with the old leader may be lost: offer
                    // it again (applying twice is harmless, see below).
                    for w in c.waiters.values_mut() {
                        w.stage = Stage::Waiting;
                        w.next_try = sink.now();
                    }
                }
                self.retry_waiters(sink.now());
            }
            FromRaft::WantSnapshot => {
                let data = self.fsm.snapshot();
                let index = self.fsm.applied;
                if let Some(r) = self.cluster.as_ref().and_then(|c| c.raft.as_ref()) {
                    r.send(ToRaft::Compact { index, data });
                }
            }
        }
    }

    fn on_link(&mut self, sink: &mut dyn Sink, ev: LinkEvent) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        match ev {
            LinkEvent::Up { link, node_id } => {
                let node = c
                    .names
                    .iter()
                    .position(|n| *n == node_id)
                    .map(|i| i as u64 + 1);
                if node.is_none() {
                    crate::log_warn!("peer link {link} reached {node_id:?}, which is not a member");
                }
                if let Some(slot) = c.link_node.get_mut(link) {
                    *slot = node;
                }
                if let Some(n) = node {
                    c.down_since.remove(&n);
                    c.removing.remove(&n);
                }
                self.retry_waiters(sink.now());
            }
            LinkEvent::Down { link } => {
                if let Some(slot) = c.link_node.get_mut(link) {
                    *slot = None;
                }
            }
            LinkEvent::Answer { tag, result } => {
                if tag & TAG_RELAY != 0 {
                    self.relay_answered(sink, tag, result);
                    return;
                }
                let ok = result.as_ref().is_ok_and(|(text, _)| {
                    serde_json::from_str::<Value>(text)
                        .is_ok_and(|v| v.get("ok") == Some(&Value::Bool(true)))
                });
                if let Some(w) = c.waiters.get_mut(&tag) {
                    if !ok {
                        w.stage = Stage::Waiting;
                    }
                }
            }
        }
    }

    /// Offers waiting changes to the leader in operation order, stopping
    /// at the first that cannot go yet, so that no change overtakes an
    /// earlier one of this node.
    fn retry_waiters(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        let waiting: Vec<u64> = c
            .waiters
            .iter()
            .filter(|(_, w)| w.stage == Stage::Waiting)
            .map(|(op, _)| *op)
            .collect();
        for op in waiting {
            self.try_propose(op, now);
            let still = self
                .cluster
                .as_ref()
                .and_then(|c| c.waiters.get(&op))
                .is_some_and(|w| w.stage == Stage::Waiting);
            if still {
                break;
            }
        }
    }

    /// An entry of this node came back after a later one of the same life
    /// was applied (it was lost with a leader and offered again): it is
    /// not applied, so that it cannot undo what came after it. Its client
    /// is told to try again; the broker's own changes are made anew.
    fn stale_entry(&mut self, sink: &mut dyn Sink, entry: Change) {
        if entry.node != self.fsm.subs.me() {
            return;
        }
        let Some(w) = self
            .cluster
            .as_mut()
            .and_then(|c| c.waiters.remove(&entry.op))
        else {
            return; // a repeat of an entry already applied
        };
        match w.reply {
            Some(r) => {
                let e = ApiError::new(
                    Code::Unavailable,
                    "the change was lost with a leader; try again",
                );
                self.refuse(sink, &r, &e);
            }
            None => self.submit_internal(sink, entry.cmd),
        }
    }

    /// Answers the client of a change with an error.
    fn refuse(&mut self, sink: &mut dyn Sink, r: &ChangeAck, e: &ApiError) {
        self.metrics.count_error(e.code);
        send_ack(sink, r.conn, r.nsp, r.ack_id, &e.ack_body());
    }

    /// Once per loop turn: send the forward batches, retry or expire
    /// waiting changes, announce this node, and (on the leader) give up
    /// on nodes that stay unreachable.
    pub(crate) fn cluster_tick(&mut self, sink: &mut dyn Sink) {
        let ended = std::mem::take(&mut self.fsm.subs.ended);
        for cmd in ended {
            self.submit_internal(sink, Cmd::Subs(cmd));
        }
        let now = sink.now();
        let me = self.fsm.subs.me();
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        for (node, batch) in c.take_batches() {
            let sent = c
                .link_to(node)
                .is_some_and(|l| c.links.as_ref().is_some_and(|ls| ls.forward(l, batch)));
            if !sent {
                c.forwards_dropped += 1;
            }
        }
        // Once a leader is known: say this node is up (dropping its
        // earlier life's subscriptions). When that comes back applied,
        // everything committed before it has been applied here too.
        if c.leader.is_some() && !c.up_proposed {
            c.up_proposed = true;
            let boot = c.boot;
            self.submit_internal(sink, Cmd::Subs(Command::NodeUp { node: me, boot }));
        }
        self.retry_waiters(now);
        self.expire_waiters(sink, now);
        if let Some(c) = self.cluster.as_mut() {
            // The Raft thread's view, every VIEW_EVERY rather than every
            // turn of a busy loop.
            if c.next_view <= now {
                c.next_view = now + VIEW_EVERY;
                c.view = c.raft.as_ref().map(RaftNode::view);
                self.watch_nodes(sink, now);
            }
        }
    }

    fn expire_waiters(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let expired: Vec<u64> = c
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(op, _)| *op)
            .collect();
        let gone: Vec<Waiter> = expired
            .iter()
            .filter_map(|op| c.waiters.remove(op))
            .collect();
        for w in gone {
            match w.reply {
                Some(r) => {
                    let e = ApiError::new(
                        Code::Unavailable,
                        "no cluster leader reachable; the change was not made",
                    );
                    self.refuse(sink, &r, &e);
                }
                None => crate::log_warn!("a control change could not reach a leader in time"),
            }
        }
    }

    /// The leader declares gone the nodes whose link and Raft connection
    /// stay down, removing their subscriptions.
    fn watch_nodes(&mut self, sink: &mut dyn Sink, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if c.role != Role::Leader {
            c.down_since.clear();
            return;
        }
        let view = c.view.clone();
        let mut gone = Vec::new();
        for node in 1..=c.names.len() as u64 {
            if node == c.me {
                continue;
            }
            // Down: silent to Raft for a second (a frozen or cut-off node
            // may keep its TCP connections), or with both its Raft
            // connection and its peer link closed (a dead one).
            let peer = view
                .as_ref()
                .and_then(|v| v.peers.iter().find(|p| p.id == node));
            let heard = peer.is_some_and(|p| p.heard);
            let connected = peer.is_some_and(|p| p.connected) || c.link_to(node).is_some();
            if heard && connected {
                c.down_since.remove(&node);
                continue;
            }
            let since = *c.down_since.entry(node).or_insert(now);
            if now.duration_since(since) >= NODE_GONE_AFTER && c.removing.insert(node) {
                gone.push(node);
            }
        }
        for node in gone {
            let has_subs = self.fsm.subs.iter().any(|s| s.owner.node == node);
            if has_subs {
                let name = self
                    .cluster
                    .as_ref()
                    .and_then(|c| c.name_of(node))
                    .unwrap_or("?")
                    .to_string();
                crate::log_warn!("node {name} is unreachable; removing its subscriptions");
                // Only the life the cluster knows of: a node that already
                // restarted keeps its new subscriptions.
                let boot = self.fsm.boots.get(&node).copied();
                self.submit_internal(sink, Cmd::Subs(Command::RemoveNode { node, boot }));
            }
        }
    }

    /// `cluster.command` from a follower: propose its entry (leader only).
    pub(crate) fn cluster_command(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&serde_json::value::RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let Some(c) = self.cluster.as_mut() else {
            return Err(ApiError::new(
                Code::BadRequest,
                "this node is not in a cluster",
            ));
        };
        let arg = arg.ok_or_else(|| ApiError::new(Code::BadRequest, "missing entry"))?;
        #[derive(serde::Deserialize)]
        struct Req {
            entry: Change,
        }
        let req: Req = serde_json::from_str(arg.get())
            .map_err(|e| ApiError::new(Code::BadRequest, format!("bad entry: {e}")))?;
        if c.role != Role::Leader {
            return Err(ApiError::new(Code::Unavailable, "not the leader"));
        }
        let Some(raft) = c.raft.as_ref() else {
            return Err(ApiError::new(Code::Unavailable, "raft is not running"));
        };
        let data = req.entry.encode();
        match ack_id {
            Some(ack_id) => {
                if c.remote.len() >= WAITERS_MAX {
                    return Err(ApiError::new(
                        Code::Unavailable,
                        "too many proposals waiting",
                    ));
                }
                c.next_tag += 1;
                let tag = TAG_REMOTE | c.next_tag;
                c.remote.insert(tag, (conn, ack_id));
                raft.send(ToRaft::Propose { tag, data });
                Ok(None)
            }
            None => {
                raft.send(ToRaft::Propose { tag: 0, data });
                Ok(Some(crate::protocol::errors::OK_BODY.to_string()))
            }
        }
    }

    /// `cluster.forward` from a peer: deliver its batch to this node's
    /// sockets.
    pub(crate) fn cluster_forward(
        &mut self,
        sink: &mut dyn Sink,
        attachments: &[Vec<u8>],
    ) -> Result<Option<String>, ApiError> {
        if self.cluster.is_none() {
            return Err(ApiError::new(
                Code::BadRequest,
                "this node is not in a cluster",
            ));
        }
        let batch = attachments
            .first()
            .ok_or_else(|| ApiError::new(Code::BadRequest, "cluster.forward needs its batch"))?;
        let msgs = forward::decode(batch).map_err(|e| ApiError::new(Code::BadRequest, e))?;
        for m in &msgs {
            self.deliver_forwarded(sink, m);
        }
        Ok(Some(crate::protocol::errors::OK_BODY.to_string()))
    }

    #[allow(clippy::too_many_arguments)]
    /// Relays a client's event to node `node` over the peer link's `/`
    /// socket; its answer is relayed back as this event's ack.
    pub(crate) fn relay(
        &mut self,
        node: u64,
        conn: ConnId,
        ack_id: Option<u64>,
        event: &str,
        arg: String,
        attachments: Vec<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let c = self
            .cluster
            .as_mut()
            .ok_or_else(|| ApiError::new(Code::Internal, "not in a cluster"))?;
        let unreachable = || {
            ApiError::new(
                Code::Unavailable,
                "the node that owns this stream is unreachable",
            )
        };
        let link = c.link_to(node).ok_or_else(unreachable)?;
        if c.relays.len() >= RELAYS_MAX {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many relayed requests waiting",
            ));
        }
        let tag = c.tag(TAG_RELAY);
        let queued = c.links.as_ref().is_some_and(|l| {
            l.call(
                link,
                LinkOut::Call {
                    tag,
                    event: event.to_string(),
                    args: arg,
                    attachments,
                    timeout,
                    root: true,
                },
            )
        });
        if !queued {
            return Err(unreachable());
        }
        c.relays.insert(tag, Relay { conn, ack_id });
        Ok(None)
    }

    /// `stream.list` in a cluster: this node's streams plus every other
    /// node's, asked for over the links.
    pub(crate) fn gather_stream_list(
        &mut self,
        conn: ConnId,
        ack_id: Option<u64>,
        local: Vec<Value>,
    ) -> Result<Option<String>, ApiError> {
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let Some(c) = self.cluster.as_mut() else {
            return Err(ApiError::new(Code::Internal, "not in a cluster"));
        };
        let links: Vec<usize> = (0..c.link_node.len())
            .filter(|&l| c.link_node[l].is_some())
            .collect();
        if c.gathers.len() >= RELAYS_MAX {
            return Err(ApiError::new(
                Code::Unavailable,
                "too many relayed requests waiting",
            ));
        }
        c.next_tag += 1;
        let gid = c.next_tag;
        let mut g = Gather {
            conn,
            ack_id,
            left: 0,
            streams: local,
        };
        for link in links {
            let tag = c.tag(TAG_RELAY);
            let queued = c.links.as_ref().is_some_and(|l| {
                l.call(
                    link,
                    LinkOut::Call {
                        tag,
                        event: "stream.list".into(),
                        args: r#"{"local":true}"#.to_string(),
                        attachments: Vec::new(),
                        timeout: PROPOSE_WAIT,
                        root: true,
                    },
                )
            });
            if queued {
                g.left += 1;
                c.gather_of.insert(tag, gid);
            }
        }
        if g.left == 0 {
            let body = json!([{"ok": true, "streams": g.streams}]).to_string();
            return Ok(Some(body));
        }
        c.gathers.insert(gid, g);
        Ok(None)
    }

    fn relay_answered(
        &mut self,
        sink: &mut dyn Sink,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    ) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if let Some(gid) = c.gather_of.remove(&tag) {
            let Some(g) = c.gathers.get_mut(&gid) else {
                return;
            };
            g.left -= 1;
            if let Ok((text, _)) = &result {
                let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
                if let Some(list) = v.get("streams").and_then(Value::as_array) {
                    g.streams.extend(list.iter().cloned());
                }
            }
            if g.left == 0 {
                if let Some(mut g) = c.gathers.remove(&gid) {
                    g.streams.sort_by(|a, b| {
                        let name = |v: &Value| v["config"]["name"].as_str().map(str::to_string);
                        name(a).cmp(&name(b))
                    });
                    let body = json!([{"ok": true, "streams": g.streams}]).to_string();
                    let body = self.filter_stream_list(g.conn, body);
                    send_ack(sink, g.conn, NSP_ROOT, g.ack_id, &body);
                }
            }
            return;
        }
        let Some(r) = c.relays.remove(&tag) else {
            return;
        };
        let Some(ack_id) = r.ack_id else {
            return;
        };
        match result {
            Ok((text, attachments)) => relay_ack(sink, r.conn, ack_id, &text, &attachments),
            Err(e) => {
                self.metrics.count_error(Code::Unavailable);
                relay_ack(sink, r.conn, ack_id, &call_error_value(&e), &[]);
            }
        }
    }

    /// Delivers a message a peer forwarded: to this node's plain and
    /// broadcast subscribers when `plain`, and to the group members the
    /// sender picked (or, if one is gone, another local member of its
    /// group).
    fn deliver_forwarded(&mut self, sink: &mut dyn Sink, m: &PeerMessage<'_>) {
        if self.requests.may_be_inbox(m.subject) {
            if let Some(pending) = self.requests.take(m.subject) {
                super::dispatch::answer_request(
                    sink,
                    &pending,
                    m.subject,
                    m.data,
                    m.headers,
                    &m.attachments,
                );
            }
        }
        let matches = self.fsm.subs.matches(m.subject);
        let mut targets: Vec<SubKey> = Vec::new();
        if m.plain {
            targets.extend(matches.plain.iter().copied());
            for g in &matches.groups {
                if self.fsm.subs.group_mode(&g.queue) == GroupMode::Broadcast {
                    targets.extend(g.members.iter().copied());
                }
            }
        }
        let me = self.fsm.subs.me();
        for (serial, sid) in &m.picks {
            let owner = self.fsm.subs.local_owner(*serial);
            let key = self.fsm.subs.find(owner, sid);
            if let Some(k) = key.filter(|&k| self.fsm.subs.deliverable(k).is_some()) {
                targets.push(k);
                continue;
            }
            // The picked member is closing: another member of its group
            // here. (One already removed cannot be told apart: the message
            // is lost to that group, as a core message may be.)
            let Some(queue) = key
                .and_then(|k| self.fsm.subs.get(k))
                .and_then(|s| s.queue.clone())
            else {
                continue;
            };
            let other = matches
                .groups
                .iter()
                .filter(|g| *g.queue == *queue)
                .flat_map(|g| g.members.iter().copied())
                .find(|&k| {
                    self.fsm
                        .subs
                        .deliverable(k)
                        .is_some_and(|s| s.owner.node == me)
                });
            if let Some(k) = other {
                targets.push(k);
            }
        }
        if targets.is_empty() {
            return;
        }
        let size = m.data.len() + m.headers.map_or(0, str::len);
        self.deliver_to(sink, &targets, m, size);
    }

    /// Queues the push deliveries a stream made for other nodes'
    /// subscribers.
    pub(crate) fn forward_pushes(&mut self) {
        if self.remote_push.out.is_empty() {
            return;
        }
        let out = std::mem::take(&mut self.remote_push.out);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        for p in &out {
            c.queue_forward(
                p.node,
                &PeerMessage {
                    subject: &p.subject,
                    reply: None,
                    data: &p.data,
                    headers: p.headers.as_deref(),
                    extra: Some(&p.extra),
                    attachments: p.attachments.clone(),
                    plain: false,
                    picks: vec![(p.pick.0, p.pick.1.as_str())],
                },
            );
            c.forwarded += 1;
        }
    }
}

/// Keeps `c` usable when an entry is applied twice (a change resent after
/// a leader change): subscribing with a sid already taken is refused and
/// removals are idempotent, so a repeat changes nothing.
/// Raft's and the links' part, played by in-process tests of the core:
/// what the core handed to Raft, and the events Raft and the links would
/// bring back.
#[cfg(test)]
impl Broker {
    /// The changes this node is waiting to see committed, oldest first.
    pub(crate) fn proposals(&self) -> Vec<Change> {
        self.cluster.as_ref().map_or(Vec::new(), |c| {
            c.waiters
                .values()
                .filter_map(|w| Change::decode(&w.data).ok())
                .collect()
        })
    }

    /// Raft committed `change` at `index`: the event the Raft thread
    /// reports through the waker.
    pub(crate) fn raft_applied(&mut self, sink: &mut dyn Sink, index: u64, change: &Change) {
        let data = change.encode();
        self.on_raft(sink, FromRaft::Apply { index, data });
    }

    /// The peer link `link` now reaches `node` (`None`: it is down).
    pub(crate) fn set_link(&mut self, link: usize, node: Option<u64>) {
        if let Some(c) = self.cluster.as_mut() {
            c.link_node[link] = node;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fsm::Fsm;
    use crate::routing::subs::Owner;

    #[test]
    fn applying_a_change_twice_changes_nothing() {
        let mut f = Fsm::new(1);
        let sub = Cmd::Subs(Command::Subscribe {
            owner: Owner { node: 2, conn: 1 },
            sid: "a".into(),
            pattern: "x".into(),
            queue: None,
            max: None,
        });
        f.apply(&sub).unwrap();
        assert!(f.apply(&sub).is_err());
        assert_eq!(f.subs.len(), 1);
        let rm = Cmd::Subs(Command::RemoveConn {
            owner: Owner { node: 2, conn: 1 },
        });
        f.apply(&rm).unwrap();
        f.apply(&rm).unwrap();
        assert!(f.subs.is_empty());
    }

    #[test]
    fn inboxes_route_to_their_node() {
        let settings = ClusterSettings {
            names: vec!["n1".into(), "n.2".into(), "n3".into()],
            raft: NodeConfig {
                id: 1,
                listen: "127.0.0.1:1".parse().unwrap(),
                members: BTreeMap::new(),
                data: std::path::PathBuf::from("/nonexistent"),
                memory_log: true,
                bootstrap: false,
                secret: None,
                names: BTreeMap::new(),
            },
            peers_http: vec![],
        };
        let c = Cluster::new(settings, 1);
        assert_eq!(c.inbox_node("_INBOX.n_2.ab12.7"), Some(2));
        assert_eq!(c.inbox_node("_INBOX.n1.ab12.7"), None, "own inbox");
        assert_eq!(c.inbox_node("_INBOX.zz.ab12.7"), None);
        assert_eq!(c.inbox_node("orders.new"), None);
    }
}
