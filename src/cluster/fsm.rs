//! The control-state machine: every change to the state the cluster
//! shares (subscriptions with their owners, queue-group rules, which node
//! owns which stream and with what config, consumer configs and cursors)
//! is an [`Change`] applied by [`Fsm::apply`], the one apply path. A single
//! node applies entries as they are made; a cluster node applies them as
//! Raft commits them, in the same order everywhere. [`Fsm::snapshot`] and
//! [`Fsm::restore`] bound the Raft log. Pure: no sockets, files or clocks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::placement::{self, Placement};
use crate::protocol::errors::{ApiError, Code};
use crate::routing::subs::{Command, Owner, SubTable};

/// Most streams the registry records (the broker's own cap is lower).
pub const STREAMS_MAX: usize = 10_000;
/// Most consumers recorded per stream.
pub const CONSUMERS_MAX: usize = 10_000;

/// One replicated change: who made it (node and that node's operation
/// number, so the maker can answer its client when it is applied) and what.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub node: u64,
    pub op: u64,
    pub cmd: Cmd,
}

impl Change {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads what [`Change::encode`] wrote (`entry_json.rs`).
    pub fn decode(bytes: &[u8]) -> Result<Change, String> {
        super::entry_json::read_change(bytes).map_err(|e| format!("bad entry: {e}"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cmd {
    /// A change to the subscription table (and group rules).
    Subs(Command),
    /// A change to stream metadata.
    Meta(MetaCommand),
}

/// A change to the stream registry. Written by serde as an object with
/// an `op` member; read back by `entry_json.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MetaCommand {
    /// Stream `name` lives on node `owner` with this config (create or
    /// update).
    StreamPut {
        name: String,
        owner: u64,
        config: Value,
    },
    StreamDelete {
        name: String,
    },
    ConsumerPut {
        stream: String,
        name: String,
        config: Value,
    },
    ConsumerDelete {
        stream: String,
        name: String,
    },
    /// Consumer cursors of one stream, batched by its owner.
    Cursors {
        stream: String,
        cursors: Vec<Cursor>,
    },
    /// Stream `name` is replicated by Raft group `placement.group` on
    /// `placement.replicas` (see `placement.rs`). Refused while another
    /// stream holds that group id.
    StreamPlace {
        name: String,
        placement: Placement,
    },
}

/// Where a consumer stands: every stream sequence up to `ack_floor` is
/// acknowledged, and `delivered` is the last one handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CursorPos {
    pub ack_floor: u64,
    pub delivered: u64,
}

/// Written as one object, `{"consumer":…,"ack_floor":…,"delivered":…}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub consumer: String,
    pub pos: CursorPos,
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Cursor", 3)?;
        st.serialize_field("consumer", &self.consumer)?;
        st.serialize_field("ack_floor", &self.pos.ack_floor)?;
        st.serialize_field("delivered", &self.pos.delivered)?;
        st.end()
    }
}

/// Why a committed entry changed nothing.
#[derive(Debug)]
pub struct Refused {
    /// A repeat, or overtaken: not applied at all.
    pub stale: bool,
    pub error: ApiError,
}

/// What the cluster knows about one stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamMeta {
    pub owner: u64,
    pub config: Value,
    pub consumers: BTreeMap<String, ConsumerMeta>,
    /// A replicated stream's group and nodes (none: an R1 stream on
    /// `owner`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerMeta {
    pub config: Value,
    pub cursor: CursorPos,
}

/// The replicated control state.
#[derive(Debug)]
pub struct Fsm {
    pub subs: SubTable,
    pub streams: BTreeMap<String, StreamMeta>,
    /// Each node's boot id, as its last `NodeUp` said.
    pub boots: BTreeMap<u64, u64>,
    /// The last operation applied per node and life (boot id): a node
    /// proposes in operation order, so an entry at or below it is a
    /// repeat, or one overtaken by a later change.
    pub last_op: BTreeMap<(u64, u64), u64>,
    /// The Raft index of the last applied entry (0 on a single node).
    pub applied: u64,
}

/// A snapshot's shape: the state as plain lists.
#[derive(Serialize, Deserialize)]
struct Image {
    applied: u64,
    subs: Vec<SubImage>,
    groups: Vec<(String, crate::routing::groups::GroupMode)>,
    streams: BTreeMap<String, StreamMeta>,
    #[serde(default)]
    boots: BTreeMap<u64, u64>,
    #[serde(default)]
    last_op: Vec<((u64, u64), u64)>,
}

