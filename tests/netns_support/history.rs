//! A history checker for replicated streams under network faults: it
//! reads what each publisher saw (each publish's send time, and its ack
//! `{ok, seq}`, refusal or no answer), what each replica holds (seq ->
//! message), and the fault windows, and names every violation of:
//! - every publish is answered (`{ok, seq}` or a refusal);
//! - every acked publish is stored exactly once, at the acked seq, on
//!   every replica read;
//! - the publishes of one publisher are stored in its order, whatever
//!   their answers (one answered `unavailable` may be stored or not, but
//!   never behind a later one), and acked in that order;
//! - no seq holds two different messages on two replicas, and no two
//!   publishes are acked with one seq;
//! - nothing is stored that was never published, nor stored twice;
//! - a node cut off from its peers acks no publish its clients sent
//!   after the cut began (it could not have replicated it);
//! - after each heal, every node's publisher is acked again within the
//!   bound.
//!
//! Each violation comes with the history of the publisher(s) around it.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::cluster_support::IDS;

/// How a publish ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `{ok, seq}`.
    Acked(u64),
    /// Refused by the server (e.g. `unavailable`): maybe stored, not acked.
    Refused(String),
    /// No answer within the client's wait, well past the contract's bound
    /// for answering (`unavailable` after 4.5 s): a violation.
    Unanswered,
    /// The connection failed first: maybe stored, not acked.
    Unknown(String),
}

/// One publish: its number in its publisher's order, when it was sent and
/// when its outcome came.
#[derive(Clone, Debug)]
pub struct Op {
    pub k: u64,
    pub sent: Instant,
    pub done: Instant,
    pub outcome: Outcome,
}

/// What one publisher (on node `node`, publisher id `p`) saw.
#[derive(Clone, Debug)]
pub struct History {
    pub p: u64,
    pub node: usize,
    pub ops: Vec<Op>,
}

/// What a publish is stored as: (publisher id, k).
pub type MsgId = (u64, u64);

/// One replica's stream as read through it: seq -> message, in seq order
/// as read (a seq read twice is kept twice).
#[derive(Clone, Debug)]
pub struct Replica {
    pub node: usize,
    pub msgs: Vec<(u64, MsgId)>,
}

/// A window during which node `node` was cut off from every peer.
#[derive(Clone, Debug)]
pub struct Cut {
    pub node: usize,
    pub start: Instant,
    pub end: Instant,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: &'static str,
    pub text: String,
    /// Publishers and ks whose history goes with it.
    pub around: Vec<MsgId>,
}

/// What the checker measured besides violations.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub published: usize,
    pub acked: usize,
    pub refused: usize,
    pub unknown: usize,
    /// Per heal: (node healed, per node the time to its first ack after
    /// the heal).
    pub recoveries: Vec<(usize, Vec<Option<Duration>>)>,
}

