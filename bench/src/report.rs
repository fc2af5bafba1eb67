//! Medians over runs as a Markdown table, plus the gombus ÷ nats ratio of
//! every metric. Input: the JSON rows the workloads produced, each with
//! `peer` and `workload` added.

use serde_json::Value;

/// The rate a workload is judged by, and how the table names it.
pub fn rate_of(workload: &str) -> (&'static str, &'static str) {
    match workload {
        "fanout" | "fanout3" => ("deliveries_per_s", "deliveries/s"),
        "queue" => ("msgs_per_s", "msgs/s"),
        "reqrep" => ("msgs_per_s", "requests/s"),
        "stream" | "stream3" | "stream3-follower" | "stream3-leader" => ("acked_per_s", "acked/s"),
        "kv-put" => ("acked_per_s", "puts/s"),
        "kv-get" => ("acked_per_s", "gets/s"),
        "kv-watch" => ("watched_per_s", "watched/s"),
        "conns" => ("conns_per_s", "conns/s"),
        _ => ("msgs_per_s", "msgs/s"),
    }
}

/// The median of some numbers (the mean of the middle two for an even count).
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let m = xs.len() / 2;
    Some(if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    })
}

/// The columns of the table after workload, peer and runs: (heading, field).
const COLUMNS: &[(&str, &str)] = &[
    ("rate", ""),
    ("server CPU µs/msg", "server_cpu_us_per_msg"),
    ("server CPU %", "server_cpu_pct"),
    ("loadgen CPU %", "loadgen_cpu_pct"),
    ("other CPU %", "other_cpu_pct"),
    ("p50 µs", "p50_us"),
    ("p99 µs", "p99_us"),
    ("bytes/conn", "bytes_per_conn"),
    ("disk B per B per replica", "write_per_byte"),
];

/// Metrics compared between gombus and nats: (heading, field; "" = the rate).
const RATIOS: &[(&str, &str)] = &[
    ("rate", ""),
    ("server CPU/msg", "server_cpu_us_per_msg"),
    ("p50", "p50_us"),
    ("p99", "p99_us"),
    ("bytes/conn", "bytes_per_conn"),
    ("disk B/B", "write_per_byte"),
];

fn field<'a>(workload: &str, f: &'a str) -> &'a str {
    if f.is_empty() {
        rate_of(workload).0
    } else {
        f
    }
}

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// The median of `f` over the rows of one workload and peer.
fn med(rows: &[&Value], f: &str) -> Option<f64> {
    median(
        rows.iter()
            .filter_map(|r| r.get(f).and_then(Value::as_f64))
            .collect(),
    )
}

pub fn fmt_num(x: Option<f64>) -> String {
    match x {
        None => "–".into(),
        Some(x) if x.abs() >= 1000.0 => {
            let digits = format!("{:.0}", x.abs());
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    out.push(' ');
                }
                out.push(c);
            }
            if x < 0.0 {
                format!("-{out}")
            } else {
                out
            }
        }
        Some(x) if x.abs() >= 10.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 1.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.3}"),
    }
}

/// (workload, peer) pairs in first-seen order.
fn groups(rows: &[Value]) -> Vec<(String, String)> {
    let mut g: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (s(r, "workload"), s(r, "peer"));
        if !g.contains(&k) {
            g.push(k);
        }
    }
    g
}

fn select<'a>(rows: &'a [Value], w: &str, p: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| s(r, "workload") == w && s(r, "peer") == p)
        .collect()
}

