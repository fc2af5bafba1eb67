//! The CLI's command line: the global flags, the table of commands with
//! their usage and options, and parsing one invocation into a [`Parsed`]
//! (command path, positional arguments, matched options).
//!
//! Global flags may stand before or after the command words:
//! `gombus --json stream ls` and `gombus stream ls --json` are the same.

use std::time::Duration;

use getopts::{Matches, Options, ParsingStyle};

use crate::config::{parse_bytes, parse_duration};

/// Where the CLI connects when neither `--server` nor `GOMBUS_URL` is set.
pub const DEFAULT_SERVER: &str = "127.0.0.1:8080";

/// Settings every command shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Global {
    /// Servers to try in order (`--server a,b` or `GOMBUS_URL`).
    pub servers: Vec<String>,
    /// Token for the `/` namespace (`--token` or `GOMBUS_TOKEN`).
    pub token: Option<String>,
    /// Token for `/control` (`--control-token` or `GOMBUS_CONTROL_TOKEN`).
    pub control_token: Option<String>,
    /// Print JSON instead of text.
    pub json: bool,
    /// Bound on connecting and on each server answer.
    pub timeout: Duration,
}

/// Why a command line could not be run.
#[derive(Debug, PartialEq)]
pub enum ArgError {
    /// Help was asked for; the text to print (exit 0).
    Help(String),
    /// A usage error; the message and the help command to suggest.
    Usage(String, String),
}

/// One command: its words, positional arguments, one-line summary and
/// its own options.
pub struct Command {
    pub path: &'static [&'static str],
    pub args: &'static str,
    pub about: &'static str,
    pub opts: fn(&mut Options),
}

fn no_opts(_: &mut Options) {}

fn pub_opts(o: &mut Options) {
    o.optopt(
        "",
        "count",
        "publish N times; {{n}} in DATA becomes 1..N",
        "N",
    );
    o.optmulti("", "header", "add a header (repeatable)", "K:V");
    o.optopt(
        "",
        "reply",
        "reply subject to send with the message",
        "SUBJECT",
    );
}

fn sub_opts(o: &mut Options) {
    o.optopt("", "queue", "join this queue group", "Q");
    o.optopt("", "count", "exit after N messages", "N");
}

fn req_opts(o: &mut Options) {
    o.optmulti("", "header", "add a header (repeatable)", "K:V");
}

fn reply_opts(o: &mut Options) {
    o.optopt("", "queue", "answer as a member of this queue group", "Q");
    o.optopt("", "count", "exit after answering N requests", "N");
}

fn stream_add_opts(o: &mut Options) {
    o.optopt(
        "",
        "subjects",
        "subjects the stream captures, comma separated (required)",
        "S,...",
    );
    o.optopt(
        "",
        "retention",
        "limits (default), workqueue or interest",
        "POLICY",
    );
    o.optopt("", "max-msgs", "keep at most N messages", "N");
    o.optopt(
        "",
        "max-msgs-per-subject",
        "keep at most N messages of each subject",
        "N",
    );
    o.optopt(
        "",
        "max-bytes",
        "keep at most this many bytes (e.g. 1GiB)",
        "SIZE",
    );
    o.optopt(
        "",
        "max-age",
        "drop messages older than this (e.g. 24h)",
        "DURATION",
    );
    o.optopt("", "max-msg-size", "refuse larger messages", "SIZE");
    o.optopt(
        "",
        "discard",
        "old (default) or new when a limit is reached",
        "POLICY",
    );
    o.optopt(
        "",
        "dupe-window",
        "Msg-Id duplicate window (e.g. 2m)",
        "DURATION",
    );
    o.optopt(
        "",
        "replicas",
        "copies kept on this many cluster nodes (default 1)",
        "N",
    );
}

