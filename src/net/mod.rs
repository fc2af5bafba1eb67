//! The I/O shell.
