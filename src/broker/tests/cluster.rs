//! A cluster member's core in-process, with Raft and the peer links
//! played by the test through detached handles (`RaftNode::detached`,
//! `Links::detached`), as the sink plays the sockets: the changes the core
//! hands to Raft and acks once they come back committed, the forward
//! batches it queues toward each peer (decoded and checked), and what it
//! delivers from a peer's `cluster.forward`. The broker is driven only
//! through its `Handler` calls; the threads and sockets behind Raft and
//! the links are covered by `tests/cluster.rs` with real processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{config, msg, Core};
use crate::broker::cluster::ClusterSettings;
use crate::broker::Broker;
use crate::cluster::api::{
    forward, Change, ChangeState, Cmd, FromRaft, LinkEvent, LinkOut, Links, LinksEnd, MemberView,
    NodeConfig, PeerMessage, RaftEnd, RaftNode, Role, Status, ToRaft, TransportStats, View,
};
use crate::routing::subs::{Command, Owner};

/// A connection serial of node 2's (boot id 5).
const REMOTE_SERIAL: u64 = (5 << 32) | 1;

/// Raft and the peer links of node 1, as the test plays them.
struct Played {
    raft: RaftEnd,
    links: LinksEnd,
    /// Proposals taken from the broker and not committed yet: (tag, data).
    pending: Vec<(u64, Vec<u8>)>,
    /// The index the next committed entry gets.
    next: u64,
}

impl Played {
    /// Takes what the broker handed to Raft since the last call.
    fn take(&mut self) {
        while let Ok(m) = self.raft.rx.try_recv() {
            if let ToRaft::Propose { tag, data } = m {
                self.pending.push((tag, data));
            }
        }
    }

    /// The changes proposed and not committed yet, in order.
    fn proposed(&mut self) -> Vec<Change> {
        self.take();
        self.pending
            .iter()
            .map(|(_, data)| Change::decode(data).unwrap())
            .collect()
    }

    /// Appends and commits every pending proposal, in order, as a leader's
    /// Raft thread reports them, and wakes the broker.
    fn commit(&mut self, core: &mut Core) {
        self.take();
        for (tag, data) in std::mem::take(&mut self.pending) {
            let index = self.next;
            self.next += 1;
            self.send(FromRaft::Proposed {
                tag,
                result: Ok(index),
            });
            self.send(FromRaft::Apply { index, data });
        }
        core.woken();
    }

    /// Commits a change another node proposed.
    fn commit_remote(&mut self, core: &mut Core, change: &Change) {
        let index = self.next;
        self.next += 1;
        self.send(FromRaft::Apply {
            index,
            data: change.encode(),
        });
        core.woken();
    }

    fn send(&self, m: FromRaft) {
        self.raft.tx.send(m).unwrap();
    }

    /// Link 0's event, as its thread reports it, and the broker woken.
    fn link_event(&self, core: &mut Core, ev: LinkEvent) {
        self.links.events.send(ev).unwrap();
        core.woken();
    }

    /// The forward batches of this turn (sent at the turn's tick), decoded,
    /// per node: link 0 reaches node 2.
    fn forwards(&mut self, core: &mut Core) -> Vec<(u64, Vec<String>)> {
        core.tick();
        let mut out = Vec::new();
        while let Some(m) = self.links.take(0) {
            if let LinkOut::Forward(batch) = m {
                let msgs = forward::decode(&batch).unwrap();
                out.push((2, msgs.iter().map(|m| format!("{m:?}")).collect()));
            }
        }
        out
    }
}

