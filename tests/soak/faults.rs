//! The soak's fault bookkeeping: a seeded random source for the schedule,
//! and the log of fault windows the checkers consult to tell a loss the
//! contract allows (across a fault of a node involved) from a violation.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// After a node is healthy again, losses on its paths are still put down
/// to its fault for this long (clients reconnect and subscribe again).
pub const GRACE: Duration = Duration::from_secs(5);

/// splitmix64: small, seedable, good enough for a schedule.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn millis(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_millis(self.range(lo.as_millis() as u64, hi.as_millis() as u64))
    }
}

/// The kinds of fault the schedule injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SIGKILL, down for a while, then started again on its data.
    Kill,
    /// SIGSTOP, then SIGCONT after a bounded time.
    Freeze,
    /// SIGTERM (a clean stop), then started again at once.
    Restart,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill -9",
            Kind::Freeze => "freeze (SIGSTOP)",
            Kind::Restart => "restart (SIGTERM)",
        }
    }
}

struct Window {
    node: usize,
    start: Instant,
    /// When the cluster was healthy again; `None` while the fault lasts.
    end: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    windows: Vec<Window>,
    /// Faults begun per node: a checker notes it when an ack is answered
    /// and compares later.
    epochs: [u64; 3],
}

/// Every fault window so far.
#[derive(Default)]
pub struct FaultLog {
    inner: Mutex<Inner>,
}

impl FaultLog {
    pub fn begin(&self, node: usize) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.epochs[node] += 1;
        g.windows.push(Window {
            node,
            start: Instant::now(),
            end: None,
        });
    }

    /// The fault on `node` is over: the cluster is healthy again.
    pub fn end(&self, node: usize) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = g
            .windows
            .iter_mut()
            .rev()
            .find(|w| w.node == node && w.end.is_none())
        {
            w.end = Some(Instant::now());
        }
    }

    /// How many faults have begun on `node`.
    pub fn epoch(&self, node: usize) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).epochs[node]
    }

    /// True if a fault of one of `nodes` (its window stretched by
    /// [`GRACE`]) overlaps `[from, to]`.
    pub fn touched(&self, nodes: &[usize], from: Instant, to: Instant) -> bool {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.windows.iter().any(|w| {
            nodes.contains(&w.node) && w.start <= to && w.end.is_none_or(|e| e + GRACE >= from)
        })
    }
}
