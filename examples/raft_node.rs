//! A replicated counter over gombus's Raft and its real TCP transport, so
//! a cluster can be started, killed and measured before the broker uses
//! the module. Three nodes on loopback:
//!
//! ```text
//! P=a=127.0.0.1:7001,b=127.0.0.1:7002,c=127.0.0.1:7003
//! cargo run --example raft_node -- -node-id=a -raft-addr=127.0.0.1:7001 -raft-peers=$P -data=/tmp/a -bootstrap -load=20
//! cargo run --example raft_node -- -node-id=b -raft-addr=127.0.0.1:7002 -raft-peers=$P -data=/tmp/b -bootstrap -load=20
//! cargo run --example raft_node -- -node-id=c -raft-addr=127.0.0.1:7003 -raft-peers=$P -data=/tmp/c -bootstrap -load=20
//! ```
//!
//! Flags share the broker's names (-node-id, -raft-addr, -raft-peers,
//! -bootstrap, -raft-log, -data), plus -load (increments proposed per
//! second while this node leads) and -status-ms. Every line on stdout
//! starts with the wall-clock time in ms: `role` lines on each role
//! change, `status` lines with the applied index and the counter.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gombus::cluster::raft::{self, Config, Raft};
use gombus::cluster::raft_log::{self, DurableLog, LogStore, MemoryLog, StateFile};
use gombus::cluster::raft_msg::{EntryKind, NodeId};
use gombus::cluster::raft_transport::{Transport, TransportConfig};
use gombus::config::{parse_addr, parse_peers, RaftLogKind};

struct Args {
    name: String,
    addr: std::net::SocketAddr,
    /// Member names, sorted: a member's NodeId is its position + 1.
    names: Vec<String>,
    peers: BTreeMap<NodeId, std::net::SocketAddr>,
    id: NodeId,
    data: PathBuf,
    bootstrap: bool,
    memory: bool,
    load: u64,
    status_ms: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut o = getopts::Options::new();
    o.long_only(true);
    o.optopt("", "node-id", "this node's name", "ID");
    o.optopt("", "raft-addr", "Raft listen address", "HOST:PORT");
    o.optopt("", "raft-peers", "every member, id=host:port,...", "LIST");
    o.optopt("", "data", "directory for the Raft state", "DIR");
    o.optopt("", "raft-log", "memory or durable", "KIND");
    o.optflag("", "bootstrap", "may start a new cluster");
    o.optopt("", "load", "increments per second while leading", "N");
    o.optopt("", "status-ms", "status line interval", "MS");
    let m = o
        .parse(std::env::args().skip(1))
        .map_err(|e| e.to_string())?;
    let need = |k: &str| m.opt_str(k).ok_or(format!("-{k} is required"));
    let name = need("node-id")?;
    let addr = parse_addr(&need("raft-addr")?)?;
    let list = parse_peers(&need("raft-peers")?)?;
    let mut names: Vec<String> = list.iter().map(|p| p.id.clone()).collect();
    names.sort();
    let id_of = |n: &str| names.iter().position(|x| x == n).map(|i| i as NodeId + 1);
    let id = id_of(&name).ok_or(format!("-node-id {name} is not in -raft-peers"))?;
    let peers = list
        .iter()
        .filter(|p| p.id != name)
        .filter_map(|p| Some((id_of(&p.id)?, p.addr)))
        .collect();
    let kind: RaftLogKind = m.opt_str("raft-log").unwrap_or("durable".into()).parse()?;
    let num = |k: &str, d: u64| {
        m.opt_str(k).map_or(Ok(d), |v| {
            v.parse().map_err(|_| format!("-{k}: not a number"))
        })
    };
    Ok(Args {
        name,
        addr,
        names,
        peers,
        id,
        data: PathBuf::from(m.opt_str("data").unwrap_or("./data".into())),
        bootstrap: m.opt_present("bootstrap"),
        memory: kind == RaftLogKind::Memory,
        load: num("load", 0)?,
        status_ms: num("status-ms", 1000)?,
    })
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The state machine: a counter and the index it has applied.
struct Counter {
    value: u64,
    applied: u64,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raft_node: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    let dir = a.data.join("raft");
    let mut state = StateFile::open(&dir).map_err(|e| e.to_string())?;
    let hs = state.load().map_err(|e| e.to_string())?;
    let mut log: Box<dyn LogStore> = if a.memory {
        Box::new(MemoryLog::new())
    } else {
        Box::new(DurableLog::open(&dir).map_err(|e| e.to_string())?)
    };
    let loaded = log.load().map_err(|e| e.to_string())?;
    let empty = loaded.snapshot.index == 0 && loaded.entries.is_empty();
    let mut cfg = Config::new(a.id, (1..=a.names.len() as NodeId).collect());
    cfg.voter = raft::starts_as_voter(a.bootstrap, a.memory, &hs, empty);
    cfg.seed = now_ms() as u64 ^ a.id;
    let mut fsm = Counter {
        value: decode_counter(&loaded.snapshot.data),
        applied: loaded.snapshot.index,
    };
    let mut node = Raft::new(cfg, hs, loaded.snapshot, loaded.entries);
    let tcfg = TransportConfig::new(a.id, a.addr, a.peers.clone());
    let mut net = Transport::bind(tcfg).map_err(|e| format!("bind {}: {e}", a.addr))?;
    println!(
        "{} start node {} id {} addr {} voter {}",
        now_ms(),
        a.name,
        a.id,
        a.addr,
        node.is_voter()
    );

