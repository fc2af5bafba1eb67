//! Command-line configuration of the broker.
//!
//! This module owns every flag the `broker` binary understands and what it
//! produces: the [`Config`] with its defaults, the public entry points
//! ([`parse`], [`parse_with_env`], [`usage`]) and the value syntaxes other
//! code shares (sizes, durations, addresses, node ids, peer lists).
//!
//! Files: `flags.rs` (the flag table, parsing, usage, GOMBUS_* variables),
//! `values.rs` (value syntaxes), `launch.rs` (`-cluster` and member
//! addresses), `validate.rs` (every bound and cross-flag rule).
//!
//! Flags follow the Go convention: a single dash is enough (`-addr=:8080`),
//! though `--addr=:8080`, `-addr :8080` and `--addr :8080` work too. Boolean
//! flags are written `-bootstrap`, `-bootstrap=true` or `-bootstrap=false`.
//!
//! Nothing here touches the network or the disk apart from reading the host
//! name for the default node id.

mod flags;
mod launch;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use crate::storage::sync::{parse_policy, SyncPolicy};
pub use flags::{env_var_name, parse, parse_with_env, usage};
pub use launch::{parse_cluster, parse_member_addr};
pub use values::{
    format_duration, format_size, parse_addr, parse_bytes, parse_duration, parse_peers, parse_size,
    validate_node_id,
};

use values::{GIB, KIB, MIB};

/// Default `-max-payload`: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = MIB as usize;
/// Largest accepted `-max-payload`: 64 MiB.
pub const MAX_MAX_PAYLOAD: usize = (64 * MIB) as usize;
/// Default `-max-pending`: 64 MiB.
pub const DEFAULT_MAX_PENDING: usize = (64 * MIB) as usize;
/// Smallest accepted `-max-pending`: 64 KiB.
pub const MIN_MAX_PENDING: usize = (64 * KIB) as usize;
/// Largest accepted `-max-pending`: 4 GiB (or the address space, if smaller).
pub const MAX_MAX_PENDING: u64 = 4 * GIB;
/// Default `-max-pending-total`: 1 GiB, or `-max-pending` if that is larger
/// (one connection may always queue up to its own bound).
pub const DEFAULT_MAX_PENDING_TOTAL: usize = GIB as usize;
/// Largest accepted `-max-pending-total`: 1024 GiB.
pub const MAX_MAX_PENDING_TOTAL: u64 = 1024 * GIB;
/// Shortest accepted ping interval, ping timeout or connect timeout.
pub const MIN_TIMER: Duration = Duration::from_millis(10);
/// Longest accepted ping interval, ping timeout or connect timeout.
pub const MAX_TIMER: Duration = Duration::from_secs(3600);
/// Default `-segment-size`.
pub const DEFAULT_SEGMENT_SIZE: usize = 64 << 20;
/// Smallest accepted `-segment-size`.
pub const SEGMENT_SIZE_MIN: usize = 4 << 10;
/// Largest accepted `-segment-size` (the store's offsets are 32-bit).
pub const SEGMENT_SIZE_MAX: usize = 1 << 30;

/// Longest accepted node id.
pub const MAX_NODE_ID_LEN: usize = 64;
/// Node id used when the host name is unreadable or not a valid node id.
pub const FALLBACK_NODE_ID: &str = "gombus";

