//! Integration tests: a real broker process per test, driven through the
//! Rust client over Socket.IO. Absence of a message is proven with barriers
//! (`ping` from the publisher, then from the subscriber), never with sleeps.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::{Client, Error, Message, Options, OutMessage, Payload, Subscription};
use serde_json::{json, Value};

/// How long a message that should arrive may take.
const ARRIVAL_WAIT: Duration = Duration::from_secs(5);

fn connect(broker: &Broker) -> Client {
    Client::connect(&broker.addr).unwrap_or_else(|e| panic!("connect to {}: {e}", broker.addr))
}

fn connect_ns(broker: &Broker, namespace: &str, token: Option<&str>) -> Result<Client, Error> {
    let opts = Options {
        token: token.map(str::to_string),
        namespace: namespace.to_string(),
        ..Options::default()
    };
    Client::connect_with(&broker.addr, opts)
}

fn recv(sub: &Subscription) -> Message {
    sub.recv_timeout(ARRIVAL_WAIT)
        .unwrap_or_else(|e| panic!("sid {}: expected a message: {e}", sub.sid()))
}

/// Every event `publisher` sent is processed, and every delivery queued for
/// `subscriber` before its own barrier has reached its channels.
fn settle(publisher: &Client, subscriber: &Client) {
    publisher.ping().expect("publisher barrier");
    subscriber.ping().expect("subscriber barrier");
}

fn assert_empty(sub: &Subscription) {
    match sub.try_recv() {
        Ok(None) => {}
        Ok(Some(m)) => panic!("sid {}: unexpected message {m:?}", sub.sid()),
        Err(e) => panic!("sid {}: {e}", sub.sid()),
    }
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, Error>, code: &str) {
    match result {
        Err(e) if e.code() == Some(code) => {}
        other => panic!("expected error code {code}, got {other:?}"),
    }
}

#[test]
fn publish_reaches_subscriber() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("orders.new").unwrap();
    let ack = pub_client
        .publish_acked("orders.new", json!({"id": 1}))
        .unwrap();
    assert_eq!(ack["ok"], json!(true));
    pub_client.publish("orders.new", "second").unwrap();
    let first = recv(&sub);
    assert_eq!(first.sid, sub.sid());
    assert_eq!(first.subject, "orders.new");
    assert_eq!(first.data, json!({"id": 1}));
    assert_eq!(first.reply, None);
    assert_eq!(recv(&sub).data, json!("second"));
}

#[test]
fn wildcards_match_and_non_matches_stay_away() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let star = sub_client.subscribe("foo.*").unwrap();
    let tail = sub_client.subscribe("foo.>").unwrap();
    let middle = sub_client.subscribe("a.*.c").unwrap();
    for subject in [
        "foo.bar",
        "foo.bar.baz",
        "foo",
        "bar.foo",
        "a.b.c",
        "a.b.d",
        "a.c",
    ] {
        pub_client.publish(subject, subject).unwrap();
    }
    assert_eq!(recv(&star).subject, "foo.bar");
    assert_eq!(recv(&tail).subject, "foo.bar");
    assert_eq!(recv(&tail).subject, "foo.bar.baz");
    assert_eq!(recv(&middle).subject, "a.b.c");
    settle(&pub_client, &sub_client);
    assert_empty(&star);
    assert_empty(&tail);
    assert_empty(&middle);
}

#[test]
fn unsub_stops_delivery() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("news").unwrap();
    pub_client.publish("news", 1).unwrap();
    assert_eq!(recv(&sub).data, json!(1));
    // Unsubscribe through a raw call so the channel stays observable.
    sub_client.call("unsub", json!({"sid": sub.sid()})).unwrap();
    pub_client.publish("news", 2).unwrap();
    settle(&pub_client, &sub_client);
    assert_empty(&sub);
    // The typed form works too.
    let again = sub_client.subscribe("news").unwrap();
    again.unsubscribe().unwrap();
}

#[test]
fn unsub_after_delivers_exactly_n_more() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("ticks").unwrap();
    pub_client.publish("ticks", 0).unwrap();
    assert_eq!(recv(&sub).data, json!(0));
    sub_client.unsubscribe_after(sub.sid(), 3).unwrap();
    for n in 1..=6 {
        pub_client.publish("ticks", n).unwrap();
    }
    for n in 1..=3 {
        assert_eq!(recv(&sub).data, json!(n));
    }
    settle(&pub_client, &sub_client);
    assert_empty(&sub);
}

