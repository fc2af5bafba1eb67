//! Streams and consumers through the Rust client against the broker
//! binary: every stream and consumer event, limits and retention modes,
//! dedup, redelivery (ack_wait, nak), max_deliver, push delivery (also to
//! a queue group), binary data, restart recovery, and bad input.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::{Client, ConsumerConfig, Error, OutMessage, Payload, StreamConfig};
use serde_json::{json, Value};

fn connect(b: &Broker) -> Client {
    Client::connect(&b.addr).unwrap_or_else(|e| panic!("connect to {}: {e}", b.addr))
}

fn code(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Server { code, .. }) => code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// Polls `f` until it is true or `limit` passes.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stream(c: &Client, name: &str, subjects: &[&str]) {
    c.stream_create(&StreamConfig::new(name, subjects)).unwrap();
}

#[test]
fn create_info_list_delete() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    let info = c
        .stream_create(&StreamConfig::new("ORDERS", &["orders.>"]))
        .unwrap();
    assert_eq!(info.config["retention"], "limits");
    assert_eq!(info.config["discard"], "old");
    assert_eq!((info.state.first_seq, info.state.last_seq), (0, 0));
    // The same config again is fine; another one is `exists`.
    c.stream_create(&StreamConfig::new("ORDERS", &["orders.>"]))
        .unwrap();
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("ORDERS", &["x"]))),
        "exists"
    );
    // Overlapping subjects of another stream are refused.
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("EU", &["orders.eu"]))),
        "bad_request"
    );
    // `replicas` 1 is a single node's stream; more needs a cluster
    // (docs/PROTOCOL.md "Replicated streams").
    let with_replicas = |r: Value| {
        c.call(
            "stream.create",
            json!({"name": "ORDERS", "subjects": ["orders.>"], "replicas": r}),
        )
    };
    with_replicas(json!(1)).unwrap();
    with_replicas(Value::Null).unwrap();
    for r in [json!(2), json!(0), json!("1")] {
        assert_eq!(code(with_replicas(r)), "bad_request");
    }
    stream(&c, "AUDIT", &["audit.*"]);
    let names: Vec<String> = c
        .stream_list()
        .unwrap()
        .iter()
        .map(|s| s.config["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(names, vec!["AUDIT", "ORDERS"]);
    let ctl = Client::connect_with(
        &b.addr,
        gombus::client::Options {
            namespace: "/control".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(ctl.call("server.info", json!({})).unwrap()["streams"], 2);
    c.publish_stream("audit.x", 1).unwrap();
    let metrics = common::http_exchange(&b.addr, "/metrics").expect("GET /metrics");
    assert!(metrics.contains("gombus_streams 2"), "{metrics}");
    assert!(
        metrics.contains("gombus_stream_messages{stream=\"AUDIT\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gombus_stream_bytes{stream=\"ORDERS\"} 0"),
        "{metrics}"
    );
    c.stream_delete("AUDIT").unwrap();
    assert_eq!(code(c.stream_info("AUDIT")), "not_found");
    assert_eq!(code(c.stream_delete("AUDIT")), "not_found");
    // Its subjects are free again.
    stream(&c, "AUDIT2", &["audit.>"]);
}

#[test]
fn publish_get_and_purge() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "S", &["s.>"]);
    let sub = c.subscribe("s.a").unwrap();
    let a1 = c.publish_stream("s.a", json!({"n": 1})).unwrap();
    assert_eq!((a1.stream.as_str(), a1.seq, a1.duplicate), ("S", 1, false));
    // Core subscribers still get captured messages.
    assert_eq!(
        sub.recv_timeout(Duration::from_secs(5)).unwrap().data,
        json!({"n": 1})
    );
    let msg = OutMessage::new("s.b", Payload::Json(json!("two"))).with_header("k", "v");
    assert_eq!(c.publish_stream_msg(&msg).unwrap().seq, 2);
    c.publish_stream("s.a", 3).unwrap();
    // An uncaptured subject gets a plain ack.
    assert_eq!(c.publish_acked("other", 1).unwrap(), json!({"ok": true}));
    let m = c.stream_get("S", 2).unwrap();
    assert_eq!((m.subject.as_str(), &m.data), ("s.b", &json!("two")));
    assert_eq!(m.headers.unwrap()["k"], "v");
    assert!(m.time > 1_600_000_000_000);
    assert_eq!(c.stream_get_last("S", "s.a").unwrap().seq, 3);
    assert_eq!(code(c.stream_get("S", 99)), "not_found");
    assert_eq!(code(c.stream_get_last("S", "s.zz")), "not_found");
    assert_eq!(c.stream_purge("S", Some("s.a")).unwrap(), 2);
    let st = c.stream_info("S").unwrap().state;
    assert_eq!((st.messages, st.first_seq, st.last_seq), (1, 2, 3));
    assert_eq!(c.stream_purge("S", None).unwrap(), 1);
    let st = c.stream_info("S").unwrap().state;
    assert_eq!(
        (st.messages, st.bytes, st.first_seq, st.last_seq),
        (0, 0, 4, 3)
    );
    // Sequences never go back.
    assert_eq!(c.publish_stream("s.a", 4).unwrap().seq, 4);
}

#[test]
fn limits_and_discard() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    let mut cfg = StreamConfig::new("OLD", &["old"]);
    cfg.max_msgs = Some(3);
    c.stream_create(&cfg).unwrap();
    for i in 0..5 {
        c.publish_stream("old", i).unwrap();
    }
    let st = c.stream_info("OLD").unwrap().state;
    assert_eq!((st.messages, st.first_seq, st.last_seq), (3, 3, 5));

    let mut cfg = StreamConfig::new("NEW", &["new"]);
    cfg.max_msgs = Some(2);
    cfg.discard = Some("new".into());
    c.stream_create(&cfg).unwrap();
    c.publish_stream("new", 1).unwrap();
    c.publish_stream("new", 2).unwrap();
    assert_eq!(code(c.publish_stream("new", 3)), "limit");
    assert_eq!(c.stream_info("NEW").unwrap().state.messages, 2);

    let mut cfg = StreamConfig::new("BYTES", &["bytes"]);
    cfg.max_bytes = Some(300);
    c.stream_create(&cfg).unwrap();
    for _ in 0..10 {
        c.publish_stream("bytes", "x".repeat(20)).unwrap();
    }
    let st = c.stream_info("BYTES").unwrap().state;
    assert!(
        st.bytes <= 300 && st.messages >= 2 && st.messages < 10,
        "{st:?}"
    );

    let mut cfg = StreamConfig::new("SIZE", &["size"]);
    cfg.max_msg_size = Some(10);
    c.stream_create(&cfg).unwrap();
    assert_eq!(
        code(c.publish_stream("size", "x".repeat(20))),
        "payload_too_large"
    );
    c.publish_stream("size", 1).unwrap();
    // The payload counts (the JSON text of data and headers), not the
    // subject: "12345678" is 10 bytes of JSON.
    c.publish_stream("size", "12345678").unwrap();
    assert_eq!(
        code(c.publish_stream("size", "123456789")),
        "payload_too_large"
    );

    let mut cfg = StreamConfig::new("AGE", &["age"]);
    cfg.max_age_ms = Some(200);
    c.stream_create(&cfg).unwrap();
    c.publish_stream("age", 1).unwrap();
    assert_eq!(c.stream_info("AGE").unwrap().state.messages, 1);
    assert!(eventually(Duration::from_secs(5), || {
        c.stream_info("AGE").unwrap().state.messages == 0
    }));
}

