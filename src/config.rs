//! Command-line configuration of the broker.
//!
//! This module owns every flag the `broker` binary understands: their names,
//! defaults and help text (one table, [`FLAGS`], drives both the getopts
//! registration and [`usage`]), the value syntaxes (addresses, sizes,
//! durations, peer lists) and the validation of the finished [`Config`].
//!
//! Flags follow the Go convention: a single dash is enough (`-addr=:8080`),
//! though `--addr=:8080`, `-addr :8080` and `--addr :8080` work too. Boolean
//! flags are written `-bootstrap`, `-bootstrap=true` or `-bootstrap=false`.
//!
//! Nothing here touches the network or the disk apart from reading the host
//! name for the default node id.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use crate::storage::sync::{parse_policy, SyncPolicy};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

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

/// How a flag takes its value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FlagForm {
    /// Needs a value: `-flag=v` or `-flag v`.
    Value,
    /// Boolean: `-flag`, `-flag=true`, `-flag=false`.
    Bool,
    /// `-h` / `-help`.
    Help,
    /// `-version`.
    Version,
}

/// One row of the flag table.
struct FlagSpec {
    name: &'static str,
    /// Placeholder for the value in the usage text.
    hint: &'static str,
    /// Default as shown in the usage text; empty means "unset".
    default: &'static str,
    help: &'static str,
    form: FlagForm,
}

const fn value(
    name: &'static str,
    hint: &'static str,
    default: &'static str,
    help: &'static str,
) -> FlagSpec {
    FlagSpec {
        name,
        hint,
        default,
        help,
        form: FlagForm::Value,
    }
}

const fn boolean(name: &'static str, default: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec {
        name,
        hint: "",
        default,
        help,
        form: FlagForm::Bool,
    }
}

/// Every flag, in the order the usage text lists them.
const FLAGS: &[FlagSpec] = &[
    value(
        "addr",
        "host:port",
        ":8080",
        "HTTP/Socket.IO listen address (:port means all interfaces)",
    ),
    value(
        "node-id",
        "id",
        "the host name",
        "this node's id: 1-64 characters of A-Z a-z 0-9 . _ -",
    ),
    value("data", "dir", "./data", "directory for durable state"),
    value(
        "control-token",
        "token",
        "",
        "token required by the control namespace",
    ),
    value(
        "auth-token",
        "token",
        "",
        "token required by the \"/\" namespace",
    ),
    value(
        "users",
        "file",
        "",
        "JSON file of users, their tokens and rights on \"/\"; SIGHUP reloads it",
    ),
    value(
        "cluster-token",
        "token",
        "-control-token",
        "cluster: secret every member proves it holds on Raft connections and peer links",
    ),
    value(
        "max-payload",
        "size",
        "1MiB",
        "largest message payload, 1B to 64MiB (bytes or KB/KiB/MB/MiB/GB/GiB)",
    ),
    value(
        "max-pending",
        "size",
        "64MiB",
        "per-connection outbound buffer limit, 64KiB to 4GiB",
    ),
    value(
        "max-pending-total",
        "size",
        "1GiB or -max-pending if larger",
        "outbound bytes queued across all connections, -max-pending to 1024GiB; past it the largest queues are cut",
    ),
    value(
        "ping-interval",
        "duration",
        "25s",
        "Engine.IO ping interval, 10ms to 1h (ms, s, m, h; e.g. 1500ms, 1m30s)",
    ),
    value(
        "ping-timeout",
        "duration",
        "20s",
        "how long a pong may take, 10ms to 1h",
    ),
    value(
        "connect-timeout",
        "duration",
        "45s",
        "the Socket.IO CONNECT must arrive within this, 10ms to 1h",
    ),
    boolean("allow-eio3", "true", "accept Engine.IO v3 clients"),
    value(
        "cors-origin",
        "origin",
        "",
        "allowed CORS origin (unset: no CORS headers)",
    ),
    value("log-level", "level", "info", "error, warn, info or debug"),
    value(
        "raft-addr",
        "host:port",
        "",
        "cluster: this node's Raft address, required with -raft-peers",
    ),
    value(
        "raft-peers",
        "id=host:port,...",
        "",
        "cluster: every Raft member including this node, comma separated, unique ids; turns cluster mode on",
    ),
    value(
        "cluster",
        "id=url,...",
        "",
        "cluster: every node's HTTP address as id=http://host:port[/socket.io] (this node's own entry is checked and skipped), or the other nodes' host:port, comma separated",
    ),
    boolean(
        "bootstrap",
        "false",
        "cluster: may form a new cluster from -raft-peers (harmless on every node)",
    ),
    boolean(
        "join",
        "false",
        "cluster: start empty and wait to be added (cluster.add) to the running cluster -cluster names; no -raft-peers",
    ),
    value(
        "raft-log",
        "kind",
        "durable",
        "cluster: where the Raft log lives, memory or durable",
    ),
    value(
        "sync",
        "policy",
        "always",
        "stream fsync: always (group commit, acks after fsync), an interval like 100ms, or none",
    ),
    value(
        "segment-size",
        "size",
        "64MiB",
        "stream segment files roll at this size, 4 KiB to 1 GiB",
    ),
    FlagSpec {
        name: "version",
        hint: "",
        default: "",
        help: "print the version and exit",
        form: FlagForm::Version,
    },
    FlagSpec {
        name: "help",
        hint: "",
        default: "",
        help: "show this help and exit",
        form: FlagForm::Help,
    },
];

/// The broker's version, as `-version` prints it after `broker `.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn find_flag(name: &str) -> Option<&'static FlagSpec> {
    if name == "h" {
        return FLAGS.iter().find(|f| f.form == FlagForm::Help);
    }
    FLAGS.iter().find(|f| f.name == name)
}

