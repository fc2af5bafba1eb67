//! A subscriber that outlives its broker: it keeps a list of addresses,
//! reconnects after a crash or restart, and its subscription keeps
//! receiving without being made again.
//!
//! Run a broker with `make run`, then in another terminal:
//!
//! ```text
//! cargo run --example reconnect [ADDR...]
//! ```
//!
//! Stop and restart the broker while it runs: the example prints the
//! disconnect and the reconnect, then goes on receiving its own ticks.
//! Addresses come from the arguments, else `GOMBUS_ADDR`, else
//! `127.0.0.1:8080`.

use std::time::Duration;

use gombus::client::{Client, Error, Event, Options, Reconnect};
use serde_json::json;

fn main() -> Result<(), Error> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls.push(std::env::var("GOMBUS_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_string()));
    }
    let opts = Options {
        reconnect: Some(Reconnect::default()), // 50 ms doubling to 2 s, jitter, forever
        publish_buffer: 100,                   // hold up to 100 publishes while down
        ..Options::default()
    };
    let client = Client::connect_any_with(&urls, opts)?;
    let events = client.events();
    let sub = client.subscribe("ticks")?;

    // One tick every 100 ms for a minute.
    for n in 0..600 {
        std::thread::sleep(Duration::from_millis(100));
        match client.publish("ticks", json!({ "n": n })) {
            Ok(()) => {}
            Err(Error::BufferFull) => println!("tick {n} not sent: buffer full"),
            Err(e) => return Err(e),
        }
        while let Some(event) = events.try_recv()? {
            match event {
                Event::Disconnected { url, reason } => println!("lost {url}: {reason}"),
                Event::Reconnected { url, attempts } => {
                    println!("back on {url} after {attempts} attempt(s)")
                }
                other => println!("{other:?}"),
            }
        }
        match sub.recv_timeout(Duration::from_millis(500)) {
            Ok(msg) => println!("{} {}", msg.subject, msg.data),
            Err(Error::Timeout) => println!("(no tick: reconnecting)"),
            Err(e) => return Err(e),
        }
    }
    client.close()
}
