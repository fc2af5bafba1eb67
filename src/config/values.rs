//! The value syntaxes of the broker's flags: byte sizes, durations,
//! addresses, node ids, comma lists, peer lists and booleans. The rest of
//! the crate reads them here too (the CLI its sizes and durations,
//! `cluster.add` its node ids). Each parser's message leaves the flag out;
//! the flag table puts `-name: ` in front.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use super::{Peer, MAX_NODE_ID_LEN};

pub(super) const KIB: u64 = 1024;
pub(super) const MIB: u64 = 1024 * KIB;
pub(super) const GIB: u64 = 1024 * MIB;

/// The value of a boolean flag written with one: `true`, `t`, `1`, `yes`
/// or `false`, `f`, `0`, `no` (case ignored).
pub(super) fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" => Ok(true),
        "false" | "f" | "0" | "no" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean (use true or false)")),
    }
}

/// The value of a flag where empty means unset.
pub(super) fn unless_empty(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_string())
}

/// Checks that `id` is 1..=64 characters of `[A-Za-z0-9._-]`.
pub fn validate_node_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".into());
    }
    if id.len() > MAX_NODE_ID_LEN {
        return Err(format!(
            "{id:?} is longer than {MAX_NODE_ID_LEN} characters"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{id:?} contains {c:?} (use only A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}

/// Parses `host:port`, `:port` (all interfaces), `localhost:port`
/// (127.0.0.1) or `[v6]:port`. The host must be an IP literal or `localhost`;
/// no name lookups happen here.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(addr) = t.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = t.rsplit_once(':') else {
        return Err(format!(
            "{s:?} is not an address (use host:port, :port or localhost:port)"
        ));
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} has no valid port (use host:port or :port)"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?}: port {port} is above 65535"))?;
    let ip = if host.is_empty() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        IpAddr::V6(
            inner
                .parse::<Ipv6Addr>()
                .map_err(|_| format!("{s:?}: {inner:?} is not an IPv6 address"))?,
        )
    } else if host.contains(':') {
        return Err(format!(
            "{s:?}: put an IPv6 host in brackets, e.g. [::1]:8080"
        ));
    } else {
        host.parse::<IpAddr>()
            .map_err(|_| format!("{s:?}: host {host:?} is not an IP address or localhost"))?
    };
    Ok(SocketAddr::new(ip, port))
}

/// Parses an address another node can be reached at: like [`parse_addr`],
/// but port 0 is refused.
pub(super) fn parse_dial_addr(s: &str) -> Result<SocketAddr, String> {
    let addr = parse_addr(s)?;
    if addr.port() == 0 {
        return Err(format!("{s:?} needs a real port, not 0"));
    }
    Ok(addr)
}

/// Splits a comma-separated list; an empty or blank value is an empty list,
/// but an empty entry inside a list is an error.
pub(super) fn split_list(s: &str) -> Result<Vec<&str>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() {
                Err(format!("{s:?} has an empty entry"))
            } else {
                Ok(item)
            }
        })
        .collect()
}

/// Parses `id=host:port,id=host:port,...`.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    let peers = split_list(s)?
        .into_iter()
        .map(|item| {
            let Some((id, addr)) = item.split_once('=') else {
                return Err(format!("{item:?} is not id=host:port"));
            };
            let id = id.trim();
            validate_node_id(id).map_err(|e| format!("peer id {e}"))?;
            let addr = parse_dial_addr(addr.trim())?;
            Ok(Peer {
                id: id.to_string(),
                addr,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    check_peers(&peers)?;
    Ok(peers)
}

pub(super) fn check_peers(peers: &[Peer]) -> Result<(), String> {
    let mut ids = HashSet::new();
    let mut addrs = HashSet::new();
    for p in peers {
        validate_node_id(&p.id).map_err(|e| format!("peer id {e}"))?;
        if !ids.insert(p.id.as_str()) {
            return Err(format!("peer id {:?} appears more than once", p.id));
        }
        if !addrs.insert(p.addr) {
            return Err(format!("address {} appears more than once", p.addr));
        }
    }
    Ok(())
}

pub(super) fn check_addr_list(addrs: &[SocketAddr]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for a in addrs {
        if !seen.insert(*a) {
            return Err(format!("address {a} appears more than once"));
        }
    }
    Ok(())
}

/// Parses a byte size for something held in memory: [`parse_bytes`],
/// refused when the address space cannot hold it (over 4 GiB on a 32-bit
/// host such as armv7).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s)?;
    usize::try_from(bytes)
        .map_err(|_| format!("{s:?} is more than a {}-bit host can address", usize::BITS))
}

/// Parses a byte size: a whole number, optionally followed by `B`, `KB`
/// (1000), `KiB` (1024), `MB`, `MiB`, `GB` or `GiB` (suffix case ignored,
/// space before it allowed).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a size (use bytes or a KB/KiB/MB/MiB/GB/GiB suffix)");
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    if number.is_empty() {
        return Err(bad());
    }
    let unit: u64 = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => KIB,
        "mb" => 1000 * 1000,
        "mib" => MIB,
        "gb" => 1000 * 1000 * 1000,
        "gib" => GIB,
        _ => return Err(bad()),
    };
    let too_large = || format!("{s:?} is too large");
    let n: u64 = number.parse().map_err(|_| too_large())?;
    n.checked_mul(unit).ok_or_else(too_large)
}

