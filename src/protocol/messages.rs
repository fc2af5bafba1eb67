//! Typed requests for the events of the contract, read with serde straight
//! from the event's first argument. Pass-through values (`data`, `headers`)
//! stay raw JSON text so a delivery re-uses the publisher's bytes.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::errors::{ApiError, Code};

#[derive(Debug, Deserialize)]
pub struct Sub<'a> {
    #[serde(borrow)]
    pub subject: Cow<'a, str>,
    #[serde(borrow, default)]
    pub queue: Option<Cow<'a, str>>,
    #[serde(default)]
    pub sid: Option<SidValue>,
    #[serde(default)]
    pub max: Option<u64>,
}

/// A client-chosen sid: a string, or a number taken as its decimal text.
/// Read by a small visitor rather than serde's `untagged`, which buffers
/// the value in serde's `Content` first; what it accepts and the error for
/// anything else are the same.
#[derive(Debug)]
pub enum SidValue {
    Text(String),
    Number(u64),
}

impl<'de> Deserialize<'de> for SidValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SidVisitor)
    }
}

struct SidVisitor;

impl SidVisitor {
    fn refuse<E: serde::de::Error>(self) -> Result<SidValue, E> {
        Err(E::custom(
            "data did not match any variant of untagged enum SidValue",
        ))
    }
}