#[test]
fn duplicate_window() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    let mut cfg = StreamConfig::new("D", &["d"]);
    cfg.duplicate_window_ms = Some(60_000);
    c.stream_create(&cfg).unwrap();
    let with_id =
        |id: &str| OutMessage::new("d", Payload::Json(json!(id))).with_header("Msg-Id", id);
    let first = c.publish_stream_msg(&with_id("a")).unwrap();
    let again = c.publish_stream_msg(&with_id("a")).unwrap();
    assert_eq!((again.seq, again.duplicate), (first.seq, true));
    let other = c.publish_stream_msg(&with_id("b")).unwrap();
    assert_eq!((other.seq, other.duplicate), (2, false));
    assert_eq!(c.stream_info("D").unwrap().state.messages, 2);
}

#[test]
fn pull_consumer_fetch_ack_and_info() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "P", &["p.*"]);
    for i in 1..=5 {
        c.publish_stream(if i % 2 == 0 { "p.even" } else { "p.odd" }, i)
            .unwrap();
    }
    let info = c.consumer_create("P", &ConsumerConfig::new("all")).unwrap();
    assert_eq!(info.num_pending, 5);
    assert_eq!(info.config["ack_policy"], "explicit");
    assert_eq!(info.config["ack_wait_ms"], 30000);
    let got = c
        .fetch("P", "all", 3, Some(Duration::from_secs(1)))
        .unwrap();
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(got[0].delivered, Some(1));
    c.ack("P", "all", 2).unwrap();
    let i = c.consumer_info("P", "all").unwrap();
    assert_eq!((i.delivered.stream_seq, i.delivered.consumer_seq), (3, 3));
    assert_eq!(i.ack_floor.stream_seq, 0);
    assert_eq!(
        (i.num_pending, i.num_ack_pending, i.num_redelivered),
        (2, 2, 0)
    );
    c.ack("P", "all", 1).unwrap();
    c.ack("P", "all", 3).unwrap();
    let i = c.consumer_info("P", "all").unwrap();
    assert_eq!((i.ack_floor.stream_seq, i.ack_floor.consumer_seq), (3, 3));
    // Acking again is accepted; a seq never delivered is not_found.
    c.ack("P", "all", 3).unwrap();
    assert_eq!(code(c.ack("P", "all", 5)), "not_found");

    // Filter and deliver policies.
    let mut f = ConsumerConfig::new("even");
    f.filter_subject = Some("p.even".into());
    assert_eq!(c.consumer_create("P", &f).unwrap().num_pending, 2);
    let got = c.fetch("P", "even", 10, None).unwrap();
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![2, 4]);
    let mut last = ConsumerConfig::new("last");
    last.deliver_policy = Some("last".into());
    c.consumer_create("P", &last).unwrap();
    assert_eq!(c.fetch("P", "last", 10, None).unwrap()[0].seq, 5);
    let mut new = ConsumerConfig::new("new");
    new.deliver_policy = Some("new".into());
    c.consumer_create("P", &new).unwrap();
    assert!(c.fetch("P", "new", 10, None).unwrap().is_empty());
    let mut by = ConsumerConfig::new("by");
    by.deliver_policy = Some("by_start_seq".into());
    by.opt_start_seq = Some(4);
    c.consumer_create("P", &by).unwrap();
    assert_eq!(c.fetch("P", "by", 10, None).unwrap()[0].seq, 4);

    // Same config again: ok; another: exists. List and delete.
    c.consumer_create("P", &f).unwrap();
    let mut f2 = f.clone();
    f2.ack_wait_ms = Some(5);
    assert_eq!(code(c.consumer_create("P", &f2)), "exists");
    assert_eq!(c.consumer_list("P").unwrap().len(), 5);
    c.consumer_delete("P", "even").unwrap();
    assert_eq!(code(c.consumer_info("P", "even")), "not_found");
    assert_eq!(c.stream_info("P").unwrap().state.consumer_count, 4);
}

