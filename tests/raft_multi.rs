//! A thousand idle Raft groups on three nodes, each node one `Multi`
//! driven by one tick, the messages crossing as framed bytes: what an
//! idle group costs in CPU and on the wire. Prints the figures
//! (`cargo test --release --test raft_multi -- --nocapture`).

use std::collections::BTreeMap;
use std::time::Instant;

use gombus::cluster::raft::{AfterPersist, Config, Raft, Role, TICK_MS};
use gombus::cluster::raft_msg::{self, GroupId, HardState, Message, Snapshot};
use gombus::cluster::raft_multi::{self, Multi};
use gombus::storage::record;

struct Net {
    nodes: Vec<Multi>,
    wire: Vec<Message>,
    bytes: u64,
    messages: u64,
}

impl Net {
    fn new(groups: u64) -> Net {
        let members = vec![1, 2, 3];
        let nodes = members
            .iter()
            .map(|&id| {
                let mut m = Multi::new(id);
                for g in 1..=groups {
                    let mut cfg = Config::new(id, members.clone());
                    cfg.group = g;
                    cfg.seed = gombus::rand::splitmix64(&mut (g << 8 | id));
                    m.insert(
                        g,
                        Raft::new(cfg, HardState::default(), Snapshot::default(), vec![]),
                    );
                }
                m
            })
            .collect();
        Net {
            nodes,
            wire: Vec::new(),
            bytes: 0,
            messages: 0,
        }
    }

    fn drain(&mut self) {
        loop {
            let mut any = false;
            for n in &mut self.nodes {
                let mut after: Vec<(GroupId, AfterPersist)> = n
                    .ready()
                    .into_iter()
                    .map(|(g, r)| (g, r.persisted()))
                    .collect();
                any |= !after.is_empty();
                self.wire.extend(raft_multi::outgoing(&mut after));
            }
            if !any {
                return;
            }
        }
    }

    fn tick(&mut self) {
        for n in &mut self.nodes {
            n.tick();
        }
        self.drain();
        while !self.wire.is_empty() {
            for m in std::mem::take(&mut self.wire) {
                let mut frame = Vec::new();
                let start = record::begin(&mut frame);
                raft_msg::encode(&mut frame, &m);
                record::finish(&mut frame, start);
                self.bytes += frame.len() as u64;
                self.messages += 1;
                let back = raft_msg::decode(&frame[record::HEAD_BYTES..]).unwrap();
                self.nodes[(back.to - 1) as usize].step(back);
            }
            self.drain();
        }
    }

    fn leaders(&self) -> usize {
        let mut led = BTreeMap::new();
        for n in &self.nodes {
            for (g, r) in n.groups() {
                if r.role() == Role::Leader {
                    *led.entry(g).or_insert(0) += 1;
                }
            }
        }
        assert!(led.values().all(|&k| k == 1), "one leader per group");
        led.len()
    }
}

#[test]
fn figures_idle_group_cost() {
    let groups = 1_000u64;
    let mut net = Net::new(groups);
    let mut ticks = 0;
    while net.leaders() < groups as usize {
        net.tick();
        ticks += 1;
        assert!(ticks < 400, "every group elects within 20 s");
    }
    for _ in 0..4 {
        net.tick();
    }
    let secs = 5;
    let (bytes0, messages0) = (net.bytes, net.messages);
    let started = Instant::now();
    for _ in 0..secs * 1_000 / TICK_MS {
        net.tick();
    }
    let cpu = started.elapsed();
    let bytes = net.bytes - bytes0;
    let messages = net.messages - messages0;
    assert_eq!(net.leaders(), groups as usize, "no election while idle");
    // Three nodes, six ordered pairs: at most a Beats and a BeatsResp
    // per pair and tick, whatever the number of groups.
    let ticks = secs * 1_000 / TICK_MS;
    assert!(
        messages <= 6 * 2 * ticks,
        "{messages} messages in {ticks} ticks"
    );
    let per_group_pair = bytes as f64 / secs as f64 / groups as f64 / 6.0;
    let us_per_group_s = cpu.as_secs_f64() * 1e6 / secs as f64 / groups as f64 / 3.0;
    println!(
        "{groups} idle groups on 3 nodes: {messages} messages in {secs} s, \
         {:.0} B/s per ordered node pair ({per_group_pair:.1} B/s per group), \
         {us_per_group_s:.2} µs of CPU per group and node per second \
         (ticks, beats, codec and steps; {} build)",
        bytes as f64 / secs as f64 / 6.0,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    // Ids above 127 take two bytes: 8 bytes a group a pair and round at
    // most, plus the carrying messages.
    assert!(per_group_pair < 80.0, "{per_group_pair} B/s per group");
}
