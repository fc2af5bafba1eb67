//! The cluster's launch lines: `-cluster` in both its forms (the other
//! nodes' `host:port` list, or every node's `id=http://host:port` URL) and
//! the address of a node being added with `cluster.add`. No names are
//! looked up: hosts are IP literals or `localhost`.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;

use super::values::{check_addr_list, parse_dial_addr, split_list, validate_node_id};
use super::Peer;

/// Parses the address of a node being added to a cluster (`cluster.add`):
/// `host:port` with a real host and port, or (`http`) also the URL form
/// of `-cluster` (`http://host:port[/socket.io]`).
pub fn parse_member_addr(s: &str, http: bool) -> Result<SocketAddr, String> {
    let addr = if http && s.contains("://") {
        parse_http_url(s.trim())?
    } else {
        parse_dial_addr(s)?
    };
    if addr.ip().is_unspecified() {
        return Err(format!(
            "{s:?} names no host (give the address other nodes reach it at)"
        ));
    }
    Ok(addr)
}

/// Parses `-cluster` into the other nodes' HTTP addresses. Two forms:
/// the other nodes' `host:port` list, or `id=http://host:port` pairs (path
/// empty, `/`, `/socket.io` or `/socket.io/`) naming `peers` members
/// (any ids when `peers` is `None`: a node that joins), each once. In the
/// second form this node's own entry may be given; its port must be
/// `listen_port` (the `-addr` port), and it is then left out.
/// Hosts are IP literals or `localhost`: no names are looked up.
pub fn parse_cluster(
    s: &str,
    node_id: &str,
    listen_port: u16,
    peers: Option<&[Peer]>,
) -> Result<Vec<SocketAddr>, String> {
    let items = split_list(s)?;
    let with_ids = items.iter().filter(|i| i.contains('=')).count();
    if with_ids == 0 {
        let addrs = items
            .into_iter()
            .map(parse_dial_addr)
            .collect::<Result<Vec<_>, String>>()?;
        check_addr_list(&addrs)?;
        return Ok(addrs);
    }
    if with_ids != items.len() {
        return Err(format!(
            "{s:?} mixes id=URL and host:port entries (use one form)"
        ));
    }
    let mut ids = HashSet::new();
    let mut others = Vec::new();
    for item in items {
        let (id, url) = item.split_once('=').unwrap_or((item, ""));
        let (id, url) = (id.trim(), url.trim());
        validate_node_id(id).map_err(|e| format!("node id {e}"))?;
        if peers.is_some_and(|peers| !peers.iter().any(|p| p.id == id)) {
            return Err(format!(
                "node id {id:?} is not one of the -raft-peers members"
            ));
        }
        if !ids.insert(id) {
            return Err(format!("node id {id:?} appears more than once"));
        }
        let addr = parse_http_url(url)?;
        if id != node_id {
            others.push(addr);
        } else if addr.port() != listen_port {
            return Err(format!(
                "this node's entry {item:?} has port {}, but -addr listens on port {listen_port}",
                addr.port()
            ));
        }
    }
    check_addr_list(&others)?;
    Ok(others)
}

/// The `id=URL` pairs of a `-cluster` value [`parse_cluster`] accepted
/// (none for its `host:port` form).
pub(super) fn cluster_ids(s: &str) -> BTreeMap<String, SocketAddr> {
    crate::maps::map_of(
        split_list(s)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|item| {
                let (id, url) = item.split_once('=')?;
                Some((id.trim().to_string(), parse_http_url(url.trim()).ok()?))
            }),
    )
}

