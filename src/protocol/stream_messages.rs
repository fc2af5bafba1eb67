//! Typed requests and configurations for the stream and consumer events
//! (contract section 5): what `stream.*`, `consumer.*`, `ack`, `nak`,
//! `term` and `wip` carry, the defaults of every optional field, and the
//! checks that turn a bad name or config into `bad_request`.
//!
//! Names of streams and consumers are 1 to 64 characters from
//! `[A-Za-z0-9_-]`, so that they are safe as directory and file names.

use serde::{Deserialize, Serialize};

use super::errors::{ApiError, Code};
use super::subject;

/// Longest stream or consumer name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;
/// Most subjects one stream may capture.
pub const STREAM_SUBJECTS_MAX: usize = 64;
/// Default `ack_wait_ms` (contract: 30 s).
pub const ACK_WAIT_MS_DEFAULT: u64 = 30_000;
/// Default and largest `max_ack_pending`: what one consumer keeps unacked.
pub const MAX_ACK_PENDING_DEFAULT: u64 = 1_000;
pub const MAX_ACK_PENDING_MAX: u64 = 100_000;
/// Largest `batch` of one `consumer.fetch`.
pub const FETCH_BATCH_MAX: u64 = 1_000;
/// Default and largest `expires_ms` of a waiting fetch.
pub const FETCH_EXPIRES_MS_DEFAULT: u64 = 5_000;
pub const FETCH_EXPIRES_MS_MAX: u64 = 300_000;
/// Largest `duplicate_window_ms` (one day).
pub const DUPLICATE_WINDOW_MS_MAX: u64 = 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    #[default]
    Limits,
    Workqueue,
    Interest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Discard {
    #[default]
    Old,
    New,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeliverPolicy {
    #[default]
    All,
    New,
    Last,
    ByStartSeq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AckPolicy {
    #[default]
    Explicit,
    None,
    All,
}

/// A stream's configuration with every default filled in; `0` in a limit
/// means "no limit". This is what `stream.info` shows and what decides
/// whether a second `stream.create` is the same stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    pub name: String,
    pub subjects: Vec<String>,
    #[serde(default)]
    pub retention: Retention,
    #[serde(default)]
    pub max_msgs: u64,
    #[serde(default)]
    pub max_bytes: u64,
    #[serde(default)]
    pub max_age_ms: u64,
    #[serde(default)]
    pub max_msg_size: u64,
    #[serde(default)]
    pub discard: Discard,
    #[serde(default)]
    pub duplicate_window_ms: u64,
    /// At most this many messages of one subject are kept (0: no limit).
    /// Left out of the JSON when 0, so that configs and snapshots written
    /// before it existed read and compare the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_msgs_per_subject: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl StreamConfig {
    /// Checks names, subjects and bounds; subjects are de-duplicated.
    pub fn validate(&mut self) -> Result<(), ApiError> {
        check_name("stream", &self.name)?;
        if self.subjects.is_empty() {
            return Err(bad("a stream needs at least one subject"));
        }
        if self.subjects.len() > STREAM_SUBJECTS_MAX {
            return Err(bad(format!(
                "a stream captures at most {STREAM_SUBJECTS_MAX} subjects"
            )));
        }
        for s in &self.subjects {
            subject::validate_pattern(s)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("{e}: {s:?}")))?;
        }
        for (i, a) in self.subjects.iter().enumerate() {
            if self.subjects[..i].iter().any(|b| patterns_overlap(a, b)) {
                return Err(bad(format!("subject {a:?} overlaps another of the stream")));
            }
        }
        if self.duplicate_window_ms > DUPLICATE_WINDOW_MS_MAX {
            return Err(bad("duplicate_window_ms is at most one day"));
        }
        Ok(())
    }
}

/// A consumer's configuration with defaults filled in (`0` for
/// `max_deliver` means "no limit").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_subject: Option<String>,
    #[serde(default)]
    pub deliver_policy: DeliverPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt_start_seq: Option<u64>,
    #[serde(default)]
    pub ack_policy: AckPolicy,
    #[serde(default = "ack_wait_default")]
    pub ack_wait_ms: u64,
    #[serde(default)]
    pub max_deliver: u64,
    #[serde(default = "max_ack_pending_default")]
    pub max_ack_pending: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_group: Option<String>,
}

