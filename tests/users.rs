//! Users and permissions (docs/PROTOCOL.md §11) through the Rust client
//! against a real broker: admission by token, publish and subscribe
//! rights with deny cuts, one answer per delivered request, stream
//! rights, `forbidden` counted in /metrics without tokens, and SIGHUP
//! reloads (narrowed rights, removed users, a refused file, and a reload
//! under load that loses nothing for users whose rights stayed); and a
//! three-node cluster started with `-users` and no `-auth-token`, where
//! users on different nodes reach each other and each node enforces the
//! rights of the clients connected to it.
//! tests/users/users.json is the file the tests start from; the
//! python-socketio and socket.io-client runs of the same rules are in
//! tests/interop.rs.

// Both harnesses include tests/support; this binary takes both.
#[allow(clippy::duplicate_mod)]
mod cluster_support;
#[allow(clippy::duplicate_mod)]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::{Client, Error, Options, Subscription};
use serde_json::{json, Value};

/// Bound on any single wait.
const WAIT: Duration = Duration::from_secs(10);

fn users_file() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/users/users.json"
    ))
    .expect("read tests/users/users.json")
}

/// A private copy of a users file (mode 0600) in a fresh directory.
fn write_users(text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gombus-users-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("users.json");
    replace_file(&path, text);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}

/// Replaces the file's content in one rename, as an operator's editor
/// or deploy tool would.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write users file");
    std::fs::rename(&tmp, path).expect("rename users file");
}

fn start(path: &Path, extra: &[&str]) -> Broker {
    let mut args = vec![format!("-users={}", path.display())];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Broker::start(&args)
}

fn connect(broker: &Broker, token: Option<&str>) -> Result<Client, Error> {
    Client::connect_with(
        &broker.addr,
        Options {
            token: token.map(str::to_string),
            ..Options::default()
        },
    )
}

fn user(broker: &Broker, token: &str) -> Client {
    connect(broker, Some(token)).unwrap_or_else(|e| panic!("connect as {token}: {e}"))
}

fn assert_forbidden<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.code(), Some("forbidden"), "{what}: {e}"),
        Ok(v) => panic!("{what}: allowed ({v:?}), expected forbidden"),
    }
}

fn next(sub: &Subscription) -> gombus::client::Message {
    sub.recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("sid {}: nothing within {WAIT:?}: {e}", sub.sid()))
}

fn hangup(broker: &Broker) {
    let ok = Command::new("kill")
        .arg("-HUP")
        .arg(broker.pid().to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -HUP failed");
}

/// Polls `cond` until it holds; fails after [`WAIT`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

fn metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect for /metrics");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read /metrics");
    out
}

#[test]
fn connect_names_the_user_by_token_and_auth_token_keeps_every_right() {
    let path = write_users(&users_file());
    let broker = start(&path, &["-auth-token=tok-root"]);
    let refused = Error::ConnectRefused("unauthorized".to_string());
    assert_eq!(connect(&broker, Some("nope")).unwrap_err(), refused);
    assert_eq!(connect(&broker, None).unwrap_err(), refused);
    // A token that is a prefix of a real one is no token.
    assert_eq!(connect(&broker, Some("tok-admi")).unwrap_err(), refused);
    let root = user(&broker, "tok-root");
    let sub = root.subscribe(">").unwrap();
    root.publish_acked("any.thing", json!(1)).unwrap();
    assert_eq!(next(&sub).subject, "any.thing");
    user(&broker, "tok-reader").ping().unwrap();
}

#[test]
fn publish_rights_refuse_with_forbidden_and_nothing_reaches_anyone() {
    let path = write_users(&users_file());
    let broker = start(&path, &[]);
    let admin = user(&broker, "tok-admin");
    let all = admin.subscribe(">").unwrap();
    let billing = user(&broker, "tok-billing");
    assert_forbidden(
        billing.publish_acked("other.x", json!(1)),
        "pub outside allow",
    );
    assert_forbidden(
        billing.publish_acked("orders.internal.audit", json!(1)),
        "pub under deny",
    );
    assert_forbidden(
        billing.publish_acked("billing.a.b", json!(1)),
        "`*` is one token",
    );
    assert_forbidden(
        billing.request("other.x", json!(1), Duration::from_secs(1)),
        "request outside allow",
    );
    // Without an ack id a forbidden publish is dropped, and the
    // connection stays open.
    billing.publish("other.y", json!("dropped")).unwrap();
    billing.publish_acked("orders.new", json!("ok")).unwrap();
    billing.publish_acked("billing.run", json!("ok")).unwrap();
    assert_eq!(
        next(&all).subject,
        "orders.new",
        "the refused ones reached nobody"
    );
    assert_eq!(next(&all).subject, "billing.run");
    // The reader may publish nothing at all (no publish list).
    let reader = user(&broker, "tok-reader");
    assert_forbidden(
        reader.publish_acked("orders.new", json!(1)),
        "no publish list",
    );
    reader.ping().unwrap();
}

