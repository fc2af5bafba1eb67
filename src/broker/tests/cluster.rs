//! A cluster member's core in-process, with Raft and the peer links
//! played by the test: the changes it hands to Raft and acks once they
//! come back committed, the forward batches it queues toward each peer
//! (decoded and checked), and what it delivers from a peer's
//! `cluster.forward`. The threads and sockets behind Raft and the links
//! are not started (the broker is never attached); `tests/cluster.rs`
//! covers them with real processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{config, msg, Core};
use crate::broker::cluster::ClusterSettings;
use crate::broker::Broker;
use crate::cluster::api::{forward, Change, Cmd, NodeConfig, PeerMessage};
use crate::routing::subs::{Command, Owner};

/// A connection serial of node 2's (boot id 5).
const REMOTE_SERIAL: u64 = (5 << 32) | 1;

/// Node 1 (`n1`) of a two-node cluster whose link 0 reaches node 2.
fn member() -> Core {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut cfg = config();
    cfg.cluster_token = Some("secret".into());
    let mut broker = Broker::new(cfg);
    broker.enable_cluster(ClusterSettings {
        names: vec!["n1".into(), "n2".into()],
        raft: NodeConfig {
            id: 1,
            listen: addr,
            members: BTreeMap::from([(1, addr), (2, addr)]),
            data: std::env::temp_dir(),
            memory_log: true,
            bootstrap: false,
            secret: None,
            names: BTreeMap::from([(1, "n1".into()), (2, "n2".into())]),
            infos: BTreeMap::new(),
            join: false,
        },
        peers_http: vec![addr],
    });
    broker.set_link(0, Some(2));
    Core::with(broker)
}

/// Commits every change the core is waiting on, in order, from index
/// `first` on; returns the next free index.
fn commit_proposals(core: &mut Core, first: u64) -> u64 {
    let mut index = first;
    for change in core.broker.proposals() {
        core.broker.raft_applied(&mut core.sink, index, &change);
        index += 1;
    }
    index
}

/// Node 2's subscription, committed at `index`.
fn remote_sub(core: &mut Core, index: u64, sid: &str, pattern: &str, queue: Option<&str>) {
    let change = Change {
        node: 2,
        op: index,
        cmd: Cmd::Subs(Command::Subscribe {
            owner: Owner {
                node: 2,
                conn: REMOTE_SERIAL,
            },
            sid: sid.into(),
            pattern: pattern.into(),
            queue: queue.map(str::to_string),
            max: None,
        }),
    };
    core.broker.raft_applied(&mut core.sink, index, &change);
}

/// The forward batches of this turn, decoded, per node.
fn forwards(core: &mut Core) -> Vec<(u64, Vec<String>)> {
    let batches = core.broker.cluster.as_mut().unwrap().take_batches();
    batches
        .iter()
        .map(|(node, batch)| {
            let msgs = forward::decode(batch).unwrap();
            (*node, msgs.iter().map(|m| format!("{m:?}")).collect())
        })
        .collect()
}

fn forwarded(subject: &str, data: &str, plain: bool, picks: Vec<(u64, &str)>) -> String {
    format!(
        "{:?}",
        PeerMessage {
            subject,
            reply: None,
            data,
            headers: None,
            extra: None,
            attachments: Vec::new(),
            plain,
            picks,
        }
    )
}

