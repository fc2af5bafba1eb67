//! Where a replicated stream lives: the `replicas` field of
//! `stream.create`, the choice of its R nodes, and the [`Placement`] the control group records for it
//! (`fsm::MetaCommand::StreamPlace`) so that every node knows the group
//! id and members of every stream group.
//!
//! Pure: the caller hands in the cluster's nodes and how many replicas
//! each already holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::errors::{ApiError, Code};

/// The nodes of one stream's Raft group. `replicas[0]` is the node the
/// group starts on (the one that took the create), the preferred first
/// leader; the others are in the order they were picked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The stream's Raft group (never 0, the control group's).
    pub group: u64,
    pub replicas: Vec<u64>,
    /// Nodes whose replica is being moved off (the node is being removed
    /// from the cluster): still in the group until the nodes in
    /// `replicas` all vote in it, then dropped, and this list emptied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<u64>,
    /// Nodes of `replicas` that take over from `leaving`: they join the
    /// group as non-voters and are promoted once they have caught up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<u64>,
}

impl Placement {
    /// Every node holding a replica: the group's members and those
    /// leaving it.
    pub fn holders(&self) -> impl Iterator<Item = u64> + '_ {
        self.replicas.iter().chain(&self.leaving).copied()
    }

    /// Whether `node` holds a replica (a member or leaving).
    pub fn holds(&self, node: u64) -> bool {
        self.holders().any(|n| n == node)
    }

    /// The group's voters before the move under way (if any) began: what
    /// a member starts from when its log does not say otherwise.
    pub fn seed(&self) -> Vec<u64> {
        let mut seed: Vec<u64> = self
            .replicas
            .iter()
            .copied()
            .filter(|n| !self.joining.contains(n))
            .collect();
        seed.extend(&self.leaving);
        seed
    }

    /// Whether a move is under way.
    pub fn moving(&self) -> bool {
        !self.leaving.is_empty() || !self.joining.is_empty()
    }
}

/// The placement of a stream whose replica on `node` must leave (the node
/// is being removed): that replica is re-created on the node of `nodes`
/// holding the fewest replicas (`held`) among those without one of this
/// stream, and `node` is marked leaving. With no such node, the stream
/// keeps one replica fewer, if that leaves two. `None`: `node` holds no
/// replica here (or only a leaving one), or it cannot go.
pub fn move_off(
    p: &Placement,
    node: u64,
    nodes: &[u64],
    held: &BTreeMap<u64, usize>,
) -> Option<Placement> {
    let at = p.replicas.iter().position(|&n| n == node)?;
    let mut next = p.clone();
    next.replicas.remove(at);
    let to = nodes
        .iter()
        .copied()
        .filter(|&n| n != node && !p.holds(n))
        .min_by_key(|n| (held.get(n).copied().unwrap_or(0), *n));
    if let Some(to) = to {
        next.replicas.push(to);
        next.joining.push(to);
    }
    if next.replicas.len() < 2 {
        // A replicated stream keeps two replicas at least: with nowhere
        // to go, this one stays.
        return None;
    }
    next.leaving.push(node);
    Some(next)
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

/// Takes `replicas` out of a `stream.create` request object (so the rest
/// reads as a stream config) and checks it: an integer from 1 to `nodes`
/// (the cluster's node count, 1 on a single node), above 1 only when
/// `clustered`; absent or null means 1.
pub fn take_replicas(
    fields: &mut Map<String, Value>,
    nodes: usize,
    clustered: bool,
) -> Result<usize, ApiError> {
    let r = match fields.remove("replicas") {
        None | Some(Value::Null) => return Ok(1),
        Some(v) => v
            .as_u64()
            .filter(|&r| r >= 1)
            .ok_or_else(|| bad("replicas must be an integer of at least 1"))?,
    };
    if r > 1 && !clustered {
        return Err(bad("replicas above 1 needs a cluster"));
    }
    if r > nodes as u64 {
        return Err(bad(format!(
            "replicas is {r}, the cluster has {nodes} node{}",
            if nodes == 1 { "" } else { "s" }
        )));
    }
    Ok(r as usize)
}

/// How many replicas each node holds, from the placements of the
/// replicated streams and the owners of the others.
pub fn replica_counts<'a>(
    placed: impl IntoIterator<Item = (u64, Option<&'a Placement>)>,
) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for (owner, placement) in placed {
        match placement {
            Some(p) => {
                for &n in &p.replicas {
                    *out.entry(n).or_insert(0) += 1;
                }
            }
            None => *out.entry(owner).or_insert(0) += 1,
        }
    }
    out
}

