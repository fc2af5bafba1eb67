//! The Rust client's resilience against real broker processes: it survives
//! a SIGKILL and restart of the broker with its subscriptions intact,
//! reports the outage as events, fails or holds publishes made while down,
//! falls through a list of addresses, and keeps each subscription's queue
//! bounded. Pipelined acked calls are answered in order and fail when the
//! broker dies under them.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::Broker;
use gombus::client::{
    Client, Error, Event, Events, Options, OutMessage, Payload, Reconnect, StreamConfig,
    Subscription,
};
use serde_json::json;

/// Bound on any single wait for a message or an event.
const WAIT: Duration = Duration::from_secs(10);

/// A quick policy so the tests do not idle: 20 ms doubling to 200 ms.
fn quick() -> Reconnect {
    Reconnect {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
        ..Reconnect::default()
    }
}

fn resilient(publish_buffer: usize) -> Options {
    Options {
        reconnect: Some(quick()),
        publish_buffer,
        ..Options::default()
    }
}

/// Waits (bounded) for the first event that `wanted` accepts.
fn await_event(events: &Events, wanted: impl Fn(&Event) -> bool) -> Event {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(event) if wanted(&event) => return event,
            Ok(event) => seen.push(event),
            Err(e) => panic!("no matching event within {WAIT:?} ({e}); saw {seen:?}"),
        }
    }
}

fn is_disconnected(event: &Event) -> bool {
    matches!(event, Event::Disconnected { .. })
}

fn is_reconnected(event: &Event) -> bool {
    matches!(event, Event::Reconnected { .. })
}

fn recv_data(sub: &Subscription) -> serde_json::Value {
    sub.recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("sid {}: nothing within {WAIT:?}: {e}", sub.sid()))
        .data
}

/// An address nothing listens on: a port the OS just handed out and took
/// back.
fn dead_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    let addr = listener.local_addr().expect("probe address");
    drop(listener);
    addr.to_string()
}

#[test]
fn subscriptions_survive_a_broker_crash_and_restart() {
    let mut broker = Broker::start(&[]);
    let client = Client::connect_any_with(&[&broker.addr], resilient(0)).unwrap();
    let events = client.events();
    let plain = client.subscribe("orders.*").unwrap();
    let worker = client.queue_subscribe("jobs.*", "workers").unwrap();
    let limited = client.subscribe_with("limited", None, Some(3)).unwrap();
    let publisher = Client::connect(&broker.addr).unwrap();
    publisher.publish_acked("limited", 1).unwrap();
    assert_eq!(recv_data(&limited), json!(1));

    broker.kill();
    let Event::Disconnected { url, .. } = await_event(&events, is_disconnected) else {
        unreachable!()
    };
    assert_eq!(url, broker.addr);
    // While down, calls fail at once with a typed error instead of hanging.
    assert_eq!(client.publish("orders.lost", 0), Err(Error::Reconnecting));
    assert_eq!(client.ping(), Err(Error::Reconnecting));
    assert!(!client.is_closed());

    broker.restart(&[]);
    let Event::Reconnected { url, attempts } = await_event(&events, is_reconnected) else {
        unreachable!()
    };
    assert_eq!(url, broker.addr);
    assert!(attempts >= 1);
    assert!(client.is_connected());

    // No resubscribe by hand: the same handles receive what is published
    // after the restart.
    let publisher = Client::connect(&broker.addr).unwrap();
    publisher.publish_acked("orders.new", "after").unwrap();
    publisher.publish_acked("jobs.build", "job").unwrap();
    assert_eq!(recv_data(&plain), json!("after"));
    assert_eq!(recv_data(&worker), json!("job"));
    // The `max` of 3 carried over as the 2 deliveries left.
    for n in 2..=4 {
        publisher.publish_acked("limited", n).unwrap();
    }
    publisher.ping().unwrap();
    client.ping().unwrap();
    assert_eq!(recv_data(&limited), json!(2));
    assert_eq!(recv_data(&limited), json!(3));
    assert_eq!(limited.try_recv(), Ok(None), "max was not carried over");
    // The queue group is really a group: a second worker shares the load.
    let other = publisher.queue_subscribe("jobs.*", "workers").unwrap();
    for n in 0..20 {
        publisher.publish("jobs.n", n).unwrap();
    }
    publisher.ping().unwrap();
    client.ping().unwrap();
    let mut got = 0;
    while worker.try_recv().unwrap().is_some() {
        got += 1;
    }
    while other.try_recv().unwrap().is_some() {
        got += 1;
    }
    assert_eq!(got, 20, "each job reaches exactly one worker");
    assert_eq!(client.publish("orders.lost", 0), Ok(()));
    assert_eq!(recv_data(&plain), json!(0));
}

