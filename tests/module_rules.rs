//! The dependency rules between the crate's top-level modules (the table in
//! docs/DESIGN.md, "Dependency rules"): reads every file under `src/` and
//! fails on a `crate::X` path that a module may not use.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it may import. Lower
/// layers come first; a module never imports one listed after it, except
/// through [`EXCEPTIONS`].
const RULES: &[(&str, &[&str])] = &[
    ("rand", &[]),
    ("storage", &[]),
    ("crypto", &[]),
    ("port", &[]),
    ("protocol", &["rand"]),
    ("auth", &["rand", "crypto", "protocol"]),
    ("config", &["storage"]),
    ("log", &["config"]),
    ("routing", &["rand", "port", "protocol", "log"]),
    ("stream", &["rand", "storage", "protocol", "config", "log"]),
    ("net", &["rand", "port", "protocol", "config", "log"]),
    ("client", &["rand", "protocol"]),
    ("cli", &["rand", "protocol", "config", "log", "client"]),
    (
        "cluster",
        &[
            "rand", "storage", "crypto", "protocol", "config", "log", "routing", "client",
        ],
    ),
    (
        "broker",
        &[
            "rand", "storage", "crypto", "port", "protocol", "auth", "config", "log", "routing",
            "stream", "cluster",
        ],
    ),
];

/// Imports that break the rules and are known, as whole module pairs (a
/// new pair still fails). None today; the mechanism stays for a crossing
/// that must land before its fix.
const EXCEPTIONS: &[(&str, &str)] = &[];

/// The top-level modules named by `crate::` paths in `text`, comments left
/// out. `crate::log_warn!` and friends are `log`'s macros.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::b, c}`: the first name of each item at depth 0.
                let mut depth = 0;
                let mut items = vec![String::new()];
                for c in group.chars() {
                    match c {
                        '}' if depth == 0 => break,
                        ',' if depth == 0 => items.push(String::new()),
                        _ => {
                            depth += usize::from(c == '{');
                            depth -= usize::from(c == '}');
                            items.last_mut().unwrap().push(c);
                        }
                    }
                }
                for item in items {
                    let name = leading_name(item.trim_start());
                    if !name.is_empty() {
                        out.insert(top_name(&name));
                    }
                }
                continue;
            }
            let name = leading_name(rest);
            if !name.is_empty() {
                out.insert(top_name(&name));
            }
        }
    }
    out
}

fn leading_name(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
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
