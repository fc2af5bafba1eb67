//! The contract's error codes and the one-object ack bodies that carry them
//! (`{"ok":true,…}` or `{"ok":false,"error":{"code":"…","message":"…"}}`).

use serde_json::value::RawValue;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    BadRequest,
    BadSubject,
    PayloadTooLarge,
    NoResponders,
    Timeout,
    NotFound,
    Exists,
    Unauthorized,
    Unavailable,
    /// The user's rights do not allow it (docs/PROTOCOL.md §11).
    Forbidden,
    Limit,
    Internal,
    /// A compare-and-set found another revision (docs/PROTOCOL.md §14).
    WrongRevision,
}

impl Code {
    pub const ALL: [Code; 13] = [
        Code::BadRequest,
        Code::BadSubject,
        Code::PayloadTooLarge,
        Code::NoResponders,
        Code::Timeout,
        Code::NotFound,
        Code::Exists,
        Code::Unauthorized,
        Code::Unavailable,
        Code::Forbidden,
        Code::Limit,
        Code::Internal,
        Code::WrongRevision,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad_request",
            Code::BadSubject => "bad_subject",
            Code::PayloadTooLarge => "payload_too_large",
            Code::NoResponders => "no_responders",
            Code::Timeout => "timeout",
            Code::NotFound => "not_found",
            Code::Exists => "exists",
            Code::Unauthorized => "unauthorized",
            Code::Unavailable => "unavailable",
            Code::Forbidden => "forbidden",
            Code::Limit => "limit",
            Code::Internal => "internal",
            Code::WrongRevision => "wrong_revision",
        }
    }
}

/// A refused request: a code from the contract and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    /// `wrong_revision`'s `error.revision`: the key's latest revision.
    pub revision: Option<u64>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            revision: None,
        }
    }

    /// The ack argument array: `[{"ok":false,"error":{…}}]`.
    pub fn ack_body(&self) -> String {
        let revision = self
            .revision
            .map_or(String::new(), |r| format!(",\"revision\":{r}"));
        format!(
            "[{{\"ok\":false,\"error\":{{\"code\":\"{}\",\"message\":{}{revision}}}}}]",
            self.code.as_str(),
            serde_json::Value::from(self.message.as_str())
        )
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// `[{"ok":true}]`
pub const OK_BODY: &str = "[{\"ok\":true}]";

/// `[{"ok":true,<fields>}]` where `fields` is a JSON object's inner text
/// (`"sid":"1"`) or empty.
pub fn ok_body(fields: &str) -> String {
    if fields.is_empty() {
        return OK_BODY.to_string();
    }
    format!("[{{\"ok\":true,{fields}}}]")
}

/// `[{"ok":true, …every field of obj…}]` for a serde_json object.
pub fn ok_with(obj: serde_json::Value) -> String {
    let text = obj.to_string();
    match text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        Some(inner) if obj.is_object() => ok_body(inner),
        _ => OK_BODY.to_string(),
    }
}

/// A raw JSON value as it was received, for pass-through fields.
pub fn raw_text(v: Option<&RawValue>) -> &str {
    v.map_or("null", |r| r.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_contracts() {
        let names: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "bad_request",
                "bad_subject",
                "payload_too_large",
                "no_responders",
                "timeout",
                "not_found",
                "exists",
                "unauthorized",
                "unavailable",
                "forbidden",
                "limit",
                "internal",
                "wrong_revision"
            ]
        );
    }

    #[test]
    fn a_wrong_revision_carries_the_latest() {
        let mut e = ApiError::new(Code::WrongRevision, "x");
        e.revision = Some(7);
        let v: serde_json::Value = serde_json::from_str(&e.ack_body()).unwrap();
        assert_eq!(v[0]["error"]["code"], "wrong_revision");
        assert_eq!(v[0]["error"]["revision"], 7);
    }

    #[test]
    fn bodies_are_one_object_arrays() {
        let e = ApiError::new(Code::BadSubject, "subject \"a..b\" has an empty token");
        let v: serde_json::Value = serde_json::from_str(&e.ack_body()).unwrap();
        assert_eq!(v[0]["ok"], false);
        assert_eq!(v[0]["error"]["code"], "bad_subject");
        assert_eq!(
            v[0]["error"]["message"],
            "subject \"a..b\" has an empty token"
        );
        assert_eq!(v.as_array().map(|a| a.len()), Some(1));
        assert_eq!(ok_body(""), r#"[{"ok":true}]"#);
        assert_eq!(ok_body(r#""sid":"1""#), r#"[{"ok":true,"sid":"1"}]"#);
        assert_eq!(
            ok_with(serde_json::json!({"groups": []})),
            r#"[{"ok":true,"groups":[]}]"#
        );
    }
}