#[test]
fn a_subscription_is_acked_once_raft_commits_it() {
    let mut core = member();
    core.join(1);
    core.join(2);
    core.text(1, r#"29["sub",{"subject":"a.b","sid":"s1"}]"#);
    core.tick();
    core.assert_quiet();
    let proposed = core.broker.proposals();
    assert_eq!(proposed.len(), 1);
    assert_eq!(proposed[0].node, 1);
    assert!(
        matches!(&proposed[0].cmd, Cmd::Subs(Command::Subscribe { sid, pattern, .. })
            if sid == "s1" && pattern == "a.b"),
        "{proposed:?}"
    );

    commit_proposals(&mut core, 1);
    assert_eq!(core.sent(1), [r#"39[{"ok":true,"sid":"s1"}]"#]);
    core.text(2, r#"2["pub",{"subject":"a.b","data":1}]"#);
    assert_eq!(core.sent(1), [msg("s1", "a.b", "1")]);
    core.assert_quiet();
}

#[test]
fn a_publish_is_forwarded_once_per_peer_with_its_picked_group_members() {
    let mut core = member();
    core.join(1);
    core.join(2);
    core.text(1, r#"2["sub",{"subject":"orders.*","sid":"s1"}]"#);
    commit_proposals(&mut core, 1);
    remote_sub(&mut core, 10, "r1", "orders.>", None);
    remote_sub(&mut core, 11, "g2", "job", Some("q"));
    core.assert_quiet();

    core.text(2, r#"2["pub",{"subject":"orders.new","data":1}]"#);
    core.text(2, r#"2["pub",{"subject":"orders.old","data":2}]"#);
    assert_eq!(
        core.sent(1),
        [msg("s1", "orders.new", "1"), msg("s1", "orders.old", "2")]
    );
    // Both messages for node 2's plain subscribers, in one batch.
    assert_eq!(
        forwards(&mut core),
        [(
            2,
            vec![
                forwarded("orders.new", "1", true, vec![]),
                forwarded("orders.old", "2", true, vec![])
            ]
        )]
    );

    // The group's only member is on node 2: it is picked here.
    core.text(2, r#"2["pub",{"subject":"job","data":3}]"#);
    assert_eq!(
        forwards(&mut core),
        [(
            2,
            vec![forwarded("job", "3", false, vec![(REMOTE_SERIAL, "g2")])]
        )]
    );
    core.assert_quiet();

    // With the link down, nothing is queued toward node 2, and a request
    // whose only responder is there has no responders.
    core.broker.set_link(0, None);
    core.text(2, r#"2["pub",{"subject":"orders.x","data":4}]"#);
    assert_eq!(core.sent(1), [msg("s1", "orders.x", "4")]);
    assert!(forwards(&mut core).is_empty());
    core.text(2, r#"25["request",{"subject":"job","data":5}]"#);
    assert_eq!(
        core.sent(2),
        [
            r#"35[{"ok":false,"error":{"code":"no_responders","message":"no subscribers on \"job\""}}]"#
        ]
    );
    core.assert_quiet();
}

#[test]
fn a_peers_forward_batch_is_delivered_to_local_subscribers() {
    let mut core = member();
    core.join(1);
    core.text(1, r#"2["sub",{"subject":"orders.*","sid":"s1"}]"#);
    core.text(1, r#"2["sub",{"subject":"job","sid":"m","queue":"q"}]"#);
    commit_proposals(&mut core, 1);
    core.assert_quiet();

    let mut batch = Vec::new();
    forward::push(
        &mut batch,
        &PeerMessage {
            subject: "orders.new",
            reply: Some("_INBOX.n2.ab.1"),
            data: "7",
            headers: None,
            extra: None,
            attachments: Vec::new(),
            plain: true,
            picks: Vec::new(),
        },
    );
    // A load-balanced message node 2 picked this node's member for (by
    // its serial and sid), and one for a plain subject with no pick here.
    let serial = core.broker.sessions[1].as_ref().unwrap().serial;
    forward::push(
        &mut batch,
        &PeerMessage {
            subject: "job",
            reply: None,
            data: "8",
            headers: None,
            extra: None,
            attachments: Vec::new(),
            plain: false,
            picks: vec![(serial, "m")],
        },
    );
    let event = r#"51-/control,["cluster.forward",{},{"_placeholder":true,"num":0}]"#;

    // Only a connection holding the cluster token may forward.
    core.open(8);
    core.text(8, "0/control,");
    core.sent(8);
    core.text(8, event);
    core.binary(8, &batch);
    core.assert_quiet();

    core.open(9);
    core.text(9, r#"0/control,{"token":"secret"}"#);
    assert_eq!(core.sent(9).len(), 1);
    core.text(9, event);
    core.binary(9, &batch);
    assert_eq!(
        core.sent(1),
        [
            r#"2["msg",{"sid":"s1","subject":"orders.new","data":7,"reply":"_INBOX.n2.ab.1"}]"#
                .to_string(),
            msg("m", "job", "8")
        ]
    );
    core.assert_quiet();
}
