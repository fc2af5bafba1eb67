//! Peer links: one persistent Socket.IO connection from this node to each
//! other node's `/control` namespace (the `-cluster` addresses, with the
//! control token), each run by a thread with the crate's own client. The
//! broker hands a link forward batches (sent as `cluster.forward`, no ack)
//! and calls (`cluster.command`, `cluster.stream`, with an ack relayed
//! back as [`LinkEvent::Answer`]). A link learns its peer's node id from
//! `server.info`, reports up and down, and reconnects with backoff. Its
//! queue is bounded in bytes: forwards past it are dropped (core messaging
//! is at most once) and calls are answered `unavailable`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;
use serde_json::{json, Value};

use super::forward::BATCH_MAGIC;
use crate::client::pending::PendingAck;
use crate::client::{self, Client, Error, Options};

/// Bytes a link may hold queued for its peer.
pub const LINK_QUEUE_BYTES: usize = 64 << 20;
/// Most forward bytes gathered into one `cluster.forward` event (its
/// attachment must stay under the peer's maxPayload, which is at least
/// `-max-payload` plus 64 KiB; nodes of a cluster share `-max-payload`).
pub const EMIT_BYTES_MAX: usize = 256 << 10;
/// Backoff between connection attempts: short, so that forwards to a
/// restarted node resume soon after it is back.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_millis(250);

/// What the broker asks a link to send.
pub enum LinkOut {
    /// A batch in the [`super::forward`] format.
    Forward(Vec<u8>),
    Call {
        tag: u64,
        event: String,
        /// The event's argument as JSON text.
        args: String,
        attachments: Vec<Vec<u8>>,
        timeout: Duration,
        /// Sent on the link's `/` socket (a relayed client request)
        /// rather than on `/control`.
        root: bool,
        /// Stamped with the connection it goes out on ([`LinkOut::fenced`]).
        fenced: bool,
    },
}

impl LinkOut {
    /// A call of `event` on the peer's `/control` socket, without
    /// attachments.
    pub fn control(tag: u64, event: &str, args: String, timeout: Duration) -> LinkOut {
        LinkOut::Call {
            tag,
            event: event.to_string(),
            args,
            attachments: Vec::new(),
            timeout,
            root: false,
            fenced: false,
        }
    }

    /// The same call with these attachments.
    pub fn with_attachments(mut self, with: Vec<Vec<u8>>) -> LinkOut {
        if let LinkOut::Call { attachments, .. } = &mut self {
            *attachments = with;
        }
        self
    }

    /// The same call on the peer's `/` socket (a relayed client request).
    pub fn on_root(mut self) -> LinkOut {
        if let LinkOut::Call { root, .. } = &mut self {
            *root = true;
        }
        self
    }

    /// The same call (whose argument is a JSON object) with `"link": n`
    /// added as it goes out, n being the number of the connection that
    /// carries it. Numbers grow with every connection this node makes to
    /// any peer, also across restarts (they start from the wall clock), so
    /// a peer that refuses a call numbered below one it has already taken
    /// from this node never executes a call left in a connection given up
    /// (its caller answered `unavailable`) after one sent later.
    pub fn fenced(mut self) -> LinkOut {
        if let LinkOut::Call { fenced, .. } = &mut self {
            *fenced = true;
        }
        self
    }
    /// What it counts against the link's queue (the same when queued and
    /// when taken off).
    fn bytes(&self) -> usize {
        match self {
            LinkOut::Forward(b) => b.len(),
            LinkOut::Call {
                args, attachments, ..
            } => 256 + args.len() + attachments.iter().map(Vec::len).sum::<usize>(),
        }
    }
}

/// A call's failure: an error code of the contract and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub code: &'static str,
    pub message: String,
}

/// What links report to the broker.
#[derive(Debug)]
pub enum LinkEvent {
    /// Link `link` is connected to node `node_id`.
    Up {
        link: usize,
        node_id: String,
    },
    Down {
        link: usize,
    },
    /// The ack of call `tag`: its first argument as JSON text and its
    /// attachments.
    Answer {
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), CallError>,
    },
}

struct Link {
    tx: Sender<LinkOut>,
    queued: Arc<AtomicUsize>,
}

/// Every link of this node.
pub struct Links {
    links: Vec<Link>,
    rx: Receiver<LinkEvent>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// What a link added later ([`Links::add`]) is started with.
    events: Sender<LinkEvent>,
    token: Option<String>,
    auth: Option<String>,
    /// `None` for detached links ([`Links::detached`]): no thread runs.
    notify: Option<Arc<Waker>>,
}

