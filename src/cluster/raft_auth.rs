//! The handshake that opens every Raft connection when the cluster has a
//! secret (`-cluster-token`): its frames, and the proofs each side
//! computes. Pure: no sockets, no clocks; the transport
//! ([`super::raft_transport`]) drives it and supplies the nonces.
//!
//! The side that dials sends a hello with its node id, the id it means to
//! reach and a fresh nonce. The side that accepts answers with its own
//! nonce and a proof: HMAC-SHA256 under the secret over both ids, both
//! nonces and the role. The dialer checks it and sends its own proof (the
//! other role); only then do Raft frames follow. The secret never crosses
//! the wire, a proof made for one role cannot be sent back as the other,
//! and a recorded exchange is worthless later because the other side's
//! nonce is new each time. Every frame has a fixed size; each is one
//! [`crate::storage::record`] (length, crc32, body). docs/PROTOCOL.md
//! ("Node-to-node trust") shows the bytes.

use std::fmt;

use super::raft_msg::NodeId;
use crate::crypto::hmac::{self, HmacSha256, TAG_BYTES};
use crate::storage::record;

/// First bytes of every handshake body.
pub const MAGIC: [u8; 4] = *b"GBRA";
/// The handshake's version; a proof covers it.
pub const VERSION: u8 = 1;
/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 32;

const KIND_DIALER_HELLO: u8 = 1;
const KIND_ACCEPTOR_HELLO: u8 = 2;
const KIND_DIALER_PROOF: u8 = 3;

/// Body sizes: magic, version, kind, then the fields.
pub const DIALER_HELLO_BYTES: usize = 6 + 8 + 8 + NONCE_BYTES;
pub const ACCEPTOR_HELLO_BYTES: usize = 6 + 8 + 8 + NONCE_BYTES + TAG_BYTES;
pub const DIALER_PROOF_BYTES: usize = 6 + TAG_BYTES;

/// What a proof is made with; the label keeps these tags apart from any
/// other use of the same secret.
const LABEL: &[u8; 11] = b"gombus-raft";

/// The cluster secret. Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(Vec<u8>);

impl ClusterKey {
    pub fn new(secret: &[u8]) -> ClusterKey {
        ClusterKey(secret.to_vec())
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(set)")
    }
}

/// Which side a proof speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Dialer,
    Acceptor,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Role::Dialer => b'D',
            Role::Acceptor => b'A',
        }
    }
}

/// Everything a proof covers: ids as the dialer names them, both nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    pub dialer: NodeId,
    pub acceptor: NodeId,
    pub dialer_nonce: [u8; NONCE_BYTES],
    pub acceptor_nonce: [u8; NONCE_BYTES],
}

/// HMAC-SHA256(secret, version || "gombus-raft" || role || dialer id ||
/// acceptor id || dialer nonce || acceptor nonce), ids as u64 LE. Every
/// field has a fixed size, so no two transcripts share a message.
pub fn proof(key: &ClusterKey, role: Role, t: &Transcript) -> [u8; TAG_BYTES] {
    let mut h = HmacSha256::new(&key.0);
    h.update(&[VERSION]);
    h.update(LABEL);
    h.update(&[role.byte()]);
    h.update(&t.dialer.to_le_bytes());
    h.update(&t.acceptor.to_le_bytes());
    h.update(&t.dialer_nonce);
    h.update(&t.acceptor_nonce);
    h.finish()
}

/// Whether `given` is the proof `role` must give for `t`, in constant time.
pub fn check(key: &ClusterKey, role: Role, t: &Transcript, given: &[u8; TAG_BYTES]) -> bool {
    hmac::verify(given, &proof(key, role, t))
}

/// A decoded handshake frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Dialer to acceptor, first.
    DialerHello {
        dialer: NodeId,
        acceptor: NodeId,
        nonce: [u8; NONCE_BYTES],
    },
    /// Acceptor to dialer: its nonce and its proof.
    AcceptorHello {
        acceptor: NodeId,
        dialer: NodeId,
        nonce: [u8; NONCE_BYTES],
        proof: [u8; TAG_BYTES],
    },
    /// Dialer to acceptor: its proof; Raft frames follow.
    DialerProof { proof: [u8; TAG_BYTES] },
}

/// Why bytes are not the handshake frame expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a handshake at all (another program, a Raft frame sent
    /// without one, a node without a cluster secret).
    NotHandshake,
    /// A handshake of another version.
    Version(u8),
    /// A handshake frame, but not the one this step expects.
    Unexpected,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NotHandshake => write!(f, "not a handshake frame"),
            Refused::Version(v) => write!(f, "handshake version {v}, expected {VERSION}"),
            Refused::Unexpected => write!(f, "a handshake frame out of turn"),
        }
    }
}

fn head(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = record::begin(out);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    start
}

