//! Typed requests of the key-value events (contract section 14): bucket
//! and key names, a bucket's configuration with its defaults, and how a
//! bucket maps onto its stream (`KV_<bucket>` capturing `$KV.<bucket>.>`,
//! `history` as `max_msgs_per_subject`, `ttl_ms` as `max_age_ms`,
//! `max_value_size` as `max_msg_size`). Pure.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::errors::{ApiError, Code};
use super::stream_messages::{check_name, StreamConfig};
use super::subject;

/// Most writes of one key a bucket keeps.
pub const HISTORY_MAX: u64 = 64;
/// Longest key, in bytes.
pub const KEY_BYTES_MAX: usize = 256;
/// The prefix of a bucket's stream name.
pub const STREAM_PREFIX: &str = "KV_";
/// The first token of every bucket subject.
pub const SUBJECT_PREFIX: &str = "$KV.";
/// The header naming what a bucket write is: `DEL` (a delete marker) or
/// `PURGE` (a purge marker); a message without it is a put.
pub const KV_OP_HEADER: &str = "KV-Operation";
/// The header a compare-and-set publish carries: the revision (stream
/// sequence) its subject's latest message must have, in decimal; `0`
/// also stands for "none, or a delete or purge marker".
pub const EXPECTED_REVISION_HEADER: &str = "KV-Expected-Revision";

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

/// A bucket name: 1 to 64 of `A-Z a-z 0-9 _ -`.
pub fn check_bucket(name: &str) -> Result<(), ApiError> {
    check_name("bucket", name)
}

fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'/' | b'=')
}

/// A key: tokens of `A-Z a-z 0-9 _ - / =` joined by single dots, at most
/// [`KEY_BYTES_MAX`] bytes.
pub fn check_key(key: &str) -> Result<(), ApiError> {
    let ok = !key.is_empty()
        && key.len() <= KEY_BYTES_MAX
        && key
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(key_byte));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "key {key:?} must be tokens of A-Z a-z 0-9 _ - / = joined by single dots, \
             at most {KEY_BYTES_MAX} bytes"
        )))
    }
}

/// A key filter: a key whose tokens may also be `*`, and whose last may
/// be `>`.
pub fn check_key_filter(filter: &str) -> Result<(), ApiError> {
    let n = filter.split('.').count();
    let ok = !filter.is_empty()
        && filter.len() <= KEY_BYTES_MAX
        && filter.split('.').enumerate().all(|(i, t)| {
            t == "*" || (t == ">" && i == n - 1) || (!t.is_empty() && t.bytes().all(key_byte))
        });
    if ok {
        Ok(())
    } else {
        Err(bad(format!("key filter {filter:?} is not a key pattern")))
    }
}

/// The stream holding bucket `bucket`.
pub fn stream_name(bucket: &str) -> String {
    format!("{STREAM_PREFIX}{bucket}")
}

/// The bucket a stream holds, if it is a bucket's.
pub fn bucket_of_stream(stream: &str) -> Option<&str> {
    stream
        .strip_prefix(STREAM_PREFIX)
        .filter(|b| check_bucket(b).is_ok())
}

/// The subject of `key` in `bucket` (`key` may be a filter).
pub fn subject_of(bucket: &str, key: &str) -> String {
    format!("{SUBJECT_PREFIX}{bucket}.{key}")
}

/// The key of a subject of `bucket`.
pub fn key_of<'a>(bucket: &str, subj: &'a str) -> Option<&'a str> {
    subj.strip_prefix(SUBJECT_PREFIX)?
        .strip_prefix(bucket)?
        .strip_prefix('.')
}

/// Whether `subj` matches key filter `filter` (a key pattern).
pub fn key_matches(filter: &str, key: &str) -> bool {
    subject::matches(filter, key)
}

/// `kv.create`: a bucket's configuration as asked (defaults not yet
/// filled in).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReq {
    pub bucket: String,
    #[serde(default)]
    pub history: Option<u64>,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub max_value_size: Option<u64>,
    #[serde(default)]
    pub replicas: Option<u64>,
}