/// The address in `http://host[:port][/socket.io[/]]` (port 80 when left
/// out). Any other scheme, path, query or user part is refused.
fn parse_http_url(url: &str) -> Result<SocketAddr, String> {
    const SCHEME: &str = "http://";
    let rest = match url.get(..SCHEME.len()) {
        Some(head) if head.eq_ignore_ascii_case(SCHEME) => &url[SCHEME.len()..],
        _ => {
            return Err(match url.split_once("://") {
                Some((scheme, _)) => format!(
                    "{url:?} is not an http:// URL (scheme {scheme:?}; nodes talk plain HTTP)"
                ),
                None => format!("{url:?} is not an http:// URL (write id=http://host:port)"),
            });
        }
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    if !matches!(path, "" | "/" | "/socket.io" | "/socket.io/") {
        return Err(format!(
            "{url:?}: the path may only be /socket.io (got {path:?})"
        ));
    }
    if authority.is_empty() || authority.contains(['@', '?', '#']) {
        return Err(format!("{url:?} is not http://host:port"));
    }
    let has_port = match authority.rfind(']') {
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    };
    let with_port;
    let authority = if has_port {
        authority
    } else {
        with_port = format!("{authority}:80");
        &with_port
    };
    parse_dial_addr(authority).map_err(|e| {
        if e.contains("is not an IP address") {
            format!("{url:?}: {e} (names are not looked up: give the node's IP address)")
        } else {
            format!("{url:?}: {e}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{bad, ok, sock};
    use crate::config::{parse, parse_peers};

    #[test]
    fn cluster_list() {
        let cfg = ok(&["-cluster=127.0.0.1:8081,127.0.0.1:8082"]);
        assert_eq!(
            cfg.cluster,
            vec![sock("127.0.0.1:8081"), sock("127.0.0.1:8082")]
        );
        assert!(bad(&["-cluster=127.0.0.1:8081,127.0.0.1:8081"]).contains("more than once"));
        assert!(bad(&["-cluster=127.0.0.1:8081,nope"]).starts_with("-cluster: "));
        assert!(ok(&["-cluster="]).cluster.is_empty());
    }

    /// The contract's launch line for node `id` of three, from `-addr` on.
    fn launch_line(id: &str, addr: &str) -> Vec<String> {
        let n = &id[1..];
        [
            format!("-node-id={id}"),
            format!("-addr={addr}"),
            format!("-raft-addr=:909{n}"),
            "-raft-peers=n1=127.0.0.1:9091,n2=127.0.0.1:9092,n3=127.0.0.1:9093".to_string(),
            "-cluster=n1=http://127.0.0.1:8081/socket.io,n2=http://127.0.0.1:8082/socket.io,\
             n3=http://127.0.0.1:8083/socket.io"
                .to_string(),
            "-control-token=secret".to_string(),
            format!("-data=./data/{id}"),
            "-bootstrap".to_string(),
        ]
        .to_vec()
    }

    #[test]
    fn cluster_urls_as_in_the_launch_lines() {
        for (id, addr, others) in [
            ("n1", ":8081", ["127.0.0.1:8082", "127.0.0.1:8083"]),
            ("n2", ":8082", ["127.0.0.1:8081", "127.0.0.1:8083"]),
            ("n3", "127.0.0.1:8083", ["127.0.0.1:8081", "127.0.0.1:8082"]),
        ] {
            let cfg = parse(launch_line(id, addr)).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(cfg.cluster, others.map(sock).to_vec(), "{id}");
            assert_eq!(cfg.addr.port(), 8080 + id[1..].parse::<u16>().unwrap());
            assert!(cfg.bootstrap);
        }
    }

    #[test]
    fn cluster_url_forms() {
        let peers = parse_peers("a=127.0.0.1:9001,b=127.0.0.1:9002,c=127.0.0.1:9003").unwrap();
        let others = |v: &str| parse_cluster(v, "a", 8001, Some(&peers));
        // Path with or without /socket.io, trailing slash, any scheme case,
        // port 80 by default, localhost, IPv6, own entry left out.
        assert_eq!(
            others("b=http://127.0.0.1:8002/socket.io/,c=HTTP://localhost/").unwrap(),
            vec![sock("127.0.0.1:8002"), sock("127.0.0.1:80")]
        );
        assert_eq!(
            others("a=http://[::1]:8001/,b=http://[::1]:8002,c=http://10.0.0.3:8003/socket.io")
                .unwrap(),
            vec![sock("[::1]:8002"), sock("10.0.0.3:8003")]
        );
        // Own entry omitted is fine; plain host:port lists still work.
        assert_eq!(others("b=http://127.0.0.1:8002").unwrap().len(), 1);
        assert_eq!(
            others("127.0.0.1:8002,127.0.0.1:8003").unwrap(),
            vec![sock("127.0.0.1:8002"), sock("127.0.0.1:8003")]
        );
    }

    #[test]
    fn cluster_url_rejections_name_the_flag() {
        let base = [
            "-node-id=n1",
            "-addr=:8081",
            "-raft-addr=:9091",
            "-raft-peers=n1=127.0.0.1:9091,n2=127.0.0.1:9092,n3=127.0.0.1:9093",
        ];
        let cases = [
            // Not http://.
            (
                "n2=https://127.0.0.1:8082,n3=http://127.0.0.1:8083",
                "is not an http:// URL (scheme \"https\"",
            ),
            (
                "n2=ws://127.0.0.1:8082,n3=http://127.0.0.1:8083",
                "is not an http:// URL",
            ),
            (
                "n2=127.0.0.1:8082,n3=http://127.0.0.1:8083",
                "is not an http:// URL",
            ),
            // An id that is not a member.
            (
                "n2=http://127.0.0.1:8082,n4=http://127.0.0.1:8084",
                "node id \"n4\" is not one of the -raft-peers members",
            ),
            // Two entries for one id.
            (
                "n2=http://127.0.0.1:8082,n2=http://127.0.0.1:8083",
                "node id \"n2\" appears more than once",
            ),
            // The own entry on another port than -addr's.
            (
                "n1=http://127.0.0.1:9999,n2=http://127.0.0.1:8082,n3=http://127.0.0.1:8083",
                "has port 9999, but -addr listens on port 8081",
            ),
            // Names are not looked up.
            (
                "n2=http://node2.example:8082,n3=http://127.0.0.1:8083",
                "names are not looked up",
            ),
            // Other paths, user parts, queries, port 0, mixed forms, two
            // nodes on one address.
            (
                "n2=http://127.0.0.1:8082/engine.io,n3=http://127.0.0.1:8083",
                "the path may only be /socket.io",
            ),
            (
                "n2=http://u@127.0.0.1:8082,n3=http://127.0.0.1:8083",
                "is not http://host:port",
            ),
            (
                "n2=http://127.0.0.1:8082?x=1,n3=http://127.0.0.1:8083",
                "is not http://host:port",
            ),
            (
                "n2=http://127.0.0.1:0,n3=http://127.0.0.1:8083",
                "needs a real port",
            ),
            ("n2=http://127.0.0.1:8082,127.0.0.1:8083", "mixes id=URL"),
            (
                "n2=http://127.0.0.1:8082,n3=http://127.0.0.1:8082",
                "appears more than once",
            ),
        ];
        for (value, want) in cases {
            let mut args = base.to_vec();
            let flag = format!("-cluster={value}");
            args.push(&flag);
            let msg = bad(&args);
            assert!(msg.starts_with("-cluster: "), "{value}: {msg}");
            assert!(msg.contains(want), "{value}: {msg}");
        }
        // The other members' addresses must all be there.
        let mut args = base.to_vec();
        args.push("-cluster=n1=http://127.0.0.1:8081,n2=http://127.0.0.1:8082");
        assert_eq!(
            bad(&args),
            "-cluster: give the HTTP addresses of the 2 other members (1 given)"
        );
        // Ids need -raft-peers to be checked against.
        assert!(bad(&["-cluster=n2=http://127.0.0.1:8082"])
            .contains("is not one of the -raft-peers members"));
    }
}
