//! The `gombus` command line, on the blocking Rust client: everyday
//! messaging (`pub`, `sub`, `req`, `reply`, `rtt`), streams and consumers,
//! key-value buckets, queue group modes, server health, metrics and
//! cluster membership, and benchmarks. Every request event of the
//! contract (docs/PROTOCOL.md) but the node-to-node ones has a command;
//! tests/cli.rs checks that each of its fields has a flag.
//!
//! - [`args`]: global flags, the command table, parsing and help.
//! - [`output`]: text and `--json` printing, the failure type.
//! - [`commands`]: messaging, `/control` and HTTP commands.
//! - [`streams`]: `stream …` and `consumer …`, through the contract's
//!   events (section 5) with `Client::call`.
//! - [`kv`]: `kv …`, key-value buckets (section 14) through the client's
//!   `Kv` handle.
//! - [`bench`]: the benchmark workloads and their summary.
//!
//! Exit status: 0 on success, 1 when a command fails (connection, server
//! error, timeout), 2 for a usage error.

pub mod args;
pub mod bench;
pub mod commands;
pub mod kv;
pub mod output;
pub mod streams;

use crate::client::{Client, Options};
use args::{ArgError, Global, Parsed};
use output::Failure;

/// Which namespace a command talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    Root,
    Control,
}

/// Connects to the first server that answers, with the namespace's token.
pub fn connect(g: &Global, ns: Namespace) -> Result<Client, Failure> {
    connect_tuned(g, ns, |_| {})
}

/// [`connect`] with a different bound on each answer (long fetches).
pub fn connect_timeout(
    g: &Global,
    ns: Namespace,
    timeout: std::time::Duration,
) -> Result<Client, Failure> {
    connect_tuned(g, ns, |o| o.timeout = timeout)
}

/// [`connect`] with the client's options adjusted by `tune` (the bench
/// lets subscriptions queue more). The CLI never reconnects: a command
/// fails when its connection does.
pub fn connect_tuned(
    g: &Global,
    ns: Namespace,
    tune: impl Fn(&mut Options),
) -> Result<Client, Failure> {
    let (namespace, token) = match ns {
        Namespace::Root => ("/", g.token.clone()),
        Namespace::Control => ("/control", g.control_token.clone()),
    };
    let mut last = None;
    for server in &g.servers {
        let mut opts = Options {
            token: token.clone(),
            namespace: namespace.to_string(),
            timeout: g.timeout,
            ..Options::default()
        };
        tune(&mut opts);
        match Client::connect_with(server, opts) {
            Ok(c) => return Ok(c),
            Err(e) => last = Some((server, e)),
        }
    }
    match last {
        Some((server, e)) => Err(Failure::call(&format!("cannot connect to {server}"), &e)),
        None => Err(Failure("no server given".into())),
    }
}

/// Runs one invocation; returns the process exit status.
pub fn run(argv: &[String]) -> u8 {
    let env = |k: &str| std::env::var(k).ok();
    let parsed = match args::parse(argv, &env) {
        Ok(p) => p,
        Err(ArgError::Help(text)) => {
            print!("{text}");
            return 0;
        }
        Err(ArgError::Usage(msg, hint)) => {
            eprintln!("gombus: {msg}\nRun `{hint}` for usage.");
            return 2;
        }
    };
    match dispatch(&parsed) {
        Ok(()) => 0,
        Err(Run::Usage(ArgError::Usage(msg, hint))) => {
            eprintln!("gombus: {msg}\nRun `{hint}` for usage.");
            2
        }
        Err(Run::Usage(ArgError::Help(text))) => {
            print!("{text}");
            0
        }
        Err(Run::Failed(f)) => {
            eprintln!("gombus: {f}");
            1
        }
    }
}

/// Why a command stopped.
pub enum Run {
    Usage(ArgError),
    Failed(Failure),
}

impl From<ArgError> for Run {
    fn from(e: ArgError) -> Run {
        Run::Usage(e)
    }
}

impl From<Failure> for Run {
    fn from(f: Failure) -> Run {
        Run::Failed(f)
    }
}

fn dispatch(p: &Parsed) -> Result<(), Run> {
    match p.command.path {
        ["pub"] => commands::publish(p),
        ["sub"] => commands::subscribe(p),
        ["req"] => commands::request(p),
        ["reply"] => commands::reply(p),
        ["server", "info"] => commands::server_info(p),
        ["server", "health" | "metrics"] => commands::server_http(p),
        ["group", "set"] => commands::group_set(p),
        ["group", "ls"] => commands::group_list(p),
        ["rtt"] => commands::rtt(p),
        ["cluster", "status"] => commands::cluster_status(p),
        ["cluster", "add"] => commands::cluster_add(p),
        ["cluster", "remove"] => commands::cluster_remove(p),
        ["stream", _] => streams::stream(p),
        ["consumer", _] => streams::consumer(p),
        ["kv", _] => kv::kv(p),
        ["bench"] => bench::run(p),
        other => Err(Run::Failed(Failure(format!(
            "command {} is not implemented",
            other.join(" ")
        )))),
    }
}