#[derive(Serialize, Deserialize)]
struct SubImage {
    owner: Owner,
    sid: String,
    pattern: String,
    queue: Option<String>,
    remaining: Option<u64>,
}

impl Fsm {
    /// The state of node `me`, empty.
    pub fn new(me: u64) -> Fsm {
        Fsm {
            subs: SubTable::new(me),
            streams: BTreeMap::new(),
            boots: BTreeMap::new(),
            last_op: BTreeMap::new(),
            applied: 0,
        }
    }

    /// Applies a committed entry: [`Fsm::apply`], unless it is a repeat
    /// or was overtaken by a later entry of its node (see `last_op`).
    pub fn apply_entry(&mut self, e: &Change) -> Result<(), Refused> {
        let life = (e.node, e.op >> 32);
        if self.last_op.get(&life).is_some_and(|&last| e.op <= last) {
            return Err(Refused {
                stale: true,
                error: ApiError::new(Code::Unavailable, "a repeated or overtaken change"),
            });
        }
        self.last_op.insert(life, e.op);
        self.apply(&e.cmd).map_err(|error| Refused {
            stale: false,
            error,
        })
    }

    /// Applies one change. An error leaves the state as it was and is the
    /// answer for whoever made the change.
    pub fn apply(&mut self, cmd: &Cmd) -> Result<(), ApiError> {
        match cmd {
            Cmd::Subs(c) => {
                if let Command::NodeUp { node, boot } = c {
                    self.boots.insert(*node, *boot);
                    // Earlier lives propose nothing any more.
                    self.last_op.retain(|&(n, b), _| n != *node || b == *boot);
                }
                self.subs.apply(c.clone())
            }
            Cmd::Meta(m) => self.apply_meta(m),
        }
    }

    fn apply_meta(&mut self, m: &MetaCommand) -> Result<(), ApiError> {
        match m {
            MetaCommand::StreamPut {
                name,
                owner,
                config,
            } => {
                if let Some(s) = self.streams.get_mut(name) {
                    if s.owner != *owner {
                        return Err(ApiError::new(
                            Code::Exists,
                            format!("stream {name:?} lives on another node"),
                        ));
                    }
                    s.config = config.clone();
                    return Ok(());
                }
                if self.streams.len() >= STREAMS_MAX {
                    return Err(ApiError::new(Code::Limit, "too many streams"));
                }
                self.streams.insert(
                    name.clone(),
                    StreamMeta {
                        owner: *owner,
                        config: config.clone(),
                        consumers: BTreeMap::new(),
                        placement: None,
                    },
                );
                Ok(())
            }
            MetaCommand::StreamDelete { name } => {
                self.streams.remove(name);
                Ok(())
            }
            MetaCommand::ConsumerPut {
                stream,
                name,
                config,
            } => {
                let s = self.stream_mut(stream)?;
                if let Some(c) = s.consumers.get_mut(name) {
                    c.config = config.clone();
                    return Ok(());
                }
                if s.consumers.len() >= CONSUMERS_MAX {
                    return Err(ApiError::new(Code::Limit, "too many consumers"));
                }
                s.consumers.insert(
                    name.clone(),
                    ConsumerMeta {
                        config: config.clone(),
                        cursor: CursorPos::default(),
                    },
                );
                Ok(())
            }
            MetaCommand::ConsumerDelete { stream, name } => {
                self.stream_mut(stream)?.consumers.remove(name);
                Ok(())
            }
            MetaCommand::Cursors { stream, cursors } => {
                let s = self.stream_mut(stream)?;
                for c in cursors {
                    if let Some(m) = s.consumers.get_mut(&c.consumer) {
                        // Cursors only move forward, whatever order the
                        // batches of a restarted owner arrive in.
                        m.cursor.ack_floor = m.cursor.ack_floor.max(c.pos.ack_floor);
                        m.cursor.delivered = m.cursor.delivered.max(c.pos.delivered);
                    }
                }
                Ok(())
            }
            MetaCommand::StreamPlace { name, placement } => self.place(name, placement),
        }
    }

