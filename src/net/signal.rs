//! SIGTERM and SIGINT: the process's polite stop. The handler only asks
//! the event loop to stop (an atomic store and a wake, both safe in a
//! signal handler); the loop then shuts down in its own time. SIGHUP sets
//! a flag the handler's owner reads at the loop's next wake-up (the
//! broker reloads its users file).
//!
//! `signal(2)` is declared here directly rather than through a crate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::server::Stopper;

const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

extern "C" {
    /// `sighandler_t signal(int signum, sighandler_t handler)`.
    fn signal(signum: i32, handler: usize) -> usize;
}

/// Who the handler tells; set once, before the handler is installed.
static STOPPER: OnceLock<Stopper> = OnceLock::new();

extern "C" fn on_signal(_signum: i32) {
    if let Some(stopper) = STOPPER.get() {
        stopper.stop();
    }
}

/// Makes SIGTERM and SIGINT stop the server behind `stopper`. Only the
/// first call in a process takes effect.
pub fn stop_on_terminate(stopper: Stopper) {
    if STOPPER.set(stopper).is_err() {
        return;
    }
    let handler = on_signal as extern "C" fn(i32) as usize;
    // SAFETY: `signal` is the C library's; the handler only touches a
    // OnceLock that is already set and an eventfd write, both
    // async-signal-safe.
    unsafe {
        signal(SIGTERM, handler);
        signal(SIGINT, handler);
    }
}

/// Who SIGHUP tells: the flag to set and the loop to wake.
static HANGUP: OnceLock<(Arc<AtomicBool>, Stopper)> = OnceLock::new();

extern "C" fn on_hangup(_signum: i32) {
    if let Some((flag, waker)) = HANGUP.get() {
        flag.store(true, Ordering::Release);
        waker.wake();
    }
}

/// Makes SIGHUP set `flag` and wake the loop behind `stopper` (without
/// stopping it). Only the first call in a process takes effect.
pub fn flag_on_hangup(flag: Arc<AtomicBool>, stopper: Stopper) {
    if HANGUP.set((flag, stopper)).is_err() {
        return;
    }
    let handler = on_hangup as extern "C" fn(i32) as usize;
    // SAFETY: as above: an atomic store and an eventfd write.
    unsafe {
        signal(SIGHUP, handler);
    }
}
