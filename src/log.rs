//! Process-wide logging: one line per event on stderr, with a UTC
//! timestamp and the level, filtered by `-log-level`.
//!
//! ```text
//! 2026-11-29T11:40:02.123Z info listening on 127.0.0.1:8080
//! ```
//!
//! The level is one atomic, so any thread may log; each line is written
//! with a single `write` so lines from different threads do not interleave.

use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogLevel;

/// The least severe level that is written (as `LogLevel as u8`).
static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);

/// Sets the least severe level that is written.
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether a line at `level` would be written.
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one line at `level` if it is enabled; newlines inside the
/// message are replaced so an event stays on one line.
pub fn write(level: LogLevel, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut line = format!(
        "{} {:<5} {}",
        timestamp(now.as_millis() as u64),
        level,
        args
    );
    if line.contains('\n') {
        line = line.replace('\n', " ");
    }
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs at error level: `log_error!("cannot open {}", path)`.
#[macro_export]
macro_rules! log_error {
    ($($arg:tt)*) => { $crate::log::write($crate::config::LogLevel::Error, format_args!($($arg)*)) };
}

/// Logs at warn level.
#[macro_export]
macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::write($crate::config::LogLevel::Warn, format_args!($($arg)*)) };
}

/// Logs at info level.
#[macro_export]
macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::write($crate::config::LogLevel::Info, format_args!($($arg)*)) };
}

/// Logs at debug level.
#[macro_export]
macro_rules! log_debug {
    ($($arg:tt)*) => { $crate::log::write($crate::config::LogLevel::Debug, format_args!($($arg)*)) };
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for milliseconds since the Unix epoch.
pub fn timestamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift to an era starting on 0000-03-01 so leap days end each cycle.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(timestamp(1_796_297_045_123), "2026-12-03T11:24:05.123Z");
        assert_eq!(timestamp(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn levels_filter() {
        set_level(LogLevel::Warn);
        assert!(enabled(LogLevel::Error));
        assert!(enabled(LogLevel::Warn));
        assert!(!enabled(LogLevel::Info));
        set_level(LogLevel::Debug);
        assert!(enabled(LogLevel::Debug));
        set_level(LogLevel::Info);
    }
}
