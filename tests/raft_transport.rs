//! The Raft transport over loopback: messages arrive whole and in order
//! (including a large one, and one written a byte at a time), a flush
//! writes without waiting for a poll, a corrupt frame closes only its
//! connection, a restarted peer is reconnected, and a peer that stops
//! reading costs a bounded queue, not memory. With a
//! cluster secret: members that share it talk, one with another secret is
//! sent nothing, a proven connection speaks only for its own node, and
//! strangers' connections neither push members out nor stay past their
//! time.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use std::io::Read;

use gombus::cluster::raft_auth::{self, ClusterKey, Frame, Role, Transcript};
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
        group: 0,
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
        group: 0,
        from: 1,
        to: 3,
        term: 3,
        body: Body::HeartbeatResp {
            read_seq: 9,
            epoch: 1,
        },
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

/// `flush_all` writes what is queued there and then: a leader's Appends
/// leave before its fsync, not at its next poll.
#[test]
fn flush_all_writes_the_queues_without_a_poll() {
    let mut ts = cluster(2, |_| {});
    let mut inbox = BTreeMap::new();
    // Connected (and the first frame through) by polling both.
    ts.get_mut(&1).unwrap().send(&append(1, 2, 0, 10));
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.len() == 1)
    });
    let m = append(1, 2, 1, 4096);
    let t1 = ts.get_mut(&1).unwrap();
    t1.send(&m);
    assert!(t1.queued_bytes(2) > 0);
    t1.flush_all();
    assert_eq!(t1.queued_bytes(2), 0);
    // Only node 2 polls from now on.
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = inbox.entry(2).or_default();
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "the flushed frame never came");
        ts.get_mut(&2)
            .unwrap()
            .poll(Duration::from_millis(1), got)
            .unwrap();
    }
    assert_eq!(got[1], m);
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

fn with_secret(secret: &[u8]) -> impl Fn(&mut TransportConfig) + '_ {
    move |c: &mut TransportConfig| c.secret = Some(ClusterKey::new(secret))
}

/// Polls every transport once, briefly.
fn turn(ts: &mut BTreeMap<NodeId, Transport>, inbox: &mut BTreeMap<NodeId, Vec<Message>>) {
    for (id, t) in ts.iter_mut() {
        t.poll(Duration::from_millis(1), inbox.entry(*id).or_default())
            .unwrap();
    }
}

#[test]
fn members_sharing_the_secret_prove_themselves_and_talk() {
    let mut ts = cluster(3, with_secret(b"s3cret"));
    let msgs: Vec<Message> = (0..50).map(|i| append(1, 2, i, 100)).collect();
    for m in &msgs {
        ts.get_mut(&1).unwrap().send(m);
    }
    let back = append(3, 1, 7, 10);
    ts.get_mut(&3).unwrap().send(&back);
    let mut inbox = BTreeMap::new();
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).map_or(0, |v| v.len()) == 50 && ib.get(&1).map_or(0, |v| v.len()) == 1
    });
    assert_eq!(inbox[&2], msgs);
    assert_eq!(inbox[&1], [back]);
    assert!(ts[&1].is_connected(2));
    assert!(ts[&2].stats().handshakes >= 1);
    assert_eq!(ts[&2].stats().refused_proof, 0);
}

#[test]
fn a_member_with_another_secret_is_sent_nothing_and_heard_from_never() {
    let mut ts = cluster(2, with_secret(b"right"));
    let addr1 = ts[&1].local_addr().unwrap();
    let addr2 = ts[&2].local_addr().unwrap();
    // Node 2 comes back with another secret on the same address.
    ts.remove(&2);
    let mut cfg = TransportConfig::new(2, addr2, [(1, addr1)].into());
    cfg.secret = Some(ClusterKey::new(b"wrong"));
    cfg.backoff_max = Duration::from_millis(100);
    ts.insert(2, Transport::bind(cfg).unwrap());
    ts.get_mut(&1).unwrap().send(&append(1, 2, 1, 10));
    ts.get_mut(&2).unwrap().send(&append(2, 1, 1, 10));
    let mut inbox = BTreeMap::new();
    // Both dial, both find the other's proof does not verify.
    pump(&mut ts, &mut inbox, |_, ts| {
        ts[&1].stats().refused_proof >= 2 && ts[&2].stats().refused_proof >= 2
    });
    assert!(inbox.values().all(Vec::is_empty), "{inbox:?}");
    assert!(!ts[&1].is_connected(2) && !ts[&2].is_connected(1));
    assert_eq!(ts[&1].stats().handshakes, 0);
    // Nothing left the queues: a peer that has not proven itself is
    // written nothing.
    assert!(ts[&1].queued_bytes(2) > 0 && ts[&2].queued_bytes(1) > 0);
}

