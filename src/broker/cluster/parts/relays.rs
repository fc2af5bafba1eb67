//! Relays: the requests relayed to another node and awaiting its answer
//! (by link tag), and the `stream.list` / `kv.list` listings gathered from
//! every node (the calls each waits on, the entries merged so far). It
//! sends nothing: the broker makes the calls and sends the answers this
//! part hands back.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::cluster::api::GroupId;
use crate::port::ConnId;

/// Most requests relayed to other nodes and awaiting their answer (and
/// most gathers under way).
const RELAYS_MAX: usize = 100_000;

/// What a gathered list lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listing {
    /// `stream.list`: `{streams:[{config:{name}, …}]}`.
    Streams,
    /// `kv.list`: `{buckets:[{config:{bucket}, …}]}`.
    Buckets,
}

impl Listing {
    /// The event asked of every node.
    pub(crate) fn event(self) -> &'static str {
        match self {
            Listing::Streams => "stream.list",
            Listing::Buckets => "kv.list",
        }
    }

    /// The answer's field holding the entries.
    pub(crate) fn field(self) -> &'static str {
        match self {
            Listing::Streams => "streams",
            Listing::Buckets => "buckets",
        }
    }

    /// An entry's name, by which entries are merged and sorted.
    pub(crate) fn name(self, entry: &Value) -> Option<&str> {
        let key = match self {
            Listing::Streams => "name",
            Listing::Buckets => "bucket",
        };
        entry["config"][key].as_str()
    }

    /// Sorts entries by name (stable). The one sort of `Value`s in the
    /// broker: each sort call site is a copy of the standard library's
    /// sort, about 17 KB for `Value`.
    pub(crate) fn sort(self, entries: &mut [Value]) {
        entries.sort_by(|a, b| self.name(a).cmp(&self.name(b)));
    }

    /// The stream an entry stands for (rights name streams).
    pub(crate) fn stream_of(self, entry: &Value) -> Option<String> {
        match self {
            Listing::Streams => entry
                .pointer("/config/name")
                .or_else(|| entry.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string),
            Listing::Buckets => self
                .name(entry)
                .map(crate::protocol::kv_messages::stream_name),
        }
    }
}

/// A client request relayed to another node, answered with its answer.
struct Relay {
    conn: ConnId,
    ack_id: Option<u64>,
    /// For a fetch on a replicated stream: its group, and the node
    /// relayed to as that group's leader.
    group: Option<(GroupId, u64)>,
}

/// A `stream.list` or `kv.list` gathered from every node.
pub(crate) struct Gather {
    conn: ConnId,
    ack_id: u64,
    /// Calls not answered yet.
    left: usize,
    listing: Listing,
    entries: Vec<Value>,
}

impl Gather {
    /// The answer to socket `conn`'s event `ack_id`: `listing`, this
    /// node's entries (`local`) first.
    pub(crate) fn new(conn: ConnId, ack_id: u64, listing: Listing, local: Vec<Value>) -> Gather {
        Gather {
            conn,
            ack_id,
            left: 0,
            listing,
            entries: local,
        }
    }

    /// The asking socket, its event's ack id, what it lists, and the ack
    /// body: every entry, sorted by name (not yet filtered by rights).
    pub(crate) fn finish(mut self) -> (ConnId, u64, Listing, String) {
        let listing = self.listing;
        listing.sort(&mut self.entries);
        let body = json!([{"ok": true, listing.field(): self.entries}]).to_string();
        (self.conn, self.ack_id, listing, body)
    }

    /// Adds a peer's entry. A name listed already is a replicated stream
    /// (or bucket) this node knows only as a member or bystander; the
    /// peer that sent it leads the stream's group (a peer lists only
    /// those, see `stream_cluster.rs` and `kv.rs`), so its entry replaces
    /// this node's own.
    fn merge(&mut self, entry: Value) {
        let listing = self.listing;
        let key = listing.name(&entry).map(str::to_string);
        match self
            .entries
            .iter_mut()
            .find(|s| key.is_some() && listing.name(s).map(str::to_string) == key)
        {
            Some(known) => *known = entry,
            None => self.entries.push(entry),
        }
    }
}

/// What an answer to a relay tag is for.
pub(crate) enum Answered {
    /// Nothing waits for it (forgotten, or a relay without an ack).
    Nobody,
    /// A relayed request: send the answer to `conn`'s event `ack_id`.
    Relay { conn: ConnId, ack_id: u64 },
    /// One call of a gather that others still wait on.
    Gathering,
    /// The last call of a gather: it is complete.
    Gathered(Gather),
}