/// The broker's version, as `-version` prints it after `broker `.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything the broker needs to know before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `-addr`: HTTP / Socket.IO listen address.
    pub addr: SocketAddr,
    /// `-node-id`: this node's name, 1..=64 chars of `[A-Za-z0-9._-]`.
    pub node_id: String,
    /// `-data`: directory for durable state.
    pub data_dir: PathBuf,
    /// `-control-token`: token for the control namespace; `None` when unset.
    pub control_token: Option<String>,
    /// `-auth-token`: token protecting the `/` namespace; `None` when unset.
    pub auth_token: Option<String>,
    /// `-users`: the users file naming each client's token and rights
    /// (docs/PROTOCOL.md §11); `None` when unset.
    pub users: Option<PathBuf>,
    /// `-cluster-token`: the secret cluster members share; `None` when
    /// unset (then [`Config::cluster_secret`] is `-control-token`).
    pub cluster_token: Option<String>,
    /// `-max-payload`: largest accepted message payload, in bytes.
    pub max_payload: usize,
    /// `-max-pending`: per-connection outbound buffer limit, in bytes.
    pub max_pending: usize,
    /// `-max-pending-total`: outbound bytes queued across all connections;
    /// `None` for the default (see [`Config::pending_total`]).
    pub max_pending_total: Option<usize>,
    /// `-ping-interval`: Engine.IO ping interval.
    pub ping_interval: Duration,
    /// `-ping-timeout`: how long a pong may take.
    pub ping_timeout: Duration,
    /// `-connect-timeout`: the Socket.IO CONNECT must arrive within it.
    pub connect_timeout: Duration,
    /// `-allow-eio3`: accept Engine.IO v3 clients.
    pub allow_eio3: bool,
    /// `-cors-origin`: value for CORS responses; `None` when unset.
    pub cors_origin: Option<String>,
    /// `-log-level`: least severe level that is logged.
    pub log_level: LogLevel,
    /// `-raft-addr`: this node's Raft address.
    pub raft_addr: Option<SocketAddr>,
    /// `-raft-peers`: the Raft members, `id=host:port` each.
    pub raft_peers: Vec<Peer>,
    /// `-cluster`: the other nodes' HTTP addresses (from either form of
    /// the flag, this node's own entry left out).
    pub cluster: Vec<SocketAddr>,
    /// `-cluster` in its `id=URL` form: each named node's HTTP address,
    /// this node's own entry included (empty for the `host:port` form).
    pub cluster_ids: BTreeMap<String, SocketAddr>,
    /// `-bootstrap`: form a new cluster from `raft_peers` (or alone).
    pub bootstrap: bool,
    /// `-join`: start with an empty log and wait to be added to the
    /// running cluster `-cluster` names (with `cluster.add`).
    pub join: bool,
    /// `-raft-log`: where the Raft log lives.
    pub raft_log: RaftLogKind,
    /// `-sync`: when stream writes are fsynced (what an ack promises).
    pub sync: SyncPolicy,
    /// `-segment-size`: a stream segment file rolls at this size, in bytes.
    pub segment_size: usize,
}

/// One Raft member: its node id and Raft address.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub id: String,
    pub addr: SocketAddr,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.id, self.addr)
    }
}

/// Logging verbosity, ordered from least to most verbose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    /// The flag spelling of this level.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(LogLevel::Error),
            "warn" | "warning" => Ok(LogLevel::Warn),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            _ => Err(format!(
                "{s:?} is not a log level (use error, warn, info or debug)"
            )),
        }
    }
}

/// Where the Raft log is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftLogKind {
    /// In memory only; lost on restart.
    Memory,
    /// On disk under the data directory.
    Durable,
}

impl RaftLogKind {
    /// The flag spelling of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            RaftLogKind::Memory => "memory",
            RaftLogKind::Durable => "durable",
        }
    }
}

impl fmt::Display for RaftLogKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RaftLogKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "memory" => Ok(RaftLogKind::Memory),
            "durable" => Ok(RaftLogKind::Durable),
            _ => Err(format!(
                "{s:?} is not a raft log kind (use memory or durable)"
            )),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8080),
            node_id: default_node_id(),
            data_dir: PathBuf::from("./data"),
            control_token: None,
            auth_token: None,
            users: None,
            cluster_token: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_pending: DEFAULT_MAX_PENDING,
            max_pending_total: None,
            ping_interval: Duration::from_secs(25),
            ping_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(45),
            allow_eio3: true,
            cors_origin: None,
            log_level: LogLevel::Info,
            raft_addr: None,
            raft_peers: Vec::new(),
            cluster: Vec::new(),
            cluster_ids: BTreeMap::new(),
            bootstrap: false,
            join: false,
            raft_log: RaftLogKind::Durable,
            sync: SyncPolicy::Always,
            segment_size: DEFAULT_SEGMENT_SIZE,
        }
    }
}

/// Why [`parse`] did not produce a [`Config`].
#[derive(Debug, PartialEq)]
pub enum ConfigError {
    /// Help or the version was asked for; carries the text to print
    /// (the full usage text, or `broker VERSION`).
    Help(String),
    /// The command line is wrong; carries a message naming the flag and value.
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Help(text) => f.write_str(text),
            ConfigError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ConfigError {}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

impl Config {
    /// The outbound budget across all connections: `-max-pending-total`,
    /// else 1 GiB or `-max-pending` if that is larger.
    pub fn pending_total(&self) -> usize {
        self.max_pending_total
            .unwrap_or(DEFAULT_MAX_PENDING_TOTAL.max(self.max_pending))
    }