#[test]
fn subscribe_rights_cover_wildcards_and_deny_cuts_skip_subjects() {
    let path = write_users(&users_file());
    let broker = start(&path, &[]);
    let billing = user(&broker, "tok-billing");
    assert_forbidden(billing.subscribe("billing.*"), "outside allow");
    assert_forbidden(billing.subscribe("orders.internal.>"), "covered by deny");
    assert_forbidden(billing.subscribe("orders.internal.x"), "literal under deny");
    assert_forbidden(billing.subscribe(">"), "wider than allow");
    assert_forbidden(
        billing.subscribe("*.new"),
        "`*.new` is not covered by `orders.>`",
    );
    // Allowed, but its deny cut keeps orders.internal.> out.
    let orders = billing.subscribe("orders.>").unwrap();
    let new_only = billing.subscribe("orders.*").unwrap();
    let admin = user(&broker, "tok-admin");
    admin
        .publish_acked("orders.internal.audit", json!(1))
        .unwrap();
    admin.publish_acked("orders.internal", json!(2)).unwrap();
    admin.publish_acked("orders.eu.new", json!(3)).unwrap();
    assert_eq!(
        next(&orders).data,
        json!(2),
        "orders.internal.audit skipped"
    );
    assert_eq!(next(&orders).data, json!(3));
    assert_eq!(next(&new_only).data, json!(2));
    // The cut is per subscription: another user's `>` gets everything.
    let reader = user(&broker, "tok-reader");
    let all = reader.subscribe(">").unwrap();
    admin
        .publish_acked("orders.internal.audit", json!(4))
        .unwrap();
    assert_eq!(next(&all).data, json!(4));
    admin.publish_acked("orders.x", json!(5)).unwrap();
    assert_eq!(
        next(&orders).data,
        json!(5),
        "the cut still held for billing"
    );
}

#[test]
fn allow_responses_opens_one_answer_per_delivered_request() {
    let path = write_users(&users_file());
    let broker = start(&path, &[]);
    let service = user(&broker, "tok-service");
    let requests = service.subscribe("svc.echo").unwrap();
    assert_forbidden(
        service.publish_acked("svc.echo", json!(1)),
        "no publish list",
    );
    let admin = user(&broker, "tok-admin");
    let asker = {
        let admin = Client::connect_with(
            &broker.addr,
            Options {
                token: Some("tok-admin".into()),
                ..Options::default()
            },
        )
        .unwrap();
        thread::spawn(move || admin.request("svc.echo", json!("hi"), Duration::from_secs(5)))
    };
    let req = next(&requests);
    let reply = req
        .reply
        .clone()
        .expect("a request carries a reply subject");
    assert_forbidden(
        service.publish_acked("other.subject", json!(1)),
        "not a reply",
    );
    service.publish_acked(&reply, json!("answer")).unwrap();
    assert_forbidden(
        service.publish_acked(&reply, json!("again")),
        "a second answer",
    );
    let answer = asker.join().unwrap().expect("request answered");
    assert_eq!(answer.data, json!("answer"));
    // A publish with a reply subject (not a request) opens one too.
    admin
        .publish_msg(
            &gombus::client::OutMessage::new("svc.echo", gombus::client::Payload::Json(json!("x")))
                .with_reply("reply.here"),
            true,
        )
        .unwrap();
    assert_eq!(next(&requests).reply.as_deref(), Some("reply.here"));
    service.publish_acked("reply.here", json!(1)).unwrap();
    assert_forbidden(service.publish_acked("reply.here", json!(2)), "used up");
    // The reader has no allow_responses: a delivered request opens nothing.
    let reader = user(&broker, "tok-reader");
    let r = reader.subscribe("svc.>").unwrap();
    admin
        .publish_msg(
            &gombus::client::OutMessage::new("svc.x", gombus::client::Payload::Json(json!(0)))
                .with_reply("reply.two"),
            true,
        )
        .unwrap();
    next(&r);
    assert_forbidden(
        reader.publish_acked("reply.two", json!(1)),
        "no allow_responses",
    );
}