#[test]
fn ack_policies_all_and_none() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "A", &["a"]);
    for i in 0..4 {
        c.publish_stream("a", i).unwrap();
    }
    let mut all = ConsumerConfig::new("all");
    all.ack_policy = Some("all".into());
    c.consumer_create("A", &all).unwrap();
    assert_eq!(c.fetch("A", "all", 4, None).unwrap().len(), 4);
    c.ack("A", "all", 3).unwrap();
    let i = c.consumer_info("A", "all").unwrap();
    assert_eq!((i.ack_floor.stream_seq, i.num_ack_pending), (3, 1));

    let mut none = ConsumerConfig::new("none");
    none.ack_policy = Some("none".into());
    c.consumer_create("A", &none).unwrap();
    assert_eq!(c.fetch("A", "none", 2, None).unwrap().len(), 2);
    let i = c.consumer_info("A", "none").unwrap();
    assert_eq!((i.ack_floor.stream_seq, i.num_ack_pending), (2, 0));
}

#[test]
fn redelivery_nak_term_wip_and_max_deliver() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "R", &["r"]);
    c.publish_stream("r", "one").unwrap();
    c.publish_stream("r", "two").unwrap();
    let mut cfg = ConsumerConfig::new("w");
    cfg.ack_wait_ms = Some(200);
    cfg.max_deliver = Some(2);
    c.consumer_create("R", &cfg).unwrap();
    let wait = Some(Duration::from_secs(3));
    let first = c.fetch("R", "w", 2, wait).unwrap();
    assert_eq!(first.len(), 2);
    // ack_wait passes: both come back with delivered = 2.
    let again = c.fetch("R", "w", 2, wait).unwrap();
    assert_eq!(
        again
            .iter()
            .map(|m| (m.seq, m.delivered))
            .collect::<Vec<_>>(),
        vec![(1, Some(2)), (2, Some(2))]
    );
    let i = c.consumer_info("R", "w").unwrap();
    assert_eq!(i.num_redelivered, 2);
    // max_deliver 2: after another ack_wait they are not delivered again.
    let none = c
        .fetch("R", "w", 2, Some(Duration::from_millis(600)))
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    assert!(eventually(Duration::from_secs(3), || {
        c.consumer_info("R", "w").unwrap().num_ack_pending == 0
    }));

    // nak with a delay, term, wip.
    let mut cfg = ConsumerConfig::new("n");
    cfg.ack_wait_ms = Some(60_000);
    c.consumer_create("R", &cfg).unwrap();
    let got = c.fetch("R", "n", 2, wait).unwrap();
    assert_eq!(got.len(), 2);
    let t0 = Instant::now();
    c.wip("R", "n", 1).unwrap();
    c.nak("R", "n", 1, Duration::from_millis(300)).unwrap();
    c.term("R", "n", 2).unwrap();
    let back = c.fetch("R", "n", 2, wait).unwrap();
    assert_eq!(
        back.iter()
            .map(|m| (m.seq, m.delivered))
            .collect::<Vec<_>>(),
        vec![(1, Some(2))]
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "nak delay honoured"
    );
    c.nak("R", "n", 1, Duration::ZERO).unwrap();
    assert_eq!(c.fetch("R", "n", 1, wait).unwrap()[0].delivered, Some(3));
    // A second term of the same seq is accepted; nak of it is not (done).
    c.term("R", "n", 2).unwrap();
    assert_eq!(code(c.nak("R", "n", 2, Duration::ZERO)), "not_found");
}