/// The Markdown table of medians and the ratio table.
pub fn table(rows: &[Value]) -> String {
    let mut out = String::from("| workload | peer | runs | rate | ");
    out.push_str(
        &COLUMNS[1..]
            .iter()
            .map(|c| c.0)
            .collect::<Vec<_>>()
            .join(" | "),
    );
    out.push_str(" | lost |\n|---|---|---|");
    out.push_str(&"---:|".repeat(COLUMNS.len() + 1));
    out.push('\n');
    let mut errors: Vec<String> = Vec::new();
    for (w, p) in groups(rows) {
        let sel = select(rows, &w, &p);
        let failed = sel
            .iter()
            .filter(|r| r.get("ok") != Some(&Value::Bool(true)))
            .count();
        for r in &sel {
            if let Some(e) = r.get("error").and_then(Value::as_str) {
                let line = format!("{w} / {p}: {e}");
                if !errors.contains(&line) {
                    errors.push(line);
                }
            }
        }
        let runs = if failed > 0 {
            format!("{} ({failed} FAILED)", sel.len())
        } else {
            sel.len().to_string()
        };
        let label = match (
            w.as_str(),
            sel.first()
                .and_then(|r| r.get("pin"))
                .and_then(Value::as_str),
        ) {
            (_, Some(pin)) if pin != "none" => format!("{w} (pin {pin})"),
            _ => w.clone(),
        };
        let mut cells = vec![label, p.clone(), runs];
        for (i, (_, f)) in COLUMNS.iter().enumerate() {
            let v = fmt_num(med(&sel, field(&w, f)));
            cells.push(if i == 0 {
                format!("{v} {}", rate_of(&w).1)
            } else {
                v
            });
        }
        let lost: u64 = sel
            .iter()
            .filter_map(|r| r.get("lost").and_then(Value::as_u64))
            .sum();
        cells.push(lost.to_string());
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    let ratio_rows: Vec<String> = groups(rows)
        .into_iter()
        .filter(|(_, p)| p == "gombus")
        .filter_map(|(w, _)| {
            let g = select(rows, &w, "gombus");
            let n = select(rows, &w, "nats");
            if n.is_empty() {
                return None;
            }
            let cells: Vec<String> = RATIOS
                .iter()
                .map(
                    |(_, f)| match (med(&g, field(&w, f)), med(&n, field(&w, f))) {
                        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}", a / b),
                        _ => "–".into(),
                    },
                )
                .collect();
            Some(format!("| {w} | {} |\n", cells.join(" | ")))
        })
        .collect();
    if !ratio_rows.is_empty() {
        out.push_str("\ngombus ÷ nats (medians; rate above 1: gombus faster; CPU, latency and memory above 1: gombus costlier)\n\n| workload | ");
        out.push_str(&RATIOS.iter().map(|r| r.0).collect::<Vec<_>>().join(" | "));
        out.push_str(" |\n|---|");
        out.push_str(&"---:|".repeat(RATIOS.len()));
        out.push('\n');
        for r in ratio_rows {
            out.push_str(&r);
        }
    }
    if !errors.is_empty() {
        out.push_str("\nErrors:\n\n");
        for e in errors {
            out.push_str(&format!("- {e}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(fmt_num(Some(1234567.4)), "1 234 567");
        assert_eq!(fmt_num(Some(1000.0)), "1 000");
        assert_eq!(fmt_num(Some(42.4)), "42");
        assert_eq!(fmt_num(Some(1.234)), "1.23");
        assert_eq!(fmt_num(Some(0.1234)), "0.123");
        assert_eq!(fmt_num(None), "–");
    }

    #[test]
    fn table_has_medians_ratios_and_failures() {
        let row = |peer: &str, rate: f64, cpu: f64, ok: bool| {
            json!({"peer": peer, "workload": "fanout", "deliveries_per_s": rate,
                   "server_cpu_us_per_msg": cpu, "lost": if ok { 0 } else { 5 }, "ok": ok,
                   "error": if ok { Value::Null } else { json!("no delivery for 10 s") }})
        };
        let rows = vec![
            row("gombus", 100.0, 2.0, true),
            row("nats", 400.0, 1.0, true),
            row("gombus", 300.0, 4.0, true),
            row("nats", 200.0, 1.0, true),
            row("gombus", 200.0, 3.0, false),
            row("nats", 300.0, 1.0, true),
        ];
        let t = table(&rows);
        assert!(
            t.contains("| fanout | gombus | 3 (1 FAILED) | 200 deliveries/s | 3.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| fanout | nats | 3 | 300 deliveries/s | 1.00 |"),
            "{t}"
        );
        // rate 200/300, CPU 3/1.
        assert!(t.contains("| fanout | 0.67 | 3.00 | – | – | – |"), "{t}");
        assert!(t.contains("- fanout / gombus: no delivery for 10 s"), "{t}");
        assert!(t.contains("| 5 |"), "{t}");
    }
}
