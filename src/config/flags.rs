//! The broker's flags: one table, [`FLAGS`], where each flag is named once
//! with its value hint, default, help text and setter. It drives the getopts
//! registration, [`parse`], [`usage`] and the `GOMBUS_*` environment
//! variables (each flag's name in upper snake case).

use std::collections::HashSet;
use std::path::PathBuf;

use super::launch::{cluster_ids, parse_cluster};
use super::values::{
    parse_addr, parse_bool, parse_duration, parse_peers, parse_size, unless_empty,
};
use super::{invalid, parse_policy, Config, ConfigError, VERSION};

/// A value flag's setter: reads the value into the config, or says what is
/// wrong with it (without the flag's name).
type SetValue = fn(&mut Config, &str) -> Result<(), String>;

/// How a flag takes its value, and what it sets.
#[derive(Clone, Copy)]
enum Kind {
    /// Needs a value: `-flag=v` or `-flag v`; `hint` stands for it in the
    /// usage text.
    Value { hint: &'static str, set: SetValue },
    /// Boolean: `-flag`, `-flag=true`, `-flag=false`.
    Bool { set: fn(&mut Config, bool) },
    /// `-h` / `-help`.
    Help,
    /// `-version`.
    Version,
}

/// One row of the flag table.
struct Flag {
    name: &'static str,
    /// Default as shown in the usage text; empty means "unset".
    default: &'static str,
    help: &'static str,
    kind: Kind,
    /// Flags listed later whose setters run before this one's, because it
    /// reads what they set.
    after: &'static [&'static str],
}

impl Flag {
    /// Whether the flag sets something (and so has an environment variable).
    fn settable(&self) -> bool {
        matches!(self.kind, Kind::Value { .. } | Kind::Bool { .. })
    }

    /// This flag, set only once `names` are.
    const fn after(self, names: &'static [&'static str]) -> Flag {
        Flag {
            after: names,
            ..self
        }
    }
}

const fn value(
    name: &'static str,
    hint: &'static str,
    default: &'static str,
    help: &'static str,
    set: SetValue,
) -> Flag {
    Flag {
        name,
        default,
        help,
        kind: Kind::Value { hint, set },
        after: &[],
    }
}

const fn boolean(
    name: &'static str,
    default: &'static str,
    help: &'static str,
    set: fn(&mut Config, bool),
) -> Flag {
    Flag {
        name,
        default,
        help,
        kind: Kind::Bool { set },
        after: &[],
    }
}

const fn action(name: &'static str, help: &'static str, kind: Kind) -> Flag {
    Flag {
        name,
        default: "",
        help,
        kind,
        after: &[],
    }
}

