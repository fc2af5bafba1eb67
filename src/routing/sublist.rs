//! The subscription index: which subscriptions (plain and queue-group) a
//! published subject reaches. Owns the token trie that stores subscriptions by
//! pattern, the bounded per-subject match cache in front of it, and the
//! deterministic ordering of match results.
//!
//! The trie has one level per token. Each node keeps its literal children in a
//! hash map plus at most one `*` child and one `>` child, and holds the
//! subscriptions whose pattern ends at that node. A lookup follows the
//! subject's tokens down the literal and `*` branches and collects every `>`
//! child passed on the way, so its cost depends on the subject and on the
//! patterns that could match it, never on the total number of subscriptions.
//!
//! Patterns and subjects are validated by the caller (see
//! [`crate::protocol::subject`]); this module trusts them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::rc::Rc;

use crate::protocol::subject;

/// Most subjects the match cache remembers at once.
pub const CACHE_ENTRIES_MAX: usize = 4096;

/// Everything a subject reaches.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Match<T> {
    /// Plain subscribers, ascending, each value once.
    pub plain: Vec<T>,
    /// Queue groups, ascending by queue name, each name once.
    pub groups: Vec<QueueGroup<T>>,
}

impl<T> Match<T> {
    /// True when the subject reaches nobody.
    pub fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.groups.is_empty()
    }
}

/// The members of one queue group that a subject reaches.
#[derive(Debug, PartialEq, Eq)]
pub struct QueueGroup<T> {
    /// The queue name.
    pub queue: Rc<str>,
    /// Members, ascending, each value once.
    pub members: Vec<T>,
}

/// The subscription index. See the module documentation.
pub struct Sublist<T> {
    root: Node<T>,
    /// Number of distinct (pattern, queue, value) entries.
    entries: usize,
    /// Subject -> result. `None` when caching is turned off.
    cache: Option<HashMap<Box<str>, Rc<Match<T>>>>,
    /// Shared result for subjects that reach nobody, so that misses with no
    /// interest allocate nothing.
    empty: Rc<Match<T>>,
}

/// One trie level.
struct Node<T> {
    literal: HashMap<Box<str>, Node<T>>,
    star: Option<Box<Node<T>>>,
    full: Option<Box<Node<T>>>,
    /// Plain subscriptions ending here: sorted, no duplicates.
    plain: Vec<T>,
    /// Queue subscriptions ending here, by queue name; every member list is
    /// sorted, duplicate-free and non-empty.
    queues: BTreeMap<Rc<str>, Vec<T>>,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node {
            literal: HashMap::new(),
            star: None,
            full: None,
            plain: Vec::new(),
            queues: BTreeMap::new(),
        }
    }
}

/// Splits off the first token: `("a", Some("b.c"))` for `"a.b.c"`,
/// `("a", None)` for `"a"`.
fn split_first(s: &str) -> (&str, Option<&str>) {
    match s.split_once('.') {
        Some((token, rest)) => (token, Some(rest)),
        None => (s, None),
    }
}

/// Inserts into a sorted, duplicate-free vector; false if already present.
fn insert_sorted<T: Ord>(items: &mut Vec<T>, value: T) -> bool {
    match items.binary_search(&value) {
        Ok(_) => false,
        Err(at) => {
            items.insert(at, value);
            true
        }
    }
}

/// Removes from a sorted vector; false if absent. Gives memory back once the
/// vector is mostly empty (the 4x gap keeps grow/shrink from thrashing).
fn remove_sorted<T: Ord>(items: &mut Vec<T>, value: &T) -> bool {
    match items.binary_search(value) {
        Ok(at) => {
            items.remove(at);
            if items.len() * 4 < items.capacity() {
                items.shrink_to_fit();
            }
            true
        }
        Err(_) => false,
    }
}

/// Partial result of a trie walk.
struct Collector<T> {
    plain: Vec<T>,
    /// How many nodes contributed plain subscribers; with more than one the
    /// concatenation has to be sorted and deduplicated.
    plain_sources: usize,
    groups: Vec<QueueGroup<T>>,
    /// Same as `plain_sources`, for queue groups.
    group_sources: usize,
}

