//! The client's key-value API (contract section 14): [`Client::kv_create`]
//! and a [`Kv`] handle on one bucket with `put`, `update` (compare-and-
//! set), `get`, `delete`, `purge`, `keys`, `history`, each one `kv.*`
//! call, and `watch` ([`KvWatch`], routed like a subscription under a sid
//! the client picks). Values are JSON or bytes ([`Payload`]).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Client, Error, Payload};
use crate::protocol::socketio::placeholder_num;

/// A bucket's configuration; `None` fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BucketConfig {
    pub bucket: String,
    /// Writes kept per key, 1-64 (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_value_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u64>,
}

impl BucketConfig {
    pub fn new(bucket: &str) -> BucketConfig {
        BucketConfig {
            bucket: bucket.to_string(),
            ..BucketConfig::default()
        }
    }
}

/// One write of a key.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEntry {
    pub key: String,
    /// The value of a put (`None` for a delete or purge marker).
    pub value: Option<Payload>,
    pub revision: u64,
    /// Milliseconds since the Unix epoch, when it was stored.
    pub time_ms: u64,
    /// `put`, `delete` or `purge`.
    pub op: String,
}

impl KvEntry {
    fn from_json(v: &Value, attachments: &[Vec<u8>]) -> Result<KvEntry, Error> {
        let bad = || Error::Protocol(format!("not a bucket entry: {v}"));
        let value =
            v.get("value").map(
                |d| match placeholder_num(d).and_then(|n| attachments.get(n)) {
                    Some(b) => Payload::Bytes(b.clone()),
                    None => Payload::Json(d.clone()),
                },
            );
        Ok(KvEntry {
            key: v["key"].as_str().ok_or_else(bad)?.to_string(),
            value,
            revision: v["revision"].as_u64().ok_or_else(bad)?,
            time_ms: v["time"].as_u64().unwrap_or(0),
            op: v["op"].as_str().ok_or_else(bad)?.to_string(),
        })
    }
}

/// A handle on bucket `bucket` of a [`Client`].
#[derive(Debug, Clone, Copy)]
pub struct Kv<'a> {
    client: &'a Client,
    bucket: &'a str,
}

impl Client {
    /// `kv.create`: makes the bucket (the same config again is fine);
    /// returns its `{config, state}`.
    pub fn kv_create(&self, cfg: &BucketConfig) -> Result<Value, Error> {
        let arg = serde_json::to_value(cfg).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok(self.call("kv.create", arg)?["bucket"].take())
    }

    /// `kv.delete_bucket`.
    pub fn kv_delete_bucket(&self, bucket: &str) -> Result<(), Error> {
        self.call("kv.delete_bucket", json!({ "bucket": bucket }))
            .map(drop)
    }

    /// `kv.list`: every bucket's `{config, state}`.
    pub fn kv_list(&self) -> Result<Vec<Value>, Error> {
        let mut v = self.call("kv.list", json!({}))?;
        Ok(match v["buckets"].take() {
            Value::Array(a) => a,
            _ => Vec::new(),
        })
    }

    /// A handle on bucket `bucket`.
    pub fn kv<'a>(&'a self, bucket: &'a str) -> Kv<'a> {
        Kv {
            client: self,
            bucket,
        }
    }
}