#[test]
fn max_ack_pending_holds_back_deliveries() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "M", &["m"]);
    for i in 0..5 {
        c.publish_stream("m", i).unwrap();
    }
    let mut cfg = ConsumerConfig::new("c");
    cfg.max_ack_pending = Some(2);
    c.consumer_create("M", &cfg).unwrap();
    assert_eq!(c.fetch("M", "c", 5, None).unwrap().len(), 2);
    assert!(c.fetch("M", "c", 5, None).unwrap().is_empty());
    c.ack("M", "c", 1).unwrap();
    assert_eq!(
        c.fetch("M", "c", 5, None)
            .unwrap()
            .iter()
            .map(|m| m.seq)
            .collect::<Vec<_>>(),
        vec![3]
    );
}

#[test]
fn waiting_fetch_wakes_on_publish_and_expires_empty() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "F", &["f"]);
    c.consumer_create("F", &ConsumerConfig::new("c")).unwrap();
    let t0 = Instant::now();
    assert!(c
        .fetch("F", "c", 1, Some(Duration::from_millis(200)))
        .unwrap()
        .is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(180));
    let addr = b.addr.clone();
    // Publishes once the fetch below is seen waiting on the broker.
    let publisher = std::thread::spawn(move || {
        let p = Client::connect(&addr).unwrap();
        let waiting = || {
            p.call("consumer.info", json!({"stream": "F", "name": "c"}))
                .unwrap()["consumer"]["num_waiting"]
                == json!(1)
        };
        assert!(eventually(Duration::from_secs(5), waiting));
        p.publish_stream("f", "late").unwrap();
    });
    let t0 = Instant::now();
    let got = c
        .fetch("F", "c", 10, Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(t0.elapsed() < Duration::from_secs(5), "answered on arrival");
    publisher.join().unwrap();
}

#[test]
fn a_waiting_fetch_ends_when_its_consumer_is_deleted() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "WD", &["wd"]);
    c.consumer_create("WD", &ConsumerConfig::new("c")).unwrap();
    let addr = b.addr.clone();
    let waiter = std::thread::spawn(move || {
        let w = Client::connect(&addr).unwrap();
        let t0 = Instant::now();
        let r = w.fetch("WD", "c", 1, Some(Duration::from_secs(20)));
        (code(r), t0.elapsed())
    });
    let waiting = |c: &Client| {
        c.call("consumer.info", json!({"stream":"WD","name":"c"}))
            .unwrap()["consumer"]["num_waiting"]
            .clone()
    };
    assert!(eventually(Duration::from_secs(5), || waiting(&c) == json!(1)));
    c.consumer_delete("WD", "c").unwrap();
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, "not_found");
    assert!(
        waited < Duration::from_secs(10),
        "answered at the delete, not at expiry"
    );
}