/// Node 1 (`n1`) of a two-node cluster, leading its control group in term
/// 1, whose link 0 reaches node 2; its announcement that it is up is
/// committed.
fn member() -> (Core, Played) {
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
    let view = View {
        role: Role::Leader,
        term: 1,
        leader: Some(1),
        commit: 0,
        last_index: 0,
        peers: Vec::new(),
        dropped: 0,
        transport: TransportStats::default(),
        groups: BTreeMap::new(),
        members: [1, 2]
            .map(|id| MemberView {
                id,
                voter: true,
                info: None,
            })
            .to_vec(),
        conf_index: 0,
        change: ChangeState::Idle,
        member: true,
        removed: false,
    };
    let (raft, raft_end) = RaftNode::detached(view);
    let (links, links_end) = Links::detached(1);
    broker.run_cluster_with(raft, links);
    let mut core = Core::with(broker);
    let mut played = Played {
        raft: raft_end,
        links: links_end,
        pending: Vec::new(),
        next: 1,
    };
    played.send(FromRaft::Status(Status {
        role: Role::Leader,
        term: 1,
        leader: Some(1),
        voter: true,
    }));
    played.link_event(
        &mut core,
        LinkEvent::Up {
            link: 0,
            node_id: "n2".into(),
        },
    );
    core.tick();
    let up = played.proposed();
    assert!(
        matches!(
            up[..],
            [Change {
                node: 1,
                cmd: Cmd::Subs(Command::NodeUp { .. }),
                ..
            }]
        ),
        "{up:?}"
    );
    played.commit(&mut core);
    core.assert_quiet();
    (core, played)
}

/// Node 2's subscription, committed.
fn remote_sub(core: &mut Core, played: &mut Played, sid: &str, pattern: &str, queue: Option<&str>) {
    let change = Change {
        node: 2,
        op: played.next,
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
    played.commit_remote(core, &change);
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
    let (mut core, mut played) = member();
    core.join(1);
    core.join(2);
    core.text(1, r#"29["sub",{"subject":"a.b","sid":"s1"}]"#);
    core.tick();
    core.assert_quiet();
    let proposed = played.proposed();
    assert_eq!(proposed.len(), 1);
    assert_eq!(proposed[0].node, 1);
    assert!(
        matches!(&proposed[0].cmd, Cmd::Subs(Command::Subscribe { sid, pattern, .. })
            if sid == "s1" && pattern == "a.b"),
        "{proposed:?}"
    );

    played.commit(&mut core);
    assert_eq!(core.sent(1), [r#"39[{"ok":true,"sid":"s1"}]"#]);
    core.text(2, r#"2["pub",{"subject":"a.b","data":1}]"#);
    assert_eq!(core.sent(1), [msg("s1", "a.b", "1")]);
    core.assert_quiet();
}

#[test]
fn a_publish_is_forwarded_once_per_peer_with_its_picked_group_members() {
    let (mut core, mut played) = member();
    core.join(1);
    core.join(2);
    core.text(1, r#"2["sub",{"subject":"orders.*","sid":"s1"}]"#);
    played.commit(&mut core);
    remote_sub(&mut core, &mut played, "r1", "orders.>", None);
    remote_sub(&mut core, &mut played, "g2", "job", Some("q"));
    core.assert_quiet();

    core.text(2, r#"2["pub",{"subject":"orders.new","data":1}]"#);
    core.text(2, r#"2["pub",{"subject":"orders.old","data":2}]"#);
    assert_eq!(
        core.sent(1),
        [msg("s1", "orders.new", "1"), msg("s1", "orders.old", "2")]
    );
    // Both messages for node 2's plain subscribers, in one batch.
    assert_eq!(
        played.forwards(&mut core),
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
        played.forwards(&mut core),
        [(
            2,
            vec![forwarded("job", "3", false, vec![(REMOTE_SERIAL, "g2")])]
        )]
    );
    core.assert_quiet();

    // With the link down, nothing is queued toward node 2, and a request
    // whose only responder is there has no responders.
    played.link_event(&mut core, LinkEvent::Down { link: 0 });
    core.text(2, r#"2["pub",{"subject":"orders.x","data":4}]"#);
    assert_eq!(core.sent(1), [msg("s1", "orders.x", "4")]);
    assert!(played.forwards(&mut core).is_empty());
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
    let (mut core, mut played) = member();
    core.join(1);
    core.text(1, r#"2["sub",{"subject":"orders.*","sid":"s1"}]"#);
    core.text(1, r#"2["sub",{"subject":"job","sid":"m","queue":"q"}]"#);
    played.commit(&mut core);
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
