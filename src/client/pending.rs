//! Pipelined acked calls of the Rust client: [`Client::call_async`] and
//! [`Client::publish_async`] send an event with an ack id and return at
//! once with a [`PendingAck`], so many acks can be outstanding on one
//! connection. They use the same ack table as blocking calls; each holds
//! one of the client's [`super::Options::async_acks_max`] slots until its
//! ack arrives, the link fails it, it times out or it is dropped.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::shared::{check_ack, AckMode, ReceivedAck, Shared};
use super::{Client, Error, OutMessage};

/// The ack of an event sent by [`Client::call_async`] or
/// [`Client::publish_async`], still to come. The server answers the events
/// of one connection in the order they were sent.
///
/// Dropping it stops waiting (frees its slot); the event was sent anyway.
#[derive(Debug)]
pub struct PendingAck {
    id: u64,
    rx: Receiver<Result<ReceivedAck, Error>>,
    shared: Arc<Shared>,
    /// The outcome, once [`PendingAck::is_ready`] has seen it.
    outcome: Option<Result<ReceivedAck, Error>>,
    /// The ack table no longer holds this waiter.
    settled: bool,
}

impl PendingAck {
    /// Whether the ack (or the error ending the wait) is here, so that
    /// [`PendingAck::wait`] returns without blocking.
    pub fn is_ready(&mut self) -> bool {
        if self.outcome.is_none() {
            self.outcome = match self.rx.try_recv() {
                Ok(outcome) => Some(outcome),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(Error::Closed)),
            };
        }
        self.outcome.is_some()
    }

    /// Waits for the ack, at most the client's [`super::Options::timeout`],
    /// and returns the ack object; `ok:false` becomes [`Error::Server`], a
    /// connection lost meanwhile [`Error::Disconnected`] (while the client
    /// reconnects) or [`Error::Closed`].
    pub fn wait(self) -> Result<Value, Error> {
        let timeout = self.shared.opts.timeout;
        self.wait_timeout(timeout)
    }

    /// [`PendingAck::wait`] for at most `timeout`; [`Error::Timeout`] when
    /// it passes (the ack is then no longer awaited).
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Value, Error> {
        let outcome = match self.outcome.take() {
            Some(outcome) => outcome,
            None => match self.rx.recv_timeout(timeout) {
                Ok(outcome) => outcome,
                Err(RecvTimeoutError::Timeout) => {
                    if self.shared.forget(self.id) {
                        Err(Error::Timeout)
                    } else {
                        // The answer came just as the wait ended.
                        self.rx.try_recv().unwrap_or(Err(Error::Timeout))
                    }
                }
                Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
            },
        };
        self.settled = true;
        outcome.and_then(check_ack).map(|reply| reply.value)
    }
}

/// An ack's first argument (as JSON text when the client keeps raw acks,
/// else re-encoded) and its binary attachments.
pub(crate) type RawAnswer = (String, Vec<Vec<u8>>);

impl PendingAck {
    /// The whole ack array's first element and the ack's attachments, once
    /// here, without judging `ok` (for relaying an answer as it came).
    pub(crate) fn try_take(&mut self) -> Option<Result<RawAnswer, Error>> {
        if !self.is_ready() {
            return None;
        }
        self.settled = true;
        let outcome = self.outcome.take()?;
        Some(outcome.map(|r| (r.raw.unwrap_or_else(|| r.value.to_string()), r.attachments)))
    }
}

impl Drop for PendingAck {
    fn drop(&mut self) {
        if !self.settled && self.outcome.is_none() {
            self.shared.forget(self.id);
        }
    }
}

impl Client {
    /// Sends any event with an ack id and returns without waiting for the
    /// ack; [`PendingAck::wait`] gets it. With
    /// [`super::Options::async_acks_max`] acks already outstanding this
    /// blocks until one ends, at most the client's timeout
    /// ([`Error::Timeout`]).
    pub fn call_async(&self, event: &str, args: Value) -> Result<PendingAck, Error> {
        self.send_async(event, args, &[], false)
    }

    /// Publishes `msg` asking for an ack, without waiting for it (see
    /// [`Client::call_async`]). A publish to a subject a stream captures
    /// is acked once stored, with its stream and sequence. While the
    /// client reconnects it may be held like [`Client::publish_msg`]'s.
    pub fn publish_async(&self, msg: &OutMessage) -> Result<PendingAck, Error> {
        let (arg, attachments) = msg.encode();
        self.send_async("pub", arg, &attachments, true)
    }

    /// [`Client::call_async`] with the argument as JSON text (sent as
    /// is, so nothing in it is reordered or rounded) and attachments.
    pub(crate) fn call_async_raw(
        &self,
        event: &str,
        arg: &str,
        attachments: &[Vec<u8>],
    ) -> Result<PendingAck, Error> {
        let (id, rx) = self
            .shared
            .send_event_raw(event, arg, attachments, AckMode::Async)?
            .ok_or_else(|| Error::Protocol(format!("{event} sent without an ack id")))?;
        Ok(PendingAck {
            id,
            rx,
            shared: Arc::clone(&self.shared),
            outcome: None,
            settled: false,
        })
    }

    /// Sends any event without an ack id, with binary attachments.
    pub(crate) fn emit_with(
        &self,
        event: &str,
        args: Value,
        attachments: &[Vec<u8>],
    ) -> Result<(), Error> {
        self.shared
            .emit(event, args, attachments, None, false)
            .map(|_| ())
    }

    fn send_async(
        &self,
        event: &str,
        args: Value,
        attachments: &[Vec<u8>],
        holdable: bool,
    ) -> Result<PendingAck, Error> {
        let (id, rx) = self
            .shared
            .send_event(event, args, attachments, AckMode::Async, holdable)?
            .ok_or_else(|| Error::Protocol(format!("{event} sent without an ack id")))?;
        Ok(PendingAck {
            id,
            rx,
            shared: Arc::clone(&self.shared),
            outcome: None,
            settled: false,
        })
    }
}
