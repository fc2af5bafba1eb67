//! Interop: real Socket.IO clients that nobody here wrote (python-socketio
//! 5.x and socket.io-client 4.x, pinned by scripts/test-deps.sh) run the
//! checks in tests/interop/ against a broker, in each transport mode: their
//! default (long-polling, then the upgrade to WebSocket), WebSocket only,
//! and long-polling with upgrades off.
//! Contract: docs/PROTOCOL.md §1 (transports), §2 (namespaces,
//! acks), §3 (subjects), §4 (pub/sub, request/reply, binary data), §5
//! (streams: both clients create one, publish, get, fetch, ack, purge and
//! take a push delivery, checking the shape of each ack;
//! tests/interop/py_streams.py holds every row of the stream table to the
//! exact shape of its ack, with the client's default transports).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long one client script may run before it is killed. The scripts bound
/// every wait to 5 s and end themselves after 50 s; this is the backstop.
const SCRIPT_RUN_MAX: Duration = Duration::from_secs(60);

const CONTROL_TOKEN: &str = "secret";

/// socket.io-client 4.x's checks: the shared ones and streams.
const NODE_CHECKS: [&str; 10] = [
    "connect",
    "control_info",
    "control_unauthorized",
    "pubsub_wildcard",
    "request_reply",
    "error_acks",
    "binary",
    "streams",
    "stream_binary",
    "kv",
];

/// The python-socketio script's checks: the shared ones and streams.
const PY_CHECKS: [&str; 8] = [
    "connect",
    "control_info",
    "control_unauthorized",
    "pubsub_wildcard",
    "request_reply",
    "error_acks",
    "binary",
    "streams",
];

/// The checks of py_streams.py (contract §5, one or more rows each).
const PY_STREAM_CHECKS: [&str; 12] = [
    "create_info_list",
    "publish_get",
    "purge",
    "limits",
    "duplicates",
    "interest",
    "workqueue",
    "consumers",
    "push",
    "fetch_waits",
    "binary",
    "delete",
];

/// The checks of py_kv.py (contract §14 and `max_msgs_per_subject`).
const PY_KV_CHECKS: [&str; 7] = [
    "per_subject",
    "buckets",
    "put_get",
    "cas_delete_purge",
    "race",
    "watch",
    "delete_bucket",
];

const DEPS_HINT: &str =
    "run `scripts/test-deps.sh` (or `make test`) to install the interop clients";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What a finished (or killed) script left behind.
struct Outcome {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn describe(&self) -> String {
        let status = match self.status {
            Some(status) => status.to_string(),
            None => format!("killed after {SCRIPT_RUN_MAX:?}"),
        };
        format!(
            "status: {status}\n---- stdout ----\n{}\n---- stderr ----\n{}",
            self.stdout, self.stderr
        )
    }
}

