//! The users file (`-users`, docs/PROTOCOL.md §11): its JSON form, parsed
//! strictly (unknown keys, bad patterns, empty or duplicate tokens and
//! names are refused with the line they are on), and the token lookup a
//! CONNECT makes, compared in constant time.

use std::fmt;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, Error as _};

use super::rights::{Rights, Rules, StreamAccess};
use crate::protocol::subject;

/// One user: a name for logs and metrics, a secret token, and rights.
#[derive(Clone)]
pub struct User {
    pub name: Arc<str>,
    token: Box<str>,
    pub rights: Arc<Rights>,
}

impl fmt::Debug for User {
    // The token is left out on purpose: it must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("rights", &self.rights)
            .finish_non_exhaustive()
    }
}

impl User {
    /// True when `token` is this user's (constant time for equal lengths).
    pub fn holds(&self, token: &str) -> bool {
        crate::crypto::token_eq(token.as_bytes(), self.token.as_bytes())
    }

    /// True when both hold the same token (a reload that changed a
    /// user's token ends the connections made with the old one).
    pub fn same_token(&self, other: &User) -> bool {
        self.holds(&other.token)
    }
}

/// Every user of a users file.
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: Vec<User>,
}

/// Why a users file was refused: the line (1-based) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsersError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for UsersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for UsersError {}

/// Bound on a users file's size; a larger one is refused unread.
pub const USERS_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    users: Vec<UserJson>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UserJson {
    name: NonEmpty,
    token: NonEmpty,
    publish: Option<RulesJson>,
    subscribe: Option<RulesJson>,
    #[serde(default)]
    allow_responses: bool,
    #[serde(default)]
    streams: Vec<NonEmpty>,
    #[serde(default)]
    stream_admin: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesJson {
    #[serde(default)]
    allow: Vec<Pattern>,
    #[serde(default)]
    deny: Vec<Pattern>,
}

/// A subject pattern, checked as it is read so a bad one is reported at
/// its own line.
struct Pattern(String);

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pattern, D::Error> {
        let s = String::deserialize(d)?;
        subject::validate_pattern(&s)
            .map_err(|e| D::Error::custom(format!("bad pattern {s:?}: {e}")))?;
        Ok(Pattern(s))
    }
}

/// A string that must not be empty (names, tokens, stream names). The
/// message never repeats the value: it may be a token.
struct NonEmpty(String);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NonEmpty, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Err(D::Error::custom("an empty string where a value is needed"));
        }
        Ok(NonEmpty(s))
    }
}

fn rules(r: Option<RulesJson>) -> Rules {
    let Some(r) = r else {
        return Rules::default();
    };
    let list = |v: Vec<Pattern>| v.into_iter().map(|p| p.0).collect();
    // The patterns were checked while reading.
    Rules::new(list(r.allow), list(r.deny)).unwrap_or_default()
}

impl Users {
    /// Parses a users file's text.
    pub fn parse(text: &str) -> Result<Users, UsersError> {
        let file: FileJson = serde_json::from_str(text).map_err(|e| UsersError {
            line: e.line().max(1),
            message: without_position(&e.to_string()),
        })?;
        let lines = user_lines(text);
        let line_of = |i: usize| lines.get(i).copied().unwrap_or(1);
        let mut users: Vec<User> = Vec::with_capacity(file.users.len());
        for (i, u) in file.users.into_iter().enumerate() {
            let name = u.name.0;
            if users.iter().any(|x| *x.name == *name) {
                return Err(UsersError {
                    line: line_of(i),
                    message: format!("user {name:?} is named twice"),
                });
            }
            if let Some(other) = users.iter().find(|x| x.holds(&u.token.0)) {
                return Err(UsersError {
                    line: line_of(i),
                    message: format!("user {name:?} has the same token as user {:?}", other.name),
                });
            }
            let streams: Vec<String> = u.streams.into_iter().map(|s| s.0).collect();
            let streams = if streams.iter().any(|s| s == "*") {
                StreamAccess::All
            } else {
                StreamAccess::Names(streams.into_iter().map(String::into_boxed_str).collect())
            };
            users.push(User {
                name: name.into(),
                token: u.token.0.into_boxed_str(),
                rights: Arc::new(Rights {
                    publish: rules(u.publish),
                    subscribe: rules(u.subscribe),
                    allow_responses: u.allow_responses,
                    streams,
                    stream_admin: u.stream_admin,
                }),
            });
        }
        Ok(Users { users })
    }

    /// The user whose token this is. Every user's token is compared, so
    /// the time taken does not tell which one matched.
    pub fn find(&self, token: &str) -> Option<&User> {
        let mut found = None;
        for u in &self.users {
            if u.holds(token) && found.is_none() {
                found = Some(u);
            }
        }
        found
    }