impl CreateReq {
    /// The `stream.create` argument of the bucket's stream; values larger
    /// than `max_payload` are refused at the door anyway, so that is the
    /// default `max_value_size`.
    pub fn stream_create(&self, max_payload: u64) -> Result<Map<String, Value>, ApiError> {
        check_bucket(&self.bucket)?;
        let history = self.history.unwrap_or(1);
        if !(1..=HISTORY_MAX).contains(&history) {
            return Err(bad(format!("history must be 1 to {HISTORY_MAX}")));
        }
        let mut m = Map::new();
        m.insert("name".into(), stream_name(&self.bucket).into());
        m.insert("subjects".into(), json!([subject_of(&self.bucket, ">")]));
        m.insert("max_msgs_per_subject".into(), history.into());
        m.insert("max_age_ms".into(), self.ttl_ms.unwrap_or(0).into());
        m.insert("max_bytes".into(), self.max_bytes.unwrap_or(0).into());
        let size = self.max_value_size.unwrap_or(max_payload);
        m.insert("max_msg_size".into(), size.into());
        if let Some(r) = self.replicas {
            m.insert("replicas".into(), r.into());
        }
        Ok(m)
    }
}

/// A bucket's `config` as `kv.info` shows it, from its stream's.
pub fn bucket_config(cfg: &StreamConfig, replicas: u64) -> Value {
    json!({
        "bucket": bucket_of_stream(&cfg.name).unwrap_or_default(),
        "history": cfg.max_msgs_per_subject.max(1),
        "ttl_ms": cfg.max_age_ms,
        "max_bytes": cfg.max_bytes,
        "max_value_size": cfg.max_msg_size,
        "replicas": replicas,
    })
}

#[derive(Debug, Deserialize)]
pub struct BucketReq {
    pub bucket: String,
}

/// `kv.put`, `kv.delete`, `kv.purge`, `kv.get`, `kv.history`: the key and
/// the revision (the one to compare with, or the one to read).
#[derive(Debug, Deserialize)]
pub struct KeyReq<'a> {
    pub bucket: String,
    pub key: String,
    #[serde(default, borrow)]
    pub value: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    pub revision: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct KeysReq {
    pub bucket: String,
    #[serde(default)]
    pub filter: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WatchReq {
    pub bucket: String,
    /// The watch's sid, chosen by the client (else the broker picks one).
    #[serde(default)]
    pub sid: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub updates_only: Option<bool>,
    #[serde(default)]
    pub include_history: Option<bool>,
}

/// The headers of a bucket write: its operation (none for a put) and the
/// revision it expects, as raw JSON, or `None` when it needs none.
pub fn write_headers(op: Option<&str>, expected: Option<u64>) -> Option<String> {
    let mut m = Map::new();
    if let Some(op) = op {
        m.insert(KV_OP_HEADER.into(), op.into());
    }
    if let Some(r) = expected {
        m.insert(EXPECTED_REVISION_HEADER.into(), r.to_string().into());
    }
    (!m.is_empty()).then(|| Value::Object(m).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_filters() {
        for ok in ["a", "a.b", "cfg/x=1.dev-1_2", &"k".repeat(KEY_BYTES_MAX)] {
            assert!(check_key(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "a b",
            "a*",
            "*",
            ">",
            "é",
            &"k".repeat(KEY_BYTES_MAX + 1),
        ] {
            assert_eq!(check_key(bad).unwrap_err().code, Code::BadRequest, "{bad}");
        }
        for ok in ["a", "a.*", "*.b", ">", "a.>"] {
            assert!(check_key_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a.>.b", "a..b", "a b", "a*"] {
            assert!(check_key_filter(bad).is_err(), "{bad}");
        }
        assert!(check_bucket("cfg_1-x").is_ok());
        assert!(check_bucket("a.b").is_err());
    }

    #[test]
    fn a_bucket_is_a_stream() {
        let req: CreateReq = serde_json::from_str(r#"{"bucket":"cfg","history":5}"#).unwrap();
        let m = req.stream_create(1024).unwrap();
        let cfg: StreamConfig = serde_json::from_value(Value::Object(m)).unwrap();
        assert_eq!(cfg.name, "KV_cfg");
        assert_eq!(cfg.subjects, vec!["$KV.cfg.>"]);
        assert_eq!((cfg.max_msgs_per_subject, cfg.max_msg_size), (5, 1024));
        let shown = bucket_config(&cfg, 1);
        assert_eq!(shown["bucket"], "cfg");
        assert_eq!(shown["history"], 5);
        assert_eq!(key_of("cfg", "$KV.cfg.a.b"), Some("a.b"));
        assert_eq!(key_of("cfg", "$KV.cfgx.a"), None);
        for h in [0, 65] {
            let r: CreateReq =
                serde_json::from_str(&format!(r#"{{"bucket":"b","history":{h}}}"#)).unwrap();
            assert!(r.stream_create(1).is_err());
        }
    }
}