#[test]
fn publishes_held_while_down_are_sent_after_reconnect() {
    let mut broker = Broker::start(&[]);
    let client = Client::connect_any_with(&[&broker.addr], resilient(3)).unwrap();
    let events = client.events();
    let sub = client.subscribe("held.>").unwrap();

    broker.kill();
    await_event(&events, is_disconnected);
    for n in 0..3 {
        client.publish("held.x", n).unwrap();
    }
    assert_eq!(client.publish("held.x", 3), Err(Error::BufferFull));
    // Only publishes are held; other calls still fail fast.
    assert!(matches!(
        client.request("svc", 0, Duration::from_secs(1)),
        Err(Error::Reconnecting)
    ));

    broker.restart(&[]);
    await_event(&events, is_reconnected);
    // The subscription goes out before the held publishes, so the client
    // receives its own publishes back, in order.
    for n in 0..3 {
        assert_eq!(recv_data(&sub), json!(n));
    }
    client.ping().unwrap();
    assert_eq!(sub.try_recv(), Ok(None));
}

#[test]
fn an_acked_publish_held_while_down_gets_its_ack_after_reconnect() {
    let mut broker = Broker::start(&[]);
    let client = Client::connect_any_with(&[&broker.addr], resilient(1)).unwrap();
    let events = client.events();
    broker.kill();
    await_event(&events, is_disconnected);
    thread::scope(|scope| {
        let waiter = scope.spawn(|| client.publish_acked("anywhere", 1));
        broker.restart(&[]);
        let ack = waiter.join().unwrap().unwrap();
        assert_eq!(ack["ok"], json!(true));
    });
}

#[test]
fn a_call_in_flight_fails_with_disconnected() {
    let broker = Broker::start(&[]);
    let responder = Client::connect(&broker.addr).unwrap();
    let silent = responder.subscribe("svc.slow").unwrap();
    let client = Client::connect_any_with(&[&broker.addr], resilient(0)).unwrap();
    let mut broker = broker;
    thread::scope(|scope| {
        let started = Instant::now();
        let call = scope.spawn(|| client.request("svc.slow", 0, Duration::from_secs(30)));
        // The request reached the responder, so it is in flight.
        recv_data(&silent);
        broker.kill();
        assert_eq!(call.join().unwrap(), Err(Error::Disconnected));
        assert!(started.elapsed() < WAIT, "the call waited out its timeout");
    });
}

#[test]
fn the_first_live_address_of_the_list_is_used() {
    let broker = Broker::start(&[]);
    let dead = dead_addr();
    let client = Client::connect_any(&[dead.as_str(), broker.addr.as_str()]).unwrap();
    assert_eq!(client.url().as_deref(), Some(broker.addr.as_str()));
    let sub = client.subscribe("x").unwrap();
    client.publish_acked("x", "hi").unwrap();
    assert_eq!(recv_data(&sub), json!("hi"));
    // With no live address the last error comes back.
    let refused = Client::connect_any(&[dead.as_str(), dead.as_str()]).unwrap_err();
    assert!(matches!(refused, Error::Io(_)), "{refused:?}");
}

