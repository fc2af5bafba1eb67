//! What one user may do (docs/PROTOCOL.md §11): subject rules for publish
//! and subscribe with pattern-against-pattern coverage, the deny patterns
//! that cut into an allowed wildcard subscription, the stream rights, and
//! a bounded per-connection cache of publish decisions.

use std::collections::HashMap;

use crate::protocol::subject;

/// Allow and deny patterns for one direction (publish or subscribe). A
/// subject is allowed when an allow pattern covers it and no deny pattern
/// covers it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    allow: Vec<Box<str>>,
    deny: Vec<Box<str>>,
}

/// The answer to a subscribe: refused, or allowed with the deny patterns
/// that overlap the subscription without covering it (its cuts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubDecision {
    Forbidden,
    Allowed(Cuts),
}

/// Deny patterns kept on one subscription: a delivery whose subject one of
/// them matches is skipped. Empty for almost every subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cuts(Box<[Box<str>]>);

impl Cuts {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when this (publish) subject may not reach the subscription.
    pub fn denies(&self, subject: &str) -> bool {
        self.0.iter().any(|d| subject::matches(d, subject))
    }
}

impl Rules {
    /// Every subject (`allow: [">"]`, no deny).
    pub fn everything() -> Rules {
        Rules {
            allow: vec![">".into()],
            deny: Vec::new(),
        }
    }

    /// Rules from pattern lists; every pattern must be a valid
    /// subscription pattern (docs/PROTOCOL.md §3).
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> Result<Rules, String> {
        for p in allow.iter().chain(&deny) {
            subject::validate_pattern(p).map_err(|e| format!("bad pattern {p:?}: {e}"))?;
        }
        Ok(Rules {
            allow: allow.into_iter().map(String::into_boxed_str).collect(),
            deny: deny.into_iter().map(String::into_boxed_str).collect(),
        })
    }

    /// May a message be published to this (wildcard-free) subject?
    pub fn allows_subject(&self, subject: &str) -> bool {
        self.allow.iter().any(|a| covers(a, subject))
            && !self.deny.iter().any(|d| covers(d, subject))
    }

    /// Decides a subscription once: allowed when an allow pattern covers
    /// the whole pattern and no deny pattern does; the deny patterns that
    /// still overlap it become its cuts.
    pub fn decide_sub(&self, pattern: &str) -> SubDecision {
        if !self.allow.iter().any(|a| covers(a, pattern)) {
            return SubDecision::Forbidden;
        }
        if self.deny.iter().any(|d| covers(d, pattern)) {
            return SubDecision::Forbidden;
        }
        let cuts: Vec<Box<str>> = self
            .deny
            .iter()
            .filter(|d| intersects(d, pattern))
            .cloned()
            .collect();
        SubDecision::Allowed(Cuts(cuts.into_boxed_slice()))
    }
}

/// Does pattern `p` cover pattern `q`: is every subject `q` matches also
/// matched by `p`? A subject is a pattern without wildcards, so this is
/// also plain matching. `orders.>` covers `orders.*`; `orders.*` does not
/// cover `orders.>`.
pub fn covers(p: &str, q: &str) -> bool {
    let mut ps = p.split('.');
    let mut qs = q.split('.');
    loop {
        match (ps.next(), qs.next()) {
            (None, None) => return true,
            // `>` takes the rest, which is at least this one token.
            (Some(">"), Some(_)) => return true,
            // `*` stands for any one token, but not for `>`'s many.
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b && a != "*" && a != ">" => {}
            _ => return false,
        }
    }
}

/// Is there a subject both patterns match?
pub fn intersects(a: &str, b: &str) -> bool {
    let mut xs = a.split('.');
    let mut ys = b.split('.');
    loop {
        match (xs.next(), ys.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(x), Some(y)) if x == y => {}
            _ => return false,
        }
    }
}

/// Which streams a user may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamAccess {
    /// `"*"` in the list.
    All,
    Names(Vec<Box<str>>),
}

impl StreamAccess {
    pub fn allows(&self, name: &str) -> bool {
        match self {
            StreamAccess::All => true,
            StreamAccess::Names(names) => names.iter().any(|n| &**n == name),
        }
    }
}

/// What a stream event needs: use of the stream, or administration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamNeed {
    Use,
    Admin,
}