/// The full help text: every flag with its default and one line of help.
pub fn usage() -> String {
    let left = |f: &FlagSpec| -> String {
        match f.form {
            FlagForm::Value => format!("-{} {}", f.name, f.hint),
            FlagForm::Bool => format!("-{}[=bool]", f.name),
            FlagForm::Help => format!("-h, -{}", f.name),
            FlagForm::Version => format!("-{}", f.name),
        }
    };
    let width = FLAGS.iter().map(|f| left(f).len()).max().unwrap_or(0);

    let mut out = String::from(
        "Usage: broker [flags]\n\
         \n\
         A NATS-style message broker reached over Socket.IO.\n\
         \n\
         Flags may be written -flag=value, -flag value, --flag=value or --flag value.\n\
         Boolean flags take -flag, -flag=true or -flag=false.\n\
         Every flag can also be set from the environment as GOMBUS_<NAME>\n\
         (e.g. GOMBUS_CONTROL_TOKEN); a flag on the command line wins.\n\
         \n\
         Flags:\n",
    );
    for f in FLAGS {
        let default = match (f.form, f.default) {
            (FlagForm::Help | FlagForm::Version, _) => String::new(),
            (_, "") => " (default: unset)".to_string(),
            (_, d) => format!(" (default: {d})"),
        };
        out.push_str(&format!(
            "  {:<width$}  {}{}\n",
            left(f),
            f.help,
            default,
            width = width
        ));
    }
    out
}

/// Parses the command line (without the program name) into a validated
/// [`Config`].
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Config, ConfigError> {
    let args: Vec<String> = args.into_iter().collect();
    check_missing_values(&args)?;

    let mut opts = getopts::Options::new();
    opts.long_only(true);
    for f in FLAGS {
        match f.form {
            FlagForm::Value => {
                opts.optopt("", f.name, f.help, f.hint);
            }
            FlagForm::Bool => {
                opts.optflagopt("", f.name, f.help, "bool");
            }
            FlagForm::Help => {
                opts.optflag("h", f.name, f.help);
            }
            FlagForm::Version => {
                opts.optflag("", f.name, f.help);
            }
        }
    }

    let matches = opts.parse(&args).map_err(describe_getopts_failure)?;
    if matches.opt_present("help") {
        return Err(ConfigError::Help(usage()));
    }
    if matches.opt_present("version") {
        return Err(ConfigError::Help(format!("broker {VERSION}")));
    }
    if let Some(stray) = matches.free.first() {
        let hint = if matches!(
            stray.to_ascii_lowercase().as_str(),
            "true" | "false" | "1" | "0"
        ) {
            " (boolean flags take their value as -flag=false)"
        } else {
            " (flags start with -, values follow the flag)"
        };
        return Err(invalid(format!("unexpected argument {stray:?}{hint}")));
    }

    let mut cfg = Config::default();
    let flag_err = |name: &str, msg: String| invalid(format!("-{name}: {msg}"));
    let get = |name: &str| matches.opt_str(name);

    if let Some(v) = get("addr") {
        cfg.addr = parse_addr(&v).map_err(|e| flag_err("addr", e))?;
    }
    if let Some(v) = get("node-id") {
        cfg.node_id = v;
    }
    if let Some(v) = get("data") {
        if v.trim().is_empty() {
            return Err(flag_err("data", "must not be empty".into()));
        }
        cfg.data_dir = PathBuf::from(v);
    }
    cfg.control_token = get("control-token").filter(|v| !v.is_empty());
    cfg.auth_token = get("auth-token").filter(|v| !v.is_empty());
    cfg.users = get("users").filter(|v| !v.is_empty()).map(PathBuf::from);
    cfg.cluster_token = get("cluster-token").filter(|v| !v.is_empty());
    if let Some(v) = get("max-payload") {
        cfg.max_payload = parse_size(&v).map_err(|e| flag_err("max-payload", e))?;
    }
    if let Some(v) = get("max-pending") {
        cfg.max_pending = parse_size(&v).map_err(|e| flag_err("max-pending", e))?;
    }
    if let Some(v) = get("max-pending-total") {
        let total = parse_size(&v).map_err(|e| flag_err("max-pending-total", e))?;
        cfg.max_pending_total = Some(total);
    }
    if let Some(v) = get("ping-interval") {
        cfg.ping_interval = parse_duration(&v).map_err(|e| flag_err("ping-interval", e))?;
    }
    if let Some(v) = get("ping-timeout") {
        cfg.ping_timeout = parse_duration(&v).map_err(|e| flag_err("ping-timeout", e))?;
    }
    if let Some(v) = get("connect-timeout") {
        cfg.connect_timeout = parse_duration(&v).map_err(|e| flag_err("connect-timeout", e))?;
    }
    if matches.opt_present("allow-eio3") {
        cfg.allow_eio3 = bool_flag(get("allow-eio3")).map_err(|e| flag_err("allow-eio3", e))?;
    }
    cfg.cors_origin = get("cors-origin").filter(|v| !v.trim().is_empty());
    if let Some(v) = get("log-level") {
        cfg.log_level = v.parse().map_err(|e| flag_err("log-level", e))?;
    }
    if let Some(v) = get("raft-addr").filter(|v| !v.trim().is_empty()) {
        cfg.raft_addr = Some(parse_addr(&v).map_err(|e| flag_err("raft-addr", e))?);
    }
    if let Some(v) = get("raft-peers") {
        cfg.raft_peers = parse_peers(&v).map_err(|e| flag_err("raft-peers", e))?;
    }
    if matches.opt_present("join") {
        cfg.join = bool_flag(get("join")).map_err(|e| flag_err("join", e))?;
    }
    if let Some(v) = get("cluster") {
        // A node that joins has no -raft-peers: its -cluster names
        // current members, whoever they are.
        let known = (!cfg.join).then_some(cfg.raft_peers.as_slice());
        cfg.cluster = parse_cluster(&v, &cfg.node_id, cfg.addr.port(), known)
            .map_err(|e| flag_err("cluster", e))?;
        cfg.cluster_ids = cluster_ids(&v);
    }
    if matches.opt_present("bootstrap") {
        cfg.bootstrap = bool_flag(get("bootstrap")).map_err(|e| flag_err("bootstrap", e))?;
    }
    if let Some(v) = get("raft-log") {
        cfg.raft_log = v.parse().map_err(|e| flag_err("raft-log", e))?;
    }
    if let Some(v) = get("sync") {
        cfg.sync = parse_policy(&v).map_err(|e| flag_err("sync", e))?;
    }
    if let Some(v) = get("segment-size") {
        let n = parse_size(&v).map_err(|e| flag_err("segment-size", e))?;
        if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&n) {
            return Err(flag_err(
                "segment-size",
                format!("{v:?} is outside 4KiB..1GiB"),
            ));
        }
        cfg.segment_size = n;
    }

    cfg.validate()?;
    Ok(cfg)
}

