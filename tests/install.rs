//! `make install` and `make dist`, from outside: install into a temporary
//! DESTDIR with PREFIX=/usr, check the tree (binaries, hardened units,
//! environment file mode 0600 naming every variable, docs), start the
//! installed broker on a free loopback port and talk to it (HTTP and a
//! pub/sub round trip with the crate's client), stop it with SIGTERM by
//! PID; run `systemd-analyze verify` on the units where it exists; and
//! check that the dist tarball holds the same files with a SHA256SUMS that
//! `sha256sum -c` accepts.
//!
//! `make install` depends on `make build`: with bin/ up to date (as in
//! `make test`) it only copies.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{http_get, Broker, TempDir};
use gombus::client::Client;
use serde_json::json;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `make ARGS` in the repository; panics with its output if it fails.
fn make(args: &[String]) -> Output {
    let out = Command::new("make")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .output()
        .expect("run make");
    assert!(
        out.status.success(),
        "make {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The unit's directives a hardened broker service must carry.
const UNIT_MUSTS: &[&str] = &[
    "Type=exec",
    "DynamicUser=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "NoNewPrivileges=yes",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "SystemCallFilter=@system-service",
    "LimitNOFILE=65536",
    "Restart=on-failure",
    "RestartPreventExitStatus=2",
    "KillSignal=SIGTERM",
];

/// Runs the program and returns its stdout, asserting success.
fn run_ok(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {out:?}",
        program.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn make_install_puts_a_working_broker_and_hardened_units_in_destdir() {
    let dest = TempDir::new("install");
    let root = &dest.0;
    let install = [
        "install".to_string(),
        format!("DESTDIR={}", root.display()),
        "PREFIX=/usr".to_string(),
    ];
    make(&install);

    // The tree.
    let broker = root.join("usr/bin/gombus-broker");
    let cli = root.join("usr/bin/gombus");
    let units = root.join("usr/lib/systemd/system");
    let env_file = root.join("etc/gombus/gombus.env");
    for bin in [&broker, &cli] {
        assert_eq!(mode(bin), 0o755, "{}", bin.display());
    }
    for doc in [
        "README.md",
        "OPERATIONS.md",
        "PROTOCOL.md",
        "DESIGN.md",
        "PERFORMANCE.md",
    ] {
        assert!(
            root.join("usr/share/doc/gombus").join(doc).is_file(),
            "{doc}"
        );
    }
    // The environment file may hold tokens: root only.
    assert_eq!(mode(&env_file), 0o600);
    let env_text = read(&env_file);
    for var in [
        "GOMBUS_ADDR",
        "GOMBUS_CONTROL_TOKEN",
        "GOMBUS_USERS",
        "GOMBUS_CLUSTER",
        "GOMBUS_SYNC",
    ] {
        assert!(env_text.contains(&format!("#{var}=")), "{var}");
    }
    // Everything in it is commented out: the defaults apply as shipped.
    assert!(
        env_text
            .lines()
            .all(|l| l.trim().is_empty() || l.starts_with('#')),
        "{env_text}"
    );

    let service = read(&units.join("gombus.service"));
    let template = read(&units.join("gombus@.service"));
    for (name, text) in [("gombus.service", &service), ("gombus@.service", &template)] {
        assert!(
            !["@BINDIR@", "@SYSCONFDIR@", "@DOCDIR@"]
                .iter()
                .any(|p| text.contains(p)),
            "{name} keeps a placeholder:\n{text}"
        );
        for must in UNIT_MUSTS {
            assert!(
                text.lines().any(|l| l == *must),
                "{name} lacks {must}:\n{text}"
            );
        }
    }
    assert!(service.contains("\nExecStart=/usr/bin/gombus-broker -data=/var/lib/gombus\n"));
    assert!(service.contains("\nStateDirectory=gombus\n"));
    assert!(service.contains("\nEnvironmentFile=-/etc/gombus/gombus.env\n"));
    assert!(template.contains("\nExecStart=/usr/bin/gombus-broker -data=/var/lib/gombus/%i\n"));
    assert!(template.contains("\nStateDirectory=gombus/%i\n"));
    assert!(template.contains("\nEnvironmentFile=/etc/gombus/%i.env\n"));

    // The installed binaries run.
    assert_eq!(
        run_ok(&broker, &["-version"]).trim(),
        format!("broker {VERSION}")
    );
    assert_eq!(
        run_ok(&cli, &["--version"]).trim(),
        format!("gombus {VERSION}")
    );

    // The installed broker serves: health, and a message through it.
    let mut b = Broker::start_program(&broker.to_string_lossy(), &[], &[]);
    let (code, body) = http_get(&b.addr, "/healthz");
    assert_eq!((code, body.as_str()), (200, r#"{"status":"ok"}"#));
    let sub_client = Client::connect(&b.addr).expect("connect subscriber");
    let sub = sub_client.subscribe("install.check").expect("subscribe");
    let publisher = Client::connect(&b.addr).expect("connect publisher");
    publisher
        .publish("install.check", json!({ "ok": true }))
        .expect("publish");
    let m = sub
        .recv_timeout(Duration::from_secs(5))
        .expect("message through the installed broker");
    assert_eq!(m.data, json!({ "ok": true }));
    drop((sub, sub_client, publisher));
    // SIGTERM by PID stops it cleanly, as the unit's KillSignal does.
    let status = b.terminate(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        b.recent_log()
    );

    // A second install keeps an edited environment file.
    std::fs::write(&env_file, "GOMBUS_CONTROL_TOKEN=kept\n").expect("edit env file");
    make(&install);
    assert_eq!(read(&env_file), "GOMBUS_CONTROL_TOKEN=kept\n");

    verify_units(root, &units);
}

/// `systemd-analyze verify` on copies of the installed units whose paths
/// point into the DESTDIR (verify checks that ExecStart is executable),
/// the template as instance `gombus@n1`. Skipped, saying so, where
/// systemd-analyze is missing.
fn verify_units(root: &Path, units: &Path) {
    let have = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("systemd-analyze not found: unit verification skipped");
        return;
    }
    let dir = TempDir::new("units");
    let prefix = root.display().to_string();
    for (from, to) in [
        ("gombus.service", "gombus.service"),
        ("gombus@.service", "gombus@n1.service"),
    ] {
        let text = read(&units.join(from))
            .replace("=/usr/bin/", &format!("={prefix}/usr/bin/"))
            .replace("=-/etc/", &format!("=-{prefix}/etc/"))
            .replace("=/etc/", &format!("={prefix}/etc/"));
        std::fs::write(dir.0.join(to), text).expect("write unit copy");
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "gombus.service", "gombus@n1.service"])
        .current_dir(&dir.0)
        .output()
        .expect("run systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    // Any complaint about our units counts, even one verify lets pass.
    assert!(!err.contains("gombus"), "systemd-analyze verify: {err}");
}

#[test]
fn make_dist_builds_a_tarball_whose_sums_verify() {
    let out_dir = TempDir::new("dist");
    // The host's target only: the ARM tarballs are the same recipe, and
    // their binaries are tested under qemu by tests/emulated.rs.
    let out = make(&[
        "dist".to_string(),
        "TARGETS=x86_64-unknown-linux-gnu".to_string(),
        format!("DIST_OUT={}", out_dir.0.display()),
    ]);
    let name = format!("gombus-{VERSION}-x86_64-linux");
    let tarball = out_dir.0.join(format!("{name}.tar.gz"));
    assert!(
        tarball.is_file(),
        "no {}: {}",
        tarball.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    // Only the tarball is left behind.
    let left: Vec<_> = std::fs::read_dir(&out_dir.0)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");

    let unpack = TempDir::new("unpack");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpack.0)
        .status()
        .expect("run tar");
    assert!(status.success());
    let top = unpack.0.join(&name);
    for file in [
        "bin/gombus-broker",
        "bin/gombus",
        "systemd/gombus.service",
        "systemd/gombus@.service",
        "systemd/gombus.env",
        "README.md",
        "docs/OPERATIONS.md",
        "docs/PROTOCOL.md",
        "SHA256SUMS",
    ] {
        assert!(top.join(file).is_file(), "{file} missing from the tarball");
    }
    let sums = read(&top.join("SHA256SUMS"));
    for file in ["bin/gombus-broker", "bin/gombus", "systemd/gombus.service"] {
        assert!(
            sums.lines().any(|l| l.ends_with(&format!("  {file}"))),
            "{file} not in SHA256SUMS:\n{sums}"
        );
    }
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "SHA256SUMS"])
        .current_dir(&top)
        .output()
        .expect("run sha256sum");
    assert!(check.status.success(), "sha256sum -c: {check:?}");
    // A changed file is caught: the sums are real.
    std::fs::write(top.join("README.md"), "changed\n").expect("write");
    let tampered = Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(&top)
        .output()
        .expect("run sha256sum");
    assert!(!tampered.status.success());
    // The units in the tarball are set for the default PREFIX.
    let unit = read(&top.join("systemd/gombus.service"));
    assert!(unit.contains("\nExecStart=/usr/local/bin/gombus-broker -data=/var/lib/gombus\n"));
    assert_eq!(
        run_ok(&top.join("bin/gombus-broker"), &["-version"]).trim(),
        format!("broker {VERSION}")
    );
}

/// The budget of dist/size-budget: its one line that is a number.
fn size_budget() -> u64 {
    let text = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/size-budget"));
    let numbers: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(
        numbers.len(),
        1,
        "dist/size-budget holds one number: {text}"
    );
    numbers[0]
}

#[test]
fn release_broker_is_within_its_size_budget() {
    // `make test` passes the release broker of `make build`; a debug build
    // says nothing about the release's size.
    let Ok(bin) = std::env::var("GOMBUS_BIN") else {
        eprintln!("skipped: GOMBUS_BIN names no release broker (`make test` sets it)");
        return;
    };
    let budget = size_budget();
    let size = std::fs::metadata(&bin).expect("stat the broker").len();
    assert!(
        size <= budget,
        "{bin} is {size} bytes, over the budget of {budget} in dist/size-budget \
         (docs/PERFORMANCE.md, \"Binary size\")"
    );
}