/// Every flag, in the order the usage text lists them.
static FLAGS: &[Flag] = &[
    value(
        "addr",
        "host:port",
        ":8080",
        "HTTP/Socket.IO listen address (:port means all interfaces)",
        |c, v| parse_addr(v).map(|a| c.addr = a),
    ),
    value(
        "node-id",
        "id",
        "the host name",
        "this node's id: 1-64 characters of A-Z a-z 0-9 . _ -",
        |c, v| {
            c.node_id = v.to_string();
            Ok(())
        },
    ),
    value("data", "dir", "./data", "directory for durable state", |c, v| {
        if v.trim().is_empty() {
            return Err("must not be empty".into());
        }
        c.data_dir = PathBuf::from(v);
        Ok(())
    }),
    value(
        "control-token",
        "token",
        "",
        "token required by the control namespace",
        |c, v| {
            c.control_token = unless_empty(v);
            Ok(())
        },
    ),
    value(
        "auth-token",
        "token",
        "",
        "token required by the \"/\" namespace",
        |c, v| {
            c.auth_token = unless_empty(v);
            Ok(())
        },
    ),
    value(
        "users",
        "file",
        "",
        "JSON file of users, their tokens and rights on \"/\"; SIGHUP reloads it",
        |c, v| {
            c.users = unless_empty(v).map(PathBuf::from);
            Ok(())
        },
    ),
    value(
        "cluster-token",
        "token",
        "-control-token",
        "cluster: secret every member proves it holds on Raft connections and peer links",
        |c, v| {
            c.cluster_token = unless_empty(v);
            Ok(())
        },
    ),
    value(
        "max-payload",
        "size",
        "1MiB",
        "largest message payload, 1B to 64MiB (bytes or KB/KiB/MB/MiB/GB/GiB)",
        |c, v| parse_size(v).map(|n| c.max_payload = n),
    ),
    value(
        "max-pending",
        "size",
        "64MiB",
        "per-connection outbound buffer limit, 64KiB to 4GiB",
        |c, v| parse_size(v).map(|n| c.max_pending = n),
    ),
    value(
        "max-pending-total",
        "size",
        "1GiB or -max-pending if larger",
        "outbound bytes queued across all connections, -max-pending to 1024GiB; past it the largest queues are cut",
        |c, v| parse_size(v).map(|n| c.max_pending_total = Some(n)),
    ),
    value(
        "ping-interval",
        "duration",
        "25s",
        "Engine.IO ping interval, 10ms to 1h (ms, s, m, h; e.g. 1500ms, 1m30s)",
        |c, v| parse_duration(v).map(|d| c.ping_interval = d),
    ),
    value(
        "ping-timeout",
        "duration",
        "20s",
        "how long a pong may take, 10ms to 1h",
        |c, v| parse_duration(v).map(|d| c.ping_timeout = d),
    ),
    value(
        "connect-timeout",
        "duration",
        "45s",
        "the Socket.IO CONNECT must arrive within this, 10ms to 1h",
        |c, v| parse_duration(v).map(|d| c.connect_timeout = d),
    ),
    boolean("allow-eio3", "true", "accept Engine.IO v3 clients", |c, on| {
        c.allow_eio3 = on
    }),
    value(
        "cors-origin",
        "origin",
        "",
        "allowed CORS origin (unset: no CORS headers)",
        |c, v| {
            c.cors_origin = Some(v.to_string()).filter(|v| !v.trim().is_empty());
            Ok(())
        },
    ),
    value(
        "log-level",
        "level",
        "info",
        "error, warn, info or debug",
        |c, v| v.parse().map(|l| c.log_level = l),
    ),
    value(
        "raft-addr",
        "host:port",
        "",
        "cluster: this node's Raft address, required with -raft-peers",
        |c, v| {
            if !v.trim().is_empty() {
                c.raft_addr = Some(parse_addr(v)?);
            }
            Ok(())
        },
    ),
    value(
        "raft-peers",
        "id=host:port,...",
        "",
        "cluster: every Raft member including this node, comma separated, unique ids; turns cluster mode on",
        |c, v| parse_peers(v).map(|p| c.raft_peers = p),
    ),
    value(
        "cluster",
        "id=url,...",
        "",
        "cluster: every node's HTTP address as id=http://host:port[/socket.io] (this node's own entry is checked and skipped), or the other nodes' host:port, comma separated",
        |c, v| {
            // A node that joins has no -raft-peers: its -cluster names
            // current members, whoever they are.
            let known = (!c.join).then_some(c.raft_peers.as_slice());
            c.cluster = parse_cluster(v, &c.node_id, c.addr.port(), known)?;
            c.cluster_ids = cluster_ids(v);
            Ok(())
        },
    )
    .after(&["join"]),
    boolean(
        "bootstrap",
        "false",
        "cluster: may form a new cluster from -raft-peers (harmless on every node)",
        |c, on| c.bootstrap = on,
    ),
    boolean(
        "join",
        "false",
        "cluster: start empty and wait to be added (cluster.add) to the running cluster -cluster names; no -raft-peers",
        |c, on| c.join = on,
    ),
    value(
        "raft-log",
        "kind",
        "durable",
        "cluster: where the Raft log lives, memory or durable",
        |c, v| v.parse().map(|k| c.raft_log = k),
    ),
    value(
        "sync",
        "policy",
        "always",
        "stream fsync: always (group commit, acks after fsync), an interval like 100ms, or none",
        |c, v| parse_policy(v).map(|p| c.sync = p),
    ),
    value(
        "segment-size",
        "size",
        "64MiB",
        "stream segment files roll at this size, 4 KiB to 1 GiB",
        |c, v| parse_size(v).map(|n| c.segment_size = n),
    ),
    action("version", "print the version and exit", Kind::Version),
    action("help", "show this help and exit", Kind::Help),
];