fn ack_wait_default() -> u64 {
    ACK_WAIT_MS_DEFAULT
}

fn max_ack_pending_default() -> u64 {
    MAX_ACK_PENDING_DEFAULT
}

impl ConsumerConfig {
    pub fn validate(&mut self) -> Result<(), ApiError> {
        check_name("consumer", &self.name)?;
        if let Some(f) = &self.filter_subject {
            subject::validate_pattern(f)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("filter_subject: {e}")))?;
        }
        match (self.deliver_policy, self.opt_start_seq) {
            (DeliverPolicy::ByStartSeq, None | Some(0)) => {
                return Err(bad("deliver_policy by_start_seq needs opt_start_seq >= 1"))
            }
            (DeliverPolicy::ByStartSeq, Some(_)) => {}
            (_, Some(_)) => return Err(bad("opt_start_seq goes with deliver_policy by_start_seq")),
            _ => {}
        }
        if self.ack_wait_ms == 0 {
            return Err(bad("ack_wait_ms must be at least 1"));
        }
        if self.max_ack_pending == 0 || self.max_ack_pending > MAX_ACK_PENDING_MAX {
            return Err(bad(format!(
                "max_ack_pending must be 1 to {MAX_ACK_PENDING_MAX}"
            )));
        }
        if let Some(d) = &self.deliver_subject {
            subject::validate_subject(d)
                .map_err(|e| ApiError::new(Code::BadSubject, format!("deliver_subject: {e}")))?;
        }
        if let Some(g) = &self.deliver_group {
            if self.deliver_subject.is_none() {
                return Err(bad("deliver_group needs deliver_subject"));
            }
            if g.is_empty()
                || g.len() > subject::SUBJECT_BYTES_MAX
                || g.contains(char::is_whitespace)
            {
                return Err(bad("deliver_group must be a name without whitespace"));
            }
        }
        Ok(())
    }
}

/// `consumer.create`: the stream's name plus the consumer's config (the
/// object's other members). Read by hand rather than with serde's
/// `flatten`, which buffers every member in serde's `Content` first, with
/// the same results and errors: an object only, `stream` a string given
/// once, of other members given twice the last.
#[derive(Debug)]
pub struct ConsumerCreate {
    pub stream: String,
    pub config: serde_json::Map<String, serde_json::Value>,
}

impl<'de> Deserialize<'de> for ConsumerCreate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ConsumerCreateVisitor)
    }
}

struct ConsumerCreateVisitor;

impl<'de> serde::de::Visitor<'de> for ConsumerCreateVisitor {
    type Value = ConsumerCreate;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("struct ConsumerCreate")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<ConsumerCreate, A::Error> {
        let mut stream = None;
        let mut config = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "stream" {
                if stream.is_some() {
                    return Err(serde::de::Error::duplicate_field("stream"));
                }
                stream = Some(map.next_value::<String>()?);
            } else {
                config.insert(key, map.next_value()?);
            }
        }
        let stream = stream.ok_or_else(|| serde::de::Error::missing_field("stream"))?;
        Ok(ConsumerCreate { stream, config })
    }
}

#[derive(Debug, Deserialize)]
pub struct NameReq {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct PurgeReq {
    pub name: String,
    #[serde(default)]
    pub subject: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct GetReq {
    pub name: String,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub last_by_subject: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct StreamReq {
    pub stream: String,
}

#[derive(Debug, Deserialize)]
pub struct ConsumerReq {
    pub stream: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct FetchReq {
    pub stream: String,
    pub consumer: String,
    #[serde(default)]
    pub batch: Option<u64>,
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// `null` is the same as absent (false).
    #[serde(default)]
    pub no_wait: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct AckReq {
    pub stream: String,
    pub consumer: String,
    pub seq: u64,
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

/// Stream and consumer names: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    // A bucket's stream is its name (up to the same length) after `KV_`.
    let max = match name.strip_prefix("KV_") {
        Some(_) if what == "stream" => NAME_BYTES_MAX + 3,
        _ => NAME_BYTES_MAX,
    };
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "{what} name {name:?} must be 1 to {NAME_BYTES_MAX} characters of A-Z a-z 0-9 _ -"
        )))
    }
}

/// Reads a config object (a JSON object of the request's fields) into `T`
/// with every default filled in; unknown fields are `bad_request`. An
/// optional field given as `null` counts as absent (its default), as
/// clients that send every key of a request object do.
pub fn read_config<T: serde::de::DeserializeOwned>(
    mut fields: serde_json::Map<String, serde_json::Value>,
) -> Result<T, ApiError> {
    fields.retain(|_, v| !v.is_null());
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| bad(format!("bad config: {e}")))
}

