//! The parts of `Cluster` that own their state: each keeps its fields
//! private and is driven through its methods, and none imports a file
//! that names the broker, so each is tested on its own.

pub(crate) mod member_changes;
pub(crate) mod peers;
pub(crate) mod proposals;
pub(crate) mod relays;
