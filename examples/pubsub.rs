//! Publish/subscribe with the gombus client.
//!
//! Run the broker in one terminal with `make run`, then in another:
//!
//! ```text
//! cargo run --example pubsub [ADDR]
//! ```
//!
//! The address comes from the first argument, else the `GOMBUS_ADDR`
//! environment variable, else `127.0.0.1:8080`.

use std::time::Duration;

use gombus::client::{Client, Error};
use serde_json::json;

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("GOMBUS_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let subscriber = Client::connect(&addr)?;
    let publisher = Client::connect(&addr)?;

    // `*` matches one token: greetings.en and greetings.fr, not greetings.
    let sub = subscriber.subscribe("greetings.*")?;
    for (lang, text) in [("en", "hello"), ("fr", "bonjour"), ("de", "hallo")] {
        publisher.publish(&format!("greetings.{lang}"), json!({ "text": text }))?;
    }
    // Acked publish: returns once the broker has routed the message.
    let ack = publisher.publish_acked("greetings.it", json!({ "text": "ciao" }))?;
    println!("acked publish: {ack}");

    for _ in 0..4 {
        let msg = sub.recv_timeout(Duration::from_secs(2))?;
        println!("{} -> {}", msg.subject, msg.data);
    }
    sub.unsubscribe()?;
    publisher.close()?;
    subscriber.close()
}