#[test]
fn workqueue_and_interest_retention() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    let mut cfg = StreamConfig::new("WQ", &["wq.>"]);
    cfg.retention = Some("workqueue".into());
    c.stream_create(&cfg).unwrap();
    c.consumer_create("WQ", &ConsumerConfig::new("w")).unwrap();
    // A second consumer over the same subjects is refused.
    assert_eq!(
        code(c.consumer_create("WQ", &ConsumerConfig::new("w2"))),
        "bad_request"
    );
    for i in 0..3 {
        c.publish_stream("wq.x", i).unwrap();
    }
    let got = c.fetch("WQ", "w", 3, None).unwrap();
    c.ack("WQ", "w", got[0].seq).unwrap();
    c.ack("WQ", "w", got[2].seq).unwrap();
    let st = c.stream_info("WQ").unwrap().state;
    assert_eq!((st.messages, st.first_seq), (1, 2));

    let mut cfg = StreamConfig::new("IN", &["in"]);
    cfg.retention = Some("interest".into());
    c.stream_create(&cfg).unwrap();
    // No consumer: not kept, but acked with a seq.
    assert_eq!(c.publish_stream("in", 0).unwrap().seq, 1);
    assert_eq!(c.stream_info("IN").unwrap().state.messages, 0);
    c.consumer_create("IN", &ConsumerConfig::new("a")).unwrap();
    c.consumer_create("IN", &ConsumerConfig::new("b")).unwrap();
    c.publish_stream("in", 1).unwrap();
    let a = c.fetch("IN", "a", 1, None).unwrap();
    c.ack("IN", "a", a[0].seq).unwrap();
    assert_eq!(c.stream_info("IN").unwrap().state.messages, 1);
    let bm = c.fetch("IN", "b", 1, None).unwrap();
    c.ack("IN", "b", bm[0].seq).unwrap();
    assert_eq!(c.stream_info("IN").unwrap().state.messages, 0);
}

#[test]
fn push_consumer_delivers_and_paces() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "PU", &["pu"]);
    let sub = c.subscribe("deliver.pu").unwrap();
    let mut cfg = ConsumerConfig::new("push");
    cfg.deliver_subject = Some("deliver.pu".into());
    cfg.max_ack_pending = Some(2);
    c.consumer_create("PU", &cfg).unwrap();
    for i in 0..4 {
        c.publish_stream("pu", i).unwrap();
    }
    let m1 = sub.recv_timeout(Duration::from_secs(5)).unwrap();
    let m2 = sub.recv_timeout(Duration::from_secs(5)).unwrap();
    let d1 = m1.stream.clone().unwrap();
    assert_eq!(
        (
            d1.stream.as_str(),
            d1.consumer.as_str(),
            d1.seq,
            d1.delivered
        ),
        ("PU", "push", 1, 1)
    );
    assert_eq!(m1.subject, "pu");
    assert_eq!(m2.stream.as_ref().map(|d| d.seq), Some(2));
    // Paced by max_ack_pending: nothing more until an ack.
    assert!(sub.recv_timeout(Duration::from_millis(300)).is_err());
    c.ack("PU", "push", 1).unwrap();
    let m3 = sub.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(m3.stream.map(|d| d.seq), Some(3));
    assert_eq!(code(c.fetch("PU", "push", 1, None)), "bad_request");
}

#[test]
fn push_consumer_to_a_queue_group() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "G", &["g"]);
    let x = connect(&b);
    let y = connect(&b);
    let sx = x.queue_subscribe("deliver.g", "workers").unwrap();
    let sy = y.queue_subscribe("deliver.g", "workers").unwrap();
    let mut cfg = ConsumerConfig::new("grp");
    cfg.deliver_subject = Some("deliver.g".into());
    cfg.deliver_group = Some("workers".into());
    cfg.ack_policy = Some("none".into());
    c.consumer_create("G", &cfg).unwrap();
    let n = 20;
    for i in 0..n {
        c.publish_stream("g", i).unwrap();
    }
    let mut seen = BTreeSet::new();
    let (mut on_x, mut on_y) = (0, 0);
    let end = Instant::now() + Duration::from_secs(10);
    while seen.len() < n && Instant::now() < end {
        if let Ok(m) = sx.recv_timeout(Duration::from_millis(20)) {
            assert!(seen.insert(m.stream.map(|d| d.seq)), "delivered once");
            on_x += 1;
        }
        if let Ok(m) = sy.recv_timeout(Duration::from_millis(20)) {
            assert!(seen.insert(m.stream.map(|d| d.seq)), "delivered once");
            on_y += 1;
        }
    }
    assert_eq!(seen.len(), n);
    assert!(
        on_x > 0 && on_y > 0,
        "spread over the group: {on_x} / {on_y}"
    );
}

fn publish_bytes_to_stream(c: &Client, subject: &str, bytes: &[u8]) -> Result<u64, Error> {
    let msg = OutMessage::new(subject, Payload::Bytes(bytes.to_vec()));
    c.publish_stream_msg(&msg).map(|a| a.seq)
}

fn placeholder(num: u64) -> Value {
    json!({"_placeholder": true, "num": num})
}