fn kv_add_opts(o: &mut Options) {
    o.optopt("", "history", "writes kept per key, 1-64 (default 1)", "N");
    o.optopt(
        "",
        "ttl",
        "drop writes older than this (e.g. 24h)",
        "DURATION",
    );
    o.optopt("", "max-bytes", "keep at most this many bytes", "SIZE");
    o.optopt("", "max-value-size", "refuse larger values", "SIZE");
    o.optopt("", "replicas", "copies in a cluster (default 1)", "N");
}

fn kv_revision_opts(o: &mut Options) {
    o.optopt(
        "",
        "revision",
        "the key's revision (compare-and-set, or which write to read)",
        "N",
    );
}

fn kv_watch_opts(o: &mut Options) {
    o.optopt(
        "",
        "key",
        "only keys matching this pattern (e.g. site.>)",
        "PATTERN",
    );
    o.optflag("", "history", "start with every kept write");
    o.optflag("", "updates-only", "print only writes made from now on");
    o.optopt("", "count", "exit after N new writes", "N");
}

fn kv_keys_opts(o: &mut Options) {
    o.optopt(
        "",
        "filter",
        "only keys matching this pattern (e.g. site.*)",
        "PATTERN",
    );
}

fn stream_purge_opts(o: &mut Options) {
    o.optopt(
        "",
        "subject",
        "purge only messages on this subject",
        "SUBJECT",
    );
}

fn stream_get_opts(o: &mut Options) {
    o.optopt("", "seq", "the message with this sequence", "N");
    o.optopt("", "last", "the last message on this subject", "SUBJECT");
}

fn consumer_add_opts(o: &mut Options) {
    o.optopt("", "filter", "only messages on this subject", "SUBJECT");
    o.optopt(
        "",
        "deliver",
        "all (default), new, last or by_start_seq",
        "POLICY",
    );
    o.optopt(
        "",
        "start-seq",
        "first sequence for --deliver by_start_seq",
        "N",
    );
    o.optopt("", "ack", "explicit (default), none or all", "POLICY");
    o.optopt(
        "",
        "ack-wait",
        "redeliver unacked messages after this (e.g. 30s)",
        "DURATION",
    );
    o.optopt("", "max-deliver", "deliver a message at most N times", "N");
    o.optopt("", "max-ack-pending", "at most N unacked messages", "N");
    o.optopt(
        "",
        "deliver-subject",
        "push: deliver to subscribers of this subject",
        "SUBJECT",
    );
    o.optopt(
        "",
        "deliver-group",
        "push: the subscribers' queue group",
        "Q",
    );
}

fn consumer_next_opts(o: &mut Options) {
    o.optopt("", "count", "messages to fetch (default 1)", "N");
    o.optopt(
        "",
        "expires",
        "wait at most this long for a message (default 5s)",
        "DURATION",
    );
    o.optflag("", "no-wait", "answer at once, even with nothing pending");
    o.optflag("", "no-ack", "do not ack what was fetched");
}

fn consumer_nak_opts(o: &mut Options) {
    o.optopt(
        "",
        "delay",
        "redeliver no sooner than this (e.g. 10s; default at once)",
        "DURATION",
    );
}

fn bench_opts(o: &mut Options) {
    o.optopt(
        "",
        "msgs",
        "messages to send, or subscribes to make (default 100000; reqrep/stream 10000; subscribe 1000)",
        "N",
    );
    o.optopt(
        "",
        "size",
        "payload bytes per message (default 128)",
        "SIZE",
    );
    o.optopt(
        "",
        "pubs",
        "publishing (or requesting) clients (default 1)",
        "N",
    );
    o.optopt(
        "",
        "subs",
        "subscribing (or replying) clients (default: 1; fanout/queue 4); subscribe: clients sharing the subscribes",
        "N",
    );
    o.optopt(
        "",
        "sub-server",
        "subscribers and responders connect here instead, round-robin (default: --server)",
        "HOST:PORT,...",
    );
    o.optopt(
        "",
        "subject",
        "subject to use (default bench.<workload>)",
        "SUBJECT",
    );
    o.optflag(
        "",
        "acked",
        "pub: wait for each publish's ack (gives latencies)",
    );
    o.optopt(
        "",
        "window",
        "stream, pub --acked: acked publishes each publisher keeps in flight (default 256)",
        "W",
    );
}

