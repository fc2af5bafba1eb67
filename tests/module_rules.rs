//! The dependency rules between the crate's top-level modules (the table in
//! docs/DESIGN.md, "Dependency rules"): reads every file under `src/` and
//! fails on a `crate::X` path that a module may not use, on a path into
//! another module past the seam it offers ([`SEAMS`]), on an import
//! cycle among the broker's files, and on a broker file other than the
//! executor of its effects that names the cluster handles ([`HANDLES`])
//! or sends on them ([`SENDS`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it may import. Lower
/// layers come first; a module never imports one listed after it, except
/// through [`EXCEPTIONS`].
const RULES: &[(&str, &[&str])] = &[
    ("rand", &[]),
    ("maps", &[]),
    ("storage", &[]),
    ("crypto", &[]),
    ("port", &[]),
    ("protocol", &["rand"]),
    ("auth", &["rand", "crypto", "protocol"]),
    ("config", &["maps", "storage"]),
    ("log", &["config"]),
    ("routing", &["rand", "port", "protocol", "log"]),
    ("stream", &["rand", "storage", "protocol", "config", "log"]),
    ("net", &["rand", "port", "protocol", "config", "log"]),
    ("client", &["rand", "maps", "protocol"]),
    ("cli", &["rand", "protocol", "config", "log", "client"]),
    (
        "cluster",
        &[
            "rand", "maps", "storage", "crypto", "protocol", "config", "log", "routing", "client",
        ],
    ),
    (
        "broker",
        &[
            "rand", "maps", "storage", "crypto", "port", "protocol", "auth", "config", "log",
            "routing", "stream", "cluster",
        ],
    ),
];

/// Imports that break the rules and are known, as whole module pairs (a
/// new pair still fails). None today; the mechanism stays for a crossing
/// that must land before its fix.
const EXCEPTIONS: &[(&str, &str)] = &[];

/// Modules that may use another only through the seam it offers: the
/// importing module, the imported one, and the only submodules of it that
/// the importer may name. The broker reaches cluster mode through
/// `src/cluster/api.rs` alone.
const SEAMS: &[(&str, &str, &[&str])] = &[("broker", "cluster", &["api"])];

/// The top-level modules named by `crate::` paths in `text`, comments left
/// out. `crate::log_warn!` and friends are `log`'s macros.
fn imports(text: &str) -> BTreeSet<String> {
    paths(text, "crate")
        .into_iter()
        .filter(|p| p[0] != "*")
        .map(|p| top_name(&p[0]))
        .collect()
}

/// Every path `text` names after `root::`, groups spread out:
/// `crate::{a::b, c::{d, e}}` is `[a, b]`, `[c, d]`, `[c, e]`; a group may
/// span lines. Whole-line comments are left out; `self` ends a path, and a
/// glob is a last segment `*`.
fn paths(text: &str, root: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let head = format!("{root}::");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find(&head) {
        let start = at + found;
        at = start + head.len();
        // `crate::` inside a longer name (`my_crate::`) or path
        // (`a::super::`) is not the root.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut chars = code[at..].chars().peekable();
        tree(&mut chars, &mut Vec::new(), &mut out);
    }
    out
}

/// The paths of one use-tree, `a::{b, c}` is `[a, b]` and `[a, c]`.
fn use_tree(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    tree(&mut text.chars().peekable(), &mut Vec::new(), &mut out);
    out
}

/// Reads one use-tree from `chars` below `prefix` into `out`.
fn tree(
    chars: &mut std::iter::Peekable<std::str::Chars>,
    prefix: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) {
    skip_space(chars);
    if chars.peek() == Some(&'{') {
        chars.next();
        loop {
            let depth = prefix.len();
            tree(chars, prefix, out);
            prefix.truncate(depth);
            // Past `as name` to the item's end.
            let mut end = None;
            for c in chars.by_ref() {
                if c == ',' || c == '}' {
                    end = Some(c);
                    break;
                }
            }
            if end != Some(',') {
                return;
            }
        }
    }
    let mut name = String::new();
    while let Some(&c) = chars.peek() {
        if c.is_alphanumeric() || c == '_' {
            name.push(c);
            chars.next();
        } else {
            break;
        }
    }
    if name.is_empty() && chars.peek() == Some(&'*') {
        chars.next();
        prefix.push("*".to_string());
        out.push(prefix.clone());
        return;
    }
    if name == "self" {
        if !prefix.is_empty() {
            out.push(prefix.clone());
        }
        return;
    }
    if name.is_empty() {
        return;
    }
    prefix.push(name);
    let mut ahead = chars.clone();
    if ahead.next() == Some(':') && ahead.next() == Some(':') {
        chars.next();
        chars.next();
        tree(chars, prefix, out);
    } else {
        out.push(prefix.clone());
    }
}

