//! The control group's entries are kept in Raft logs and snapshots and
//! sent between nodes, so their JSON must not change: this test holds the
//! hand-written reader (`src/cluster/entry_json.rs`) and `consumer.create`'s
//! reader to what serde's derived readers made of the same text. `old`
//! below is a copy of the derived types as they were (internally tagged
//! commands, a flattened cursor); the golden vectors are what the derived
//! writers produced, one per command variant. Every vector, and thousands
//! of variations of it (members dropped, repeated, replaced by values of
//! other types, unknown members added, objects written as arrays), must be
//! accepted or refused alike, and what is accepted must be the same entry.

use gombus::cluster::fsm::{Change, Fsm};
use gombus::protocol::stream_messages::ConsumerCreate;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

mod old {
    use gombus::cluster::fsm::CursorPos;
    use gombus::cluster::placement::Placement;
    use gombus::routing::groups::GroupMode;
    use gombus::routing::subs::Owner;
    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    #[derive(Debug, Serialize, Deserialize)]
    pub struct Change {
        pub node: u64,
        pub op: u64,
        pub cmd: Cmd,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Cmd {
        Subs(Command),
        Meta(MetaCommand),
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(tag = "op", rename_all = "snake_case")]
    pub enum MetaCommand {
        StreamPut {
            name: String,
            owner: u64,
            config: Value,
        },
        StreamDelete {
            name: String,
        },
        ConsumerPut {
            stream: String,
            name: String,
            config: Value,
        },
        ConsumerDelete {
            stream: String,
            name: String,
        },
        Cursors {
            stream: String,
            cursors: Vec<Cursor>,
        },
        StreamPlace {
            name: String,
            placement: Placement,
        },
    }

    #[derive(Debug, Serialize, Deserialize)]
    pub struct Cursor {
        pub consumer: String,
        #[serde(flatten)]
        pub pos: CursorPos,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(tag = "op", rename_all = "snake_case")]
    pub enum Command {
        Subscribe {
            owner: Owner,
            sid: String,
            pattern: String,
            queue: Option<String>,
            max: Option<u64>,
        },
        Unsubscribe {
            owner: Owner,
            sid: String,
            after: Option<u64>,
        },
        RemoveConn {
            owner: Owner,
        },
        RemoveNode {
            node: u64,
            boot: Option<u64>,
        },
        NodeUp {
            node: u64,
            boot: u64,
        },
        GroupSet {
            queue: String,
            mode: GroupMode,
        },
    }

