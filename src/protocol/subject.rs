//! Subject rules (part of the wire contract): what a valid publish subject and
//! a valid subscription pattern look like, and a plain reference matcher that
//! the subscription index is checked against.
//!
//! A subject is a sequence of non-empty tokens joined by `.`. Tokens never hold
//! whitespace. In patterns, the token `*` stands for exactly one token and the
//! token `>` for one or more tokens (only as the last token). Any other token
//! that contains `*` or `>` is rejected outright rather than read as a literal,
//! so that nobody mistakes `a*` for a prefix match.

use std::fmt;

/// Upper bound, in bytes, on the length of a subject or a pattern.
pub const SUBJECT_BYTES_MAX: usize = 256;

/// Why a subject or pattern was refused. All variants map to the contract's
/// `bad_subject` error; the variant only sharpens the human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectError {
    /// The string is empty.
    Empty,
    /// The string is longer than [`SUBJECT_BYTES_MAX`] bytes.
    TooLong,
    /// A token is empty (leading, trailing or doubled `.`).
    EmptyToken,
    /// A token contains a whitespace character.
    Whitespace,
    /// A token contains `*` or `>` without being exactly `*` or `>`.
    BadWildcard,
    /// A wildcard token appears in a publish subject.
    WildcardNotAllowed,
    /// `>` appears somewhere other than as the last token.
    FullWildcardNotLast,
}

impl fmt::Display for SubjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            SubjectError::Empty => "subject is empty",
            SubjectError::TooLong => "subject is longer than 256 bytes",
            SubjectError::EmptyToken => "subject has an empty token",
            SubjectError::Whitespace => "subject contains whitespace",
            SubjectError::BadWildcard => {
                "`*` and `>` are only allowed as whole tokens of a subscription"
            }
            SubjectError::WildcardNotAllowed => "wildcards are not allowed when publishing",
            SubjectError::FullWildcardNotLast => "`>` is only allowed as the last token",
        };
        f.write_str(text)
    }
}

impl std::error::Error for SubjectError {}

/// Checks a subject that a message is published to: wildcards are refused.
pub fn validate_subject(s: &str) -> Result<(), SubjectError> {
    check(s, false)
}

/// Checks a subscription pattern: `*` and a trailing `>` are allowed.
pub fn validate_pattern(s: &str) -> Result<(), SubjectError> {
    check(s, true)
}

/// True if the (valid) pattern holds a `*` or `>` token, i.e. it can match
/// more than the one subject spelled exactly like it.
/// The common case, checked in one pass over the bytes: printable ASCII,
/// no wildcard characters, no empty token. Anything else takes the full
/// check, which also names the error.
fn plain_ascii(s: &[u8]) -> bool {
    let mut after_dot = true;
    for &b in s {
        match b {
            b'.' if after_dot => return false,
            b'.' => after_dot = true,
            b'*' | b'>' => return false,
            0x21..=0x7e => after_dot = false,
            _ => return false,
        }
    }
    !after_dot
}

pub fn has_wildcard(pattern: &str) -> bool {
    pattern.split('.').any(|token| token == "*" || token == ">")
}

/// Reference matcher: does `pattern` match `subject`? Walks both token by
/// token. Both are assumed valid; the answer for invalid input is unspecified
/// (but the function does not panic).
pub fn matches(pattern: &str, subject: &str) -> bool {
    let mut pattern_tokens = pattern.split('.');
    let mut subject_tokens = subject.split('.');
    loop {
        match (pattern_tokens.next(), subject_tokens.next()) {
            (None, None) => return true,
            // `>` swallows this token and everything after it.
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(p), Some(s)) if p == s => {}
            _ => return false,
        }
    }
}