/// The far end of [`Links::detached`], held by whoever plays the links.
pub struct LinksEnd {
    /// What the broker queued on each link, in order, and the link's
    /// count of queued bytes.
    out: Vec<(Receiver<LinkOut>, Arc<AtomicUsize>)>,
    /// Events for the broker, as the link threads report them.
    pub events: Sender<LinkEvent>,
}

impl LinksEnd {
    /// The next thing the broker queued on link `link`, taken off its
    /// queue as a link thread takes it (its bytes no longer count
    /// against the link's bound).
    pub fn take(&self, link: usize) -> Option<LinkOut> {
        let (rx, queued) = self.out.get(link)?;
        let out = rx.try_recv().ok()?;
        queued.fetch_sub(out.bytes(), Ordering::Relaxed);
        Some(out)
    }
}

impl Links {
    /// `count` links with no thread behind them: what the broker queues
    /// on link i is taken by [`LinksEnd::take`]`(i)`, and the
    /// events sent from there reach the broker (the waker is not called).
    /// It is how the broker's in-process tests play the peer links. A link
    /// added later leads nowhere: what is queued on it is dropped.
    pub fn detached(count: usize) -> (Links, LinksEnd) {
        let mut links = Links::none(None, None, None);
        let events = links.events.clone();
        let mut out = Vec::new();
        for _ in 0..count {
            let (tx, out_rx) = mpsc::channel();
            let queued = Arc::new(AtomicUsize::new(0));
            links.links.push(Link {
                tx,
                queued: Arc::clone(&queued),
            });
            out.push((out_rx, queued));
        }
        (links, LinksEnd { out, events })
    }

    /// Starts a link to each address; `notify` is woken when events wait.
    pub fn start(
        addrs: &[SocketAddr],
        token: Option<String>,
        auth: Option<String>,
        notify: Arc<Waker>,
    ) -> Links {
        let mut links = Links::none(token, auth, Some(notify));
        for addr in addrs {
            links.add(*addr);
        }
        links
    }

    /// No link yet; those added log in with `token` and `auth` and wake
    /// `notify` (none: detached, no thread is started).
    fn none(token: Option<String>, auth: Option<String>, notify: Option<Arc<Waker>>) -> Links {
        let (events, rx) = mpsc::channel();
        Links {
            links: Vec::new(),
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            events,
            token,
            auth,
            notify,
        }
    }

