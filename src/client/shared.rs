//! What the Rust client's callers and its background thread share: the
//! current link and its write half, the phase (up, reconnecting, closed),
//! the acks awaited, the live subscriptions (enough to re-send them) and the
//! publishes held while reconnecting. Locked briefly, never across socket
//! I/O; every state change of the client goes through here.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::protocol::frame::coding::OpCode;

use super::inbox::Inbox;
use super::wire::{self, MaskRng};
use super::{Error, Event, Message, Options};
use crate::protocol::socketio::{self, PacketType};

/// An ack as received: its single argument and any attachments.
#[derive(Debug)]
pub(super) struct ReceivedAck {
    pub(super) value: Value,
    pub(super) attachments: Vec<Vec<u8>>,
    /// The first argument's JSON text as received, with
    /// [`super::Options::raw_acks`].
    pub(super) raw: Option<String>,
}

/// Who waits for an ack.
#[derive(Debug)]
pub(super) enum Waiter {
    /// A caller blocked on its reply (or on the error that ends the wait).
    Call(SyncSender<Result<ReceivedAck, Error>>),
    /// A [`super::PendingAck`]: like `Call`, and it holds one of the
    /// client's [`Options::async_acks_max`] slots until it ends.
    Async(SyncSender<Result<ReceivedAck, Error>>),
    /// The background thread's re-`sub` of this sid after a reconnect.
    Resub(String),
}

/// Whether and how an emitted event waits for its ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AckMode {
    /// Sent without an ack id.
    None,
    /// The caller blocks for the ack.
    Call,
    /// The caller gets a [`super::PendingAck`] back at once.
    Async,
}

/// An ack registered for a sent event: its id and where it will arrive.
pub(super) type AckSlot = (u64, Receiver<Result<ReceivedAck, Error>>);

/// What the client remembers of a live subscription so it can re-send it.
#[derive(Debug)]
pub(super) struct SubRoute {
    pub(super) subject: String,
    pub(super) queue: Option<String>,
    /// Deliveries left before the server ends it (`max`, `unsub after`).
    pub(super) left: Option<u64>,
    pub(super) inbox: Arc<Inbox<Message>>,
    /// A bucket watch's `kv.watch` argument, sent again instead of a
    /// `sub` after a reconnect.
    pub(super) watch: Option<Value>,
    /// Times in a row its re-sent subscription was refused as
    /// unavailable since the last reconnect.
    pub(super) resub_tries: u32,
}

/// Most times a re-sent subscription refused `unavailable` or `timeout`
/// (a node back from a restart whose cluster has no leader yet answers so,
/// after waiting up to 4 s for one) is sent again before it is ended.
pub(super) const RESUB_TRIES_MAX: u32 = 30;

impl SubRoute {
    /// The event and argument that make subscription `sid` again on a new
    /// link: its `kv.watch`, or a `sub` with what is left of its `max`.
    pub(super) fn resend(&self, sid: &str) -> (&'static str, Value) {
        match &self.watch {
            Some(w) => ("kv.watch", w.clone()),
            None => {
                let arg = super::sub_arg(sid, &self.subject, self.queue.as_deref(), self.left);
                ("sub", arg)
            }
        }
    }
}

/// A fire-and-forget or acked publish written while the link was down,
/// already encoded (its ack id, if any, is registered in `pending`).
#[derive(Debug)]
pub(super) struct Held {
    pub(super) text: String,
    pub(super) attachments: Vec<Vec<u8>>,
}

/// One open connection: the write half and what its open packet said.
pub(super) struct Link {
    pub(super) url: String,
    pub(super) writer: Mutex<Writer>,
    /// A handle on the socket so shutdown never waits for a writer.
    pub(super) socket: TcpStream,
    pub(super) max_payload: Option<u64>,
}

impl Link {
    pub(super) fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn send(&self, text: &str, attachments: &[Vec<u8>]) -> io::Result<()> {
        self.writer().send_packet(text, attachments)
    }