#[test]
fn binary_data_is_stored_and_comes_back_as_bytes() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    let mut cfg = StreamConfig::new("BIN", &["bin.>"]);
    cfg.max_msg_size = Some(300);
    c.stream_create(&cfg).unwrap();
    let all: Vec<u8> = (0..=255).collect();
    let edge = vec![0xffu8; 300];
    // max_msg_size counts the bytes themselves (not the placeholder's text).
    assert_eq!(publish_bytes_to_stream(&c, "bin.a", &all).unwrap(), 1);
    assert_eq!(c.publish_stream("bin.b", "text").unwrap().seq, 2);
    assert_eq!(
        publish_bytes_to_stream(&c, "bin.b", b"\x00\xfe").unwrap(),
        3
    );
    assert_eq!(publish_bytes_to_stream(&c, "bin.c", &edge).unwrap(), 4);
    assert_eq!(
        code(publish_bytes_to_stream(&c, "bin.c", &[1; 301])),
        "payload_too_large"
    );
    assert_eq!(c.stream_info("BIN").unwrap().state.messages, 4);

    let got = c.stream_get("BIN", 1).unwrap();
    assert_eq!((got.data, got.bytes), (placeholder(0), Some(all.clone())));
    let got = c.stream_get("BIN", 2).unwrap();
    assert_eq!((got.data, got.bytes), (json!("text"), None));
    let got = c.stream_get_last("BIN", "bin.b").unwrap();
    assert_eq!(got.seq, 3);
    assert_eq!(got.bytes.as_deref(), Some(&b"\x00\xfe"[..]));

    // A fetch answer numbers the placeholders in order.
    c.consumer_create("BIN", &ConsumerConfig::new("pull"))
        .unwrap();
    let got = c.fetch("BIN", "pull", 10, None).unwrap();
    let seen: Vec<(u64, Value, Option<Vec<u8>>)> =
        got.into_iter().map(|m| (m.seq, m.data, m.bytes)).collect();
    assert_eq!(
        seen,
        vec![
            (1, placeholder(0), Some(all.clone())),
            (2, json!("text"), None),
            (3, placeholder(1), Some(b"\x00\xfe".to_vec())),
            (4, placeholder(2), Some(edge.clone())),
        ]
    );
    // The raw ack: the placeholders and one attachment per binary message.
    let (raw, attachments) = c
        .call_with_attachments("stream.get", json!({"name": "BIN", "seq": 4}))
        .unwrap();
    assert_eq!(raw["message"]["data"], placeholder(0));
    assert_eq!(attachments, vec![edge.clone()]);

    // Push delivery: a BINARY_EVENT `msg` with the stream fields.
    let sub = c.subscribe("deliver.bin").unwrap();
    let mut push = ConsumerConfig::new("push");
    push.deliver_subject = Some("deliver.bin".into());
    push.ack_policy = Some("none".into());
    c.consumer_create("BIN", &push).unwrap();
    let mut pushed = Vec::new();
    for _ in 0..4 {
        let m = sub.recv_timeout(Duration::from_secs(5)).unwrap();
        let seq = m.stream.as_ref().map(|d| (d.stream.clone(), d.seq));
        pushed.push((seq, m.subject.clone(), m.bytes().map(<[u8]>::to_vec)));
    }
    let s = |seq| Some(("BIN".to_string(), seq));
    assert_eq!(
        pushed,
        vec![
            (s(1), "bin.a".to_string(), Some(all)),
            (s(2), "bin.b".to_string(), None),
            (s(3), "bin.b".to_string(), Some(b"\x00\xfe".to_vec())),
            (s(4), "bin.c".to_string(), Some(edge)),
        ]
    );
}

#[test]
fn binary_messages_survive_a_restart() {
    let mut b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "BR", &["br"]);
    // Not UTF-8, with bytes that look like record framing and JSON.
    let blob: Vec<u8> = b"\xff\x00{\"_placeholder\":true}\x80\n".repeat(50);
    assert_eq!(publish_bytes_to_stream(&c, "br", &blob).unwrap(), 1);
    assert_eq!(c.publish_stream("br", json!({"n": 2})).unwrap().seq, 2);
    drop(c);
    b.restart(&[]);
    let c = connect(&b);
    let got = c.stream_get("BR", 1).unwrap();
    assert_eq!((got.data, got.bytes), (placeholder(0), Some(blob.clone())));
    c.consumer_create("BR", &ConsumerConfig::new("c")).unwrap();
    let got = c.fetch("BR", "c", 5, None).unwrap();
    let seen: Vec<(u64, Option<Vec<u8>>)> = got.into_iter().map(|m| (m.seq, m.bytes)).collect();
    assert_eq!(seen, vec![(1, Some(blob)), (2, None)]);
}