impl<T: Copy + Ord> Collector<T> {
    fn new() -> Self {
        Collector {
            plain: Vec::new(),
            plain_sources: 0,
            groups: Vec::new(),
            group_sources: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.plain_sources == 0 && self.group_sources == 0
    }

    /// Puts the concatenated per-node lists into the documented order.
    fn finish(mut self) -> Match<T> {
        if self.plain_sources > 1 {
            self.plain.sort_unstable();
            self.plain.dedup();
        }
        if self.group_sources > 1 {
            self.groups.sort_unstable_by(|a, b| a.queue.cmp(&b.queue));
            // Fold groups with the same name (from different patterns) into
            // the first one; `kept` is the earlier, retained element.
            self.groups.dedup_by(|later, kept| {
                if later.queue == kept.queue {
                    kept.members.append(&mut later.members);
                    true
                } else {
                    false
                }
            });
            for group in &mut self.groups {
                if !group.members.windows(2).all(|w| w[0] < w[1]) {
                    group.members.sort_unstable();
                    group.members.dedup();
                }
            }
        }
        Match {
            plain: self.plain,
            groups: self.groups,
        }
    }
}

impl<T: Copy + Ord> Node<T> {
    fn is_empty(&self) -> bool {
        self.plain.is_empty()
            && self.queues.is_empty()
            && self.literal.is_empty()
            && self.star.is_none()
            && self.full.is_none()
    }

    /// Adds a subscription ending at this node; false if it was already here.
    fn add(&mut self, queue: Option<&str>, value: T) -> bool {
        match queue {
            None => insert_sorted(&mut self.plain, value),
            Some(name) => match self.queues.get_mut(name) {
                Some(members) => insert_sorted(members, value),
                None => {
                    self.queues.insert(Rc::from(name), vec![value]);
                    true
                }
            },
        }
    }

    /// Drops a subscription ending at this node; false if it was not here.
    fn drop_here(&mut self, queue: Option<&str>, value: T) -> bool {
        match queue {
            None => remove_sorted(&mut self.plain, &value),
            Some(name) => {
                let Some(members) = self.queues.get_mut(name) else {
                    return false;
                };
                let removed = remove_sorted(members, &value);
                if members.is_empty() {
                    self.queues.remove(name);
                }
                removed
            }
        }
    }

    /// Removes the subscription for the pattern remainder `rest` (`None`: it
    /// ends here), pruning children that become empty on the way back up.
    fn remove(&mut self, rest: Option<&str>, queue: Option<&str>, value: T) -> bool {
        let Some(rest) = rest else {
            return self.drop_here(queue, value);
        };
        let (token, next) = split_first(rest);
        match token {
            "*" => Self::remove_in_slot(&mut self.star, next, queue, value),
            ">" => Self::remove_in_slot(&mut self.full, next, queue, value),
            _ => {
                let Some(child) = self.literal.get_mut(token) else {
                    return false;
                };
                let removed = child.remove(next, queue, value);
                if removed && child.is_empty() {
                    self.literal.remove(token);
                    if self.literal.capacity() > 16
                        && self.literal.len() * 4 < self.literal.capacity()
                    {
                        self.literal.shrink_to_fit();
                    }
                }
                removed
            }
        }
    }

    fn remove_in_slot(
        slot: &mut Option<Box<Node<T>>>,
        rest: Option<&str>,
        queue: Option<&str>,
        value: T,
    ) -> bool {
        let Some(child) = slot.as_deref_mut() else {
            return false;
        };
        let removed = child.remove(rest, queue, value);
        if removed && child.is_empty() {
            *slot = None;
        }
        removed
    }

    /// Adds the subscriptions ending at this node to `out`.
    fn gather(&self, out: &mut Collector<T>) {
        if !self.plain.is_empty() {
            out.plain.extend_from_slice(&self.plain);
            out.plain_sources += 1;
        }
        if !self.queues.is_empty() {
            out.groups
                .extend(self.queues.iter().map(|(name, members)| QueueGroup {
                    queue: Rc::clone(name),
                    members: members.clone(),
                }));
            out.group_sources += 1;
        }
    }

