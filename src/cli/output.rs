//! How the CLI prints: JSON (one document, or one line per message for
//! streams of messages) or text (aligned `key: value` lines and tables),
//! and the error type every command returns.

use std::fmt;

use serde_json::Value;

use crate::client::Error as ClientError;

/// A command failure; printed as `gombus: …` with exit status 1.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Failure {
    /// A failed call, with a hint for the errors people hit most.
    pub fn call(what: &str, e: &ClientError) -> Failure {
        let hint = match e.code() {
            Some("unauthorized") => " (check --token / --control-token)",
            Some("forbidden") => " (the user of --token does not have this right)",
            Some("bad_request") if e.to_string().contains("unknown event") => {
                " (this server does not serve that feature)"
            }
            _ => "",
        };
        let hint = match e {
            ClientError::ConnectRefused(m) if m == "unauthorized" => {
                " (check --token / --control-token)"
            }
            _ => hint,
        };
        Failure(format!("{what}: {e}{hint}"))
    }
}

/// Prints a JSON value on one line.
pub fn json_line(v: &Value) {
    println!("{v}");
}

/// Prints a JSON value indented.
pub fn json_pretty(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// A JSON value as text: strings bare, everything else as JSON.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// Prints an object's fields as `key: value` lines, nested objects
/// indented under their key.
pub fn fields(v: &Value) {
    let mut out = String::new();
    write_fields(&mut out, v, 0);
    print!("{out}");
}

fn write_fields(out: &mut String, v: &Value, depth: usize) {
    let Value::Object(map) = v else {
        out.push_str(&format!("{}{}\n", "  ".repeat(depth), plain(v)));
        return;
    };
    let width = map.keys().map(String::len).max().unwrap_or(0);
    for (k, v) in map {
        if k == "ok" {
            continue;
        }
        let pad = "  ".repeat(depth);
        match v {
            Value::Object(_) => {
                out.push_str(&format!("{pad}{k}:\n"));
                write_fields(out, v, depth + 1);
            }
            _ => out.push_str(&format!(
                "{pad}{:<w$}  {}\n",
                format!("{k}:"),
                plain(v),
                w = width + 1
            )),
        }
    }
}

/// Prints rows under a header, columns aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(header, rows));
}

pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.len());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(&format!(
                "{:<w$}",
                c,
                w = widths.get(i).copied().unwrap_or(0)
            ));
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align() {
        let t = render_table(&["name", "n"], &[vec!["orders".into(), "12".into()]]);
        assert_eq!(t, "name    n\norders  12\n");
    }

    #[test]
    fn fields_nest() {
        let mut out = String::new();
        write_fields(&mut out, &json!({"ok": true, "a": 1, "bb": {"c": "x"}}), 0);
        assert_eq!(out, "a:   1\nbb:\n  c:  x\n");
    }
}
