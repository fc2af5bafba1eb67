//! The Rust client's background thread: it reads the current link, and
//! when the link drops it reconnects (next address, capped exponential
//! backoff with jitter), re-sends every live subscription under its own sid
//! and only then the publishes held while down, before calls go through
//! again.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::backoff::Backoff;
use super::dial::{dial, Dialed};
use super::reader::{ReadHalf, Reader};
use super::shared::{Link, Phase, Shared, Waiter, Writer};
use super::{Error, Event};
use crate::protocol::socketio::{self, PacketType};

/// Splits a finished handshake into the write side callers share and the
/// read side the background thread keeps.
pub(crate) fn link_up(dialed: Dialed) -> io::Result<(Arc<Link>, ReadHalf)> {
    let Dialed {
        url,
        stream,
        decoder,
        rng,
        open,
    } = dialed;
    let link = Link {
        url,
        writer: Mutex::new(Writer {
            stream: stream.try_clone()?,
            rng,
            buf: Vec::new(),
            close_sent: false,
        }),
        socket: stream.try_clone()?,
        max_payload: open.max_payload,
    };
    let silence_max = open
        .silence_max_ms
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis);
    let half = ReadHalf {
        stream,
        decoder,
        silence_max,
    };
    Ok((Arc::new(link), half))
}

/// The thread's body. `index` is the position of `link`'s address in the
/// client's list; a reconnect starts with the address after it.
pub(crate) fn run(shared: Arc<Shared>, mut link: Arc<Link>, mut half: ReadHalf, mut index: usize) {
    loop {
        let reason = Reader::new(&shared, &link, half).run();
        link.abort();
        if !shared.link_lost(&link, &reason) {
            return;
        }
        match reconnect(&shared, index) {
            Some((next_link, next_half, next_index)) => {
                link = next_link;
                half = next_half;
                index = next_index;
            }
            None => return,
        }
    }
}

/// Tries the addresses in turn, waiting out the backoff before each
/// attempt, until one takes or the policy gives up (`None`: closed).
fn reconnect(shared: &Shared, last: usize) -> Option<(Arc<Link>, ReadHalf, usize)> {
    let policy = shared.opts.reconnect.unwrap_or_default();
    let mut backoff = Backoff::new(policy, crate::rand::random_seed());
    let count = shared.urls.len().max(1);
    let mut index = last;
    let mut last_error = String::from("no attempt made");
    loop {
        let Some(delay) = backoff.next_delay() else {
            let attempts = backoff.attempts();
            shared.give_up(&format!(
                "reconnecting gave up after {attempts} attempts: {last_error}"
            ));
            return None;
        };
        if shared.wait_closing(delay) {
            shared.give_up("closed by the client");
            return None;
        }
        index = (index + 1) % count;
        let Some(url) = shared.urls.get(index) else {
            shared.give_up("no address to reconnect to");
            return None;
        };
        let announce = Event::Reconnected {
            url: url.clone(),
            attempts: backoff.attempts(),
        };
        match attempt(shared, url, announce) {
            Ok((link, half)) => return Some((link, half, index)),
            Err(e) => last_error = format!("{url}: {e}"),
        }
    }
}

/// One attempt: connect, then bring the new link up to date.
fn attempt(shared: &Shared, url: &str, announce: Event) -> Result<(Arc<Link>, ReadHalf), Error> {
    let dialed = dial(url, &shared.opts, |socket| shared.watch_dial(socket));
    shared.state().dialing = None;
    let (link, half) = link_up(dialed?)?;
    if let Err(e) = resume(shared, &link, announce) {
        link.abort();
        // Acks for what went out on this link will never come.
        shared.state().fail_pending(|| Error::Disconnected);
        shared.slots.notify_all();
        return Err(e);
    }
    Ok((link, half))
}

/// Re-sends every subscription, then every held publish, then opens the
/// link to callers. Everything goes out in this order on one socket, and
/// the server handles one socket's events in order, so a replayed publish
/// already sees the subscriptions. `announce` is reported once the server
/// has acked every re-sent subscription (the reader counts them down).
fn resume(shared: &Shared, link: &Arc<Link>, announce: Event) -> Result<(), Error> {
    let namespace = &shared.opts.namespace;
    let resubs: Vec<String> = {
        let mut state = shared.state();
        state.max_payload = link.max_payload;
        let args: Vec<_> = state
            .subs
            .iter()
            .filter(|(_, route)| route.left != Some(0))
            .map(|(sid, route)| {
                let (event, arg) = route.resend(sid);
                (sid.clone(), event, arg)
            })
            .collect();
        state.resubs_unacked = args.len();
        args.into_iter()
            .map(|(sid, event, arg)| {
                let id = state.register(Waiter::Resub(sid));
                let payload = json!([event, arg]).to_string();
                socketio::encode_message(PacketType::Event, 0, namespace, Some(id), &payload)
            })
            .collect()
    };
    for text in &resubs {
        link.send(text, &[])?;
    }
    loop {
        let mut state = shared.state();
        if state.closing {
            return Err(Error::Closed);
        }
        let Some(held) = state.held.pop_front() else {
            state.phase = Phase::Up(Arc::clone(link));
            if state.resubs_unacked == 0 {
                shared.push_event(announce);
            } else {
                // The reader, not yet started, reports it after the acks.
                state.announce = Some(announce);
            }
            drop(state);
            shared.changed.notify_all();
            return Ok(());
        };
        drop(state);
        if let Err(e) = link.send(&held.text, &held.attachments) {
            // A failed write reached the server as a cut frame at most, which
            // it discards: the publish goes out on the next link instead.
            shared.state().held.push_front(held);
            return Err(e.into());
        }
    }
}

impl Shared {
    /// Remembers the socket of a connect attempt so `close` can cut it.
    fn watch_dial(&self, socket: &TcpStream) {
        let mut state = self.state();
        if state.closing {
            let _ = socket.shutdown(Shutdown::Both);
        } else {
            state.dialing = socket.try_clone().ok();
        }
    }

    /// Waits `wait` unless `close` is called first; true if it was.
    fn wait_closing(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut state = self.state();
        loop {
            if state.closing {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = match self.changed.wait_timeout(state, left) {
                Ok((guard, _)) => guard,
                Err(p) => p.into_inner().0,
            };
        }
    }

    fn give_up(&self, reason: &str) {
        let mut state = self.state();
        self.close_for_good(&mut state, reason);
    }
}