    /// Collects matches for the subject remainder `rest` below this node.
    /// Recursion depth is bounded by the token count (at most 128 for a
    /// valid subject), and each trie node is visited at most once.
    fn collect(&self, rest: &str, out: &mut Collector<T>) {
        let (token, next) = split_first(rest);
        // `>` here covers this token and all that follow.
        if let Some(full) = &self.full {
            full.gather(out);
        }
        if let Some(star) = &self.star {
            star.descend(next, out);
        }
        if !self.literal.is_empty() {
            if let Some(child) = self.literal.get(token) {
                child.descend(next, out);
            }
        }
    }

    fn descend(&self, next: Option<&str>, out: &mut Collector<T>) {
        match next {
            None => self.gather(out),
            Some(rest) => self.collect(rest, out),
        }
    }

    #[cfg(test)]
    fn count_below(&self) -> usize {
        let literal: usize = self.literal.values().map(|n| 1 + n.count_below()).sum();
        let star = self.star.as_ref().map_or(0, |n| 1 + n.count_below());
        let full = self.full.as_ref().map_or(0, |n| 1 + n.count_below());
        literal + star + full
    }
}

impl<T> Sublist<T>
where
    T: Copy + Eq + Hash + Ord + fmt::Debug,
{
    /// An empty index with the match cache on.
    pub fn new() -> Self {
        Self::build(true)
    }

    /// An empty index with the match cache off: every lookup walks the trie.
    pub fn without_cache() -> Self {
        Self::build(false)
    }

    fn build(cached: bool) -> Self {
        Sublist {
            root: Node::default(),
            entries: 0,
            cache: cached.then(HashMap::new),
            empty: Rc::new(Match {
                plain: Vec::new(),
                groups: Vec::new(),
            }),
        }
    }

    /// Adds `value` under `pattern` (a valid pattern) as a plain subscriber
    /// or, with `queue`, as a member of that queue group. Adding an entry
    /// that is already present changes nothing.
    pub fn insert(&mut self, pattern: &str, queue: Option<&str>, value: T) {
        let mut node = &mut self.root;
        let mut rest = Some(pattern);
        while let Some(remaining) = rest {
            let (token, next) = split_first(remaining);
            node = match token {
                "*" => node.star.get_or_insert_with(Box::default).as_mut(),
                ">" => node.full.get_or_insert_with(Box::default).as_mut(),
                _ => node.literal.entry(Box::from(token)).or_default(),
            };
            rest = next;
        }
        if node.add(queue, value) {
            self.entries += 1;
            self.invalidate(pattern);
        }
    }

    /// Removes one entry; false (and no change) if it was not present.
    /// Trie nodes left with nothing in or under them are freed.
    pub fn remove(&mut self, pattern: &str, queue: Option<&str>, value: T) -> bool {
        let removed = self.root.remove(Some(pattern), queue, value);
        if removed {
            self.entries -= 1;
            self.invalidate(pattern);
        }
        removed
    }

    /// Everything `subject` (a valid publish subject) reaches. A cache hit
    /// is one hash lookup plus an `Rc` clone. The returned value is a
    /// snapshot: later inserts and removes do not change it.
    pub fn matches(&mut self, subject: &str) -> Rc<Match<T>> {
        if self.entries == 0 {
            return Rc::clone(&self.empty);
        }
        if let Some(cache) = &self.cache {
            if let Some(hit) = cache.get(subject) {
                return Rc::clone(hit);
            }
        }
        let found = self.lookup(subject);
        if let Some(cache) = &mut self.cache {
            if cache.len() >= CACHE_ENTRIES_MAX {
                evict_half(cache);
            }
            cache.insert(Box::from(subject), Rc::clone(&found));
        }
        found
    }

    /// Number of (pattern, queue, value) entries.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Number of subjects currently cached (0 when the cache is off).
    pub fn cache_len(&self) -> usize {
        self.cache.as_ref().map_or(0, HashMap::len)
    }

    /// Walks the trie; never touches the cache.
    fn lookup(&self, subject: &str) -> Rc<Match<T>> {
        let mut out = Collector::new();
        self.root.collect(subject, &mut out);
        if out.is_empty() {
            Rc::clone(&self.empty)
        } else {
            Rc::new(out.finish())
        }
    }

    /// Forgets cached results that a change to `pattern` may have made stale.
    ///
    /// Decision: drop only the cached subjects the pattern matches, not the
    /// whole cache. Request/reply makes every request subscribe and
    /// unsubscribe a fresh literal inbox; clearing everything on each of
    /// those would keep the publish cache cold. A literal pattern matches
    /// only the identical subject, so that common case is a single hash
    /// removal; a wildcard pattern costs one scan of at most
    /// [`CACHE_ENTRIES_MAX`] entries.
    fn invalidate(&mut self, pattern: &str) {
        let Some(cache) = &mut self.cache else {
            return;
        };
        if cache.is_empty() {
            return;
        }
        if subject::has_wildcard(pattern) {
            cache.retain(|cached, _| !subject::matches(pattern, cached));
        } else {
            cache.remove(pattern);
        }
    }

    /// Number of trie nodes below the root.
    #[cfg(test)]
    fn node_count(&self) -> usize {
        self.root.count_below()
    }
}

/// Makes room in a full cache by dropping about half of it. The std map's
/// iteration order comes from its randomly seeded hasher, so "every other
/// entry in iteration order" is an arbitrary half that outside clients cannot
/// steer. Amortized over the ~2048 inserts until the next eviction this is
/// cheap, and the cache never holds more than [`CACHE_ENTRIES_MAX`] entries.
fn evict_half<V>(cache: &mut HashMap<Box<str>, V>) {
    let mut keep = false;
    cache.retain(|_, _| {
        keep = !keep;
        keep
    });
}

impl<T> Default for Sublist<T>
where
    T: Copy + Eq + Hash + Ord + fmt::Debug,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Sublist<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sublist")
            .field("entries", &self.entries)
            .field("cached", &self.cache.as_ref().map(HashMap::len))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn expect(plain: &[u32], groups: &[(&str, &[u32])]) -> Match<u32> {
        Match {
            plain: plain.to_vec(),
            groups: groups
                .iter()
                .map(|&(queue, members)| QueueGroup {
                    queue: Rc::from(queue),
                    members: members.to_vec(),
                })
                .collect(),
        }
    }