impl<'de> serde::de::Visitor<'de> for SidVisitor {
    type Value = SidValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or a non-negative integer")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<SidValue, E> {
        Ok(SidValue::Text(s.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<SidValue, E> {
        Ok(SidValue::Text(s))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<SidValue, E> {
        Ok(SidValue::Number(n))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<SidValue, E> {
        match u64::try_from(n) {
            Ok(n) => Ok(SidValue::Number(n)),
            Err(_) => self.refuse(),
        }
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<SidValue, E> {
        self.refuse()
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<SidValue, E> {
        self.refuse()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<SidValue, E> {
        self.refuse()
    }

    // The whole value is read before the refusal, as `untagged` did.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<SidValue, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        self.refuse()
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SidValue, A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        self.refuse()
    }
}

impl SidValue {
    pub fn into_string(self) -> String {
        match self {
            SidValue::Text(s) => s,
            SidValue::Number(n) => n.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct Unsub {
    pub sid: SidValue,
    #[serde(default)]
    pub after: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct Pub<'a> {
    #[serde(borrow)]
    pub subject: Cow<'a, str>,
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub reply: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub headers: Option<&'a RawValue>,
}

/// A `pub` argument as the broker uses it, however it was read: `data` and
/// `headers` are raw JSON text, `None` when left out or `null`.
#[derive(Debug, PartialEq, Eq)]
pub struct PubArg<'a> {
    pub subject: Cow<'a, str>,
    pub data: Option<&'a str>,
    pub reply: Option<Cow<'a, str>>,
    pub headers: Option<&'a str>,
}

impl<'a> From<Pub<'a>> for PubArg<'a> {
    fn from(p: Pub<'a>) -> PubArg<'a> {
        PubArg {
            subject: p.subject,
            data: p.data.map(RawValue::get),
            reply: p.reply,
            headers: p.headers.map(RawValue::get),
        }
    }
}

/// Reads the argument of a `pub` event packet: the hand scanner
/// ([`super::pub_scan`]) where it can answer, else serde (same answers).
pub fn read_pub(data: &str) -> Result<PubArg<'_>, ArgError> {
    match super::pub_scan::scan_pub(data) {
        Some(p) => Ok(p),
        None => read_pub_serde(data),
    }
}

#[cold]
#[inline(never)]
fn read_pub_serde(data: &str) -> Result<PubArg<'_>, ArgError> {
    event_arg::<Pub>(data).map(PubArg::from)
}

#[derive(Debug, Deserialize)]
pub struct Request<'a> {
    #[serde(borrow)]
    pub subject: Cow<'a, str>,
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub headers: Option<&'a RawValue>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct GroupSet {
    pub queue: String,
    pub mode: String,
}

/// Reads an event argument into `T`; a missing argument or wrong shape is
/// `bad_request` with serde's description of what was wrong.
pub fn parse_arg<'a, T: Deserialize<'a>>(arg: Option<&'a RawValue>) -> Result<T, ApiError> {
    let arg =
        arg.ok_or_else(|| ApiError::new(Code::BadRequest, "the event needs an object argument"))?;
    serde_json::from_str(arg.get())
        .map_err(|e| ApiError::new(Code::BadRequest, format!("bad arguments: {e}")))
}

/// Checks that headers are an object of string values.
pub fn check_headers(headers: Option<&RawValue>) -> Result<(), ApiError> {
    check_headers_text(headers.map(RawValue::get))
}

/// [`check_headers`] for headers as raw JSON text.
pub fn check_headers_text(headers: Option<&str>) -> Result<(), ApiError> {
    let Some(h) = headers else { return Ok(()) };
    if h == "null" {
        return Ok(());
    }
    serde_json::from_str::<StringMap>(h)
        .map(|_| ())
        .map_err(|_| {
            ApiError::new(
                Code::BadRequest,
                "headers must be an object of string values",
            )
        })
}

/// Reads a JSON object whose values are all strings and keeps nothing:
/// keys and values are read as a `String` would be (escapes decoded and
/// checked), without a map or a copy.
struct StringMap;

/// One string, read and dropped.
struct AnyString;

impl<'de> Deserialize<'de> for StringMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StringMap, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = StringMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of string values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<StringMap, A::Error> {
                while m.next_entry::<AnyString, AnyString>()?.is_some() {}
                Ok(StringMap)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AnyString, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = AnyString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<AnyString, E> {
                Ok(AnyString)
            }
        }
        d.deserialize_string(V)
    }
}

#[cfg(test)]
mod tests {
    /// `SidValue` as serde's `untagged` derive read it.
    mod old {
        #[derive(Debug, serde::Deserialize)]
        #[serde(untagged)]
        pub enum SidValue {
            Text(String),
            Number(u64),
        }

        #[derive(Debug, serde::Deserialize)]
        pub struct Unsub {
            pub sid: SidValue,
            #[serde(default)]
            pub after: Option<u64>,
        }
    }

    #[test]
    fn sids_are_read_as_the_untagged_derive_read_them() {
        let cases = [
            r#""s1""#,
            r#""a\u00e9\n""#,
            "0",
            "7",
            "18446744073709551615",
            "18446744073709551616",
            "-1",
            "1.5",
            "1e3",
            "true",
            "null",
            "[]",
            "[1,\"x\"]",
            "{}",
            r#"{"a":[1,{"b":2}]}"#,
            r#"{"a":1"#,
            r#""x" y"#,
            "",
        ];
        for c in cases {
            let text = format!(r#"{{"sid":{c},"after":1}}"#);
            let old = serde_json::from_str::<old::Unsub>(&text)
                .map(|u| {
                    let sid = match u.sid {
                        old::SidValue::Text(t) => super::SidValue::Text(t),
                        old::SidValue::Number(n) => super::SidValue::Number(n),
                    };
                    format!("{sid:?} {:?}", u.after)
                })
                .map_err(|e| e.to_string());
            let new = serde_json::from_str::<super::Unsub>(&text)
                .map(|u| format!("{:?} {:?}", u.sid, u.after))
                .map_err(|e| e.to_string());
            assert_eq!(new, old, "{c}");
        }
    }

    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn reads_pub_with_raw_data() {
        let r = raw(r#"{"subject":"a.b","data":{"x":[1, 2]},"reply":"r.1","headers":{"k":"v"}}"#);
        let p: Pub = parse_arg(Some(&r)).unwrap();
        assert_eq!(p.subject, "a.b");
        assert_eq!(p.data.map(|d| d.get()), Some(r#"{"x":[1, 2]}"#));
        assert_eq!(p.reply.as_deref(), Some("r.1"));
        assert!(check_headers(p.headers).is_ok());
    }

    #[test]
    fn refuses_bad_shapes() {
        assert_eq!(parse_arg::<Pub>(None).unwrap_err().code, Code::BadRequest);
        let r = raw(r#"{"data":1}"#);
        assert_eq!(
            parse_arg::<Pub>(Some(&r)).unwrap_err().code,
            Code::BadRequest
        );
        let r = raw(r#""text""#);
        assert_eq!(
            parse_arg::<Sub>(Some(&r)).unwrap_err().code,
            Code::BadRequest
        );
        let h = raw(r#"{"k":1}"#);
        assert_eq!(check_headers(Some(&h)).unwrap_err().code, Code::BadRequest);
        let h = raw(r#"["k"]"#);
        assert!(check_headers(Some(&h)).is_err());
    }

    /// The header check accepts exactly what a map of strings accepts.
    #[test]
    fn header_check_matches_a_map_of_strings() {
        type Map<'a> = std::collections::BTreeMap<Cow<'a, str>, Cow<'a, str>>;
        for h in [
            r#"{}"#,
            r#"{"k":"v"}"#,
            r#" { "k" : "v" , "k" : "w" , "\u00e9\n" : "\"x\"" } "#,
            r#"{"k":"\ud83d\ude00"}"#,
            r#"{"k":"\ud800"}"#,
            r#"{"\udc00":"v"}"#,
            r#"{"k":"\x"}"#,
            r#"{"k":1}"#,
            r#"{"k":null}"#,
            r#"{"k":["v"]}"#,
            r#"{"k":{"a":"b"}}"#,
            r#"{"k":"v",}"#,
            r#"{"k":"v"} x"#,
            r#"{"k":"v""#,
            r#"{k:"v"}"#,
            r#"["k","v"]"#,
            r#""kv""#,
            r#"1"#,
            r#"true"#,
            "{\"k\":\"\u{1}\"}",
        ] {
            let want = serde_json::from_str::<Map>(h).is_ok();
            assert_eq!(check_headers_text(Some(h)).is_ok(), want, "{h}");
        }
        assert!(check_headers_text(Some("null")).is_ok());
        assert!(check_headers_text(None).is_ok());
    }

    #[test]
    fn sids_may_be_numbers() {
        let r = raw(r#"{"subject":"a","sid":7}"#);
        let s: Sub = parse_arg(Some(&r)).unwrap();
        assert_eq!(s.sid.map(SidValue::into_string).as_deref(), Some("7"));
    }
}

/// Why an event's argument could not be read.
#[derive(Debug)]
pub enum ArgError {
    /// The packet's JSON is broken: the connection closes.
    Malformed,
    /// Well-formed JSON with the wrong shape: a `bad_request` ack.
    Api(ApiError),
}

impl From<ApiError> for ArgError {
    fn from(e: ApiError) -> ArgError {
        ArgError::Api(e)
    }
}

/// Reads the first argument of an event packet `["name", arg, …]` as `T` in
/// one pass over the JSON (the publish hot path parses each byte once).
pub fn event_arg<'a, T: Deserialize<'a>>(data: &'a str) -> Result<T, ArgError> {
    use serde::de::{Deserializer as _, IgnoredAny, SeqAccess, Visitor};
    struct FirstArg<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for FirstArg<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an event array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
            seq.next_element::<IgnoredAny>()?;
            let arg = seq.next_element::<T>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(arg)
        }
    }
    let mut de = serde_json::Deserializer::from_str(data);
    let parsed = de
        .deserialize_seq(FirstArg(std::marker::PhantomData))
        .and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(ArgError::Api(ApiError::new(
            Code::BadRequest,
            "the event needs an object argument",
        ))),
        Err(e) if e.classify() == serde_json::error::Category::Data => Err(ArgError::Api(
            ApiError::new(Code::BadRequest, format!("bad arguments: {e}")),
        )),
        // A syntax error may come from the argument's shape rather than
        // the JSON: an argument array with more values than the request
        // has fields, or a number out of range. Only JSON that does not
        // parse at all (checked again, off the hot path) closes.
        Err(e) if well_formed(data) => Err(ArgError::Api(ApiError::new(
            Code::BadRequest,
            shape_message(&e),
        ))),
        Err(_) => Err(ArgError::Malformed),
    }
}

/// Whether `data` is one JSON value, whatever its shape.
fn well_formed(data: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(data).is_ok()
}

/// The `bad_request` message for a well-formed argument that failed with
/// what serde calls a syntax error.
fn shape_message(e: &serde_json::Error) -> String {
    if e.to_string().starts_with("trailing characters") {
        "bad arguments: the argument array has more values than the request has fields".into()
    } else {
        format!("bad arguments: {e}")
    }
}

#[cfg(test)]
mod event_arg_tests {
    use super::*;

    #[test]
    fn reads_the_first_argument_in_one_pass() {
        let p: Pub = event_arg(r#"["pub",{"subject":"a","data":[1,2]},"extra"]"#).unwrap();
        assert_eq!(p.subject, "a");
        assert_eq!(p.data.map(|d| d.get()), Some("[1,2]"));
        assert!(
            matches!(event_arg::<Pub>(r#"["pub"]"#), Err(ArgError::Api(e)) if e.code == Code::BadRequest)
        );
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",{"data":1}]"#),
            Err(ArgError::Api(_))
        ));
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",5]"#),
            Err(ArgError::Api(_))
        ));
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",{"#),
            Err(ArgError::Malformed)
        ));
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",{"subject":"a"}] x"#),
            Err(ArgError::Malformed)
        ));
    }

    #[test]
    fn an_argument_array_too_long_is_a_bad_request_not_a_broken_packet() {
        for data in [
            r#"["pub",["a.b",1,"r.x",{},5]]"#,
            r#"["sub",["a.b","s1","q",2,"x"]]"#,
            r#"["unsub",["s1",1,2]]"#,
        ] {
            let e = match data {
                d if d.starts_with(r#"["pub""#) => event_arg::<Pub>(d).map(|_| ()),
                d if d.starts_with(r#"["sub""#) => event_arg::<Sub>(d).map(|_| ()),
                d => event_arg::<Unsub>(d).map(|_| ()),
            };
            match e {
                Err(ArgError::Api(e)) => {
                    assert_eq!(e.code, Code::BadRequest, "{data}");
                    assert!(e.message.contains("more values"), "{data}: {}", e.message);
                }
                other => panic!("{data}: {other:?}"),
            }
        }
        // Shorter arrays were already refused as bad arguments.
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",[]]"#),
            Err(ArgError::Api(_))
        ));
        // A number out of range is a bad argument too.
        assert!(matches!(
            event_arg::<Sub>(r#"["sub",{"subject":"a","max":1e400}]"#),
            Err(ArgError::Api(_))
        ));
        // Broken JSON still closes.
        assert!(matches!(
            event_arg::<Pub>(r#"["pub",["a.b",1,]]"#),
            Err(ArgError::Malformed)
        ));
    }
}
