//! A three-node cluster on a real network: each node in a network
//! namespace of its own with one address of `10.77.0.0/24` on a veth link,
//! the links joined by a bridge in a further namespace. Every namespace is
//! made by the test and named after its process, so two test processes
//! never share one. Clients run inside a node's namespace ([`NetCluster::on`],
//! [`NetCluster::spawn_on`]): a node cut off from the bridge keeps its own
//! clients. Faults are link changes: a node cut off from every peer
//! ([`Net::cut`], its bridge port down), packets from one node to another
//! dropped one way ([`Net::drop_one_way`], nftables in its namespace),
//! loss (nftables) and a slow link on one node ([`Net::impair`]: netem
//! delay with jitter where the kernel has netem, else a tbf rate limit). Dropping the [`NetCluster`] kills the brokers by PID
//! first, then deletes the namespaces (and with them every link), also when
//! the test panics. [`Net::create`] says why it cannot be used (not root,
//! no `ip` or `nft`, no namespaces) so the test can skip. A fourth
//! namespace ([`SPARE`], `10.77.0.4`) holds a node that joins the cluster
//! ([`NetCluster::join`]); its process is killed by PID when its
//! [`Joined`] is dropped.

#![allow(dead_code)] // Each test binary uses a different part of it.

pub mod history;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::cluster_support::{Cluster, Launch, IDS};

/// The nodes' addresses: `10.77.0.1` .. `10.77.0.3`, inside the test's
/// namespaces only.
pub const SUBNET: &str = "10.77.0";
/// The namespace (and address, `10.77.0.4`) of a node that joins.
pub const SPARE: usize = 3;
/// Every node listens on the same ports of its own address.
pub const HTTP_PORT: u16 = 4100;
pub const RAFT_PORT: u16 = 4200;
/// The prefix of every namespace these tests make; the owning test
/// process's PID follows it.
const NS_PREFIX: &str = "gbt";

static NEXT_NET: AtomicU64 = AtomicU64::new(0);

/// Node `i`'s address.
pub fn addr(i: usize) -> String {
    format!("{SUBNET}.{}", i + 1)
}

/// The namespaces and links of one test network.
pub struct Net {
    /// The bridge's namespace.
    bridge: String,
    /// Node `i`'s namespace.
    pub nodes: Vec<String>,
    /// The faults on node `i`'s link.
    shaped: Vec<LinkFaults>,
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `tc ARGS` inside namespace `ns`.
fn tc(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["netns", "exec", ns, "tc"];
    all.extend_from_slice(args);
    ip(&all)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|r| r.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Deletes namespaces of this harness left by a test process that no
/// longer runs (one killed before its guards ran).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Net {
    /// Makes the bridge namespace and one namespace per node, each linked
    /// to the bridge and up. `Err` says why it cannot be done here.
    pub fn create() -> Result<Net, String> {
        if !is_root() {
            return Err("network namespaces need root".into());
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Err("iproute2's `ip` is not installed".into());
        }
        if Command::new("nft").arg("-v").output().is_err() {
            return Err(
                "nftables' `nft` is not installed (scripts/test-deps.sh installs it)".into(),
            );
        }
        remove_stale();
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let base = format!("{NS_PREFIX}{}-{n}", std::process::id());
        let mut net = Net {
            bridge: format!("{base}-br"),
            nodes: Vec::new(),
            shaped: vec![LinkFaults::default(); SPARE + 1],
        };
        // From here on, Drop removes whatever was made.
        ip(&["netns", "add", &net.bridge])
            .map_err(|e| format!("cannot make a network namespace: {e}"))?;
        let br = net.bridge.clone();
        ip(&["-n", &br, "link", "set", "lo", "up"])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..=SPARE {
            let ns = format!("{base}-{}", IDS.get(i).unwrap_or(&"spare"));
            ip(&["netns", "add", &ns])?;
            net.nodes.push(ns.clone());
            let port = format!("v{}", i + 1);
            ip(&[
                "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &br, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &br, "link", "set", &port, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let cidr = format!("{}/24", addr(i));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }

    fn port(i: usize) -> String {
        format!("v{}", i + 1)
    }

    /// Cuts node `i` off from every peer (its bridge port down); its own
    /// clients still reach it.
    pub fn cut(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &Net::port(i), "down"]).expect("cut");
    }

    /// Undoes [`Net::cut`].
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &Net::port(i), "up"]).expect("heal");
    }

    /// Drops every packet node `from` sends to node `to`; `to`'s packets
    /// to `from` still arrive. Undone by [`Net::clear`] on `from`.
    pub fn drop_one_way(&mut self, from: usize, to: usize) {
        self.shaped[from].drops.push(to);
        self.apply_filter(from);
    }

