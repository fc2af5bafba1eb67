//! Key-value buckets through the Rust client's `Kv` handle against the
//! release broker (docs/PROTOCOL.md "Key-value buckets"): revisions,
//! compare-and-set refusals carrying the latest revision, markers,
//! history, keys, binary values, and acked writes surviving kill -9 with
//! revisions that never go back.

mod common;

use common::Broker;
use std::time::Duration;

use gombus::client::{BucketConfig, Client, Error, KvWatchEvent, Payload, WatchFrom};
use serde_json::json;

#[test]
fn a_bucket_through_the_client_survives_kill9() {
    let mut b = Broker::start(&[]);
    let c = Client::connect(&b.addr).expect("connect");
    let mut cfg = BucketConfig::new("cfg");
    cfg.history = Some(2);
    let made = c.kv_create(&cfg).expect("kv.create");
    assert_eq!(made["config"]["history"], 2);
    let kv = c.kv("cfg");
    let w = kv.watch(Some("site.*"), WatchFrom::Latest).expect("watch");
    let next = || {
        w.next_timeout(Duration::from_secs(5))
            .expect("a watch event")
    };
    assert_eq!(next(), KvWatchEvent::CaughtUp, "an empty bucket");
    let r1 = kv.put("site.eu", json!({"on": true})).expect("put");
    let r2 = kv.put("site.eu", json!({"on": false})).expect("put");
    let r3 = kv
        .put("site.us", Payload::Bytes(vec![0, 255, 7]))
        .expect("put bytes");
    assert!(r1 < r2 && r2 < r3);
    for (rev, value) in [
        (r1, Payload::Json(json!({"on": true}))),
        (r2, Payload::Json(json!({"on": false}))),
        (r3, Payload::Bytes(vec![0, 255, 7])),
    ] {
        match next() {
            KvWatchEvent::Entry(e) => assert_eq!((e.revision, e.value), (rev, Some(value))),
            other => panic!("a watch event: {other:?}"),
        }
    }
    w.stop().expect("stop the watch");
    match kv.update("site.eu", json!(1), r1) {
        Err(Error::Server { code, revision, .. }) => {
            assert_eq!((code.as_str(), revision), ("wrong_revision", Some(r2)));
        }
        other => panic!("a stale update: {other:?}"),
    }
    let r4 = kv.update("site.eu", json!(3), r2).expect("update");
    let e = kv.get("site.eu").expect("get").expect("a value");
    assert_eq!(
        (e.value, e.revision, e.op.as_str()),
        (Some(Payload::Json(json!(3))), r4, "put")
    );
    let bytes = kv.get("site.us").expect("get").expect("a value");
    assert_eq!(bytes.value, Some(Payload::Bytes(vec![0, 255, 7])));
    // history 2: the oldest write of site.eu is gone.
    let h: Vec<u64> = kv
        .history("site.eu")
        .expect("history")
        .iter()
        .map(|e| e.revision)
        .collect();
    assert_eq!(h, vec![r2, r4]);
    assert_eq!(kv.get_at("site.eu", Some(r1)).expect("get_at"), None);
    let d = kv.delete("site.us", Some(r3)).expect("delete");
    assert_eq!(kv.get("site.us").expect("get"), None);
    assert_eq!(kv.keys(None).expect("keys"), vec!["site.eu".to_string()]);
    kv.update("site.us", json!("back"), 0)
        .expect("0 after a delete");

    b.restart(&[]);
    let c = Client::connect(&b.addr).expect("reconnect");
    let kv = c.kv("cfg");
    let e = kv
        .get("site.eu")
        .expect("get")
        .expect("kept across kill -9");
    assert_eq!((e.value, e.revision), (Some(Payload::Json(json!(3))), r4));
    let us = kv.history("site.us").expect("history");
    assert_eq!(
        us.iter().map(|e| e.op.as_str()).collect::<Vec<_>>(),
        vec!["delete", "put"]
    );
    assert_eq!(us[0].revision, d);
    let next = kv.put("site.eu", json!(4)).expect("put after restart");
    assert!(next > us[1].revision, "revisions went back: {next}");
    assert_eq!(kv.purge("site.eu").expect("purge"), next + 1);
    assert_eq!(kv.history("site.eu").expect("history").len(), 1);
    c.kv_delete_bucket("cfg").expect("delete bucket");
    assert!(c.kv_list().expect("list").is_empty());
}

/// docs/PROTOCOL.md "Key-value buckets", watch: with `history` 1 a burst
/// of writes to one key (sent without waiting for acks, so many land in
/// one loop turn and each removes the one before) still reaches a watch
/// whole: every revision once, in order.
#[test]
fn a_watch_misses_no_write_of_a_burst() {
    let b = Broker::start(&[]);
    let c = Client::connect(&b.addr).expect("connect");
    c.kv_create(&BucketConfig::new("burst")).expect("kv.create");
    let w = c
        .kv("burst")
        .watch(None, WatchFrom::UpdatesOnly)
        .expect("watch");
    assert_eq!(
        w.next_timeout(Duration::from_secs(5)).expect("caught up"),
        KvWatchEvent::CaughtUp
    );
    let writer = Client::connect(&b.addr).expect("connect");
    const N: u64 = 2_000;
    for i in 0..N {
        writer
            .emit("kv.put", json!({"bucket": "burst", "key": "k", "value": i}))
            .expect("emit");
    }
    writer.ping().expect("the writes were handled");
    for i in 0..N {
        match w.next_timeout(Duration::from_secs(5)).expect("a write") {
            KvWatchEvent::Entry(e) => {
                assert_eq!(
                    (e.revision, e.value),
                    (i + 1, Some(Payload::Json(json!(i))))
                )
            }
            other => panic!("write {i}: {other:?}"),
        }
    }
    let info = c.kv("burst").info().expect("kv.info");
    assert_eq!(info["state"]["values"], 1, "history 1 kept one write");
}