/// Reads exactly `buf.len()` bytes from `s` while the transports run.
fn read_polling(
    s: &mut TcpStream,
    buf: &mut [u8],
    ts: &mut BTreeMap<NodeId, Transport>,
    inbox: &mut BTreeMap<NodeId, Vec<Message>>,
) {
    s.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut at = 0;
    while at < buf.len() {
        assert!(Instant::now() < deadline, "no answer from the transport");
        turn(ts, inbox);
        match s.read(&mut buf[at..]) {
            Ok(0) => panic!("closed by the transport"),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
}

/// Dials node `acceptor` and runs the dialer's side of the handshake as
/// node `dialer`; returns the proven stream.
fn handshake(
    ts: &mut BTreeMap<NodeId, Transport>,
    inbox: &mut BTreeMap<NodeId, Vec<Message>>,
    key: &ClusterKey,
    dialer: NodeId,
    acceptor: NodeId,
) -> TcpStream {
    let mut s = TcpStream::connect(ts[&acceptor].local_addr().unwrap()).unwrap();
    let nonce = [7u8; raft_auth::NONCE_BYTES];
    let mut out = Vec::new();
    raft_auth::encode_dialer_hello(&mut out, dialer, acceptor, &nonce);
    s.write_all(&out).unwrap();
    let mut answer = vec![0u8; raft_auth::framed(raft_auth::ACCEPTOR_HELLO_BYTES)];
    read_polling(&mut s, &mut answer, ts, inbox);
    let Ok(Some(Frame::AcceptorHello {
        nonce: theirs,
        proof,
        ..
    })) = raft_auth::read_frame(&answer, raft_auth::ACCEPTOR_HELLO_BYTES)
    else {
        panic!("no acceptor hello");
    };
    let tr = Transcript {
        dialer,
        acceptor,
        dialer_nonce: nonce,
        acceptor_nonce: theirs,
    };
    assert!(raft_auth::check(key, Role::Acceptor, &tr, &proof));
    out.clear();
    raft_auth::encode_dialer_proof(&mut out, &raft_auth::proof(key, Role::Dialer, &tr));
    s.write_all(&out).unwrap();
    s
}

fn frame(m: &Message) -> Vec<u8> {
    let mut body = Vec::new();
    raft_msg::encode(&mut body, m);
    let mut out = Vec::new();
    record::encode(&mut out, &body);
    out
}

#[test]
fn a_proven_connection_speaks_only_for_its_own_node() {
    let key = ClusterKey::new(b"s3cret");
    let mut ts = cluster(3, with_secret(b"s3cret"));
    // This test speaks for node 3 (a node's newest proven connection
    // replaces its older one).
    ts.remove(&3);
    let mut inbox = BTreeMap::new();
    let mut s = handshake(&mut ts, &mut inbox, &key, 3, 2);
    let forged = append(1, 2, 9, 4);
    let own = append(3, 2, 10, 4);
    s.write_all(&frame(&forged)).unwrap();
    s.write_all(&frame(&own)).unwrap();
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.contains(&own))
    });
    assert!(!inbox[&2].contains(&forged));
    assert_eq!(ts[&2].stats().rejected_sender, 1);
}

#[test]
fn a_raft_frame_without_a_handshake_is_refused_and_closed() {
    let mut ts = cluster(2, with_secret(b"s3cret"));
    let addr = ts[&2].local_addr().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let m = Message {
        group: 0,
        from: 1,
        to: 2,
        term: 1000,
        body: Body::Heartbeat {
            commit: 0,
            commit_term: 0,
            read_seq: 0,
        },
    };
    s.write_all(&frame(&m)).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut inbox = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut b = [0u8; 16];
    loop {
        turn(&mut ts, &mut inbox);
        match s.read(&mut b) {
            Ok(0) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
            Ok(n) => panic!("the transport wrote {n} bytes to a stranger"),
        }
        assert!(Instant::now() < deadline, "the connection stayed open");
    }
    assert!(inbox.get(&2).is_none_or(Vec::is_empty));
    assert_eq!(ts[&2].stats().refused_hello, 1);
}