    /// Loses `loss_pct` % of the packets on node `i`'s link, both ways
    /// (nftables), and slows the link: `delay_ms` ± `jitter_ms` of delay
    /// with netem where the kernel has it, else a `rate_kbit` token bucket
    /// (tbf) each way, whose queue delays what the link cannot carry at
    /// once. Undone by [`Net::clear`]; returns what was applied.
    pub fn impair(
        &mut self,
        i: usize,
        loss_pct: u32,
        delay_ms: u32,
        jitter_ms: u32,
        rate_kbit: u32,
    ) -> String {
        self.shaped[i].loss = loss_pct;
        self.apply_filter(i);
        let port = Net::port(i);
        let sides = [
            (self.nodes[i].clone(), "eth0"),
            (self.bridge.clone(), &port),
        ];
        let delay = format!("{delay_ms}ms");
        let jitter = format!("{jitter_ms}ms");
        let netem = sides.iter().all(|(ns, dev)| {
            tc(
                ns,
                &[
                    "qdisc", "add", "dev", dev, "root", "netem", "delay", &delay, &jitter,
                ],
            )
            .is_ok()
        });
        self.shaped[i].qdisc = true;
        if netem {
            return format!("{loss_pct}% loss, {delay_ms}±{jitter_ms}ms delay (netem)");
        }
        let rate = format!("{rate_kbit}kbit");
        for (ns, dev) in &sides {
            let _ = tc(ns, &["qdisc", "del", "dev", dev, "root"]);
            tc(
                ns,
                &[
                    "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst", "4kb",
                    "latency", "400ms",
                ],
            )
            .expect("tbf qdisc");
        }
        format!("{loss_pct}% loss, {rate_kbit} kbit/s each way (tbf; no netem in this kernel)")
    }

    /// Removes every fault [`Net::impair`] or [`Net::drop_one_way`] put on
    /// node `i`'s link.
    pub fn clear(&mut self, i: usize) {
        let was = std::mem::take(&mut self.shaped[i]);
        if was.qdisc {
            let _ = tc(&self.nodes[i], &["qdisc", "del", "dev", "eth0", "root"]);
            let _ = tc(
                &self.bridge,
                &["qdisc", "del", "dev", &Net::port(i), "root"],
            );
        }
        if was.loss > 0 || !was.drops.is_empty() {
            self.apply_filter(i);
        }
    }

    /// Writes node `i`'s nftables table (`gbfault`, in its namespace) from
    /// its faults: the one-way drops and the loss on `eth0`; traffic on
    /// `lo` (its own clients) is never touched.
    fn apply_filter(&self, i: usize) {
        let ns = &self.nodes[i];
        let _ = nft(ns, "delete table inet gbfault\n");
        let f = &self.shaped[i];
        if f.loss == 0 && f.drops.is_empty() {
            return;
        }
        let mut out = String::new();
        let mut input = String::new();
        for &to in &f.drops {
            out += &format!("    oifname \"eth0\" ip daddr {} drop\n", addr(to));
        }
        if f.loss > 0 {
            let rule = format!("numgen random mod 100 < {} drop\n", f.loss);
            out += &format!("    oifname \"eth0\" {rule}");
            input += &format!("    iifname \"eth0\" {rule}");
        }
        let script = format!(
            "table inet gbfault {{\n  chain out {{\n    type filter hook output priority 0;\n\
             {out}  }}\n  chain in {{\n    type filter hook input priority 0;\n{input}  }}\n}}\n"
        );
        nft(ns, &script).unwrap_or_else(|e| panic!("nft in {ns}: {e}\n{script}"));
    }
}

/// Runs `nft -f -` inside namespace `ns` with `script` on its stdin.
fn nft(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The faults on one node's link.
#[derive(Clone, Debug, Default)]
struct LinkFaults {
    /// Nodes whose packets from this node are dropped.
    drops: Vec<usize>,
    /// Percent of packets lost each way.
    loss: u32,
    /// A qdisc (netem or tbf) is on both sides of the link.
    qdisc: bool,
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links (and their peers).
        for ns in self.nodes.iter().chain(std::iter::once(&self.bridge)) {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("netns: {e}");
            }
        }
    }
}

extern "C" {
    fn setns(fd: c_int, nstype: c_int) -> c_int;
}
const CLONE_NEWNET: c_int = 0x4000_0000;

