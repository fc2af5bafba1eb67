//! Non-cryptographic randomness: one seed source and one mixer (SplitMix64)
//! for everything that only needs numbers nobody can usefully predict or
//! that must replay from a seed: Engine.IO session ids, request inbox
//! prefixes, Raft election jitter, reconnect jitter, WebSocket frame masks
//! and the seeded generators of tests. Secrets do not come from here.

use std::io::Read;

/// A seed from the kernel's random source, else from the clock and pid.
pub fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ ((std::process::id() as u64) << 32)
}

/// One step of SplitMix64: advances `state` and returns the next number.
/// Any state works, 0 included; the same state gives the same sequence.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 generator, for callers that keep no other state
/// with it (test drivers, simulations).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next number of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// A number in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs for seed 0, as published with the algorithm.
    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn the_same_seed_replays_and_another_differs() {
        let run = |seed| {
            let mut s = seed;
            (0..8).map(|_| splitmix64(&mut s)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn below_stays_below() {
        let mut rng = SplitMix64(7);
        for n in [1, 2, 3, 10, 1000] {
            assert!((0..200).all(|_| rng.below(n) < n));
        }
    }
}