/// The environment variable that can set flag `name`: `GOMBUS_` and the
/// name in upper snake case (`-control-token` -> `GOMBUS_CONTROL_TOKEN`).
pub fn env_var_name(name: &str) -> String {
    format!("GOMBUS_{}", name.to_ascii_uppercase().replace('-', "_"))
}

/// [`parse`] with every flag also readable from its environment variable
/// (see [`env_var_name`]); a flag on the command line wins over the
/// variable. `lookup` is `std::env::var` in the binary, a map in tests.
pub fn parse_with_env<I, F>(args: I, lookup: F) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = String>,
    F: Fn(&str) -> Option<String>,
{
    let args: Vec<String> = args.into_iter().collect();
    let given: HashSet<String> = args
        .iter()
        .take_while(|a| a.as_str() != "--")
        .filter_map(|a| flag_name(a))
        .map(str::to_string)
        .collect();
    let mut all = Vec::new();
    for f in FLAGS
        .iter()
        .filter(|f| matches!(f.form, FlagForm::Value | FlagForm::Bool))
    {
        if given.contains(f.name) {
            continue;
        }
        let var = env_var_name(f.name);
        if let Some(v) = lookup(&var) {
            all.push(format!("-{}={v}", f.name));
        }
    }
    all.extend(args);
    parse(all).map_err(|e| match e {
        ConfigError::Invalid(m) if !given.iter().any(|g| m.starts_with(&format!("-{g}:"))) => {
            ConfigError::Invalid(env_hint(m))
        }
        other => other,
    })
}

/// Names the variable in a message about a flag that came from one.
fn env_hint(msg: String) -> String {
    match msg.strip_prefix('-').and_then(|m| m.split_once(':')) {
        Some((name, _)) if find_flag(name).is_some() => {
            format!("{msg} (from {})", env_var_name(name))
        }
        _ => msg,
    }
}

/// Catches `-flag -other` where a value-taking flag would otherwise swallow
/// the next flag as its value (getopts takes whatever follows).
fn check_missing_values(args: &[String]) -> Result<(), ConfigError> {
    let mut iter = args.iter().peekable();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            break;
        }
        let Some(name) = flag_name(arg) else {
            continue;
        };
        if arg.contains('=') {
            continue;
        }
        let takes_value = find_flag(name).is_some_and(|f| f.form == FlagForm::Value);
        if !takes_value {
            continue;
        }
        match iter.peek() {
            Some(next) if flag_name(next).and_then(find_flag).is_some() => {
                return Err(invalid(format!(
                    "-{name}: missing value (the next argument {next:?} is a flag)"
                )));
            }
            Some(_) => {
                iter.next();
            }
            None => {}
        }
    }
    Ok(())
}

/// The flag name in `-name`, `--name`, `-name=v` or `--name=v`.
fn flag_name(arg: &str) -> Option<&str> {
    let tail = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    let name = tail.split('=').next().unwrap_or(tail);
    if name.is_empty() {
        None
    } else {
        Some(name)
    }
}

fn describe_getopts_failure(fail: getopts::Fail) -> ConfigError {
    use getopts::Fail;
    let msg = match fail {
        Fail::ArgumentMissing(name) => format!("-{name}: missing value"),
        Fail::UnrecognizedOption(name) => {
            format!("unknown flag -{name}")
        }
        Fail::OptionMissing(name) => format!("-{name}: required"),
        Fail::OptionDuplicated(name) => format!("-{name}: given more than once"),
        Fail::UnexpectedArgument(name) => format!("-{name}: takes no value"),
    };
    invalid(msg)
}

/// The value of a boolean flag that was present: bare means true.
fn bool_flag(value: Option<String>) -> Result<bool, String> {
    match value {
        None => Ok(true),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "true" | "t" | "1" | "yes" => Ok(true),
            "false" | "f" | "0" | "no" => Ok(false),
            _ => Err(format!("{v:?} is not a boolean (use true or false)")),
        },
    }
}