#[test]
fn restart_recovers_streams_and_cursors() {
    let mut b = Broker::start(&[]);
    let c = connect(&b);
    let mut cfg = StreamConfig::new("K", &["k"]);
    cfg.max_msgs = Some(100);
    c.stream_create(&cfg).unwrap();
    for i in 1..=6 {
        c.publish_stream("k", i).unwrap();
    }
    c.consumer_create("K", &ConsumerConfig::new("c")).unwrap();
    let got = c.fetch("K", "c", 4, None).unwrap();
    assert_eq!(got.len(), 4);
    for s in [1, 2, 4] {
        c.ack("K", "c", s).unwrap();
    }
    drop(c);
    b.restart(&[]);
    let c = connect(&b);
    let info = c.stream_info("K").unwrap();
    assert_eq!(info.config["max_msgs"], 100);
    let st = info.state;
    assert_eq!((st.messages, st.first_seq, st.last_seq), (6, 1, 6));
    let i = c.consumer_info("K", "c").unwrap();
    assert_eq!((i.ack_floor.stream_seq, i.num_ack_pending), (2, 1));
    // The unacked 3 comes back (as a redelivery), then 5 and 6; never 1, 2, 4.
    let got = c.fetch("K", "c", 10, None).unwrap();
    let seqs: Vec<(u64, Option<u64>)> = got.iter().map(|m| (m.seq, m.delivered)).collect();
    assert_eq!(seqs, vec![(3, Some(2)), (5, Some(1)), (6, Some(1))]);
    assert_eq!(c.stream_get("K", 4).unwrap().data, json!(4));
    assert_eq!(c.publish_stream("k", 7).unwrap().seq, 7);
}

#[test]
fn a_stream_that_cannot_be_recovered_is_refused_not_overwritten() {
    let mut b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "GOOD", &["good"]);
    stream(&c, "BAD", &["bad"]);
    c.publish_stream("good", 1).unwrap();
    c.publish_stream("bad", 1).unwrap();
    drop(c);
    b.kill();
    let snap = b.data_dir().join("streams/BAD/meta.snap");
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&snap, bytes).unwrap();
    // A create that died before its snapshot leaves a log and nothing else.
    let half = b.data_dir().join("streams/HALF");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("meta.1.log"), b"").unwrap();
    b.restart(&[]);
    let c = connect(&b);
    assert_eq!(code(c.stream_info("BAD")), "internal");
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("BAD", &["bad"]))),
        "internal"
    );
    assert_eq!(code(c.stream_delete("BAD")), "internal");
    // Every event naming it says so, the fetch included.
    assert_eq!(code(c.fetch("BAD", "c", 1, None)), "internal");
    assert_eq!(code(c.consumer_info("BAD", "c")), "internal");
    assert!(
        b.data_dir().join("streams/BAD/meta.snap").exists(),
        "left alone"
    );
    assert_eq!(c.stream_info("GOOD").unwrap().state.messages, 1);
    assert_eq!(c.publish_stream("good", 2).unwrap().seq, 2);
    assert_eq!(code(c.stream_info("HALF")), "not_found");
    stream(&c, "HALF", &["half"]);
}

#[test]
fn every_sync_policy_keeps_acked_messages_across_sigkill() {
    for policy in ["-sync=always", "-sync=50ms", "-sync=none"] {
        let mut b = Broker::start(&[policy]);
        let c = connect(&b);
        stream(&c, "P", &["p"]);
        c.consumer_create("P", &ConsumerConfig::new("c")).unwrap();
        for i in 1..=20 {
            assert_eq!(c.publish_stream("p", i).unwrap().seq, i, "{policy}");
        }
        let got = c.fetch("P", "c", 5, None).unwrap();
        for m in &got {
            c.ack("P", "c", m.seq).unwrap();
        }
        drop(c);
        b.restart(&[policy]);
        let c = connect(&b);
        let st = c.stream_info("P").unwrap().state;
        assert_eq!((st.messages, st.last_seq), (20, 20), "{policy}");
        let i = c.consumer_info("P", "c").unwrap();
        assert_eq!(i.ack_floor.stream_seq, 5, "{policy}");
        assert_eq!(c.fetch("P", "c", 1, None).unwrap()[0].seq, 6, "{policy}");
    }
}

