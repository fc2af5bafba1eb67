//! The one table of the Socket.IO events the broker answers
//! (docs/PROTOCOL.md, sections 4, 7 and 8): each event's name, its
//! namespace, the type its argument is read as, and the handler it goes
//! to. Dispatch finds an event here and matches on its [`Route`]; a name
//! that is not here is answered [`unknown`].

use super::session::{NSP_CONTROL, NSP_ROOT};
use crate::protocol::errors::{ApiError, Code};

/// The handler an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `dispatch.rs`: core messaging.
    Pub,
    Sub,
    Unsub,
    Request,
    Ping,
    /// `streams.rs` (in a cluster, through `stream_cluster.rs` first).
    Stream(StreamOp),
    /// `kv.rs`: key-value buckets, over the streams.
    Kv(KvOp),
    /// `control.rs`.
    GroupSet,
    GroupList,
    ServerInfo,
    ClusterStatus,
    /// `cluster/membership.rs`: membership changes.
    ClusterAdd,
    ClusterRemove,
    /// `cluster.rs`: node-to-node, for connections holding the cluster
    /// token only.
    ClusterCommand,
    ClusterForward,
    ClusterCatchup,
    ClusterPublish,
    /// `cluster/membership.rs`: the configuration, asked for by a node
    /// waiting to be added.
    ClusterMembers,
}

/// The stream and consumer events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOp {
    StreamCreate,
    StreamInfo,
    StreamList,
    StreamDelete,
    StreamPurge,
    StreamGet,
    ConsumerCreate,
    ConsumerInfo,
    ConsumerList,
    ConsumerDelete,
    ConsumerFetch,
    Ack,
    Nak,
    Term,
    Wip,
}

impl StreamOp {
    /// The argument field that names the event's stream: `name` for the
    /// `stream.*` events, `stream` for the rest; `None` for `stream.list`.
    pub fn names_stream_by(self) -> Option<&'static str> {
        use StreamOp::*;
        match self {
            StreamList => None,
            StreamCreate | StreamInfo | StreamDelete | StreamPurge | StreamGet => Some("name"),
            _ => Some("stream"),
        }
    }

    /// Whether the event changes what the cluster records about streams
    /// (so it is replicated after it succeeds on the owner).
    pub fn changes_meta(self) -> bool {
        use StreamOp::*;
        matches!(
            self,
            StreamCreate | StreamDelete | ConsumerCreate | ConsumerDelete
        )
    }
}

/// The key-value events (docs/PROTOCOL.md §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOp {
    Create,
    Info,
    List,
    DeleteBucket,
    Put,
    Get,
    Delete,
    Purge,
    Keys,
    History,
    Watch,
}

/// One event of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub name: &'static str,
    pub nsp: &'static str,
    /// The type its first argument is read as (`protocol::messages`,
    /// `protocol::stream_messages`), or what it is when no type reads it.
    pub arg: &'static str,
    pub route: Route,
}

const fn root(name: &'static str, arg: &'static str, route: Route) -> Event {
    Event {
        name,
        nsp: NSP_ROOT,
        arg,
        route,
    }
}

const fn control(name: &'static str, arg: &'static str, route: Route) -> Event {
    Event {
        name,
        nsp: NSP_CONTROL,
        arg,
        route,
    }
}

