//! The client's streams and consumers API (contract section 5): typed
//! configs and answers, `stream.*` and `consumer.*` calls, publishing with
//! a stream ack, pull fetches, and `ack` / `nak` / `term` / `wip`. Push
//! consumers are read with an ordinary subscription on their
//! `deliver_subject`; each [`super::Message`] then carries a
//! [`StreamDelivery`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{to_json, Client, Error, OutMessage, Payload};

/// A stream's configuration; `None` fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamConfig {
    pub name: String,
    pub subjects: Vec<String>,
    /// `limits` (default), `workqueue` or `interest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_msgs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_msg_size: Option<u64>,
    /// `old` (default) or `new`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discard: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate_window_ms: Option<u64>,
}

impl StreamConfig {
    pub fn new(name: &str, subjects: &[&str]) -> StreamConfig {
        StreamConfig {
            name: name.to_string(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            ..StreamConfig::default()
        }
    }
}

/// `stream.info`'s state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct StreamState {
    pub messages: u64,
    pub bytes: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub consumer_count: u64,
}

/// A stream as the server shows it (config with defaults filled in).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StreamInfo {
    pub config: Value,
    pub state: StreamState,
}

/// A consumer's configuration; `None` fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConsumerConfig {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_subject: Option<String>,
    /// `all` (default), `new`, `last`, `by_start_seq`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opt_start_seq: Option<u64>,
    /// `explicit` (default), `none`, `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_wait_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_deliver: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ack_pending: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_group: Option<String>,
}

impl ConsumerConfig {
    pub fn new(name: &str) -> ConsumerConfig {
        ConsumerConfig {
            name: name.to_string(),
            ..ConsumerConfig::default()
        }
    }
}

/// `{stream_seq, consumer_seq}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct SeqPair {
    pub stream_seq: u64,
    pub consumer_seq: u64,
}

/// `consumer.info`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ConsumerInfo {
    pub stream: String,
    pub name: String,
    pub config: Value,
    pub delivered: SeqPair,
    pub ack_floor: SeqPair,
    pub num_pending: u64,
    pub num_ack_pending: u64,
    pub num_redelivered: u64,
}

/// A stored message (`stream.get`, `consumer.fetch`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredMessage {
    pub seq: u64,
    pub subject: String,
    /// The JSON `data`; for binary data, its Socket.IO placeholder (the
    /// bytes are in [`StoredMessage::bytes`]).
    pub data: Value,
    /// The bytes, when `data` was published as a binary attachment.
    #[serde(skip)]
    pub bytes: Option<Vec<u8>>,
    #[serde(default)]
    pub headers: Option<Map<String, Value>>,
    /// Milliseconds since the Unix epoch when it was stored.
    pub time: u64,
    /// How often it has been delivered (fetch only).
    #[serde(default)]
    pub delivered: Option<u64>,
}

impl StoredMessage {
    /// Fills [`StoredMessage::bytes`] from the ack's attachments when
    /// `data` is a placeholder.
    fn attach(&mut self, attachments: &[Vec<u8>]) {
        if let Some(num) = crate::protocol::socketio::placeholder_num(&self.data) {
            self.bytes = attachments.get(num).cloned();
        }
    }
}

/// The ack of a publish a stream captured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PubAck {
    pub stream: String,
    pub seq: u64,
    #[serde(default)]
    pub duplicate: bool,
}

/// What a push consumer's `msg` adds to a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDelivery {
    pub stream: String,
    pub consumer: String,
    pub seq: u64,
    pub delivered: u64,
}

/// Reads the stream fields of a `msg` argument, if it has them.
pub(super) fn delivery(fields: &Map<String, Value>) -> Option<StreamDelivery> {
    Some(StreamDelivery {
        stream: fields.get("stream")?.as_str()?.to_string(),
        consumer: fields.get("consumer")?.as_str()?.to_string(),
        seq: fields.get("seq")?.as_u64()?,
        delivered: fields.get("delivered")?.as_u64()?,
    })
}

fn field<T: serde::de::DeserializeOwned>(v: &Value, key: &str) -> Result<T, Error> {
    let f = v
        .get(key)
        .ok_or_else(|| Error::Protocol(format!("ack without {key}: {v}")))?;
    serde_json::from_value(f.clone()).map_err(|e| Error::Protocol(format!("bad {key}: {e}")))
}

impl Client {
    /// `stream.create`; the same config again is accepted.
    pub fn stream_create(&self, cfg: &StreamConfig) -> Result<StreamInfo, Error> {
        let v = self.call("stream.create", to_json(cfg)?)?;
        field(&v, "stream")
    }

    pub fn stream_info(&self, name: &str) -> Result<StreamInfo, Error> {
        let v = self.call("stream.info", json!({ "name": name }))?;
        field(&v, "stream")
    }

    pub fn stream_list(&self) -> Result<Vec<StreamInfo>, Error> {
        let v = self.call("stream.list", json!({}))?;
        field(&v, "streams")
    }

    pub fn stream_delete(&self, name: &str) -> Result<(), Error> {
        self.call("stream.delete", json!({ "name": name }))
            .map(|_| ())
    }