/// The right a stream event needs, and the argument field that names its
/// stream; `None` for events that are not stream events (and for
/// `stream.list`, which is filtered rather than refused).
pub fn stream_need(event: &str) -> Option<(StreamNeed, &'static str)> {
    Some(match event {
        "stream.create" | "stream.delete" | "stream.purge" => (StreamNeed::Admin, "name"),
        "stream.info" | "stream.get" => (StreamNeed::Use, "name"),
        "consumer.create" | "consumer.delete" => (StreamNeed::Admin, "stream"),
        "consumer.info" | "consumer.list" | "consumer.fetch" | "ack" | "nak" | "term" | "wip" => {
            (StreamNeed::Use, "stream")
        }
        _ => return None,
    })
}

/// Everything one user may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    pub publish: Rules,
    pub subscribe: Rules,
    /// May publish once to the reply subject of each request delivered.
    pub allow_responses: bool,
    pub streams: StreamAccess,
    pub stream_admin: bool,
}

impl Rights {
    /// Every right: the `-auth-token` user, or `/` with no token at all.
    pub fn all() -> Rights {
        Rights {
            publish: Rules::everything(),
            subscribe: Rules::everything(),
            allow_responses: true,
            streams: StreamAccess::All,
            stream_admin: true,
        }
    }

    /// No right at all: a connection on its way out after a reload.
    pub fn none() -> Rights {
        Rights {
            publish: Rules::default(),
            subscribe: Rules::default(),
            allow_responses: false,
            streams: StreamAccess::Names(Vec::new()),
            stream_admin: false,
        }
    }

    /// May this stream event be used on stream `name`?
    pub fn may_stream(&self, name: &str, need: StreamNeed) -> bool {
        self.streams.allows(name) && (need == StreamNeed::Use || self.stream_admin)
    }
}

/// Publish decisions of one connection, per subject: a publish costs one
/// lookup once its subject was decided, and a publish to the same subject
/// as the one before it only a comparison (publishers mostly repeat a
/// subject, and hashing it cost about 5 % of a publish). At most
/// [`PUB_CACHE_ENTRIES_MAX`] are kept; a full cache starts again empty.
#[derive(Debug, Default)]
pub struct PubCache {
    decided: HashMap<Box<str>, bool>,
    /// The subject of the last decision (its buffer reused) and the
    /// decision; `last_set` is false until there is one.
    last: String,
    last_ok: bool,
    last_set: bool,
}

/// Bound on the subjects one connection's cache remembers: at most about
/// 70 KiB per socket with 256-byte subjects, and more distinct subjects
/// than a publisher normally cycles through.
pub const PUB_CACHE_ENTRIES_MAX: usize = 256;

impl PubCache {
    /// The decision for `subject` under `rules`, from the cache when known.
    pub fn allows(&mut self, rules: &Rules, subject: &str) -> bool {
        if self.last_set && self.last == subject {
            return self.last_ok;
        }
        let ok = match self.decided.get(subject) {
            Some(&ok) => ok,
            None => {
                let ok = rules.allows_subject(subject);
                if self.decided.len() >= PUB_CACHE_ENTRIES_MAX {
                    self.decided.clear();
                }
                self.decided.insert(subject.into(), ok);
                ok
            }
        };
        self.last.clear();
        self.last.push_str(subject);
        self.last_ok = ok;
        self.last_set = true;
        ok
    }

    /// Forgets every decision (the rights changed).
    pub fn clear(&mut self) {
        self.decided.clear();
        self.last_set = false;
    }

    pub fn len(&self) -> usize {
        self.decided.len()
    }

    pub fn is_empty(&self) -> bool {
        self.decided.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        Rules::new(v(allow), v(deny)).unwrap()
    }

    #[test]
    fn coverage_table() {
        // (p, q, p covers q)
        let table = [
            ("a.b", "a.b", true),
            ("a.b", "a.c", false),
            ("a.*", "a.b", true),
            ("a.*", "a.*", true),
            ("a.*", "a.>", false),
            ("a.*", "a.b.c", false),
            ("a.>", "a.b", true),
            ("a.>", "a.*", true),
            ("a.>", "a.*.c", true),
            ("a.>", "a.>", true),
            ("a.>", "a", false),
            ("a.>", "b.c", false),
            (">", "a", true),
            (">", "*", true),
            (">", ">", true),
            ("*", ">", false),
            ("*.b", "a.*", false),
            ("*.*", "a.*", true),
            ("a.b", "a.*", false),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.*.>", false),
        ];
        for (p, q, want) in table {
            assert_eq!(covers(p, q), want, "covers({p:?}, {q:?})");
        }
    }

