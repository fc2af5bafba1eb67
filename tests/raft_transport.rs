//! The Raft transport over loopback: messages arrive whole and in order
//! (including a large one, and one written a byte at a time), a corrupt
//! frame closes only its connection, a restarted peer is reconnected, and
//! a peer that stops reading costs a bounded queue, not memory.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use gombus::cluster::raft_msg::{self, Body, Entry, EntryKind, Message, NodeId};
use gombus::cluster::raft_transport::{Transport, TransportConfig};
use gombus::storage::record;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Transports for nodes 1..=n on loopback, each knowing the others.
fn cluster(n: u64, tune: impl Fn(&mut TransportConfig)) -> BTreeMap<NodeId, Transport> {
    let mut ts = BTreeMap::new();
    for id in 1..=n {
        let peers = (1..=n)
            .filter(|&p| p != id)
            .map(|p| (p, loopback()))
            .collect();
        let mut cfg = TransportConfig::new(id, loopback(), peers);
        tune(&mut cfg);
        ts.insert(id, Transport::bind(cfg).unwrap());
    }
    let addrs: Vec<(NodeId, SocketAddr)> = ts
        .iter()
        .map(|(&id, t)| (id, t.local_addr().unwrap()))
        .collect();
    for t in ts.values_mut() {
        for &(id, a) in &addrs {
            t.set_peer_addr(id, a);
        }
    }
    ts
}

fn append(from: NodeId, to: NodeId, n: u64, size: usize) -> Message {
    Message {
        from,
        to,
        term: 3,
        body: Body::Append {
            prev_index: n,
            prev_term: 2,
            entries: vec![Entry {
                term: 3,
                index: n + 1,
                kind: EntryKind::Command,
                data: vec![(n % 251) as u8; size],
            }],
            commit: n,
            epoch: 0,
        },
    }
}

/// Polls every transport until `done` holds for the collected inboxes;
/// fails after 10 s.
fn pump(
    ts: &mut BTreeMap<NodeId, Transport>,
    inbox: &mut BTreeMap<NodeId, Vec<Message>>,
    mut done: impl FnMut(&BTreeMap<NodeId, Vec<Message>>, &BTreeMap<NodeId, Transport>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(inbox, ts) {
        assert!(
            Instant::now() < deadline,
            "transport did not deliver in time"
        );
        for (id, t) in ts.iter_mut() {
            t.poll(Duration::from_millis(1), inbox.entry(*id).or_default())
                .unwrap();
        }
    }
}

#[test]
fn messages_arrive_whole_and_in_order() {
    let mut ts = cluster(3, |_| {});
    let mut sent = Vec::new();
    for i in 0..200 {
        let size = if i == 100 { 3 << 20 } else { i as usize };
        let m = append(1, 2, i, size);
        ts.get_mut(&1).unwrap().send(&m);
        sent.push(m);
    }
    let hb = Message {
        from: 1,
        to: 3,
        term: 3,
        body: Body::HeartbeatResp { read_seq: 9 },
    };
    ts.get_mut(&1).unwrap().send(&hb);
    let mut inbox = BTreeMap::new();
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).map_or(0, |v| v.len()) == 200 && ib.get(&3).map_or(0, |v| v.len()) == 1
    });
    assert_eq!(inbox[&2], sent);
    assert_eq!(inbox[&3], [hb]);
    assert_eq!(ts[&2].stats().received, 200);
    assert_eq!(ts[&1].queued_bytes(2), 0);
}

#[test]
fn frames_written_a_byte_at_a_time_decode_and_a_bad_crc_closes_only_that_connection() {
    let mut ts = cluster(2, |_| {});
    let addr = ts[&2].local_addr().unwrap();
    let msgs: Vec<Message> = (0..3).map(|i| append(1, 2, i, 10)).collect();
    let mut bytes = Vec::new();
    for m in &msgs {
        let mut body = Vec::new();
        raft_msg::encode(&mut body, m);
        record::encode(&mut bytes, &body);
    }
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_nodelay(true).unwrap();
    let mut inbox = BTreeMap::new();
    for b in &bytes {
        raw.write_all(&[*b]).unwrap();
        ts.get_mut(&2)
            .unwrap()
            .poll(Duration::from_millis(1), inbox.entry(2).or_default())
            .unwrap();
    }
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).map_or(0, |v| v.len()) == 3
    });
    assert_eq!(inbox[&2], msgs);

    // Flip a body byte: the frame is refused and the connection closed.
    let mut bad = Vec::new();
    let mut body = Vec::new();
    raft_msg::encode(&mut body, &msgs[0]);
    record::encode(&mut bad, &body);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    raw.write_all(&bad).unwrap();
    pump(&mut ts, &mut inbox, |_, ts| ts[&2].stats().bad_frames == 1);

    // The transport itself goes on: node 1's own connection still works.
    let m = append(1, 2, 77, 5);
    ts.get_mut(&1).unwrap().send(&m);
    pump(&mut ts, &mut inbox, |ib, _| ib[&2].len() == 4);
    assert_eq!(inbox[&2][3], m);
}

