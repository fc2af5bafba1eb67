//! The soak's resource samples (RSS, open descriptors, data directory
//! size per node), their bounds, and the one-page report: report.md and a
//! hand-written SVG plot of each node's memory over time.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cluster_support::IDS;
use crate::faults::Kind;

/// Resident memory each node stays under.
pub const RSS_MAX_KB: u64 = 256 * 1024;
/// Open descriptors each node stays under.
pub const FDS_MAX: u64 = 1024;
/// Bytes each node's data directory stays under.
pub const DATA_MAX: u64 = 512 * 1024 * 1024;

/// One node's figures at one moment; `None` while it is down or frozen.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    pub rss_kb: u64,
    pub fds: u64,
    pub data_bytes: u64,
}

pub struct Sample {
    pub at: Duration,
    pub nodes: [Option<Usage>; 3],
}

/// A node's usage, read from /proc and its data directory.
pub fn usage(pid: u32, data: &Path) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Usage {
        rss_kb,
        fds,
        data_bytes: dir_size(data),
    })
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// What went over a bound in `u`, if anything.
pub fn over_bounds(u: &Usage) -> Vec<String> {
    let mut over = Vec::new();
    if u.rss_kb >= RSS_MAX_KB {
        over.push(format!("RSS {} KiB >= {RSS_MAX_KB} KiB", u.rss_kb));
    }
    if u.fds >= FDS_MAX {
        over.push(format!("{} open descriptors >= {FDS_MAX}", u.fds));
    }
    if u.data_bytes >= DATA_MAX {
        over.push(format!("data directory {} B >= {DATA_MAX} B", u.data_bytes));
    }
    over
}

/// One injected fault.
pub struct FaultRecord {
    pub at: Duration,
    pub node: usize,
    pub kind: Kind,
    /// How long the node was down or frozen.
    pub out_for: Duration,
    /// From the node's restart (or SIGCONT) until every node answered
    /// `/healthz` 200 with the same leader; `None` if that never came.
    pub recovery: Option<Duration>,
}

/// Everything the report shows.
pub struct Report<'a> {
    pub seed: u64,
    pub planned: Duration,
    pub ran: Duration,
    pub recovery_max: Duration,
    pub faults: &'a [FaultRecord],
    pub counters: &'a [(&'static str, u64)],
    pub samples: &'a [Sample],
    pub violations: &'a [String],
    pub violation_count: u64,
    pub replay: &'a str,
}

const COLOURS: [&str; 3] = ["#1f77b4", "#d62728", "#2ca02c"];