impl Kv<'_> {
    fn write(
        &self,
        event: &str,
        key: &str,
        value: Option<&Payload>,
        revision: Option<u64>,
    ) -> Result<u64, Error> {
        let mut arg = json!({ "bucket": self.bucket, "key": key });
        if let Some(r) = revision {
            arg["revision"] = json!(r);
        }
        let mut attachments = Vec::new();
        match value {
            Some(Payload::Json(v)) => arg["value"] = v.clone(),
            Some(Payload::Bytes(b)) => {
                arg["value"] = json!({"_placeholder": true, "num": 0});
                attachments.push(b.clone());
            }
            None => {}
        }
        let reply = self.client.call_sending(event, arg, &attachments)?;
        reply["revision"]
            .as_u64()
            .ok_or_else(|| Error::Protocol(format!("{event} without a revision: {reply}")))
    }

    /// `kv.put`; the new revision.
    pub fn put(&self, key: &str, value: impl Into<Payload>) -> Result<u64, Error> {
        self.write("kv.put", key, Some(&value.into()), None)
    }

    /// `kv.put` with compare-and-set: succeeds only while the key is at
    /// `revision` (`0`: no value). A refusal is [`Error::Server`] with code
    /// `wrong_revision` and the key's latest `revision`.
    pub fn update(
        &self,
        key: &str,
        value: impl Into<Payload>,
        revision: u64,
    ) -> Result<u64, Error> {
        self.write("kv.put", key, Some(&value.into()), Some(revision))
    }

    /// `kv.delete` (a delete marker), with compare-and-set when `revision`.
    pub fn delete(&self, key: &str, revision: Option<u64>) -> Result<u64, Error> {
        self.write("kv.delete", key, None, revision)
    }

    /// `kv.purge`: a purge marker, and every earlier write of the key goes.
    pub fn purge(&self, key: &str) -> Result<u64, Error> {
        self.write("kv.purge", key, None, None)
    }

    /// `kv.get`: the latest value (`None` when there is none, or the key
    /// was deleted or purged).
    pub fn get(&self, key: &str) -> Result<Option<KvEntry>, Error> {
        self.get_at(key, None)
    }

    /// `kv.get` of write `revision` of the key (`None` when it is gone).
    pub fn get_at(&self, key: &str, revision: Option<u64>) -> Result<Option<KvEntry>, Error> {
        let mut arg = json!({ "bucket": self.bucket, "key": key });
        if let Some(r) = revision {
            arg["revision"] = json!(r);
        }
        match self.client.call_with_attachments("kv.get", arg) {
            Ok((v, atts)) => KvEntry::from_json(&v["entry"], &atts).map(Some),
            Err(e) if e.code() == Some("not_found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `kv.history`: every kept write of the key, oldest first.
    pub fn history(&self, key: &str) -> Result<Vec<KvEntry>, Error> {
        let arg = json!({ "bucket": self.bucket, "key": key });
        match self.client.call_with_attachments("kv.history", arg) {
            Ok((v, atts)) => v["entries"]
                .as_array()
                .map(|a| a.iter().map(|e| KvEntry::from_json(e, &atts)).collect())
                .unwrap_or_else(|| Ok(Vec::new())),
            Err(e) if e.code() == Some("not_found") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// `kv.keys`: the keys with a value, matching `filter` (a key pattern)
    /// when given.
    pub fn keys(&self, filter: Option<&str>) -> Result<Vec<String>, Error> {
        let mut arg = json!({ "bucket": self.bucket });
        if let Some(f) = filter {
            arg["filter"] = json!(f);
        }
        let v = self.client.call("kv.keys", arg)?;
        Ok(v["keys"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `kv.info`: the bucket's `{config, state}`.
    pub fn info(&self) -> Result<Value, Error> {
        Ok(self
            .client
            .call("kv.info", json!({ "bucket": self.bucket }))?["bucket"]
            .take())
    }
}

/// What a [`KvWatch`] hands out.
#[derive(Debug, Clone, PartialEq)]
pub enum KvWatchEvent {
    /// A write: first the starting values, later each new write.
    Entry(KvEntry),
    /// The starting values are all there; what follows is new.
    CaughtUp,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WatchFrom {
    /// The latest write of each key (default).
    #[default]
    Latest,
    /// Every kept write.
    History,
    /// Only writes made from now on.
    UpdatesOnly,
}

/// A `kv.watch`: the writes of the watched keys, in revision order. After
/// a reconnect the client watches again (the starting values and
/// [`KvWatchEvent::CaughtUp`] come again). Dropping it ends the watch.
#[derive(Debug)]
pub struct KvWatch {
    sub: super::Subscription,
}

impl KvWatch {
    /// Waits at most `timeout` for the next event.
    pub fn next_timeout(&self, timeout: std::time::Duration) -> Result<KvWatchEvent, Error> {
        let m = self.sub.recv_timeout(timeout)?;
        if m.data.get("caught_up") == Some(&Value::Bool(true)) {
            return Ok(KvWatchEvent::CaughtUp);
        }
        KvEntry::from_json(&m.data, &m.attachments).map(KvWatchEvent::Entry)
    }

    /// Events as they come, until the client closes for good.
    pub fn iter(&self) -> impl Iterator<Item = KvWatchEvent> + '_ {
        self.sub.iter().filter_map(|m| {
            if m.data.get("caught_up") == Some(&Value::Bool(true)) {
                return Some(KvWatchEvent::CaughtUp);
            }
            KvEntry::from_json(&m.data, &m.attachments)
                .ok()
                .map(KvWatchEvent::Entry)
        })
    }

    /// Ends the watch on the server.
    pub fn stop(self) -> Result<(), Error> {
        self.sub.unsubscribe()
    }
}

impl Kv<'_> {
    /// `kv.watch` of the keys matching `key` (a key pattern; `None`: every
    /// key), starting as `from` says.
    pub fn watch(&self, key: Option<&str>, from: WatchFrom) -> Result<KvWatch, Error> {
        let mut arg = json!({ "bucket": self.bucket });
        if let Some(k) = key {
            arg["key"] = json!(k);
        }
        match from {
            WatchFrom::Latest => {}
            WatchFrom::History => arg["include_history"] = json!(true),
            WatchFrom::UpdatesOnly => arg["updates_only"] = json!(true),
        }
        let subject = format!("$KV.{}.{}", self.bucket, key.unwrap_or(">"));
        let sub = self.client.open_route(&subject, None, None, Some(arg))?;
        Ok(KvWatch { sub })
    }
}