/// Whether some subject matches both patterns (valid patterns assumed).
pub fn patterns_overlap(a: &str, b: &str) -> bool {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(p), Some(q)) => {
                if p != q && p != "*" && q != "*" {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_table() {
        let cases = [
            ("a.b", "a.b", true),
            ("a.b", "a.c", false),
            ("a.*", "a.b", true),
            ("a.>", "a.b.c", true),
            ("a.>", "a", false),
            ("*.b", "a.*", true),
            ("a.*", "a.b.c", false),
            (">", "x.y", true),
            ("a.b.>", "a.*.c", true),
            ("a.b.>", "a.*", false),
        ];
        for (a, b, want) in cases {
            assert_eq!(patterns_overlap(a, b), want, "{a} vs {b}");
            assert_eq!(patterns_overlap(b, a), want, "{b} vs {a}");
        }
    }

    #[test]
    fn names() {
        assert!(check_name("stream", "ORDERS_1-x").is_ok());
        for bad in ["", "a.b", "a b", "a/b", "é", &"x".repeat(65)] {
            assert_eq!(
                check_name("stream", bad).unwrap_err().code,
                Code::BadRequest
            );
        }
    }

    #[test]
    fn stream_config_defaults_and_checks() {
        let mut fields = serde_json::Map::new();
        fields.insert("name".into(), "S".into());
        fields.insert("subjects".into(), serde_json::json!(["a.>"]));
        let mut c: StreamConfig = read_config(fields.clone()).unwrap();
        c.validate().unwrap();
        assert_eq!(c.retention, Retention::Limits);
        assert_eq!(c.discard, Discard::Old);
        fields.insert("subjects".into(), serde_json::json!(["a.>", "a.b"]));
        let mut c: StreamConfig = read_config(fields.clone()).unwrap();
        assert_eq!(c.validate().unwrap_err().code, Code::BadRequest);
        fields.insert("retention".into(), "sometimes".into());
        assert!(read_config::<StreamConfig>(fields.clone()).is_err());
        fields.insert("retention".into(), serde_json::Value::Null);
        fields.insert("max_msgs".into(), serde_json::Value::Null);
        let mut c: StreamConfig = read_config(fields.clone()).unwrap();
        c.subjects = vec!["a.>".into()];
        c.validate().unwrap();
        assert_eq!((c.retention, c.max_msgs), (Retention::Limits, 0));
        fields.insert("colour".into(), "red".into());
        assert!(read_config::<StreamConfig>(fields).is_err());
    }

    #[test]
    fn consumer_config_checks() {
        let parse = |v: serde_json::Value| {
            let serde_json::Value::Object(m) = v else {
                panic!()
            };
            read_config::<ConsumerConfig>(m).and_then(|mut c| c.validate().map(|()| c))
        };
        let c = parse(serde_json::json!({"name":"c"})).unwrap();
        let n = parse(
            serde_json::json!({"name":"c","ack_wait_ms":null,"ack_policy":null,
            "deliver_policy":null,"filter_subject":null}),
        )
        .unwrap();
        assert_eq!(n, c);
        assert_eq!(c.ack_wait_ms, ACK_WAIT_MS_DEFAULT);
        assert_eq!(c.ack_policy, AckPolicy::Explicit);
        assert!(parse(serde_json::json!({"name":"c","deliver_policy":"by_start_seq"})).is_err());
        assert!(parse(serde_json::json!({"name":"c","opt_start_seq":3})).is_err());
        assert!(parse(serde_json::json!({"name":"c","max_ack_pending":0})).is_err());
        assert!(parse(serde_json::json!({"name":"c","deliver_group":"g"})).is_err());
        assert!(parse(serde_json::json!({"name":"c","filter_subject":"a..b"})).is_err());
    }
}
