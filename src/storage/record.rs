//! Record framing shared by every append-only file gombus writes (stream
//! segments, the durable Raft log, state files): a record is
//!
//! ```text
//! u32 LE  body length
//! u32 LE  crc32 (IEEE) of the body
//! body    `length` bytes, meaning chosen by the file's owner
//! ```
//!
//! Pure: encodes into a `Vec` and decodes from a byte slice. Reading a file
//! back is a walk with [`read`] from offset 0; the first [`Bad`] answer
//! marks where the valid prefix ends (a torn tail or corruption, which of
//! the two is the caller's judgement: it knows what was fsynced).

/// Bytes before the body: length and crc.
pub const HEAD_BYTES: usize = 8;

/// Largest body a record may hold (a bound on what a corrupt length field
/// can make a reader allocate or skip).
pub const BODY_BYTES_MAX: usize = 256 << 20;

/// Why the bytes at an offset are not a whole, valid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// The buffer ends inside the head or the body (a torn write).
    Short,
    /// The length field is beyond [`BODY_BYTES_MAX`].
    Length(u32),
    /// The body does not match its crc.
    Crc,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Short => write!(f, "record cut short"),
            Bad::Length(n) => write!(f, "record length {n} out of bounds"),
            Bad::Crc => write!(f, "record crc mismatch"),
        }
    }
}

/// Starts a record at the end of `out`: reserves its head and returns the
/// offset to hand to [`finish`] once the body has been appended.
pub fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEAD_BYTES]);
    start
}

/// Fills in the head of the record started at `start` (length and crc of
/// everything appended since).
pub fn finish(out: &mut [u8], start: usize) {
    let body = &out[start + HEAD_BYTES..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends one whole record holding `body`.
pub fn encode(out: &mut Vec<u8>, body: &[u8]) {
    let start = begin(out);
    out.extend_from_slice(body);
    finish(out, start);
}

/// The record at `at`: `Ok(None)` at exactly the end of `buf`,
/// `Ok(Some((body, next)))` for a valid record, `Err` otherwise.
pub fn read(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, Bad> {
    if at == buf.len() {
        return Ok(None);
    }
    let head = buf.get(at..at + HEAD_BYTES).ok_or(Bad::Short)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len as usize > BODY_BYTES_MAX {
        return Err(Bad::Length(len));
    }
    let start = at + HEAD_BYTES;
    let end = start + len as usize;
    let body = buf.get(start..end).ok_or(Bad::Short)?;
    if crc32fast::hash(body) != crc {
        return Err(Bad::Crc);
    }
    Ok(Some((body, end)))
}

/// Walks `buf` from offset 0: the bodies of the valid prefix, the offset
/// where it ends, and why it ends there (`None`: at the end of `buf`).
pub fn scan(buf: &[u8]) -> (Vec<&[u8]>, usize, Option<Bad>) {
    let mut bodies = Vec::new();
    let mut at = 0;
    loop {
        match read(buf, at) {
            Ok(None) => return (bodies, at, None),
            Ok(Some((body, next))) => {
                bodies.push(body);
                at = next;
            }
            Err(bad) => return (bodies, at, Some(bad)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        encode(&mut out, b"hello");
        let start = begin(&mut out);
        out.extend_from_slice(b"");
        finish(&mut out, start);
        encode(&mut out, &[7; 300]);
        let (bodies, end, bad) = scan(&out);
        assert_eq!(bodies, vec![&b"hello"[..], &b""[..], &[7u8; 300][..]]);
        assert_eq!(end, out.len());
        assert_eq!(bad, None);
    }

    #[test]
    fn known_bytes() {
        // crc32("hello") = 0x3610a686 (IEEE, as zlib and gzip compute it).
        let mut out = Vec::new();
        encode(&mut out, b"hello");
        assert_eq!(
            out,
            [5, 0, 0, 0, 0x86, 0xa6, 0x10, 0x36, b'h', b'e', b'l', b'l', b'o']
        );
    }

    #[test]
    fn every_cut_of_the_last_record_is_short() {
        let mut out = Vec::new();
        encode(&mut out, b"first");
        let keep = out.len();
        encode(&mut out, b"second record");
        for cut in keep + 1..out.len() {
            let (bodies, end, bad) = scan(&out[..cut]);
            assert_eq!(bodies, vec![&b"first"[..]], "cut at {cut}");
            assert_eq!(end, keep);
            assert_eq!(bad, Some(Bad::Short));
        }
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let mut out = Vec::new();
        encode(&mut out, b"first");
        let keep = out.len();
        encode(&mut out, b"second record");
        for i in keep..out.len() {
            let mut bytes = out.clone();
            bytes[i] ^= 0x40;
            let (bodies, end, bad) = scan(&bytes);
            assert_eq!(bodies.len(), 1, "flip at {i}");
            assert_eq!(end, keep);
            assert!(bad.is_some());
        }
    }

    #[test]
    fn absurd_length_is_refused() {
        let mut out = vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        out.extend_from_slice(&[0; 16]);
        assert_eq!(read(&out, 0), Err(Bad::Length(u32::MAX)));
    }
}
