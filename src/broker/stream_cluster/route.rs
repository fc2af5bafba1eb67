//! A stream event in cluster mode: relayed to the stream's owner and its
//! answer relayed back, gathered from every node (`stream.list`), or
//! handled here with its metadata change replicated.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// A stream event (`op`, named `event`) in cluster mode: relayed to
    /// the owning node, gathered (`stream.list`), or handled here and its
    /// metadata change replicated. `None`: not in a cluster, handle it as
    /// a single node does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn clustered_stream_event(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        event: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
    ) -> Option<Result<Option<String>, ApiError>> {
        self.clustered_stream_event_as(sink, conn, op, event, arg, ack_id, attachments, None)
    }

    /// [`Broker::clustered_stream_event`], with `shape` making the ack
    /// of a metadata change from the stream event's (a bucket event's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn clustered_stream_event_as(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        op: StreamOp,
        event: &str,
        arg: Option<&RawValue>,
        ack_id: Option<u64>,
        attachments: &[Vec<u8>],
        shape: Option<&dyn Fn(&str) -> String>,
    ) -> Option<Result<Option<String>, ApiError>> {
        let cluster = self.cluster.as_ref()?;
        let me = cluster.me();
        if op == StreamOp::StreamList {
            let from_peer = arg.is_some_and(|a| a.get().contains("\"local\":true"));
            let local = self
                .streams
                .event(sink, conn, op, event, arg, ack_id)
                .map(|b| b.map(|b| self.with_cluster_fields(b)));
            if from_peer {
                // With the replicated streams this node leads: the asking
                // node takes their entries (each replica's lag) over its own.
                let led = self.replicated_list_entries(true);
                return Some(local.map(|b| b.map(|b| with_entries(b, led))));
            }
            let streams = match local {
                Ok(Some(body)) => serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get(0)?.get("streams")?.as_array().cloned())
                    .unwrap_or_default(),
                other => return Some(other),
            };
            let mut streams = streams;
            streams.extend(self.replicated_list_entries(false));
            return Some(self.gather_list(conn, ack_id, Listing::Streams, streams));
        }
        let field = op.names_stream_by()?;
        let argv = arg
            .and_then(|a| serde_json::from_str::<Value>(a.get()).ok())
            .unwrap_or(Value::Null);
        let text_of = |k: &str| argv.get(k).and_then(Value::as_str).map(str::to_string);
        let name = text_of(field);
        if let Some(n) = name.as_deref() {
            let replicated =
                self.replicated_stream_event(sink, conn, op, event, n, arg, ack_id, attachments);
            if replicated.is_some() {
                return replicated;
            }
        }
        let owner = name.as_deref().and_then(|n| self.fsm.stream_owner(n));
        if let Some(owner) = owner.filter(|&o| o != me) {
            let timeout = relay_wait(op, &argv, PROPOSE_WAIT);
            let text = arg.map_or("{}", RawValue::get).to_string();
            return Some(self.relay(
                owner,
                None,
                conn,
                ack_id,
                event,
                text,
                attachments.to_vec(),
                timeout,
            ));
        }
        // Ours (or unknown to the cluster): handle here, then replicate
        // what the cluster must know.
        let create = match op {
            StreamOp::StreamCreate => match self.create_replicas(arg) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            },
            _ => None,
        };
        let arg = create.as_ref().map_or(arg, |c| Some(&*c.arg));
        let local = if create.as_ref().is_some_and(|c| c.replicas > 1) {
            // A replicated stream is kept by its group's members, not here.
            self.replicated_create_body(arg)
        } else {
            self.streams.event(sink, conn, op, event, arg, ack_id)
        };
        if !op.changes_meta() {
            return Some(match (local, name) {
                (Ok(Some(body)), Some(n)) if op == StreamOp::StreamInfo => {
                    Ok(Some(self.with_cluster_field(&n, body)))
                }
                (other, _) => other,
            });
        }
        let body = match local {
            Ok(Some(body)) => body,
            other => return Some(other),
        };
        let Some(name) = name else {
            return Some(Ok(Some(body)));
        };
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let cmd = match event {
            "stream.create" => MetaCommand::StreamPut {
                name,
                owner: me,
                config: answer[0]["stream"]["config"].clone(),
            },
            "stream.delete" => MetaCommand::StreamDelete { name },
            "consumer.create" => MetaCommand::ConsumerPut {
                stream: name,
                name: text_of("name").unwrap_or_default(),
                config: answer[0]["consumer"]["config"].clone(),
            },
            _ => MetaCommand::ConsumerDelete {
                stream: name,
                name: text_of("name").unwrap_or_default(),
            },
        };
        let replicas = create.map_or(1, |c| c.replicas);
        let place = match &cmd {
            MetaCommand::StreamPut { name, .. } if replicas > 1 => {
                match self.new_placement(name, replicas) {
                    Ok(p) => p.map(|p| (name.clone(), p)),
                    Err(e) => return Some(Err(e)),
                }
            }
            _ => None,
        };
        let reply = ack_id.map(|ack_id| ChangeAck {
            conn,
            nsp: NSP_ROOT,
            ack_id,
            ok_body: shape.map_or_else(|| body.clone(), |f| f(&body)),
        });
        let Some((name, placement)) = place else {
            return Some(self.submit(sink, Cmd::Meta(cmd), reply));
        };
        // The stream's record, then its placement: one log, in order.
        self.submit_internal(sink, Cmd::Meta(cmd));
        let place = MetaCommand::StreamPlace { name, placement };
        Some(self.submit(sink, Cmd::Meta(place), reply))
    }
}

/// A `stream.list` answer (`body`) with `more` entries appended.
fn with_entries(body: String, more: Vec<Value>) -> String {
    if more.is_empty() {
        return body;
    }
    let Ok(mut answer) = serde_json::from_str::<Value>(&body) else {
        return body;
    };
    match answer
        .get_mut(0)
        .and_then(|a| a.get_mut("streams"))
        .and_then(Value::as_array_mut)
    {
        Some(list) => {
            list.extend(more);
            answer.to_string()
        }
        None => body,
    }
}
