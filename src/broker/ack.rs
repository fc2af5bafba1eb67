//! How the broker answers a Socket.IO event: one ACK packet carrying the
//! answer's argument array, or a BINARY_ACK followed by its attachments in
//! binary frames when it has any (docs/PROTOCOL.md, "Socket.IO layer"). Every answer
//! the broker writes goes out through [`send_ack_with`]; paths that answer
//! often lend it a header buffer they keep, the others use [`send_ack`].

use crate::port::{ConnId, Sink};
use crate::protocol::socketio::{self, PacketType};

/// Sends the ack `ack_id` in namespace `nsp` with `body` (the argument
/// array's JSON text), then `attachments` if there are any; the header is
/// written into `head`. Whether the connection took the packet.
#[inline]
pub(crate) fn send_ack_with(
    sink: &mut dyn Sink,
    head: &mut Vec<u8>,
    nsp: &str,
    conn: ConnId,
    ack_id: u64,
    body: &[u8],
    attachments: &[Vec<u8>],
) -> bool {
    let kind = if attachments.is_empty() {
        PacketType::Ack
    } else {
        PacketType::BinaryAck
    };
    head.clear();
    socketio::write_header(head, kind, attachments.len(), nsp, Some(ack_id));
    if !sink.send_text(conn, &[head, body]) {
        return false;
    }
    for a in attachments {
        sink.send_binary(conn, a);
    }
    true
}

/// [`send_ack_with`] for an answer without attachments, with a header
/// buffer of its own.
pub(crate) fn send_ack(sink: &mut dyn Sink, conn: ConnId, nsp: &str, ack_id: u64, body: &str) {
    let mut head = Vec::with_capacity(24);
    send_ack_with(sink, &mut head, nsp, conn, ack_id, body.as_bytes(), &[]);
}