#[test]
fn sub_with_max_ends_after_max() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe_with("limited", None, Some(2)).unwrap();
    for n in 0..5 {
        pub_client.publish("limited", n).unwrap();
    }
    assert_eq!(recv(&sub).data, json!(0));
    assert_eq!(recv(&sub).data, json!(1));
    settle(&pub_client, &sub_client);
    assert_empty(&sub);
}

#[test]
fn queue_group_loadbalances_each_message_once() {
    const MESSAGES: u64 = 300;
    let broker = Broker::start(&[]);
    let members: Vec<Client> = (0..3).map(|_| connect(&broker)).collect();
    let subs: Vec<Subscription> = members
        .iter()
        .map(|c| c.queue_subscribe("work.items", "workers").unwrap())
        .collect();
    let pub_client = connect(&broker);
    for n in 0..MESSAGES {
        pub_client.publish("work.items", n).unwrap();
    }
    pub_client.ping().unwrap();
    let mut seen = HashSet::new();
    let mut per_member = [0u64; 3];
    for (i, (client, sub)) in members.iter().zip(&subs).enumerate() {
        client.ping().unwrap();
        while let Some(msg) = sub.try_recv().unwrap() {
            let n = msg.data.as_u64().expect("numeric data");
            assert!(seen.insert(n), "message {n} delivered twice");
            per_member[i] += 1;
        }
    }
    assert_eq!(seen.len() as u64, MESSAGES, "per member: {per_member:?}");
    assert!(
        per_member.iter().all(|&n| n > 0),
        "a member got nothing: {per_member:?}"
    );
}

#[test]
fn group_set_holds_queue_names_to_the_sub_rule() {
    let broker = Broker::start(&[]);
    let control = connect_ns(&broker, "/control", None).unwrap();
    let long = "q".repeat(257);
    for queue in ["", "two words", "tab\tname", long.as_str()] {
        assert_code(
            control.call("group.set", json!({"queue": queue, "mode": "broadcast"})),
            "bad_request",
        );
    }
    let client = connect(&broker);
    assert_code(
        client.call("sub", json!({"subject": "a", "queue": long})),
        "bad_request",
    );
    let groups = control.call("group.list", json!({})).unwrap();
    assert_eq!(groups["groups"], json!([]), "nothing was set: {groups}");
    let ok = "q".repeat(256);
    control
        .call("group.set", json!({"queue": ok, "mode": "broadcast"}))
        .unwrap();
}

#[test]
fn queue_group_broadcast_mode_reaches_every_member() {
    const MESSAGES: u64 = 10;
    let broker = Broker::start(&[]);
    let control = connect_ns(&broker, "/control", None).unwrap();
    control
        .call("group.set", json!({"queue": "fanout", "mode": "broadcast"}))
        .unwrap();
    let groups = control.call("group.list", json!({})).unwrap();
    assert!(
        groups["groups"]
            .as_array()
            .is_some_and(|g| g.contains(&json!({"queue": "fanout", "mode": "broadcast"}))),
        "group.list: {groups}"
    );
    let members: Vec<Client> = (0..3).map(|_| connect(&broker)).collect();
    let subs: Vec<Subscription> = members
        .iter()
        .map(|c| c.queue_subscribe("alerts", "fanout").unwrap())
        .collect();
    let pub_client = connect(&broker);
    for n in 0..MESSAGES {
        pub_client.publish("alerts", n).unwrap();
    }
    for sub in &subs {
        for n in 0..MESSAGES {
            assert_eq!(recv(sub).data, json!(n));
        }
    }
    pub_client.ping().unwrap();
    for (client, sub) in members.iter().zip(&subs) {
        client.ping().unwrap();
        assert_empty(sub);
    }
}

#[test]
fn request_reply_round_trip() {
    let broker = Broker::start(&[]);
    let responder = connect(&broker);
    let requests = responder.subscribe("svc.echo").unwrap();
    let requester = connect(&broker);
    thread::scope(|scope| {
        let responder = &responder;
        scope.spawn(move || {
            let msg = recv(&requests);
            let reply = msg.reply.expect("request carries a reply subject");
            let answer = OutMessage::new(&reply, Payload::Json(json!({"echo": msg.data})))
                .with_header("answered-by", "responder");
            responder.publish_msg(&answer, true).unwrap();
        });
        let reply = requester
            .request("svc.echo", json!("hi"), Duration::from_secs(5))
            .unwrap();
        assert_eq!(reply.data, json!({"echo": "hi"}));
        assert!(!reply.subject.is_empty());
        let headers = reply.headers.unwrap_or_default();
        assert_eq!(
            headers.get("answered-by").map(String::as_str),
            Some("responder")
        );
    });
}