fn skip_space(chars: &mut std::iter::Peekable<std::str::Chars>) {
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
}

fn top_name(name: &str) -> String {
    if name.starts_with("log_") {
        "log".to_string()
    } else {
        name.to_string()
    }
}

/// The rule violations of one file of module `module`.
fn violations(module: &str, text: &str) -> Result<Vec<String>, String> {
    let allowed = RULES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, a)| *a)
        .ok_or_else(|| {
            format!("module `{module}` has no rule: add it to RULES and to docs/DESIGN.md")
        })?;
    Ok(imports(text)
        .into_iter()
        .filter(|to| {
            to != module
                && !allowed.contains(&to.as_str())
                && !EXCEPTIONS.contains(&(module, to.as_str()))
        })
        .collect())
}

/// The paths by which a file of module `module` passes a seam of
/// [`SEAMS`]: `cluster::fsm` where only `cluster::api` is offered, or
/// `cluster` named whole.
fn seam_violations(module: &str, text: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (from, to, offered) in SEAMS {
        if *from != module {
            continue;
        }
        for path in paths(text, "crate") {
            if path[0] != *to {
                continue;
            }
            match path.get(1) {
                Some(sub) if offered.contains(&sub.as_str()) => {}
                Some(sub) => {
                    out.insert(format!("{to}::{sub}"));
                }
                None => {
                    out.insert(to.to_string());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The import graph among the broker's files, given as (path under
/// `src/broker/`, text) pairs. Each file is a node, named by its module
/// path (`cluster/turn` for `cluster/turn.rs`, `tests` for `tests/mod.rs`):
/// a part's state in `cluster.rs` sits below the `Broker` that holds it,
/// and the `impl Broker` blocks in `cluster/*.rs` above it. A file's edges
/// go to the files it names: `crate::broker::a::b`, `super::x` and
/// `super::super::x` (to the file `x` if there is one, else to the module
/// the item is in; `super::*` is the parent), `self::x` and a child's own
/// name (`kv::` in `streams.rs`). A name `mod.rs` re-exports counts as the
/// file that defines it (`Broker` is `dispatch`). Declaring a child
/// (`mod turn;`) is not an edge.
fn broker_graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let module_path = |rel: &str| -> Vec<String> {
        let mut parts: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_string)
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        parts
    };
    let nodes: BTreeSet<Vec<String>> = files
        .iter()
        .map(|(rel, _)| module_path(rel))
        .filter(|p| !p.is_empty())
        .collect();
    // The longest file path `base` + a prefix of `rest` names, else the
    // module `base` itself.
    let file_of = |base: &[String], rest: &[String]| -> Option<Vec<String>> {
        (1..=rest.len())
            .rev()
            .map(|i| [base, &rest[..i]].concat())
            .find(|c| nodes.contains(c))
            .or_else(|| (!base.is_empty()).then(|| base.to_vec()))
    };
    let mut reexports = BTreeMap::new();
    for (rel, text) in files {
        if !module_path(rel).is_empty() {
            continue;
        }
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("pub use ") {
                for p in use_tree(rest) {
                    if let Some(owner) = file_of(&[], &p[..p.len() - 1]) {
                        reexports.insert(p[p.len() - 1].clone(), owner);
                    }
                }
            }
        }
    }
    let resolve = |base: &[String], rest: &[String]| -> Option<Vec<String>> {
        file_of(base, rest).or_else(|| rest.first().and_then(|n| reexports.get(n)).cloned())
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = nodes
        .iter()
        .map(|n| (n.join("/"), BTreeSet::new()))
        .collect();
    for (rel, text) in files {
        let here = module_path(rel);
        if here.is_empty() {
            continue;
        }
        let mut named = Vec::new();
        for p in paths(text, "crate") {
            if p[0] == "broker" {
                named.extend(resolve(&[], &p[1..]));
            }
        }
        for p in paths(text, "super") {
            let ups = 1 + p.iter().take_while(|s| *s == "super").count();
            if ups <= here.len() {
                named.extend(resolve(&here[..here.len() - ups], &p[ups - 1..]));
            }
        }
        for p in paths(text, "self") {
            named.extend(resolve(&here, &p));
        }
        for child in nodes
            .iter()
            .filter(|n| n.len() == here.len() + 1 && n.starts_with(&here))
        {
            if !paths(text, child.last().unwrap()).is_empty() {
                named.push(child.clone());
            }
        }
        let edges = graph.get_mut(&here.join("/")).unwrap();
        for to in named {
            if to != here {
                edges.insert(to.join("/"));
            }
        }
    }
    graph
}

/// The import cycles of `graph`: one line per set of modules that reach
/// each other, naming the shortest cycle through its first module and
/// every edge among them.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reach = |from: &str| -> BTreeMap<String, String> {
        // Each reached module and the one it was reached from.
        let mut seen = BTreeMap::new();
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(at) = queue.pop_front() {
            for to in &graph[&at] {
                if !seen.contains_key(to) {
                    seen.insert(to.clone(), at.clone());
                    queue.push_back(to.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeMap<String, String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in graph.keys() {
        if done.contains(m) || !reached[m].contains_key(m) {
            continue;
        }
        let set: BTreeSet<&String> = graph
            .keys()
            .filter(|o| reached[m].contains_key(*o) && reached[*o].contains_key(m))
            .collect();
        done.extend(set.iter().map(|s| s.to_string()));
        let mut cycle = vec![m.clone()];
        let mut at = reached[m][m].clone();
        while at != *m {
            cycle.push(at.clone());
            at = reached[m][&at].clone();
        }
        cycle.push(m.clone());
        cycle.reverse();
        let edges: Vec<String> = set
            .iter()
            .flat_map(|from| {
                graph[*from]
                    .iter()
                    .filter(|to| set.contains(to))
                    .map(move |to| format!("{from}->{to}"))
            })
            .collect();
        out.push(format!(
            "{} (all of {{{}}} reach each other: {})",
            cycle.join(" -> "),
            set.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            edges.join(" ")
        ));
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_imports_only_what_its_rule_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut broken = Vec::new();
    let mut checked = 0;
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs");
        // The crate root and the binaries sit above every module.
        if module == "lib" || module == "bin" {
            continue;
        }
        let text = fs::read_to_string(path).unwrap();
        match violations(module, &text) {
            Ok(bad) => {
                for to in bad {
                    broken.push(format!("{}: `{module}` imports `{to}`", rel.display()));
                }
            }
            Err(e) => broken.push(format!("{}: {e}", rel.display())),
        }
        for past in seam_violations(module, &text) {
            broken.push(format!(
                "{}: `{module}` imports `{past}` past the seam of SEAMS",
                rel.display()
            ));
        }
        checked += 1;
    }
    assert!(
        checked > 50,
        "only {checked} files found under {}",
        src.display()
    );
    assert!(
        broken.is_empty(),
        "imports across the rules:\n{}",
        broken.join("\n")
    );
}

/// Every known exception is still needed; one that no longer is should be
/// deleted so that the rule holds again.
#[test]
fn every_exception_is_still_in_use() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (from, to) in EXCEPTIONS {
        let mut files = Vec::new();
        rust_files(&src.join(from), &mut files);
        let used = files
            .iter()
            .any(|p| imports(&fs::read_to_string(p).unwrap()).contains(*to));
        assert!(
            used,
            "`{from}` no longer imports `{to}`: drop the exception"
        );
    }
}

#[test]
fn the_checker_sees_paths_groups_and_macros() {
    let text = "use crate::protocol::subject;\n\
                use crate::{rand, storage::record};\n\
                // crate::broker in a comment is not an import\n\
                fn f() { crate::log_warn!(\"x\"); let _ = crate::net::ConnId(1); }\n";
    let got: Vec<_> = imports(text).into_iter().collect();
    assert_eq!(got, ["log", "net", "protocol", "rand", "storage"]);
}

#[test]
fn a_crossing_is_reported() {
    assert_eq!(
        violations("client", "use crate::broker::subs::SubTable;").unwrap(),
        ["broker"]
    );
    assert_eq!(
        violations("protocol", "use crate::stream::stream::Stream;").unwrap(),
        ["stream"]
    );
    assert_eq!(
        violations("storage", "use crate::{cluster::raft_msg, stream::store};").unwrap(),
        ["cluster", "stream"]
    );
    assert_eq!(
        violations("net", "use crate::broker::Broker;").unwrap(),
        ["broker"]
    );
    assert_eq!(
        violations("broker", "use crate::net::Io;").unwrap(),
        ["net"]
    );
    assert_eq!(
        violations("cluster", "use crate::broker::Broker;").unwrap(),
        ["broker"]
    );
    assert!(violations("cluster", "use crate::routing::subs::SubTable;")
        .unwrap()
        .is_empty());
    assert!(violations("broker", "use crate::port::{Handler, Sink};")
        .unwrap()
        .is_empty());
    assert_eq!(violations("port", "use crate::net::Io;").unwrap(), ["net"]);
    assert!(violations("newcomer", "").is_err());
}

#[test]
fn a_path_past_a_seam_is_reported() {
    let text = "use crate::cluster::api::{Cmd, Fsm};\n\
                use crate::cluster::{api::Role, fsm::Change};\n\
                use crate::{\n    cluster::{\n        node::ToRaft,\n        api::placement,\n    },\n    rand,\n};\n\
                fn f(v: &crate::cluster::raft_msg::Membership) {}\n\
                // crate::cluster::raft in a comment is not an import\n";
    assert_eq!(
        seam_violations("broker", text),
        ["cluster::fsm", "cluster::node", "cluster::raft_msg"]
    );
    assert_eq!(
        seam_violations("broker", "use crate::cluster::*;"),
        ["cluster::*"]
    );
    assert_eq!(
        seam_violations("broker", "use crate::cluster::{self as c};"),
        ["cluster"]
    );
    assert!(seam_violations(
        "broker",
        "use crate::cluster::api::{forward::{self, PeerMessage}, Role as R,};"
    )
    .is_empty());
    // Only the broker is held to the seam.
    assert!(seam_violations("cluster", "use crate::cluster::fsm::Cmd;").is_empty());
}

#[test]
fn paths_spread_groups_out() {
    let got = paths(
        "use crate::{a::{b, c::{d as e, self}}, f};\nuse my_crate::x;",
        "crate",
    );
    let want: Vec<Vec<&str>> = vec![
        vec!["a", "b"],
        vec!["a", "c", "d"],
        vec!["a", "c"],
        vec!["f"],
    ];
    assert_eq!(got, want);
}

/// The broker's files, each under `src/broker/` with its text.
fn broker_files() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/broker");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    files
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&dir).unwrap().to_str().unwrap().to_string();
            (rel, fs::read_to_string(p).unwrap())
        })
        .collect()
}

/// A part's state sits in a file below the `Broker` that holds it, and
/// the `impl Broker` blocks that need both in files above it (see
/// docs/DESIGN.md, "Dependency rules").
#[test]
fn no_import_cycle_among_the_broker_files() {
    let graph = broker_graph(&broker_files());
    assert!(
        graph.len() > 20,
        "only {} broker modules found",
        graph.len()
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles among the broker's files:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_cycle_among_broker_files_is_named() {
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = [
        file("mod.rs", "pub mod a;\npub use a::{Core, Settings};\n"),
        file("a.rs", "use super::b::Part;\npub struct Core;"),
        file(
            "b.rs",
            "use super::{c, d::Leaf};\nmod inner;\npub struct Part;",
        ),
        file("b/inner.rs", "use super::*;\nuse super::super::e::X;"),
        file("c.rs", "impl crate::broker::Core {}\n"),
        file("d.rs", "pub struct Leaf;"),
        file("e.rs", "use super::d::Leaf;\nuse crate::cluster::api::Cmd;"),
    ];
    let graph = broker_graph(&files);
    let edges: Vec<String> = graph
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| format!("{f}->{t}")))
        .collect();
    assert_eq!(
        edges,
        [
            "a->b",
            "b->c",
            "b->d",
            "b/inner->b",
            "b/inner->e",
            "c->a",
            "e->d"
        ]
    );
    assert_eq!(
        cycles(&graph),
        ["a -> b -> c -> a (all of {a, b, c} reach each other: a->b b->c c->a)"]
    );
    // A parent naming its child, which names the parent back.
    let files = [
        file("mod.rs", ""),
        file("s.rs", "mod kv;\npub use kv::Watch;"),
        file("s/kv.rs", "use super::*;\npub struct Watch;"),
        file("t.rs", "fn f() { self::g(); super::s::Watch; }"),
    ];
    assert_eq!(
        cycles(&broker_graph(&files)),
        ["s -> s/kv -> s (all of {s, s/kv} reach each other: s->s/kv s/kv->s)"]
    );
    let files = [
        file("mod.rs", ""),
        file("a.rs", "use super::b::Part;"),
        file("b.rs", "pub struct Part;"),
    ];
    assert!(cycles(&broker_graph(&files)).is_empty());
}

