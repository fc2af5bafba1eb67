//! The aarch64 and armv7 binaries on their own architecture, under
//! qemu-user (`qemu-aarch64`, `qemu-arm`): each static broker and CLI
//! prints its version; the broker starts, answers `/healthz`, passes
//! python-socketio's checks (tests/interop/py_client.py: pub/sub with
//! wildcards, request/reply, binary data, a stream with a pull consumer,
//! the control namespace), stores a publish that the ARM CLI sends and
//! gets acked, stops on SIGTERM, and after a restart the ARM CLI reads the
//! message back.
//!
//! The binaries are built by `make cross-test` (part of `make test`) with
//! the `cross-test` profile into target/TARGET/cross-test/; the
//! toolchains and qemu-user are installed by scripts/cross-deps.sh. Where
//! either is missing the test says what and skips.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{http_get, Broker};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CONTROL_TOKEN: &str = "secret";

/// One emulated target.
struct Arch {
    triple: &'static str,
    qemu: &'static str,
    /// ELF `e_machine` and `EI_CLASS` (1: 32-bit, 2: 64-bit).
    machine: u16,
    class: u8,
}

const AARCH64: Arch = Arch {
    triple: "aarch64-unknown-linux-gnu",
    qemu: "qemu-aarch64",
    machine: 183,
    class: 2,
};

const ARMV7: Arch = Arch {
    triple: "armv7-unknown-linux-gnueabihf",
    qemu: "qemu-arm",
    machine: 40,
    class: 1,
};

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The target's broker and CLI, or why the test cannot run.
fn binaries(a: &Arch) -> Result<(PathBuf, PathBuf), String> {
    let on_path = Command::new(a.qemu).arg("-version").output();
    if !on_path.is_ok_and(|o| o.status.success()) {
        return Err(format!(
            "{} is not installed (Debian's qemu-user; scripts/cross-deps.sh --qemu installs it)",
            a.qemu
        ));
    }
    let dir = target_dir().join(a.triple).join("cross-test");
    let broker = dir.join("broker");
    let cli = dir.join("gombus");
    for b in [&broker, &cli] {
        if !b.is_file() {
            return Err(format!(
                "{} was not built: `make cross-test` builds it, and \
                 `scripts/cross-deps.sh --check {}` names what it lacks",
                b.display(),
                a.triple
            ));
        }
    }
    Ok((broker, cli))
}

/// Checks the ELF header: the target's machine and word size, and no
/// program interpreter (a static executable).
fn assert_static_elf(path: &Path, a: &Arch) {
    let bytes = std::fs::read(path).expect("read the binary");
    assert_eq!(&bytes[..4], b"\x7fELF", "{}: not ELF", path.display());
    assert_eq!(bytes[4], a.class, "{}: word size", path.display());
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    assert_eq!(machine, a.machine, "{}: e_machine", path.display());
    let word = |at: usize| -> u64 {
        if a.class == 2 {
            u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
        } else {
            u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()))
        }
    };
    let half = |at: usize| usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    let (phoff, phentsize, phnum) = if a.class == 2 {
        (word(32) as usize, half(54), half(56))
    } else {
        (word(28) as usize, half(42), half(44))
    };
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let kind = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_ne!(
            kind,
            PT_INTERP,
            "{} asks for a dynamic loader",
            path.display()
        );
    }
}

/// Runs the emulated CLI against `addr`; its output, which must succeed.
fn cli(a: &Arch, bin: &Path, addr: &str, args: &[&str]) -> Output {
    let out = Command::new(a.qemu)
        .arg(bin)
        .args(["--server", addr, "--timeout", "10s", "--json"])
        .args(args)
        .output()
        .expect("run the emulated CLI");
    assert!(
        out.status.success(),
        "gombus {args:?} under {}: {}\n{}",
        a.qemu,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cli_json(a: &Arch, bin: &Path, addr: &str, args: &[&str]) -> Value {
    let out = cli(a, bin, addr, args);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gombus {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn version(a: &Arch, bin: &Path, flag: &str) -> String {
    let out = Command::new(a.qemu)
        .arg(bin)
        .arg(flag)
        .output()
        .expect("run under qemu");
    assert!(
        out.status.success(),
        "{} {flag}: {}",
        bin.display(),
        out.status
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run_on(a: &Arch) {
    let (broker, cli_bin) = match binaries(a) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("emulated {}: skipped: {why}", a.triple);
            return;
        }
    };
    assert_static_elf(&broker, a);
    assert_static_elf(&cli_bin, a);
    assert_eq!(version(a, &broker, "-version"), format!("broker {VERSION}"));
    assert_eq!(
        version(a, &cli_bin, "-version"),
        format!("gombus {VERSION}")
    );

    let program = [a.qemu.to_string(), broker.display().to_string()];
    let token = format!("-control-token={CONTROL_TOKEN}");
    // python-engineio can lose its own close packet and then waits for the
    // next ping: a short interval keeps that a pause (see tests/interop.rs).
    let args = [token.as_str(), "-ping-interval=2s"];
    let started = Instant::now();
    let mut b = Broker::start_command(&program, &args, &[]);
    let start_time = started.elapsed();

    let (code, body) = http_get(&b.addr, "/healthz");
    assert_eq!(code, 200, "/healthz: {body}");
    eprintln!(
        "emulated {}: listening after {start_time:?}, idle RSS of qemu and the broker {} KiB",
        a.triple,
        b.rss_kb()
    );

    // A real Socket.IO client, over WebSocket.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test-deps.sh",
        python.display()
    );
    // The script bounds every wait and ends itself after 50 s.
    let out = Command::new(&python)
        .arg(root.join("tests/interop/py_client.py"))
        .arg(format!("http://{}", b.addr))
        .arg(CONTROL_TOKEN)
        .arg("websocket")
        .current_dir(root)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for check in [
        "connect",
        "pubsub_wildcard",
        "request_reply",
        "binary",
        "streams",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_end() == format!("PASS {check}")),
            "python-socketio against the {} broker: {check} did not pass\n{stdout}\n{}",
            a.triple,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        out.status.success(),
        "py_client.py: {}\n{stdout}",
        out.status
    );

    // An acked publish into a stream, by the emulated CLI.
    let created = cli_json(
        a,
        &cli_bin,
        &b.addr,
        &["stream", "add", "EDGE", "--subjects", "edge.>"],
    );
    assert_eq!(created["stream"]["config"]["name"], "EDGE", "{created}");
    let ack = cli_json(a, &cli_bin, &b.addr, &["pub", "edge.temp", "{\"c\":21.5}"]);
    assert_eq!(
        (&ack["stream"], &ack["seq"]),
        (&"EDGE".into(), &1.into()),
        "{ack}"
    );

    let status = b.terminate(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM: {status:?}\n{}",
        b.recent_log()
    );
    b.restart(&args);
    let got = cli_json(
        a,
        &cli_bin,
        &b.addr,
        &["stream", "get", "EDGE", "--seq", "1"],
    );
    assert_eq!(got["message"]["subject"], "edge.temp", "{got}");
    assert_eq!(
        got["message"]["data"],
        serde_json::json!({"c": 21.5}),
        "{got}"
    );
}

#[test]
fn aarch64_broker_and_cli_under_qemu() {
    run_on(&AARCH64);
}

#[test]
fn armv7_broker_and_cli_under_qemu() {
    run_on(&ARMV7);
}
