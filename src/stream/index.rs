//! The index file of a sealed segment, `{first_seq:020}.idx`: everything
//! opening the store needs from the segment (each message's seq, offset,
//! length, subject and time; its removals) without reading the segment.
//! Pure: encodes into a `Vec`, decodes from a slice.
//!
//! One record ([`crate::storage::record`] framing) whose body is (little-endian):
//!
//! ```text
//! u8 version (3)
//! u64 segment length, u64 offset of its last record, u32 that record's crc,
//! u64 first_seq, u64 largest Synced mark, u64 Span end (0: none)
//! u32 n, n × (u16 length, subject)               the subject table
//! u32 n, n × (u64 seq, u32 offset, u32 length, u32 subject, u64 time_ms)
//! u32 n, n × (u32 messages before it, u8 kind (3 remove, 4 floor,
//!             6 truncate), u64 seq)                  in file order
//! ```
//!
//! Each removal keeps its place among the messages, so loading from the
//! index applies the records in the segment's own order.
//!
//! The index is trusted only when the segment's length and the crc of its
//! last record match what the index says; otherwise (or when it is
//! missing or fails its crc) the segment is scanned and the index written
//! again. Index files are not fsynced: a lost or torn one is rebuilt.

use super::segment::{KIND_FLOOR, KIND_REMOVE, KIND_TRUNCATE};
use crate::storage::record;

const VERSION: u8 = 3;

/// One message of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdxMsg {
    pub seq: u64,
    pub off: u32,
    pub len: u32,
    /// Index into [`Summary::subjects`].
    pub subj: u32,
    pub time_ms: u64,
}

/// A removal record of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Remove(u64),
    Floor(u64),
    Truncate(u64),
}

/// A removal and how many of the segment's messages come before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedOp {
    pub after: u32,
    pub op: Op,
}

/// What an index file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub seg_len: u64,
    pub last_off: u64,
    pub last_crc: u32,
    pub first_seq: u64,
    pub synced: u64,
    /// The end of a compacted segment's span (0 when it has none).
    pub span: u64,
    pub subjects: Vec<String>,
    pub msgs: Vec<IdxMsg>,
    pub ops: Vec<PlacedOp>,
}

impl Summary {
    /// The subject id for `name`, adding it (`ids` maps names to ids while
    /// building).
    pub fn subject_id(
        &mut self,
        ids: &mut std::collections::HashMap<String, u32>,
        name: &str,
    ) -> u32 {
        if let Some(&id) = ids.get(name) {
            return id;
        }
        let id = self.subjects.len() as u32;
        self.subjects.push(name.to_string());
        ids.insert(name.to_string(), id);
        id
    }
}

/// The framed index file, or `None` when it would exceed one record.
pub fn encode(s: &Summary) -> Option<Vec<u8>> {
    let subjects: usize = s.subjects.iter().map(|n| 2 + n.len()).sum();
    let size = 1 + 8 * 5 + 4 + 12 + subjects + s.msgs.len() * 28 + s.ops.len() * 13;
    if size > record::BODY_BYTES_MAX {
        return None;
    }
    let mut out = Vec::with_capacity(size + record::HEAD_BYTES);
    let start = record::begin(&mut out);
    out.push(VERSION);
    out.extend_from_slice(&s.seg_len.to_le_bytes());
    out.extend_from_slice(&s.last_off.to_le_bytes());
    out.extend_from_slice(&s.last_crc.to_le_bytes());
    out.extend_from_slice(&s.first_seq.to_le_bytes());
    out.extend_from_slice(&s.synced.to_le_bytes());
    out.extend_from_slice(&s.span.to_le_bytes());
    out.extend_from_slice(&(s.subjects.len() as u32).to_le_bytes());
    for n in &s.subjects {
        out.extend_from_slice(&(n.len() as u16).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    out.extend_from_slice(&(s.msgs.len() as u32).to_le_bytes());
    for m in &s.msgs {
        out.extend_from_slice(&m.seq.to_le_bytes());
        out.extend_from_slice(&m.off.to_le_bytes());
        out.extend_from_slice(&m.len.to_le_bytes());
        out.extend_from_slice(&m.subj.to_le_bytes());
        out.extend_from_slice(&m.time_ms.to_le_bytes());
    }
    out.extend_from_slice(&(s.ops.len() as u32).to_le_bytes());
    for p in &s.ops {
        let (kind, seq) = match p.op {
            Op::Remove(q) => (KIND_REMOVE, q),
            Op::Floor(q) => (KIND_FLOOR, q),
            Op::Truncate(q) => (KIND_TRUNCATE, q),
        };
        out.extend_from_slice(&p.after.to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&seq.to_le_bytes());
    }
    record::finish(&mut out, start);
    Some(out)
}

/// A cursor over the body; every read is bounds-checked.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    /// A count of items of `each` bytes that must fit in what is left.
    fn count(&mut self, each: usize) -> Option<usize> {
        let n = self.u32()? as usize;
        (n.checked_mul(each)? <= self.0.len()).then_some(n)
    }
}

/// Decodes an index file; `None` for anything but one valid, well-formed
/// record whose messages have known subjects and seqs in the order the
/// store writes them (ascending, but after a Truncate).
pub fn decode(file: &[u8]) -> Option<Summary> {
    let (body, end) = record::read(file, 0).ok()??;
    if end != file.len() {
        return None;
    }
    let mut c = Cur(body);
    if c.u8()? != VERSION {
        return None;
    }
    let mut s = Summary {
        seg_len: c.u64()?,
        last_off: c.u64()?,
        last_crc: c.u32()?,
        first_seq: c.u64()?,
        synced: c.u64()?,
        span: c.u64()?,
        ..Summary::default()
    };
    let n = c.count(2)?;
    for _ in 0..n {
        let len = c.u16()? as usize;
        let name = std::str::from_utf8(c.take(len)?).ok()?;
        s.subjects.push(name.to_string());
    }
    let n = c.count(28)?;
    for _ in 0..n {
        let m = IdxMsg {
            seq: c.u64()?,
            off: c.u32()?,
            len: c.u32()?,
            subj: c.u32()?,
            time_ms: c.u64()?,
        };
        if m.subj as usize >= s.subjects.len() {
            return None;
        }
        if u64::from(m.off) + u64::from(m.len) > s.seg_len {
            return None;
        }
        s.msgs.push(m);
    }
    let n = c.count(13)?;
    for _ in 0..n {
        let after = c.u32()?;
        let kind = c.u8()?;
        let seq = c.u64()?;
        let op = match kind {
            KIND_REMOVE => Op::Remove(seq),
            KIND_FLOOR => Op::Floor(seq),
            KIND_TRUNCATE => Op::Truncate(seq),
            _ => return None,
        };
        s.ops.push(PlacedOp { after, op });
    }
    (c.0.is_empty() && in_order(&s) && span_holds(&s)).then_some(s)
}

/// Whether a compacted segment's messages lie inside its span.
fn span_holds(s: &Summary) -> bool {
    s.span == 0 || (s.span > s.first_seq && s.msgs.iter().all(|m| m.seq < s.span))
}

/// Whether the messages and removals, replayed in order, follow the
/// store's rules: each seq at least the next one expected, removals placed
/// in order among the messages.
fn in_order(s: &Summary) -> bool {
    let mut next = s.first_seq;
    let mut ops = s.ops.iter().peekable();
    let mut placed = 0;
    for (i, m) in s.msgs.iter().enumerate() {
        while let Some(p) = ops.next_if(|p| p.after as usize <= i) {
            if p.after < placed {
                return false;
            }
            placed = p.after;
            next = after_op(next, p.op);
        }
        if m.seq < next {
            return false;
        }
        // No message is ever stored at u64::MAX: nothing could follow it.
        let Some(after) = m.seq.checked_add(1) else {
            return false;
        };
        next = after;
    }
    ops.all(|p| {
        let ok = p.after >= placed && p.after as usize <= s.msgs.len();
        placed = p.after;
        ok
    })
}

/// The next seq expected after a removal record.
fn after_op(next: u64, op: Op) -> u64 {
    match op {
        Op::Remove(_) => next,
        Op::Floor(q) => next.max(q),
        Op::Truncate(q) => q.min(next),
    }
}

/// The index file name of the segment whose first sequence is `first_seq`.
pub fn file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.idx")
}