/// Every command, in the order `gombus --help` lists them.
pub const COMMANDS: &[Command] = &[
    Command {
        path: &["pub"],
        args: "SUBJECT DATA",
        about: "Publish a message (DATA is JSON if it parses, else a string).",
        opts: pub_opts,
    },
    Command {
        path: &["sub"],
        args: "SUBJECT",
        about: "Subscribe and print messages until interrupted or --count.",
        opts: sub_opts,
    },
    Command {
        path: &["req"],
        args: "SUBJECT DATA",
        about: "Send a request and print the first reply (--timeout bounds the wait).",
        opts: req_opts,
    },
    Command {
        path: &["reply"],
        args: "SUBJECT RESPONSE",
        about: "Answer every request on SUBJECT with RESPONSE.",
        opts: reply_opts,
    },
    Command {
        path: &["stream", "add"],
        args: "NAME",
        about: "Create a stream.",
        opts: stream_add_opts,
    },
    Command {
        path: &["stream", "info"],
        args: "NAME",
        about: "Show a stream's config and state.",
        opts: no_opts,
    },
    Command {
        path: &["stream", "ls"],
        args: "",
        about: "List streams.",
        opts: no_opts,
    },
    Command {
        path: &["stream", "rm"],
        args: "NAME",
        about: "Delete a stream and its messages.",
        opts: no_opts,
    },
    Command {
        path: &["stream", "purge"],
        args: "NAME",
        about: "Remove a stream's messages.",
        opts: stream_purge_opts,
    },
    Command {
        path: &["stream", "get"],
        args: "NAME",
        about: "Show one stored message (--seq N or --last SUBJECT).",
        opts: stream_get_opts,
    },
    Command {
        path: &["consumer", "add"],
        args: "STREAM NAME",
        about: "Create a consumer on a stream.",
        opts: consumer_add_opts,
    },
    Command {
        path: &["consumer", "info"],
        args: "STREAM NAME",
        about: "Show a consumer's config and cursors.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "ls"],
        args: "STREAM",
        about: "List a stream's consumers.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "rm"],
        args: "STREAM NAME",
        about: "Delete a consumer.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "next"],
        args: "STREAM NAME",
        about: "Fetch messages from a pull consumer and ack them.",
        opts: consumer_next_opts,
    },
    Command {
        path: &["kv", "add"],
        args: "BUCKET",
        about: "Create a key-value bucket.",
        opts: kv_add_opts,
    },
    Command {
        path: &["kv", "put"],
        args: "BUCKET KEY VALUE",
        about: "Write a value (--revision N: only while the key is at N).",
        opts: kv_revision_opts,
    },
    Command {
        path: &["kv", "get"],
        args: "BUCKET KEY",
        about: "Show a key's latest value (or --revision N).",
        opts: kv_revision_opts,
    },
    Command {
        path: &["kv", "del"],
        args: "BUCKET KEY",
        about: "Delete a key (a delete marker; --revision N: only while at N).",
        opts: kv_revision_opts,
    },
    Command {
        path: &["kv", "purge"],
        args: "BUCKET KEY",
        about: "Delete a key and every earlier write of it.",
        opts: no_opts,
    },
    Command {
        path: &["kv", "ls"],
        args: "",
        about: "List buckets.",
        opts: no_opts,
    },
    Command {
        path: &["kv", "keys"],
        args: "BUCKET",
        about: "List a bucket's keys (--filter PATTERN).",
        opts: kv_keys_opts,
    },
    Command {
        path: &["kv", "history"],
        args: "BUCKET KEY",
        about: "Show every kept write of a key.",
        opts: no_opts,
    },
    Command {
        path: &["kv", "watch"],
        args: "BUCKET",
        about: "Print each key's latest value, then every new write as it comes.",
        opts: kv_watch_opts,
    },
    Command {
        path: &["kv", "rm"],
        args: "BUCKET",
        about: "Delete a bucket and its values.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "ack"],
        args: "STREAM NAME SEQ",
        about: "Acknowledge a delivered message.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "nak"],
        args: "STREAM NAME SEQ",
        about: "Hand a delivered message back for redelivery (--delay).",
        opts: consumer_nak_opts,
    },
    Command {
        path: &["consumer", "term"],
        args: "STREAM NAME SEQ",
        about: "Stop delivering a message, without acking it.",
        opts: no_opts,
    },
    Command {
        path: &["consumer", "wip"],
        args: "STREAM NAME SEQ",
        about: "Still working on a message: restart its ack wait.",
        opts: no_opts,
    },
    Command {
        path: &["server", "info"],
        args: "",
        about: "Show the server's node, uptime and counts (/control).",
        opts: no_opts,
    },
    Command {
        path: &["server", "health"],
        args: "",
        about: "Read /healthz; fails unless the server answers 200.",
        opts: no_opts,
    },
    Command {
        path: &["server", "metrics"],
        args: "",
        about: "Print the server's Prometheus metrics (/metrics).",
        opts: no_opts,
    },
    Command {
        path: &["group", "set"],
        args: "QUEUE MODE",
        about: "Make a queue group loadbalance or broadcast (/control).",
        opts: no_opts,
    },
    Command {
        path: &["group", "ls"],
        args: "",
        about: "List the queue groups set to a mode (/control).",
        opts: no_opts,
    },
    Command {
        path: &["cluster", "status"],
        args: "",
        about: "Show the cluster's leader, term and members (/control).",
        opts: no_opts,
    },
    Command {
        path: &["cluster", "add"],
        args: "ID RAFT_ADDR ADDR",
        about: "Add a node started with -join; waits until it has caught up and votes (/control).",
        opts: no_opts,
    },
    Command {
        path: &["cluster", "remove"],
        args: "ID",
        about: "Remove a node from the cluster (/control).",
        opts: no_opts,
    },
    Command {
        path: &["rtt"],
        args: "",
        about: "Measure the round trip to the server (ping).",
        opts: no_opts,
    },
    Command {
        path: &["bench"],
        args: "pub|sub|fanout|queue|reqrep|stream|subscribe",
        about: "Measure throughput and latency; prints a summary table.",
        opts: bench_opts,
    },
];