/// Appends the dialer's hello, framed.
pub fn encode_dialer_hello(
    out: &mut Vec<u8>,
    dialer: NodeId,
    acceptor: NodeId,
    nonce: &[u8; NONCE_BYTES],
) {
    let start = head(out, KIND_DIALER_HELLO);
    out.extend_from_slice(&dialer.to_le_bytes());
    out.extend_from_slice(&acceptor.to_le_bytes());
    out.extend_from_slice(nonce);
    record::finish(out, start);
}

/// Appends the acceptor's hello and proof, framed.
pub fn encode_acceptor_hello(
    out: &mut Vec<u8>,
    acceptor: NodeId,
    dialer: NodeId,
    nonce: &[u8; NONCE_BYTES],
    proof: &[u8; TAG_BYTES],
) {
    let start = head(out, KIND_ACCEPTOR_HELLO);
    out.extend_from_slice(&acceptor.to_le_bytes());
    out.extend_from_slice(&dialer.to_le_bytes());
    out.extend_from_slice(nonce);
    out.extend_from_slice(proof);
    record::finish(out, start);
}

/// Appends the dialer's proof, framed.
pub fn encode_dialer_proof(out: &mut Vec<u8>, proof: &[u8; TAG_BYTES]) {
    let start = head(out, KIND_DIALER_PROOF);
    out.extend_from_slice(proof);
    record::finish(out, start);
}

/// The whole frame's size (head included) for a body of `body` bytes.
pub const fn framed(body: usize) -> usize {
    record::HEAD_BYTES + body
}

/// Reads the frame of `body_len` bytes expected at the start of `buf`:
/// `Ok(None)` while bytes are missing, the frame once they are all there.
/// A length field other than `body_len`, a crc mismatch or a body that
/// is not that frame is refused at once (a handshake frame has one size).
pub fn read_frame(buf: &[u8], body_len: usize) -> Result<Option<Frame>, Refused> {
    if let Some(h) = buf.get(..4) {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len != body_len {
            return Err(Refused::NotHandshake);
        }
    }
    if buf.len() < framed(body_len) {
        return Ok(None);
    }
    match record::read(&buf[..framed(body_len)], 0) {
        Ok(Some((body, _))) => decode(body).map(Some),
        _ => Err(Refused::NotHandshake),
    }
}

fn u64_at(b: &[u8], at: usize) -> NodeId {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn array_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut x = [0u8; N];
    x.copy_from_slice(&b[at..at + N]);
    x
}