#[test]
fn bad_input_gets_clear_errors() {
    let b = Broker::start(&[]);
    let c = connect(&b);
    for name in ["", "a.b", "has space", "x/y", &"n".repeat(65)] {
        assert_eq!(
            code(c.stream_create(&StreamConfig::new(name, &["ok"]))),
            "bad_request",
            "{name:?}"
        );
    }
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("S", &[]))),
        "bad_request"
    );
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("S", &["a..b"]))),
        "bad_subject"
    );
    assert_eq!(
        code(c.stream_create(&StreamConfig::new("S", &["a.>", "a.b"]))),
        "bad_request"
    );
    let bad = |arg: Value| match c.call("stream.create", arg) {
        Err(Error::Server { code, .. }) => code,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        bad(json!({"name":"S","subjects":["a"],"retention":"forever"})),
        "bad_request"
    );
    assert_eq!(
        bad(json!({"name":"S","subjects":["a"],"max_msgs":-1})),
        "bad_request"
    );
    assert_eq!(
        bad(json!({"name":"S","subjects":["a"],"colour":"red"})),
        "bad_request"
    );
    assert_eq!(bad(json!("S")), "bad_request");
    stream(&c, "S", &["s"]);
    assert_eq!(code(c.stream_info("NOPE")), "not_found");
    assert_eq!(
        code(c.consumer_create("NOPE", &ConsumerConfig::new("c"))),
        "not_found"
    );
    assert_eq!(code(c.consumer_info("S", "nope")), "not_found");
    assert_eq!(code(c.fetch("S", "nope", 1, None)), "not_found");
    assert_eq!(code(c.ack("S", "nope", 1)), "not_found");
    c.consumer_create("S", &ConsumerConfig::new("c")).unwrap();
    assert_eq!(code(c.ack("S", "c", 1)), "not_found");
    assert_eq!(code(c.nak("S", "c", 0, Duration::ZERO)), "not_found");
    assert_eq!(code(c.fetch("S", "c", 0, None)), "bad_request");
    assert_eq!(code(c.fetch("S", "c", 100_000, None)), "bad_request");
    let mut bad_cfg = ConsumerConfig::new("b");
    bad_cfg.deliver_policy = Some("by_start_seq".into());
    assert_eq!(code(c.consumer_create("S", &bad_cfg)), "bad_request");
    assert_eq!(
        code(c.consumer_create("S", &ConsumerConfig::new("bad name"))),
        "bad_request"
    );
    assert_eq!(code(c.stream_get("S", 1)), "not_found");
    assert!(
        matches!(c.call("stream.get", json!({"name":"S"})), Err(Error::Server { code, .. }) if code == "bad_request")
    );
    // Nothing else was disturbed.
    assert_eq!(c.publish_stream("s", 1).unwrap().seq, 1);
    assert_eq!(c.fetch("S", "c", 1, None).unwrap()[0].seq, 1);
    c.ping().unwrap();
}

/// Contract §5: sequences never go back, also across purges and restarts
/// (a `kill -9` one included), and an empty stream reports
/// `first_seq = last_seq + 1`, whichever way it was emptied.
#[test]
fn emptied_streams_keep_their_sequences_across_restarts() {
    let mut b = Broker::start(&[]);
    let c = connect(&b);
    stream(&c, "P", &["p.*"]);
    let mut wq = StreamConfig::new("W", &["w"]);
    wq.retention = Some("workqueue".into());
    c.stream_create(&wq).unwrap();
    c.consumer_create("W", &ConsumerConfig::new("c")).unwrap();
    let mut int = StreamConfig::new("I", &["i"]);
    int.retention = Some("interest".into());
    c.stream_create(&int).unwrap();
    for i in 1..=3 {
        c.publish_stream("p.x", i).unwrap();
        c.publish_stream("w", i).unwrap();
        // No consumer: acked with its seq, not kept.
        assert_eq!(c.publish_stream("i", i).unwrap().seq, i);
    }
    assert_eq!(c.stream_purge("P", Some("p.*")).unwrap(), 3);
    for m in c.fetch("W", "c", 10, None).unwrap() {
        c.ack("W", "c", m.seq).unwrap();
    }
    let empty = |c: &Client, name: &str| {
        let st = c.stream_info(name).unwrap().state;
        (st.messages, st.bytes, st.first_seq, st.last_seq)
    };
    for name in ["P", "W", "I"] {
        assert_eq!(empty(&c, name), (0, 0, 4, 3), "{name} emptied");
    }
    drop(c);
    b.restart(&[]);
    let c = connect(&b);
    for name in ["P", "W", "I"] {
        assert_eq!(empty(&c, name), (0, 0, 4, 3), "{name} after a restart");
    }
    assert_eq!(c.publish_stream("p.y", 4).unwrap().seq, 4);
    assert_eq!(c.stream_purge("P", None).unwrap(), 1);
    drop(c);
    b.kill();
    b.restart(&[]);
    let c = connect(&b);
    assert_eq!(empty(&c, "P"), (0, 0, 5, 4), "after kill -9");
    assert_eq!(c.publish_stream("p.z", 5).unwrap().seq, 5);
    assert_eq!(c.publish_stream("w", 4).unwrap().seq, 4);
}