    /// Looks each subject up twice (the second time usually from the cache).
    fn check(sl: &mut Sublist<u32>, table: &[(&str, Match<u32>)], label: &str) {
        for round in 0..2 {
            for (subject, expected) in table {
                assert_eq!(
                    &*sl.matches(subject),
                    expected,
                    "{label}: subject {subject:?}, round {round}"
                );
            }
        }
    }

    #[test]
    fn table_with_and_without_cache() {
        for (label, mut sl) in [
            ("cache on", Sublist::new()),
            ("cache off", Sublist::without_cache()),
        ] {
            let subscriptions: &[(&str, Option<&str>, u32)] = &[
                ("foo.bar", None, 1),
                ("foo.*", None, 2),
                ("foo.>", None, 3),
                (">", None, 4),
                ("*.bar", None, 5),
                ("foo.bar.baz", None, 6),
                ("foo.bar", Some("workers"), 10),
                ("foo.bar", Some("workers"), 11),
                ("foo.*", Some("workers"), 12),
                // same member, same queue, second pattern: reported once
                ("foo.*", Some("workers"), 10),
                ("foo.>", Some("audit"), 20),
                // same plain value under a second pattern: reported once
                ("foo.bar", None, 2),
                ("a.b.c", Some("q"), 30),
                ("*.*.*", Some("q"), 31),
            ];
            check(&mut sl, &[("foo.bar", expect(&[], &[]))], label);
            for &(pattern, queue, value) in subscriptions {
                sl.insert(pattern, queue, value);
            }
            assert_eq!(sl.len(), subscriptions.len(), "{label}");
            // re-inserting an existing entry is a no-op
            sl.insert("foo.bar", None, 1);
            sl.insert("foo.*", Some("workers"), 12);
            assert_eq!(sl.len(), subscriptions.len(), "{label}");
            assert!(!sl.is_empty());

            check(
                &mut sl,
                &[
                    (
                        "foo.bar",
                        expect(
                            &[1, 2, 3, 4, 5],
                            &[("audit", &[20]), ("workers", &[10, 11, 12])],
                        ),
                    ),
                    (
                        "foo.baz",
                        expect(&[2, 3, 4], &[("audit", &[20]), ("workers", &[10, 12])]),
                    ),
                    ("foo", expect(&[4], &[])),
                    (
                        "foo.bar.baz",
                        expect(&[3, 4, 6], &[("audit", &[20]), ("q", &[31])]),
                    ),
                    ("foo.x.y.z", expect(&[3, 4], &[("audit", &[20])])),
                    ("x.bar", expect(&[4, 5], &[])),
                    ("x.y", expect(&[4], &[])),
                    ("bar", expect(&[4], &[])),
                    ("a.b.c", expect(&[4], &[("q", &[30, 31])])),
                    ("a.b", expect(&[4], &[])),
                    ("a.b.c.d", expect(&[4], &[])),
                ],
                label,
            );

            // removals, including ones that must not match anything
            assert!(sl.remove(">", None, 4), "{label}");
            assert!(!sl.remove(">", None, 4), "{label}");
            assert!(!sl.remove("foo.bar", Some("workers"), 12), "{label}");
            assert!(!sl.remove("foo.bar", Some("other"), 10), "{label}");
            assert!(!sl.remove("foo.bar", None, 10), "{label}");
            assert!(!sl.remove("nope.x", None, 1), "{label}");
            assert!(!sl.remove("foo.bar.baz.qux", None, 6), "{label}");
            assert!(!sl.remove("foo", None, 1), "{label}");
            assert!(!sl.remove("*", None, 2), "{label}");
            assert!(sl.remove("foo.*", Some("workers"), 12), "{label}");
            assert!(sl.remove("foo.bar", None, 2), "{label}");
            assert!(sl.remove("*.*.*", Some("q"), 31), "{label}");
            assert_eq!(sl.len(), subscriptions.len() - 4, "{label}");

            check(
                &mut sl,
                &[
                    (
                        "foo.bar",
                        expect(&[1, 2, 3, 5], &[("audit", &[20]), ("workers", &[10, 11])]),
                    ),
                    (
                        "foo.baz",
                        expect(&[2, 3], &[("audit", &[20]), ("workers", &[10])]),
                    ),
                    ("foo", expect(&[], &[])),
                    ("x.y", expect(&[], &[])),
                    ("x.bar", expect(&[5], &[])),
                    ("foo.bar.baz", expect(&[3, 6], &[("audit", &[20])])),
                    ("a.b.c", expect(&[], &[("q", &[30])])),
                ],
                label,
            );

            // remove the rest; everything must be gone, trie included
            for &(pattern, queue, value) in subscriptions {
                sl.remove(pattern, queue, value);
            }
            assert_eq!(sl.len(), 0, "{label}");
            assert!(sl.is_empty(), "{label}");
            assert_eq!(sl.node_count(), 0, "{label}");
            check(
                &mut sl,
                &[("foo.bar", expect(&[], &[])), ("a.b.c", expect(&[], &[]))],
                label,
            );
        }
    }