/// Renders a size the way [`parse_size`] reads it, using the largest binary
/// unit that divides it exactly.
pub fn format_size(bytes: usize) -> String {
    let b = bytes as u64;
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if b != 0 && b.is_multiple_of(unit) {
            return format!("{}{name}", b / unit);
        }
    }
    format!("{b}B")
}

/// Parses a duration: one or more whole numbers each followed by `ms`, `s`,
/// `m` or `h`, e.g. `25s`, `300ms`, `1m30s`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration (use whole numbers with ms, s, m or h, e.g. 25s or 1500ms)"
        )
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let too_large = || format!("{s:?} is too large");
    let mut rest = t;
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60 * 1000,
            "h" => 60 * 60 * 1000,
            "" => {
                return Err(format!(
                    "{s:?} has no unit (add ms, s, m or h, e.g. {number}s)"
                ))
            }
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| too_large())?;
        total_ms = n
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(too_large)?;
        rest = next;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Renders a duration the way [`parse_duration`] reads it, using the largest
/// unit that divides it exactly (sub-millisecond parts are dropped).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, name) in [(3_600_000, "h"), (60_000, "m"), (1000, "s")] {
        if ms != 0 && ms.is_multiple_of(unit) {
            return format!("{}{name}", ms / unit);
        }
    }
    if ms == 0 {
        return "0s".to_string();
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{bad, ok};

    #[test]
    fn addr_rejections() {
        for (value, needle) in [
            ("8080", "not an address"),
            (":", "no valid port"),
            (":http", "no valid port"),
            (":70000", "above 65535"),
            ("example.com:80", "not an IP address"),
            ("::1:80", "brackets"),
            ("[zz]:80", "not an IPv6"),
        ] {
            let msg = bad(&["-addr", value]);
            assert!(msg.starts_with("-addr: "), "{msg}");
            assert!(msg.contains(needle), "{value}: {msg}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("2KB"), Ok(2000));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4kib"), Ok(4096));
        assert_eq!(parse_size(" 5 MiB "), Ok(5 << 20));
        for s in [
            "", "MiB", "12XB", "1.5MiB", "-1", "+1", "1K", "1 M", "1MiBs",
        ] {
            let err = parse_size(s).unwrap_err();
            assert!(err.contains("is not a size"), "{s:?}: {err}");
        }
        let err = parse_size("99999999999999999999").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_size("18446744073709551615GiB").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        // Sizes kept on disk (a stream's max_bytes) go past 4 GiB on any
        // host; sizes held in memory only where the address space allows.
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        #[cfg(target_pointer_width = "32")]
        assert_eq!(
            parse_size("8GiB"),
            Err("\"8GiB\" is more than a 32-bit host can address".to_string())
        );
        #[cfg(target_pointer_width = "64")]
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));

        assert_eq!(
            bad(&["-max-payload=12XB"]),
            "-max-payload: \"12XB\" is not a size (use bytes or a KB/KiB/MB/MiB/GB/GiB suffix)"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("25s"), Ok(Duration::from_secs(25)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 10ms "), Ok(Duration::from_millis(10)));
        for s in [
            "", "s", "1.5s", "-1s", "25S", "1d", "10us", "1m 30s", "ms10",
        ] {
            let err = parse_duration(s).unwrap_err();
            assert!(err.contains("is not a duration"), "{s:?}: {err}");
        }
        let err = parse_duration("25").unwrap_err();
        assert!(err.contains("no unit"), "{err}");
        let err = parse_duration("99999999999999999999h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_duration("18446744073709551615h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn format_round_trips() {
        for s in ["1B", "1000B", "64KiB", "1MiB", "64MiB", "4GiB"] {
            if let Ok(n) = parse_size(s) {
                assert_eq!(format_size(n), s);
            }
        }
        for s in ["10ms", "1500ms", "25s", "90s", "1m", "2h", "0s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(format_duration(d), s);
        }
    }

    #[test]
    fn node_ids() {
        assert_eq!(ok(&["-node-id=a.B_c-9"]).node_id, "a.B_c-9");
        let long = "n".repeat(64);
        assert_eq!(ok(&["-node-id", &long]).node_id, long);
        let too_long = "n".repeat(65);
        assert!(bad(&["-node-id", &too_long]).contains("longer than 64"));
        assert!(bad(&["-node-id=node 1"]).contains("' '"));
        assert!(bad(&["-node-id=nödé"]).starts_with("-node-id: "));
    }

    #[test]
    fn booleans() {
        for v in ["true", "T", "1", "yes", " TRUE "] {
            assert_eq!(parse_bool(v), Ok(true), "{v:?}");
        }
        for v in ["false", "f", "0", "No"] {
            assert_eq!(parse_bool(v), Ok(false), "{v:?}");
        }
        assert_eq!(
            parse_bool("maybe"),
            Err("\"maybe\" is not a boolean (use true or false)".to_string())
        );
        assert_eq!(unless_empty(""), None);
        assert_eq!(unless_empty(" ").as_deref(), Some(" "));
    }
}
