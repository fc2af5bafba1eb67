//! A queue group: two members share one subject and each message goes to
//! exactly one of them.
//!
//! Run the broker in one terminal with `make run`, then in another:
//!
//! ```text
//! cargo run --example queue_group [ADDR]
//! ```
//!
//! The address comes from the first argument, else the `GOMBUS_ADDR`
//! environment variable, else `127.0.0.1:8080`.

use std::time::Duration;

use gombus::client::{Client, Error, Subscription};
use serde_json::json;

const MESSAGES: u64 = 10;

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("GOMBUS_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let worker_a = Client::connect(&addr)?;
    let worker_b = Client::connect(&addr)?;
    let publisher = Client::connect(&addr)?;

    let a = worker_a.queue_subscribe("jobs.resize", "resizers")?;
    let b = worker_b.queue_subscribe("jobs.resize", "resizers")?;
    for n in 0..MESSAGES {
        publisher.publish("jobs.resize", json!({ "job": n }))?;
    }
    // The barrier makes sure the broker routed every publish.
    publisher.ping()?;

    let mut got = 0;
    while got < MESSAGES {
        got += drain("worker a", &a)? + drain("worker b", &b)?;
    }
    println!("{got} messages, each delivered to one worker");
    publisher.close()?;
    worker_a.close()?;
    worker_b.close()
}

/// Prints what `sub` has, waiting briefly for the first message.
fn drain(name: &str, sub: &Subscription) -> Result<u64, Error> {
    let mut count = 0;
    let mut wait = Duration::from_millis(200);
    loop {
        match sub.recv_timeout(wait) {
            Ok(msg) => {
                println!("{name} got {}", msg.data);
                count += 1;
                wait = Duration::ZERO;
            }
            Err(Error::Timeout) => return Ok(count),
            Err(e) => return Err(e),
        }
    }
}
