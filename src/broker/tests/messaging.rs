//! Core messaging in-process: subjects and wildcards, queue groups,
//! request/reply, slow consumers and connection timers, each checked by
//! the packets the core queues for each connection (docs/PROTOCOL.md).

use std::time::Duration;

use super::{msg, Action, Core};
use crate::port::Handler;

/// The `reply` subject of a delivered `msg` packet.
fn reply_of(packet: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(packet.strip_prefix('2').unwrap()).unwrap();
    v[1]["reply"].as_str().unwrap().to_string()
}

#[test]
fn a_publish_reaches_every_matching_subscription_then_its_ack() {
    let mut core = Core::new();
    for conn in 1..=4 {
        core.join(conn);
    }
    core.sub(1, "s1", "orders.new", None);
    core.sub(2, "s2", "orders.*", None);
    core.sub(3, "s3", "orders.>", None);
    core.sub(3, "s4", "orders.*.eu", None);

    core.text(4, r#"25["pub",{"subject":"orders.new","data":{"id":7}}]"#);
    assert_eq!(core.sent(1), [msg("s1", "orders.new", r#"{"id":7}"#)]);
    assert_eq!(core.sent(2), [msg("s2", "orders.new", r#"{"id":7}"#)]);
    assert_eq!(core.sent(3), [msg("s3", "orders.new", r#"{"id":7}"#)]);
    assert_eq!(core.sent(4), [r#"35[{"ok":true}]"#]);
    core.assert_quiet();

    // `*` takes one token, `>` one or more.
    core.text(4, r#"26["pub",{"subject":"orders.new.eu","data":"x"}]"#);
    let mut got = core.sent(3);
    got.sort();
    assert_eq!(
        got,
        [
            msg("s3", "orders.new.eu", r#""x""#),
            msg("s4", "orders.new.eu", r#""x""#)
        ]
    );
    assert_eq!(core.sent(4), [r#"36[{"ok":true}]"#]);
    core.assert_quiet();

    // Nobody listens: only the ack.
    core.text(4, r#"27["pub",{"subject":"billing.new","data":1}]"#);
    assert_eq!(core.sent(4), [r#"37[{"ok":true}]"#]);
    core.assert_quiet();
}

#[test]
fn unsub_and_a_closed_connection_end_deliveries() {
    let mut core = Core::new();
    for conn in 1..=3 {
        core.join(conn);
    }
    core.sub(1, "s1", "a", None);
    core.sub(2, "s2", "a", None);
    core.text(1, r#"23["unsub",{"sid":"s1"}]"#);
    assert_eq!(core.sent(1), [r#"33[{"ok":true}]"#]);
    core.close(2);
    core.tick();
    core.assert_quiet();

    core.text(3, r#"2["pub",{"subject":"a","data":1}]"#);
    core.tick();
    // No ack id, no ack; and no subscriber left.
    core.assert_quiet();

    core.text(1, r#"24["unsub",{"sid":"s1"}]"#);
    assert_eq!(
        core.sent(1),
        [
            r#"34[{"ok":false,"error":{"code":"not_found","message":"no subscription with sid \"s1\""}}]"#
        ]
    );
}

#[test]
fn a_load_balanced_group_gives_each_message_to_one_member_in_turn() {
    let mut core = Core::new();
    for conn in 1..=5 {
        core.join(conn);
    }
    for conn in 1..=3 {
        core.sub(conn, "w", "work", Some("q"));
    }
    core.sub(4, "p", "work", None);
    for i in 0..6 {
        core.text(5, &format!(r#"2["pub",{{"subject":"work","data":{i}}}]"#));
    }
    // The plain subscriber gets all, the group each message once.
    let all: Vec<String> = (0..6).map(|i| msg("p", "work", &i.to_string())).collect();
    assert_eq!(core.sent(4), all);
    let mut seen = Vec::new();
    for conn in 1..=3 {
        let got = core.sent(conn);
        assert_eq!(got.len(), 2, "member {conn}: {got:?}");
        seen.extend(got);
    }
    seen.sort();
    let mut expect: Vec<String> = (0..6).map(|i| msg("w", "work", &i.to_string())).collect();
    expect.sort();
    assert_eq!(seen, expect);
    core.assert_quiet();
}

#[test]
fn a_broadcast_group_gives_every_member_each_message() {
    let mut core = Core::new();
    for conn in 1..=3 {
        core.join(conn);
    }
    core.open(9);
    core.text(9, "0/control,");
    let got = core.sent(9);
    assert!(got[0].starts_with("0/control,{\"sid\":"), "{got:?}");
    core.text(
        9,
        r#"2/control,1["group.set",{"queue":"q","mode":"broadcast"}]"#,
    );
    assert_eq!(core.sent(9), [r#"3/control,1[{"ok":true}]"#]);

    core.sub(1, "a", "news", Some("q"));
    core.sub(2, "b", "news", Some("q"));
    core.text(3, r#"2["pub",{"subject":"news","data":1}]"#);
    core.text(3, r#"2["pub",{"subject":"news","data":2}]"#);
    assert_eq!(core.sent(1), [msg("a", "news", "1"), msg("a", "news", "2")]);
    assert_eq!(core.sent(2), [msg("b", "news", "1"), msg("b", "news", "2")]);
    core.assert_quiet();
}

#[test]
fn a_request_is_answered_by_the_first_reply_to_its_inbox() {
    let mut core = Core::new();
    core.join(1);
    core.join(2);
    core.sub(1, "s1", "svc.echo", None);
    core.text(
        2,
        r#"24["request",{"subject":"svc.echo","data":"hi","timeout_ms":2000}]"#,
    );
    let got = core.sent(1);
    assert_eq!(got.len(), 1);
    let inbox = reply_of(&got[0]);
    assert!(inbox.starts_with("_INBOX.n1."), "{inbox}");
    assert_eq!(
        got[0],
        format!(r#"2["msg",{{"sid":"s1","subject":"svc.echo","data":"hi","reply":"{inbox}"}}]"#)
    );
    // Nothing for the requester until the reply.
    core.assert_quiet();

    core.text(
        1,
        &format!(
            r#"22["pub",{{"subject":"{inbox}","data":{{"answer":42}},"headers":{{"h":"1"}}}}]"#
        ),
    );
    assert_eq!(
        core.sent(2),
        [format!(
            r#"34[{{"ok":true,"subject":"{inbox}","data":{{"answer":42}},"headers":{{"h":"1"}}}}]"#
        )]
    );
    assert_eq!(core.sent(1), [r#"32[{"ok":true}]"#]);
    // A second reply is an ordinary publish: nobody is subscribed.
    core.text(1, &format!(r#"23["pub",{{"subject":"{inbox}","data":0}}]"#));
    assert_eq!(core.sent(1), [r#"33[{"ok":true}]"#]);
    core.assert_quiet();
}

#[test]
fn a_request_with_no_responder_fails_at_once_and_one_unanswered_times_out() {
    let mut core = Core::new();
    core.join(1);
    core.join(2);
    core.text(2, r#"27["request",{"subject":"nobody","data":1}]"#);
    assert_eq!(
        core.sent(2),
        [
            r#"37[{"ok":false,"error":{"code":"no_responders","message":"no subscribers on \"nobody\""}}]"#
        ]
    );

    core.sub(1, "s1", "slow.svc", None);
    core.text(
        2,
        r#"28["request",{"subject":"slow.svc","data":1,"timeout_ms":100}]"#,
    );
    assert_eq!(core.sent(1).len(), 1);
    let deadline = core.sink.now + Duration::from_millis(100);
    assert!(core.broker.next_deadline().is_some_and(|d| d <= deadline));
    core.advance(Duration::from_millis(99));
    core.tick();
    core.assert_quiet();
    core.advance(Duration::from_millis(1));
    core.tick();
    assert_eq!(
        core.sent(2),
        [r#"38[{"ok":false,"error":{"code":"timeout","message":"no reply in time"}}]"#]
    );
    core.assert_quiet();
}

#[test]
fn a_slow_consumer_is_skipped_and_its_group_passes_the_message_on() {
    let mut core = Core::new();
    for conn in 1..=5 {
        core.join(conn);
    }
    core.sub(1, "a", "s", None);
    core.sub(2, "b", "s", None);
    core.sub(3, "m", "job", Some("q"));
    core.sub(4, "m", "job", Some("q"));
    // Connections 1 and 3 take nothing more: the sink cuts them as slow
    // consumers when the core tries.
    core.set_room(1, 0);
    core.set_room(3, 0);

    core.text(5, r#"21["pub",{"subject":"s","data":1}]"#);
    assert_eq!(core.sent(2), [msg("b", "s", "1")]);
    assert_eq!(core.sent(5), [r#"31[{"ok":true}]"#]);
    core.assert_quiet();
    assert_eq!(core.sink.stats.slow_consumers, 1);

    // Whichever member the turn picks, the one that can take it does.
    for i in 0..2 {
        core.text(5, &format!(r#"2["pub",{{"subject":"job","data":{i}}}]"#));
    }
    assert_eq!(core.sent(4), [msg("m", "job", "0"), msg("m", "job", "1")]);
    core.assert_quiet();

    // A request whose only responder is cut has no responders.
    core.sub(2, "r", "svc", None);
    core.set_room(2, 0);
    core.text(5, r#"22["request",{"subject":"svc","data":1}]"#);
    assert_eq!(
        core.sent(5),
        [
            r#"32[{"ok":false,"error":{"code":"no_responders","message":"no subscribers on \"svc\""}}]"#
        ]
    );
    core.assert_quiet();
}

#[test]
fn a_large_delivery_to_several_subscribers_is_queued_by_reference() {
    let mut core = Core::new();
    for conn in 1..=3 {
        core.join(conn);
    }
    core.sub(1, "a", "big", None);
    core.sub(2, "b", "big", None);
    core.take();
    let data = format!("\"{}\"", "x".repeat(600));
    core.text(3, &format!(r#"2["pub",{{"subject":"big","data":{data}}}]"#));
    let shared: Vec<(usize, bool)> = core
        .take()
        .into_iter()
        .map(|a| match a {
            Action::Text { conn, text, shared } => {
                let sid = if conn == 1 { "a" } else { "b" };
                assert_eq!(text, msg(sid, "big", &data));
                (conn, shared)
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(shared, [(1, true), (2, true)]);

    // One subscriber: copied, not shared.
    core.text(2, r#"23["unsub",{"sid":"b"}]"#);
    core.take();
    core.text(3, &format!(r#"2["pub",{{"subject":"big","data":{data}}}]"#));
    assert_eq!(
        core.take(),
        [Action::Text {
            conn: 1,
            text: msg("a", "big", &data),
            shared: false
        }]
    );
}

#[test]
fn a_session_that_joins_nothing_in_time_is_closed() {
    let mut core = Core::new();
    let t0 = core.sink.now;
    core.open(1);
    assert_eq!(
        core.take(),
        [Action::Timer(1, Some(t0 + Duration::from_secs(45)))]
    );
    core.timer(1);
    assert_eq!(core.take(), [Action::Close(1)]);

    // Joining clears the timer; a late firing closes nothing.
    core.open(2);
    core.take();
    core.text(2, "0");
    let actions = core.take();
    assert!(
        matches!(
            &actions[..],
            [Action::Text { conn: 2, .. }, Action::Timer(2, None)]
        ),
        "{actions:?}"
    );
    core.timer(2);
    core.assert_quiet();

    // A packet that is not Socket.IO closes the connection.
    core.text(2, "9junk");
    assert_eq!(core.take(), [Action::Close(2)]);
}

#[test]
fn unknown_events_are_answered_from_the_event_table() {
    let mut core = Core::new();
    core.join(1);
    core.text(1, r#"25["nope",{}]"#);
    assert_eq!(
        core.sent(1),
        [r#"35[{"ok":false,"error":{"code":"bad_request","message":"unknown event \"nope\""}}]"#]
    );
    // A `/` event is unknown on /control, and the other way round.
    core.text(1, "0/control,");
    core.sent(1);
    core.text(1, r#"2/control,6["pub",{"subject":"a"}]"#);
    assert_eq!(
        core.sent(1),
        [
            r#"3/control,6[{"ok":false,"error":{"code":"bad_request","message":"unknown event \"pub\" on /control"}}]"#
        ]
    );
    core.text(1, r#"27["group.list",{}]"#);
    assert_eq!(
        core.sent(1),
        [
            r#"37[{"ok":false,"error":{"code":"bad_request","message":"unknown event \"group.list\""}}]"#
        ]
    );
    // A packet that is not a whole event array closes the connection.
    core.assert_quiet();
    core.text(1, r#"28["nope""#);
    assert_eq!(core.take(), [Action::Close(1)]);
}

#[test]
fn the_engine_io_endpoint_and_http_requests_are_answered() {
    use crate::port::Request;
    let mut core = Core::new();
    assert_eq!(core.broker.endpoint("/socket.io/"), Some(0));
    assert_eq!(core.broker.endpoint("/socket.io"), Some(0));
    assert_eq!(core.broker.endpoint("/other/"), None);
    let req = |method: &str, path: &str| Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        headers: Vec::new(),
        minor: 1,
    };
    let r = core.broker.http(&mut core.sink, &req("GET", "/healthz"));
    assert_eq!((r.status, &r.body[..]), (200, &br#"{"status":"ok"}"#[..]));
    let r = core.broker.http(&mut core.sink, &req("POST", "/metrics"));
    assert_eq!(r.status, 405);
    let r = core.broker.http(&mut core.sink, &req("GET", "/nowhere"));
    assert_eq!(
        (r.status, &r.body[..]),
        (404, &br#"{"error":"not found"}"#[..])
    );
    core.assert_quiet();
}

#[test]
fn binary_data_is_delivered_as_a_binary_event_and_its_attachment() {
    let mut core = Core::new();
    core.join(1);
    core.join(2);
    core.sub(2, "s1", "orders.bin", None);
    core.take();
    core.text(
        1,
        r#"51-6["pub",{"subject":"orders.bin","data":{"_placeholder":true,"num":0}}]"#,
    );
    // Nothing until the attachment arrives.
    core.assert_quiet();
    core.binary(1, &[1, 2, 3]);
    assert_eq!(
        core.take(),
        [
            Action::Text {
                conn: 2,
                text: r#"51-["msg",{"sid":"s1","subject":"orders.bin","data":{"_placeholder":true,"num":0}}]"#
                    .into(),
                shared: false
            },
            Action::Binary {
                conn: 2,
                bytes: vec![1, 2, 3]
            },
            Action::Text {
                conn: 1,
                text: r#"36[{"ok":true}]"#.into(),
                shared: false
            },
        ]
    );
}

#[test]
fn the_auth_token_guards_root_and_legacy_clients_join_it_at_open() {
    let mut cfg = super::config();
    cfg.auth_token = Some("t0k".into());
    let mut core = Core::with(crate::broker::Broker::new(cfg));
    core.open(1);
    core.text(1, r#"0{"token":"wrong"}"#);
    assert_eq!(core.sent(1), [r#"4{"message":"unauthorized"}"#]);
    core.text(1, r#"0{"token":"t0k"}"#);
    let got = core.sent(1);
    assert!(got[0].starts_with(r#"0{"sid":""#), "{got:?}");
    // An Engine.IO 3 client cannot present a token at open: refused.
    core.open_with(2, 3, 1 << 20);
    assert_eq!(core.sent(2), [r#"4"unauthorized""#]);

    // Without a token, a v3 session is in `/` from the start.
    let mut core = Core::new();
    core.open_with(3, 3, 1 << 20);
    assert_eq!(core.sent(3), ["0"]);
    core.sub(3, "s", "x", None);
}