    fn place(&mut self, name: &str, p: &Placement) -> Result<(), ApiError> {
        placement::check(p)?;
        let taken = self.streams.iter().any(|(other, s)| {
            other != name && s.placement.as_ref().is_some_and(|q| q.group == p.group)
        });
        let s = self.stream_mut(name)?;
        if taken {
            return Err(ApiError::new(
                Code::Exists,
                format!("group {} holds another stream", p.group),
            ));
        }
        if let Some(now) = s.placement.as_ref() {
            placement::check_next(now, p)?;
        }
        s.placement = Some(p.clone());
        Ok(())
    }

    /// Where replicated stream `name` lives (none for an R1 stream).
    pub fn stream_placement(&self, name: &str) -> Option<&Placement> {
        self.streams.get(name)?.placement.as_ref()
    }

    fn stream_mut(&mut self, name: &str) -> Result<&mut StreamMeta, ApiError> {
        self.streams
            .get_mut(name)
            .ok_or_else(|| ApiError::new(Code::NotFound, format!("no stream {name:?}")))
    }

    /// The node that owns stream `name`, if the cluster knows it.
    pub fn stream_owner(&self, name: &str) -> Option<u64> {
        self.streams.get(name).map(|s| s.owner)
    }

    /// The whole state as bytes, for a Raft snapshot at `applied`.
    pub fn snapshot(&self) -> Vec<u8> {
        let image = Image {
            applied: self.applied,
            subs: self
                .subs
                .iter()
                .map(|s| SubImage {
                    owner: s.owner,
                    sid: s.sid.to_string(),
                    pattern: s.pattern.to_string(),
                    queue: s.queue.as_deref().map(str::to_string),
                    remaining: s.remaining,
                })
                .collect(),
            groups: self
                .subs
                .groups
                .list()
                .map(|(q, m)| (q.to_string(), m))
                .collect(),
            streams: self.streams.clone(),
            boots: self.boots.clone(),
            last_op: self.last_op.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        serde_json::to_vec(&image).unwrap_or_default()
    }

    /// Replaces the state with a snapshot's. This node's open connections
    /// stay known, so its own subscriptions in the snapshot deliver.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        if bytes.is_empty() {
            self.subs.clear_replicated();
            self.streams.clear();
            self.boots.clear();
            self.last_op.clear();
            self.applied = 0;
            return Ok(());
        }
        let image: Image =
            crate::protocol::json_from_bytes(bytes).map_err(|e| format!("bad snapshot: {e}"))?;
        self.subs.clear_replicated();
        for s in image.subs {
            let cmd = Command::Subscribe {
                owner: s.owner,
                sid: s.sid,
                pattern: s.pattern,
                queue: s.queue,
                max: s.remaining,
            };
            self.subs
                .apply(cmd)
                .map_err(|e| format!("snapshot subscription: {}", e.message))?;
        }
        for (queue, mode) in image.groups {
            let _ = self.subs.apply(Command::GroupSet { queue, mode });
        }
        self.streams = image.streams;
        self.boots = image.boots;
        self.last_op = crate::maps::map_of(image.last_op);
        self.applied = image.applied;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::groups::GroupMode;

    fn sub(node: u64, conn: u64, sid: &str, pattern: &str) -> Cmd {
        Cmd::Subs(Command::Subscribe {
            owner: Owner { node, conn },
            sid: sid.into(),
            pattern: pattern.into(),
            queue: Some("q".into()),
            max: Some(3),
        })
    }

    fn put(name: &str, owner: u64) -> Cmd {
        Cmd::Meta(MetaCommand::StreamPut {
            name: name.into(),
            owner,
            config: serde_json::json!({"subjects": ["a.>"]}),
        })
    }

    #[test]
    fn entries_round_trip() {
        let e = Change {
            node: 2,
            op: 9,
            cmd: sub(2, 5, "s1", "a.*"),
        };
        assert_eq!(Change::decode(&e.encode()).unwrap(), e);
        assert!(Change::decode(b"{").is_err());
    }

