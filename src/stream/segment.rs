//! What a stream segment file holds: the bodies of its records (framed by
//! [`crate::storage::record`]) and the file names. Pure: encodes into a `Vec`,
//! decodes from a slice.
//!
//! A segment is named after the first sequence it may hold,
//! `{first_seq:020}.seg`, and is a run of records; the body's first byte
//! says what it is (integers little-endian):
//!
//! ```text
//! 1 Head     u64 first_seq          always the first record of a segment
//! 2 Msg      u64 seq, u64 time_ms, u8 flags (1 binary, 2 has headers),
//!            u16 subject length, subject,
//!            [u32 headers length, headers]   (when flag 2)
//!            data                            (the rest)
//! 3 Remove   u64 seq, ...                    messages removed one by one
//! 4 Floor    u64 seq                         every message below seq is gone
//! 5 Synced   u64 offset                      bytes of this file before
//!                                            offset were fsynced
//! 6 Truncate u64 seq                         every message at or after seq
//!                                            is gone; seq is the next one
//! 7 Span     u64 end                         (compacted segments, right
//!                                            after the head) the file stands
//!                                            for seqs first_seq..end: every
//!                                            message there that it does not
//!                                            hold is gone
//! 8 InLog    u64 file, u64 offset,           (a replica's payload files only)
//!            u32 data length, u32 crc,       a Msg whose data is in file
//!            then a Msg body from its seq    `file` of its group's log at
//!            on, without data                `offset`; crc: the crc of the
//!                                            Msg body it stands for
//! ```
//!
//! Remove, Floor and Truncate records refer to messages of this segment or
//! of earlier ones; they are never needed once those segments are deleted.
//! Truncate (a log's suffix cut, as Raft needs) is the one record after
//! which seqs go back; a stream never writes it. A compacted segment (see
//! [`super::store`]) holds a head, a span, a `Synced` mark covering the
//! whole file, the removal records still needed and its live messages.

use crate::storage::record;

pub const KIND_HEAD: u8 = 1;
pub const KIND_MSG: u8 = 2;
pub const KIND_REMOVE: u8 = 3;
pub const KIND_FLOOR: u8 = 4;
pub const KIND_SYNCED: u8 = 5;
pub const KIND_TRUNCATE: u8 = 6;
pub const KIND_SPAN: u8 = 7;
pub const KIND_IN_LOG: u8 = 8;

/// Bytes of an InLog body before its Msg fields.
const IN_LOG_FIXED_BYTES: usize = 1 + 8 + 8 + 4 + 4;

const FLAG_BINARY: u8 = 1;
const FLAG_HEADERS: u8 = 2;

/// Bytes of a Msg body before the subject.
pub const MSG_FIXED_BYTES: usize = 1 + 8 + 8 + 1 + 2;

/// Longest subject a record can hold.
pub const SUBJECT_BYTES_MAX: usize = u16::MAX as usize;

/// Seqs per Remove record (bounds one record's size at 512 KiB).
pub const REMOVE_SEQS_MAX: usize = 65_536;