/// Every event the broker answers.
pub const EVENTS: &[Event] = &[
    root("pub", "messages::Pub", Route::Pub),
    root("sub", "messages::Sub", Route::Sub),
    root("unsub", "messages::Unsub", Route::Unsub),
    root("request", "messages::Request", Route::Request),
    root("ping", "anything", Route::Ping),
    root(
        "stream.create",
        "stream_messages::StreamConfig",
        Route::Stream(StreamOp::StreamCreate),
    ),
    root(
        "stream.info",
        "stream_messages::NameReq",
        Route::Stream(StreamOp::StreamInfo),
    ),
    root(
        "stream.list",
        "{} (or {local:true} between nodes)",
        Route::Stream(StreamOp::StreamList),
    ),
    root(
        "stream.delete",
        "stream_messages::NameReq",
        Route::Stream(StreamOp::StreamDelete),
    ),
    root(
        "stream.purge",
        "stream_messages::PurgeReq",
        Route::Stream(StreamOp::StreamPurge),
    ),
    root(
        "stream.get",
        "stream_messages::GetReq",
        Route::Stream(StreamOp::StreamGet),
    ),
    root(
        "consumer.create",
        "stream_messages::ConsumerCreate",
        Route::Stream(StreamOp::ConsumerCreate),
    ),
    root(
        "consumer.info",
        "stream_messages::ConsumerReq",
        Route::Stream(StreamOp::ConsumerInfo),
    ),
    root(
        "consumer.list",
        "stream_messages::StreamReq",
        Route::Stream(StreamOp::ConsumerList),
    ),
    root(
        "consumer.delete",
        "stream_messages::ConsumerReq",
        Route::Stream(StreamOp::ConsumerDelete),
    ),
    root(
        "consumer.fetch",
        "stream_messages::FetchReq",
        Route::Stream(StreamOp::ConsumerFetch),
    ),
    root(
        "ack",
        "stream_messages::AckReq",
        Route::Stream(StreamOp::Ack),
    ),
    root(
        "nak",
        "stream_messages::AckReq",
        Route::Stream(StreamOp::Nak),
    ),
    root(
        "term",
        "stream_messages::AckReq",
        Route::Stream(StreamOp::Term),
    ),
    root(
        "wip",
        "stream_messages::AckReq",
        Route::Stream(StreamOp::Wip),
    ),
    root(
        "kv.create",
        "kv_messages::CreateReq",
        Route::Kv(KvOp::Create),
    ),
    root("kv.info", "kv_messages::BucketReq", Route::Kv(KvOp::Info)),
    root("kv.list", "{}", Route::Kv(KvOp::List)),
    root(
        "kv.delete_bucket",
        "kv_messages::BucketReq",
        Route::Kv(KvOp::DeleteBucket),
    ),
    root("kv.put", "kv_messages::KeyReq", Route::Kv(KvOp::Put)),
    root("kv.get", "kv_messages::KeyReq", Route::Kv(KvOp::Get)),
    root("kv.delete", "kv_messages::KeyReq", Route::Kv(KvOp::Delete)),
    root("kv.purge", "kv_messages::KeyReq", Route::Kv(KvOp::Purge)),
    root("kv.keys", "kv_messages::KeysReq", Route::Kv(KvOp::Keys)),
    root(
        "kv.history",
        "kv_messages::KeyReq",
        Route::Kv(KvOp::History),
    ),
    root("kv.watch", "kv_messages::WatchReq", Route::Kv(KvOp::Watch)),
    control("group.set", "messages::GroupSet", Route::GroupSet),
    control("group.list", "{}", Route::GroupList),
    control("server.info", "{}", Route::ServerInfo),
    control("cluster.status", "{}", Route::ClusterStatus),
    control("cluster.add", "{id, raft_addr, addr}", Route::ClusterAdd),
    control("cluster.remove", "{id}", Route::ClusterRemove),
    control(
        "cluster.command",
        "{entry: fsm::Change}",
        Route::ClusterCommand,
    ),
    control(
        "cluster.forward",
        "{} and a forward batch as attachment 0",
        Route::ClusterForward,
    ),
    control("cluster.members", "{}", Route::ClusterMembers),
    control(
        "cluster.catchup",
        "{group, index, after, max}",
        Route::ClusterCatchup,
    ),
    control(
        "cluster.publish",
        "{} and a publish batch as attachment 0",
        Route::ClusterPublish,
    ),
];

/// The event `name` of namespace `nsp`, if the broker answers it.
#[inline]
pub fn find(nsp: &str, name: &str) -> Option<&'static Event> {
    EVENTS.iter().find(|e| e.name == name && e.nsp == nsp)
}

/// The answer to an event name the table does not hold.
pub fn unknown(nsp: &str, name: &str) -> ApiError {
    let message = if nsp == NSP_ROOT {
        format!("unknown event {name:?}")
    } else {
        format!("unknown event {name:?} on {nsp}")
    };
    ApiError::new(Code::BadRequest, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_is_listed_once_per_namespace_and_found() {
        for (i, e) in EVENTS.iter().enumerate() {
            assert!(
                !EVENTS[..i]
                    .iter()
                    .any(|o| o.name == e.name && o.nsp == e.nsp),
                "{} listed twice in {}",
                e.name,
                e.nsp
            );
            assert_eq!(find(e.nsp, e.name), Some(e));
        }
        assert_eq!(find(NSP_CONTROL, "pub"), None);
        assert_eq!(find(NSP_ROOT, "group.set"), None);
    }

    #[test]
    fn every_event_is_documented_in_the_protocol() {
        let doc = include_str!("../../docs/PROTOCOL.md");
        for e in EVENTS {
            assert!(
                doc.contains(&format!("`{}`", e.name)),
                "{} is not in docs/PROTOCOL.md",
                e.name
            );
        }
    }

    #[test]
    fn stream_events_name_their_stream_by_the_documented_field() {
        for e in EVENTS {
            let Route::Stream(op) = e.route else { continue };
            let expect = if e.name == "stream.list" {
                None
            } else if e.name.starts_with("stream.") {
                Some("name")
            } else {
                Some("stream")
            };
            assert_eq!(op.names_stream_by(), expect, "{}", e.name);
        }
    }

    #[test]
    fn unknown_names_are_answered_bad_request() {
        let e = unknown(NSP_ROOT, "nope");
        assert_eq!(e.code, Code::BadRequest);
        assert_eq!(e.message, "unknown event \"nope\"");
        let e = unknown(NSP_CONTROL, "nope");
        assert_eq!(e.message, "unknown event \"nope\" on /control");
    }
}