/// Picks `r` distinct nodes of `nodes` for a new stream: those holding
/// the fewest replicas (`held`), ties to the lower node id; `prefer` (the
/// node taking the create) first when it is among them, so the group can
/// start its first election there. `unavailable` when there are not
/// enough nodes.
pub fn place(
    r: usize,
    nodes: &[u64],
    held: &BTreeMap<u64, usize>,
    prefer: Option<u64>,
) -> Result<Vec<u64>, ApiError> {
    let mut pool: Vec<u64> = nodes.to_vec();
    pool.sort_unstable();
    pool.dedup();
    if r == 0 || pool.len() < r {
        return Err(ApiError::new(
            Code::Unavailable,
            format!(
                "{r} replicas asked for, {} node{} to put them on",
                pool.len(),
                if pool.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    // Sorted by (replicas held, id) as plain pairs: a `sort_by_key` with
    // its own closure would be one more copy of the standard library's
    // sort (15 KB) for a list of a few nodes.
    let mut by_load: Vec<(u64, u64)> = pool
        .iter()
        .map(|&n| (held.get(&n).copied().unwrap_or(0) as u64, n))
        .collect();
    by_load.sort_unstable();
    let mut chosen: Vec<u64> = by_load.into_iter().take(r).map(|(_, n)| n).collect();
    if let Some(at) = prefer.and_then(|p| chosen.iter().position(|&n| n == p)) {
        let p = chosen.remove(at);
        chosen.insert(0, p);
    }
    Ok(chosen)
}

/// Whether `p` is a placement the control state may record: a stream
/// group id, and distinct replicas.
pub fn check(p: &Placement) -> Result<(), ApiError> {
    if p.group == 0 {
        return Err(bad("group 0 is the control group"));
    }
    if p.replicas.is_empty() {
        return Err(bad("a placement needs at least one replica"));
    }
    let mut seen: Vec<u64> = p.holders().collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != p.replicas.len() + p.leaving.len()
        || p.joining.iter().any(|n| !p.replicas.contains(n))
    {
        return Err(bad("a node holds one replica of a stream at most"));
    }
    Ok(())
}

/// Whether placement `next` may follow `now` (both of one stream): a
/// move starts from the replicas in place, and ends with the replicas it
/// moved to, so a change proposed from an older state is refused.
pub fn check_next(now: &Placement, next: &Placement) -> Result<(), ApiError> {
    let sorted = |v: Vec<u64>| {
        let mut v = v;
        v.sort_unstable();
        v
    };
    if now.group != next.group {
        return Err(ApiError::new(
            Code::Exists,
            "the stream is placed in another group",
        ));
    }
    let fits = match (now.moving(), next.moving()) {
        (false, true) => sorted(next.seed()) == sorted(now.replicas.clone()),
        (true, false) => sorted(next.replicas.clone()) == sorted(now.replicas.clone()),
        _ => next == now,
    };
    if fits {
        Ok(())
    } else {
        Err(ApiError::new(
            Code::Exists,
            "the stream's placement changed meanwhile",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fsm::{Cmd, Fsm, MetaCommand};
    use serde_json::json;

    fn fields(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("object"),
        }
    }

    #[test]
    fn replicas_defaults_to_one_and_is_bounded() {
        let take = |v: Value, nodes, clustered| take_replicas(&mut fields(v), nodes, clustered);
        assert_eq!(take(json!({"name": "s"}), 1, false), Ok(1));
        assert_eq!(take(json!({"replicas": null}), 3, true), Ok(1));
        assert_eq!(take(json!({"replicas": 1}), 1, false), Ok(1));
        assert_eq!(take(json!({"replicas": 3}), 3, true), Ok(3));
        assert_eq!(take(json!({"replicas": 2}), 5, true), Ok(2));
        for (v, nodes, clustered) in [
            (json!({"replicas": 0}), 3, true),
            (json!({"replicas": -1}), 3, true),
            (json!({"replicas": 2.5}), 3, true),
            (json!({"replicas": "3"}), 3, true),
            (json!({"replicas": 4}), 3, true),
            (json!({"replicas": 2}), 1, false),
            (json!({"replicas": 3}), 3, false),
        ] {
            let e = take(v.clone(), nodes, clustered).unwrap_err();
            assert_eq!(e.code, Code::BadRequest, "{v} on {nodes} nodes");
        }
        // The field is taken out: what remains reads as a stream config.
        let mut f = fields(serde_json::json!({"name": "s", "replicas": 3}));
        take_replicas(&mut f, 3, true).unwrap();
        assert_eq!(Value::Object(f), serde_json::json!({"name": "s"}));
    }

    #[test]
    fn placement_picks_distinct_nodes_holding_the_fewest_replicas() {
        let nodes = [1, 2, 3, 4, 5];
        let held: BTreeMap<u64, usize> = [(1, 4), (2, 1), (3, 0), (4, 1), (5, 2)].into();
        assert_eq!(place(3, &nodes, &held, None), Ok(vec![3, 2, 4]));
        // The node taking the create goes first when chosen anyway...
        assert_eq!(place(3, &nodes, &held, Some(4)), Ok(vec![4, 3, 2]));
        // ...and is not forced in when it holds the most.
        assert_eq!(place(3, &nodes, &held, Some(1)), Ok(vec![3, 2, 4]));
        assert_eq!(place(5, &nodes, &held, None).unwrap().len(), 5);
        assert_eq!(
            place(6, &nodes, &held, None).unwrap_err().code,
            Code::Unavailable
        );
        assert_eq!(
            place(2, &[7, 7], &held, None).unwrap_err().code,
            Code::Unavailable
        );
    }

    #[test]
    fn many_streams_spread_evenly() {
        let nodes = [1, 2, 3, 4, 5];
        let mut placements: Vec<Placement> = Vec::new();
        for k in 0..100u64 {
            let held = replica_counts(placements.iter().map(|p| (0, Some(p))));
            let replicas = place(3, &nodes, &held, Some(k % 5 + 1)).unwrap();
            placements.push(Placement {
                group: k + 1,
                replicas,
                leaving: Vec::new(),
                joining: Vec::new(),
            });
        }
        let held = replica_counts(placements.iter().map(|p| (0, Some(p))));
        assert_eq!(held.values().sum::<usize>(), 300);
        assert!(held.values().all(|&n| n == 60), "{held:?}");
        // An R1 stream counts for its owner.
        let one = replica_counts([(2, None), (2, None), (3, None)]);
        assert_eq!(one, [(2, 2), (3, 1)].into());
    }

    #[test]
    fn the_control_state_records_placements_and_keeps_them_in_snapshots() {
        let mut f = Fsm::new(1);
        f.apply(&Cmd::Meta(MetaCommand::StreamPut {
            name: "s".into(),
            owner: 2,
            config: serde_json::json!({"name": "s", "subjects": ["s.>"]}),
        }))
        .unwrap();
        let place = |p: Placement| {
            Cmd::Meta(MetaCommand::StreamPlace {
                name: "s".into(),
                placement: p,
            })
        };
        for bad in [
            Placement {
                group: 0,
                replicas: vec![1, 2, 3],
                leaving: Vec::new(),
                joining: Vec::new(),
            },
            Placement {
                group: 9,
                replicas: vec![1, 2, 1],
                leaving: Vec::new(),
                joining: Vec::new(),
            },
            Placement {
                group: 9,
                replicas: vec![],
                leaving: Vec::new(),
                joining: Vec::new(),
            },
        ] {
            assert_eq!(f.apply(&place(bad)).unwrap_err().code, Code::BadRequest);
        }
        let p = Placement {
            group: 9,
            replicas: vec![2, 1, 3],
            leaving: Vec::new(),
            joining: Vec::new(),
        };
        let missing = Cmd::Meta(MetaCommand::StreamPlace {
            name: "t".into(),
            placement: p.clone(),
        });
        assert_eq!(f.apply(&missing).unwrap_err().code, Code::NotFound);
        f.apply(&place(p.clone())).unwrap();
        assert_eq!(f.stream_placement("s"), Some(&p));
        // A group id belongs to one stream.
        f.apply(&Cmd::Meta(MetaCommand::StreamPut {
            name: "t".into(),
            owner: 1,
            config: serde_json::json!({"name": "t", "subjects": ["t.>"]}),
        }))
        .unwrap();
        assert_eq!(f.apply(&missing).unwrap_err().code, Code::Exists);
        let mut g = Fsm::new(3);
        g.restore(&f.snapshot()).unwrap();
        assert_eq!(g.stream_placement("s"), Some(&p));
        assert_eq!(g.stream_placement("t"), None);
    }

    fn placed(replicas: &[u64]) -> Placement {
        Placement {
            group: 7,
            replicas: replicas.to_vec(),
            leaving: Vec::new(),
            joining: Vec::new(),
        }
    }

    #[test]
    fn a_replica_moves_to_the_least_loaded_node_without_one() {
        let p = placed(&[1, 2, 3]);
        let held: BTreeMap<u64, usize> = [(1, 1), (2, 1), (3, 1), (4, 3), (5, 1)].into();
        let next = move_off(&p, 2, &[1, 3, 4, 5], &held).unwrap();
        assert_eq!(next.replicas, vec![1, 3, 5]);
        assert_eq!(next.joining, vec![5]);
        assert_eq!(next.leaving, vec![2]);
        assert_eq!(
            next.seed(),
            vec![1, 3, 2],
            "the voters the move starts from"
        );
        assert!(next.holds(2) && next.holds(5) && !next.holds(4));
        check(&next).unwrap();
        check_next(&p, &next).unwrap();
        // Nowhere to go: one replica fewer, if two are left.
        let next = move_off(&p, 3, &[1, 2], &held).unwrap();
        assert_eq!(
            (next.replicas, next.joining, next.leaving),
            (vec![1, 2], vec![], vec![3])
        );
        assert_eq!(move_off(&placed(&[1, 2]), 2, &[1], &held), None);
        // Not a member (or already leaving): nothing to move.
        assert_eq!(move_off(&p, 9, &[1, 2, 3], &held), None);
    }

    #[test]
    fn a_move_starts_from_the_replicas_in_place_and_ends_on_its_targets() {
        let p = placed(&[1, 2, 3]);
        let held = BTreeMap::new();
        let moving = move_off(&p, 3, &[1, 2, 4], &held).unwrap();
        check_next(&p, &moving).unwrap();
        let done = placed(&[1, 2, 4]);
        check_next(&moving, &done).unwrap();
        // A move asked from the state before it ended, applied after.
        assert_eq!(check_next(&done, &moving).unwrap_err().code, Code::Exists);
        // An end that is not the move's.
        assert!(check_next(&moving, &placed(&[1, 2, 3])).is_err());
        // Another group, or a second move over one under way.
        let mut other = done.clone();
        other.group = 8;
        assert!(check_next(&done, &other).is_err());
        let again = move_off(&done, 1, &[2, 3, 4], &held).unwrap();
        assert!(check_next(&moving, &again).is_err());
        // A joining node must be among the replicas, and no node twice.
        let mut bad = moving.clone();
        bad.joining = vec![9];
        assert!(check(&bad).is_err());
        let mut bad = moving.clone();
        bad.leaving = vec![1];
        assert!(check(&bad).is_err());
    }

    #[test]
    fn placements_without_a_move_read_and_write_as_before() {
        let p = placed(&[2, 1, 3]);
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"group":7,"replicas":[2,1,3]}"#);
        let back: Placement = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        let moving = move_off(&p, 3, &[1, 2, 4], &BTreeMap::new()).unwrap();
        let text = serde_json::to_string(&moving).unwrap();
        assert_eq!(
            text,
            r#"{"group":7,"replicas":[2,1,4],"leaving":[3],"joining":[4]}"#
        );
        assert_eq!(serde_json::from_str::<Placement>(&text).unwrap(), moving);
    }
}