/// One decoded record body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec<'a> {
    Head { first_seq: u64 },
    Msg(MsgRef<'a>),
    Remove(Seqs<'a>),
    Floor { seq: u64 },
    Synced { offset: u64 },
    Truncate { seq: u64 },
    Span { end: u64 },
    InLog(InLog<'a>),
}

/// A message whose data is in a file of its group's log (an InLog
/// record): `msg` with empty data, and where its data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InLog<'a> {
    pub msg: MsgRef<'a>,
    /// The log file's number and the data's offset in it.
    pub file: u64,
    pub offset: u64,
    pub len: u32,
    /// The crc of the Msg body this record stands for.
    pub crc: u32,
}

/// The Msg record `m` stands for, had it been written whole: its framed
/// length and its body's crc (computed without copying the data).
pub fn msg_sum(m: &MsgRef<'_>) -> (usize, u32) {
    let mut fields = Vec::with_capacity(MSG_FIXED_BYTES + m.subject.len() + 64);
    put_msg_fields(&mut fields, m);
    let mut h = crc32fast::Hasher::new();
    h.update(&[KIND_MSG]);
    h.update(&fields);
    h.update(m.data);
    (
        record::HEAD_BYTES + 1 + fields.len() + m.data.len(),
        h.finalize(),
    )
}

/// A Msg body's fields after its kind, without the data.
fn put_msg_fields(out: &mut Vec<u8>, m: &MsgRef<'_>) {
    out.extend_from_slice(&m.seq.to_le_bytes());
    out.extend_from_slice(&m.time_ms.to_le_bytes());
    let mut flags = 0;
    if m.binary {
        flags |= FLAG_BINARY;
    }
    if m.headers.is_some() {
        flags |= FLAG_HEADERS;
    }
    out.push(flags);
    out.extend_from_slice(&(m.subject.len() as u16).to_le_bytes());
    out.extend_from_slice(m.subject.as_bytes());
    if let Some(h) = m.headers {
        out.extend_from_slice(&(h.len() as u32).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
    }
}

/// Appends an InLog record for `m`, whose data is at `offset` of log file
/// `file`; its framed length, and the framed length and crc of the Msg
/// record it stands for ([`msg_sum`]).
pub fn put_in_log(
    out: &mut Vec<u8>,
    m: &MsgRef<'_>,
    file: u64,
    offset: u64,
) -> (usize, usize, u32) {
    assert!(m.subject.len() <= SUBJECT_BYTES_MAX);
    let start = record::begin(out);
    out.push(KIND_IN_LOG);
    out.extend_from_slice(&file.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(m.data.len() as u32).to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    put_msg_fields(out, m);
    // The Msg record's crc, from the fields just written (as `msg_sum`).
    let fields = &out[crc_at + 4..];
    let mut h = crc32fast::Hasher::new();
    h.update(&[KIND_MSG]);
    h.update(fields);
    h.update(m.data);
    let crc = h.finalize();
    let msg_len = record::HEAD_BYTES + 1 + fields.len() + m.data.len();
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    record::finish(out, start);
    (out.len() - start, msg_len, crc)
}

/// A stored message, borrowed from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgRef<'a> {
    pub seq: u64,
    pub time_ms: u64,
    pub subject: &'a str,
    pub headers: Option<&'a str>,
    pub data: &'a [u8],
    pub binary: bool,
}

/// The seqs of a Remove record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seqs<'a>(&'a [u8]);

impl Seqs<'_> {
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.chunks_exact(8).map(le64)
    }
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Why a body that passed its crc does not decode (written by a different
/// program, or a bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed record: {}", self.0)
    }
}

/// The framed length [`put_msg`] gives a message: what it counts for
/// in a stream's `bytes` and `max_bytes`.
pub fn msg_record_bytes(subject: &str, headers: Option<&str>, data: &[u8]) -> u64 {
    (record::HEAD_BYTES
        + MSG_FIXED_BYTES
        + subject.len()
        + headers.map_or(0, |h| 4 + h.len())
        + data.len()) as u64
}

/// Appends a whole framed Msg record to `out`; returns its framed length.
/// The caller checks the subject length (≤ [`SUBJECT_BYTES_MAX`]).
pub fn put_msg(out: &mut Vec<u8>, m: &MsgRef<'_>) -> usize {
    assert!(m.subject.len() <= SUBJECT_BYTES_MAX);
    let start = record::begin(out);
    out.push(KIND_MSG);
    put_msg_fields(out, m);
    out.extend_from_slice(m.data);
    record::finish(out, start);
    out.len() - start
}

fn put_u64(out: &mut Vec<u8>, kind: u8, v: u64) {
    let start = record::begin(out);
    out.push(kind);
    out.extend_from_slice(&v.to_le_bytes());
    record::finish(out, start);
}

