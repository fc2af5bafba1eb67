//! The contract's cluster launch lines (docs/PROTOCOL.md §9) as written:
//! three real `broker` processes told about each other with
//! `-cluster=n1=http://…/socket.io,n2=…,n3=…` (each node's own entry
//! included), n1 listening as `-addr=:PORT -raft-addr=:PORT`,
//! `-control-token=secret`, `-data=./data/ID` and `-bootstrap` on every
//! node. They must agree on a leader and carry a message across nodes.
//! Bad `-cluster` values stop the broker with exit status 2 and a message
//! naming the flag.

mod cluster_support;

use std::process::Command;
use std::time::{Duration, Instant};

use cluster_support::{free_ports, Cluster, Launch, LEADER_WAIT};
use serde_json::json;

/// Bound on the cross-node delivery.
const DELIVERY_WAIT: Duration = Duration::from_secs(5);

#[test]
fn the_launch_lines_form_a_cluster_that_delivers_across_nodes() {
    let c = Cluster::start_with(Launch::UrlLines);
    let args = c.args(0).join(" ");
    assert!(args.contains("-addr=:"), "{args}");
    assert!(args.contains("-cluster=n1=http://127.0.0.1:"), "{args}");
    // Every node names the same leader (bounded wait).
    let (leader, term) = c.await_leader(&[0, 1, 2], LEADER_WAIT);
    assert!(term > 0, "leader {leader} in term {term}");

    // Subscribe on n2 (behind a plain address), publish on n1 (the one
    // that listens as `:PORT`), and the other way round via n3.
    let sub_client = c.client(1);
    let sub = sub_client.subscribe("launch.>").expect("subscribe on n2");
    for (from, subject) in [(0, "launch.from.n1"), (2, "launch.from.n3")] {
        let publisher = c.client(from);
        let deadline = Instant::now() + DELIVERY_WAIT;
        let mut sent = 0u64;
        'wait: loop {
            assert!(
                Instant::now() < deadline,
                "nothing on {subject} reached n2 within {DELIVERY_WAIT:?} ({sent} sent)\n{}",
                c.all_logs()
            );
            sent += 1;
            publisher
                .publish(subject, json!({ "n": sent }))
                .expect("publish");
            let until = Instant::now() + Duration::from_millis(100);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                match sub.recv_timeout(left) {
                    Ok(m) if m.subject == subject => {
                        assert!(m.data["n"].as_u64().is_some_and(|n| n >= 1), "{m:?}");
                        break 'wait;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
    }
}

#[test]
fn bad_cluster_values_exit_2_naming_the_flag() {
    let [http, raft] = free_ports(2)[..] else {
        unreachable!("two ports asked for")
    };
    let peers = format!("-raft-peers=n1=127.0.0.1:{raft},n2=127.0.0.1:9992,n3=127.0.0.1:9993");
    let cases = [
        (
            format!(
                "n1=http://127.0.0.1:{http},n2=https://127.0.0.1:8082,n3=http://127.0.0.1:8083"
            ),
            "is not an http:// URL",
        ),
        (
            "n2=http://127.0.0.1:8082,n4=http://127.0.0.1:8084".to_string(),
            "not one of the -raft-peers members",
        ),
        (
            "n2=http://127.0.0.1:8082,n2=http://127.0.0.1:8083".to_string(),
            "appears more than once",
        ),
        (
            format!(
                "n1=http://127.0.0.1:{},n2=http://127.0.0.1:8082,n3=http://127.0.0.1:8083",
                http ^ 1
            ),
            "but -addr listens on port",
        ),
    ];
    let data = std::env::temp_dir().join(format!("gombus-launch-bad-{}", std::process::id()));
    for (cluster, want) in cases {
        let out = Command::new(cluster_support::broker_bin())
            .args([
                "-node-id=n1".to_string(),
                format!("-addr=:{http}"),
                format!("-raft-addr=:{raft}"),
                peers.clone(),
                format!("-cluster={cluster}"),
                format!("-data={}", data.display()),
            ])
            .env_remove("GOMBUS_CLUSTER")
            .output()
            .expect("run broker");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cluster}: {err}");
        assert!(err.contains("-cluster: "), "{cluster}: {err}");
        assert!(err.contains(want), "{cluster}: {err}");
    }
    // Refused before anything was written.
    assert!(!data.exists());
}
