//! Fetch + ack throughput of a pull consumer: fills a stream with N
//! messages, then a consumer fetches them in batches and acks every one
//! (explicit acks, pipelined: each batch's acks are sent without waiting,
//! the last with an ack id, whose answer says every earlier one of the
//! connection was handled and written). Prints one JSON line.
//!
//! ```text
//! cargo run --release --example stream_bench -- ADDR [MSGS] [BATCH] [SIZE]
//! ```
//!
//! Defaults: 100 000 messages, batches of 500, 128-byte payloads.
//! `scripts/stream-bench.sh` runs it against `bin/broker` under
//! `-sync=always` and `-sync=100ms` (`make bench` does too).

use std::time::{Duration, Instant};

use gombus::client::{Client, ConsumerConfig, Error, StreamConfig};
use serde_json::json;

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let msgs = arg(2, 100_000);
    let batch = arg(3, 500);
    let size = arg(4, 128) as usize;
    let c = Client::connect(&addr)?;
    let name = format!("FETCHBENCH{}", std::process::id());
    c.stream_create(&StreamConfig::new(&name, &[&format!("{name}.x")]))?;
    let subject = format!("{name}.x");
    let payload = "x".repeat(size.saturating_sub(2));

    // Fill: fire-and-forget publishes (stored all the same), then one acked
    // publish: its ack comes once everything before it is written.
    let t0 = Instant::now();
    for _ in 1..msgs {
        c.publish(&subject, &payload)?;
    }
    let last = c.publish_stream(&subject, &payload)?;
    let fill_s = t0.elapsed().as_secs_f64();
    assert_eq!(last.seq, msgs, "every publish stored");

    let mut cfg = ConsumerConfig::new("bench");
    cfg.max_ack_pending = Some(batch.max(1) * 2);
    c.consumer_create(&name, &cfg)?;
    let t1 = Instant::now();
    let mut done = 0u64;
    let mut expect = 1u64;
    while done < msgs {
        let got = c.fetch(&name, "bench", batch, Some(Duration::from_secs(5)))?;
        if got.is_empty() {
            return Err(Error::Protocol(format!(
                "fetch came back empty after {done}"
            )));
        }
        let (last, rest) = got.split_last().expect("non-empty");
        for m in rest {
            assert_eq!(m.seq, expect, "in order, no redelivery");
            expect += 1;
            c.emit(
                "ack",
                json!({"stream": name, "consumer": "bench", "seq": m.seq}),
            )?;
        }
        assert_eq!(last.seq, expect);
        expect += 1;
        c.ack(&name, "bench", last.seq)?;
        done += got.len() as u64;
    }
    let fetch_s = t1.elapsed().as_secs_f64();
    let info = c.consumer_info(&name, "bench")?;
    assert_eq!(info.ack_floor.stream_seq, msgs, "every message acked");
    c.stream_delete(&name)?;
    println!(
        "{}",
        json!({
            "workload": "fetch_ack",
            "msgs": msgs,
            "batch": batch,
            "size": size,
            "fill_msgs_per_s": (msgs as f64 / fill_s).round(),
            "fetch_ack_msgs_per_s": (msgs as f64 / fetch_s).round(),
            "elapsed_s": (fetch_s * 1000.0).round() / 1000.0,
        })
    );
    Ok(())
}