/// Shared validation. Errors are reported in a fixed order: emptiness, length,
/// empty tokens, then the first offending token from the left.
fn check(s: &str, wildcards_allowed: bool) -> Result<(), SubjectError> {
    if s.len() <= SUBJECT_BYTES_MAX && plain_ascii(s.as_bytes()) {
        return Ok(());
    }
    if s.is_empty() {
        return Err(SubjectError::Empty);
    }
    if s.len() > SUBJECT_BYTES_MAX {
        return Err(SubjectError::TooLong);
    }
    if s.starts_with('.') || s.ends_with('.') || s.contains("..") {
        return Err(SubjectError::EmptyToken);
    }
    let mut tokens = s.split('.').peekable();
    while let Some(token) = tokens.next() {
        match token {
            "*" | ">" => {
                if !wildcards_allowed {
                    return Err(SubjectError::WildcardNotAllowed);
                }
                if token == ">" && tokens.peek().is_some() {
                    return Err(SubjectError::FullWildcardNotLast);
                }
            }
            _ => {
                for c in token.chars() {
                    if c.is_whitespace() {
                        return Err(SubjectError::Whitespace);
                    }
                    if c == '*' || c == '>' {
                        return Err(SubjectError::BadWildcard);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_table() {
        // (pattern, subject, expected)
        let table: &[(&str, &str, bool)] = &[
            // literals
            ("a", "a", true),
            ("a", "b", false),
            ("a.b", "a.b", true),
            ("a.b", "a.c", false),
            ("a.b", "a", false),
            ("a", "a.b", false),
            ("a.b.c", "a.b.c", true),
            ("a.b.c", "a.b", false),
            ("a.b", "a.b.c", false),
            ("foo", "fo", false),
            ("fo", "foo", false),
            ("foo.bar", "foo.barr", false),
            // `*`: exactly one token
            ("*", "a", true),
            ("*", "a.b", false),
            ("*.b", "a.b", true),
            ("*.b", "a.c", false),
            ("*.b", "a.b.c", false),
            ("*.b", "b", false),
            ("a.*", "a.b", true),
            ("a.*", "a", false),
            ("a.*", "a.b.c", false),
            ("a.*", "b.a", false),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.x.c", true),
            ("a.*.c", "a.b.d", false),
            ("a.*.c", "a.c", false),
            ("a.*.c", "a.b.b.c", false),
            ("*.*", "a.b", true),
            ("*.*", "a", false),
            ("*.*", "a.b.c", false),
            ("*.*.*", "x.y.z", true),
            // `>`: one or more tokens
            (">", "a", true),
            (">", "a.b", true),
            (">", "a.b.c", true),
            ("a.>", "a", false),
            ("a.>", "a.b", true),
            ("a.>", "a.b.c", true),
            ("a.>", "b.c", false),
            ("a.>", "ab.c", false),
            ("a.b.>", "a.b", false),
            ("a.b.>", "a.b.c", true),
            ("a.b.>", "a.b.c.d.e", true),
            ("a.b.>", "a.c.d", false),
            // mixed
            ("*.>", "a", false),
            ("*.>", "a.b", true),
            ("*.>", "a.b.c", true),
            ("*.b.>", "a.b.c", true),
            ("*.b.>", "a.b", false),
            ("*.b.>", "a.c.d", false),
            ("a.*.>", "a.b.c", true),
            ("a.*.>", "a.b", false),
            ("*.*.>", "a.b.c.d", true),
            // a literal token must match the whole subject token
            ("a.bc", "a.b", false),
            ("a.b", "a.bc", false),
        ];
        for &(pattern, subject, expected) in table {
            assert_eq!(
                matches(pattern, subject),
                expected,
                "matches({pattern:?}, {subject:?})"
            );
        }
    }

    #[test]
    fn valid_subjects_and_patterns() {
        let subjects = [
            "a",
            "a.b",
            "foo.bar.baz",
            "_INBOX.abc123",
            "ñ.日本",
            "a-b_c.d:e",
            "A.B",
        ];
        for s in subjects {
            assert_eq!(validate_subject(s), Ok(()), "subject {s:?}");
            assert_eq!(validate_pattern(s), Ok(()), "pattern {s:?}");
        }
        let patterns = ["*", ">", "a.*", "a.>", "*.b", "*.*.>", "a.*.c.>", "*.>"];
        for p in patterns {
            assert_eq!(validate_pattern(p), Ok(()), "pattern {p:?}");
        }
        let longest = "a".repeat(SUBJECT_BYTES_MAX);
        assert_eq!(validate_subject(&longest), Ok(()));
        assert_eq!(validate_pattern(&longest), Ok(()));
    }

    #[test]
    fn invalid_subjects() {
        let too_long = "a".repeat(SUBJECT_BYTES_MAX + 1);
        let too_long_tokens = "ab.".repeat(85) + "ab"; // 257 bytes
        let too_long_multibyte = "é".repeat(129); // 258 bytes, 129 chars
        let table: Vec<(&str, SubjectError)> = vec![
            ("", SubjectError::Empty),
            (&too_long, SubjectError::TooLong),
            (&too_long_tokens, SubjectError::TooLong),
            (&too_long_multibyte, SubjectError::TooLong),
            (".", SubjectError::EmptyToken),
            ("a..b", SubjectError::EmptyToken),
            (".a", SubjectError::EmptyToken),
            ("a.", SubjectError::EmptyToken),
            ("..", SubjectError::EmptyToken),
            ("a.>.", SubjectError::EmptyToken),
            ("a b", SubjectError::Whitespace),
            ("a.\tb", SubjectError::Whitespace),
            (" a", SubjectError::Whitespace),
            ("a\n", SubjectError::Whitespace),
            ("a.b\r", SubjectError::Whitespace),
            ("a\u{00A0}b", SubjectError::Whitespace),
            ("a\u{3000}", SubjectError::Whitespace),
            ("*", SubjectError::WildcardNotAllowed),
            (">", SubjectError::WildcardNotAllowed),
            ("a.*", SubjectError::WildcardNotAllowed),
            ("a.>", SubjectError::WildcardNotAllowed),
            ("a.>.b", SubjectError::WildcardNotAllowed),
            ("*.b", SubjectError::WildcardNotAllowed),
            ("a*", SubjectError::BadWildcard),
            ("a.b*", SubjectError::BadWildcard),
            (">b", SubjectError::BadWildcard),
            ("a.**", SubjectError::BadWildcard),
            ("a.>>", SubjectError::BadWildcard),
            ("a.*>", SubjectError::BadWildcard),
        ];
        for (s, expected) in table {
            assert_eq!(validate_subject(s), Err(expected), "subject {s:?}");
        }
    }

    #[test]
    fn invalid_patterns() {
        let too_long = "*.".repeat(128) + "*"; // 257 bytes
        let table: Vec<(&str, SubjectError)> = vec![
            ("", SubjectError::Empty),
            (&too_long, SubjectError::TooLong),
            ("a..b", SubjectError::EmptyToken),
            (".a", SubjectError::EmptyToken),
            ("a.", SubjectError::EmptyToken),
            ("*.", SubjectError::EmptyToken),
            (".>", SubjectError::EmptyToken),
            ("a.>.", SubjectError::EmptyToken),
            ("a b", SubjectError::Whitespace),
            ("a.\tb", SubjectError::Whitespace),
            ("*.a b", SubjectError::Whitespace),
            ("a.>.b", SubjectError::FullWildcardNotLast),
            (">.a", SubjectError::FullWildcardNotLast),
            (">.>", SubjectError::FullWildcardNotLast),
            ("a.>.*", SubjectError::FullWildcardNotLast),
            ("a*", SubjectError::BadWildcard),
            ("*a", SubjectError::BadWildcard),
            (">b", SubjectError::BadWildcard),
            ("a.b>", SubjectError::BadWildcard),
            ("**", SubjectError::BadWildcard),
            ("*>", SubjectError::BadWildcard),
            ("a.**.>", SubjectError::BadWildcard),
        ];
        for (s, expected) in table {
            assert_eq!(validate_pattern(s), Err(expected), "pattern {s:?}");
        }
    }

    #[test]
    fn matcher_does_not_panic_on_invalid_input() {
        for (p, s) in [("", ""), ("*", ""), ("a.", "a."), (">", "."), ("..", "a")] {
            let _ = matches(p, s);
        }
    }

    #[test]
    fn wildcard_detection() {
        assert!(!has_wildcard("a.b.c"));
        assert!(has_wildcard("*"));
        assert!(has_wildcard(">"));
        assert!(has_wildcard("a.*.c"));
        assert!(has_wildcard("a.b.>"));
    }

    #[test]
    fn display_messages() {
        assert_eq!(
            SubjectError::EmptyToken.to_string(),
            "subject has an empty token"
        );
        let all = [
            SubjectError::Empty,
            SubjectError::TooLong,
            SubjectError::EmptyToken,
            SubjectError::Whitespace,
            SubjectError::BadWildcard,
            SubjectError::WildcardNotAllowed,
            SubjectError::FullWildcardNotLast,
        ];
        for e in all {
            assert!(!e.to_string().is_empty());
        }
    }
}