/// Moves the calling thread (and the threads it starts later) into the
/// network namespace `ns`.
pub fn enter(ns: &str) {
    let path = format!("/run/netns/{ns}");
    let f = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns only reads the descriptor, which `f` keeps open for the
    // call, and changes this thread's network namespace.
    let r = unsafe { setns(f.as_raw_fd(), CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// A [`Cluster`] whose nodes run in the namespaces of a [`Net`]. Field
/// order is drop order: the brokers die before their namespaces go.
pub struct NetCluster {
    pub c: Cluster,
    pub net: Net,
}

impl NetCluster {
    /// Makes the network and starts n1..n3 in it (every node `-bootstrap`,
    /// as [`Cluster::start`]), waiting until each listens; `Err` when the
    /// network cannot be made here.
    pub fn start() -> Result<NetCluster, String> {
        let net = Net::create()?;
        let http = (0..3).map(|i| format!("{}:{HTTP_PORT}", addr(i))).collect();
        let raft = (0..3).map(|i| format!("{}:{RAFT_PORT}", addr(i))).collect();
        let mut c = Cluster::prepare_at(Launch::Plain, http, raft);
        c.launcher = net.nodes[..SPARE]
            .iter()
            .map(|ns| {
                ["ip", "netns", "exec", ns]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            })
            .collect();
        let mut nc = NetCluster { c, net };
        nc.c.launch();
        Ok(nc)
    }

    /// Runs `f` on a thread inside node `i`'s namespace and returns what
    /// it returns (a panic in `f` is this caller's).
    pub fn on<T: Send>(&self, i: usize, f: impl FnOnce(&Cluster) -> T + Send) -> T {
        let ns = self.net.nodes[i].clone();
        let c = &self.c;
        thread::scope(|s| {
            s.spawn(move || {
                enter(&ns);
                f(c)
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Starts a thread inside node `i`'s namespace.
    pub fn spawn_on<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let ns = self.net.nodes[i].clone();
        thread::spawn(move || {
            enter(&ns);
            f()
        })
    }

    /// Polls until node `i` answers `/healthz` 200 (it knows a leader and
    /// has caught up), at most `within`.
    pub fn await_healthy(&self, i: usize, within: Duration) {
        self.on(i, |c| c.await_healthy(&[i], within));
    }

    /// The leader of stream `name`'s group as node `i` names it.
    pub fn stream_leader(&self, i: usize, name: &str) -> Option<usize> {
        self.on(i, |c| {
            crate::cluster_support::stream_group_leader(c, i, name)
        })
    }

    /// Polls until every node of `nodes` names the same leader of stream
    /// `name`'s group, one of `nodes`; None after `within`.
    pub fn agreed_stream_leader(
        &self,
        nodes: &[usize],
        name: &str,
        within: Duration,
    ) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            let seen: Vec<Option<usize>> =
                nodes.iter().map(|&i| self.stream_leader(i, name)).collect();
            if let Some(l) = seen[0].filter(|l| nodes.contains(l)) {
                if seen.iter().all(|s| *s == Some(l)) {
                    return Some(l);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a broker `name` in the [`SPARE`] namespace with `-join`,
    /// naming member `via` in `-cluster`, and waits (bounded) until it
    /// listens. Its data directory is new (under the cluster's root).
    pub fn join(&self, name: &str, via: usize) -> Joined {
        let bin = crate::cluster_support::broker_bin();
        let root = self.c.data_dir(0);
        let data = root.parent().unwrap_or(&root).join(name);
        let me = addr(SPARE);
        let (child, rx, _) = crate::cluster_support::support::spawn_logged(
            Command::new("ip")
                .args(["netns", "exec", &self.net.nodes[SPARE], &bin])
                .arg(format!("-node-id={name}"))
                .arg(format!("-addr={me}:{HTTP_PORT}"))
                .arg(format!("-raft-addr={me}:{RAFT_PORT}"))
                .arg("-join")
                .arg(format!(
                    "-cluster={}=http://{}:{HTTP_PORT}",
                    IDS[via],
                    addr(via)
                ))
                .arg(format!("-control-token={}", self.c.token()))
                .arg(format!("-data={}", data.display())),
            &bin,
            &Default::default(),
            0,
        );
        let joined = Joined {
            name: name.to_string(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("listening on ") => break,
                Ok(_) => {}
                Err(e) => panic!("{name} did not start listening: {e}"),
            }
        }
        // Its stderr is drained from here on, into nothing.
        drop(rx);
        joined
    }

    /// The control group's leader as node `i` names it.
    pub fn control_leader(&self, i: usize) -> Option<usize> {
        let status = self.on(i, |c| c.status(i)).ok()?;
        let id = status["leader"].as_str()?.to_string();
        IDS.iter().position(|n| *n == id)
    }
}

/// A broker started by [`NetCluster::join`]; dropping it kills it by PID.
pub struct Joined {
    pub name: String,
    child: Child,
}

impl Joined {
    /// The address members reach it at, as `cluster.add` takes it.
    pub fn add_args(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.name,
            "raft_addr": format!("{}:{RAFT_PORT}", addr(SPARE)),
            "addr": format!("{}:{HTTP_PORT}", addr(SPARE)),
        })
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
