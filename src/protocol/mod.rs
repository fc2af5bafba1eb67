//! Pure protocol codecs: no sockets, files or clocks.
//!
//! - [`engineio`]: Engine.IO v4 packets, handshake query, heartbeat timer logic.
//! - [`socketio`]: Socket.IO v5 packets, namespaces, ack ids, binary attachments.
//! - [`errors`]: the contract's error codes and ack bodies.
//! - [`messages`]: typed requests for every event of the contract.
//! - [`pub_scan`]: the `pub` argument read by hand, off serde, on the
//!   publish hot path.
//! - [`kv_messages`]: key-value bucket requests, names, and how a bucket
//!   maps onto its stream.
//! - [`stream_messages`]: stream and consumer requests and configs.
//! - [`subject`]: subject and pattern rules (part of the wire contract), a
//!   reference matcher.
pub mod engineio;
pub mod errors;
pub mod kv_messages;
pub mod messages;
pub mod pub_scan;
pub mod socketio;
pub mod stream_messages;
pub mod subject;

/// Reads JSON held as bytes (snapshots, Raft entries, member data)
/// through the same reader as JSON held as text: `serde_json::from_slice`
/// would be a second copy of serde_json's parser and of each type's
/// reader, about 70 KB of the broker for types that are also read from
/// events. Bytes that are not UTF-8 are refused up front, where
/// `from_slice` refused them at the first string holding them: either
/// way the JSON is not read.
pub fn json_from_bytes<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    let text =
        std::str::from_utf8(bytes).map_err(<serde_json::Error as serde::de::Error>::custom)?;
    serde_json::from_str(text)
}