    #[test]
    fn cache_is_invalidated_on_insert_and_remove() {
        let mut sl = Sublist::new();
        sl.insert("keep.alive", None, 99);

        // a cached miss must not hide a later insert
        assert!(sl.matches("a.b").is_empty());
        assert_eq!(sl.cache_len(), 1);
        sl.insert("a.b", None, 1);
        assert_eq!(sl.matches("a.b").plain, vec![1]);

        assert!(sl.matches("a.c").is_empty());
        assert!(sl.matches("x.y").is_empty());
        assert_eq!(sl.matches("keep.alive").plain, vec![99]);
        assert_eq!(sl.cache_len(), 4);

        // a wildcard insert drops exactly the subjects it matches
        sl.insert("a.*", None, 2);
        assert_eq!(sl.cache_len(), 2, "only a.b and a.c dropped");
        assert_eq!(sl.matches("a.c").plain, vec![2]);
        assert_eq!(sl.matches("a.b").plain, vec![1, 2]);

        // a literal insert drops only its own subject
        let before = sl.cache_len();
        sl.insert("q.r", None, 3);
        assert_eq!(sl.cache_len(), before);
        sl.insert("x.y", None, 4);
        assert_eq!(sl.cache_len(), before - 1);
        assert_eq!(sl.matches("x.y").plain, vec![4]);

        // a queue-group insert invalidates too
        sl.insert("a.>", Some("g"), 5);
        let hit = sl.matches("a.b");
        assert_eq!(hit.plain, vec![1, 2]);
        assert_eq!(hit.groups.len(), 1);
        assert_eq!(&*hit.groups[0].queue, "g");
        assert_eq!(hit.groups[0].members, vec![5]);
        // a hit hands back the very same result
        assert!(Rc::ptr_eq(&hit, &sl.matches("a.b")));

        // removals invalidate
        assert!(sl.remove("a.b", None, 1));
        assert_eq!(sl.matches("a.b").plain, vec![2]);
        assert!(sl.remove("a.*", None, 2));
        assert!(sl.matches("a.c").plain.is_empty());
        assert!(sl.remove("a.>", Some("g"), 5));
        assert!(sl.matches("a.c").is_empty());

        // the earlier result is a snapshot and did not change
        assert_eq!(hit.plain, vec![1, 2]);

        // a removal that finds nothing leaves the cache alone
        let before = sl.cache_len();
        assert!(!sl.remove("a.*", None, 2));
        assert!(!sl.remove(">", None, 7));
        assert_eq!(sl.cache_len(), before);
    }