/// The relays and gathers waiting on other nodes.
#[derive(Default)]
pub(crate) struct Relays {
    relays: HashMap<u64, Relay>,
    gathers: HashMap<u64, Gather>,
    /// Relay tag -> gather it belongs to.
    gather_of: HashMap<u64, u64>,
    next_gather: u64,
}

impl Relays {
    /// Whether no more relays can wait (the cap is reached).
    pub(crate) fn relays_full(&self) -> bool {
        self.relays.len() >= RELAYS_MAX
    }

    /// Whether no more gathers can wait.
    pub(crate) fn gathers_full(&self) -> bool {
        self.gathers.len() >= RELAYS_MAX
    }

    /// The call with link tag `tag` relays socket `conn`'s event
    /// (`ack_id`, if it wants an answer). With `group`, it is a fetch
    /// sent to `leader` as that stream group's leader.
    pub(crate) fn open(
        &mut self,
        tag: u64,
        conn: ConnId,
        ack_id: Option<u64>,
        group: Option<(GroupId, u64)>,
    ) {
        self.relays.insert(
            tag,
            Relay {
                conn,
                ack_id,
                group,
            },
        );
    }

    /// Starts `g`, waiting on the calls with link tags `calls`; with no
    /// call to wait on, it is handed back complete.
    pub(crate) fn gather(&mut self, mut g: Gather, calls: Vec<u64>) -> Option<Gather> {
        if calls.is_empty() {
            return Some(g);
        }
        self.next_gather += 1;
        let gid = self.next_gather;
        g.left = calls.len();
        for tag in calls {
            self.gather_of.insert(tag, gid);
        }
        self.gathers.insert(gid, g);
        None
    }

    /// The call with link tag `tag` was answered: `ok` is its answer's
    /// text, `None` when it failed. A gather's call merges the answer's
    /// entries; a relay is taken off the waiting ones.
    pub(crate) fn answered(&mut self, tag: u64, ok: Option<&str>) -> Answered {
        if let Some(gid) = self.gather_of.remove(&tag) {
            let Some(g) = self.gathers.get_mut(&gid) else {
                return Answered::Nobody;
            };
            g.left -= 1;
            if let Some(text) = ok {
                let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
                if let Some(list) = v.get(g.listing.field()).and_then(Value::as_array) {
                    for entry in list {
                        g.merge(entry.clone());
                    }
                }
            }
            if g.left > 0 {
                return Answered::Gathering;
            }
            return match self.gathers.remove(&gid) {
                Some(g) => Answered::Gathered(g),
                None => Answered::Nobody,
            };
        }
        match self.relays.remove(&tag) {
            Some(Relay {
                conn,
                ack_id: Some(ack_id),
                ..
            }) => Answered::Relay { conn, ack_id },
            _ => Answered::Nobody,
        }
    }

    /// Stream group `group` now has `leader` (or none): the fetches
    /// relayed to another node as its leader are taken off, and the
    /// sockets and ack ids owed an answer returned.
    pub(crate) fn leader_moved(
        &mut self,
        group: GroupId,
        leader: Option<u64>,
    ) -> Vec<(ConnId, u64)> {
        let moved: Vec<u64> = self
            .relays
            .iter()
            .filter(|(_, r)| {
                r.group
                    .is_some_and(|(g, n)| g == group && Some(n) != leader)
            })
            .map(|(&tag, _)| tag)
            .collect();
        moved
            .iter()
            .filter_map(|t| self.relays.remove(t))
            .filter_map(|r| r.ack_id.map(|a| (r.conn, a)))
            .collect()
    }