/// Checks `histories` against `replicas` and `cuts`; `serve_bound` is the
/// bound on the first ack after a heal.
pub fn check(
    histories: &[History],
    replicas: &[Replica],
    cuts: &[Cut],
    serve_bound: Duration,
) -> (Vec<Violation>, Summary) {
    let mut v = Vec::new();
    let mut sum = Summary::default();
    // Acked publishes, and every seq acked.
    let mut acked: BTreeMap<MsgId, u64> = BTreeMap::new();
    let mut by_seq: HashMap<u64, MsgId> = HashMap::new();
    let mut last_k: HashMap<u64, u64> = HashMap::new();
    for h in histories {
        last_k.insert(h.p, h.ops.iter().map(|o| o.k).max().unwrap_or(0));
        for o in &h.ops {
            sum.published += 1;
            match &o.outcome {
                Outcome::Acked(seq) => {
                    sum.acked += 1;
                    acked.insert((h.p, o.k), *seq);
                    if let Some(other) = by_seq.insert(*seq, (h.p, o.k)) {
                        v.push(Violation {
                            kind: "seq-acked-twice",
                            text: format!(
                                "seq {seq} was acked to p{} k{} and to p{} k{}",
                                other.0, other.1, h.p, o.k
                            ),
                            around: vec![other, (h.p, o.k)],
                        });
                    }
                }
                Outcome::Refused(_) => sum.refused += 1,
                Outcome::Unknown(_) => sum.unknown += 1,
                Outcome::Unanswered => {
                    sum.unknown += 1;
                    v.push(Violation {
                        kind: "unanswered",
                        text: format!("p{} k{} was never answered", h.p, o.k),
                        around: vec![(h.p, o.k)],
                    });
                }
            }
        }
    }
    // Publisher order of acked publishes.
    for h in histories {
        let mut prev: Option<(u64, u64)> = None;
        for o in &h.ops {
            if let Outcome::Acked(seq) = o.outcome {
                if let Some((pk, pseq)) = prev {
                    if seq <= pseq {
                        v.push(Violation {
                            kind: "acked-out-of-order",
                            text: format!(
                                "p{} k{pk} was acked seq {pseq} but the later k{} seq {seq}",
                                h.p, o.k
                            ),
                            around: vec![(h.p, pk), (h.p, o.k)],
                        });
                    }
                }
                prev = Some((o.k, seq));
            }
        }
    }
    // Each replica on its own.
    let mut at_seq: BTreeMap<u64, Vec<(usize, MsgId)>> = BTreeMap::new();
    for r in replicas {
        let name = IDS[r.node];
        let mut where_: HashMap<MsgId, u64> = HashMap::new();
        let mut seqs: HashMap<u64, MsgId> = HashMap::new();
        for &(seq, id) in &r.msgs {
            at_seq.entry(seq).or_default().push((r.node, id));
            if let Some(prev) = seqs.insert(seq, id) {
                v.push(Violation {
                    kind: "seq-read-twice",
                    text: format!("{name} delivered seq {seq} twice: {prev:?} and {id:?}"),
                    around: vec![prev, id],
                });
            }
            if id.1 == 0 || last_k.get(&id.0).is_none_or(|&m| id.1 > m) {
                v.push(Violation {
                    kind: "never-published",
                    text: format!(
                        "{name} holds p{} k{} at seq {seq}, never published",
                        id.0, id.1
                    ),
                    around: vec![id],
                });
            }
            if let Some(first) = where_.insert(id, seq) {
                v.push(Violation {
                    kind: "stored-twice",
                    text: format!(
                        "{name} holds p{} k{} at seq {first} and seq {seq}",
                        id.0, id.1
                    ),
                    around: vec![id],
                });
            }
        }
        for (&id, &seq) in &acked {
            match (where_.get(&id), seqs.get(&seq)) {
                (Some(&s), _) if s == seq => {}
                (found, holder) => v.push(Violation {
                    kind: "acked-not-stored-as-acked",
                    text: format!(
                        "p{} k{} was acked seq {seq}; {name} holds it at {}, and at seq {seq} {}",
                        id.0,
                        id.1,
                        found.map_or("no seq".to_string(), |s| format!("seq {s}")),
                        holder.map_or("nothing".to_string(), |h| format!("p{} k{}", h.0, h.1)),
                    ),
                    around: holder.into_iter().copied().chain([id]).collect(),
                }),
            }
        }
        // No publish stored behind a later one of its publisher, acked
        // or not: one answered `unavailable` may be stored, but a relayed
        // request left in a link is never executed after what its
        // publisher sent later (an acked pair out of order was named
        // above already).
        let mut last: HashMap<u64, (u64, u64)> = HashMap::new();
        for &(seq, id) in &r.msgs {
            let top = last.entry(id.0).or_insert((0, 0));
            if id.1 < top.0 && !(acked.contains_key(&id) && acked.contains_key(&(id.0, top.0))) {
                v.push(Violation {
                    kind: "stored-behind-a-later-publish",
                    text: format!(
                        "{name} holds p{} k{} at seq {seq}, behind the later k{} at seq {}",
                        id.0, id.1, top.0, top.1
                    ),
                    around: vec![id, (id.0, top.0)],
                });
            }
            if id.1 > top.0 {
                *top = (id.1, seq);
            }
        }
    }
    // Split brain: one seq, two messages on two replicas.
    for (seq, held) in &at_seq {
        let first = held[0];
        if let Some(other) = held.iter().find(|h| h.1 != first.1) {
            v.push(Violation {
                kind: "split-brain",
                text: format!(
                    "seq {seq} holds p{} k{} on {} but p{} k{} on {}",
                    first.1 .0, first.1 .1, IDS[first.0], other.1 .0, other.1 .1, IDS[other.0]
                ),
                around: vec![first.1, other.1],
            });
        }
    }
    // The cut side acks nothing sent after the cut began.
    for cut in cuts {
        for h in histories.iter().filter(|h| h.node == cut.node) {
            for o in &h.ops {
                if let Outcome::Acked(seq) = o.outcome {
                    if o.sent >= cut.start && o.done < cut.end {
                        v.push(Violation {
                            kind: "cut-side-ack",
                            text: format!(
                                "{} was cut off for {:.1}s, yet acked p{} k{} (sent {:.2}s \
                                 into the cut) with seq {seq}, {:.2}s into the cut",
                                IDS[cut.node],
                                (cut.end - cut.start).as_secs_f64(),
                                h.p,
                                o.k,
                                (o.sent - cut.start).as_secs_f64(),
                                (o.done - cut.start).as_secs_f64(),
                            ),
                            around: vec![(h.p, o.k)],
                        });
                    }
                }
            }
        }
        // Serving again after the heal.
        let mut per_node = Vec::new();
        for (node, name) in IDS.iter().enumerate() {
            let first = histories
                .iter()
                .filter(|h| h.node == node)
                .flat_map(|h| h.ops.iter())
                .filter(|o| matches!(o.outcome, Outcome::Acked(_)) && o.done >= cut.end)
                .map(|o| o.done - cut.end)
                .min();
            if first.is_none_or(|d| d > serve_bound) {
                let p = histories.iter().find(|h| h.node == node);
                let near = p.and_then(|h| {
                    h.ops
                        .iter()
                        .find(|o| o.sent >= cut.end)
                        .or(h.ops.last())
                        .map(|o| (h.p, o.k))
                });
                v.push(Violation {
                    kind: "slow-recovery",
                    text: format!(
                        "after {} healed, {}'s publisher had no ack within {serve_bound:?} ({})",
                        IDS[cut.node],
                        name,
                        first.map_or("none at all".to_string(), |d| format!("first after {d:?}"))
                    ),
                    around: near.into_iter().collect(),
                });
            }
            per_node.push(first);
        }
        sum.recoveries.push((cut.node, per_node));
    }
    (v, sum)
}