    /// The secret cluster members share: `-cluster-token`, else
    /// `-control-token`; `None` when neither is set.
    pub fn cluster_secret(&self) -> Option<&str> {
        self.cluster_token
            .as_deref()
            .or(self.control_token.as_deref())
    }

    /// One line with every setting; tokens appear only as `set` / `unset`
    /// (the cluster token also as `control-token` when it defaults to it).
    pub fn summary(&self) -> String {
        let secret = |t: &Option<String>| if t.is_some() { "set" } else { "unset" };
        let peers = if self.raft_peers.is_empty() {
            "none".to_string()
        } else {
            join(self.raft_peers.iter())
        };
        let cluster = if self.cluster.is_empty() {
            "none".to_string()
        } else {
            join(self.cluster.iter())
        };
        format!(
            "node_id={} addr={} data={} control_token={} auth_token={} cluster_token={} \
             max_payload={} max_pending={} max_pending_total={} ping_interval={} ping_timeout={} \
             connect_timeout={} allow_eio3={} cors_origin={} log_level={} \
             raft_addr={} raft_peers={} cluster={} bootstrap={} raft_log={} \
             sync={} segment_size={} users={}",
            self.node_id,
            self.addr,
            self.data_dir.display(),
            secret(&self.control_token),
            secret(&self.auth_token),
            match (&self.cluster_token, &self.control_token) {
                (Some(_), _) => "set",
                (None, Some(_)) => "control-token",
                (None, None) => "unset",
            },
            format_size(self.max_payload),
            format_size(self.max_pending),
            format_size(self.pending_total()),
            format_duration(self.ping_interval),
            format_duration(self.ping_timeout),
            format_duration(self.connect_timeout),
            self.allow_eio3,
            self.cors_origin.as_deref().unwrap_or("none"),
            self.log_level,
            self.raft_addr
                .map_or_else(|| "none".to_string(), |a| a.to_string()),
            peers,
            cluster,
            self.bootstrap,
            self.raft_log,
            self.sync,
            format_size(self.segment_size),
            self.users
                .as_ref()
                .map_or("unset".to_string(), |p| p.display().to_string()),
        )
    }
}

fn join<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// The node id the broker uses when `-node-id` is not given: the host name if
/// it is a valid node id, otherwise [`FALLBACK_NODE_ID`].
pub fn default_node_id() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_string())
        .find(|name| validate_node_id(name).is_ok())
        .unwrap_or_else(|| FALLBACK_NODE_ID.to_string())
}

/// Command lines in, a [`Config`] or the message out: what the files'
/// tests share.
#[cfg(test)]
mod testing {
    use super::{parse, Config, ConfigError};
    use std::net::SocketAddr;