    /// Starts a link to `addr` (a node added to the cluster); returns its
    /// number.
    pub fn add(&mut self, addr: SocketAddr) -> usize {
        let i = self.links.len();
        let (tx, out_rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let Some(notify) = &self.notify else {
            self.links.push(Link { tx, queued });
            return i;
        };
        let mut w = Worker {
            link: i,
            url: format!("http://{addr}"),
            token: self.token.clone(),
            auth: self.auth.clone(),
            rx: out_rx,
            events: self.events.clone(),
            notify: Arc::clone(notify),
            queued: Arc::clone(&queued),
            stop: Arc::clone(&self.stop),
            pending: Vec::new(),
            epoch: 0,
        };
        match std::thread::Builder::new()
            .name(format!("link-{addr}"))
            .spawn(move || w.run())
        {
            Ok(t) => self.threads.push(t),
            Err(e) => crate::log_error!("cannot start the link to {addr}: {e}"),
        }
        self.links.push(Link { tx, queued });
        i
    }

    /// Queues a forward batch; false (and dropped) when the link is full.
    pub fn forward(&self, link: usize, batch: Vec<u8>) -> bool {
        let Some(l) = self.links.get(link) else {
            return false;
        };
        let n = batch.len();
        if l.queued.load(Ordering::Relaxed) + n > LINK_QUEUE_BYTES {
            return false;
        }
        l.queued.fetch_add(n, Ordering::Relaxed);
        l.tx.send(LinkOut::Forward(batch)).is_ok()
    }

    /// Queues a call; false when the link is full (nothing was queued).
    pub fn call(&self, link: usize, out: LinkOut) -> bool {
        let Some(l) = self.links.get(link) else {
            return false;
        };
        let n = out.bytes();
        if l.queued.load(Ordering::Relaxed) + n > LINK_QUEUE_BYTES {
            return false;
        }
        l.queued.fetch_add(n, Ordering::Relaxed);
        l.tx.send(out).is_ok()
    }

    pub fn try_recv(&self) -> Option<LinkEvent> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Closing the queues wakes the threads; they end their client.
        self.links.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Worker {
    link: usize,
    url: String,
    token: Option<String>,
    auth: Option<String>,
    rx: Receiver<LinkOut>,
    events: Sender<LinkEvent>,
    notify: Arc<Waker>,
    queued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    pending: Vec<(u64, Instant, PendingAck)>,
    /// The number of the connection being served (see [`LinkOut::fenced`]).
    epoch: u64,
}

/// The last connection number given out on this node.
static EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A connection number above every one given out before, here and (the
/// clock not set back) by an earlier run of this node: microseconds
/// since the epoch, or one more than the last.
fn next_epoch() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut last = EPOCH.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match EPOCH.compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// `args` (a JSON object) with `"link": epoch` added.
fn stamp(args: &str, epoch: u64) -> String {
    match args.trim_start().strip_prefix('{') {
        Some(rest) if rest.trim_start().starts_with('}') => format!("{{\"link\":{epoch}}}"),
        Some(rest) => format!("{{\"link\":{epoch},{rest}"),
        None => args.to_string(),
    }
}

fn unreachable_error(why: &str) -> CallError {
    CallError {
        code: "unavailable",
        message: format!("peer unreachable: {why}"),
    }
}

impl Worker {
    fn report(&self, ev: LinkEvent) {
        if self.events.send(ev).is_ok() {
            let _ = self.notify.wake();
        }
    }

    fn run(&mut self) {
        let mut backoff = RETRY_MIN;
        while !self.stop.load(Ordering::Acquire) {
            let opts = Options {
                token: self.token.clone(),
                namespace: "/control".into(),
                timeout: Duration::from_secs(2),
                async_acks_max: 1 << 16,
                raw_acks: true,
                subscription_capacity: 16,
                // A peer's URL is made from its socket address, never a
                // name: the broker looks no names up (and so leaves the
                // system's resolver out of its binary).
                ..Options::resolving_with(client::resolve_ip)
            };
            let root_opts = Options {
                token: self.auth.clone(),
                namespace: "/".into(),
                ..opts.clone()
            };
            let client = Client::connect_with(&self.url, opts).and_then(|c| {
                let info = c.call("server.info", json!({}))?;
                let id = info
                    .get("node_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let root = Client::connect_with(&self.url, root_opts)?;
                Ok((c, root, id))
            });
            match client {
                Ok((c, root, node_id)) => {
                    backoff = RETRY_MIN;
                    self.epoch = next_epoch();
                    crate::log_info!("link to {} ({node_id}) up", self.url);
                    self.report(LinkEvent::Up {
                        link: self.link,
                        node_id,
                    });
                    let why = self.serve(&c, &root);
                    let _ = c.close();
                    let _ = root.close();
                    self.fail_pending(&why);
                    crate::log_warn!("link to {} down: {why}", self.url);
                    self.report(LinkEvent::Down { link: self.link });
                }
                Err(e) => {
                    crate::log_debug!("link to {}: {e}", self.url);
                }
            }
            // While down: answer calls at once, drop forwards, wait.
            let until = Instant::now() + backoff;
            backoff = (backoff * 2).min(RETRY_MAX);
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match self.rx.recv_timeout(left) {
                    Ok(out) => self.refuse(out, "not connected"),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    }

    fn refuse(&mut self, out: LinkOut, why: &str) {
        self.queued.fetch_sub(out.bytes(), Ordering::Relaxed);
        if let LinkOut::Call { tag, .. } = out {
            self.report(LinkEvent::Answer {
                tag,
                result: Err(unreachable_error(why)),
            });
        }
    }

    fn fail_pending(&mut self, why: &str) {
        for (tag, _, _) in std::mem::take(&mut self.pending) {
            self.report(LinkEvent::Answer {
                tag,
                result: Err(unreachable_error(why)),
            });
        }
    }

    /// Sends what the broker queues until the connection fails; returns why.
    fn serve(&mut self, c: &Client, root: &Client) -> String {
        let mut batch: Vec<u8> = Vec::new();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return "stopping".into();
            }
            let wait = if self.pending.is_empty() {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(1)
            };
            let first = match self.rx.recv_timeout(wait) {
                Ok(out) => Some(out),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return "stopping".into(),
            };
            let mut next = first;
            while let Some(out) = next.take() {
                self.queued.fetch_sub(out.bytes(), Ordering::Relaxed);
                match out {
                    LinkOut::Forward(b) => {
                        // Batches concatenate once their version byte is
                        // dropped, up to EMIT_BYTES_MAX; a larger one goes
                        // out on its own.
                        if !batch.is_empty() && batch.len() + b.len() > EMIT_BYTES_MAX {
                            if let Err(e) = self.emit(c, &mut batch) {
                                return e;
                            }
                        }
                        if batch.is_empty() {
                            batch = b;
                        } else if b.first() == Some(&BATCH_MAGIC) {
                            batch.extend_from_slice(&b[1..]);
                        }
                    }
                    LinkOut::Call {
                        tag,
                        event,
                        args,
                        attachments,
                        timeout,
                        root: on_root,
                        fenced,
                    } => {
                        // Forwards queued before the call go before it.
                        if let Err(e) = self.emit(c, &mut batch) {
                            return e;
                        }
                        let via = if on_root { root } else { c };
                        let args = if fenced {
                            stamp(&args, self.epoch)
                        } else {
                            args
                        };
                        match via.call_async_raw(&event, &args, &attachments) {
                            Ok(p) => self.pending.push((tag, Instant::now() + timeout, p)),
                            Err(e) => {
                                self.report(LinkEvent::Answer {
                                    tag,
                                    result: Err(unreachable_error(&e.to_string())),
                                });
                                if matches!(e, Error::Closed | Error::Io(_)) {
                                    return e.to_string();
                                }
                            }
                        }
                    }
                }
                next = match self.rx.try_recv() {
                    Ok(out) => Some(out),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return "stopping".into(),
                };
            }
            if let Err(e) = self.emit(c, &mut batch) {
                return e;
            }
            self.settle();
            if !c.is_connected() || !root.is_connected() {
                return "connection lost".into();
            }
        }
    }

    fn emit(&self, c: &Client, batch: &mut Vec<u8>) -> Result<(), String> {
        if batch.len() <= 1 {
            batch.clear();
            return Ok(());
        }
        let b = std::mem::take(batch);
        match c.emit_with("cluster.forward", json!({}), &[b]) {
            Ok(()) => Ok(()),
            // Too large for this peer (its -max-payload is smaller): this
            // batch is lost, the link stays up.
            Err(Error::Protocol(e)) => {
                crate::log_warn!("forward batch to {} dropped: {e}", self.url);
                Ok(())
            }
            Err(e) => Err(format!("forward: {e}")),
        }
    }

    /// Reports the calls whose ack came or whose time ran out.
    fn settle(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let (tag, deadline, p) = &mut self.pending[i];
            let result = match p.try_take() {
                Some(Ok(answer)) => Some(Ok(answer)),
                Some(Err(e)) => Some(Err(unreachable_error(&e.to_string()))),
                None if now >= *deadline => Some(Err(CallError {
                    code: "unavailable",
                    message: "the peer did not answer in time".into(),
                })),
                None => None,
            };
            if let Some(result) = result {
                let tag = *tag;
                self.pending.swap_remove(i);
                self.report(LinkEvent::Answer { tag, result });
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_numbers_grow_and_are_stamped_into_the_argument() {
        let a = next_epoch();
        let b = next_epoch();
        assert!(b > a, "{b} after {a}");
        assert_eq!(stamp("{}", 7), r#"{"link":7}"#);
        assert_eq!(stamp(r#"{"from":2}"#, 7), r#"{"link":7,"from":2}"#);
        let v: Value = serde_json::from_str(&stamp(r#" { "from" : 2 } "#, 9)).unwrap();
        assert_eq!(v, json!({"link": 9, "from": 2}));
        // Not an object: left as it is.
        assert_eq!(stamp("[1]", 7), "[1]");
    }

    /// A detached link is bounded like a started one, and what its far
    /// end takes no longer counts against the bound.
    #[test]
    fn a_detached_link_frees_what_its_far_end_takes() {
        let (links, end) = Links::detached(1);
        assert!(links.forward(0, vec![0; LINK_QUEUE_BYTES - 10]));
        assert!(!links.forward(0, vec![1; 100]), "over the bound");
        assert!(!links.forward(1, vec![1; 1]), "no such link");
        let Some(LinkOut::Forward(b)) = end.take(0) else {
            panic!("the first batch is queued");
        };
        assert_eq!(b.len(), LINK_QUEUE_BYTES - 10);
        assert!(end.take(0).is_none());
        assert!(links.forward(0, vec![1; 100]), "the taken bytes are free");
    }
}
