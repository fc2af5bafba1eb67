//! A key-value bucket: feature flags kept per site, read back, changed
//! with compare-and-set (a second writer with the same revision loses),
//! deleted, and watched from another connection.
//!
//! Run the broker in one terminal with `make run`, then in another:
//!
//! ```text
//! cargo run --example kv [ADDR]
//! ```
//!
//! The address comes from the first argument, else the `GOMBUS_ADDR`
//! environment variable, else `127.0.0.1:8080`. Running it twice is fine:
//! the bucket is created again with the same config, and the revisions go
//! on from where they were.

use std::time::Duration;

use gombus::client::{BucketConfig, Client, Error, KvWatchEvent, Payload, WatchFrom};
use serde_json::json;

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("GOMBUS_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let client = Client::connect(&addr)?;
    let mut cfg = BucketConfig::new("flags");
    cfg.history = Some(5);
    client.kv_create(&cfg)?;
    let flags = client.kv("flags");

    // Another connection watches every site's flags.
    let watcher = Client::connect(&addr)?;
    let watch = watcher
        .kv("flags")
        .watch(Some("site.*"), WatchFrom::UpdatesOnly)?;
    match watch.next_timeout(Duration::from_secs(5))? {
        KvWatchEvent::CaughtUp => println!("watching site.*"),
        other => println!("unexpected: {other:?}"),
    }

    let rev = flags.put("site.eu", json!({"dark_mode": true}))?;
    println!("site.eu is at revision {rev}");
    if let Some(e) = flags.get("site.eu")? {
        println!("site.eu = {:?} (revision {})", e.value, e.revision);
    }

    // Two writers read the same revision; only the first update wins.
    let first = flags.update("site.eu", json!({"dark_mode": false}), rev)?;
    println!("first writer: revision {first}");
    match flags.update("site.eu", json!({"dark_mode": true}), rev) {
        Err(Error::Server {
            code,
            revision: Some(latest),
            ..
        }) => println!("second writer: {code}, the key is at {latest}"),
        other => println!("second writer: {other:?}"),
    }

    flags.delete("site.eu", None)?;
    println!("site.eu after delete: {:?}", flags.get("site.eu")?);
    println!("history of site.eu:");
    for e in flags.history("site.eu")? {
        let value = match e.value {
            Some(Payload::Json(v)) => v.to_string(),
            Some(Payload::Bytes(b)) => format!("{} bytes", b.len()),
            None => "-".to_string(),
        };
        println!("  {:>4} {:<6} {value}", e.revision, e.op);
    }

    // The watcher saw each write, in order.
    for _ in 0..3 {
        if let KvWatchEvent::Entry(e) = watch.next_timeout(Duration::from_secs(5))? {
            println!("watch: {} {} at {}", e.key, e.op, e.revision);
        }
    }
    watch.stop()?;
    Ok(())
}