/// The handles through which the broker acts on its cluster node (the
/// Raft thread's and the peer links') and the only broker files that may
/// name each: the executor, `cluster/actions.rs`; `cluster/turn.rs`, which
/// reads what they report; `cluster.rs` and `dispatch.rs`, which hand the
/// started handles to the executor; and the in-process tests, which play
/// their far ends.
const HANDLES: &[(&str, &[&str])] = &[
    ("RaftNode", HOLDERS),
    ("Links", HOLDERS),
    ("RaftSender", &["cluster/actions.rs"]),
];

const HOLDERS: &[&str] = &[
    "cluster/actions.rs",
    "cluster/turn.rs",
    "cluster.rs",
    "dispatch.rs",
    "tests/cluster.rs",
];

/// The handles' methods that act (a Raft command, a peer call, a forward
/// batch): called by no broker file but the executor and the tests.
const SENDS: &[&str] = &[".send(", ".call(", ".forward("];

/// Where a broker file names a handle of [`HANDLES`] that it may not, or
/// calls a method of [`SENDS`] outside the executor and the tests: "file:
/// name" for each, whole-line comments left out.
fn handle_violations(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, text) in files {
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        let words: BTreeSet<&str> = code
            .iter()
            .flat_map(|l| l.split(|c: char| !(c.is_alphanumeric() || c == '_')))
            .collect();
        for (name, allowed) in HANDLES {
            if words.contains(name) && !allowed.contains(&rel.as_str()) {
                out.push(format!("{rel}: {name}"));
            }
        }
        if rel == "cluster/actions.rs" || rel.starts_with("tests/") {
            continue;
        }
        for call in SENDS {
            // A call may be split over lines by rustfmt: `x\n    .send(`.
            if code.iter().any(|l| l.contains(call)) {
                out.push(format!("{rel}: {call}"));
            }
        }
    }
    out
}