fn find_flag(name: &str) -> Option<&'static Flag> {
    if name == "h" {
        return FLAGS.iter().find(|f| matches!(f.kind, Kind::Help));
    }
    FLAGS.iter().find(|f| f.name == name)
}

/// The order the setters run in: the table's, each flag's `after` flags
/// moved to just before it.
fn set_order() -> Vec<&'static Flag> {
    let mut order: Vec<&'static Flag> = Vec::with_capacity(FLAGS.len());
    for f in FLAGS {
        let first = f.after.iter().map(|name| match find_flag(name) {
            Some(flag) => flag,
            None => unreachable!("-{}: `after` names no flag {name:?}", f.name),
        });
        for flag in first.chain([f]) {
            if !order.iter().any(|o| o.name == flag.name) {
                order.push(flag);
            }
        }
    }
    order
}

/// The full help text: every flag with its default and one line of help.
pub fn usage() -> String {
    let left = |f: &Flag| -> String {
        match f.kind {
            Kind::Value { hint, .. } => format!("-{} {hint}", f.name),
            Kind::Bool { .. } => format!("-{}[=bool]", f.name),
            Kind::Help => format!("-h, -{}", f.name),
            Kind::Version => format!("-{}", f.name),
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
        let default = match f.default {
            _ if !f.settable() => String::new(),
            "" => " (default: unset)".to_string(),
            d => format!(" (default: {d})"),
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
        match f.kind {
            Kind::Value { hint, .. } => {
                opts.optopt("", f.name, f.help, hint);
            }
            Kind::Bool { .. } => {
                opts.optflagopt("", f.name, f.help, "bool");
            }
            Kind::Help => {
                opts.optflag("h", f.name, f.help);
            }
            Kind::Version => {
                opts.optflag("", f.name, f.help);
            }
        }
    }

    let matches = opts.parse(&args).map_err(describe_getopts_failure)?;
    let asked = |kind: fn(&Kind) -> bool| {
        FLAGS
            .iter()
            .any(|f| kind(&f.kind) && matches.opt_present(f.name))
    };
    if asked(|k| matches!(k, Kind::Help)) {
        return Err(ConfigError::Help(usage()));
    }
    if asked(|k| matches!(k, Kind::Version)) {
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
    for f in set_order() {
        let set = match (f.kind, matches.opt_str(f.name)) {
            (Kind::Value { set, .. }, Some(v)) => set(&mut cfg, &v),
            // Present without a value: bare means true.
            (Kind::Bool { set }, v) if matches.opt_present(f.name) => v
                .map_or(Ok(true), |v| parse_bool(&v))
                .map(|on| set(&mut cfg, on)),
            _ => Ok(()),
        };
        set.map_err(|e| invalid(format!("-{}: {e}", f.name)))?;
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
    for f in FLAGS.iter().filter(|f| f.settable()) {
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
        let takes_value = find_flag(name).is_some_and(|f| matches!(f.kind, Kind::Value { .. }));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{argv, bad, ok, sock};
    use crate::config::{LogLevel, RaftLogKind, SyncPolicy};
    use std::time::Duration;

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
        assert_eq!(cfg.max_payload, 2 << 20);
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
        let file = include_str!("../../dist/systemd/gombus.env");
        for f in FLAGS.iter().filter(|f| f.settable()) {
            let var = env_var_name(f.name);
            assert!(
                file.contains(&format!("#{var}=")) || file.contains(&format!("\n{var}=")),
                "dist/systemd/gombus.env does not mention {var}"
            );
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names = HashSet::new();
        let mut vars = HashSet::new();
        for f in FLAGS {
            assert!(names.insert(f.name), "-{} is in the table twice", f.name);
            assert!(
                vars.insert(env_var_name(f.name)),
                "-{}: another flag has its variable",
                f.name
            );
        }
        assert!(!names.contains("h"), "-h is -help's short form");
    }

    /// A value each value flag's setter takes on a default config and that
    /// changes it.
    fn example(name: &str) -> &'static str {
        match name {
            "addr" => "127.0.0.1:1",
            "node-id" => "another-node",
            "data" => "/var/lib/gombus",
            "control-token" | "auth-token" | "cluster-token" => "t",
            "users" => "users.json",
            "max-payload" | "max-pending" | "max-pending-total" | "segment-size" => "2MiB",
            "ping-interval" | "ping-timeout" | "connect-timeout" => "1s",
            "cors-origin" => "*",
            "log-level" => "debug",
            "raft-addr" => "127.0.0.1:9",
            "raft-peers" => "a=127.0.0.1:9",
            "cluster" => "127.0.0.1:8081",
            "raft-log" => "memory",
            "sync" => "none",
            _ => panic!("-{name}: give the test an example value"),
        }
    }

    /// Each flag's setter changes the config, and no two change it alike
    /// (which catches a setter writing another flag's field).
    #[test]
    fn every_flag_has_a_setter_that_changes_the_config() {
        let mut seen: Vec<(&str, String)> = Vec::new();
        for f in FLAGS {
            let changed = match f.kind {
                Kind::Value { set, .. } => {
                    let mut cfg = Config::default();
                    let v = example(f.name);
                    set(&mut cfg, v).unwrap_or_else(|e| panic!("-{}={v}: {e}", f.name));
                    cfg
                }
                Kind::Bool { set } => {
                    let (mut on, mut off) = (Config::default(), Config::default());
                    set(&mut on, true);
                    set(&mut off, false);
                    assert_ne!(on, off, "-{}: true and false set the same", f.name);
                    if on == Config::default() {
                        off
                    } else {
                        on
                    }
                }
                Kind::Help | Kind::Version => continue,
            };
            assert_ne!(changed, Config::default(), "-{} changes nothing", f.name);
            let text = format!("{changed:?}");
            if let Some((other, _)) = seen.iter().find(|(_, t)| *t == text) {
                panic!("-{} and -{other} set the config alike", f.name);
            }
            seen.push((f.name, text));
        }
        assert_eq!(seen.len(), FLAGS.iter().filter(|f| f.settable()).count());
    }

    /// `-cluster` reads `-join`, listed after it: `-join` is set first,
    /// wherever it stands on the command line.
    #[test]
    fn join_is_set_before_cluster() {
        let names: Vec<&str> = set_order().iter().map(|f| f.name).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(at("join") < at("cluster"), "{names:?}");
        assert_eq!(names.len(), FLAGS.len());
        let joiner = [
            "-node-id=n4",
            "-raft-addr=127.0.0.1:9094",
            "-cluster=n1=http://127.0.0.1:8081",
        ];
        for join in ["-join", "-join=true"] {
            let mut args = joiner.to_vec();
            args.push(join);
            let cfg = ok(&args);
            assert!(cfg.join);
            assert_eq!(cfg.cluster, [sock("127.0.0.1:8081")]);
            args.rotate_right(1);
            assert_eq!(ok(&args), cfg);
        }
        assert!(bad(&joiner).contains("is not one of the -raft-peers members"));
    }
}
