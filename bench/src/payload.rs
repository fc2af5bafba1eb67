//! Message bodies and delivery bookkeeping. A body is S bytes: the
//! message's sequence number as ten decimal digits, then `x` up to S. A
//! warm-up body starts with `w` instead, so receivers can tell it apart.
//! [`Tally`] records which sequence numbers a receiver saw, which is how
//! loss, copies and reordering are counted.

/// Digits of the sequence number at the head of every body.
pub const DIGITS: usize = 10;

/// A body of `size` bytes (at least [`DIGITS`]) carrying sequence 0.
pub fn body(size: usize) -> Vec<u8> {
    let mut b = vec![b'x'; size.max(DIGITS)];
    stamp(&mut b, 0);
    b
}

/// A warm-up body of `size` bytes.
pub fn warm_body(size: usize) -> Vec<u8> {
    let mut b = vec![b'x'; size.max(DIGITS)];
    b[0] = b'w';
    b
}

/// Writes `seq` as ten digits at the start of `b`.
pub fn stamp(b: &mut [u8], mut seq: u64) {
    for i in (0..DIGITS).rev() {
        b[i] = b'0' + (seq % 10) as u8;
        seq /= 10;
    }
}

/// The sequence number at the head of a body, if it has one.
pub fn seq_of(b: &[u8]) -> Option<u64> {
    if b.len() < DIGITS {
        return None;
    }
    let mut n = 0u64;
    for &c in &b[..DIGITS] {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(c - b'0');
    }
    Some(n)
}

/// Whether a body is a warm-up message.
pub fn is_warm(b: &[u8]) -> bool {
    b.first() == Some(&b'w')
}

/// What one receiver (or a queue group, once merged) saw of N messages
/// numbered 0..N.
#[derive(Debug, Clone)]
pub struct Tally {
    seen: Vec<u64>,
    n: u64,
    pub distinct: u64,
    pub dup: u64,
    pub reordered: u64,
    pub bad: u64,
    highest: Option<u64>,
}

impl Tally {
    pub fn new(n: u64) -> Tally {
        Tally {
            seen: vec![0; n.div_ceil(64) as usize],
            n,
            distinct: 0,
            dup: 0,
            reordered: 0,
            bad: 0,
            highest: None,
        }
    }

    /// Records one delivery of body `b`.
    pub fn note(&mut self, b: &[u8]) {
        match seq_of(b) {
            Some(s) if s < self.n => self.note_seq(s),
            _ => self.bad += 1,
        }
    }

    pub fn note_seq(&mut self, s: u64) {
        let (w, bit) = ((s / 64) as usize, 1u64 << (s % 64));
        if self.seen[w] & bit != 0 {
            self.dup += 1;
            return;
        }
        self.seen[w] |= bit;
        self.distinct += 1;
        match self.highest {
            Some(h) if s < h => self.reordered += 1,
            _ => self.highest = Some(s),
        }
    }

    /// Adds another member's tally (queue groups): a number both saw is a
    /// copy. Order is judged per member, before merging.
    pub fn merge(&mut self, o: &Tally) {
        for (a, b) in self.seen.iter_mut().zip(&o.seen) {
            self.dup += u64::from((*a & *b).count_ones());
            *a |= *b;
        }
        self.distinct = self.seen.iter().map(|w| u64::from(w.count_ones())).sum();
        self.dup += o.dup;
        self.reordered += o.reordered;
        self.bad += o.bad;
    }

    pub fn complete(&self) -> bool {
        self.distinct == self.n
    }

    pub fn lost(&self) -> u64 {
        self.n - self.distinct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_and_read_back() {
        let mut b = body(32);
        assert_eq!(b.len(), 32);
        stamp(&mut b, 4_294_967_296);
        assert_eq!(&b[..12], b"4294967296xx");
        assert_eq!(seq_of(&b), Some(4_294_967_296));
        assert_eq!(seq_of(b"12345"), None);
        assert_eq!(seq_of(&warm_body(16)), None);
        assert!(is_warm(&warm_body(16)));
        assert_eq!(body(3).len(), DIGITS);
    }

    #[test]
    fn tally_counts_loss_copies_and_order() {
        let mut t = Tally::new(5);
        for s in [0, 2, 1, 2, 4] {
            t.note_seq(s);
        }
        t.note(b"junk");
        assert_eq!(
            (t.distinct, t.dup, t.reordered, t.bad, t.lost()),
            (4, 1, 1, 1, 1)
        );
        assert!(!t.complete());
    }

    #[test]
    fn merged_queue_members_cover_each_message_once() {
        let (mut a, mut b) = (Tally::new(130), Tally::new(130));
        for s in 0..130 {
            if s % 2 == 0 {
                a.note_seq(s)
            } else {
                b.note_seq(s)
            }
        }
        a.merge(&b);
        assert!(a.complete());
        assert_eq!((a.dup, a.reordered), (0, 0));
        let mut c = Tally::new(130);
        c.note_seq(129);
        a.merge(&c);
        assert_eq!(a.dup, 1);
    }
}