impl Config {
    /// Checks every bound and cross-flag rule. [`parse`] calls this; code that
    /// builds a `Config` by hand can call it too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_node_id(&self.node_id).map_err(|e| invalid(format!("-node-id: {e}")))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("-data: must not be empty"));
        }
        if self.control_token.as_deref() == Some("") {
            return Err(invalid("-control-token: must not be empty"));
        }
        if self.auth_token.as_deref() == Some("") {
            return Err(invalid("-auth-token: must not be empty"));
        }
        if self.cluster_token.as_deref() == Some("") {
            return Err(invalid("-cluster-token: must not be empty"));
        }
        let relays_unproven = self.auth_token.is_none() && self.cluster_secret().is_none();
        if self.users.is_some() && !self.raft_peers.is_empty() && relays_unproven {
            // Nodes relay clients' events to each other on `/` with the
            // cluster token (or -auth-token): with neither, a peer's
            // relays could not be told from an unknown client.
            return Err(invalid(
                "-users: cluster mode needs a cluster token (-cluster-token or -control-token) \
                 for the nodes' relays",
            ));
        }
        if self.max_payload == 0 || self.max_payload > MAX_MAX_PAYLOAD {
            return Err(invalid(format!(
                "-max-payload: {} is out of range (1B to 64MiB)",
                format_size(self.max_payload)
            )));
        }
        if self.max_pending < MIN_MAX_PENDING || self.max_pending as u64 > MAX_MAX_PENDING {
            return Err(invalid(format!(
                "-max-pending: {} is out of range (64KiB to 4GiB)",
                format_size(self.max_pending)
            )));
        }
        if let Some(total) = self.max_pending_total {
            if total < self.max_pending || total as u64 > MAX_MAX_PENDING_TOTAL {
                return Err(invalid(format!(
                    "-max-pending-total: {} is out of range (-max-pending, {}, to 1024GiB)",
                    format_size(total),
                    format_size(self.max_pending)
                )));
            }
        }
        for (name, d) in [
            ("ping-interval", self.ping_interval),
            ("ping-timeout", self.ping_timeout),
            ("connect-timeout", self.connect_timeout),
        ] {
            if !(MIN_TIMER..=MAX_TIMER).contains(&d) {
                return Err(invalid(format!(
                    "-{name}: {} is out of range (10ms to 1h)",
                    format_duration(d)
                )));
            }
        }
        if !self.raft_peers.is_empty() && self.raft_addr.is_none() {
            return Err(invalid("-raft-peers: requires -raft-addr"));
        }
        if self.join {
            if !self.raft_peers.is_empty() || self.bootstrap {
                return Err(invalid(
                    "-join: a node that joins takes neither -raft-peers nor -bootstrap \
                     (the cluster's stored membership says who the members are)",
                ));
            }
            if self.raft_addr.is_none() {
                return Err(invalid("-join: requires -raft-addr"));
            }
            if self.cluster.is_empty() {
                return Err(invalid(
                    "-join: requires -cluster naming at least one current member",
                ));
            }
        }
        check_peers(&self.raft_peers).map_err(|e| invalid(format!("-raft-peers: {e}")))?;
        if !self.raft_peers.is_empty() && !self.raft_peers.iter().any(|p| p.id == self.node_id) {
            return Err(invalid(format!(
                "-raft-peers: this node ({}) is not one of the members",
                self.node_id
            )));
        }
        if !self.join
            && !self.raft_peers.is_empty()
            && self.cluster.len() + 1 != self.raft_peers.len()
        {
            return Err(invalid(format!(
                "-cluster: give the HTTP addresses of the {} other members ({} given)",
                self.raft_peers.len() - 1,
                self.cluster.len()
            )));
        }
        check_addr_list(&self.cluster).map_err(|e| invalid(format!("-cluster: {e}")))?;
        Ok(())
    }

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

/// Checks that `id` is 1..=64 characters of `[A-Za-z0-9._-]`.
pub fn validate_node_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".into());
    }
    if id.len() > MAX_NODE_ID_LEN {
        return Err(format!(
            "{id:?} is longer than {MAX_NODE_ID_LEN} characters"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{id:?} contains {c:?} (use only A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}

/// Parses `host:port`, `:port` (all interfaces), `localhost:port`
/// (127.0.0.1) or `[v6]:port`. The host must be an IP literal or `localhost`;
/// no name lookups happen here.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(addr) = t.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = t.rsplit_once(':') else {
        return Err(format!(
            "{s:?} is not an address (use host:port, :port or localhost:port)"
        ));
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} has no valid port (use host:port or :port)"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?}: port {port} is above 65535"))?;
    let ip = if host.is_empty() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        IpAddr::V6(
            inner
                .parse::<Ipv6Addr>()
                .map_err(|_| format!("{s:?}: {inner:?} is not an IPv6 address"))?,
        )
    } else if host.contains(':') {
        return Err(format!(
            "{s:?}: put an IPv6 host in brackets, e.g. [::1]:8080"
        ));
    } else {
        host.parse::<IpAddr>()
            .map_err(|_| format!("{s:?}: host {host:?} is not an IP address or localhost"))?
    };
    Ok(SocketAddr::new(ip, port))
}

/// Parses an address another node can be reached at: like [`parse_addr`],
/// but port 0 is refused.
fn parse_dial_addr(s: &str) -> Result<SocketAddr, String> {
    let addr = parse_addr(s)?;
    if addr.port() == 0 {
        return Err(format!("{s:?} needs a real port, not 0"));
    }
    Ok(addr)
}

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

/// Splits a comma-separated list; an empty or blank value is an empty list,
/// but an empty entry inside a list is an error.
fn split_list(s: &str) -> Result<Vec<&str>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|item| {
            let item = item.trim();
            if item.is_empty() {
                Err(format!("{s:?} has an empty entry"))
            } else {
                Ok(item)
            }
        })
        .collect()
}

