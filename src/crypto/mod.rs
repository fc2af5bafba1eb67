//! The few cryptographic pieces node-to-node trust needs, written out
//! here (a few hundred lines, no runtime crate): SHA-256 ([`sha256`]),
//! HMAC-SHA256 ([`hmac`]) and fresh random bytes from the operating
//! system ([`random_bytes`]). Tags and tokens are compared in constant time
//! ([`token_eq`]).

pub mod hmac;
pub mod sha256;

use std::io::Read;

/// Fills `buf` from the kernel's random source (`/dev/urandom`). There is
/// no fallback: a nonce that is not random would let a recorded
/// exchange be replayed, so failing is better.
pub fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Compares secrets in time that does not depend on where they differ.
pub fn token_eq(given: &[u8], expected: &[u8]) -> bool {
    // Walk all of `expected` whatever `given` holds; a length mismatch is
    // folded into the same accumulator.
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(!e) ^ e;
    }
    diff == 0
}

/// Lower-case hex of `bytes` (tests and docs examples).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(token_eq(b"secret", b"secret"));
        assert!(!token_eq(b"secreT", b"secret"));
        assert!(!token_eq(b"secret1", b"secret"));
        assert!(!token_eq(b"secre", b"secret"));
        assert!(!token_eq(b"", b"secret"));
        assert!(token_eq(b"", b""));
    }

    #[test]
    fn random_bytes_differ_between_calls() {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        random_bytes(&mut a).unwrap();
        random_bytes(&mut b).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 32]);
    }

    #[test]
    fn hex_is_lower_case_and_two_digits_per_byte() {
        assert_eq!(hex(&[0, 0xab, 7]), "00ab07");
    }
}