#[test]
fn strangers_cannot_push_a_member_out_and_leave_after_the_timeout() {
    let mut ts = cluster(2, |c| {
        with_secret(b"s3cret")(c);
        c.inbound_max = 4;
        c.handshake_timeout = Duration::from_millis(300);
    });
    let addr = ts[&2].local_addr().unwrap();
    let mut inbox = BTreeMap::new();
    ts.get_mut(&1).unwrap().send(&append(1, 2, 1, 5));
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.len() == 1)
    });
    // Twenty idle sockets, ten that send a hello and stall, five garbage.
    let mut strangers: Vec<TcpStream> =
        (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for _ in 0..10 {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut out = Vec::new();
        raft_auth::encode_dialer_hello(&mut out, 1, 2, &[1; raft_auth::NONCE_BYTES]);
        s.write_all(&out).unwrap();
        strangers.push(s);
    }
    for _ in 0..5 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&[0xff; 64]).unwrap();
        strangers.push(s);
    }
    // Every stranger is taken and dealt with (closed to make room,
    // refused, or waiting), and never more than four wait at once.
    let dealt = |ts: &BTreeMap<NodeId, Transport>| {
        let st = ts[&2].stats();
        st.evicted + st.refused_hello + ts[&2].unbound_inbound() as u64
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while dealt(&ts) < 35 {
        assert!(Instant::now() < deadline, "{:?}", ts[&2].stats());
        turn(&mut ts, &mut inbox);
        assert!(ts[&2].unbound_inbound() <= 4);
    }
    // The member's connection was never touched: its messages still come.
    let m = append(1, 2, 2, 5);
    ts.get_mut(&1).unwrap().send(&m);
    pump(&mut ts, &mut inbox, |ib, _| {
        ib.get(&2).is_some_and(|v| v.contains(&m))
    });
    assert_eq!(ts[&1].stats().connects, 1, "node 1 never had to reconnect");
    let st = ts[&2].stats();
    assert!(st.evicted >= 20, "{st:?}");
    // A silent stranger and one that stalls after its hello are closed
    // once their time is up.
    let timeouts = ts[&2].stats().refused_timeout;
    let quiet = TcpStream::connect(addr).unwrap();
    let mut stalled = TcpStream::connect(addr).unwrap();
    let mut out = Vec::new();
    raft_auth::encode_dialer_hello(&mut out, 1, 2, &[2; raft_auth::NONCE_BYTES]);
    stalled.write_all(&out).unwrap();
    pump(&mut ts, &mut inbox, |_, ts| {
        ts[&2].stats().refused_timeout >= timeouts + 2 && ts[&2].unbound_inbound() == 0
    });
    drop((strangers, quiet, stalled));
}

/// A snapshot kept in a file, far larger than a frame may be, goes out in
/// pieces that follow each other, then the message naming it; a heartbeat
/// sent meanwhile is not stuck behind the whole file; the same snapshot
/// asked again while it is on its way is not sent twice.
#[test]
fn a_snapshot_file_goes_out_in_pieces_then_its_message() {
    let frame_max = 1 << 20;
    let mut ts = cluster(2, |c| c.frame_bytes_max = frame_max);
    let size: u64 = 20 << 20;
    let path = std::env::temp_dir().join(format!("gombus-transport-snap-{}", std::process::id()));
    let bytes: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let named = Message {
        group: 7,
        from: 1,
        to: 2,
        term: 4,
        body: Body::Snapshot {
            snapshot: raft_msg::Snapshot {
                index: 90,
                term: 3,
                data: b"names the file".to_vec(),
            },
        },
    };
    let open = || std::fs::File::open(&path).unwrap();
    ts.get_mut(&1)
        .unwrap()
        .send_snapshot_file(&named, open(), size);
    ts.get_mut(&1)
        .unwrap()
        .send_snapshot_file(&named, open(), size);
    let beat = Message {
        group: 0,
        from: 1,
        to: 2,
        term: 4,
        body: Body::HeartbeatResp {
            read_seq: 3,
            epoch: 1,
        },
    };
    let mut inbox = BTreeMap::new();
    let mut beat_after = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !inbox
        .get(&2)
        .is_some_and(|v: &Vec<Message>| v.last() == Some(&named))
    {
        assert!(Instant::now() < deadline, "the snapshot did not arrive");
        for (id, t) in ts.iter_mut() {
            t.poll(Duration::from_millis(1), inbox.entry(*id).or_default())
                .unwrap();
        }
        let got = inbox.get(&2).map_or(0, |v| v.len());
        if beat_after.is_none() && got > 0 {
            ts.get_mut(&1).unwrap().send(&beat);
            beat_after = Some(got);
        }
    }
    let _ = std::fs::remove_file(&path);
    let got = &inbox[&2];
    let mut file = Vec::new();
    let mut beat_at = None;
    for (k, m) in got.iter().enumerate() {
        match &m.body {
            Body::SnapshotChunk {
                index,
                snap_term,
                offset,
                total,
                data,
            } => {
                assert_eq!((m.group, *index, *snap_term, *total), (7, 90, 3, size));
                assert_eq!(*offset, file.len() as u64, "pieces follow each other");
                assert!(data.len() < frame_max);
                file.extend_from_slice(data);
            }
            Body::HeartbeatResp { .. } => beat_at = Some(k),
            _ => assert_eq!(m, &named),
        }
    }
    assert!(file == bytes, "the pieces make the file");
    assert_eq!(got.iter().filter(|m| **m == named).count(), 1, "sent once");
    let beat_at = beat_at.expect("the heartbeat arrived");
    assert!(
        beat_at < got.len() / 2,
        "the heartbeat waited for {beat_at} of {} frames",
        got.len()
    );
}
