//! Giving memory that a burst freed back to the system. glibc's allocator
//! keeps freed heap memory for reuse, and it can only shrink the heap from
//! its top: memory freed below a chunk that is still in use (a client that
//! connected during the burst, a table that grew) stays resident for good.
//! `malloc_trim(0)` also hands back the free pages inside the heap.
//!
//! The trimmer takes that job over from glibc's own heuristics. Left to
//! them, a connection's output buffer that grows past the mmap threshold
//! is mapped and unmapped afresh each time it fills and drains, and a
//! heap top freed past the trim threshold is returned and faulted back in
//! a moment later: under fan-out that was a page fault every few
//! deliveries and half of the loop's system time. [`Trimmer::new`] raises
//! both thresholds (`mallopt`), so buffers are reused from the heap, and
//! memory still goes back once a burst is over, by the rule below.
//!
//! The event loop asks [`Trimmer::turn`] once per turn. At most once a
//! second it reads how much the allocator holds free (`mallinfo2`), and
//! trims when that grew by [`TRIM_FREED_MIN`] or more since the last look
//! after a trim; a loop that frees nothing never trims. The glibc
//! functions are declared here, as the signal handling declares `signal`;
//! the binaries link glibc statically, which has all three.

use std::time::{Duration, Instant};

/// How often the allocator's free memory is looked at, at most.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Newly freed bytes that make a trim worth its cost. Under steady load
/// buffers come and go by a few MiB; this keeps such churn from trimming
/// every second while a burst's end still trims at once.
pub const TRIM_FREED_MIN: usize = 8 << 20;
/// Blocks up to this size come from the heap rather than their own
/// mapping (glibc's largest allowed value on 64-bit).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// glibc returns a free heap top by itself only past this size; below it
/// [`Trimmer::turn`] decides.
const TRIM_THRESHOLD: i32 = 64 << 20;
/// `mallopt` parameters (glibc's malloc.h).
const M_TRIM_THRESHOLD: i32 = -1;
const M_MMAP_THRESHOLD: i32 = -3;

/// glibc's `struct mallinfo2` (glibc 2.33 and later).
#[repr(C)]
#[derive(Default)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    /// Bytes in free chunks (resident or not).
    fordblks: usize,
    keepcost: usize,
}

extern "C" {
    /// `int malloc_trim(size_t pad)`.
    fn malloc_trim(pad: usize) -> i32;
    /// `struct mallinfo2 mallinfo2(void)`.
    fn mallinfo2() -> MallInfo2;
    /// `int mallopt(int param, int value)`.
    fn mallopt(param: i32, value: i32) -> i32;
}

/// Raises glibc's mmap and trim thresholds; false if it refused either.
fn take_over_returning() -> bool {
    // SAFETY: mallopt only sets allocator parameters under its own lock;
    // both values are within glibc's documented ranges.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

/// Bytes the allocator holds in free chunks, over all its arenas.
fn free_bytes() -> usize {
    // SAFETY: glibc's mallinfo2 takes no arguments and returns the struct
    // by value; it only reads the allocator's state under its locks.
    unsafe { mallinfo2() }.fordblks
}

/// Returns the allocator's free pages to the system.
fn trim() {
    // SAFETY: malloc_trim(0) is safe to call at any time from any thread;
    // it takes the allocator's locks itself.
    unsafe {
        malloc_trim(0);
    }
}

/// When to trim: rate-limited, and only after something was freed.
#[derive(Debug)]
pub struct Trimmer {
    next_look: Instant,
    /// The least free memory seen since the last trim (what was reused
    /// lowers it; what is freed after raises the reading above it).
    low: usize,
    /// Connections closed since the last look: the loop wakes for the
    /// next look rather than waiting for other work.
    armed: bool,
    pub trims: u64,
}

impl Trimmer {
    pub fn new(now: Instant) -> Trimmer {
        if !take_over_returning() {
            crate::log_warn!("the allocator refused its thresholds; buffers may fault in afresh");
        }
        Trimmer {
            next_look: now + TRIM_EVERY,
            low: free_bytes(),
            armed: false,
            trims: 0,
        }
    }

    /// Something large may have been freed (a connection closed).
    pub fn arm(&mut self) {
        self.armed = true;
    }

    /// When the loop should wake for the next look, if one is wanted.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.armed.then_some(self.next_look)
    }

    /// Once per loop turn; trims when a look is due and enough was freed.
    /// The time the trim took, if it trimmed.
    pub fn turn(&mut self, now: Instant) -> Option<Duration> {
        if now < self.next_look {
            return None;
        }
        self.next_look = now + TRIM_EVERY;
        self.armed = false;
        let free = free_bytes();
        if !should_trim(free, &mut self.low) {
            return None;
        }
        let started = Instant::now();
        trim();
        self.trims += 1;
        Some(started.elapsed())
    }
}

/// The rule: trim when `free` is at least [`TRIM_FREED_MIN`] above the
/// lowest reading since the last trim; `low` follows the readings.
fn should_trim(free: usize, low: &mut usize) -> bool {
    if free >= low.saturating_add(TRIM_FREED_MIN) {
        *low = free;
        return true;
    }
    *low = (*low).min(free);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_enough_was_freed() {
        let mut low = 10 << 20;
        assert!(!should_trim(15 << 20, &mut low), "5 MiB freed: not yet");
        assert_eq!(low, 10 << 20);
        assert!(should_trim(19 << 20, &mut low), "9 MiB freed");
        assert!(!should_trim(19 << 20, &mut low), "nothing new since");
        assert!(!should_trim(2 << 20, &mut low), "reused");
        assert_eq!(low, 2 << 20);
        assert!(should_trim(11 << 20, &mut low), "freed again after reuse");
    }

    /// A block past glibc's default mmap threshold (128 KiB) that the test
    /// thread's arena can hold: a thread's heaps are at most 64 MiB on
    /// 64-bit hosts but 1 MiB on 32-bit ones (armv7), where anything larger
    /// is mapped whatever the threshold. The broker's loop runs on the main
    /// thread, whose heap has no such bound.
    #[cfg(target_pointer_width = "64")]
    const BLOCK: usize = 16 << 20;
    #[cfg(target_pointer_width = "32")]
    const BLOCK: usize = 512 << 10;

    #[test]
    fn large_buffers_come_from_the_heap() {
        assert!(take_over_returning(), "glibc took both thresholds");
        // Without the new threshold the block would be a mapping of its
        // own while it lives.
        let mapped = || unsafe { mallinfo2() }.hblkhd;
        let before = mapped();
        let block = std::hint::black_box(vec![1u8; BLOCK]);
        assert_eq!(mapped(), before, "no mapping of its own");
        drop(std::hint::black_box(block));
    }

    #[test]
    fn looks_at_most_once_per_interval_and_disarms() {
        let start = Instant::now();
        let mut t = Trimmer::new(start);
        assert!(t.turn(start).is_none(), "not due yet");
        t.arm();
        assert_eq!(t.next_deadline(), Some(start + TRIM_EVERY));
        // Free a good amount of small chunks the allocator keeps.
        let chunks: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 4000]).collect();
        drop(chunks);
        t.turn(start + TRIM_EVERY);
        assert_eq!(t.next_deadline(), None, "disarmed after a look");
        assert!(t.turn(start + TRIM_EVERY).is_none(), "rate-limited");
    }
}
