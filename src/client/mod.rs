//! The Rust client module.
