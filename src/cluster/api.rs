//! The seam between the broker and cluster mode: every cluster name the
//! broker (and the `broker` binary that configures it) uses, and nothing
//! else. The modules behind it (Raft's core, log, transport, the control
//! state machine, links, placement, snapshot files) change without the
//! broker noticing as long as this list holds; `tests/module_rules.rs`
//! fails on a broker file that imports a cluster module past it.
//!
//! What crosses it:
//! - the Raft thread's handle ([`RaftNode`], [`RaftSender`]), its settings
//!   ([`NodeConfig`], [`ClusterKey`]), the commands in ([`ToRaft`]), the
//!   events out ([`FromRaft`], [`GroupEvent`]) and its view ([`View`],
//!   [`GroupView`]: role, groups, members, transport stats);
//! - the replicated control state the broker reads and the commands that
//!   change it ([`Fsm`], [`Cmd`], [`Change`], [`MetaCommand`], [`Cursor`],
//!   [`CursorPos`]);
//! - a change's errors and state ([`ChangeError`], [`ChangeState`]),
//!   [`Role`], the configuration ([`Membership`], [`Member`],
//!   [`MemberInfo`] and [`members`]' id rules);
//! - the links to the other nodes' `/control` namespace ([`Links`],
//!   [`LinkOut`], [`LinkEvent`], [`CallError`], [`EMIT_BYTES_MAX`]) and
//!   the forward batch format ([`forward`], [`PeerMessage`]);
//! - [`placement`] of replicated streams, and the node's
//!   [`TransportStats`];
//! - [`snapshot_file`]: a replicated stream's snapshot file, written on a
//!   thread of the broker's and read back when a replica restores. Its
//!   parts cross the seam rather than one operation behind it: writing and
//!   reading one joins this file format to the stream's replica
//!   (`Frozen::store`, `Replica::restore_files`), and only the broker
//!   imports both `cluster` and `stream`.

pub use super::forward::PeerMessage;
pub use super::fsm::{Change, Cmd, Cursor, CursorPos, Fsm, MetaCommand};
pub use super::link::{CallError, LinkEvent, LinkOut, Links, LinksEnd, EMIT_BYTES_MAX};
pub use super::members::MemberInfo;
pub use super::node::{
    FromRaft, GroupEvent, GroupView, MemberView, NodeConfig, RaftEnd, RaftNode, RaftSender, ToRaft,
    View,
};
pub use super::raft::{ChangeError, ChangeState, Role, Status};
pub use super::raft_auth::ClusterKey;
pub use super::raft_msg::{GroupId, Member, Membership};
pub use super::raft_transport::TransportStats;

/// The batch format of messages forwarded between nodes.
pub mod forward {
    pub use crate::cluster::forward::{decode, push, PeerMessage};
}

/// The choice of a replicated stream's nodes and its recorded placement.
pub mod placement {
    pub use crate::cluster::placement::{
        move_off, place, replica_counts, take_replicas, Placement,
    };
}

/// How members get their ids and when one may be added.
pub mod members {
    pub use crate::cluster::members::{check_add, joined_id, MemberInfo};
}

/// A replicated stream's snapshot file: its reference in the group's log,
/// its writer and its checked reader.
pub mod snapshot_file {
    pub use crate::cluster::snapshot_file::{Checked, FileRef, Writer};
}