/// The report: every violation (at most `max` in full) with the history
/// of its publishers around it (`width` publishes either side); times are
/// seconds since `t0`, with the fault windows they fell in.
pub fn report(
    violations: &[Violation],
    histories: &[History],
    faults: &[(Instant, Instant, String)],
    t0: Instant,
    max: usize,
) -> String {
    let mut out = String::new();
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let during = |t: Instant| -> String {
        let names: Vec<&str> = faults
            .iter()
            .filter(|(a, b, _)| *a <= t && t < *b)
            .map(|(_, _, n)| n.as_str())
            .collect();
        if names.is_empty() {
            String::new()
        } else {
            format!("  [{}]", names.join(", "))
        }
    };
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for viol in violations {
        *kinds.entry(viol.kind).or_default() += 1;
    }
    let _ = writeln!(out, "{} violation(s): {kinds:?}", violations.len());
    for viol in violations.iter().take(max) {
        let _ = writeln!(out, "VIOLATION {}: {}", viol.kind, viol.text);
        for &(p, k) in &viol.around {
            let Some(h) = histories.iter().find(|h| h.p == p) else {
                continue;
            };
            let _ = writeln!(out, "  p{p} (on {}) around k{k}:", IDS[h.node]);
            let Some(at) = h.ops.iter().position(|o| o.k == k) else {
                let _ = writeln!(out, "    k{k} is not in its history");
                continue;
            };
            let lo = at.saturating_sub(3);
            let hi = (at + 4).min(h.ops.len());
            for o in &h.ops[lo..hi] {
                let what = match &o.outcome {
                    Outcome::Acked(seq) => format!("ok seq {seq}"),
                    Outcome::Refused(e) => format!("refused: {e}"),
                    Outcome::Unanswered => "no answer".to_string(),
                    Outcome::Unknown(e) => format!("lost: {e}"),
                };
                let _ = writeln!(
                    out,
                    "    {} k{:<6} sent {:>7.3}s  answered {:>7.3}s  {what}{}",
                    if o.k == k { ">" } else { " " },
                    o.k,
                    secs(o.sent),
                    secs(o.done),
                    during(o.sent)
                );
            }
        }
    }
    if violations.len() > max {
        let _ = writeln!(out, "… and {} more", violations.len() - max);
    }
    out
}