    /// `stream.purge` of every message, or of those on `subject`; returns
    /// how many went.
    pub fn stream_purge(&self, name: &str, subject: Option<&str>) -> Result<u64, Error> {
        let mut arg = json!({ "name": name });
        if let Some(s) = subject {
            arg["subject"] = json!(s);
        }
        let v = self.call("stream.purge", arg)?;
        field(&v, "purged")
    }

    /// `stream.get` by sequence; binary data comes back in `bytes`.
    pub fn stream_get(&self, name: &str, seq: u64) -> Result<StoredMessage, Error> {
        self.get_message(json!({ "name": name, "seq": seq }))
    }

    pub fn stream_get_last(&self, name: &str, subject: &str) -> Result<StoredMessage, Error> {
        self.get_message(json!({ "name": name, "last_by_subject": subject }))
    }

    fn get_message(&self, arg: Value) -> Result<StoredMessage, Error> {
        let (v, attachments) = self.call_with_attachments("stream.get", arg)?;
        let mut m: StoredMessage = field(&v, "message")?;
        m.attach(&attachments);
        Ok(m)
    }

    /// Publishes JSON `data` to a subject a stream captures and returns
    /// the stream's ack (after the message is stored).
    pub fn publish_stream(
        &self,
        subject: &str,
        data: impl serde::Serialize,
    ) -> Result<PubAck, Error> {
        let msg = OutMessage::new(subject, Payload::Json(to_json(data)?));
        self.publish_stream_msg(&msg)
    }

    /// [`Client::publish_stream`] with headers (e.g. `Msg-Id`).
    pub fn publish_stream_msg(&self, msg: &OutMessage) -> Result<PubAck, Error> {
        let v = self.publish_msg(msg, true)?;
        if v.is_null() {
            return Err(Error::Protocol(
                "the publish was held while reconnecting: no stream ack to return".into(),
            ));
        }
        serde_json::from_value(v.clone())
            .map_err(|_| Error::Protocol(format!("no stream captured the publish: {v}")))
    }

    pub fn consumer_create(
        &self,
        stream: &str,
        cfg: &ConsumerConfig,
    ) -> Result<ConsumerInfo, Error> {
        let mut arg = to_json(cfg)?;
        arg["stream"] = json!(stream);
        let v = self.call("consumer.create", arg)?;
        field(&v, "consumer")
    }

    pub fn consumer_info(&self, stream: &str, name: &str) -> Result<ConsumerInfo, Error> {
        let v = self.call("consumer.info", json!({ "stream": stream, "name": name }))?;
        field(&v, "consumer")
    }

    pub fn consumer_list(&self, stream: &str) -> Result<Vec<ConsumerInfo>, Error> {
        let v = self.call("consumer.list", json!({ "stream": stream }))?;
        field(&v, "consumers")
    }

    pub fn consumer_delete(&self, stream: &str, name: &str) -> Result<(), Error> {
        self.call("consumer.delete", json!({ "stream": stream, "name": name }))
            .map(|_| ())
    }

    /// `consumer.fetch`: up to `batch` messages, waiting up to `expires`
    /// for the first one (`None`: answer at once, `no_wait`).
    pub fn fetch(
        &self,
        stream: &str,
        consumer: &str,
        batch: u64,
        expires: Option<Duration>,
    ) -> Result<Vec<StoredMessage>, Error> {
        let mut arg = json!({ "stream": stream, "consumer": consumer, "batch": batch });
        match expires {
            Some(d) => arg["expires_ms"] = json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => arg["no_wait"] = json!(true),
        }
        let wait = expires
            .unwrap_or_default()
            .saturating_add(self.shared.opts.timeout);
        let reply = self
            .shared
            .emit("consumer.fetch", arg, &[], Some(wait), false)?
            .ok_or_else(|| Error::Protocol("fetch without ack".to_string()))?;
        let mut messages: Vec<StoredMessage> = field(&reply.value, "messages")?;
        for m in &mut messages {
            m.attach(&reply.attachments);
        }
        Ok(messages)
    }

    fn ack_call(
        &self,
        event: &str,
        stream: &str,
        consumer: &str,
        seq: u64,
        delay: Option<Duration>,
    ) -> Result<(), Error> {
        let mut arg = json!({ "stream": stream, "consumer": consumer, "seq": seq });
        if let Some(d) = delay {
            arg["delay_ms"] = json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        self.call(event, arg).map(|_| ())
    }

    /// `ack`: done with `seq` (returns once the ack is stored).
    pub fn ack(&self, stream: &str, consumer: &str, seq: u64) -> Result<(), Error> {
        self.ack_call("ack", stream, consumer, seq, None)
    }

    /// `nak`: deliver `seq` again, after `delay`.
    pub fn nak(
        &self,
        stream: &str,
        consumer: &str,
        seq: u64,
        delay: Duration,
    ) -> Result<(), Error> {
        self.ack_call("nak", stream, consumer, seq, Some(delay))
    }

    /// `term`: never deliver `seq` again.
    pub fn term(&self, stream: &str, consumer: &str, seq: u64) -> Result<(), Error> {
        self.ack_call("term", stream, consumer, seq, None)
    }

    /// `wip`: still working on `seq`; restarts its ack wait.
    pub fn wip(&self, stream: &str, consumer: &str, seq: u64) -> Result<(), Error> {
        self.ack_call("wip", stream, consumer, seq, None)
    }
}