fn global_opts(o: &mut Options) {
    o.optopt(
        "s",
        "server",
        "server address(es), tried in order (env GOMBUS_URL; default 127.0.0.1:8080)",
        "HOST:PORT,...",
    );
    o.optopt(
        "",
        "token",
        "token for the / namespace (env GOMBUS_TOKEN)",
        "TOKEN",
    );
    o.optopt(
        "",
        "control-token",
        "token for /control (env GOMBUS_CONTROL_TOKEN)",
        "TOKEN",
    );
    o.optflag("", "json", "print JSON instead of text");
    o.optopt(
        "",
        "timeout",
        "bound on connecting and each answer (default 5s)",
        "DURATION",
    );
    o.optflag("h", "help", "show help");
}

/// A parsed invocation.
pub struct Parsed {
    pub command: &'static Command,
    pub global: Global,
    /// The positional arguments after the command words.
    pub args: Vec<String>,
    pub matches: Matches,
}

impl Parsed {
    pub fn opt(&self, name: &str) -> Option<String> {
        self.matches.opt_str(name)
    }

    pub fn flag(&self, name: &str) -> bool {
        self.matches.opt_present(name)
    }

    /// A whole-number option, with the option named in the error.
    pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, ArgError> {
        self.opt(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| self.usage_error(format!("--{name}: {v:?} is not a whole number")))
            })
            .transpose()
    }

    /// A duration option (`250ms`, `5s`, `1m`).
    pub fn opt_duration(&self, name: &str) -> Result<Option<Duration>, ArgError> {
        self.opt(name)
            .map(|v| parse_duration(&v).map_err(|e| self.usage_error(format!("--{name}: {e}"))))
            .transpose()
    }

    /// A size option (`512`, `64KiB`, `1MB`).
    pub fn opt_size(&self, name: &str) -> Result<Option<u64>, ArgError> {
        self.opt(name)
            .map(|v| parse_bytes(&v).map_err(|e| self.usage_error(format!("--{name}: {e}"))))
            .transpose()
    }

    pub fn usage_error(&self, msg: String) -> ArgError {
        ArgError::Usage(
            msg,
            format!("gombus {} --help", self.command.path.join(" ")),
        )
    }
}

