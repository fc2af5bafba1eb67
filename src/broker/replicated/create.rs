//! The `Broker`'s side of replicated streams' creation: `replicas` read
//! and checked, the stream's nodes picked and their placement proposed,
//! and the `cluster` field of `stream.info`.

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::{node_id, CreateReplicas};
use crate::broker::Broker;
use crate::cluster::api::placement::{self, Placement};
use crate::protocol::errors::{ApiError, Code};

impl Broker {
    /// Reads and checks `replicas` of a `stream.create` in a cluster of
    /// `nodes` nodes, and refuses a create that would change the replica
    /// count of a stream the cluster knows. `None`: the request is not an
    /// object, left to the stream store's own `bad_request`.
    pub(crate) fn create_replicas(
        &self,
        arg: Option<&RawValue>,
    ) -> Result<Option<CreateReplicas>, ApiError> {
        let Some(c) = self.cluster.as_ref() else {
            return Ok(None);
        };
        let Some(Ok(Value::Object(mut fields))) =
            arg.map(|a| serde_json::from_str::<Value>(a.get()))
        else {
            return Ok(None);
        };
        let replicas = placement::take_replicas(&mut fields, c.node_ids().count(), true)?;
        if let Some(m) = fields
            .get("name")
            .and_then(Value::as_str)
            .and_then(|n| self.fsm.streams.get(n))
        {
            let has = m.placement.as_ref().map_or(1, |p| p.replicas.len());
            if has != replicas {
                return Err(ApiError::new(
                    Code::Exists,
                    format!("the stream exists with {has} replica(s), not {replicas}"),
                ));
            }
        }
        let text = Value::Object(fields).to_string();
        let arg = RawValue::from_string(text)
            .map_err(|e| ApiError::new(Code::Internal, e.to_string()))?;
        Ok(Some(CreateReplicas { arg, replicas }))
    }

    /// The placement for new stream `name` of `r` > 1 replicas, or `None`
    /// when the cluster has recorded one already (a repeated create).
    /// This node is always among them, first: it holds the messages.
    pub(crate) fn new_placement(
        &self,
        name: &str,
        r: usize,
    ) -> Result<Option<Placement>, ApiError> {
        let Some(c) = self.cluster.as_ref() else {
            return Ok(None);
        };
        if self.fsm.stream_placement(name).is_some() {
            return Ok(None);
        }
        let me = c.me();
        let mut held = placement::replica_counts(
            self.fsm
                .streams
                .values()
                .map(|s| (s.owner, s.placement.as_ref())),
        );
        held.insert(me, 0);
        let nodes: Vec<u64> = c.node_ids().collect();
        let replicas = placement::place(r, &nodes, &held, Some(me))?;
        let group = self
            .fsm
            .streams
            .values()
            .filter_map(|s| s.placement.as_ref().map(|p| p.group))
            .max()
            .unwrap_or(0)
            + 1;
        Ok(Some(Placement {
            group,
            replicas,
            leaving: Vec::new(),
            joining: Vec::new(),
        }))
    }

    /// The `cluster` field of stream `name`: for an R1 stream its owner as
    /// `leader` and no replicas, for an R>1 stream its group's leader and
    /// members (`group_cluster_field`). `None` when the cluster does not
    /// know the stream.
    fn cluster_field(&self, name: &str) -> Option<Value> {
        let meta = self.fsm.streams.get(name)?;
        if meta
            .placement
            .as_ref()
            .is_some_and(|p| p.replicas.len() > 1)
        {
            return self.group_cluster_field(name);
        }
        let c = self.cluster.as_ref()?;
        let replicas: Vec<Value> = meta
            .placement
            .iter()
            .flat_map(|p| p.replicas.iter())
            .filter(|&&n| n != meta.owner)
            .map(|&n| json!({"node": node_id(c, n), "current": false, "lag": null}))
            .collect();
        let mut cluster = Map::new();
        cluster.insert("leader".into(), node_id(c, meta.owner));
        cluster.insert("replicas".into(), Value::Array(replicas));
        Some(Value::Object(cluster))
    }

    /// A `stream.info` answer (`body`, the ack's JSON array) with the
    /// stream's `cluster` field inside its `stream` object, beside
    /// `config` and `state`, as in each `stream.list` entry. For one
    /// release it is also beside `stream`, where earlier versions put it
    /// (docs/PROTOCOL.md, "Replicated streams").
    pub(crate) fn with_cluster_field(&self, name: &str, body: String) -> String {
        let Some(cluster) = self.cluster_field(name) else {
            return body;
        };
        let Ok(mut answer) = serde_json::from_str::<Value>(&body) else {
            return body;
        };
        let Some(first) = answer.get_mut(0).and_then(Value::as_object_mut) else {
            return body;
        };
        if let Some(stream) = first.get_mut("stream").and_then(Value::as_object_mut) {
            stream.insert("cluster".into(), cluster.clone());
        }
        first.insert("cluster".into(), cluster);
        answer.to_string()
    }

    /// A `stream.list` answer of this node's streams with each entry's
    /// `cluster` field.
    pub(crate) fn with_cluster_fields(&self, body: String) -> String {
        let Ok(mut answer) = serde_json::from_str::<Value>(&body) else {
            return body;
        };
        let Some(list) = answer
            .get_mut(0)
            .and_then(|a| a.get_mut("streams"))
            .and_then(Value::as_array_mut)
        else {
            return body;
        };
        for entry in list {
            let name = entry["config"]["name"].as_str().unwrap_or("").to_string();
            if let (Some(cluster), Some(obj)) = (self.cluster_field(&name), entry.as_object_mut()) {
                obj.insert("cluster".into(), cluster);
            }
        }
        answer.to_string()
    }

    /// Has the Raft thread hold every stream group the control state
    /// places on this node (a group held already is left as it is).
    /// Each is given its replica first (`stream_groups.rs`), so that the
    /// group's entries find it; a deleted stream's replica goes.
    pub(crate) fn hold_stream_groups(&mut self) {
        self.sync_stream_groups();
    }
}
