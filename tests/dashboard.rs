//! The dashboard in a real headless browser (Debian's `chromium`, which
//! scripts/test-deps.sh installs): the page loads and runs its script with
//! no console message, shows the node and the live connection count read
//! from /api/info and a stream the test created with its consumer's pending
//! count, and a screenshot is saved under target/test-artifacts/.
//! Also: /api/info's JSON and the control-token protection of both.
//!
//! A missing chromium fails these tests; they never skip.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::Client;
use serde_json::{json, Value};

const TOKEN: &str = "dash-secret";
const BROWSER_LIMIT: Duration = Duration::from_secs(60);

fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`chromium` is not on PATH: run scripts/test-deps.sh (apt-get install chromium)")
    })
}

fn fresh_profile(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gombus-chromium-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless chromium on `url` with `extra` flags, bounded; kills it
/// by PID if it hangs.
fn browse(url: &str, extra: &[String], tag: &str) -> Output {
    let profile = fresh_profile(tag);
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_t = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + BROWSER_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {BROWSER_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_dir_all(&profile);
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

/// Console messages chromium logged (`…:CONSOLE(line)] "text", source: …`).
fn console_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE")).collect()
}

/// The text inside the element with `id`, from a DOM dump.
fn text_of(dom: &str, id: &str) -> Option<String> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[start..];
    let open_end = rest.find('>')? + 1;
    let close = rest[open_end..].find('<')?;
    Some(rest[open_end..open_end + close].to_string())
}

/// The cells of the streams table's row for `name`, from a DOM dump.
fn streams_row(dom: &str, name: &str) -> Option<Vec<String>> {
    let table = &dom[dom.find("id=\"streams\"")?..];
    let table = &table[..table.find("</table>")?];
    table.split("<tr>").find_map(|row| {
        let cells: Vec<String> = row
            .split("<td>")
            .skip(1)
            .map(|c| c.split("</td>").next().unwrap_or("").replace("&gt;", ">"))
            .collect();
        (cells.first().map(String::as_str) == Some(name)).then_some(cells)
    })
}

fn http(addr: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn api_info_and_the_page_need_the_control_token() {
    let b = Broker::start(&[&format!("-control-token={TOKEN}")]);
    for path in ["/", "/api/info"] {
        let (status, body) = http(&b.addr, path, "");
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(
            http(&b.addr, path, "Authorization: Bearer wrong\r\n").0,
            401
        );
        assert_eq!(http(&b.addr, &format!("{path}?token=nope"), "").0, 401);
        assert_eq!(http(&b.addr, &format!("{path}?token={TOKEN}"), "").0, 200);
    }
    let c = Client::connect(&b.addr).unwrap();
    let _sub = c.subscribe("a.b").unwrap();
    c.publish_acked("a.b", json!("x")).unwrap();
    let (status, body) = http(
        &b.addr,
        "/api/info",
        &format!("Authorization: Bearer {TOKEN}\r\n"),
    );
    assert_eq!(status, 200);
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["node_id"], "test");
    assert_eq!(info["connections"], 1);
    assert_eq!(info["subscriptions"], 1);
    assert_eq!(info["messages"]["in"], 1);
    assert_eq!(info["messages"]["out"], 1);
    assert_eq!(info["slow_consumers"], 0);
    assert_eq!(info["streams"], json!([]));
    c.call("stream.create", json!({"name": "S1", "subjects": ["s1.>"]}))
        .unwrap();
    c.publish_acked("s1.a", json!(1)).unwrap();
    c.call("consumer.create", json!({"stream": "S1", "name": "c1"}))
        .unwrap();
    let (_, body) = http(
        &b.addr,
        "/api/info",
        &format!("Authorization: Bearer {TOKEN}\r\n"),
    );
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["streams"][0]["name"], "S1");
    assert_eq!(info["streams"][0]["messages"], 1);
    assert_eq!(info["streams"][0]["consumers"][0]["name"], "c1");
    assert_eq!(info["streams"][0]["consumers"][0]["num_pending"], 1);
    assert!(info["cluster"].is_null());
    assert!(info["history"]["rows"].is_array());
    // Without a token configured, both are open.
    let open = Broker::start(&[]);
    assert_eq!(http(&open.addr, "/api/info", "").0, 200);
    let (status, page) = http(&open.addr, "/", "");
    assert_eq!(status, 200);
    assert!(page.contains("<canvas id=\"chart\""));
}

