//! Request/reply: a responder thread answers requests on `math.double`, and
//! the main thread sends requests and prints the replies.
//!
//! Run the broker in one terminal with `make run`, then in another:
//!
//! ```text
//! cargo run --example request_reply [ADDR]
//! ```
//!
//! The address comes from the first argument, else the `GOMBUS_ADDR`
//! environment variable, else `127.0.0.1:8080`.

use std::thread;
use std::time::Duration;

use gombus::client::{Client, Error, Subscription};
use serde_json::json;

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("GOMBUS_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let responder = Client::connect(&addr)?;
    // Subscribe before the first request so it finds a responder.
    let requests = responder.subscribe("math.double")?;
    let requester = Client::connect(&addr)?;

    // A Client is Sync: the responder thread borrows it.
    thread::scope(|scope| {
        let worker = scope.spawn(|| serve(&responder, requests));
        let asked = ask(&requester);
        // A message without a reply subject tells the responder to stop.
        let stopped = requester.publish("math.double", json!({ "stop": true }));
        let served = worker
            .join()
            .unwrap_or_else(|_| Err(Error::Protocol("responder panicked".into())));
        asked.and(stopped).and(served)
    })?;
    requester.close()?;
    responder.close()
}

/// Answers each request with twice its `n` until a stop message arrives.
fn serve(client: &Client, requests: Subscription) -> Result<(), Error> {
    for msg in requests.iter() {
        let Some(reply) = msg.reply.as_deref() else {
            break;
        };
        let n = msg.data.get("n").and_then(|v| v.as_i64()).unwrap_or(0);
        client.publish(reply, json!({ "result": n * 2 }))?;
    }
    requests.unsubscribe()
}

fn ask(client: &Client) -> Result<(), Error> {
    for n in 1..=5 {
        let reply = client.request("math.double", json!({ "n": n }), Duration::from_secs(2))?;
        println!("double({n}) = {}", reply.data["result"]);
    }
    match client.request("math.nobody", json!({}), Duration::from_secs(1)) {
        Err(e) if e.code() == Some("no_responders") => println!("math.nobody: no responders"),
        other => println!("math.nobody: unexpected {other:?}"),
    }
    Ok(())
}