    /// A failed or partial write leaves the peer mid-frame, so the link
    /// cannot carry another packet: shutting it down makes its reader stop.
    pub(super) fn abort(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

/// Where the client is in its life.
pub(super) enum Phase {
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
pub(super) struct State {
    pub(super) phase: Phase,
    /// `close` was called: never reconnect.
    pub(super) closing: bool,
    pub(super) next_ack_id: u64,
    pub(super) pending: HashMap<u64, Waiter>,
    /// How many of `pending` are [`Waiter::Async`].
    pub(super) async_acks: usize,
    pub(super) subs: HashMap<String, SubRoute>,
    /// Publishes made while down, bounded by `Options::publish_buffer`.
    pub(super) held: VecDeque<Held>,
    /// The last server's `maxPayload`, to check publishes made while down.
    pub(super) max_payload: Option<u64>,
    /// The socket of a connect attempt in progress, so `close` can cut it.
    pub(super) dialing: Option<TcpStream>,
    /// Re-sent subscriptions whose ack has not come back yet.
    pub(super) resubs_unacked: usize,
    /// The [`Event::Reconnected`] to report once they all have.
    pub(super) announce: Option<Event>,
}

impl State {
    pub(super) fn register(&mut self, waiter: Waiter) -> u64 {
        let id = self.next_ack_id;
        self.next_ack_id = self.next_ack_id.wrapping_add(1);
        self.pending.insert(id, waiter);
        id
    }

    pub(super) fn register_call(&mut self) -> AckSlot {
        let (tx, rx) = mpsc::sync_channel(1);
        (self.register(Waiter::Call(tx)), rx)
    }

    fn register_ack(&mut self, mode: AckMode) -> Option<AckSlot> {
        match mode {
            AckMode::None => None,
            AckMode::Call => Some(self.register_call()),
            AckMode::Async => {
                let (tx, rx) = mpsc::sync_channel(1);
                self.async_acks += 1;
                Some((self.register(Waiter::Async(tx)), rx))
            }
        }
    }

    /// Takes the waiter of ack `id` out, freeing its async slot if it held
    /// one.
    pub(super) fn take(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.pending.remove(&id);
        if matches!(waiter, Some(Waiter::Async(_))) {
            self.async_acks = self.async_acks.saturating_sub(1);
        }
        waiter
    }

    /// Ends every wait for an ack with `error` (a fresh one per caller),
    /// and the wait for re-sent subscriptions with it.
    pub(super) fn fail_pending(&mut self, error: impl Fn() -> Error) {
        self.resubs_unacked = 0;
        self.announce = None;
        self.async_acks = 0;
        for (_, waiter) in self.pending.drain() {
            if let Waiter::Call(tx) | Waiter::Async(tx) = waiter {
                let _ = tx.try_send(Err(error()));
            }
        }
    }
}

/// The write half: whole packets (text frame plus attachments) are written
/// under this lock so frames of two callers never interleave.
pub(super) struct Writer {
    pub(super) stream: TcpStream,
    pub(super) rng: MaskRng,
    pub(super) buf: Vec<u8>,
    /// RFC 6455 §5.5.1: an endpoint sends at most one close frame.
    pub(super) close_sent: bool,
}

impl Writer {
    pub(super) fn send_packet(&mut self, text: &str, attachments: &[Vec<u8>]) -> io::Result<()> {
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
    pub(super) fn send_close(&mut self, code: u16) -> io::Result<()> {
        if self.close_sent {
            return Ok(());
        }
        self.close_sent = true;
        self.send_control(wire::close_opcode(), &code.to_be_bytes())
    }

    pub(super) fn send_control(&mut self, opcode: OpCode, payload: &[u8]) -> io::Result<()> {
        self.buf.clear();
        let mask = self.rng.next_mask();
        wire::encode_frame(&mut self.buf, opcode, payload, mask);
        self.stream.write_all(&self.buf)
    }
}

pub(super) struct Shared {
    pub(super) opts: Options,
    /// Every address the client may use, tried in turn.
    pub(super) urls: Vec<String>,
    pub(super) state: Mutex<State>,
    /// Signalled when the phase changes or `close` is called.
    pub(super) changed: Condvar,
    /// Signalled when an async ack ends (its slot is free again).
    pub(super) slots: Condvar,
    pub(super) next_sid: AtomicU64,
    /// Engine.IO pings answered since the client connected.
    pub(super) pongs: AtomicU64,
    pub(super) events: Arc<Inbox<Event>>,
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
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind; they are
        // still consistent, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn is_closed(&self) -> bool {
        matches!(self.state().phase, Phase::Closed)
    }

    /// Waits until the phase is [`Phase::Closed`] or `wait` passes.
    pub(super) fn wait_closed(&self, wait: Duration) {
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
    pub(super) fn emit(
        &self,
        event: &str,
        arg: Value,
        attachments: &[Vec<u8>],
        ack_wait: Option<Duration>,
        holdable: bool,
    ) -> Result<Option<ReceivedAck>, Error> {
        let mode = if ack_wait.is_some() {
            AckMode::Call
        } else {
            AckMode::None
        };
        let ack = self.send_event(event, arg, attachments, mode, holdable)?;
        self.await_ack(ack, ack_wait)
    }

    /// Sends `[event, arg]` with `attachments` (or holds it, as
    /// [`Shared::emit`] does) and returns the ack registered for it, if
    /// `mode` asks for one. [`AckMode::Async`] first waits for a free slot.
    pub(super) fn send_event(
        &self,
        event: &str,
        arg: Value,
        attachments: &[Vec<u8>],
        mode: AckMode,
        holdable: bool,
    ) -> Result<Option<AckSlot>, Error> {
        let payload = serde_json::to_string(&json!([event, arg]))
            .map_err(|e| Error::Protocol(format!("cannot encode {event}: {e}")))?;
        self.send_payload(event, payload, attachments, mode, holdable)
    }

    /// [`Shared::send_event`] with the argument as JSON text, sent as is.
    pub(super) fn send_event_raw(
        &self,
        event: &str,
        arg: &str,
        attachments: &[Vec<u8>],
        mode: AckMode,
    ) -> Result<Option<AckSlot>, Error> {
        let name = serde_json::to_string(event)
            .map_err(|e| Error::Protocol(format!("cannot encode {event}: {e}")))?;
        self.send_payload(event, format!("[{name},{arg}]"), attachments, mode, false)
    }

    fn send_payload(
        &self,
        event: &str,
        payload: String,
        attachments: &[Vec<u8>],
        mode: AckMode,
        holdable: bool,
    ) -> Result<Option<AckSlot>, Error> {
        let _ = event;
        let kind = if attachments.is_empty() {
            PacketType::Event
        } else {
            PacketType::BinaryEvent
        };
        let namespace = &self.opts.namespace;
        let mut state = self.state();
        if mode == AckMode::Async {
            state = self.wait_for_slot(state)?;
        }
        let link = match &state.phase {
            Phase::Closed => return Err(Error::Closed),
            Phase::Up(link) => Arc::clone(link),
            Phase::Down if holdable => {
                return self.hold(state, kind, attachments, &payload, mode);
            }
            Phase::Down => return Err(Error::Reconnecting),
        };
        let ack = state.register_ack(mode);
        drop(state);
        let ack_id = ack.as_ref().map(|(id, _)| *id);
        let text = socketio::encode_message(kind, attachments.len(), namespace, ack_id, &payload);
        let sent = check_size(link.max_payload, &text, attachments).and_then(|()| {
            link.send(&text, attachments).map_err(|e| {
                link.abort();
                self.write_error(e)
            })
        });
        if let Err(e) = sent {
            if let Some(id) = ack_id {
                self.forget(id);
            }
            return Err(e);
        }
        Ok(ack)
    }

    /// Waits until fewer than [`Options::async_acks_max`] async acks are
    /// outstanding, at most the client's `timeout` ([`Error::Timeout`]).
    fn wait_for_slot<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>, Error> {
        let max = self.opts.async_acks_max.max(1);
        let deadline = Instant::now() + self.opts.timeout;
        while state.async_acks >= max {
            if matches!(state.phase, Phase::Closed) {
                return Err(Error::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            state = match self.slots.wait_timeout(state, left) {
                Ok((guard, _)) => guard,
                Err(p) => p.into_inner().0,
            };
        }
        Ok(state)
    }

    /// Stops waiting for ack `id`; false if it was no longer awaited (its
    /// answer came, or the link failed it, already).
    pub(super) fn forget(&self, id: u64) -> bool {
        let waiter = self.state().take(id);
        if matches!(waiter, Some(Waiter::Async(_))) {
            self.slots.notify_one();
        }
        waiter.is_some()
    }

    /// Puts a publish made while down in the publish buffer, then waits for
    /// its ack like any call. One that times out there is still sent later.
    pub(super) fn hold(
        &self,
        mut state: MutexGuard<'_, State>,
        kind: PacketType,
        attachments: &[Vec<u8>],
        payload: &str,
        mode: AckMode,
    ) -> Result<Option<AckSlot>, Error> {
        if self.opts.publish_buffer == 0 {
            return Err(Error::Reconnecting);
        }
        if state.held.len() >= self.opts.publish_buffer {
            return Err(Error::BufferFull);
        }
        let namespace = &self.opts.namespace;
        let ack = state.register_ack(mode);
        let ack_id = ack.as_ref().map(|(id, _)| *id);
        let text = socketio::encode_message(kind, attachments.len(), namespace, ack_id, payload);
        if let Err(e) = check_size(state.max_payload, &text, attachments) {
            if let Some(id) = ack_id {
                state.take(id);
            }
            return Err(e);
        }
        state.held.push_back(Held {
            text,
            attachments: attachments.to_vec(),
        });
        drop(state);
        Ok(ack)
    }

    pub(super) fn await_ack(
        &self,
        ack: Option<AckSlot>,
        wait: Option<Duration>,
    ) -> Result<Option<ReceivedAck>, Error> {
        let (Some((id, rx)), Some(wait)) = (ack, wait) else {
            return Ok(None);
        };
        match rx.recv_timeout(wait) {
            Ok(Ok(reply)) => check_ack(reply).map(Some),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                self.forget(id);
                Err(Error::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }

    /// The error for a write that failed: [`Error::Closed`] once closed,
    /// [`Error::Disconnected`] when the client will reconnect, else the
    /// I/O error itself.
    pub(super) fn write_error(&self, e: io::Error) -> Error {
        match &self.state().phase {
            Phase::Closed => Error::Closed,
            Phase::Up(_) | Phase::Down if self.opts.reconnect.is_some() => Error::Disconnected,
            Phase::Up(_) | Phase::Down => Error::Io(e),
        }
    }

    pub(super) fn push_event(&self, event: Event) {
        self.events.push(event, 0);
    }

    /// The link ended with `reason`. Calls waiting on it fail, and the
    /// client either starts reconnecting (returns true) or closes for good.
    pub(super) fn link_lost(&self, link: &Link, reason: &str) -> bool {
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
        self.slots.notify_all();
        true
    }

    /// Enters [`Phase::Closed`]: every wait and every subscription ends.
    pub(super) fn close_for_good(&self, state: &mut State, reason: &str) {
        if matches!(state.phase, Phase::Closed) {
            return;
        }
        state.phase = Phase::Closed;
        state.fail_pending(|| Error::Closed);
        self.slots.notify_all();
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

    /// Delivers a `msg` of `bytes` on the wire to its subscription,
    /// counting down its `max`.
    pub(super) fn deliver(&self, message: Message, bytes: usize) {
        let mut state = self.state();
        if let Some(route) = state.subs.get_mut(&message.sid) {
            if let Some(left) = route.left.as_mut() {
                *left = left.saturating_sub(1);
            }
            route.inbox.push(message, bytes);
        }
    }

    /// Hands an ack to whoever waits for it.
    pub(super) fn acked(&self, id: u64, reply: ReceivedAck) {
        let waiter = self.state().take(id);
        match waiter {
            // The caller may have timed out already; that is fine.
            Some(Waiter::Call(tx)) => {
                let _ = tx.try_send(Ok(reply));
            }
            Some(Waiter::Async(tx)) => {
                let _ = tx.try_send(Ok(reply));
                self.slots.notify_one();
            }
            Some(Waiter::Resub(sid)) => self.resubscribed(sid, reply),
            None => {}
        }
    }

    /// The ack of subscription `sid`, re-sent after a reconnect; the last
    /// one outstanding reports the reconnect.
    fn resubscribed(&self, sid: String, reply: ReceivedAck) {
        let refused = check_ack(reply).err();
        let mut state = self.state();
        match refused {
            None if !state.subs.contains_key(&sid) => {
                // Dropped while it was being re-sent: end it on the server
                // too. Not under the lock: the write takes the link's.
                drop(state);
                let _ = self.emit("unsub", json!({ "sid": sid }), &[], None, false);
                state = self.state();
            }
            None => {
                if let Some(route) = state.subs.get_mut(&sid) {
                    route.resub_tries = 0;
                }
            }
            Some(e) if transient(&e) => {
                if let Some((link, text)) = self.resend_sub(&mut state, &sid) {
                    // Asked again: it still counts as outstanding. Not under
                    // the lock: the write takes the link's.
                    drop(state);
                    // A failed write means the link is going; the
                    // reconnect then sends every subscription again.
                    let _ = link.send(&text, &[]);
                    return;
                }
                self.end_sub(&mut state, sid, &e);
            }
            Some(e) => self.end_sub(&mut state, sid, &e),
        }
        state.resubs_unacked = state.resubs_unacked.saturating_sub(1);
        if state.resubs_unacked == 0 {
            if let Some(event) = state.announce.take() {
                self.push_event(event);
            }
        }
    }

    /// The server refused subscription `sid` back: end it visibly rather
    /// than leave its handle waiting forever.
    fn end_sub(&self, state: &mut State, sid: String, e: &Error) {
        if let Some(route) = state.subs.remove(&sid) {
            route.inbox.close();
        }
        self.push_event(Event::ResubscribeFailed {
            sid,
            error: e.to_string(),
        });
    }

    /// Subscription `sid` asked for again on the current link, unless it
    /// is gone, has used up [`RESUB_TRIES_MAX`], or the link is down: the
    /// link and the packet to write on it (its ack is registered).
    fn resend_sub(&self, state: &mut State, sid: &str) -> Option<(Arc<Link>, String)> {
        let Phase::Up(link) = &state.phase else {
            return None;
        };
        let link = Arc::clone(link);
        let route = state.subs.get_mut(sid)?;
        if route.resub_tries >= RESUB_TRIES_MAX {
            return None;
        }
        route.resub_tries += 1;
        let (event, arg) = route.resend(sid);
        let id = state.register(Waiter::Resub(sid.to_string()));
        let payload = json!([event, arg]).to_string();
        let namespace = &self.opts.namespace;
        let text = socketio::encode_message(PacketType::Event, 0, namespace, Some(id), &payload);
        Some((link, text))
    }
}

pub(super) fn check_size(
    max: Option<u64>,
    text: &str,
    attachments: &[Vec<u8>],
) -> Result<(), Error> {
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

/// A refusal that a later try may not meet: the node has no cluster
/// leader yet (`unavailable`), or its answer did not come in time.
fn transient(e: &Error) -> bool {
    matches!(e, Error::Server { code, .. } if code == "unavailable" || code == "timeout")
}

pub(super) fn check_ack(reply: ReceivedAck) -> Result<ReceivedAck, Error> {
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
                revision: error
                    .and_then(|e| e.get("revision"))
                    .and_then(Value::as_u64),
            })
        }
        None => Err(Error::Protocol(format!(
            "ack without a boolean ok: {}",
            reply.value
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::inbox::Empty;
    use crate::client::{Reconnect, EVENTS_MAX};

    fn reply(value: Value) -> ReceivedAck {
        ReceivedAck {
            raw: None,
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
                async_acks: 0,
                subs: HashMap::new(),
                held: VecDeque::new(),
                max_payload: Some(64),
                dialing: None,
                resubs_unacked: 0,
                announce: None,
            }),
            changed: Condvar::new(),
            slots: Condvar::new(),
            next_sid: AtomicU64::new(1),
            pongs: AtomicU64::new(0),
            events: Arc::new(Inbox::new(EVENTS_MAX, usize::MAX)),
        }
    }

    fn route(shared: &Shared, sid: &str, left: Option<u64>) -> Arc<Inbox<Message>> {
        let inbox = Arc::new(Inbox::new(8, usize::MAX));
        let route = SubRoute {
            subject: "a".to_string(),
            queue: None,
            left,
            inbox: Arc::clone(&inbox),
            watch: None,
            resub_tries: 0,
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
            stream: None,
        };
        shared.deliver(msg("1"), 10);
        shared.deliver(msg("unknown"), 10);
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

    /// A client whose link is up, over a loopback socket; the server's end.
    fn up() -> (Shared, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let link = Arc::new(Link {
            url: "test".to_string(),
            writer: Mutex::new(Writer {
                stream: ours.try_clone().unwrap(),
                rng: MaskRng::new(),
                buf: Vec::new(),
                close_sent: false,
            }),
            socket: ours,
            max_payload: None,
        });
        let shared = down(0);
        shared.state().phase = Phase::Up(link);
        (shared, theirs)
    }

    /// The next text message the client wrote to the server's end.
    fn written(theirs: &mut TcpStream, decoder: &mut wire::FrameDecoder) -> String {
        let mut chunk = [0u8; 256];
        loop {
            if let Some(message) = decoder.next().unwrap() {
                match message {
                    wire::WsMessage::Text(t) => return t,
                    other => panic!("not text: {other:?}"),
                }
            }
            let n = std::io::Read::read(theirs, &mut chunk).unwrap();
            assert!(n > 0, "the link closed");
            decoder.push(&chunk[..n]);
        }
    }

    #[test]
    fn a_subscription_dropped_while_re_sent_is_ended_on_the_server() {
        let (shared, mut theirs) = up();
        let id = shared.state().register(Waiter::Resub("9".to_string()));
        shared.acked(id, reply(json!({"ok": true, "sid": "9"})));
        let mut decoder = wire::FrameDecoder::new(1024);
        assert_eq!(
            written(&mut theirs, &mut decoder),
            r#"42["unsub",{"sid":"9"}]"#
        );
    }

    #[test]
    fn a_resubscribe_refused_unavailable_is_asked_again_up_to_its_tries() {
        let (shared, mut theirs) = up();
        let inbox = route(&shared, "4", None);
        shared.state().resubs_unacked = 1;
        let mut decoder = wire::FrameDecoder::new(1024);
        let unavailable =
            json!({"ok": false, "error": {"code": "unavailable", "message": "no leader"}});
        let mut id = shared.state().register(Waiter::Resub("4".to_string()));
        for _ in 0..RESUB_TRIES_MAX {
            shared.acked(id, reply(unavailable.clone()));
            let text = written(&mut theirs, &mut decoder);
            assert!(text.contains(r#"["sub",{"#), "{text}");
            assert!(text.contains(r#""sid":"4""#), "{text}");
            assert_eq!(inbox.try_recv(), Ok(None), "still open");
            assert_eq!(shared.state().resubs_unacked, 1, "still outstanding");
            id = shared.state().pending.keys().copied().max().unwrap();
        }
        // Its tries used up, the next refusal ends it.
        shared.acked(id, reply(unavailable));
        assert_eq!(inbox.recv(None), Err(Empty::Closed));
        assert!(matches!(
            shared.events.try_recv(),
            Ok(Some(Event::ResubscribeFailed { .. }))
        ));
    }

    #[test]
    fn a_resubscribe_that_takes_after_a_refusal_starts_its_tries_again() {
        let (shared, mut theirs) = up();
        let _inbox = route(&shared, "5", None);
        let mut decoder = wire::FrameDecoder::new(1024);
        let id = shared.state().register(Waiter::Resub("5".to_string()));
        let timeout = json!({"ok": false, "error": {"code": "timeout", "message": "slow"}});
        shared.acked(id, reply(timeout));
        written(&mut theirs, &mut decoder);
        assert_eq!(shared.state().subs["5"].resub_tries, 1);
        let id = shared.state().pending.keys().copied().max().unwrap();
        shared.acked(id, reply(json!({"ok": true, "sid": "5"})));
        assert_eq!(shared.state().subs["5"].resub_tries, 0);
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
    fn async_acks_are_capped_and_every_ending_frees_a_slot() {
        let mut shared = down(8);
        shared.opts.async_acks_max = 2;
        let publish = |s: &Shared| {
            let arg = json!({"subject": "a", "data": 1});
            s.send_event("pub", arg, &[], AckMode::Async, true)
        };
        let (a, _ra) = publish(&shared).unwrap().unwrap();
        let (_b, rb) = publish(&shared).unwrap().unwrap();
        assert_eq!(publish(&shared).unwrap_err(), Error::Timeout);
        assert_eq!(shared.state().held.len(), 2);
        // An ack frees a slot.
        shared.acked(a, reply(json!({"ok": true})));
        let (c, _rc) = publish(&shared).unwrap().unwrap();
        // So does giving up on one, once.
        assert!(shared.forget(c));
        assert!(!shared.forget(c));
        assert_eq!(shared.state().async_acks, 1);
        // A blocked caller goes on as soon as a slot frees.
        let (d, _rd) = publish(&shared).unwrap().unwrap();
        shared.opts.timeout = Duration::from_secs(10);
        let shared = &shared;
        std::thread::scope(|scope| {
            let blocked = scope.spawn(|| publish(shared).map(|ack| ack.is_some()));
            // Ends either way: the blocked call gives up after 10 s.
            while !blocked.is_finished() {
                if shared.state().pending.contains_key(&d) {
                    shared.acked(d, reply(json!({"ok": true})));
                }
                std::thread::yield_now();
            }
            assert_eq!(blocked.join().unwrap(), Ok(true));
        });
        // A lost link fails them all and frees every slot.
        shared.state().fail_pending(|| Error::Disconnected);
        assert_eq!(rb.try_recv().unwrap().unwrap_err(), Error::Disconnected);
        assert_eq!(shared.state().async_acks, 0);
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
}
