//! Streams in-process: a captured publish is acked only once what it
//! confirms is on disk. Under `-sync=always` the ack waits for the event
//! that reports the fsync round covering it (the fsync thread wakes the
//! loop, the loop calls `woken`); under an interval policy it goes out in
//! the turn that wrote it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{config, msg, Core};
use crate::broker::Broker;
use crate::port::Handler;
use crate::storage::sync::SyncPolicy;

/// A fresh data directory, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn new(tag: &str) -> DataDir {
        let dir = std::env::temp_dir().join(format!(
            "gombus-core-{tag}-{}-{:x}",
            std::process::id(),
            crate::rand::random_seed()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        DataDir(dir)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A core with streams under `dir` and the given policy, attached to a
/// poller of its own whose waker the fsync thread calls (no sockets).
fn core_with_streams(dir: &DataDir, policy: SyncPolicy) -> (Core, mio::Poll) {
    let poll = mio::Poll::new().unwrap();
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
    let mut broker = Broker::new(config());
    broker.open_streams(&dir.0, policy, 1 << 20).unwrap();
    broker.attach(waker).unwrap();
    (Core::with(broker), poll)
}

/// Waits (bounded) for the next wake-up of `poll`; false on timeout.
fn wait_wake(poll: &mut mio::Poll, within: Duration) -> bool {
    let mut events = mio::Events::with_capacity(4);
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match poll.poll(&mut events, Some(left)) {
            Ok(()) if !events.is_empty() => return true,
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("poll: {e}"),
        }
    }
}

/// Creates stream `ORDERS` on `orders.>` from `conn`.
fn create_stream(core: &mut Core, conn: usize) {
    core.text(
        conn,
        r#"21["stream.create",{"name":"ORDERS","subjects":["orders.>"]}]"#,
    );
    let got = core.sent(conn);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with(r#"31[{"ok":true"#), "{got:?}");
    core.tick();
}

#[test]
fn under_sync_always_a_publish_is_acked_only_after_its_fsync_is_reported() {
    let dir = DataDir::new("always");
    let (mut core, mut poll) = core_with_streams(&dir, SyncPolicy::Always);
    core.join(1);
    core.join(2);
    create_stream(&mut core, 1);
    core.sub(2, "s", "orders.*", None);

    core.text(1, r#"22["pub",{"subject":"orders.new","data":{"id":1}}]"#);
    // Core subscribers get it at once; the publisher's ack is held.
    assert_eq!(core.sent(2), [msg("s", "orders.new", r#"{"id":1}"#)]);
    core.assert_quiet();
    // The turn's end writes it; the ack still waits for the fsync.
    core.tick();
    core.assert_quiet();
    // Until the fsync thread's report arrives and is taken in, nothing
    // releases it, however long the wait.
    core.advance(Duration::from_secs(10));
    core.tick();
    core.assert_quiet();

    let deadline = Instant::now() + Duration::from_secs(10);
    let acks = loop {
        assert!(Instant::now() < deadline, "no fsync report within 10 s");
        if wait_wake(&mut poll, Duration::from_secs(1)) {
            core.woken();
        }
        let acks = core.sent(1);
        if !acks.is_empty() {
            break acks;
        }
    };
    assert_eq!(acks, [r#"32[{"ok":true,"stream":"ORDERS","seq":1}]"#]);
    core.assert_quiet();
    let stored = std::fs::read_dir(dir.0.join("streams/ORDERS"))
        .unwrap()
        .count();
    assert!(stored > 0, "the stream has files on disk");
}

#[test]
fn under_an_interval_policy_the_ack_follows_the_write() {
    let dir = DataDir::new("interval");
    let (mut core, _poll) = core_with_streams(&dir, SyncPolicy::Every(Duration::from_secs(60)));
    core.join(1);
    create_stream(&mut core, 1);
    core.text(1, r#"23["pub",{"subject":"orders.new","data":2}]"#);
    core.assert_quiet();
    core.tick();
    assert_eq!(
        core.sent(1),
        [r#"33[{"ok":true,"stream":"ORDERS","seq":1}]"#]
    );
    core.assert_quiet();
}