pub fn put_head(out: &mut Vec<u8>, first_seq: u64) {
    put_u64(out, KIND_HEAD, first_seq);
}

pub fn put_floor(out: &mut Vec<u8>, seq: u64) {
    put_u64(out, KIND_FLOOR, seq);
}

pub fn put_synced(out: &mut Vec<u8>, offset: u64) {
    put_u64(out, KIND_SYNCED, offset);
}

pub fn put_truncate(out: &mut Vec<u8>, seq: u64) {
    put_u64(out, KIND_TRUNCATE, seq);
}

pub fn put_span(out: &mut Vec<u8>, end: u64) {
    put_u64(out, KIND_SPAN, end);
}

/// The framed length of a Head, Floor, Synced, Truncate or Span record.
pub const FIXED_RECORD_BYTES: usize = record::HEAD_BYTES + 1 + 8;

/// Appends Remove records for `seqs` (several when there are more than
/// [`REMOVE_SEQS_MAX`]).
pub fn put_remove(out: &mut Vec<u8>, seqs: &[u64]) {
    for chunk in seqs.chunks(REMOVE_SEQS_MAX) {
        let start = record::begin(out);
        out.push(KIND_REMOVE);
        for s in chunk {
            out.extend_from_slice(&s.to_le_bytes());
        }
        record::finish(out, start);
    }
}

/// Decodes one record body.
pub fn decode(body: &[u8]) -> Result<Rec<'_>, Malformed> {
    let (&kind, rest) = body.split_first().ok_or(Malformed("empty body"))?;
    let one = |rest: &[u8]| -> Result<u64, Malformed> {
        if rest.len() != 8 {
            return Err(Malformed("fixed record of the wrong length"));
        }
        Ok(le64(rest))
    };
    match kind {
        KIND_HEAD => Ok(Rec::Head {
            first_seq: one(rest)?,
        }),
        KIND_FLOOR => Ok(Rec::Floor { seq: one(rest)? }),
        KIND_SYNCED => Ok(Rec::Synced { offset: one(rest)? }),
        KIND_TRUNCATE => Ok(Rec::Truncate { seq: one(rest)? }),
        KIND_SPAN => Ok(Rec::Span { end: one(rest)? }),
        KIND_REMOVE => {
            if rest.len() % 8 != 0 {
                return Err(Malformed("remove record of the wrong length"));
            }
            Ok(Rec::Remove(Seqs(rest)))
        }
        KIND_MSG => decode_msg(body).map(Rec::Msg),
        KIND_IN_LOG => {
            let fixed = body
                .get(..IN_LOG_FIXED_BYTES)
                .ok_or(Malformed("in-log record cut short"))?;
            let u32_at = |at: usize| {
                u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]])
            };
            // The Msg fields, read as a Msg body whose kind byte is the
            // last byte before them.
            let msg = decode_msg(&body[IN_LOG_FIXED_BYTES - 1..])?;
            if !msg.data.is_empty() {
                return Err(Malformed("in-log record with data"));
            }
            Ok(Rec::InLog(InLog {
                msg,
                file: le64(&fixed[1..9]),
                offset: le64(&fixed[9..17]),
                len: u32_at(17),
                crc: u32_at(21),
            }))
        }
        _ => Err(Malformed("unknown record kind")),
    }
}

fn decode_msg(body: &[u8]) -> Result<MsgRef<'_>, Malformed> {
    let short = Malformed("message record cut short");
    if body.len() < MSG_FIXED_BYTES {
        return Err(short);
    }
    let seq = le64(&body[1..9]);
    let time_ms = le64(&body[9..17]);
    let flags = body[17];
    let subject_len = u16::from_le_bytes([body[18], body[19]]) as usize;
    let mut at = MSG_FIXED_BYTES;
    let subject = body.get(at..at + subject_len).ok_or(short)?;
    let subject = std::str::from_utf8(subject).map_err(|_| Malformed("subject not UTF-8"))?;
    at += subject_len;
    let headers = if flags & FLAG_HEADERS != 0 {
        let len = body.get(at..at + 4).ok_or(short)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        at += 4;
        let h = body.get(at..at.saturating_add(len)).ok_or(short)?;
        at += len;
        Some(std::str::from_utf8(h).map_err(|_| Malformed("headers not UTF-8"))?)
    } else {
        None
    };
    Ok(MsgRef {
        seq,
        time_ms,
        subject,
        headers,
        data: &body[at..],
        binary: flags & FLAG_BINARY != 0,
    })
}