    pub fn by_name(&self, name: &str) -> Option<&User> {
        self.users.iter().find(|u| &*u.name == name)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.iter()
    }
}

/// Reads and parses the users file at `path`. The flag is true when the
/// file may be read by its group or by others (worth a warning: it holds
/// tokens).
pub fn read(path: &std::path::Path) -> Result<(Users, bool), String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > USERS_FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {USERS_FILE_BYTES_MAX} bytes",
            path.display()
        ));
    }
    let mut text = String::new();
    file.take(USERS_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let users = Users::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((users, meta.permissions().mode() & 0o077 != 0))
}

/// serde_json's message without its trailing " at line L column C" (the
/// line is reported on its own).
fn without_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// The line each object of the top-level `users` array opens on, in
/// order. Only called on text that parsed, whose top level holds nothing
/// but `users`.
fn user_lines(text: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let (mut line, mut depth) = (1usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => {
                if c == '{' && depth == 2 {
                    lines.push(line);
                }
                depth += 1;
            }
            '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::rights::{StreamNeed, SubDecision};

    const FILE: &str = r#"{"users": [
  {"name": "billing", "token": "tok-billing",
   "publish":   {"allow": ["orders.>", "billing.*"], "deny": ["orders.internal.>"]},
   "subscribe": {"allow": ["orders.*"], "deny": []},
   "allow_responses": true,
   "streams": ["ORDERS"], "stream_admin": false},
  {"name": "reader", "token": "tok-reader",
   "subscribe": {"allow": [">"]}}
]}"#;

    #[test]
    fn the_example_file_parses() {
        let users = Users::parse(FILE).unwrap();
        assert_eq!(users.len(), 2);
        let b = users.find("tok-billing").unwrap();
        assert_eq!(&*b.name, "billing");
        assert!(b.rights.publish.allows_subject("orders.new"));
        assert!(!b.rights.publish.allows_subject("orders.internal.x"));
        assert!(b.rights.allow_responses);
        assert!(b.rights.may_stream("ORDERS", StreamNeed::Use));
        assert!(!b.rights.may_stream("ORDERS", StreamNeed::Admin));
        let r = users.find("tok-reader").unwrap();
        assert!(
            !r.rights.publish.allows_subject("a"),
            "no publish list: nothing"
        );
        assert!(matches!(
            r.rights.subscribe.decide_sub(">"),
            SubDecision::Allowed(_)
        ));
        assert!(!r.rights.allow_responses);
        assert!(!r.rights.may_stream("ORDERS", StreamNeed::Use));
        assert!(users.find("tok-nobody").is_none());
        assert!(users.find("").is_none());
        assert!(users.by_name("reader").is_some());
    }

    #[test]
    fn refusals_name_the_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("{\"users\": [\n{\"name\": \"a\", \"token\": \"t\",\n \"colour\": 1}]}", 3, "unknown field"),
            ("{\"users\": [\n{\"name\": \"a\", \"token\": \"t\"},\n{\"name\": \"b\", \"token\": \"t\"}]}", 3, "same token"),
            ("{\"users\": [\n{\"name\": \"a\", \"token\": \"t\"},\n\n{\"name\": \"a\", \"token\": \"u\"}]}", 4, "named twice"),
            ("{\"users\": [\n{\"name\": \"a\", \"token\": \"t\",\n\"publish\": {\"allow\": [\"a.>.b\"]}}]}", 3, "bad pattern"),
            ("{\"users\": [\n{\"name\": \"a\", \"token\": \"\"}]}", 2, "empty"),
            ("{\"users\": [\n{\"name\": \"a\"\n\"token\": \"t\"}]}", 3, "expected"),
            ("{\"users\": [], \"extra\": 1}", 1, "unknown field"),
            ("", 1, "EOF"),
        ];
        for (text, line, needle) in cases {
            let e = Users::parse(text).unwrap_err();
            assert_eq!(e.line, *line, "{text:?}: {e}");
            assert!(e.message.contains(needle), "{text:?}: {e}");
            assert!(!e.to_string().contains("at line"), "{e}");
        }
    }

    #[test]
    fn a_refusal_never_repeats_a_token() {
        let text = "{\"users\": [{\"name\": \"a\", \"token\": \"s3cr3t\"}, {\"name\": \"b\", \"token\": \"s3cr3t\"}]}";
        let e = Users::parse(text).unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        assert!(!format!("{:?}", Users::parse(FILE).unwrap()).contains("tok-"));
    }

    #[test]
    fn a_wildcard_stream_entry_allows_every_stream() {
        let users = Users::parse(
            r#"{"users":[{"name":"a","token":"t","streams":["*"],"stream_admin":true}]}"#,
        )
        .unwrap();
        let a = users.find("t").unwrap();
        assert!(a.rights.may_stream("ANY", StreamNeed::Admin));
    }
}
