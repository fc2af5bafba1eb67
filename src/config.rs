//! Command-line flags.