/// The first sequence an index file name stands for, if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".idx")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        let mut s = Summary {
            seg_len: 4000,
            last_off: 3900,
            last_crc: 0xdead_beef,
            first_seq: 10,
            synced: 1200,
            span: 40,
            ..Summary::default()
        };
        let mut ids = std::collections::HashMap::new();
        for (i, subj) in ["a", "b.c", "a"].iter().enumerate() {
            let id = s.subject_id(&mut ids, subj);
            s.msgs.push(IdxMsg {
                seq: 10 + i as u64,
                off: 20 + 100 * i as u32,
                len: 90,
                subj: id,
                time_ms: 1000 + i as u64,
            });
        }
        s.ops = vec![
            PlacedOp {
                after: 0,
                op: Op::Remove(3),
            },
            PlacedOp {
                after: 2,
                op: Op::Floor(11),
            },
            PlacedOp {
                after: 3,
                op: Op::Remove(12),
            },
        ];
        s
    }

    #[test]
    fn names() {
        assert_eq!(file_name(42), "00000000000000000042.idx");
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(parse_name("00000000000000000042.seg"), None);
        assert_eq!(parse_name("42.idx"), None);
    }

    #[test]
    fn round_trip() {
        let s = sample();
        assert_eq!(s.subjects, vec!["a", "b.c"]);
        let bytes = encode(&s).unwrap();
        assert_eq!(decode(&bytes), Some(s));
    }

    #[test]
    fn damaged_or_inconsistent_files_are_refused() {
        let bytes = encode(&sample()).unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert_eq!(decode(&b), None, "flip at {i}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode(&long), None);
        // Well framed but out of order.
        let mut s = sample();
        s.msgs.swap(0, 1);
        assert_eq!(decode(&encode(&s).unwrap()), None);
        let mut s = sample();
        s.ops.swap(0, 1);
        assert_eq!(decode(&encode(&s).unwrap()), None);
        // Seqs may go back only after a Truncate.
        let mut s = sample();
        s.msgs[2].seq = 11;
        assert_eq!(decode(&encode(&s).unwrap()), None);
        s.ops.insert(
            2,
            PlacedOp {
                after: 2,
                op: Op::Truncate(11),
            },
        );
        s.ops[3].op = Op::Remove(11);
        let bytes = encode(&s).unwrap();
        assert_eq!(decode(&bytes), Some(s));
        // A message past the span.
        let mut s = sample();
        s.span = 12;
        assert_eq!(decode(&encode(&s).unwrap()), None);
        // A message past the segment's end.
        let mut s = sample();
        s.seg_len = 100;
        assert_eq!(decode(&encode(&s).unwrap()), None);
    }
}