/// Parses `id=host:port,id=host:port,...`.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    let peers = split_list(s)?
        .into_iter()
        .map(|item| {
            let Some((id, addr)) = item.split_once('=') else {
                return Err(format!("{item:?} is not id=host:port"));
            };
            let id = id.trim();
            validate_node_id(id).map_err(|e| format!("peer id {e}"))?;
            let addr = parse_dial_addr(addr.trim())?;
            Ok(Peer {
                id: id.to_string(),
                addr,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    check_peers(&peers)?;
    Ok(peers)
}

fn check_peers(peers: &[Peer]) -> Result<(), String> {
    let mut ids = HashSet::new();
    let mut addrs = HashSet::new();
    for p in peers {
        validate_node_id(&p.id).map_err(|e| format!("peer id {e}"))?;
        if !ids.insert(p.id.as_str()) {
            return Err(format!("peer id {:?} appears more than once", p.id));
        }
        if !addrs.insert(p.addr) {
            return Err(format!("address {} appears more than once", p.addr));
        }
    }
    Ok(())
}

/// Parses `-cluster` into the other nodes' HTTP addresses. Two forms:
/// the other nodes' `host:port` list, or `id=http://host:port` pairs (path
/// empty, `/`, `/socket.io` or `/socket.io/`) naming `peers` members
/// (any ids when `peers` is `None`: a node that joins), each once. In the second form this node's own entry may be given; its
/// port must be `listen_port` (the `-addr` port), and it is then left out.
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
fn cluster_ids(s: &str) -> BTreeMap<String, SocketAddr> {
    split_list(s)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|item| {
            let (id, url) = item.split_once('=')?;
            Some((id.trim().to_string(), parse_http_url(url.trim()).ok()?))
        })
        .collect()
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

fn check_addr_list(addrs: &[SocketAddr]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for a in addrs {
        if !seen.insert(*a) {
            return Err(format!("address {a} appears more than once"));
        }
    }
    Ok(())
}

/// Parses a byte size for something held in memory: [`parse_bytes`],
/// refused when the address space cannot hold it (over 4 GiB on a 32-bit
/// host such as armv7).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s)?;
    usize::try_from(bytes)
        .map_err(|_| format!("{s:?} is more than a {}-bit host can address", usize::BITS))
}

/// Parses a byte size: a whole number, optionally followed by `B`, `KB`
/// (1000), `KiB` (1024), `MB`, `MiB`, `GB` or `GiB` (suffix case ignored,
/// space before it allowed).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a size (use bytes or a KB/KiB/MB/MiB/GB/GiB suffix)");
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    if number.is_empty() {
        return Err(bad());
    }
    let unit: u64 = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => KIB,
        "mb" => 1000 * 1000,
        "mib" => MIB,
        "gb" => 1000 * 1000 * 1000,
        "gib" => GIB,
        _ => return Err(bad()),
    };
    let too_large = || format!("{s:?} is too large");
    let n: u64 = number.parse().map_err(|_| too_large())?;
    n.checked_mul(unit).ok_or_else(too_large)
}

/// Renders a size the way [`parse_size`] reads it, using the largest binary
/// unit that divides it exactly.
pub fn format_size(bytes: usize) -> String {
    let b = bytes as u64;
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if b != 0 && b.is_multiple_of(unit) {
            return format!("{}{name}", b / unit);
        }
    }
    format!("{b}B")
}

/// Parses a duration: one or more whole numbers each followed by `ms`, `s`,
/// `m` or `h`, e.g. `25s`, `300ms`, `1m30s`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration (use whole numbers with ms, s, m or h, e.g. 25s or 1500ms)"
        )
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let too_large = || format!("{s:?} is too large");
    let mut rest = t;
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60 * 1000,
            "h" => 60 * 60 * 1000,
            "" => {
                return Err(format!(
                    "{s:?} has no unit (add ms, s, m or h, e.g. {number}s)"
                ))
            }
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| too_large())?;
        total_ms = n
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(too_large)?;
        rest = next;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Renders a duration the way [`parse_duration`] reads it, using the largest
