//! A stream and its consumers: messages on `orders.>` are stored, a pull
//! consumer fetches and acks them (one is nak'ed and comes back), and a
//! push consumer delivers the same messages to a subscription.
//!
//! Run the broker in one terminal with `make run`, then in another:
//!
//! ```text
//! cargo run --example stream_consumer [ADDR]
//! ```
//!
//! The address comes from the first argument, else the `GOMBUS_ADDR`
//! environment variable, else `127.0.0.1:8080`. Running it twice is fine:
//! the stream and consumers are created again with the same config.

use std::time::Duration;

use gombus::client::{Client, ConsumerConfig, Error, StreamConfig};
use serde_json::json;

const STREAM: &str = "ORDERS";

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("GOMBUS_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let client = Client::connect(&addr)?;

    let mut cfg = StreamConfig::new(STREAM, &["orders.>"]);
    cfg.max_msgs = Some(10_000);
    let info = client.stream_create(&cfg)?;
    println!("stream {STREAM}: {:?}", info.state);

    for n in 1..=3 {
        let ack = client.publish_stream("orders.eu", json!({ "order": n }))?;
        println!("stored order {n} as seq {}", ack.seq);
    }

    // A pull consumer that starts with the messages published from now on
    // would miss the three above; this one starts at the beginning.
    let mut pull = ConsumerConfig::new("billing");
    pull.filter_subject = Some("orders.eu".into());
    pull.ack_wait_ms = Some(5_000);
    client.consumer_create(STREAM, &pull)?;
    let batch = client.fetch(STREAM, "billing", 10, Some(Duration::from_secs(1)))?;
    for m in &batch {
        println!(
            "billing got seq {} {} (delivery {:?})",
            m.seq, m.data, m.delivered
        );
    }
    // Ack all but the first, which is nak'ed and delivered again at once.
    if let Some((first, rest)) = batch.split_first() {
        client.nak(STREAM, "billing", first.seq, Duration::ZERO)?;
        for m in rest {
            client.ack(STREAM, "billing", m.seq)?;
        }
        for m in client.fetch(STREAM, "billing", 10, Some(Duration::from_secs(1)))? {
            println!(
                "billing got seq {} again (delivery {:?})",
                m.seq, m.delivered
            );
            client.ack(STREAM, "billing", m.seq)?;
        }
    }
    let c = client.consumer_info(STREAM, "billing")?;
    println!(
        "billing: ack floor {}, {} pending, {} awaiting ack",
        c.ack_floor.stream_seq, c.num_pending, c.num_ack_pending
    );

    // A push consumer delivers to whoever subscribes to its subject.
    let sub = client.subscribe("deliver.audit")?;
    let mut push = ConsumerConfig::new("audit");
    push.deliver_subject = Some("deliver.audit".into());
    push.deliver_policy = Some("last".into());
    client.consumer_create(STREAM, &push)?;
    let m = sub.recv_timeout(Duration::from_secs(5))?;
    if let Some(d) = &m.stream {
        println!("audit pushed seq {} {} on {}", d.seq, m.data, m.subject);
        client.ack(STREAM, "audit", d.seq)?;
    }
    Ok(())
}