/// RSS of each node over time as an SVG line plot (a gap where a node was
/// down or frozen).
pub fn memory_svg(samples: &[Sample], span: Duration) -> String {
    let (w, h, left, bottom, top, right) = (760.0, 320.0, 60.0, 40.0, 30.0, 20.0);
    let max_kb = samples
        .iter()
        .flat_map(|s| s.nodes.iter().flatten().map(|u| u.rss_kb))
        .max()
        .unwrap_or(1024)
        .max(1024);
    // A multiple of 4, so the four grid steps are whole MiB.
    let top_mib = ((max_kb as f64 / 1024.0 * 1.1) / 4.0).ceil().max(1.0) * 4.0;
    let secs = span.as_secs_f64().max(1.0);
    let x = |t: Duration| left + t.as_secs_f64() / secs * (w - left - right);
    let y = |kb: u64| h - bottom - (kb as f64 / 1024.0) / top_mib * (h - bottom - top);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="18">RSS per node (MiB) over time (s)</text>"#
    );
    let (x0, y0, x1, y1) = (left, h - bottom, w - right, top);
    let _ = writeln!(
        svg,
        r#"<path d="M{x0},{y1} L{x0},{y0} L{x1},{y0}" stroke="black" fill="none"/>"#
    );
    for k in 0..=4 {
        let mib = top_mib * k as f64 / 4.0;
        let yy = y((mib * 1024.0) as u64);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{mib:.0}</text><line x1="{x0}" y1="{yy}" x2="{x1}" y2="{yy}" stroke="lightgrey"/>"#,
            left - 6.0,
            yy + 4.0
        );
        let t = Duration::from_secs_f64(secs * k as f64 / 4.0);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0}</text>"#,
            x(t),
            h - bottom + 16.0,
            t.as_secs_f64()
        );
    }
    for (i, colour) in COLOURS.iter().enumerate() {
        let mut runs: Vec<Vec<String>> = vec![Vec::new()];
        for s in samples {
            match s.nodes[i] {
                Some(u) => runs.last_mut().expect("one run at least").push(format!(
                    "{:.1},{:.1}",
                    x(s.at),
                    y(u.rss_kb)
                )),
                None => runs.push(Vec::new()),
            }
        }
        for run in runs.iter().filter(|r| !r.is_empty()) {
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" stroke="{colour}" stroke-width="1.5" fill="none"/>"#,
                run.join(" ")
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="18" fill="{colour}">{}</text>"#,
            w - right - 150.0 + 50.0 * i as f64,
            IDS[i]
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The worst figure of each node over the run.
fn peaks(samples: &[Sample]) -> [Usage; 3] {
    let mut peak = [Usage::default(); 3];
    for s in samples {
        for (p, u) in peak.iter_mut().zip(s.nodes.iter()) {
            if let Some(u) = u {
                p.rss_kb = p.rss_kb.max(u.rss_kb);
                p.fds = p.fds.max(u.fds);
                p.data_bytes = p.data_bytes.max(u.data_bytes);
            }
        }
    }
    peak
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The worst recovery time, if any fault recovered.
pub fn worst_recovery(faults: &[FaultRecord]) -> Option<Duration> {
    faults.iter().filter_map(|f| f.recovery).max()
}

/// report.md's text.
pub fn markdown(r: &Report) -> String {
    let mut md = String::new();
    let verdict = if r.violation_count == 0 {
        "PASS".to_string()
    } else {
        format!("FAIL ({} violations)", r.violation_count)
    };
    let _ = writeln!(md, "# gombus chaos soak: {verdict}\n");
    let _ = writeln!(
        md,
        "Seed {}, planned {}, ran {} (load, then a drain). Replay: `{}`\n",
        r.seed,
        secs(r.planned),
        secs(r.ran),
        r.replay
    );
    let worst = worst_recovery(r.faults)
        .map(secs)
        .unwrap_or_else(|| "-".into());
    let _ = writeln!(
        md,
        "## Faults: {} injected, worst recovery {worst} (bound {})\n",
        r.faults.len(),
        secs(r.recovery_max)
    );
    let _ = writeln!(md, "| at | node | fault | out for | back to healthy in |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for f in r.faults {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            secs(f.at),
            IDS[f.node],
            f.kind.name(),
            secs(f.out_for),
            f.recovery.map(secs).unwrap_or_else(|| "never".into())
        );
    }
    let _ = writeln!(md, "\n## Messages and events\n");
    let _ = writeln!(md, "| what | count |");
    let _ = writeln!(md, "|---|---|");
    for (k, v) in r.counters {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let peak = peaks(r.samples);
    let _ = writeln!(
        md,
        "\n## Resources: peak per node ({} samples)\n",
        r.samples.len()
    );
    let _ = writeln!(
        md,
        "| node | RSS (bound {} MiB) | open fds (bound {FDS_MAX}) | data dir (bound {} MiB) |",
        RSS_MAX_KB / 1024,
        DATA_MAX >> 20
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for (i, p) in peak.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {:.1} MiB | {} | {:.1} MiB |",
            IDS[i],
            p.rss_kb as f64 / 1024.0,
            p.fds,
            p.data_bytes as f64 / (1024.0 * 1024.0)
        );
    }
    let _ = writeln!(md, "\n![RSS per node over time](memory.svg)\n");
    if !r.violations.is_empty() {
        let _ = writeln!(md, "## Violations (first {})\n", r.violations.len());
        for v in r.violations {
            let _ = writeln!(md, "- {v}");
        }
    }
    md
}

/// `YYYYMMDDTHHMMSSZ` for now, in UTC.
pub fn stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
