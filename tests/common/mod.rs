//! Test harness: starts a real `broker` process on a free port with its own
//! data directory, waits (bounded) until it listens, and cleans up on drop.

#![allow(dead_code)] // Each test binary uses a different part of it.

pub mod raw_ws;
#[path = "../support/mod.rs"]
pub mod support;

#[allow(unused_imports)] // each test binary calls a different part
pub use support::{broker_bin, free_port, http_exchange, http_get, try_http_get, Log, TempDir};

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long a broker may take to print its `listening on` line.
const STARTUP_WAIT: Duration = Duration::from_secs(10);
/// How many stderr lines are kept to show when a test fails.
const LOG_LINES_MAX: usize = 200;
/// The marker the broker prints once it accepts connections.
const LISTENING_MARKER: &str = "listening on ";

/// A running broker process.
pub struct Broker {
    child: Child,
    /// The program and the arguments before the broker's own (a launcher
    /// such as `qemu-aarch64` and the binary), for [`Broker::restart`].
    program: Vec<String>,
    /// `127.0.0.1:PORT`, ready for `Client::connect`.
    pub addr: String,
    data_dir: PathBuf,
    log: Log,
    /// The thread copying stderr into `log`; it ends at the pipe's EOF.
    reader: Option<thread::JoinHandle<()>>,
}

impl Broker {
    /// Starts the broker (`GOMBUS_BIN`, else the crate's `broker` binary)
    /// with a free port, node id `test`, a fresh data dir and `extra_args`.
    pub fn start(extra_args: &[&str]) -> Broker {
        Broker::start_with_env(extra_args, &[])
    }

    /// [`Broker::start`] with extra environment variables (`GOMBUS_*`).
    pub fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::start_program(&broker_bin(), extra_args, env)
    }

    /// [`Broker::start_with_env`] with the broker binary at `bin` (e.g. an
    /// installed copy).
    pub fn start_program(bin: &str, extra_args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::start_command(&[bin.to_string()], extra_args, env)
    }

    /// [`Broker::start_program`] through a launcher: `program` is the
    /// command and its first arguments (`["qemu-arm", "/path/broker"]`).
    pub fn start_command(program: &[String], extra_args: &[&str], env: &[(&str, &str)]) -> Broker {
        let data_dir = TempDir::new("test").keep();
        let bin = program.join(" ");
        let log = Log::default();
        let (child, lines_rx, reader) = support::spawn_logged(
            Command::new(&program[0])
                .args(&program[1..])
                .arg("-addr=127.0.0.1:0")
                .arg("-node-id=test")
                .arg(format!("-data={}", data_dir.display()))
                .args(extra_args)
                .envs(env.iter().copied()),
            &bin,
            &log,
            LOG_LINES_MAX,
        );
        let mut broker = Broker {
            child,
            program: program.to_vec(),
            addr: String::new(),
            data_dir,
            log,
            reader,
        };
        broker.addr = broker.await_listening(&lines_rx, extra_args);
        broker
    }

    fn await_listening(&mut self, lines: &mpsc::Receiver<String>, args: &[&str]) -> String {
        let deadline = Instant::now() + STARTUP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = listening_addr(&line) {
                        return addr;
                    }
                }
                Err(e) => {
                    self.kill();
                    panic!(
                        "broker {args:?} did not print `{LISTENING_MARKER}ADDR` within \
                         {STARTUP_WAIT:?} ({e}); stderr:\n{}",
                        self.recent_log()
                    );
                }
            }
        }
    }

    /// The broker's `-data` directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the broker in KiB (VmRSS), 0 if unreadable.
    pub fn rss_kb(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(path).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse().ok())
            .unwrap_or(0)
    }

    /// The last stderr lines, oldest first.
    pub fn recent_log(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Sends SIGTERM (by PID) and waits at most `limit` for the process to
    /// exit; its exit status, or `None` if it is still running.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .map(|s| s.success());
        assert!(matches!(sent, Ok(true)), "kill -TERM failed: {sent:?}");
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    // Every line the process wrote is in `recent_log` once
                    // the reader has seen the pipe close.
                    while self.reader.as_ref().is_some_and(|r| !r.is_finished())
                        && Instant::now() < deadline
                    {
                        thread::sleep(Duration::from_millis(5));
                    }
                    return Some(status);
                }
                Ok(None) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(10));
                }
                _ => return None,
            }
        }
    }

    /// Kills the process (by its PID) and reaps it; idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            eprintln!("--- broker stderr (last lines) ---\n{}", self.recent_log());
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

impl Broker {
    /// Kills the process with SIGKILL (by PID) and starts a new one on the
    /// same address and data directory with `extra_args`, waiting (bounded)
    /// until it listens. For tests of clients that outlive a crash.
    pub fn restart(&mut self, extra_args: &[&str]) {
        self.kill();
        let bin = self.program.join(" ");
        let (child, lines_rx, reader) = support::spawn_logged(
            Command::new(&self.program[0])
                .args(&self.program[1..])
                .arg(format!("-addr={}", self.addr))
                .arg("-node-id=test")
                .arg(format!("-data={}", self.data_dir.display()))
                .args(extra_args),
            &bin,
            &self.log,
            LOG_LINES_MAX,
        );
        self.reader = reader;
        self.child = child;
        let addr = self.await_listening(&lines_rx, extra_args);
        assert_eq!(addr, self.addr, "the restarted broker moved");
    }
}

/// The whitespace-delimited token after `listening on `, if present.
fn listening_addr(line: &str) -> Option<String> {
    let (_, rest) = line.split_once(LISTENING_MARKER)?;
    rest.split_whitespace().next().map(str::to_string)
}