/// Decodes one handshake body.
pub fn decode(body: &[u8]) -> Result<Frame, Refused> {
    if body.len() < 6 || body[..4] != MAGIC {
        return Err(Refused::NotHandshake);
    }
    if body[4] != VERSION {
        return Err(Refused::Version(body[4]));
    }
    match (body[5], body.len()) {
        (KIND_DIALER_HELLO, DIALER_HELLO_BYTES) => Ok(Frame::DialerHello {
            dialer: u64_at(body, 6),
            acceptor: u64_at(body, 14),
            nonce: array_at(body, 22),
        }),
        (KIND_ACCEPTOR_HELLO, ACCEPTOR_HELLO_BYTES) => Ok(Frame::AcceptorHello {
            acceptor: u64_at(body, 6),
            dialer: u64_at(body, 14),
            nonce: array_at(body, 22),
            proof: array_at(body, 22 + NONCE_BYTES),
        }),
        (KIND_DIALER_PROOF, DIALER_PROOF_BYTES) => Ok(Frame::DialerProof {
            proof: array_at(body, 6),
        }),
        _ => Err(Refused::Unexpected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::raft_msg::{self, Body, Message};
    use crate::crypto::hex;

    fn transcript() -> Transcript {
        Transcript {
            dialer: 1,
            acceptor: 2,
            dialer_nonce: [0x11; NONCE_BYTES],
            acceptor_nonce: [0x22; NONCE_BYTES],
        }
    }

    #[test]
    fn frames_round_trip_at_their_fixed_sizes() {
        let key = ClusterKey::new(b"secret");
        let t = transcript();
        let pa = proof(&key, Role::Acceptor, &t);
        let pd = proof(&key, Role::Dialer, &t);
        let mut out = Vec::new();
        encode_dialer_hello(&mut out, 1, 2, &t.dialer_nonce);
        assert_eq!(out.len(), framed(DIALER_HELLO_BYTES));
        assert_eq!(
            read_frame(&out, DIALER_HELLO_BYTES),
            Ok(Some(Frame::DialerHello {
                dialer: 1,
                acceptor: 2,
                nonce: t.dialer_nonce
            }))
        );
        out.clear();
        encode_acceptor_hello(&mut out, 2, 1, &t.acceptor_nonce, &pa);
        assert_eq!(out.len(), framed(ACCEPTOR_HELLO_BYTES));
        assert_eq!(
            read_frame(&out, ACCEPTOR_HELLO_BYTES),
            Ok(Some(Frame::AcceptorHello {
                acceptor: 2,
                dialer: 1,
                nonce: t.acceptor_nonce,
                proof: pa
            }))
        );
        out.clear();
        encode_dialer_proof(&mut out, &pd);
        assert_eq!(out.len(), framed(DIALER_PROOF_BYTES));
        assert_eq!(
            read_frame(&out, DIALER_PROOF_BYTES),
            Ok(Some(Frame::DialerProof { proof: pd }))
        );
        // Cut short: wait for more.
        assert_eq!(read_frame(&out[..10], DIALER_PROOF_BYTES), Ok(None));
    }

    /// The example of docs/PROTOCOL.md ("Node-to-node trust"), byte for
    /// byte: secret `secret`, node 1 dials node 2, nonces 0x11… and 0x22….
    #[test]
    fn the_documented_example() {
        let key = ClusterKey::new(b"secret");
        let t = transcript();
        let mut out = Vec::new();
        encode_dialer_hello(&mut out, 1, 2, &t.dialer_nonce);
        assert_eq!(
            hex(&out),
            format!(
                "360000004e622a1247425241010101000000000000000200000000000000{}",
                "11".repeat(32)
            )
        );
        let pa = proof(&key, Role::Acceptor, &t);
        assert_eq!(
            hex(&pa),
            "de15550b067c83b57491d4a969b7059dfb0089b68cc2a3bfde6fdb3c9f1229ab"
        );
        out.clear();
        encode_acceptor_hello(&mut out, 2, 1, &t.acceptor_nonce, &pa);
        assert_eq!(
            hex(&out),
            format!(
                "56000000b6eab81047425241010202000000000000000100000000000000{}{}",
                "22".repeat(32),
                hex(&pa)
            )
        );
        let pd = proof(&key, Role::Dialer, &t);
        out.clear();
        encode_dialer_proof(&mut out, &pd);
        assert_eq!(
            hex(&out),
            "260000003443c67d474252410103\
             cc72fc1550300423786f2d14a6fed3f01e82135f8b5b1a839c01d0c2ea19935e"
        );
    }

    #[test]
    fn proofs_depend_on_key_role_ids_and_both_nonces() {
        let key = ClusterKey::new(b"secret");
        let t = transcript();
        let p = proof(&key, Role::Dialer, &t);
        assert!(check(&key, Role::Dialer, &t, &p));
        assert!(!check(&key, Role::Acceptor, &t, &p), "roles differ");
        assert!(!check(&ClusterKey::new(b"secreT"), Role::Dialer, &t, &p));
        let variants = [
            Transcript { dialer: 3, ..t },
            Transcript { acceptor: 3, ..t },
            Transcript {
                dialer_nonce: [0x12; NONCE_BYTES],
                ..t
            },
            Transcript {
                acceptor_nonce: [0x23; NONCE_BYTES],
                ..t
            },
        ];
        for v in variants {
            assert!(!check(&key, Role::Dialer, &v, &p), "{v:?}");
        }
    }

    #[test]
    fn a_raft_frame_or_garbage_is_not_a_handshake() {
        let m = Message {
            group: 0,
            from: 1,
            to: 2,
            term: 1000,
            body: Body::Heartbeat {
                commit: 0,
                commit_term: 0,
                read_seq: 0,
            },
        };
        let mut body = Vec::new();
        raft_msg::encode(&mut body, &m);
        let mut framed_msg = Vec::new();
        record::encode(&mut framed_msg, &body);
        assert_eq!(
            read_frame(&framed_msg, DIALER_HELLO_BYTES),
            Err(Refused::NotHandshake)
        );
        assert_eq!(
            read_frame(b"GET / HTTP/1.1\r\n", DIALER_HELLO_BYTES),
            Err(Refused::NotHandshake)
        );
        // The right length with a bad crc.
        let mut out = Vec::new();
        encode_dialer_hello(&mut out, 1, 2, &[0; NONCE_BYTES]);
        out[20] ^= 1;
        assert_eq!(
            read_frame(&out, DIALER_HELLO_BYTES),
            Err(Refused::NotHandshake)
        );
        // Another version, and a proof where a hello is due.
        let mut v2 = Vec::new();
        encode_dialer_hello(&mut v2, 1, 2, &[0; NONCE_BYTES]);
        v2[8 + 4] = 2;
        let start = 0;
        let crc = crc32fast::hash(&v2[8..]);
        v2[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            read_frame(&v2, DIALER_HELLO_BYTES),
            Err(Refused::Version(2))
        );
        let mut p = Vec::new();
        encode_dialer_proof(&mut p, &[0; TAG_BYTES]);
        assert_eq!(decode(&p[8..]), Ok(Frame::DialerProof { proof: [0; 32] }));
        assert_eq!(
            read_frame(&p, DIALER_HELLO_BYTES),
            Err(Refused::NotHandshake),
            "wrong size for this step"
        );
    }
}
