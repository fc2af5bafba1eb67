//! HMAC-SHA256 as RFC 2104 defines it, over [`super::sha256`]: a keyed
//! hasher ([`HmacSha256`]), a one-shot [`mac`], and [`verify`], which
//! compares a received tag in constant time. Checked against every
//! HMAC-SHA256 case of RFC 4231 in the tests below.

use super::sha256::{self, Sha256, BLOCK_BYTES, DIGEST_BYTES};

/// Bytes in a tag.
pub const TAG_BYTES: usize = DIGEST_BYTES;

const IPAD: u8 = 0x36;
const OPAD: u8 = 0x5c;

/// An HMAC-SHA256 computation in progress.
#[derive(Clone)]
pub struct HmacSha256 {
    inner: Sha256,
    /// The key XOR opad, kept for the outer hash.
    outer_key: [u8; BLOCK_BYTES],
}

impl HmacSha256 {
    /// Starts a MAC under `key`. A key longer than a block is hashed
    /// first; a shorter one is padded with zeros (RFC 2104, section 2).
    pub fn new(key: &[u8]) -> HmacSha256 {
        let mut k = [0u8; BLOCK_BYTES];
        if key.len() > BLOCK_BYTES {
            k[..DIGEST_BYTES].copy_from_slice(&sha256::digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let mut inner_key = [0u8; BLOCK_BYTES];
        let mut outer_key = [0u8; BLOCK_BYTES];
        for i in 0..BLOCK_BYTES {
            inner_key[i] = k[i] ^ IPAD;
            outer_key[i] = k[i] ^ OPAD;
        }
        let mut inner = Sha256::new();
        inner.update(&inner_key);
        HmacSha256 { inner, outer_key }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.inner.update(data);
    }

    /// H((K ^ opad) || H((K ^ ipad) || message)).
    pub fn finish(self) -> [u8; TAG_BYTES] {
        let inner = self.inner.finish();
        let mut outer = Sha256::new();
        outer.update(&self.outer_key);
        outer.update(&inner);
        outer.finish()
    }
}

/// The tag of `data` under `key`.
pub fn mac(key: &[u8], data: &[u8]) -> [u8; TAG_BYTES] {
    let mut h = HmacSha256::new(key);
    h.update(data);
    h.finish()
}

/// Whether `given` is the tag `expected`, compared in time that does not
/// depend on where they differ.
pub fn verify(given: &[u8], expected: &[u8; TAG_BYTES]) -> bool {
    super::token_eq(given, expected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::hex;

    /// RFC 4231, section 4: (key, data, expected tag in hex).
    fn case(key: &[u8], data: &[u8], want: &str) {
        let tag = mac(key, data);
        let n = want.len() / 2;
        assert_eq!(hex(&tag[..n]), want);
        // Fed a byte at a time, the same tag.
        let mut h = HmacSha256::new(key);
        for b in data {
            h.update(std::slice::from_ref(b));
        }
        assert_eq!(h.finish(), tag);
    }

    #[test]
    fn rfc4231_case_1() {
        case(
            &[0x0b; 20],
            b"Hi There",
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        );
    }

    #[test]
    fn rfc4231_case_2_key_shorter_than_the_tag() {
        case(
            b"Jefe",
            b"what do ya want for nothing?",
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        );
    }

    #[test]
    fn rfc4231_case_3() {
        case(
            &[0xaa; 20],
            &[0xdd; 50],
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        );
    }

    #[test]
    fn rfc4231_case_4() {
        let key: Vec<u8> = (1..=25).collect();
        case(
            &key,
            &[0xcd; 50],
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        );
    }

    #[test]
    fn rfc4231_case_5_truncated_to_128_bits() {
        case(
            &[0x0c; 20],
            b"Test With Truncation",
            "a3b6167473100ee06e0c796c2955552b",
        );
    }

    #[test]
    fn rfc4231_case_6_key_larger_than_a_block() {
        case(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        );
    }

    #[test]
    fn rfc4231_case_7_key_and_data_larger_than_a_block() {
        case(
            &[0xaa; 131],
            b"This is a test using a larger than block-size key and a larger than \
              block-size data. The key needs to be hashed before being used by the \
              HMAC algorithm.",
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        );
    }

    #[test]
    fn verify_takes_only_the_exact_tag() {
        let tag = mac(b"k", b"m");
        assert!(verify(&tag, &tag));
        let mut bad = tag;
        bad[31] ^= 1;
        assert!(!verify(&bad, &tag));
        assert!(!verify(&tag[..31], &tag));
        assert!(!verify(&[], &tag));
        assert!(!verify(&mac(b"K", b"m"), &tag));
    }
}