/// The top-level help: global flags and every command.
pub fn main_help() -> String {
    let mut o = Options::new();
    global_opts(&mut o);
    let mut out = String::from(
        "Usage: gombus [global flags] COMMAND [args] [flags]\n\
         \x20      gombus --version\n\n\
         The gombus command line: publish, subscribe, request, manage streams\n\
         and consumers, inspect servers, and benchmark.\n\nCommands:\n",
    );
    let left = |c: &Command| format!("{} {}", c.path.join(" "), c.args);
    let width = COMMANDS.iter().map(|c| left(c).len()).max().unwrap_or(0);
    for c in COMMANDS {
        out.push_str(&format!("  {:<width$}  {}\n", left(c), c.about));
    }
    out.push('\n');
    out.push_str(&o.usage_with_format(|rows| {
        let mut s = String::from("Global flags:\n");
        for r in rows {
            s.push_str(&r);
            s.push('\n');
        }
        s
    }));
    out.push_str("\nRun `gombus COMMAND --help` for a command's flags.\n");
    out
}

/// Help for one command, or for a group (`gombus stream --help`).
fn command_help(c: &Command) -> String {
    let mut o = Options::new();
    (c.opts)(&mut o);
    let path = c.path.join(" ");
    let head = format!("Usage: gombus {path} {} [flags]\n\n{}\n", c.args, c.about);
    let mut g = Options::new();
    global_opts(&mut g);
    let own = o.usage_with_format(|rows| rows.collect::<Vec<_>>().join("\n"));
    let global = g.usage_with_format(|rows| rows.collect::<Vec<_>>().join("\n"));
    let own = if own.trim().is_empty() {
        String::new()
    } else {
        format!("\nFlags:\n{own}\n")
    };
    format!("{head}{own}\nGlobal flags:\n{global}\n")
}

fn group_help(group: &str) -> String {
    let mut out = format!("Usage: gombus {group} SUBCOMMAND [args] [flags]\n\nSubcommands:\n");
    for c in COMMANDS.iter().filter(|c| c.path[0] == group) {
        out.push_str(&format!("  {:<8} {:<22} {}\n", c.path[1], c.args, c.about));
    }
    out.push_str(&format!(
        "\nRun `gombus {group} SUBCOMMAND --help` for its flags.\n"
    ));
    out
}