/// unit that divides it exactly (sub-millisecond parts are dropped).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, name) in [(3_600_000, "h"), (60_000, "m"), (1000, "s")] {
        if ms != 0 && ms.is_multiple_of(unit) {
            return format!("{}{name}", ms / unit);
        }
    }
    if ms == 0 {
        return "0s".to_string();
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn ok(list: &[&str]) -> Config {
        match parse(argv(list)) {
            Ok(cfg) => cfg,
            Err(e) => panic!("{list:?} should parse, got {e:?}"),
        }
    }

    fn bad(list: &[&str]) -> String {
        match parse(argv(list)) {
            Err(ConfigError::Invalid(msg)) => msg,
            other => panic!("{list:?} should be invalid, got {other:?}"),
        }
    }

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

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
    fn single_dash_example() {
        let cfg = ok(&[
            "-node-id=node-1",
            "-addr=:8080",
            "-data=./data",
            "-control-token=secret",
        ]);
        assert_eq!(cfg.node_id, "node-1");
        assert_eq!(cfg.addr, sock("0.0.0.0:8080"));
        assert_eq!(cfg.data_dir, PathBuf::from("./data"));
        assert_eq!(cfg.control_token.as_deref(), Some("secret"));
    }

    #[test]
    fn value_forms() {
        assert_eq!(ok(&["--addr", "127.0.0.1:0"]).addr, sock("127.0.0.1:0"));
        assert_eq!(
            ok(&["-addr", "127.0.0.1:8080"]).addr,
            sock("127.0.0.1:8080")
        );
        assert_eq!(ok(&["--addr=127.0.0.1:9"]).addr, sock("127.0.0.1:9"));
        assert_eq!(ok(&["-addr=localhost:81"]).addr, sock("127.0.0.1:81"));
        assert_eq!(ok(&["-addr=[::1]:82"]).addr, sock("[::1]:82"));
        let cfg = ok(&[
            "-auth-token",
            "abc",
            "-cors-origin=*",
            "-log-level=DEBUG",
            "-raft-log=memory",
            "-ping-interval=300ms",
            "-ping-timeout",
            "1m",
            "-connect-timeout=1500ms",
            "-max-payload=64KiB",
            "-max-pending=1GiB",
        ]);
        assert_eq!(cfg.auth_token.as_deref(), Some("abc"));
        assert_eq!(cfg.cors_origin.as_deref(), Some("*"));
        assert_eq!(cfg.log_level, LogLevel::Debug);
        assert_eq!(cfg.raft_log, RaftLogKind::Memory);
        assert_eq!(cfg.ping_interval, Duration::from_millis(300));
        assert_eq!(cfg.ping_timeout, Duration::from_secs(60));
        assert_eq!(cfg.connect_timeout, Duration::from_millis(1500));
        assert_eq!(cfg.max_payload, 65536);
        assert_eq!(cfg.max_pending, 1 << 30);
    }

    #[test]
    fn empty_tokens_are_unset() {
        let cfg = ok(&["-control-token=", "-auth-token=", "-cors-origin="]);
        assert_eq!(cfg.control_token, None);
        assert_eq!(cfg.auth_token, None);
        assert_eq!(cfg.cors_origin, None);
    }

    #[test]
    fn addr_rejections() {
        for (value, needle) in [
            ("8080", "not an address"),
            (":", "no valid port"),
            (":http", "no valid port"),
            (":70000", "above 65535"),
            ("example.com:80", "not an IP address"),
            ("::1:80", "brackets"),
            ("[zz]:80", "not an IPv6"),
        ] {
            let msg = bad(&["-addr", value]);
            assert!(msg.starts_with("-addr: "), "{msg}");
            assert!(msg.contains(needle), "{value}: {msg}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("2KB"), Ok(2000));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4kib"), Ok(4096));
        assert_eq!(parse_size(" 5 MiB "), Ok(5 << 20));
        for s in [
            "", "MiB", "12XB", "1.5MiB", "-1", "+1", "1K", "1 M", "1MiBs",
        ] {
            let err = parse_size(s).unwrap_err();
            assert!(err.contains("is not a size"), "{s:?}: {err}");
        }
        let err = parse_size("99999999999999999999").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_size("18446744073709551615GiB").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        // Sizes kept on disk (a stream's max_bytes) go past 4 GiB on any
        // host; sizes held in memory only where the address space allows.
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        #[cfg(target_pointer_width = "32")]
        assert_eq!(
            parse_size("8GiB"),
            Err("\"8GiB\" is more than a 32-bit host can address".to_string())
        );
        #[cfg(target_pointer_width = "64")]
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));

        assert_eq!(
            bad(&["-max-payload=12XB"]),
            "-max-payload: \"12XB\" is not a size (use bytes or a KB/KiB/MB/MiB/GB/GiB suffix)"
        );
    }

    #[test]
    fn size_bounds() {
        assert_eq!(ok(&["-max-payload=1"]).max_payload, 1);
        assert_eq!(ok(&["-max-payload=64MiB"]).max_payload, 64 << 20);
        assert!(bad(&["-max-payload=0"]).contains("out of range"));
        assert!(bad(&["-max-payload=67108865"]).contains("out of range"));
        assert_eq!(ok(&["-max-pending=64KiB"]).max_pending, 64 << 10);
        assert!(bad(&["-max-pending=65535"]).starts_with("-max-pending: "));
        assert!(bad(&["-max-pending=64KB"]).contains("out of range"));
        if usize::BITS >= 64 {
            assert_eq!(ok(&["-max-pending=4GiB"]).max_pending as u64, 4 << 30);
            assert!(bad(&["-max-pending=4097MiB"]).contains("out of range"));
        }
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
    fn durations() {
        assert_eq!(parse_duration("25s"), Ok(Duration::from_secs(25)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 10ms "), Ok(Duration::from_millis(10)));
        for s in [
            "", "s", "1.5s", "-1s", "25S", "1d", "10us", "1m 30s", "ms10",
        ] {
            let err = parse_duration(s).unwrap_err();
            assert!(err.contains("is not a duration"), "{s:?}: {err}");
        }
        let err = parse_duration("25").unwrap_err();
        assert!(err.contains("no unit"), "{err}");
        let err = parse_duration("99999999999999999999h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_duration("18446744073709551615h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn duration_bounds() {
        assert_eq!(
            ok(&["-ping-interval=10ms"]).ping_interval,
            Duration::from_millis(10)
        );
        assert_eq!(
            ok(&["-ping-timeout=1h"]).ping_timeout,
            Duration::from_secs(3600)
        );
        assert!(bad(&["-ping-interval=9ms"]).starts_with("-ping-interval: "));
        assert!(bad(&["-ping-timeout=61m"]).contains("out of range"));
        assert!(bad(&["-ping-interval=2h"]).contains("out of range"));
        assert!(bad(&["-connect-timeout=0s"]).starts_with("-connect-timeout: "));
        assert!(bad(&["-ping-timeout=abc"]).starts_with("-ping-timeout: \"abc\""));
    }

    #[test]
    fn format_round_trips() {
        for s in ["1B", "1000B", "64KiB", "1MiB", "64MiB", "4GiB"] {
            if let Ok(n) = parse_size(s) {
                assert_eq!(format_size(n), s);
            }
        }
        for s in ["10ms", "1500ms", "25s", "90s", "1m", "2h", "0s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(format_duration(d), s);
        }
    }

    #[test]
    fn unknown_flag() {
        let msg = bad(&["-nope=1"]);
        assert_eq!(msg, "unknown flag -nope");
        assert_eq!(bad(&["--addrr", "x"]), "unknown flag -addrr");
        assert_eq!(bad(&["-x"]), "unknown flag -x");
    }

    #[test]
    fn stray_argument() {
        let msg = bad(&["-addr=:1", "extra"]);
        assert!(msg.contains("unexpected argument \"extra\""), "{msg}");
        let msg = bad(&["-bootstrap", "false"]);
        assert!(msg.contains("-flag=false"), "{msg}");
        assert!(bad(&["--", "-addr=:1"]).contains("unexpected argument"));
        assert!(bad(&["-"]).contains("unexpected argument \"-\""));
    }

    #[test]
    fn missing_values() {
        assert_eq!(bad(&["-addr"]), "-addr: missing value");
        assert_eq!(bad(&["--node-id"]), "-node-id: missing value");
        let msg = bad(&["-control-token", "-data=./x"]);
        assert!(msg.starts_with("-control-token: missing value"), "{msg}");
        assert!(bad(&["-node-id="]).starts_with("-node-id: must not be empty"));
        assert!(bad(&["-data="]).starts_with("-data: must not be empty"));
        assert!(bad(&["-log-level="]).starts_with("-log-level: "));
    }

    #[test]
    fn duplicates_and_misc_rejections() {
        assert_eq!(
            bad(&["-addr=:1", "-addr=:2"]),
            "-addr: given more than once"
        );
        assert_eq!(bad(&["-help=yes"]), "-help: takes no value");
        assert!(bad(&["-log-level=trace"]).contains("\"trace\" is not a log level"));
        assert!(bad(&["-raft-log=disk"]).contains("\"disk\" is not a raft log kind"));
    }

    #[test]
    fn node_ids() {
        assert_eq!(ok(&["-node-id=a.B_c-9"]).node_id, "a.B_c-9");
        let long = "n".repeat(64);
        assert_eq!(ok(&["-node-id", &long]).node_id, long);
        let too_long = "n".repeat(65);
        assert!(bad(&["-node-id", &too_long]).contains("longer than 64"));
        assert!(bad(&["-node-id=node 1"]).contains("' '"));
        assert!(bad(&["-node-id=nödé"]).starts_with("-node-id: "));
    }

    #[test]
    fn users_flag_and_its_cluster_rule() {
        let cfg = ok(&["-users=/etc/gombus/users.json"]);
        assert_eq!(cfg.users, Some(PathBuf::from("/etc/gombus/users.json")));
        assert!(cfg.summary().contains("users=/etc/gombus/users.json"));
        assert_eq!(ok(&["-users="]).users, None);
        let cluster = [
            "-node-id=node-1",
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=node-1=127.0.0.1:7001,node-2=127.0.0.1:7002",
            "-cluster=127.0.0.1:8002",
            "-users=u.json",
        ];
        assert!(bad(&cluster).contains("cluster token"));
        // The relays prove the cluster token (or use -auth-token): no
        // user with every right is needed.
        for token in ["-auth-token=relay", "-cluster-token=c", "-control-token=k"] {
            let mut with_token = cluster.to_vec();
            with_token.push(token);
            assert!(ok(&with_token).users.is_some(), "{token}");
        }
    }

    #[test]
    fn raft_peers() {
        let cfg = ok(&[
            "-node-id=node-1",
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=node-1=127.0.0.1:7001, node-2=127.0.0.1:7002,node-3=localhost:7003",
            "-cluster=127.0.0.1:8002,127.0.0.1:8003",
        ]);
        assert_eq!(
            bad(&[
                "-node-id=node-1",
                "-raft-addr=127.0.0.1:7001",
                "-raft-peers=node-1=127.0.0.1:7001,node-2=127.0.0.1:7002",
            ]),
            "-cluster: give the HTTP addresses of the 1 other members (0 given)"
        );
        assert_eq!(cfg.raft_addr, Some(sock("127.0.0.1:7001")));
        assert_eq!(
            cfg.raft_peers,
            vec![
                Peer {
                    id: "node-1".into(),
                    addr: sock("127.0.0.1:7001")
                },
                Peer {
                    id: "node-2".into(),
                    addr: sock("127.0.0.1:7002")
                },
                Peer {
                    id: "node-3".into(),
                    addr: sock("127.0.0.1:7003")
                },
            ]
        );

        let msg = bad(&[
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=a=127.0.0.1:7001,a=127.0.0.1:7002",
        ]);
        assert_eq!(msg, "-raft-peers: peer id \"a\" appears more than once");
        let msg = bad(&[
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=a=127.0.0.1:7001,b=127.0.0.1:7001",
        ]);
        assert!(msg.contains("appears more than once"), "{msg}");
        assert_eq!(
            bad(&[
                "-node-id=c",
                "-raft-addr=127.0.0.1:7001",
                "-raft-peers=a=127.0.0.1:7001,b=127.0.0.1:7002",
            ]),
            "-raft-peers: this node (c) is not one of the members"
        );
        assert_eq!(
            bad(&["-raft-peers=a=127.0.0.1:7001"]),
            "-raft-peers: requires -raft-addr"
        );
        for value in [
            "a",
            "a=",
            "=127.0.0.1:1",
            "a b=127.0.0.1:1",
            "a=127.0.0.1:0",
            "a=127.0.0.1:1,,b=127.0.0.1:2",
        ] {
            let msg = bad(&["-raft-addr=127.0.0.1:7001", "-raft-peers", value]);
            assert!(msg.starts_with("-raft-peers: "), "{value}: {msg}");
        }
        assert!(ok(&["-raft-peers="]).raft_peers.is_empty());
    }

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

    #[test]
    fn bool_flags() {
        assert!(ok(&["-bootstrap"]).bootstrap);
        assert!(ok(&["--bootstrap"]).bootstrap);
        assert!(ok(&["-bootstrap=true"]).bootstrap);
        assert!(!ok(&["-bootstrap=false"]).bootstrap);
        assert!(ok(&["-allow-eio3"]).allow_eio3);
        assert!(!ok(&["-allow-eio3=false"]).allow_eio3);
        assert!(ok(&["-allow-eio3=TRUE"]).allow_eio3);
        assert!(!ok(&["-allow-eio3=0"]).allow_eio3);
        assert!(bad(&["-bootstrap=maybe"]).starts_with("-bootstrap: \"maybe\" is not a boolean"));
        // A lone bootstrap is a single-node cluster and is fine.
        let cfg = ok(&["-bootstrap", "-raft-addr=127.0.0.1:7001"]);
        assert!(cfg.bootstrap && cfg.raft_peers.is_empty());
    }

    #[test]
    fn help() {
        for flag in ["-help", "-h", "--help", "--h"] {
            assert_eq!(parse(argv(&[flag])), Err(ConfigError::Help(usage())));
        }
        assert_eq!(
            parse(argv(&["-addr=:1", "-help", "-node-id=bad id"])),
            Err(ConfigError::Help(usage()))
        );
        let text = usage();
        for f in FLAGS {
            assert!(text.contains(&format!("-{}", f.name)), "{}", f.name);
        }
        assert!(text.contains("(default: :8080)"));
        assert!(text.contains("(default: 1MiB)"));
        assert_eq!(ConfigError::Help(text.clone()).to_string(), text);
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
    fn sync_and_segment_size_flags() {
        let cfg = ok(&[]);
        assert_eq!(cfg.sync, SyncPolicy::Always);
        assert_eq!(cfg.segment_size, 64 << 20);
        let cfg = ok(&["-sync=100ms", "-segment-size=8MiB"]);
        assert_eq!(cfg.sync, SyncPolicy::Every(Duration::from_millis(100)));
        assert_eq!(cfg.segment_size, 8 << 20);
        assert_eq!(ok(&["-sync", "none"]).sync, SyncPolicy::Never);
        assert!(bad(&["-sync=sometimes"]).contains("-sync"));
        assert!(bad(&["-sync=0ms"]).contains("-sync"));
        assert!(bad(&["-segment-size=1KiB"]).contains("outside"));
        assert!(bad(&["-segment-size=2GiB"]).contains("outside"));
        assert!(usage().contains("-sync policy"));
        assert!(usage().contains("-segment-size size"));
    }

    #[test]
    fn env_vars_fill_flags_and_flags_win() {
        let env = |name: &str| match name {
            "GOMBUS_CONTROL_TOKEN" => Some("fromenv".to_string()),
            "GOMBUS_MAX_PAYLOAD" => Some("2MiB".to_string()),
            "GOMBUS_NODE_ID" => Some("env-node".to_string()),
            "GOMBUS_BOOTSTRAP" => Some("true".to_string()),
            _ => None,
        };
        let cfg = parse_with_env(argv(&["-node-id=flag-node"]), env).unwrap();
        assert_eq!(cfg.control_token.as_deref(), Some("fromenv"));
        assert_eq!(cfg.max_payload, 2 * MIB as usize);
        assert_eq!(cfg.node_id, "flag-node");
        assert!(cfg.bootstrap);
        assert_eq!(env_var_name("max-payload"), "GOMBUS_MAX_PAYLOAD");
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let env = |name: &str| (name == "GOMBUS_MAX_PAYLOAD").then(|| "lots".to_string());
        let e = parse_with_env(argv(&[]), env).unwrap_err().to_string();
        assert!(e.contains("-max-payload"), "{e}");
        assert!(e.contains("GOMBUS_MAX_PAYLOAD"), "{e}");
        // The flag wins, so the bad variable is not read at all.
        assert!(parse_with_env(argv(&["-max-payload=1KiB"]), env).is_ok());
    }

    #[test]
    fn version_flag_prints_the_version() {
        for flag in ["-version", "--version"] {
            assert_eq!(
                parse(argv(&[flag])),
                Err(ConfigError::Help(format!(
                    "broker {}",
                    env!("CARGO_PKG_VERSION")
                )))
            );
        }
        assert!(usage().contains("-version"));
        // Not read from the environment: GOMBUS_VERSION must not stop a
        // service from starting.
        let env = |name: &str| (name == "GOMBUS_VERSION").then(|| "true".to_string());
        assert!(parse_with_env(argv(&[]), env).is_ok());
    }

    /// The environment file installed with the systemd units names every
    /// variable the broker reads.
    #[test]
    fn the_installed_environment_file_names_every_variable() {
        let file = include_str!("../dist/systemd/gombus.env");
        for f in FLAGS
            .iter()
            .filter(|f| matches!(f.form, FlagForm::Value | FlagForm::Bool))
        {
            let var = env_var_name(f.name);
            assert!(
                file.contains(&format!("#{var}=")) || file.contains(&format!("\n{var}=")),
                "dist/systemd/gombus.env does not mention {var}"
            );
        }
    }

    #[test]
    fn invalid_display() {
        let e = ConfigError::Invalid("-addr: bad".into());
        assert_eq!(e.to_string(), "-addr: bad");
    }
}
