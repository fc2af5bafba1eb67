//! One rule for every event's arguments (docs/PROTOCOL.md §2, Events and
//! acks): a well-formed event whose argument is missing, too short, too
//! long (an argument array with more values than the request has fields)
//! or of the wrong type is answered `bad_request`, and the connection stays
//! open and usable. A table covers every event name of `/` (core and
//! stream events) and `/control`. Events that take no argument ignore one.

mod common;

use common::raw_ws::Ws;
use common::Broker;
use serde_json::Value;

const CONTROL_TOKEN: &str = "secret";

/// An event that takes an argument, with arguments it must refuse.
struct Case {
    event: &'static str,
    /// Missing fields (`None`: no argument at all).
    too_few: &'static [Option<&'static str>],
    /// An argument array longer than the request's fields.
    too_many: &'static str,
    wrong_type: &'static [&'static str],
}

const ROOT: &[Case] = &[
    Case {
        event: "pub",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["a.b",1,"r.x",{},5]"#,
        wrong_type: &["5", r#"{"subject":5}"#, r#"{"subject":"a.b","reply":[]}"#],
    },
    Case {
        event: "sub",
        too_few: &[None, Some("[]"), Some(r#"{"sid":"x"}"#)],
        too_many: r#"["a.b","q","s1",1,"x"]"#,
        wrong_type: &[r#""a.b""#, r#"{"subject":"a.b","max":"x"}"#],
    },
    Case {
        event: "unsub",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["s1",1,2]"#,
        wrong_type: &["null", r#"{"sid":{}}"#, r#"{"sid":"s1","after":-1}"#],
    },
    Case {
        event: "request",
        too_few: &[None, Some("[]"), Some(r#"{"data":1}"#)],
        too_many: r#"["a.b",1,{},100,"x"]"#,
        wrong_type: &["[1]", r#"{"subject":"a.b","timeout_ms":"soon"}"#],
    },
    Case {
        event: "stream.create",
        too_few: &[None, Some("{}")],
        too_many: r#"["S",["s.>"],1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]"#,
        wrong_type: &["7", r#"{"name":5,"subjects":["s.>"]}"#],
    },
    Case {
        event: "stream.info",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["S","x"]"#,
        wrong_type: &[r#"{"name":5}"#],
    },
    Case {
        event: "stream.delete",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["S","x"]"#,
        wrong_type: &[r#"{"name":true}"#],
    },
    Case {
        event: "stream.purge",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["S","a",1]"#,
        wrong_type: &[r#"{"name":"S","subject":5}"#],
    },
    Case {
        event: "stream.get",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["S",1,"a",1]"#,
        wrong_type: &[r#"{"name":"S","seq":"x"}"#],
    },
    Case {
        event: "consumer.create",
        too_few: &[None, Some("{}")],
        too_many: r#"["S",{},1]"#,
        wrong_type: &[r#"{"stream":5}"#],
    },
    Case {
        event: "consumer.info",
        too_few: &[None, Some(r#"["S"]"#), Some(r#"{"stream":"S"}"#)],
        too_many: r#"["S","c",1]"#,
        wrong_type: &[r#"{"stream":"S","name":5}"#],
    },
    Case {
        event: "consumer.list",
        too_few: &[None, Some("[]"), Some("{}")],
        too_many: r#"["S",1]"#,
        wrong_type: &[r#"{"stream":5}"#],
    },
    Case {
        event: "consumer.delete",
        too_few: &[None, Some(r#"["S"]"#), Some(r#"{"stream":"S"}"#)],
        too_many: r#"["S","c",1]"#,
        wrong_type: &[r#"{"stream":"S","name":[]}"#],
    },
    Case {
        event: "consumer.fetch",
        too_few: &[None, Some(r#"["S"]"#), Some(r#"{"stream":"S"}"#)],
        too_many: r#"["S","c",1,100,true,1,2,3]"#,
        wrong_type: &[r#"{"stream":"S","consumer":"c","batch":"x"}"#],
    },
    Case {
        event: "ack",
        too_few: &[
            None,
            Some(r#"["S","c"]"#),
            Some(r#"{"stream":"S","consumer":"c"}"#),
        ],
        too_many: r#"["S","c",1,0,9]"#,
        wrong_type: &[r#"{"stream":"S","consumer":"c","seq":"1"}"#],
    },
    Case {
        event: "nak",
        too_few: &[
            None,
            Some(r#"["S","c"]"#),
            Some(r#"{"stream":"S","consumer":"c"}"#),
        ],
        too_many: r#"["S","c",1,0,9]"#,
        wrong_type: &[r#"{"stream":"S","consumer":"c","seq":1,"delay_ms":"x"}"#],
    },
    Case {
        event: "term",
        too_few: &[
            None,
            Some(r#"["S","c"]"#),
            Some(r#"{"stream":"S","consumer":"c"}"#),
        ],
        too_many: r#"["S","c",1,0,9]"#,
        wrong_type: &[r#"{"stream":"S","consumer":"c","seq":-1}"#],
    },
    Case {
        event: "wip",
        too_few: &[
            None,
            Some(r#"["S","c"]"#),
            Some(r#"{"stream":"S","consumer":"c"}"#),
        ],
        too_many: r#"["S","c",1,0,9]"#,
        wrong_type: &[r#"{"stream":["S"],"consumer":"c","seq":1}"#],
    },
];

const CONTROL: &[Case] = &[
    Case {
        event: "group.set",
        too_few: &[None, Some(r#"["q"]"#), Some(r#"{"queue":"q"}"#)],
        too_many: r#"["q","broadcast",1]"#,
        wrong_type: &[r#"{"queue":"q","mode":5}"#],
    },
    // Peer events: on a single node every call is refused as a bad request.
    Case {
        event: "cluster.command",
        too_few: &[None, Some("{}")],
        too_many: r#"[{},1]"#,
        wrong_type: &["5"],
    },
    Case {
        event: "cluster.forward",
        too_few: &[None],
        too_many: r#"[1,2]"#,
        wrong_type: &["5"],
    },
];

/// Events that take no argument: one given is ignored.
const ROOT_NO_ARG: &[&str] = &["ping", "stream.list"];
const CONTROL_NO_ARG: &[&str] = &["group.list", "server.info", "cluster.status"];

/// The event array for `event` with `arg` (none: no argument).
fn event(event: &str, arg: Option<&str>) -> String {
    match arg {
        Some(a) => format!("[\"{event}\",{a}]"),
        None => format!("[\"{event}\"]"),
    }
}

/// Sends each argument of `case` on `nsp` and checks the answers.
fn check(c: &mut Ws, nsp: &str, case: &Case, failures: &mut Vec<String>) {
    let mut args: Vec<(&str, Option<&str>)> = Vec::new();
    args.extend(case.too_few.iter().map(|a| ("too few", *a)));
    args.push(("too many", Some(case.too_many)));
    args.extend(case.wrong_type.iter().map(|a| ("wrong type", Some(*a))));
    for (what, arg) in args {
        let data = event(case.event, arg);
        let ack = c.call_raw(nsp, &data);
        if ack["error"]["code"] != "bad_request" {
            failures.push(format!("{nsp}{data} ({what}): {ack}"));
        }
        // Still open and answering.
        let alive = match nsp {
            "" => c.call("ping", "{}"),
            _ => c.call_raw(nsp, r#"["group.list"]"#),
        };
        assert_eq!(
            alive["ok"], true,
            "after {nsp}{data} the connection no longer answers: {alive}"
        );
    }
}

#[test]
fn every_event_answers_bad_arguments_with_bad_request_and_stays_open() {
    let broker = Broker::start(&[&format!("-control-token={CONTROL_TOKEN}")]);
    let mut c = Ws::join(&broker.addr);
    c.send(&format!("0/control,{{\"token\":\"{CONTROL_TOKEN}\"}}"));
    let joined = c.next(|p| p.starts_with("0/control,") || p.starts_with("4/control,"));
    assert!(joined.starts_with("0/control,{"), "{joined}");
    let mut failures = Vec::new();
    for case in ROOT {
        check(&mut c, "", case, &mut failures);
    }
    for case in CONTROL {
        check(&mut c, "/control,", case, &mut failures);
    }
    for name in ROOT_NO_ARG {
        let ack = c.call_raw("", &event(name, Some(r#"["x",1,2,3]"#)));
        if ack["ok"] != true {
            failures.push(format!("{name} with an ignored argument: {ack}"));
        }
    }
    for name in CONTROL_NO_ARG {
        let ack = c.call_raw("/control,", &event(name, Some(r#"["x",1,2,3]"#)));
        if ack["ok"] != true {
            failures.push(format!("/control {name} with an ignored argument: {ack}"));
        }
    }
    // Still subscribed and delivering at the end.
    let ack = c.call("sub", r#"{"subject":"end.x","sid":"e"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    let ack = c.call("pub", r#"{"subject":"end.x","data":"bye"}"#);
    assert_eq!(ack["ok"], true, "{ack}");
    c.call("ping", "{}");
    assert_eq!(c.take_msgs(), vec![("e".to_string(), Value::from("bye"))]);
    assert!(
        failures.is_empty(),
        "events not answered bad_request:\n{}",
        failures.join("\n")
    );
}
