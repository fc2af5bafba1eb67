//! The broker's part of a clean stop, in order: the streams write what
//! they hold, run a final fsync round (bounded by [`STREAM_SYNC_MAX`]) and
//! send the held acks it covers; then every client is told it is
//! disconnected (Socket.IO DISCONNECT on each namespace it joined), before
//! the event loop closes the connections. Called from `Handler::shutdown`.

use std::time::Duration;

use super::Broker;
use crate::port::Sink;

/// Longest the final fsync round may hold up the goodbyes. The event loop's
/// 2 s drain of queued bytes starts before it, so time spent here is taken
/// from that drain.
pub const STREAM_SYNC_MAX: Duration = Duration::from_secs(2);

impl Broker {
    /// The clean stop: streams first (so the acks their final fsync makes
    /// true are queued ahead of the DISCONNECT), then the goodbyes.
    pub(crate) fn shut_down(&mut self, sink: &mut dyn Sink) {
        self.streams.shutdown(sink, STREAM_SYNC_MAX);
        self.say_goodbye(sink);
    }

    /// Sends DISCONNECT (`1` on `/`, `1/control,` on `/control`) to every
    /// session, as a Socket.IO server does when it closes a socket.
    pub(crate) fn say_goodbye(&mut self, sink: &mut dyn Sink) {
        let mut told = 0usize;
        for (conn, session) in self.sessions.iter().enumerate() {
            let Some(session) = session else { continue };
            if session.root {
                sink.send_text(conn, &[b"1"]);
            }
            if session.control {
                sink.send_text(conn, &[b"1/control,"]);
            }
            told += usize::from(session.root || session.control);
        }
        crate::log_info!("shutting down: disconnected {told} clients");
    }
}
