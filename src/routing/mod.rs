//! Who receives what: the subscription index and the subscription table,
//! with queue-group rules. Pure state with no I/O, shared by the broker
//! core (which delivers by it) and the control-state machine in
//! `cluster/fsm.rs` (which applies every change to it, locally or through
//! Raft).
//!
//! - [`sublist`]: the token trie with a bounded match cache.
//! - [`subs`]: subscriptions and [`subs::Command`], applied in one place.
//! - [`groups`]: queue-group rules (loadbalance / broadcast) and the
//!   rotating pick.
pub mod groups;
pub mod sublist;
pub mod subs;