#[test]
fn rates_come_from_per_second_samples() {
    let b = Broker::start(&[]);
    let c = Client::connect(&b.addr).unwrap();
    let _sub = c.subscribe("r.>").unwrap();
    // Publish until a sample shows the traffic (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while Instant::now() < deadline && !seen {
        for _ in 0..20 {
            c.publish("r.x", 1).unwrap();
        }
        c.ping().unwrap();
        let info: Value = serde_json::from_str(&http(&b.addr, "/api/info", "").1).unwrap();
        seen = info["history"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r[1].as_f64().unwrap() > 0.0 && r[2].as_f64().unwrap() > 0.0);
        thread::sleep(Duration::from_millis(50));
    }
    assert!(seen, "no sample with traffic within 10 s");
}

#[test]
fn dashboard_renders_in_headless_chromium_without_console_messages() {
    let b = Broker::start(&[&format!("-control-token={TOKEN}")]);
    // Three clients on `/` stay connected while the browser looks.
    let clients: Vec<Client> = (0..3).map(|_| Client::connect(&b.addr).unwrap()).collect();
    let _sub = clients[0].subscribe("dash.>").unwrap();
    clients[1]
        .publish_acked("dash.x", json!({"hello": 1}))
        .unwrap();
    // A stream with three messages and a consumer that has taken none.
    clients[2]
        .call(
            "stream.create",
            json!({"name": "DASHSTREAM", "subjects": ["shown.>"]}),
        )
        .unwrap();
    for i in 0..3 {
        clients[2].publish_acked("shown.x", json!(i)).unwrap();
    }
    clients[2]
        .call(
            "consumer.create",
            json!({"stream": "DASHSTREAM", "name": "reader"}),
        )
        .unwrap();
    let url = format!("http://{}/?token={TOKEN}", b.addr);

    let out = browse(
        &url,
        &[
            "--virtual-time-budget=5000".to_string(),
            "--dump-dom".to_string(),
        ],
        "dom",
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {log}");
    assert_eq!(
        console_lines(&log),
        Vec::<&str>::new(),
        "console messages:\n{log}"
    );
    assert_eq!(text_of(&dom, "node").as_deref(), Some("test"), "{dom}");
    assert_eq!(text_of(&dom, "connections").as_deref(), Some("3"), "{dom}");
    assert_eq!(
        text_of(&dom, "subscriptions").as_deref(),
        Some("1"),
        "{dom}"
    );
    let status = text_of(&dom, "status").unwrap_or_default();
    assert!(status.starts_with("updated"), "status: {status}");
    let row = streams_row(&dom, "DASHSTREAM").unwrap_or_else(|| panic!("no stream row:\n{dom}"));
    assert_eq!(row[1], "shown.>", "{row:?}");
    assert_eq!(row[2], "3", "{row:?}");
    assert_eq!(row[5], "reader (3 / 0)", "{row:?}");

    // Without the token the page says why it shows nothing.
    let denied = browse(
        &format!("http://{}/", b.addr),
        &[
            "--virtual-time-budget=3000".to_string(),
            "--dump-dom".to_string(),
        ],
        "denied",
    );
    let dom = String::from_utf8_lossy(&denied.stdout);
    assert!(dom.contains("unauthorized"), "{dom}");

    let shot = artifacts_dir().join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let out = browse(
        &url,
        &[
            "--virtual-time-budget=5000".to_string(),
            "--window-size=1280,1000".to_string(),
            "--hide-scrollbars".to_string(),
            format!("--screenshot={}", shot.display()),
        ],
        "shot",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 10_000, "screenshot is only {} bytes", png.len());
}