    #[test]
    fn cache_stays_bounded() {
        let mut sl = Sublist::new();
        sl.insert("s.>", None, 1u32);
        sl.insert("s.*.even", Some("q"), 2);
        for i in 0..3 * CACHE_ENTRIES_MAX {
            let subject = format!("s.{i}.even");
            let found = sl.matches(&subject);
            assert_eq!(found.plain, vec![1]);
            assert_eq!(found.groups.len(), 1);
            assert!(sl.cache_len() <= CACHE_ENTRIES_MAX);
        }
        assert!(sl.cache_len() >= CACHE_ENTRIES_MAX / 2);

        let mut off = Sublist::without_cache();
        off.insert(">", None, 1u32);
        assert_eq!(off.matches("a").plain, vec![1]);
        assert_eq!(off.cache_len(), 0);
    }

    #[test]
    fn removal_prunes_the_trie() {
        let mut sl = Sublist::new();
        let patterns = [
            "a",
            "a.b",
            "a.b.c.d.e",
            "a.*.c",
            "a.>",
            "*",
            ">",
            "*.*.>",
            "x.y.z",
            "x.*.>",
        ];
        for (i, pattern) in patterns.iter().enumerate() {
            sl.insert(pattern, None, i as u32);
            sl.insert(pattern, Some("g"), i as u32);
            sl.insert(pattern, Some("h"), 100 + i as u32);
        }
        let _ = sl.matches("a.b.c");
        assert!(sl.node_count() > 0);
        for (i, pattern) in patterns.iter().enumerate().rev() {
            assert!(sl.remove(pattern, Some("h"), 100 + i as u32));
            assert!(sl.remove(pattern, None, i as u32));
            assert!(sl.remove(pattern, Some("g"), i as u32));
        }
        assert_eq!(sl.len(), 0);
        assert_eq!(sl.node_count(), 0);
        assert!(sl.matches("a.b.c").is_empty());

        // churn of short-lived inbox subscriptions leaves nothing behind
        for i in 0..2000u32 {
            let inbox = format!("_INBOX.{}.{}", i % 7, i);
            sl.insert(&inbox, None, i);
            assert_eq!(sl.matches(&inbox).plain, vec![i]);
            assert!(sl.remove(&inbox, None, i));
        }
        assert_eq!(sl.node_count(), 0);
        assert!(sl.root.literal.capacity() <= 16);
    }

    use crate::rand::SplitMix64;