    let tick = Duration::from_millis(raft::TICK_MS);
    let mut next_tick = Instant::now() + tick;
    let mut next_status = Instant::now();
    let mut next_propose = Instant::now();
    let mut inbox = Vec::new();
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        net.poll(wait, &mut inbox).map_err(|e| e.to_string())?;
        for m in inbox.drain(..) {
            node.step(m);
        }
        let now = Instant::now();
        if now >= next_tick {
            node.tick();
            next_tick += tick;
            if next_tick < now {
                next_tick = now + tick; // fell far behind: do not burst
            }
        }
        if a.load > 0 && node.role() == raft::Role::Leader {
            let every = Duration::from_micros(1_000_000 / a.load);
            while next_propose <= now {
                let _ = node.propose(b"incr".to_vec());
                next_propose += every;
            }
        } else {
            next_propose = now;
        }
        drive(&mut node, &mut state, log.as_mut(), &mut net, &mut fsm, &a)?;
        if now >= next_status {
            next_status = now + Duration::from_millis(a.status_ms);
            let s = node.status();
            println!(
                "{} status node {} term {} role {:?} applied {} counter {} commit {} sent {} dropped {}",
                now_ms(),
                a.name,
                s.term,
                s.role,
                fsm.applied,
                fsm.value,
                node.commit(),
                net.stats().sent,
                net.stats().dropped_full
            );
        }
    }
}

/// Persist, then send, then apply: the order Raft requires.
fn drive(
    node: &mut Raft,
    state: &mut StateFile,
    log: &mut dyn LogStore,
    net: &mut Transport,
    fsm: &mut Counter,
    a: &Args,
) -> Result<(), String> {
    loop {
        let ready = node.ready();
        if ready.is_empty() {
            return Ok(());
        }
        raft_log::persist(&ready, &mut |hs| state.save(hs), log).map_err(|e| e.to_string())?;
        let after = ready.persisted();
        for m in &after.messages {
            net.send(m);
        }
        if let Some(s) = &after.restore {
            fsm.value = decode_counter(&s.data);
            fsm.applied = s.index;
        }
        for e in &after.committed {
            if e.kind == EntryKind::Command && e.data == b"incr" {
                fsm.value += 1;
            }
            fsm.applied = e.index;
        }
        if let Some(s) = after.status {
            let leader = s
                .leader
                .and_then(|l| a.names.get(l as usize - 1))
                .map_or("none", |n| n.as_str());
            println!(
                "{} role node {} {:?} term {} leader {} voter {}",
                now_ms(),
                a.name,
                s.role,
                s.term,
                leader,
                s.voter
            );
        }
        if after.want_snapshot {
            node.compact(fsm.applied, fsm.value.to_le_bytes().to_vec());
        }
    }
}

fn decode_counter(b: &[u8]) -> u64 {
    b.get(..8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}