/// The file name of the segment whose first sequence is `first_seq`.
pub fn file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

/// The first sequence a segment file name stands for, if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        let mut out = Vec::new();
        put_head(&mut out, 7);
        let m = MsgRef {
            seq: 7,
            time_ms: 1_700_000_000_123,
            subject: "orders.eu",
            headers: Some(r#"{"Msg-Id":"a"}"#),
            data: b"\x00\x01payload",
            binary: true,
        };
        let n = put_msg(&mut out, &m);
        let plain = MsgRef {
            seq: 8,
            time_ms: 5,
            subject: "x",
            headers: None,
            data: b"",
            binary: false,
        };
        let n_plain = put_msg(&mut out, &plain);
        assert_eq!(msg_record_bytes(m.subject, m.headers, m.data), n as u64);
        assert_eq!(msg_record_bytes("x", None, b""), n_plain as u64);
        put_remove(&mut out, &[7, 8]);
        put_floor(&mut out, 9);
        put_synced(&mut out, 40);
        put_truncate(&mut out, 8);
        put_span(&mut out, 30);
        let (bodies, end, bad) = record::scan(&out);
        assert_eq!((end, bad), (out.len(), None));
        assert_eq!(record::HEAD_BYTES + bodies[1].len(), n);
        let recs: Vec<Rec<'_>> = bodies.iter().map(|b| decode(b).unwrap()).collect();
        assert_eq!(recs[0], Rec::Head { first_seq: 7 });
        assert_eq!(recs[1], Rec::Msg(m));
        assert_eq!(recs[2], Rec::Msg(plain));
        match &recs[3] {
            Rec::Remove(s) => assert_eq!(s.iter().collect::<Vec<_>>(), vec![7, 8]),
            other => panic!("{other:?}"),
        }
        assert_eq!(recs[4], Rec::Floor { seq: 9 });
        assert_eq!(recs[5], Rec::Synced { offset: 40 });
        assert_eq!(recs[6], Rec::Truncate { seq: 8 });
        assert_eq!(recs[7], Rec::Span { end: 30 });
        assert_eq!(bodies[7].len() + record::HEAD_BYTES, FIXED_RECORD_BYTES);
    }

    #[test]
    fn large_removals_split() {
        let seqs: Vec<u64> = (1..=(REMOVE_SEQS_MAX as u64 + 3)).collect();
        let mut out = Vec::new();
        put_remove(&mut out, &seqs);
        let (bodies, _, bad) = record::scan(&out);
        assert_eq!(bad, None);
        assert_eq!(bodies.len(), 2);
        let mut all = Vec::new();
        for b in bodies {
            match decode(b).unwrap() {
                Rec::Remove(s) => all.extend(s.iter()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(all, seqs);
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for body in [
            &b""[..],
            &[9, 0, 0],
            &[KIND_HEAD, 1, 2],
            &[KIND_REMOVE, 1, 2, 3],
            &[KIND_MSG, 1, 2, 3],
            // subject length 5 with only 1 byte left
            &[
                KIND_MSG, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, b'a',
            ],
            // headers flag with no length
            &[
                KIND_MSG, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, b'a',
            ],
        ] {
            assert!(decode(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(file_name(1), "00000000000000000001.seg");
        assert_eq!(parse_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_name("1.seg"), None);
        assert_eq!(parse_name("0000000000000000000x.seg"), None);
        assert_eq!(parse_name("00000000000000000001.idx"), None);
    }
}