#[test]
fn only_the_executor_acts_on_the_cluster_handles() {
    let files = broker_files();
    assert!(files.iter().any(|(rel, _)| rel == "cluster/actions.rs"));
    let found = handle_violations(&files);
    assert!(
        found.is_empty(),
        "broker files that name the Raft handle or the links, or send on \
         them, outside cluster/actions.rs (make it an `Action`):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_handle_named_or_sent_on_outside_the_executor_is_reported() {
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = [
        file(
            "stream_groups.rs",
            "use crate::cluster::api::{GroupId, RaftSender};\nfn f(r: &RaftNode) {}",
        ),
        file(
            "cluster/turn.rs",
            "// a RaftNode in a comment\nfn g(r: &RaftNode) {}",
        ),
        file(
            "cluster/proposals.rs",
            "fn p(c: &Cluster) {\n    c.raft\n        .send(x);\n    // c.call(y) in a comment\n}",
        ),
        file(
            "cluster/actions.rs",
            "fn act(&self) { self.raft.send(m); self.l.call(1, o); }",
        ),
        file(
            "dispatch.rs",
            "fn run(l: Links, r: RaftNode, s: RaftSender) {}",
        ),
        file("tests/cluster.rs", "fn t(l: &Links) { l.forward(0, b); }"),
    ];
    assert_eq!(
        handle_violations(&files),
        [
            "stream_groups.rs: RaftNode",
            "stream_groups.rs: RaftSender",
            "cluster/proposals.rs: .send(",
            "dispatch.rs: RaftSender"
        ]
    );
}