#[test]
fn a_reconnect_moves_on_to_the_next_address() {
    let mut first = Broker::start(&[]);
    let second = Broker::start(&[]);
    let urls = [first.addr.as_str(), second.addr.as_str()];
    let client = Client::connect_any_with(&urls, resilient(0)).unwrap();
    let events = client.events();
    let sub = client.queue_subscribe("work", "pool").unwrap();
    assert_eq!(client.url().as_deref(), Some(first.addr.as_str()));
    first.kill();
    let Event::Reconnected { url, .. } = await_event(&events, is_reconnected) else {
        unreachable!()
    };
    assert_eq!(url, second.addr);
    let publisher = Client::connect(&second.addr).unwrap();
    publisher.publish_acked("work", "moved").unwrap();
    assert_eq!(recv_data(&sub), json!("moved"));
}

#[test]
fn reconnecting_gives_up_after_max_attempts() {
    let mut broker = Broker::start(&[]);
    let opts = Options {
        reconnect: Some(Reconnect {
            max_attempts: Some(2),
            ..quick()
        }),
        ..Options::default()
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let events = client.events();
    let sub = client.subscribe("gone").unwrap();
    broker.kill();
    let Event::Closed { reason } = await_event(&events, |e| matches!(e, Event::Closed { .. }))
    else {
        unreachable!()
    };
    assert!(reason.contains("gave up after 2 attempts"), "{reason}");
    assert!(client.is_closed());
    assert_eq!(sub.recv_timeout(WAIT), Err(Error::Closed));
    assert_eq!(client.publish("gone", 0), Err(Error::Closed));
    assert_eq!(events.recv_timeout(WAIT), Err(Error::Closed));
}

#[test]
fn close_while_reconnecting_returns_promptly() {
    let mut broker = Broker::start(&[]);
    let opts = Options {
        reconnect: Some(Reconnect {
            initial: Duration::from_secs(60),
            max: Duration::from_secs(60),
            ..Reconnect::default()
        }),
        ..Options::default()
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let events = client.events();
    broker.kill();
    await_event(&events, is_disconnected);
    let started = Instant::now();
    client.close().unwrap();
    assert!(started.elapsed() < WAIT, "close waited out the backoff");
    assert!(matches!(
        await_event(&events, |e| matches!(e, Event::Closed { .. })),
        Event::Closed { reason } if reason == "closed by the client"
    ));
}

#[test]
fn a_full_subscription_queue_drops_its_oldest_messages() {
    let broker = Broker::start(&[]);
    let opts = Options {
        subscription_capacity: 4,
        ..Options::default()
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let sub = client.subscribe("burst").unwrap();
    for n in 0..10 {
        client.publish("burst", n).unwrap();
    }
    client.ping().unwrap();
    // Deliveries precede the ping's ack on the same connection.
    assert_eq!((sub.pending(), sub.dropped()), (4, 6));
    let kept: Vec<_> = (0..4).map(|_| recv_data(&sub)).collect();
    assert_eq!(kept, vec![json!(6), json!(7), json!(8), json!(9)]);
}

#[test]
fn a_clean_close_reports_only_closed() {
    let broker = Broker::start(&[]);
    let client = Client::connect_any(&[&broker.addr]).unwrap();
    let events = client.events();
    client.close().unwrap();
    assert_eq!(
        events.try_recv(),
        Ok(Some(Event::Closed {
            reason: "closed by the client".to_string()
        }))
    );
    assert_eq!(events.try_recv(), Err(Error::Closed));
}

/// Sends `signal` (e.g. `STOP`, `CONT`) to the process `pid` with kill(1).
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Resumes a stopped process even if the test fails half-way.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

#[test]
fn a_server_gone_silent_counts_as_gone() {
    // The server pings every 100 ms and allows 100 ms for the pong, so the
    // client may call it dead after 200 ms without a word.
    let broker = Broker::start(&["-ping-interval=100ms", "-ping-timeout=100ms"]);
    let opts = Options {
        timeout: Duration::from_secs(1),
        ..resilient(0)
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let events = client.events();
    let sub = client.subscribe("quiet").unwrap();
    // A stopped process keeps its sockets open but sends nothing.
    signal(broker.pid(), "STOP");
    let resume = Resume(broker.pid());
    let Event::Disconnected { reason, .. } = await_event(&events, is_disconnected) else {
        unreachable!()
    };
    assert!(reason.contains("heartbeat"), "{reason}");
    drop(resume);
    await_event(&events, is_reconnected);
    let publisher = Client::connect(&broker.addr).unwrap();
    publisher.publish_acked("quiet", "again").unwrap();
    assert_eq!(recv_data(&sub), json!("again"));
}

#[test]
fn a_subscription_queue_is_bounded_in_bytes_too() {
    let broker = Broker::start(&[]);
    let opts = Options {
        subscription_bytes_max: 1000,
        ..Options::default()
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let sub = client.subscribe("big").unwrap();
    let filler = "x".repeat(300);
    for n in 0..10 {
        client
            .publish("big", json!({ "n": n, "filler": filler }))
            .unwrap();
    }
    client.ping().unwrap();
    // About 340 bytes each on the wire: two fit in 1000 bytes, three do not.
    let kept = sub.pending();
    assert_eq!((kept, sub.dropped()), (2, 8));
    let first = sub.recv_timeout(WAIT).unwrap();
    assert_eq!(first.data["n"], json!(8));
    // A single message larger than the bound still gets through.
    let huge = "y".repeat(5000);
    client
        .publish("big", json!({ "n": 99, "filler": huge }))
        .unwrap();
    client.ping().unwrap();
    assert_eq!(sub.pending(), 1);
    assert_eq!(recv_data(&sub)["n"], json!(99));
}

#[test]
fn pipelined_acked_publishes_are_acked_in_order() {
    let broker = Broker::start(&[]);
    let client = Client::connect(&broker.addr).unwrap();
    client
        .stream_create(&StreamConfig::new("PIPE", &["pipe.>"]))
        .unwrap();
    let pending: Vec<_> = (0..1000)
        .map(|i| {
            let msg = OutMessage::new("pipe.a", Payload::Json(json!(i)));
            client.publish_async(&msg).unwrap()
        })
        .collect();
    let seqs: Vec<u64> = pending
        .into_iter()
        .map(|ack| {
            let ack = ack.wait().unwrap();
            assert_eq!(ack["stream"], json!("PIPE"), "{ack}");
            ack["seq"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(seqs, (1..=1000).collect::<Vec<u64>>());
    let state = client.stream_info("PIPE").unwrap().state;
    assert_eq!((state.messages, state.last_seq), (1000, 1000));
    // Message 500 is the 500th published.
    assert_eq!(client.stream_get("PIPE", 500).unwrap().data, json!(499));
}

#[test]
fn a_pending_ack_fails_with_disconnected_when_the_broker_dies() {
    let mut broker = Broker::start(&[]);
    let responder = Client::connect(&broker.addr).unwrap();
    let silent = responder.subscribe("svc.never").unwrap();
    let client = Client::connect_any_with(&[&broker.addr], resilient(0)).unwrap();
    let arg = json!({"subject": "svc.never", "data": 1, "timeout_ms": 30_000});
    let pending = client.call_async("request", arg).unwrap();
    // The request reached the responder, so its ack is outstanding.
    recv_data(&silent);
    let started = Instant::now();
    broker.kill();
    assert_eq!(pending.wait_timeout(WAIT), Err(Error::Disconnected));
    assert!(started.elapsed() < WAIT, "the wait ran out instead");
}

#[test]
fn a_full_window_of_async_acks_blocks_the_next_call_until_its_timeout() {
    let broker = Broker::start(&[]);
    let responder = Client::connect(&broker.addr).unwrap();
    let silent = responder.subscribe("svc.never").unwrap();
    let opts = Options {
        async_acks_max: 2,
        timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let client = Client::connect_with(&broker.addr, opts).unwrap();
    let request = || json!({"subject": "svc.never", "data": 1, "timeout_ms": 30_000});
    let first = client.call_async("request", request()).unwrap();
    let _second = client.call_async("request", request()).unwrap();
    let started = Instant::now();
    assert_eq!(
        client.call_async("request", request()).unwrap_err(),
        Error::Timeout
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Giving up on one frees its slot; a quick call then goes through.
    drop(first);
    let ping = client.call_async("ping", json!({})).unwrap();
    assert_eq!(ping.wait().unwrap()["ok"], json!(true));
    drop(silent);
}
