//! Subject validation and the reference matcher.