/// CPU time (user + system, in clock ticks) process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    // Fields after the command name (which may hold spaces) closed by ')'.
    let rest = &stat[stat.rfind(')').expect("stat has a command") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// An answered request's deadline once kept the loop awake with no wait
/// once it passed (the loop polls until the next deadline): an idle
/// broker spun at most of a core. Once the deadline has passed, the
/// broker must use next to no CPU while nothing happens.
#[test]
fn an_answered_request_leaves_the_broker_idle() {
    let broker = Broker::start(&[]);
    let responder = connect(&broker);
    let requests = responder.subscribe("svc.idle").unwrap();
    let requester = connect(&broker);
    let timeout = Duration::from_millis(300);
    thread::scope(|scope| {
        let responder = &responder;
        scope.spawn(move || {
            let reply = recv(&requests).reply.expect("a reply subject");
            responder.publish(&reply, json!("pong")).unwrap();
        });
        let reply = requester
            .request("svc.idle", json!("ping"), timeout)
            .unwrap();
        assert_eq!(reply.data, json!("pong"));
    });
    // Past the answered request's deadline, then one second of nothing.
    thread::sleep(timeout + Duration::from_millis(200));
    let before = cpu_ticks(broker.pid());
    thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(broker.pid()) - before;
    assert!(used < 20, "an idle broker used {used} ticks of CPU in 1 s");
}

#[test]
fn request_without_responders_fails_at_once() {
    let broker = Broker::start(&[]);
    let requester = connect(&broker);
    let started = Instant::now();
    let result = requester.request("svc.nobody", json!({}), Duration::from_secs(10));
    assert_code(result, "no_responders");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no_responders took {:?}",
        started.elapsed()
    );
}