/// Reads a pipe to its end on a thread of its own, so neither pipe can fill
/// up and stall the child while we wait on the other.
fn drain<R: Read + Send + 'static>(
    pipe: Option<R>,
    done: mpsc::Sender<()>,
) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut pipe) = pipe {
            // A read error just ends the capture; what was read is kept.
            let _ = pipe.read_to_end(&mut text);
        }
        let _ = done.send(());
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// Waits for the child's pipes to close (it exited, or it closed them) and
/// then for its status; kills it once `SCRIPT_RUN_MAX` has passed.
fn run_bounded(mut child: Child) -> Outcome {
    let (done_tx, done_rx) = mpsc::channel();
    let stdout = drain(child.stdout.take(), done_tx.clone());
    let stderr = drain(child.stderr.take(), done_tx);
    let deadline = Instant::now() + SCRIPT_RUN_MAX;
    let mut finished = 0;
    while finished < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => finished += 1,
            Err(_) => break,
        }
    }
    let status = if finished == 2 {
        child.wait().ok()
    } else {
        // Past the bound: kill it, and let the pipes close with it.
        let _ = child.kill();
        let _ = child.wait();
        None
    };
    Outcome {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn require(path: &Path, what: &str) {
    assert!(
        path.exists(),
        "{what} is missing ({} does not exist): {DEPS_HINT}",
        path.display()
    );
}

/// The checks socket.io-client 2.x runs (Engine.IO v3, Socket.IO v4).
const LEGACY_CHECKS: [&str; 4] = ["connect", "control", "pubsub_wildcard", "request_reply"];

/// `mode`: `websocket`, `default` or `polling` (see the scripts).
fn run_checks(program: &Path, script: &Path, client: &str, mode: &str, checks: &[&str]) {
    run_checks_with(program, script, client, mode, checks, &[]);
}

/// [`run_checks`] against a broker started with `extra` flags as well.
fn run_checks_with(
    program: &Path,
    script: &Path,
    client: &str,
    mode: &str,
    checks: &[&str],
    extra: &[&str],
) {
    require(script, "the interop script");
    // A short ping interval: python-engineio's polling client can lose its
    // own close packet (its write thread stops once `disconnect()` changes
    // the state, even with packets queued), and then waits for the next
    // ping to end its long poll. At the default 25 s that wait is a stalled
    // test; at 2 s it is a pause. Every check still runs as written.
    let mut args = vec![
        format!("-control-token={CONTROL_TOKEN}"),
        "-ping-interval=2s".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let broker = common::Broker::start(&args);
    let url = format!("http://{}", broker.addr);
    let child = Command::new(program)
        .arg(script)
        .arg(&url)
        .arg(CONTROL_TOKEN)
        .arg(mode)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| {
            panic!(
                "cannot start {} for {client}: {err}; {DEPS_HINT}",
                program.display()
            )
        });
    let outcome = run_bounded(child);
    let missing: Vec<&str> = checks
        .iter()
        .copied()
        .filter(|name| {
            !outcome
                .stdout
                .lines()
                .any(|line| line.trim_end() == format!("PASS {name}"))
        })
        .collect();
    let exited_ok = outcome.status.is_some_and(|status| status.success());
    assert!(
        exited_ok && missing.is_empty(),
        "{client} ({mode}) against {url}: checks not passed: {missing:?}\n{}",
        outcome.describe()
    );
}

/// Runs `tests/interop/<script>` with the venv's Python (python-socketio).
fn python_script(script: &str, client: &str, mode: &str, checks: &[&str]) {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    require(&python, "the Python venv with python-socketio");
    let script = root.join("tests/interop").join(script);
    run_checks(&python, &script, client, mode, checks);
}

/// Runs `tests/interop/<dir>/client.mjs` with node against the
/// socket.io-client installed in that folder (`what` names it if missing).
fn node_script(dir: &str, what: &str, client: &str, mode: &str, checks: &[&str]) {
    let node_dir = repo_root().join("tests/interop").join(dir);
    require(
        &node_dir.join("node_modules/socket.io-client/package.json"),
        what,
    );
    run_checks(
        Path::new("node"),
        &node_dir.join("client.mjs"),
        client,
        mode,
        checks,
    );
}

fn python(mode: &str) {
    python_script("py_client.py", "python-socketio", mode, &PY_CHECKS);
}

fn node(mode: &str) {
    node_script(
        "node",
        "socket.io-client in tests/interop/node/node_modules",
        "socket.io-client",
        mode,
        &NODE_CHECKS,
    );
}

#[test]
fn python_socketio_streams_contract() {
    python_script(
        "py_streams.py",
        "python-socketio streams",
        "default",
        &PY_STREAM_CHECKS,
    );
}

#[test]
fn python_socketio_kv_contract() {
    python_script("py_kv.py", "python-socketio kv", "default", &PY_KV_CHECKS);
}

#[test]
fn python_socketio_client_interop() {
    python("websocket");
}

#[test]
fn python_socketio_default_transports_poll_then_upgrade() {
    python("default");
}

#[test]
fn python_socketio_stays_on_polling() {
    python("polling");
}

#[test]
fn node_socket_io_client_interop() {
    node("websocket");
}

#[test]
fn node_socket_io_default_transports_poll_then_upgrade() {
    node("default");
}

#[test]
fn node_socket_io_stays_on_polling_without_upgrades() {
    node("polling");
}

fn legacy_node(mode: &str) {
    node_script(
        "node2",
        "socket.io-client 2.x in tests/interop/node2/node_modules",
        "socket.io-client 2.x",
        mode,
        &LEGACY_CHECKS,
    );
}

#[test]
fn legacy_socket_io_client_2_polls_then_upgrades_with_eio3() {
    legacy_node("default");
}

#[test]
fn legacy_socket_io_client_2_on_polling_only() {
    legacy_node("polling");
}

/// The checks of py_users.py and node/users.mjs (docs/PROTOCOL.md §11):
/// admission by token, publish and subscribe rights with a deny cut, one
/// answer per delivered request, stream rights and the filtered list.
const USERS_CHECKS: [&str; 5] = [
    "unauthorized",
    "publish",
    "subscribe",
    "responses",
    "streams",
];

fn users_flag() -> String {
    format!(
        "-users={}",
        repo_root().join("tests/users/users.json").display()
    )
}

#[test]
fn python_socketio_users_and_permissions() {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    require(&python, "the Python venv with python-socketio");
    let script = root.join("tests/interop/py_users.py");
    for mode in ["websocket", "default"] {
        run_checks_with(
            &python,
            &script,
            "python-socketio users",
            mode,
            &USERS_CHECKS,
            &[&users_flag()],
        );
    }
}

#[test]
fn node_socket_io_client_users_and_permissions() {
    let node_dir = repo_root().join("tests/interop/node");
    require(
        &node_dir.join("node_modules/socket.io-client/package.json"),
        "socket.io-client in tests/interop/node/node_modules",
    );
    for mode in ["websocket", "default"] {
        run_checks_with(
            Path::new("node"),
            &node_dir.join("users.mjs"),
            "socket.io-client users",
            mode,
            &USERS_CHECKS,
            &[&users_flag()],
        );
    }
}

#[test]
fn legacy_socket_io_client_2_names_its_user_in_the_handshake_query() {
    let node_dir = repo_root().join("tests/interop/node2");
    require(
        &node_dir.join("node_modules/socket.io-client/package.json"),
        "socket.io-client 2.x in tests/interop/node2/node_modules",
    );
    for mode in ["default", "polling"] {
        run_checks_with(
            Path::new("node"),
            &node_dir.join("users.mjs"),
            "socket.io-client 2.x users",
            mode,
            &["refused", "rights"],
            &[&users_flag()],
        );
    }
}