#[test]
fn stream_rights_limit_events_and_the_list() {
    let path = write_users(&users_file());
    let broker = start(&path, &[]);
    let admin = user(&broker, "tok-admin");
    for (name, subject) in [("ORDERS", "stored.orders.>"), ("OTHER", "stored.other.>")] {
        admin
            .call(
                "stream.create",
                json!({"name": name, "subjects": [subject]}),
            )
            .unwrap();
    }
    let billing = user(&broker, "tok-billing");
    assert_forbidden(
        billing.call(
            "stream.create",
            json!({"name": "MINE", "subjects": ["mine.>"]}),
        ),
        "create without stream_admin",
    );
    assert_forbidden(
        billing.call("stream.purge", json!({"name": "ORDERS"})),
        "purge",
    );
    assert_forbidden(
        billing.call("stream.info", json!({"name": "OTHER"})),
        "another stream",
    );
    assert_forbidden(
        billing.call("consumer.create", json!({"stream": "ORDERS", "name": "c"})),
        "consumer.create without stream_admin",
    );
    let info = billing
        .call("stream.info", json!({"name": "ORDERS"}))
        .unwrap();
    assert_eq!(info["stream"]["config"]["name"], json!("ORDERS"));
    let list = billing.call("stream.list", json!({})).unwrap();
    let names: Vec<&str> = list["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .filter_map(|s| s["config"]["name"].as_str())
        .collect();
    assert_eq!(names, ["ORDERS"], "{list}");
    assert_eq!(
        admin.call("stream.list", json!({})).unwrap()["streams"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    // The subjects a stream captures are still subject to publish rights.
    let reader = user(&broker, "tok-reader");
    assert_forbidden(
        reader.publish_acked("stored.orders.x", json!(1)),
        "captured subject",
    );
    let state = admin
        .call("stream.info", json!({"name": "ORDERS"}))
        .unwrap();
    assert_eq!(state["stream"]["state"]["messages"], json!(0));
}

#[test]
fn forbidden_is_counted_by_user_and_kind_and_tokens_never_show() {
    let path = write_users(&users_file());
    let broker = start(&path, &["-log-level=debug"]);
    let billing = user(&broker, "tok-billing");
    assert_forbidden(billing.publish_acked("other.x", json!(1)), "pub");
    assert_forbidden(billing.publish_acked("other.y", json!(1)), "pub");
    assert_forbidden(billing.subscribe("billing.*"), "sub");
    let text = metrics(&broker.addr);
    assert!(
        text.contains("gombus_forbidden_total{user=\"billing\",kind=\"publish to\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("gombus_forbidden_total{user=\"billing\",kind=\"subscribe to\"} 1"),
        "{text}"
    );
    assert!(text.contains("gombus_users 4"), "{text}");
    assert!(text.contains("code=\"forbidden\""), "{text}");
    // The broker's stderr is read by another thread: wait for the line.
    wait_until("the refusal is logged", || {
        broker.recent_log().contains("may not publish to other.x")
    });
    let log = broker.recent_log();
    for shown in [text, log] {
        assert!(!shown.contains("tok-"), "a token was shown:\n{shown}");
    }
}

#[test]
fn bad_files_are_refused_at_start_with_the_line_and_loose_modes_warned() {
    use std::os::unix::fs::PermissionsExt;
    let bad = write_users("{\"users\": [\n {\"name\": \"a\", \"token\": \"t\"},\n {\"name\": \"b\", \"token\": \"t\"}\n]}");
    let out = Command::new(common::broker_bin())
        .arg("-addr=127.0.0.1:0")
        .arg(format!("-users={}", bad.display()))
        .output()
        .expect("run broker");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("same token"),
        "{err}"
    );
    assert!(!err.contains("\"t\""), "{err}");
    let loose = write_users(&users_file());
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let broker = start(&loose, &[]);
    let log = broker.recent_log();
    assert!(log.contains("may be read by its group or others"), "{log}");
}

/// The file with `billing` narrowed to `orders.*` and `reader` gone.
fn narrowed() -> String {
    users_file()
        .replace(
            "\"subscribe\": {\"allow\": [\"orders.>\"], \"deny\": [\"orders.internal.>\"]}",
            "\"subscribe\": {\"allow\": [\"orders.*\"]}",
        )
        .replace(
            ",\n  {\"name\": \"reader\", \"token\": \"tok-reader\",\n   \"subscribe\": {\"allow\": [\">\"]}}",
            "",
        )
}

#[test]
fn sighup_reload_narrows_rights_closes_removed_users_and_refuses_bad_files() {
    assert!(!narrowed().contains("tok-reader") && narrowed().contains("orders.*\"]}"));
    let path = write_users(&users_file());
    let mut broker = start(&path, &[]);
    let billing = user(&broker, "tok-billing");
    let wide = billing.subscribe("orders.>").unwrap();
    let narrow = billing.subscribe("orders.*").unwrap();
    let reader = user(&broker, "tok-reader");
    let reader_events = reader.events();
    let admin = user(&broker, "tok-admin");

    // A file that does not parse is refused, naming its line; the old
    // rights stay.
    replace_file(
        &path,
        "{\"users\": [\n  {\"name\": \"x\", \"token\": \"y\",\n   \"colour\": 1}]}",
    );
    hangup(&broker);
    wait_until("the refusal is logged", || {
        broker.recent_log().contains("users file refused")
    });
    let log = broker.recent_log();
    assert!(
        log.contains("line 3") && log.contains("unknown field"),
        "{log}"
    );
    reader.ping().unwrap();
    billing
        .subscribe("orders.>")
        .unwrap()
        .unsubscribe()
        .unwrap();

    replace_file(&path, &narrowed());
    hangup(&broker);
    wait_until("the reader's connection is closed", || {
        reader_events
            .try_recv()
            .ok()
            .flatten()
            .is_some_and(|e| matches!(e, gombus::client::Event::Disconnected { .. }))
            || reader.is_closed()
    });
    // The now-forbidden subscription is gone; the allowed one stays.
    wait_until("orders.> is removed", || {
        billing.unsubscribe_after(wide.sid(), 1).is_err()
    });
    assert_eq!(
        billing.unsubscribe_after(wide.sid(), 1).unwrap_err().code(),
        Some("not_found")
    );
    assert_forbidden(billing.subscribe("orders.>"), "narrowed");
    admin.publish_acked("orders.new", json!("still")).unwrap();
    assert_eq!(next(&narrow).data, json!("still"));
    assert_eq!(
        connect(&broker, Some("tok-reader")).unwrap_err(),
        Error::ConnectRefused("unauthorized".into())
    );
    assert!(broker.terminate(WAIT).is_some_and(|s| s.success()));
}

#[test]
fn a_reload_under_load_loses_nothing_for_users_whose_rights_stayed() {
    const MSGS: u64 = 3000;
    let path = write_users(&users_file());
    let broker = start(&path, &[]);
    let subscribers: Vec<(Client, Subscription)> = (0..3)
        .map(|_| {
            let c = user(&broker, "tok-billing");
            let s = c.subscribe("orders.>").unwrap();
            (c, s)
        })
        .collect();
    let reader = user(&broker, "tok-reader");
    let reader_sub = reader.subscribe("orders.*").unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let publisher = {
        let addr = broker.addr.clone();
        let running = Arc::clone(&running);
        thread::spawn(move || {
            let admin = Client::connect_with(
                &addr,
                Options {
                    token: Some("tok-admin".into()),
                    ..Options::default()
                },
            )
            .expect("publisher connects");
            for i in 0..MSGS {
                admin.publish("orders.load", json!(i)).expect("publish");
                if i % 500 == 0 {
                    admin.ping().expect("ping");
                }
            }
            admin.ping().expect("final ping");
            running.store(false, Ordering::Release);
        })
    };
    // Reload while the publisher runs: each file changes only the
    // reader's rights (widened, then back), never billing's.
    let mut reloads = 0;
    let widened = users_file().replace(
        "{\"name\": \"reader\", \"token\": \"tok-reader\",\n   \"subscribe\": {\"allow\": [\">\"]}}",
        "{\"name\": \"reader\", \"token\": \"tok-reader\",\n   \"subscribe\": {\"allow\": [\">\"]}, \"publish\": {\"allow\": [\"x\"]}}",
    );
    assert_ne!(widened, users_file());
    while running.load(Ordering::Acquire) || reloads < 2 {
        let text = if reloads % 2 == 0 {
            widened.clone()
        } else {
            users_file()
        };
        replace_file(&path, &text);
        hangup(&broker);
        reloads += 1;
        let want = reloads;
        wait_until("the reload is logged", || {
            broker.recent_log().matches("reloaded").count() >= want
        });
    }
    publisher.join().expect("publisher");
    for (_, sub) in &subscribers {
        for i in 0..MSGS {
            assert_eq!(next(sub).data, json!(i), "after {reloads} reloads");
        }
    }
    for i in 0..MSGS {
        assert_eq!(
            next(&reader_sub).data,
            json!(i),
            "the reader's rights allowed it throughout"
        );
    }
    assert!(reloads >= 2);
    let _: Value = json!(reloads);
}

/// A user's client of cluster node `i`.
fn cluster_user(c: &cluster_support::Cluster, i: usize, token: &str) -> Client {
    let opts = Options {
        token: Some(token.to_string()),
        ..Options::default()
    };
    Client::connect_with(&c.http[i], opts)
        .unwrap_or_else(|e| panic!("connect to {} as {token}: {e}", c.http[i]))
}

/// docs/PROTOCOL.md §11: `-users` in a cluster needs no `-auth-token`.
/// The nodes relay to each other with the cluster token, so a user on
/// one node receives what a user on another publishes, a stream on one
/// node serves a user on another, and each node refuses what its own
/// clients may not do.
#[test]
fn users_work_in_a_cluster_without_an_auth_token() {
    let path = write_users(&users_file());
    let mut c = cluster_support::Cluster::prepare();
    let users = format!("-users={}", path.display());
    c.edit_args = Some(Box::new(move |_, args| args.push(users.clone())));
    c.launch();
    c.await_leader(&[0, 1, 2], cluster_support::LEADER_WAIT);
    c.await_healthy(&[0, 1, 2], cluster_support::LEADER_WAIT);
    // No token, or an unknown one, is refused on every node.
    for i in 0..3 {
        assert!(Client::connect(&c.http[i]).is_err(), "no token on node {i}");
    }
    let billing = cluster_user(&c, 0, "tok-billing");
    let reader = cluster_user(&c, 1, "tok-reader");
    let service = cluster_user(&c, 2, "tok-service");
    // billing on n1 reaches reader on n2 (once the subscription is known
    // on n1: probes until one arrives).
    let sub = reader
        .subscribe("orders.>")
        .expect("reader subscribes on n2");
    wait_until("a probe from n1 reaches n2", || {
        billing
            .publish_acked("orders.probe", json!({}))
            .expect("billing publishes on n1");
        sub.recv_timeout(Duration::from_millis(100)).is_ok()
    });
    while sub.recv_timeout(Duration::from_millis(200)).is_ok() {}
    billing
        .publish_acked("orders.new", json!({"n": 1}))
        .expect("billing publishes orders.new on n1");
    let m = next(&sub);
    assert_eq!(
        (m.subject.as_str(), m.data.clone()),
        ("orders.new", json!({"n": 1}))
    );
    // Rights are enforced where each client is connected.
    assert_forbidden(
        billing.publish_acked("svc.x", json!({})),
        "billing pub svc.x on n1",
    );
    assert_forbidden(
        reader.publish_acked("orders.new", json!({})),
        "reader pub on n2",
    );
    assert_forbidden(service.subscribe("orders.>"), "service sub orders.> on n3");
    // A stream on n1, used by billing from n3 (relayed to n1 on the
    // nodes' link); billing may not create one, nor read another stream.
    let admin = cluster_user(&c, 0, "tok-admin");
    for name in ["ORDERS", "OTHER"] {
        let subjects = format!("{}.>", name.to_lowercase());
        admin
            .call(
                "stream.create",
                json!({"name": name, "subjects": [subjects]}),
            )
            .unwrap_or_else(|e| panic!("admin creates {name} on n1: {e}"));
    }
    let billing3 = cluster_user(&c, 2, "tok-billing");
    let info = wait_for_stream(&billing3, "ORDERS");
    assert_eq!(info["stream"]["config"]["name"], json!("ORDERS"));
    assert_forbidden(
        billing3.call("stream.info", json!({"name": "OTHER"})),
        "billing stream.info OTHER on n3",
    );
    assert_forbidden(
        billing3.call(
            "stream.create",
            json!({"name": "MINE", "subjects": ["mine.>"]}),
        ),
        "billing stream.create on n3",
    );
}

/// `stream.info` of `name` through `client`, once the node knows it.
fn wait_for_stream(client: &Client, name: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        match client.call("stream.info", json!({ "name": name })) {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "stream.info {name}: {e}"),
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// docs/PROTOCOL.md "Key-value buckets", rights: writes need `publish` on
/// the key's subject, reads `subscribe` on it, `kv.keys` and a wildcard
/// watch show only readable keys, and bucket administration needs
/// `stream_admin` with the bucket's stream among `streams`.
#[test]
fn bucket_rights_follow_subject_and_stream_rights() {
    let path = write_users(
        r#"{"users": [
  {"name": "kvadmin", "token": "tok-kvadmin",
   "publish": {"allow": [">"]}, "subscribe": {"allow": [">"]},
   "streams": ["KV_cfg"], "stream_admin": true},
  {"name": "site", "token": "tok-site",
   "publish": {"allow": ["$KV.cfg.site.>"]}, "subscribe": {"allow": ["$KV.cfg.site.>"]},
   "streams": ["KV_cfg"]}
]}"#,
    );
    let b = start(&path, &[]);
    let admin = user(&b, "tok-kvadmin");
    let site = user(&b, "tok-site");
    assert_forbidden(
        site.call("kv.create", json!({"bucket": "cfg"})),
        "kv.create without stream_admin",
    );
    assert_forbidden(
        admin.call("kv.create", json!({"bucket": "other"})),
        "kv.create of a stream not in streams",
    );
    admin
        .call("kv.create", json!({"bucket": "cfg"}))
        .expect("kv.create");
    admin
        .call(
            "kv.put",
            json!({"bucket": "cfg", "key": "core.db", "value": 1}),
        )
        .expect("admin put");
    site.call(
        "kv.put",
        json!({"bucket": "cfg", "key": "site.eu", "value": 2}),
    )
    .expect("a put the user may make");
    assert_forbidden(
        site.call(
            "kv.put",
            json!({"bucket": "cfg", "key": "core.db", "value": 3}),
        ),
        "kv.put outside publish",
    );
    assert_forbidden(
        site.call("kv.get", json!({"bucket": "cfg", "key": "core.db"})),
        "kv.get outside subscribe",
    );
    assert_forbidden(
        site.call("kv.history", json!({"bucket": "cfg", "key": "core.db"})),
        "kv.history outside subscribe",
    );
    let keys = site
        .call("kv.keys", json!({"bucket": "cfg"}))
        .expect("kv.keys");
    assert_eq!(keys["keys"], json!(["site.eu"]), "only readable keys");
    let all = admin
        .call("kv.keys", json!({"bucket": "cfg"}))
        .expect("kv.keys");
    assert_eq!(all["keys"], json!(["core.db", "site.eu"]));
    assert_forbidden(
        site.call("kv.watch", json!({"bucket": "cfg", "key": "core.db"})),
        "a watch of an unreadable key",
    );
    let w = site
        .kv("cfg")
        .watch(None, gombus::client::WatchFrom::Latest)
        .expect("a wildcard watch");
    let first = w.next_timeout(WAIT).expect("a watch event");
    match first {
        gombus::client::KvWatchEvent::Entry(e) => assert_eq!(e.key, "site.eu"),
        other => panic!("expected site.eu first, got {other:?}"),
    }
    assert_eq!(
        w.next_timeout(WAIT).expect("caught up"),
        gombus::client::KvWatchEvent::CaughtUp,
        "core.db is not shown"
    );
    admin
        .call(
            "kv.put",
            json!({"bucket": "cfg", "key": "core.db", "value": 4}),
        )
        .expect("admin put");
    admin
        .call(
            "kv.put",
            json!({"bucket": "cfg", "key": "site.us", "value": 5}),
        )
        .expect("admin put");
    match w.next_timeout(WAIT).expect("a watch event") {
        gombus::client::KvWatchEvent::Entry(e) => assert_eq!(e.key, "site.us", "core.db skipped"),
        other => panic!("expected site.us, got {other:?}"),
    }
    assert_forbidden(
        site.call("kv.delete_bucket", json!({"bucket": "cfg"})),
        "kv.delete_bucket without stream_admin",
    );
}
