//! Users and their rights (docs/PROTOCOL.md §11): the users file, the
//! subject and stream rules, and the bookkeeping for answering requests.
//! Pure but for [`users::read`], which reads the file; the broker passes
//! the clock in.
//!
//! - [`users`]: the file's format, its strict parser, the token lookup.
//! - [`rights`]: pattern coverage, subscribe cuts, stream rights and the
//!   per-connection publish cache.
//! - [`conn`]: the rights one connection holds, with its caches.
//! - [`responses`]: the one answer each delivered request allows.

pub mod conn;
pub mod responses;
pub mod rights;
pub mod users;

pub use conn::ConnRights;
pub use rights::{Cuts, PubCache, Rights, Rules, StreamNeed, SubDecision};
pub use users::{User, Users, UsersError};