#[test]
fn a_restarted_peer_is_reconnected() {
    let mut ts = cluster(2, |c| c.backoff_max = Duration::from_millis(200));
    let mut inbox = BTreeMap::new();
    ts.get_mut(&1).unwrap().send(&append(1, 2, 1, 10));
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).map_or(0, |v| v.len()) == 1
    });

    // Node 2 goes away; node 1 notices when writing fails or the socket
    // reports the close, and keeps dialling.
    let addr2 = ts[&2].local_addr().unwrap();
    let addr1 = ts[&1].local_addr().unwrap();
    ts.remove(&2);
    for i in 0..20 {
        ts.get_mut(&1).unwrap().send(&append(1, 2, 100 + i, 10));
        ts.get_mut(&1)
            .unwrap()
            .poll(Duration::from_millis(5), &mut Vec::new())
            .unwrap();
    }
    let mut cfg = TransportConfig::new(2, addr2, [(1, addr1)].into());
    cfg.backoff_max = Duration::from_millis(200);
    ts.insert(2, Transport::bind(cfg).unwrap());
    let marker = append(1, 2, 999, 10);
    ts.get_mut(&1).unwrap().send(&marker);
    let mut inbox = BTreeMap::new();
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.contains(&marker))
    });
    assert!(ts[&1].stats().connects >= 2);
}

#[test]
fn a_peer_that_stops_reading_costs_a_bounded_queue() {
    let cap = 256 << 10;
    let mut ts = cluster(3, |c| c.queue_bytes_max = cap);
    // Node 2's address now leads to a socket that accepts and never reads.
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    sink.set_nonblocking(true).unwrap();
    ts.get_mut(&1)
        .unwrap()
        .set_peer_addr(2, sink.local_addr().unwrap());
    ts.remove(&2);
    let mut inbox = BTreeMap::new();
    let mut held = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    // Push 64 MiB at it (far beyond socket buffers and the cap) while
    // node 3 keeps being served.
    while i < 64 * 16 {
        assert!(Instant::now() < deadline);
        if held.is_none() {
            held = sink.accept().ok();
        }
        let t1 = ts.get_mut(&1).unwrap();
        t1.send(&append(1, 2, i, 64 << 10));
        t1.send(&append(1, 3, i, 8));
        t1.poll(Duration::from_millis(0), &mut Vec::new()).unwrap();
        assert!(
            t1.queued_bytes(2) <= cap,
            "queue {} over cap",
            t1.queued_bytes(2)
        );
        ts.get_mut(&3)
            .unwrap()
            .poll(Duration::from_millis(0), inbox.entry(3).or_default())
            .unwrap();
        i += 1;
    }
    assert!(held.is_some(), "the sink accepted the connection");
    let st = ts[&1].stats();
    assert!(st.dropped_full > 900, "dropped {}", st.dropped_full);
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&3).map_or(0, |v| v.len()) == 64 * 16
    });
}

#[test]
fn idle_connections_cannot_lock_a_peer_out() {
    let mut ts = cluster(2, |c| c.inbound_max = 4);
    let addr = ts[&2].local_addr().unwrap();
    // Eight idle sockets fill node 2's inbound slots twice over...
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut inbox = BTreeMap::new();
    for _ in 0..50 {
        ts.get_mut(&2)
            .unwrap()
            .poll(Duration::from_millis(1), inbox.entry(2).or_default())
            .unwrap();
    }
    // ...and node 1 still gets through.
    let m = append(1, 2, 5, 5);
    ts.get_mut(&1).unwrap().send(&m);
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.contains(&m))
    });
    drop(idle);
}

#[test]
fn a_message_larger_than_the_queue_cap_goes_out_alone() {
    // A snapshot can outgrow the per-peer queue; it must still reach a
    // lagging peer, one at a time.
    let cap = 64 << 10;
    let mut ts = cluster(2, |c| c.queue_bytes_max = cap);
    let big = append(1, 2, 7, 4 * cap);
    ts.get_mut(&1).unwrap().send(&big);
    let behind = append(1, 2, 8, 16);
    ts.get_mut(&1).unwrap().send(&behind);
    assert_eq!(
        ts[&1].stats().dropped_full,
        1,
        "nothing joins a queue past its cap"
    );
    let mut inbox = BTreeMap::new();
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| !v.is_empty())
    });
    assert_eq!(inbox[&2], [big]);
    let too_big = append(1, 2, 9, (64 << 20) + 1);
    ts.get_mut(&1).unwrap().send(&too_big);
    assert_eq!(
        ts[&1].stats().dropped_full,
        2,
        "past the frame limit it is dropped"
    );
}