    type Entry = (String, Option<&'static str>, u32);

    fn random_pattern(rng: &mut SplitMix64, alphabet: &[&str]) -> String {
        let len = 1 + rng.below(4);
        let mut tokens = Vec::with_capacity(len);
        for i in 0..len {
            let roll = rng.below(6);
            let token = if roll == 0 && i + 1 == len {
                ">"
            } else if roll <= 1 {
                "*"
            } else {
                alphabet[rng.below(alphabet.len())]
            };
            tokens.push(token);
        }
        tokens.join(".")
    }

    fn random_subject(rng: &mut SplitMix64, alphabet: &[&str]) -> String {
        let len = 1 + rng.below(5);
        let tokens: Vec<&str> = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        tokens.join(".")
    }

    /// The answer computed the slow way, from `subject::matches` alone.
    fn reference(model: &[Entry], subject_text: &str) -> Match<u32> {
        let mut plain = BTreeSet::new();
        let mut groups: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
        for (pattern, queue, value) in model {
            if subject::matches(pattern, subject_text) {
                match queue {
                    None => {
                        plain.insert(*value);
                    }
                    Some(name) => {
                        groups.entry(name).or_default().insert(*value);
                    }
                }
            }
        }
        Match {
            plain: plain.into_iter().collect(),
            groups: groups
                .into_iter()
                .map(|(name, members)| QueueGroup {
                    queue: Rc::from(name),
                    members: members.into_iter().collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn randomized_against_reference_matcher() {
        const QUEUES: [Option<&str>; 3] = [None, Some("q1"), Some("q2")];
        const LETTERS: [&str; 4] = ["a", "b", "c", "d"];
        let seeds = [1u64, 2, 3, 0xDEAD_BEEF, 0x5EED_5EED, 42];
        for seed in seeds {
            let mut rng = SplitMix64(seed);
            let alphabet = &LETTERS[..3 + rng.below(2)];
            let mut cached = Sublist::new();
            let mut uncached = Sublist::without_cache();
            let mut model: Vec<Entry> = Vec::new();
            for step in 0..3000 {
                let ctx = format!("seed {seed:#x}, step {step}");
                let roll = rng.below(100);
                if roll < 35 {
                    let entry: Entry = (
                        random_pattern(&mut rng, alphabet),
                        QUEUES[rng.below(QUEUES.len())],
                        rng.below(12) as u32,
                    );
                    assert_eq!(subject::validate_pattern(&entry.0), Ok(()), "{ctx}");
                    cached.insert(&entry.0, entry.1, entry.2);
                    uncached.insert(&entry.0, entry.1, entry.2);
                    if !model.contains(&entry) {
                        model.push(entry);
                    }
                } else if roll < 62 && !model.is_empty() {
                    let (pattern, queue, value) = model.swap_remove(rng.below(model.len()));
                    assert!(cached.remove(&pattern, queue, value), "{ctx}");
                    assert!(uncached.remove(&pattern, queue, value), "{ctx}");
                } else if roll < 70 {
                    let entry: Entry = (
                        random_pattern(&mut rng, alphabet),
                        QUEUES[rng.below(QUEUES.len())],
                        rng.below(12) as u32,
                    );
                    let present = model.iter().position(|e| *e == entry);
                    if let Some(at) = present {
                        model.swap_remove(at);
                    }
                    assert_eq!(
                        cached.remove(&entry.0, entry.1, entry.2),
                        present.is_some(),
                        "{ctx}"
                    );
                    assert_eq!(
                        uncached.remove(&entry.0, entry.1, entry.2),
                        present.is_some(),
                        "{ctx}"
                    );
                } else {
                    for _ in 0..3 {
                        let subject_text = random_subject(&mut rng, alphabet);
                        let expected = reference(&model, &subject_text);
                        assert_eq!(
                            *cached.matches(&subject_text),
                            expected,
                            "{ctx}, cached, subject {subject_text:?}"
                        );
                        assert_eq!(
                            *uncached.matches(&subject_text),
                            expected,
                            "{ctx}, uncached, subject {subject_text:?}"
                        );
                    }
                }
                assert_eq!(cached.len(), model.len(), "{ctx}");
                assert_eq!(uncached.len(), model.len(), "{ctx}");
            }
            for (pattern, queue, value) in model.drain(..) {
                assert!(cached.remove(&pattern, queue, value), "seed {seed:#x}");
                assert!(uncached.remove(&pattern, queue, value), "seed {seed:#x}");
            }
            assert_eq!(cached.node_count(), 0, "seed {seed:#x}");
            assert_eq!(uncached.node_count(), 0, "seed {seed:#x}");
        }
    }
}