    /// Socket `conn` ended: nothing relayed or gathered for it is
    /// answered any more, and its gathers' calls are forgotten with them
    /// (their answers, if they come, find nobody).
    pub(crate) fn forget(&mut self, conn: ConnId) {
        self.relays.retain(|_, r| r.conn != conn);
        let before = self.gathers.len();
        self.gathers.retain(|_, g| g.conn != conn);
        if self.gathers.len() < before {
            let gathers = &self.gathers;
            self.gather_of.retain(|_, gid| gathers.contains_key(gid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_names(body: &str, listing: Listing) -> Vec<String> {
        let v: Value = serde_json::from_str(body).unwrap();
        v[0][listing.field()]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| listing.name(e).unwrap().to_string())
            .collect()
    }

    fn stream(name: &str, owner: &str) -> Value {
        json!({"config": {"name": name}, "owner": owner})
    }

    #[test]
    fn a_closed_sockets_gathers_leave_no_call_behind() {
        let mut r = Relays::default();
        let mine = Gather::new(7, 1, Listing::Streams, Vec::new());
        let other = Gather::new(8, 2, Listing::Streams, Vec::new());
        assert!(r.gather(mine, vec![5, 6]).is_none());
        assert!(r.gather(other, vec![9]).is_none());
        r.forget(7);
        assert_eq!(r.gathers.len(), 1);
        assert_eq!(r.gather_of.keys().copied().collect::<Vec<_>>(), [9]);
        assert!(matches!(r.answered(5, Some("{}")), Answered::Nobody));
        assert!(matches!(r.answered(9, Some("{}")), Answered::Gathered(_)));
        assert!(r.gather_of.is_empty() && r.gathers.is_empty());
    }

    #[test]
    fn a_relay_is_answered_once_and_only_if_it_wants_an_answer() {
        let mut r = Relays::default();
        r.open(1, 7, Some(3), None);
        r.open(2, 8, None, None);
        assert!(matches!(
            r.answered(1, Some("{}")),
            Answered::Relay { conn: 7, ack_id: 3 }
        ));
        assert!(matches!(r.answered(1, Some("{}")), Answered::Nobody));
        assert!(matches!(r.answered(2, None), Answered::Nobody));
        assert!(matches!(r.answered(99, None), Answered::Nobody));
    }

    #[test]
    fn a_fetch_relayed_to_a_former_leader_is_answered_when_the_leader_moves() {
        let mut r = Relays::default();
        r.open(1, 7, Some(10), Some((5, 2)));
        r.open(2, 8, Some(11), Some((6, 2)));
        r.open(3, 9, None, Some((5, 3)));
        // Group 5 still led by node 2: nothing moved.
        assert!(r.leader_moved(5, Some(2)).is_empty());
        // Group 5 now led by node 3: the relay to node 2 is owed an
        // answer; the one to node 3 stays.
        assert_eq!(r.leader_moved(5, Some(3)), vec![(7, 10)]);
        assert!(matches!(r.answered(1, None), Answered::Nobody));
        // Group 5 with no leader: the relay to node 3 goes, unanswered
        // (it wanted no ack).
        assert!(r.leader_moved(5, None).is_empty());
        assert!(matches!(r.answered(3, None), Answered::Nobody));
        // Group 6 was never touched.
        assert!(matches!(
            r.answered(2, None),
            Answered::Relay {
                conn: 8,
                ack_id: 11
            }
        ));
    }

    #[test]
    fn a_gather_completes_on_its_last_call_with_entries_merged_and_sorted() {
        let mut r = Relays::default();
        let local = vec![stream("b", "me"), stream("d", "me")];
        let g = Gather::new(4, 20, Listing::Streams, local);
        assert!(r.gather(g, vec![11, 12, 13]).is_none());
        let answer = json!({"streams": [stream("c", "p1"), stream("b", "p1")]}).to_string();
        assert!(matches!(r.answered(11, Some(&answer)), Answered::Gathering));
        // A failed call counts as answered, with nothing to add.
        assert!(matches!(r.answered(12, None), Answered::Gathering));
        let answer = json!({"streams": [stream("a", "p2")]}).to_string();
        let Answered::Gathered(g) = r.answered(13, Some(&answer)) else {
            panic!("the last call completes the gather");
        };
        let (conn, ack_id, listing, body) = g.finish();
        assert_eq!((conn, ack_id, listing), (4, 20, Listing::Streams));
        assert_eq!(body_names(&body, listing), ["a", "b", "c", "d"]);
        // The peer that leads `b` lists it: its entry replaces this node's.
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v[0]["streams"][1]["owner"], "p1");
    }

    #[test]
    fn a_gather_with_no_call_to_wait_on_is_complete_at_once() {
        let mut r = Relays::default();
        let g = Gather::new(4, 20, Listing::Buckets, vec![]);
        let g = r.gather(g, vec![]).expect("nothing to wait on");
        let (_, _, listing, body) = g.finish();
        assert_eq!(listing, Listing::Buckets);
        assert_eq!(body, r#"[{"buckets":[],"ok":true}]"#);
    }

    #[test]
    fn a_forgotten_socket_is_answered_nothing() {
        let mut r = Relays::default();
        r.open(1, 7, Some(3), None);
        r.open(2, 8, Some(4), None);
        let g = Gather::new(7, 5, Listing::Streams, vec![]);
        assert!(r.gather(g, vec![3]).is_none());
        r.forget(7);
        assert!(matches!(r.answered(1, None), Answered::Nobody));
        assert!(matches!(r.answered(3, Some("{}")), Answered::Nobody));
        assert!(matches!(
            r.answered(2, None),
            Answered::Relay { conn: 8, ack_id: 4 }
        ));
    }
}
