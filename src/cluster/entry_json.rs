//! Reading the control group's entries ([`Change`]) from their JSON, by
//! hand: the text is parsed once into a plain tree that keeps every
//! object member in order, and the commands are matched on their `op`
//! string from there. Entries are kept in Raft logs and snapshots and sent
//! between nodes, so this reader accepts exactly what serde's derived
//! readers of these types accepted (`tests/entry_encoding.rs` holds both
//! to the same vectors): a struct as an object (unknown members ignored, a
//! known one given twice refused) or as an array of its fields in order;
//! a command as an object with its `op` member anywhere, or as an array
//! whose first element is the op. One non-generic path instead of a
//! derived reader per command: the derived ones for internally tagged
//! enums buffer every value in serde's `Content` first, and made the
//! broker 81 KB larger than this reader does (docs/PERFORMANCE.md,
//! "Binary size").

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::fsm::{Change, Cmd, Cursor, CursorPos, MetaCommand};
use super::placement::Placement;
use crate::routing::groups::GroupMode;
use crate::routing::subs::{Command, Owner};

/// A JSON value with its objects' members in order, repeats kept.
enum J {
    Null,
    Bool(bool),
    Num(Number),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    /// What serde's "invalid type" errors call this kind of value.
    fn kind(&self) -> String {
        match self {
            J::Null => "null".into(),
            J::Bool(b) => format!("boolean `{b}`"),
            J::Num(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => format!("integer `{u}`"),
                (_, Some(i)) => format!("integer `{i}`"),
                _ => format!("floating point `{n}`"),
            },
            J::Str(s) => format!("string {s:?}"),
            J::Arr(_) => "sequence".into(),
            J::Obj(_) => "map".into(),
        }
    }