#[test]
fn request_times_out_when_responder_is_silent() {
    let broker = Broker::start(&[]);
    let silent = connect(&broker);
    let requests = silent.subscribe("svc.silent").unwrap();
    let requester = connect(&broker);
    let started = Instant::now();
    let result = requester.request("svc.silent", json!({}), Duration::from_millis(300));
    let took = started.elapsed();
    assert_code(result, "timeout");
    assert!(
        took >= Duration::from_millis(250),
        "timed out early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "timed out late: {took:?}");
    // The silent responder did see the request.
    assert!(recv(&requests).reply.is_some());
}

#[test]
fn ten_thousand_messages_arrive_in_order() {
    const MESSAGES: u64 = 10_000;
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("seq").unwrap();
    for n in 0..MESSAGES {
        pub_client.publish("seq", n).unwrap();
    }
    for n in 0..MESSAGES {
        let msg = recv(&sub);
        assert_eq!(msg.data, json!(n), "out of order");
    }
    settle(&pub_client, &sub_client);
    assert_empty(&sub);
}

/// Large messages to several subscribers are queued as one shared tail
/// (written with `writev`), small ones are copied: mixed on the same
/// connections, every subscriber gets every message once, in order, with
/// its own sid, across the three WebSocket length encodings.
#[test]
fn shared_and_copied_deliveries_keep_their_order_and_sids() {
    const MESSAGES: usize = 120;
    let broker = Broker::start(&[]);
    let both = connect(&broker);
    let other = connect(&broker);
    let pub_client = connect(&broker);
    let subs = [
        both.subscribe("fan.big").unwrap(),
        both.subscribe("fan.*").unwrap(),
        other.subscribe("fan.>").unwrap(),
    ];
    // Tails under 126 bytes, under 64 KiB and over it (7-, 16- and
    // 64-bit frame lengths), the larger two shared.
    let body = |n: usize| match n % 3 {
        0 => format!("{n}"),
        1 => format!("{n}:{}", "m".repeat(2000 + n)),
        _ => format!("{n}:{}", "L".repeat(70_000 + n)),
    };
    for n in 0..MESSAGES {
        pub_client.publish("fan.big", body(n)).unwrap();
    }
    for sub in &subs {
        for n in 0..MESSAGES {
            let msg = recv(sub);
            assert_eq!(msg.sid, sub.sid());
            assert_eq!(msg.subject, "fan.big");
            assert_eq!(msg.data, json!(body(n)), "sid {}: message {n}", sub.sid());
        }
    }
    settle(&pub_client, &both);
    settle(&pub_client, &other);
    for sub in &subs {
        assert_empty(sub);
    }
}

#[test]
fn oversized_payload_is_refused_and_connection_survives() {
    let broker = Broker::start(&["-max-payload=1024"]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("big").unwrap();
    let result = pub_client.publish_acked("big", "x".repeat(2000));
    assert_code(result, "payload_too_large");
    pub_client.ping().unwrap();
    pub_client.publish_acked("big", "small").unwrap();
    assert_eq!(recv(&sub).data, json!("small"));
    // A packet beyond the open packet's maxPayload would close the
    // connection, so the client refuses it before sending.
    let huge = "x".repeat(2 * 1024 * 1024);
    assert!(matches!(
        pub_client.publish_acked("big", huge),
        Err(Error::Protocol(_))
    ));
    pub_client.ping().unwrap();
    assert!(!pub_client.is_closed());
}

#[test]
fn bad_subjects_are_refused() {
    let broker = Broker::start(&[]);
    let client = connect(&broker);
    for subject in ["", "a..b", ".a", "a.", "a b", "a.*", "a.>", "a.>.b"] {
        assert_code(client.publish_acked(subject, 1), "bad_subject");
    }
    for subject in ["", "a..b", "a.>.b", "a b"] {
        assert_code(client.subscribe(subject), "bad_subject");
    }
    assert_code(client.publish_acked(&"a".repeat(257), 1), "bad_subject");
    client.ping().unwrap();
}

#[test]
fn duplicate_sid_is_bad_request() {
    let broker = Broker::start(&[]);
    let client = connect(&broker);
    let ack = client
        .call("sub", json!({"subject": "dup", "sid": "same"}))
        .unwrap();
    assert_eq!(ack["sid"], json!("same"));
    assert_code(
        client.call("sub", json!({"subject": "other", "sid": "same"})),
        "bad_request",
    );
}

#[test]
fn server_assigns_sid_when_missing() {
    let broker = Broker::start(&[]);
    let client = connect(&broker);
    let ack = client.call("sub", json!({"subject": "anon"})).unwrap();
    assert!(
        ack["sid"].as_str().is_some_and(|s| !s.is_empty()),
        "sub ack: {ack}"
    );
}

#[test]
fn unsub_of_unknown_sid_is_not_found() {
    let broker = Broker::start(&[]);
    let client = connect(&broker);
    assert_code(client.call("unsub", json!({"sid": "nope"})), "not_found");
}

#[test]
fn unknown_event_with_ack_is_bad_request() {
    let broker = Broker::start(&[]);
    let client = connect(&broker);
    assert_code(client.call("no.such.event", json!({})), "bad_request");
    // Without an ack id it is ignored and the connection stays usable.
    client.emit("no.such.event", json!({})).unwrap();
    // A control event on `/` is an unknown event there.
    assert_code(client.call("server.info", json!({})), "bad_request");
    client.ping().unwrap();
}

#[test]
fn control_namespace_checks_its_token() {
    let broker = Broker::start(&["-control-token=secret"]);
    let refused = Error::ConnectRefused("unauthorized".to_string());
    assert_eq!(
        connect_ns(&broker, "/control", Some("wrong")).unwrap_err(),
        refused
    );
    assert_eq!(connect_ns(&broker, "/control", None).unwrap_err(), refused);
    let control = connect_ns(&broker, "/control", Some("secret")).unwrap();
    let info = control.call("server.info", json!({})).unwrap();
    assert_eq!(info["node_id"], json!("test"));
    assert!(info["version"].is_string(), "server.info: {info}");
    // `/` stays open without `-auth-token`.
    connect(&broker).ping().unwrap();
}

#[test]
fn unknown_namespace_is_refused() {
    let broker = Broker::start(&[]);
    assert_eq!(
        connect_ns(&broker, "/nowhere", None).unwrap_err(),
        Error::ConnectRefused("Invalid namespace".to_string())
    );
}

#[test]
fn auth_token_protects_default_namespace() {
    let broker = Broker::start(&["-auth-token=letmein"]);
    let refused = Error::ConnectRefused("unauthorized".to_string());
    assert_eq!(connect_ns(&broker, "/", None).unwrap_err(), refused);
    assert_eq!(connect_ns(&broker, "/", Some("nope")).unwrap_err(), refused);
    let sub_client = connect_ns(&broker, "/", Some("letmein")).unwrap();
    let pub_client = connect_ns(&broker, "/", Some("letmein")).unwrap();
    let sub = sub_client.subscribe("private").unwrap();
    pub_client.publish("private", "hello").unwrap();
    assert_eq!(recv(&sub).data, json!("hello"));
}

#[test]
fn headers_round_trip() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("with.headers").unwrap();
    let msg = OutMessage::new("with.headers", Payload::Json(json!({"k": [1, 2]})))
        .with_header("Trace-Id", "abc-123")
        .with_header("Msg-Id", "7")
        .with_reply("inbox.me");
    pub_client.publish_msg(&msg, true).unwrap();
    let got = recv(&sub);
    let expected: BTreeMap<String, String> = [("Trace-Id", "abc-123"), ("Msg-Id", "7")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got.headers, Some(expected));
    assert_eq!(got.reply.as_deref(), Some("inbox.me"));
    assert_eq!(got.data, json!({"k": [1, 2]}));
}

#[test]
fn binary_data_round_trips_as_bytes() {
    let broker = Broker::start(&[]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("blobs").unwrap();
    let bytes: Vec<u8> = (0..=255u8).chain([0, 0, 255]).collect();
    pub_client.publish_bytes("blobs", &bytes).unwrap();
    let acked = OutMessage::new("blobs", Payload::Bytes(vec![]));
    pub_client.publish_msg(&acked, true).unwrap();
    let got = recv(&sub);
    assert_eq!(got.bytes(), Some(bytes.as_slice()), "got {got:?}");
    assert_eq!(recv(&sub).bytes(), Some(&[][..]));
    // JSON that merely looks like text is not turned into bytes.
    pub_client.publish("blobs", "not bytes").unwrap();
    let text = recv(&sub);
    assert_eq!(text.bytes(), None);
    assert!(text.attachments.is_empty());
}

#[test]
fn binary_reply_to_a_request() {
    let broker = Broker::start(&[]);
    let responder = connect(&broker);
    let requests = responder.subscribe("svc.blob").unwrap();
    let requester = connect(&broker);
    thread::scope(|scope| {
        let responder = &responder;
        scope.spawn(move || {
            let msg = recv(&requests);
            let reply = msg.reply.expect("reply subject");
            responder.publish_bytes(&reply, b"\x00\x01binary").unwrap();
        });
        let reply = requester
            .request("svc.blob", Value::Null, Duration::from_secs(5))
            .unwrap();
        assert_eq!(reply.bytes(), Some(&b"\x00\x01binary"[..]), "got {reply:?}");
    });
}

#[test]
fn binary_request_payload_reaches_responder() {
    let broker = Broker::start(&[]);
    let responder = connect(&broker);
    let requests = responder.subscribe("svc.upload").unwrap();
    let requester = connect(&broker);
    thread::scope(|scope| {
        let responder = &responder;
        scope.spawn(move || {
            let msg = recv(&requests);
            let size = msg.bytes().map(<[u8]>::len);
            let reply = msg.reply.expect("reply subject");
            responder.publish(&reply, json!({ "size": size })).unwrap();
        });
        let upload = OutMessage::new("svc.upload", Payload::Bytes(vec![42; 5000]));
        let reply = requester
            .request_msg(&upload, Duration::from_secs(5))
            .unwrap();
        assert_eq!(reply.data, json!({"size": 5000}));
    });
}

#[test]
fn client_answers_heartbeats() {
    // pingInterval + pingTimeout is 400 ms: a client that ignored the
    // server's pings would be closed after the first one.
    let broker = Broker::start(&["-ping-interval=100ms", "-ping-timeout=300ms"]);
    let sub_client = connect(&broker);
    let pub_client = connect(&broker);
    let sub = sub_client.subscribe("alive").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sub_client.heartbeats() < 3 || pub_client.heartbeats() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than 3 pings in 10 s"
        );
        // Each round trip also proves the socket is still open.
        sub_client.ping().unwrap();
        pub_client.ping().unwrap();
    }
    pub_client.publish_acked("alive", "still here").unwrap();
    assert_eq!(recv(&sub).data, json!("still here"));
    assert!(!sub_client.is_closed() && !pub_client.is_closed());
}

#[test]
fn broker_exit_closes_client() {
    let mut broker = Broker::start(&[]);
    let client = connect(&broker);
    let sub = client.subscribe("anything").unwrap();
    broker.kill();
    assert_eq!(sub.recv_timeout(ARRIVAL_WAIT).unwrap_err(), Error::Closed);
    assert_eq!(client.ping().unwrap_err(), Error::Closed);
    assert!(client.is_closed());
}

#[test]
fn request_without_ack_id_is_still_delivered() {
    let broker = Broker::start(&[]);
    let responder = connect(&broker);
    let requests = responder.subscribe("svc.fire").unwrap();
    let requester = connect(&broker);
    requester
        .emit("request", json!({"subject": "svc.fire", "data": 7}))
        .unwrap();
    let msg = recv(&requests);
    assert_eq!(msg.data, json!(7));
    let reply = msg.reply.expect("a reply subject even when nobody waits");
    // Replying to it is fine and reaches nobody; both sockets stay usable.
    responder.publish_acked(&reply, json!("late")).unwrap();
    requester.ping().unwrap();
    responder.ping().unwrap();
}