    pub fn argv(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    pub fn ok(list: &[&str]) -> Config {
        match parse(argv(list)) {
            Ok(cfg) => cfg,
            Err(e) => panic!("{list:?} should parse, got {e:?}"),
        }
    }

    pub fn bad(list: &[&str]) -> String {
        match parse(argv(list)) {
            Err(ConfigError::Invalid(msg)) => msg,
            other => panic!("{list:?} should be invalid, got {other:?}"),
        }
    }

    pub fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{argv, bad, ok, sock};
    use super::*;

    #[test]
    fn defaults() {
        let cfg = ok(&[]);
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.addr, sock("0.0.0.0:8080"));
        assert_eq!(cfg.node_id, default_node_id());
        assert!(validate_node_id(&cfg.node_id).is_ok());
        assert_eq!(cfg.data_dir, PathBuf::from("./data"));
        assert_eq!(cfg.control_token, None);
        assert_eq!(cfg.auth_token, None);
        assert_eq!(cfg.max_payload, 1_048_576);
        assert_eq!(cfg.max_pending, 64 * 1_048_576);
        assert_eq!(cfg.ping_interval, Duration::from_secs(25));
        assert_eq!(cfg.ping_timeout, Duration::from_secs(20));
        assert_eq!(cfg.connect_timeout, Duration::from_secs(45));
        assert!(cfg.allow_eio3);
        assert_eq!(cfg.cors_origin, None);
        assert_eq!(cfg.log_level, LogLevel::Info);
        assert_eq!(cfg.raft_addr, None);
        assert!(cfg.raft_peers.is_empty());
        assert!(cfg.cluster.is_empty());
        assert!(!cfg.bootstrap);
        assert_eq!(cfg.raft_log, RaftLogKind::Durable);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn pending_total_defaults_and_bounds() {
        let cfg = ok(&[]);
        assert_eq!(cfg.max_pending_total, None);
        assert_eq!(cfg.pending_total(), 1 << 30);
        assert!(
            cfg.summary().contains("max_pending_total=1GiB"),
            "{}",
            cfg.summary()
        );
        // The default never falls below the per-connection bound.
        if usize::BITS >= 64 {
            assert_eq!(ok(&["-max-pending=2GiB"]).pending_total(), 2 << 30);
        }
        let cfg = ok(&["-max-pending=1MiB", "-max-pending-total=8MiB"]);
        assert_eq!(cfg.pending_total(), 8 << 20);
        assert_eq!(ok(&["-max-pending-total=64MiB"]).pending_total(), 64 << 20);
        let e = bad(&["-max-pending-total=63MiB"]);
        assert!(
            e.starts_with("-max-pending-total: ") && e.contains("out of range"),
            "{e}"
        );
        assert!(bad(&["-max-pending-total=lots"]).starts_with("-max-pending-total: "));
        if usize::BITS >= 64 {
            assert!(bad(&["-max-pending-total=1025GiB"]).contains("out of range"));
        }
        assert!(usage().contains("-max-pending-total size"));
        let env = |name: &str| (name == "GOMBUS_MAX_PENDING_TOTAL").then(|| "2GiB".to_string());
        let cfg = parse_with_env(argv(&[]), env).unwrap();
        assert_eq!(cfg.pending_total(), 2 << 30);
    }

    #[test]
    fn summary_hides_secrets() {
        let cfg = ok(&[
            "-node-id=n1",
            "-control-token=topsecret",
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=n1=127.0.0.1:7001,n2=127.0.0.1:7002",
            "-cluster=127.0.0.1:8002",
        ]);
        let line = cfg.summary();
        assert!(!line.contains('\n'));
        assert!(!line.contains("topsecret"));
        assert!(line.contains("control_token=set"));
        assert!(line.contains("auth_token=unset"));
        assert!(line.contains("node_id=n1"));
        assert!(line.contains("max_payload=1MiB"));
        assert!(line.contains("ping_interval=25s"));
        assert!(line.contains("raft_peers=n1=127.0.0.1:7001,n2=127.0.0.1:7002"));
        assert!(line.contains("cluster=127.0.0.1:8002"));
        assert!(line.contains("raft_log=durable"));
        assert!(line.contains("sync=always segment_size=64MiB"));
    }

    #[test]
    fn cluster_token_defaults_to_the_control_token_and_is_never_shown() {
        let cfg = ok(&["-control-token=ctl"]);
        assert_eq!(cfg.cluster_token, None);
        assert_eq!(cfg.cluster_secret(), Some("ctl"));
        assert!(cfg.summary().contains("cluster_token=control-token"));
        let cfg = ok(&["-control-token=ctl", "-cluster-token=peers-only"]);
        assert_eq!(cfg.cluster_secret(), Some("peers-only"));
        assert!(cfg.summary().contains("cluster_token=set"));
        assert!(!cfg.summary().contains("peers-only"));
        let cfg = ok(&["-cluster-token="]);
        assert_eq!(cfg.cluster_secret(), None);
        assert!(cfg.summary().contains("cluster_token=unset"));
        let env = |name: &str| (name == "GOMBUS_CLUSTER_TOKEN").then(|| "from-env".to_string());
        let cfg = parse_with_env(argv(&[]), env).unwrap();
        assert_eq!(cfg.cluster_secret(), Some("from-env"));
        assert!(usage().contains("-cluster-token token"));
    }

    #[test]
    fn invalid_display() {
        let e = ConfigError::Invalid("-addr: bad".into());
        assert_eq!(e.to_string(), "-addr: bad");
    }
}