/// Parses the arguments (without the program name); `env` reads the
/// environment (`std::env::var` in the binary).
pub fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Parsed, ArgError> {
    let main_usage = || "gombus --help".to_string();
    if let [only] = args {
        if only == "--version" || only == "-version" {
            return Err(ArgError::Help(format!(
                "gombus {}\n",
                env!("CARGO_PKG_VERSION")
            )));
        }
    }
    // Global flags before the command words.
    let mut pre = Options::new();
    global_opts(&mut pre);
    pre.parsing_style(ParsingStyle::StopAtFirstFree);
    let head = pre
        .parse(args)
        .map_err(|e| ArgError::Usage(e.to_string(), main_usage()))?;
    let words = &head.free;
    let Some(first) = words.first() else {
        if head.opt_present("help") {
            return Err(ArgError::Help(main_help()));
        }
        return Err(ArgError::Usage("no command given".into(), main_usage()));
    };
    if first == "help" {
        return Err(ArgError::Help(main_help()));
    }
    let group: Vec<&Command> = COMMANDS.iter().filter(|c| c.path[0] == *first).collect();
    let command = match group.as_slice() {
        [] => {
            return Err(ArgError::Usage(
                format!("unknown command {first:?}"),
                main_usage(),
            ));
        }
        [only] if only.path.len() == 1 => *only,
        _ => {
            let sub = words.get(1).map(String::as_str);
            let wants_help =
                head.opt_present("help") || matches!(sub, None | Some("--help" | "-h" | "help"));
            match sub.and_then(|s| group.iter().find(|c| c.path[1] == s)) {
                Some(c) => *c,
                None if wants_help && sub.is_none_or(|s| s.starts_with('-') || s == "help") => {
                    return Err(ArgError::Help(group_help(first)));
                }
                None => {
                    let names: Vec<&str> = group.iter().map(|c| c.path[1]).collect();
                    let msg = match sub {
                        Some(s) => format!(
                            "unknown {first} subcommand {s:?} (use {})",
                            names.join(", ")
                        ),
                        None => format!("{first} needs a subcommand ({})", names.join(", ")),
                    };
                    return Err(ArgError::Usage(msg, format!("gombus {first} --help")));
                }
            }
        }
    };
    let rest = &words[command.path.len()..];
    let mut o = Options::new();
    global_opts(&mut o);
    (command.opts)(&mut o);
    let cmd_usage = || format!("gombus {} --help", command.path.join(" "));
    let m = o
        .parse(rest)
        .map_err(|e| ArgError::Usage(e.to_string(), cmd_usage()))?;
    if m.opt_present("help") || head.opt_present("help") {
        return Err(ArgError::Help(command_help(command)));
    }
    // Global flags may be given before or after the command; after wins.
    let pick = |name: &str| m.opt_str(name).or_else(|| head.opt_str(name));
    let servers = pick("server")
        .or_else(|| env("GOMBUS_URL"))
        .unwrap_or_else(|| DEFAULT_SERVER.to_string());
    let servers: Vec<String> = servers
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if servers.is_empty() {
        return Err(ArgError::Usage(
            "--server: no address given".into(),
            cmd_usage(),
        ));
    }
    let timeout = match pick("timeout") {
        Some(v) => parse_duration(&v)
            .map_err(|e| ArgError::Usage(format!("--timeout: {e}"), cmd_usage()))?,
        None => Duration::from_secs(5),
    };
    let global = Global {
        servers,
        token: pick("token")
            .or_else(|| env("GOMBUS_TOKEN"))
            .filter(|t| !t.is_empty()),
        control_token: pick("control-token")
            .or_else(|| env("GOMBUS_CONTROL_TOKEN"))
            .filter(|t| !t.is_empty()),
        json: m.opt_present("json") || head.opt_present("json"),
        timeout,
    };
    let want = command.args.split_whitespace().count();
    let args = m.free.clone();
    let parsed = Parsed {
        command,
        global,
        args,
        matches: m,
    };
    if command.path != ["bench"] && parsed.args.len() != want {
        let msg = if parsed.args.len() < want {
            format!("missing arguments: expected {}", command.args)
        } else {
            format!("unexpected argument {:?}", parsed.args[want])
        };
        return Err(parsed.usage_error(msg));
    }
    if command.path == ["bench"] && parsed.args.len() != 1 {
        return Err(parsed.usage_error(format!(
            "bench needs exactly one workload: {}",
            command.args
        )));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn version_flag_prints_the_version() {
        for flag in ["--version", "-version"] {
            let Err(ArgError::Help(text)) = parse(&argv(flag), &no_env) else {
                panic!("{flag} did not print the version");
            };
            assert_eq!(text, format!("gombus {}\n", env!("CARGO_PKG_VERSION")));
        }
        let Err(ArgError::Help(help)) = parse(&argv("--help"), &no_env) else {
            panic!("no help");
        };
        assert!(help.contains("gombus --version"), "{help}");
    }

    #[test]
    fn globals_before_or_after_the_command() {
        let a = parse(&argv("--json -s 10.0.0.1:1,10.0.0.2:2 stream ls"), &no_env).unwrap();
        let b = parse(
            &argv("stream ls --json --server=10.0.0.1:1,10.0.0.2:2"),
            &no_env,
        )
        .unwrap();
        assert_eq!(a.global, b.global);
        assert!(a.global.json);
        assert_eq!(a.global.servers, ["10.0.0.1:1", "10.0.0.2:2"]);
        assert_eq!(a.command.path, ["stream", "ls"]);
    }

    #[test]
    fn env_fills_what_flags_leave_out() {
        let env = |k: &str| match k {
            "GOMBUS_URL" => Some("h:1".to_string()),
            "GOMBUS_CONTROL_TOKEN" => Some("ct".to_string()),
            _ => None,
        };
        let p = parse(&argv("server info"), &env).unwrap();
        assert_eq!(p.global.servers, ["h:1"]);
        assert_eq!(p.global.control_token.as_deref(), Some("ct"));
        let p = parse(&argv("server info --control-token x -s h:2"), &env).unwrap();
        assert_eq!(p.global.servers, ["h:2"]);
        assert_eq!(p.global.control_token.as_deref(), Some("x"));
    }

    #[test]
    fn positional_arguments_and_options() {
        let p = parse(
            &argv("pub a.b 42 --count 3 --header x:1 --header y:2"),
            &no_env,
        )
        .unwrap();
        assert_eq!(p.args, ["a.b", "42"]);
        assert_eq!(p.opt_u64("count").unwrap(), Some(3));
        assert_eq!(p.matches.opt_strs("header"), ["x:1", "y:2"]);
        let e = parse(&argv("pub a.b 1 --count many"), &no_env)
            .unwrap()
            .opt_u64("count");
        assert!(matches!(e, Err(ArgError::Usage(m, _)) if m.contains("--count")));
    }

    #[test]
    fn usage_errors_name_the_problem() {
        let usage = |s: &str| match parse(&argv(s), &no_env) {
            Err(ArgError::Usage(m, hint)) => (m, hint),
            Err(ArgError::Help(_)) => panic!("{s}: help"),
            Ok(_) => panic!("{s}: parsed"),
        };
        assert!(usage("").0.contains("no command"));
        assert!(usage("frobnicate").0.contains("unknown command"));
        assert!(usage("pub only-subject").0.contains("missing arguments"));
        assert!(usage("sub a b").0.contains("unexpected argument"));
        assert!(usage("stream explode")
            .0
            .contains("unknown stream subcommand"));
        assert!(usage("sub x --bogus").0.contains("bogus"));
        assert_eq!(usage("sub x --bogus").1, "gombus sub --help");
        assert!(usage("bench").0.contains("workload"));
        assert!(usage("req a b --timeout soon").0.contains("--timeout"));
    }

    #[test]
    fn help_everywhere() {
        for s in [
            "--help",
            "help",
            "-h",
            "pub --help",
            "stream --help",
            "stream",
            "stream add --help",
            "--help consumer next",
            "bench -h",
        ] {
            assert!(
                matches!(parse(&argv(s), &no_env), Err(ArgError::Help(_))),
                "{s}"
            );
        }
        let Err(ArgError::Help(text)) = parse(&argv("stream add --help"), &no_env) else {
            panic!()
        };
        assert!(
            text.contains("--subjects") && text.contains("--json"),
            "{text}"
        );
        let Err(ArgError::Help(text)) = parse(&argv("--help"), &no_env) else {
            panic!()
        };
        for c in COMMANDS {
            assert!(text.contains(&c.path.join(" ")), "{}", c.path.join(" "));
        }
    }
}