    /// As a `serde_json::Value`: of members given twice, the last counts.
    fn into_value(self) -> Value {
        match self {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(b),
            J::Num(n) => Value::Number(n),
            J::Str(s) => Value::String(s),
            J::Arr(items) => Value::Array(items.into_iter().map(J::into_value).collect()),
            J::Obj(members) => {
                let mut map = Map::new();
                for (k, v) in members {
                    map.insert(k, v.into_value());
                }
                Value::Object(map)
            }
        }
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<J, E> {
        Ok(J::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<J, E> {
        Ok(J::Num(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<J, E> {
        Ok(J::Num(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<J, E> {
        Ok(Number::from_f64(n).map_or(J::Null, J::Num))
    }

    fn visit_str<E>(self, s: &str) -> Result<J, E> {
        Ok(J::Str(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<J, E> {
        Ok(J::Str(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(J::Arr(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J, A::Error> {
        let mut members = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, J>()? {
            members.push((k, v));
        }
        Ok(J::Obj(members))
    }
}

fn invalid(j: &J, expected: &str) -> String {
    format!("invalid type: {}, expected {expected}", j.kind())
}

/// The fields of one struct, by declaration order.
struct Fields {
    names: &'static [&'static str],
    vals: Vec<Option<J>>,
}

impl Fields {
    /// Reads struct `what` with fields `names` from an object or array.
    fn read(j: J, what: &str, names: &'static [&'static str]) -> Result<Fields, String> {
        let mut vals: Vec<Option<J>> = names.iter().map(|_| None).collect();
        match j {
            J::Obj(members) => Self::fill(&mut vals, names, members)?,
            J::Arr(items) => Self::fill_seq(&mut vals, what, items)?,
            other => return Err(invalid(&other, what)),
        }
        Ok(Fields { names, vals })
    }

    fn fill(
        vals: &mut [Option<J>],
        names: &'static [&'static str],
        members: Vec<(String, J)>,
    ) -> Result<(), String> {
        for (k, v) in members {
            if let Some(i) = names.iter().position(|n| *n == k) {
                if vals[i].is_some() {
                    return Err(format!("duplicate field `{k}`"));
                }
                vals[i] = Some(v);
            }
        }
        Ok(())
    }

    /// An array: exactly one element per field.
    fn fill_seq(vals: &mut [Option<J>], what: &str, items: Vec<J>) -> Result<(), String> {
        if items.len() != vals.len() {
            return Err(format!(
                "invalid length {}, expected {what} with {} elements",
                items.len(),
                vals.len()
            ));
        }
        for (slot, item) in vals.iter_mut().zip(items) {
            *slot = Some(item);
        }
        Ok(())
    }

    /// A required field.
    fn take(&mut self, i: usize) -> Result<J, String> {
        self.vals[i]
            .take()
            .ok_or_else(|| format!("missing field `{}`", self.names[i]))
    }

    /// An optional field: absent or `null` is none.
    fn opt(&mut self, i: usize) -> Option<J> {
        self.vals[i].take().filter(|j| !matches!(j, J::Null))
    }

    fn u64(&mut self, i: usize) -> Result<u64, String> {
        as_u64(self.take(i)?)
    }

    fn opt_u64(&mut self, i: usize) -> Result<Option<u64>, String> {
        self.opt(i).map(as_u64).transpose()
    }

    fn string(&mut self, i: usize) -> Result<String, String> {
        as_string(self.take(i)?)
    }

    fn opt_string(&mut self, i: usize) -> Result<Option<String>, String> {
        self.opt(i).map(as_string).transpose()
    }

    fn value(&mut self, i: usize) -> Result<Value, String> {
        Ok(self.take(i)?.into_value())
    }

    fn owner(&mut self, i: usize) -> Result<Owner, String> {
        let mut f = Fields::read(self.take(i)?, "struct Owner", &["node", "conn"])?;
        Ok(Owner {
            node: f.u64(0)?,
            conn: f.u64(1)?,
        })
    }
}

fn as_u64(j: J) -> Result<u64, String> {
    match &j {
        J::Num(n) if n.is_u64() => Ok(n.as_u64().unwrap_or_default()),
        J::Num(n) if n.is_i64() => Err(format!("invalid value: {}, expected u64", j.kind())),
        _ => Err(invalid(&j, "u64")),
    }
}

/// A [`Placement`]: a move's two lists (`leaving`, `joining`) are left
/// out when empty, in the array form too, where they come last.
fn read_placement(j: J) -> Result<Placement, String> {
    const NAMES: &[&str] = &["group", "replicas", "leaving", "joining"];
    let what = "struct Placement";
    let mut vals: Vec<Option<J>> = NAMES.iter().map(|_| None).collect();
    match j {
        J::Obj(members) => Fields::fill(&mut vals, NAMES, members)?,
        J::Arr(items) if (2..=NAMES.len()).contains(&items.len()) => {
            for (slot, item) in vals.iter_mut().zip(items) {
                *slot = Some(item);
            }
        }
        J::Arr(items) => Fields::fill_seq(&mut vals, what, items)?,
        other => return Err(invalid(&other, what)),
    }
    let mut f = Fields { names: NAMES, vals };
    let list = |v: Option<J>| v.map(as_u64s).transpose().map(Option::unwrap_or_default);
    Ok(Placement {
        group: f.u64(0)?,
        replicas: as_u64s(f.take(1)?)?,
        leaving: list(f.vals[2].take())?,
        joining: list(f.vals[3].take())?,
    })
}

fn as_u64s(j: J) -> Result<Vec<u64>, String> {
    match j {
        J::Arr(items) => items.into_iter().map(as_u64).collect(),
        other => Err(invalid(&other, "a sequence")),
    }
}

fn as_string(j: J) -> Result<String, String> {
    match j {
        J::Str(s) => Ok(s),
        other => Err(invalid(&other, "a string")),
    }
}

/// Reads one entry, as [`Change::decode`] does.
pub fn read_change(bytes: &[u8]) -> Result<Change, String> {
    let j: J = crate::protocol::json_from_bytes(bytes).map_err(|e| e.to_string())?;
    change(j)
}

/// An entry inside other JSON (`cluster.command` carries one).
impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Change, D::Error> {
        change(J::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

fn change(j: J) -> Result<Change, String> {
    let mut f = Fields::read(j, "struct Change", &["node", "op", "cmd"])?;
    Ok(Change {
        node: f.u64(0)?,
        op: f.u64(1)?,
        cmd: read_cmd(f.take(2)?)?,
    })
}

/// `{"subs": command}` or `{"meta": command}`.
fn read_cmd(j: J) -> Result<Cmd, String> {
    let J::Obj(mut members) = j else {
        return Err(invalid(&j, "enum Cmd"));
    };
    if members.len() != 1 {
        return Err("expected an object with one member, the variant".into());
    }
    let (variant, body) = members.pop().unwrap_or((String::new(), J::Null));
    match variant.as_str() {
        "subs" => read_subs(body).map(Cmd::Subs),
        "meta" => read_meta(body).map(Cmd::Meta),
        other => Err(format!(
            "unknown variant `{other}`, expected `subs` or `meta`"
        )),
    }
}

/// An internally tagged command: its op, and the rest as an object or
/// an array of the variant's fields.
fn split_op(j: J, what: &str) -> Result<(String, J), String> {
    match j {
        J::Obj(mut members) => {
            let mut op = None;
            let mut i = 0;
            while i < members.len() {
                if members[i].0 == "op" {
                    if op.is_some() {
                        return Err("duplicate field `op`".into());
                    }
                    op = Some(members.remove(i).1);
                } else {
                    i += 1;
                }
            }
            let op = op.ok_or("missing field `op`")?;
            Ok((as_variant(op)?, J::Obj(members)))
        }
        J::Arr(mut items) => {
            if items.is_empty() {
                return Err("missing field `op`".into());
            }
            let op = items.remove(0);
            Ok((as_variant(op)?, J::Arr(items)))
        }
        other => Err(invalid(&other, what)),
    }
}

fn as_variant(j: J) -> Result<String, String> {
    match j {
        J::Str(s) => Ok(s),
        other => Err(invalid(&other, "variant identifier")),
    }
}

fn read_subs(j: J) -> Result<Command, String> {
    let (op, body) = split_op(j, "internally tagged enum Command")?;
    Ok(match op.as_str() {
        "subscribe" => {
            let names = &["owner", "sid", "pattern", "queue", "max"];
            let mut f = Fields::read(body, "struct variant Command::Subscribe", names)?;
            Command::Subscribe {
                owner: f.owner(0)?,
                sid: f.string(1)?,
                pattern: f.string(2)?,
                queue: f.opt_string(3)?,
                max: f.opt_u64(4)?,
            }
        }
        "unsubscribe" => {
            let names = &["owner", "sid", "after"];
            let mut f = Fields::read(body, "struct variant Command::Unsubscribe", names)?;
            Command::Unsubscribe {
                owner: f.owner(0)?,
                sid: f.string(1)?,
                after: f.opt_u64(2)?,
            }
        }
        "remove_conn" => {
            let mut f = Fields::read(body, "struct variant Command::RemoveConn", &["owner"])?;
            Command::RemoveConn { owner: f.owner(0)? }
        }
        "remove_node" => {
            let names = &["node", "boot"];
            let mut f = Fields::read(body, "struct variant Command::RemoveNode", names)?;
            Command::RemoveNode {
                node: f.u64(0)?,
                boot: f.opt_u64(1)?,
            }
        }
        "node_up" => {
            let names = &["node", "boot"];
            let mut f = Fields::read(body, "struct variant Command::NodeUp", names)?;
            Command::NodeUp {
                node: f.u64(0)?,
                boot: f.u64(1)?,
            }
        }
        "group_set" => {
            let names = &["queue", "mode"];
            let mut f = Fields::read(body, "struct variant Command::GroupSet", names)?;
            Command::GroupSet {
                queue: f.string(0)?,
                mode: read_group_mode(f.take(1)?)?,
            }
        }
        other => return Err(unknown_op(other)),
    })
}

fn unknown_op(op: &str) -> String {
    format!("unknown variant `{op}`")
}

/// A unit variant: its name, or an object of one member, the name, whose
/// value is `null` or `{}`.
fn read_group_mode(j: J) -> Result<GroupMode, String> {
    let name = match j {
        J::Str(s) => s,
        J::Obj(mut members) if members.len() == 1 => {
            let (name, value) = members.pop().unwrap_or((String::new(), J::Null));
            match value {
                J::Null => {}
                J::Obj(m) if m.is_empty() => {}
                other => return Err(invalid(&other, "unit variant")),
            }
            name
        }
        other => return Err(invalid(&other, "string or map")),
    };
    GroupMode::parse(&name)
        .ok_or_else(|| format!("unknown variant `{name}`, expected `loadbalance` or `broadcast`"))
}

fn read_meta(j: J) -> Result<MetaCommand, String> {
    let (op, body) = split_op(j, "internally tagged enum MetaCommand")?;
    Ok(match op.as_str() {
        "stream_put" => {
            let names = &["name", "owner", "config"];
            let mut f = Fields::read(body, "struct variant MetaCommand::StreamPut", names)?;
            MetaCommand::StreamPut {
                name: f.string(0)?,
                owner: f.u64(1)?,
                config: f.value(2)?,
            }
        }
        "stream_delete" => {
            let mut f = Fields::read(body, "struct variant MetaCommand::StreamDelete", &["name"])?;
            MetaCommand::StreamDelete { name: f.string(0)? }
        }
        "consumer_put" => {
            let names = &["stream", "name", "config"];
            let mut f = Fields::read(body, "struct variant MetaCommand::ConsumerPut", names)?;
            MetaCommand::ConsumerPut {
                stream: f.string(0)?,
                name: f.string(1)?,
                config: f.value(2)?,
            }
        }
        "consumer_delete" => {
            let names = &["stream", "name"];
            let mut f = Fields::read(body, "struct variant MetaCommand::ConsumerDelete", names)?;
            MetaCommand::ConsumerDelete {
                stream: f.string(0)?,
                name: f.string(1)?,
            }
        }
        "cursors" => {
            let names = &["stream", "cursors"];
            let mut f = Fields::read(body, "struct variant MetaCommand::Cursors", names)?;
            let stream = f.string(0)?;
            let cursors = match f.take(1)? {
                J::Arr(items) => items
                    .into_iter()
                    .map(read_cursor)
                    .collect::<Result<_, _>>()?,
                other => return Err(invalid(&other, "a sequence")),
            };
            MetaCommand::Cursors { stream, cursors }
        }
        "stream_place" => {
            let names = &["name", "placement"];
            let mut f = Fields::read(body, "struct variant MetaCommand::StreamPlace", names)?;
            let name = f.string(0)?;
            let placement = read_placement(f.take(1)?)?;
            MetaCommand::StreamPlace { name, placement }
        }
        other => return Err(unknown_op(other)),
    })
}

/// A cursor is an object only: its position's fields sit beside
/// `consumer` (serde's `flatten`, which reads no arrays).
fn read_cursor(j: J) -> Result<Cursor, String> {
    let J::Obj(members) = j else {
        return Err(invalid(&j, "struct Cursor"));
    };
    let names = &["consumer", "ack_floor", "delivered"];
    let mut vals: Vec<Option<J>> = vec![None, None, None];
    Fields::fill(&mut vals, names, members)?;
    let mut f = Fields { names, vals };
    Ok(Cursor {
        consumer: f.string(0)?,
        pos: CursorPos {
            ack_floor: f.u64(1)?,
            delivered: f.u64(2)?,
        },
    })
}