    #[derive(Debug, Deserialize)]
    pub struct ConsumerCreate {
        pub stream: String,
        #[serde(flatten)]
        pub config: serde_json::Map<String, Value>,
    }
}

/// Entries as the derived writers wrote them, one per command variant.
const GOLDEN_CHANGES: &[&str] = &[
    r##"{"node":2,"op":30064771073,"cmd":{"subs":{"op":"subscribe","owner":{"node":2,"conn":30064771077},"sid":"s1","pattern":"a.*","queue":"q","max":3}}}"##,
    r##"{"node":2,"op":30064771074,"cmd":{"subs":{"op":"subscribe","owner":{"node":2,"conn":30064771077},"sid":"s\"2é","pattern":"a.>","queue":null,"max":null}}}"##,
    r##"{"node":2,"op":30064771075,"cmd":{"subs":{"op":"unsubscribe","owner":{"node":2,"conn":30064771077},"sid":"s1","after":10}}}"##,
    r##"{"node":2,"op":30064771076,"cmd":{"subs":{"op":"unsubscribe","owner":{"node":2,"conn":30064771077},"sid":"s1","after":null}}}"##,
    r##"{"node":2,"op":30064771077,"cmd":{"subs":{"op":"remove_conn","owner":{"node":2,"conn":30064771077}}}}"##,
    r##"{"node":2,"op":30064771078,"cmd":{"subs":{"op":"remove_node","node":3,"boot":9}}}"##,
    r##"{"node":2,"op":30064771079,"cmd":{"subs":{"op":"remove_node","node":3,"boot":null}}}"##,
    r##"{"node":2,"op":30064771080,"cmd":{"subs":{"op":"node_up","node":3,"boot":11}}}"##,
    r##"{"node":2,"op":30064771081,"cmd":{"subs":{"op":"group_set","queue":"q","mode":"broadcast"}}}"##,
    r##"{"node":2,"op":30064771082,"cmd":{"subs":{"op":"group_set","queue":"w","mode":"loadbalance"}}}"##,
    r##"{"node":2,"op":30064771083,"cmd":{"meta":{"op":"stream_put","name":"orders","owner":2,"config":{"max_msgs":0,"n":null,"name":"orders","subjects":["a.>"],"x":1.5}}}}"##,
    r##"{"node":2,"op":30064771084,"cmd":{"meta":{"op":"stream_delete","name":"orders"}}}"##,
    r##"{"node":2,"op":30064771085,"cmd":{"meta":{"op":"consumer_put","stream":"orders","name":"c","config":{"ack_wait_ms":30000,"name":"c"}}}}"##,
    r##"{"node":2,"op":30064771086,"cmd":{"meta":{"op":"consumer_put","stream":"orders","name":"d","config":null}}}"##,
    r##"{"node":2,"op":30064771087,"cmd":{"meta":{"op":"consumer_delete","stream":"orders","name":"c"}}}"##,
    r##"{"node":2,"op":30064771088,"cmd":{"meta":{"op":"cursors","stream":"orders","cursors":[{"consumer":"c","ack_floor":4,"delivered":6},{"consumer":"d","ack_floor":0,"delivered":18446744073709551615}]}}}"##,
    r##"{"node":2,"op":30064771089,"cmd":{"meta":{"op":"cursors","stream":"orders","cursors":[]}}}"##,
    r##"{"node":2,"op":30064771090,"cmd":{"meta":{"op":"stream_place","name":"orders","placement":{"group":5,"replicas":[2,1,3]}}}}"##,
    r##"{"node":2,"op":30064771091,"cmd":{"meta":{"op":"stream_place","name":"orders","placement":{"group":5,"replicas":[2,1,4],"leaving":[3],"joining":[4]}}}}"##,
];

/// A snapshot as the derived writer wrote it.
const GOLDEN_SNAPSHOT: &str = r##"{"applied":42,"subs":[{"owner":{"node":1,"conn":12884901889},"sid":"x","pattern":"a.*","queue":"q","remaining":3},{"owner":{"node":2,"conn":30064771077},"sid":"y","pattern":"a.>","queue":null,"remaining":null}],"groups":[["q","broadcast"]],"streams":{"orders":{"owner":2,"config":{"subjects":["a.>"]},"consumers":{"c":{"config":{"name":"c"},"cursor":{"ack_floor":4,"delivered":6}}}},"r3":{"owner":1,"config":{"subjects":["r.>"]},"consumers":{},"placement":{"group":4,"replicas":[1,2,3]}}},"boots":{"2":7},"last_op":[[[2,7],30064771081]]}"##;

/// `consumer.create` arguments and what the derived (`flatten`) reader
/// made of them: `ok STREAM CONFIG` or `err MESSAGE`.
const GOLDEN_CONSUMER_CREATE: &[(&str, &str)] = &[
    (r##"{"stream":"S","name":"c"}"##, r##"ok S {"name":"c"}"##),
    (
        r##"{"name":"c","stream":"S","ack_wait_ms":5,"filter_subject":null}"##,
        r##"ok S {"ack_wait_ms":5,"filter_subject":null,"name":"c"}"##,
    ),
    (r##"{"stream":"S"}"##, r##"ok S {}"##),
    (
        r##"{}"##,
        r##"err missing field `stream` at line 1 column 2"##,
    ),
    (
        r##"{"stream":5}"##,
        r##"err invalid type: integer `5`, expected a string at line 1 column 11"##,
    ),
    (
        r##"{"stream":null}"##,
        r##"err invalid type: null, expected a string at line 1 column 14"##,
    ),
    (
        r##"{"stream":"S","stream":"T"}"##,
        r##"err duplicate field `stream` at line 1 column 22"##,
    ),
    (
        r##"{"name":"c","name":"d","stream":"S"}"##,
        r##"ok S {"name":"d"}"##,
    ),
    (
        r##"["S",{}]"##,
        r##"err invalid type: sequence, expected struct ConsumerCreate at line 1 column 0"##,
    ),
    (
        r##"["S",{},1]"##,
        r##"err invalid type: sequence, expected struct ConsumerCreate at line 1 column 0"##,
    ),
    (
        r##"5"##,
        r##"err invalid type: integer `5`, expected struct ConsumerCreate at line 1 column 1"##,
    ),
    (
        r##"null"##,
        r##"err invalid type: null, expected struct ConsumerCreate at line 1 column 4"##,
    ),
    (
        r##""S""##,
        r##"err invalid type: string "S", expected struct ConsumerCreate at line 1 column 3"##,
    ),
    (
        r##"{"stream":"S","x":[1,{"y":2.5}]}"##,
        r##"ok S {"x":[1,{"y":2.5}]}"##,
    ),
    (
        r##"{"stream":["S"]}"##,
        r##"err invalid type: sequence, expected a string at line 1 column 10"##,
    ),
    (
        r##"{"stream":{"a":1}}"##,
        r##"err invalid type: map, expected a string at line 1 column 10"##,
    ),
    (
        r##"{"stream":true, "name":"c"}"##,
        r##"err invalid type: boolean `true`, expected a string at line 1 column 14"##,
    ),
    (
        r##"{"stream":1.5}"##,
        r##"err invalid type: floating point `1.5`, expected a string at line 1 column 13"##,
    ),
    (
        r##"{"stream":-1}"##,
        r##"err invalid type: integer `-1`, expected a string at line 1 column 12"##,
    ),
    (
        r##"{"stream":"S""##,
        r##"err EOF while parsing an object at line 1 column 13"##,
    ),
    (
        r##"{"stream":"S","name":"c"} x"##,
        r##"err trailing characters at line 1 column 27"##,
    ),
];

/// A JSON value whose objects keep their members' order (and repeats),
/// so that variations can be written back member by member.
#[derive(Clone, Debug)]
enum T {
    Atom(String),
    Arr(Vec<T>),
    Obj(Vec<(String, T)>),
}

impl<'de> Deserialize<'de> for T {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        d.deserialize_any(TVisitor)
    }
}

struct TVisitor;

impl<'de> Visitor<'de> for TVisitor {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::Atom("null".into()))
    }
    fn visit_bool<E>(self, b: bool) -> Result<T, E> {
        Ok(T::Atom(b.to_string()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<T, E> {
        Ok(T::Atom(n.to_string()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<T, E> {
        Ok(T::Atom(n.to_string()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<T, E> {
        Ok(T::Atom(serde_json::Value::from(n).to_string()))
    }
    fn visit_str<E>(self, s: &str) -> Result<T, E> {
        Ok(T::Atom(serde_json::Value::from(s).to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element()? {
            v.push(x);
        }
        Ok(T::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut v = Vec::new();
        while let Some(kv) = map.next_entry::<String, T>()? {
            v.push(kv);
        }
        Ok(T::Obj(v))
    }
}

impl T {
    fn text(&self) -> String {
        match self {
            T::Atom(a) => a.clone(),
            T::Arr(items) => {
                let parts: Vec<String> = items.iter().map(T::text).collect();
                format!("[{}]", parts.join(","))
            }
            T::Obj(members) => {
                let parts: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::Value::from(k.as_str()), v.text()))
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
        }
    }

    /// Every variation of this value, each differing in one place.
    fn variations(&self) -> Vec<T> {
        let atoms = [
            "null",
            "0",
            "1",
            "-1",
            "1.5",
            "true",
            "\"s\"",
            "\"broadcast\"",
            "[]",
            "{}",
            "[1,2]",
            "{\"broadcast\":null}",
            "{\"broadcast\":{}}",
            "{\"x\":1}",
            "18446744073709551616",
        ];
        let mut out = Vec::new();
        for a in atoms {
            out.push(T::Atom(a.into()));
        }
        match self {
            T::Atom(_) => {}
            T::Arr(items) => {
                out.push(T::Arr(Vec::new()));
                for i in 0..items.len() {
                    let mut fewer = items.clone();
                    fewer.remove(i);
                    out.push(T::Arr(fewer));
                    for v in items[i].variations() {
                        let mut other = items.clone();
                        other[i] = v;
                        out.push(T::Arr(other));
                    }
                }
                let mut more = items.clone();
                more.push(T::Atom("1".into()));
                out.push(T::Arr(more));
            }
            T::Obj(members) => {
                // The object as an array of its values, in order.
                out.push(T::Arr(members.iter().map(|(_, v)| v.clone()).collect()));
                let mut more = members.clone();
                more.push(("zz".into(), T::Atom("1".into())));
                out.push(T::Obj(more));
                let mut more = members.clone();
                more.insert(0, ("zz".into(), T::Obj(Vec::new())));
                out.push(T::Obj(more));
                let mut reversed = members.clone();
                reversed.reverse();
                out.push(T::Obj(reversed));
                for i in 0..members.len() {
                    let mut fewer = members.clone();
                    fewer.remove(i);
                    out.push(T::Obj(fewer));
                    let mut twice = members.clone();
                    twice.push(members[i].clone());
                    out.push(T::Obj(twice));
                    let mut renamed = members.clone();
                    renamed[i].0.push('_');
                    out.push(T::Obj(renamed));
                    for v in members[i].1.variations() {
                        let mut other = members.clone();
                        other[i].1 = v;
                        out.push(T::Obj(other));
                    }
                }
            }
        }
        out
    }
}

/// Both readers agree on `text`: both refuse it, or both read the same
/// entry (the same bytes when written again). Returns whether it was read.
fn agree(text: &str) -> bool {
    let old = serde_json::from_str::<old::Change>(text);
    let new = Change::decode(text.as_bytes());
    // The same entry inside other JSON (`cluster.command`'s argument).
    let inner = serde_json::from_str::<Change>(text);
    match (&old, &new) {
        (Ok(o), Ok(n)) => {
            let o = serde_json::to_vec(o).unwrap();
            assert_eq!(
                String::from_utf8(n.encode()).unwrap(),
                String::from_utf8(o).unwrap(),
                "{text}"
            );
        }
        (Err(_), Err(_)) => {}
        _ => panic!("the readers disagree on {text}: old {old:?}, new {new:?}"),
    }
    assert_eq!(inner.is_ok(), new.is_ok(), "{text}");
    new.is_ok()
}

#[test]
fn golden_entries_read_back_and_write_the_same_bytes() {
    for &g in GOLDEN_CHANGES {
        let e = Change::decode(g.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(e.encode()).unwrap(), g);
        assert!(agree(g));
    }
}

#[test]
fn every_variation_of_the_golden_entries_is_read_as_before() {
    let (mut read, mut refused) = (0, 0);
    for &g in GOLDEN_CHANGES {
        let t: T = serde_json::from_str(g).unwrap();
        let mut all = t.variations();
        // Variations of variations one level down for the command itself.
        if let T::Obj(m) = &t {
            if let Some((_, T::Obj(cmd))) = m.iter().find(|(k, _)| k == "cmd") {
                if let Some((_, body)) = cmd.first() {
                    for v in body.variations() {
                        for w in v.variations().into_iter().take(64) {
                            let mut outer = m.clone();
                            for (k, val) in outer.iter_mut() {
                                if k == "cmd" {
                                    *val = T::Obj(vec![(cmd[0].0.clone(), w.clone())]);
                                }
                            }
                            all.push(T::Obj(outer));
                        }
                    }
                }
            }
        }
        for v in all {
            if agree(&v.text()) {
                read += 1;
            } else {
                refused += 1;
            }
        }
    }
    // Both kinds are well represented, so the comparison means something.
    assert!(
        read > 500 && refused > 5_000,
        "{read} read, {refused} refused"
    );
}

#[test]
fn odd_forms_are_read_as_before() {
    let cases = [
        // Structs as arrays, the op first.
        r#"[2,9,{"subs":["node_up",3,4]}]"#,
        r#"[2,9,{"subs":["subscribe",[1,2],"s","p",null,null]}]"#,
        r#"[2,9,{"subs":["subscribe",[1,2],"s","p"]}]"#,
        r#"[2,9,{"meta":["stream_place","s",[4,[1,2]]]}]"#,
        r#"[2,9,{"meta":["cursors","s",[["c",1,2]]]}]"#,
        r#"[2,9,{"meta":["cursors","s",[{"consumer":"c","ack_floor":1,"delivered":2,"x":0}]]}]"#,
        r#"[2,9,{"meta":["cursors","s",[{"consumer":"c","ack_floor":1,"ack_floor":1,"delivered":2}]]}]"#,
        r#"[2,9,{"meta":[]}]"#,
        r#"[2,9]"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":0,"node":3,"boot":4}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"node":3,"boot":4,"op":"node_up"}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"node_up","op":"node_up","node":3,"boot":4}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":{"broadcast":null}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":{"broadcast":{}}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":{"broadcast":[]}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":{"broadcast":1}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":{}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"group_set","queue":"q","mode":"Broadcast"}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"node_up","node":3.0,"boot":4}}}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"node_up","node":3,"boot":4}},"cmd":1}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"node_up","node":3,"boot":4},"meta":{}}}"#,
        r#"{"node":2,"op":9,"cmd":{}}"#,
        r#"{"node":2,"op":9,"cmd":"subs"}"#,
        r#"{"node":2,"op":9,"cmd":{"subs":{"op":"remove_node","node":3}}}"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_put","name":"s","owner":1}}}"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_put","name":"s","owner":1,"config":{"a":1,"a":2}}}}"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_put","name":"s","owner":1,"config":[1,-2,1e400]}}}"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_put","name":"s","owner":1,"config":[1,-2,1.0e3]}}}"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_delete","name":"s\u00e9\n"}}}"#,
        r#" {"node":2,"op":9,"cmd":{"meta":{"op":"stream_delete","name":"s"}}} "#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_delete","name":"s"}}} x"#,
        r#"{"node":2,"op":9,"cmd":{"meta":{"op":"stream_delete","name":"s"}}"#,
        r#""#,
        r#"null"#,
    ];
    for c in cases {
        agree(c);
    }
}

#[test]
fn a_golden_snapshot_restores_and_writes_the_same_bytes() {
    let mut f = Fsm::new(1);
    f.restore(GOLDEN_SNAPSHOT.as_bytes()).unwrap();
    assert_eq!(String::from_utf8(f.snapshot()).unwrap(), GOLDEN_SNAPSHOT);
    assert_eq!(f.applied, 42);
    assert_eq!(f.streams["orders"].consumers["c"].cursor.delivered, 6);
}

fn consumer_create(text: &str) -> String {
    match serde_json::from_str::<ConsumerCreate>(text) {
        Ok(c) => format!("ok {} {}", c.stream, serde_json::Value::Object(c.config)),
        Err(e) => format!("err {e}"),
    }
}

fn old_consumer_create(text: &str) -> String {
    match serde_json::from_str::<old::ConsumerCreate>(text) {
        Ok(c) => format!("ok {} {}", c.stream, serde_json::Value::Object(c.config)),
        Err(e) => format!("err {e}"),
    }
}

#[test]
fn consumer_create_reads_and_fails_as_before() {
    for &(text, want) in GOLDEN_CONSUMER_CREATE {
        assert_eq!(consumer_create(text), want, "{text}");
    }
    let t: T = serde_json::from_str(r#"{"stream":"S","name":"c","ack_wait_ms":5}"#).unwrap();
    for v in t.variations() {
        let text = v.text();
        assert_eq!(consumer_create(&text), old_consumer_create(&text), "{text}");
    }
}