    #[test]
    fn intersection_table() {
        let table = [
            ("a.b", "a.b", true),
            ("a.b", "a.c", false),
            ("a.*", "*.b", true),
            ("a.>", "*.b.c", true),
            ("a.>", "a", false),
            ("a.*", "a.b.c", false),
            (">", "x.y", true),
            ("*", "a.b", false),
            ("a.*.c", "a.b.*", true),
            ("a.*.c", "a.b.d", false),
        ];
        for (a, b, want) in table {
            assert_eq!(intersects(a, b), want, "intersects({a:?}, {b:?})");
            assert_eq!(intersects(b, a), want, "intersects({b:?}, {a:?})");
        }
    }

    #[test]
    fn publish_table() {
        let r = rules(&["orders.>", "billing.*"], &["orders.internal.>"]);
        let table = [
            ("orders.new", true),
            ("orders.eu.new", true),
            ("orders", false),
            ("orders.internal.audit", false),
            ("orders.internal", true),
            ("billing.run", true),
            ("billing.run.now", false),
            ("other", false),
        ];
        for (s, want) in table {
            assert_eq!(r.allows_subject(s), want, "{s}");
        }
        assert!(
            !Rules::default().allows_subject("a"),
            "a missing list allows nothing"
        );
        assert!(Rules::everything().allows_subject("a.b.c"));
    }

    #[test]
    fn subscribe_table() {
        let r = rules(&["orders.>"], &["orders.internal.>", "orders.*.secret"]);
        let cut =
            |c: &[&str]| SubDecision::Allowed(Cuts(c.iter().map(|x| Box::from(*x)).collect()));
        let table = [
            ("orders.new", cut(&[])),
            ("orders.*", cut(&[])),
            ("orders.>", cut(&["orders.internal.>", "orders.*.secret"])),
            ("orders.*.*", cut(&["orders.internal.>", "orders.*.secret"])),
            ("orders.eu.*", cut(&["orders.*.secret"])),
            ("orders.internal.>", SubDecision::Forbidden),
            ("orders.internal.x", SubDecision::Forbidden),
            ("orders.eu.secret", SubDecision::Forbidden),
            (">", SubDecision::Forbidden),
            ("*.new", SubDecision::Forbidden),
            ("billing.x", SubDecision::Forbidden),
        ];
        for (p, want) in table {
            assert_eq!(r.decide_sub(p), want, "{p}");
        }
    }

    #[test]
    fn cuts_skip_only_denied_subjects() {
        let r = rules(&[">"], &["orders.internal.>"]);
        let SubDecision::Allowed(c) = r.decide_sub("orders.>") else {
            panic!("orders.> should be allowed");
        };
        assert!(c.denies("orders.internal.audit"));
        assert!(!c.denies("orders.new"));
        let SubDecision::Allowed(c) = r.decide_sub("billing.*") else {
            panic!("billing.* should be allowed");
        };
        assert!(c.is_empty(), "a deny that does not overlap is no cut");
    }

    #[test]
    fn stream_rights() {
        let mut r = Rights::all();
        r.streams = StreamAccess::Names(vec!["ORDERS".into()]);
        r.stream_admin = false;
        assert!(r.may_stream("ORDERS", StreamNeed::Use));
        assert!(!r.may_stream("ORDERS", StreamNeed::Admin));
        assert!(!r.may_stream("OTHER", StreamNeed::Use));
        assert_eq!(stream_need("ack"), Some((StreamNeed::Use, "stream")));
        assert_eq!(
            stream_need("stream.purge"),
            Some((StreamNeed::Admin, "name"))
        );
        assert_eq!(stream_need("stream.list"), None);
    }

    #[test]
    fn the_publish_cache_is_bounded_and_agrees_with_the_rules() {
        let r = rules(&["a.*"], &["a.x"]);
        let mut c = PubCache::default();
        for i in 0..(PUB_CACHE_ENTRIES_MAX * 2 + 7) {
            let s = format!("a.{i}");
            assert!(c.allows(&r, &s));
            assert!(c.len() <= PUB_CACHE_ENTRIES_MAX);
        }
        assert!(!c.allows(&r, "a.x"));
        assert!(!c.allows(&r, "a.x"), "a cached refusal stays a refusal");
        assert!(c.allows(&r, "a.y"));
        assert!(
            !c.allows(&r, "a.x"),
            "the last subject is no shortcut for another"
        );
        c.clear();
        assert!(c.is_empty());
        assert!(
            !c.allows(&Rules::default(), "a.y"),
            "cleared, it decides again"
        );
    }
}
