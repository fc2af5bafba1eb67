//! The broker's part of a clean stop: every client is told it is
//! disconnected (Socket.IO DISCONNECT on each namespace it joined) before
//! the event loop closes the connections. Stores that must be flushed and
//! fsynced at shutdown do it here too, from `Handler::shutdown`.

use super::Broker;
use crate::net::Io;

impl Broker {
    /// Sends DISCONNECT (`1` on `/`, `1/control,` on `/control`) to every
    /// session, as a Socket.IO server does when it closes a socket.
    pub(crate) fn say_goodbye(&mut self, io: &mut Io<'_>) {
        let mut told = 0usize;
        for (conn, session) in self.sessions.iter().enumerate() {
            let Some(session) = session else { continue };
            if session.root {
                io.send_text(conn, &[b"1"]);
            }
            if session.control {
                io.send_text(conn, &[b"1/control,"]);
            }
            told += usize::from(session.root || session.control);
        }
        crate::log_info!("shutting down: disconnected {told} clients");
    }
}