    #[test]
    fn snapshot_restores_the_same_state() {
        let mut a = Fsm::new(1);
        a.apply(&sub(1, 7, "x", "a.*")).unwrap();
        a.apply(&sub(2, (9 << 32) | 8, "y", "a.>")).unwrap();
        a.apply(&Cmd::Subs(Command::GroupSet {
            queue: "q".into(),
            mode: GroupMode::Broadcast,
        }))
        .unwrap();
        a.apply(&put("orders", 2)).unwrap();
        a.apply(&Cmd::Subs(Command::NodeUp { node: 2, boot: 9 }))
            .unwrap();
        a.apply(&Cmd::Meta(MetaCommand::ConsumerPut {
            stream: "orders".into(),
            name: "c".into(),
            config: serde_json::json!({}),
        }))
        .unwrap();
        a.apply(&Cmd::Meta(MetaCommand::Cursors {
            stream: "orders".into(),
            cursors: vec![Cursor {
                consumer: "c".into(),
                pos: CursorPos {
                    ack_floor: 4,
                    delivered: 6,
                },
            }],
        }))
        .unwrap();
        a.applied = 42;
        let snap = a.snapshot();
        let mut b = Fsm::new(3);
        b.apply(&sub(3, 1, "old", "z")).unwrap();
        b.restore(&snap).unwrap();
        assert_eq!(b.applied, 42);
        assert_eq!(b.subs.len(), 2);
        assert_eq!(b.subs.matches("a.b").groups[0].members.len(), 2);
        assert_eq!(b.subs.group_mode("q"), GroupMode::Broadcast);
        assert_eq!(b.streams, a.streams);
        assert_eq!(b.boots.get(&2), Some(&9));
        assert_eq!(b.snapshot(), snap, "restore then snapshot is the identity");
        assert!(b.restore(b"not json").is_err());
    }

    #[test]
    fn repeated_and_overtaken_entries_are_not_applied() {
        let mut f = Fsm::new(1);
        let life = 7u64 << 32;
        let e = |op: u64, cmd: Cmd| Change { node: 2, op, cmd };
        f.apply_entry(&e(life | 1, sub(2, life | 1, "a", "x")))
            .unwrap();
        let rm = Cmd::Subs(Command::RemoveConn {
            owner: Owner {
                node: 2,
                conn: life | 1,
            },
        });
        f.apply_entry(&e(life | 2, rm)).unwrap();
        assert!(f.subs.is_empty());
        // The subscribe again, resent after a leader change: not applied.
        let again = f.apply_entry(&e(life | 1, sub(2, life | 1, "a", "x")));
        assert!(again.unwrap_err().stale);
        assert!(f.subs.is_empty(), "a resent subscribe cannot come back");
        // Another life of the node starts its own count.
        let next = 8u64 << 32;
        f.apply_entry(&e(next | 1, sub(2, next | 1, "a", "x")))
            .unwrap();
        // A refused change is still the node's latest.
        let dup = f.apply_entry(&e(next | 2, sub(2, next | 1, "a", "x")));
        assert!(!dup.unwrap_err().stale);
        f.apply(&Cmd::Subs(Command::NodeUp { node: 2, boot: 8 }))
            .unwrap();
        assert_eq!(f.last_op.len(), 1, "earlier lives are forgotten");
        let snap = f.snapshot();
        let mut g = Fsm::new(1);
        g.restore(&snap).unwrap();
        assert_eq!(g.last_op, f.last_op);
    }

    #[test]
    fn stream_owners_and_cursors() {
        let mut f = Fsm::new(1);
        f.apply(&put("s", 1)).unwrap();
        assert_eq!(f.apply(&put("s", 2)).unwrap_err().code, Code::Exists);
        assert_eq!(f.stream_owner("s"), Some(1));
        let cursors = |floor| {
            Cmd::Meta(MetaCommand::Cursors {
                stream: "s".into(),
                cursors: vec![Cursor {
                    consumer: "c".into(),
                    pos: CursorPos {
                        ack_floor: floor,
                        delivered: floor,
                    },
                }],
            })
        };
        f.apply(&Cmd::Meta(MetaCommand::ConsumerPut {
            stream: "s".into(),
            name: "c".into(),
            config: Value::Null,
        }))
        .unwrap();
        f.apply(&cursors(10)).unwrap();
        f.apply(&cursors(5)).unwrap();
        assert_eq!(f.streams["s"].consumers["c"].cursor.ack_floor, 10);
        f.apply(&Cmd::Meta(MetaCommand::StreamDelete { name: "s".into() }))
            .unwrap();
        assert_eq!(f.apply(&cursors(11)).unwrap_err().code, Code::NotFound);
    }
}
