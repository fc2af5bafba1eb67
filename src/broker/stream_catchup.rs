//! Catching a replica of a replicated stream up by ranges of messages,
//! and the small snapshots that make it possible.
//!
//! A stream group's snapshot is the stream's state without its messages
//! (`Replica::freeze`: config, counts, the live seqs as ranges, a digest,
//! the `Msg-Id` window, the consumers); the messages stay in each
//! member's payload files, fsynced before the snapshot is stored. So a
//! member that falls behind the leader's log start, or lost or damaged
//! files, is sent a small snapshot and fetches only what it lacks:
//!
//! - its Raft thread holds the arrived snapshot back from the core and
//!   tells the broker (`GroupEvent::Arrived`); the replica takes the
//!   snapshot's state, keeps the messages it names that are here and
//!   drops the others ([`Replica::rebase`], or `Replica::restore_files`
//!   for a replica that has not opened its files yet);
//! - it asks the group's leader, over the peer link's `/control`, for
//!   the records after the last one it holds (`cluster.catchup`: group,
//!   snapshot index, `after`, at most [`CATCHUP_BATCH_BYTES`]), one call
//!   at a time, so at most one batch per catch-up is in flight. The
//!   leader reads them from the state it froze for that snapshot (its
//!   payload files held open), so compacting again meanwhile changes
//!   nothing for this catch-up; a leader without that state (it
//!   restarted, or leads since) takes a new snapshot, which the core
//!   sends in turn: the member keeps what it fetched and goes on. Both
//!   ends' bookkeeping is `stream/catchup.rs`'s (the stream simulation
//!   runs it too); this file carries it over the links;
//! - once it holds exactly what the snapshot names (count, bytes and
//!   digest agree) it fsyncs its files and lets the core take the
//!   snapshot ([`ToRaft::GroupInstall`]). If what it holds disagrees it
//!   starts over empty. Until then the core stays behind the leader's
//!   log, so the member neither applies entries nor can win an election.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::cluster::actions::{Action, SnapshotJob};
use super::session::NSP_CONTROL;
use super::Broker;
use crate::cluster::api::snapshot_file::{self, FileRef};
use crate::cluster::api::{GroupId, ToRaft};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};
use crate::stream::catchup::{Answer, CatchUp, Next, Pace, Served};
use crate::stream::replica::{Replica, SMALL_VERSION};

/// Most record bytes one `cluster.catchup` answer carries (at least one
/// record): under the peer's `maxPayload`, which is `-max-payload` plus
/// 64 KiB or more.
pub const CATCHUP_BATCH_BYTES: usize = 512 << 10;
/// How long a `cluster.catchup` call may take before it is asked again.
const CATCHUP_CALL_WAIT: Duration = Duration::from_secs(5);
/// The member's and the leader's waits: a call asked again after
/// [`CATCHUP_CALL_WAIT`], 500 ms after a refusal, and a snapshot taken
/// unasked for members catching up at most every 2 s.
const PACE: Pace = Pace {
    call_wait: CATCHUP_CALL_WAIT,
    retry: Duration::from_millis(500),
    forced_every: Duration::from_secs(2),
};

impl Broker {
    /// A small snapshot of group `group` at `index` arrived whole (`data`
    /// names `file`): the replica takes its state and starts fetching
    /// what it lacks. Anything else goes to the core at once.
    pub(super) fn snapshot_arrived(
        &mut self,
        group: GroupId,
        index: u64,
        data: &[u8],
        file: Option<File>,
        now: Instant,
    ) {
        let Some(c) = self.cluster.as_ref().filter(|c| c.running()) else {
            return;
        };
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let install_now = |h: &mut super::stream_groups::Held| {
            h.catchup = None;
            h.lost = false;
            h.installed = None;
            c.act(Action::Raft(ToRaft::GroupInstall { group, index }));
        };
        let (Some(r), Some(f)) = (FileRef::decode(data), file) else {
            install_now(h);
            return;
        };
        let mut version = [0u8; 1];
        if f.read_exact_at(&mut version, 0).is_err() || version[0] != SMALL_VERSION {
            // A full snapshot: restored whole when the core takes it.
            install_now(h);
            return;
        }
        let mut read = snapshot_file::Checked::new(std::io::BufReader::new(f), &r);
        let taken = match &h.store {
            Some((dir, segment_bytes, log)) if !h.opened => {
                Replica::restore_files(&mut read, r.size, now, dir, *segment_bytes, log.as_deref())
                    .map(|(rep, target)| {
                        h.core.replica = rep;
                        h.opened = true;
                        target
                    })
            }
            _ => h.core.replica.rebase(&mut read, r.size, now),
        };
        match taken {
            Ok(target) => {
                crate::log_info!(
                    "stream {:?}: catching up to its snapshot at {index}: holds {} of {} messages",
                    h.name,
                    h.core.replica.messages(),
                    target.count
                );
                h.lost = false;
                // `installed` stays: an install handed to the core before
                // this snapshot arrived may still come back as a restore,
                // which the replica, now ahead of it, ignores.
                h.catchup = Some(CatchUp::new(index, target, now));
                self.catch_up(group, now);
            }
            Err(e) => crate::log_error!(
                "stream {:?}: installing the snapshot at {index}: {e}",
                h.name
            ),
        }
    }

    /// Every turn: each catching-up replica asks for its next batch, or,
    /// once whole, hands its snapshot to the core.
    pub(super) fn catch_up_all(&mut self, now: Instant) {
        let groups: Vec<GroupId> = (self.stream_groups.held.iter())
            .filter(|(_, h)| h.catchup.is_some())
            .map(|(&g, _)| g)
            .collect();
        for g in groups {
            self.catch_up(g, now);
        }
    }

    fn catch_up(&mut self, group: GroupId, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let me = c.me();
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let Some(cu) = h.catchup.as_mut() else {
            return;
        };
        let leads = h.core.leads();
        let next = match cu.next(&mut h.core.replica, leads, now, &PACE) {
            Ok(n) => n,
            Err(e) => {
                crate::log_error!("stream {:?}: syncing its files: {e}", h.name);
                return;
            }
        };
        match next {
            Next::Lost => {
                // A leader fed the core entries past the snapshot (its
                // log covers it), and this member now leads or they are
                // too many to wait in the core's log: they were not
                // applied, so the replica starts again from a fresh
                // snapshot.
                crate::log_warn!(
                    "stream {:?}: entries past its snapshot at {} came during its catch-up; \
                     fetching again",
                    h.name,
                    cu.index
                );
                h.catchup = None;
                h.lost = true;
                c.act(Action::Raft(ToRaft::GroupLost { group }));
            }
            Next::StartedOver => crate::log_warn!(
                "stream {:?}: its messages disagree with the snapshot at {}; starting over",
                h.name,
                cu.index
            ),
            Next::Whole { index, replay } => {
                crate::log_info!(
                    "stream {:?}: caught up to its snapshot at {index}: {} bytes fetched in {} ms",
                    h.name,
                    cu.received,
                    now.saturating_duration_since(cu.since).as_millis()
                );
                h.catchup = None;
                // With `replay`, the Raft thread hands over again the
                // entries its core applied past `index` meanwhile.
                h.core.made_whole(index, replay);
                h.installed = Some(index);
                c.act(Action::Raft(ToRaft::GroupInstall { group, index }));
            }
            Next::Ask { index, after } => {
                let Some(leader) = h.core.leader().filter(|&l| l != me) else {
                    return;
                };
                let args = json!({
                    "group": group,
                    "index": index,
                    "after": after,
                    "max": CATCHUP_BATCH_BYTES,
                })
                .to_string();
                let tag = c.call_node(
                    leader,
                    super::cluster::Tag::Catchup,
                    "cluster.catchup",
                    args,
                    Vec::new(),
                    CATCHUP_CALL_WAIT,
                    false,
                );
                cu.asked(tag, now, &PACE);
            }
            Next::Wait => {}
        }
    }

    /// The leader's answer to a `cluster.catchup` call.
    pub(crate) fn catchup_answered(
        &mut self,
        now: Instant,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), crate::cluster::api::CallError>,
    ) {
        let found = (self.stream_groups.held.iter_mut())
            .find(|(_, h)| h.catchup.as_ref().is_some_and(|c| c.waits_on(tag)));
        let Some((&group, h)) = found else {
            return;
        };
        let Some(cu) = h.catchup.as_mut() else {
            return;
        };
        let (text, attachments) = match result {
            Ok(r) => r,
            Err(e) => {
                crate::log_warn!("stream {:?}: catching up: {}", h.name, e.message);
                (String::new(), Vec::new())
            }
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let first = attachments.first().map_or(&[][..], Vec::as_slice);
        let answer = match v.get("index").and_then(Value::as_u64) {
            Some(index) if v.get("ok") == Some(&Value::Bool(true)) => {
                if v.get("snapshot") == Some(&Value::Bool(true)) {
                    Answer::Newer {
                        index,
                        small: first,
                    }
                } else {
                    Answer::Records { index, recs: first }
                }
            }
            _ => Answer::Refused,
        };
        if let Err(e) = cu.answered(&mut h.core.replica, tag, answer, now, &PACE) {
            crate::log_warn!("stream {:?}: catching up: {e}; starting over", h.name);
        }
        self.catch_up(group, now);
    }

    /// `cluster.catchup` from a member catching up: the records after
    /// `after` of the state this node froze for its snapshot at `index`,
    /// as one attachment, answered here. Without that state it takes a
    /// new snapshot (which the group's core then sends) and answers
    /// `unavailable`.
    pub(crate) fn cluster_catchup(
        &mut self,
        sink: &mut dyn Sink,
        conn: ConnId,
        ack_id: Option<u64>,
        arg: Option<&RawValue>,
    ) -> Result<Option<String>, ApiError> {
        let bad = |what: &str| ApiError::new(Code::BadRequest, what);
        let v: Value = arg
            .and_then(|a| serde_json::from_str(a.get()).ok())
            .ok_or_else(|| bad("cluster.catchup takes {group, index, after, max}"))?;
        let num = |k: &str| v.get(k).and_then(Value::as_u64);
        let (Some(group), Some(index), Some(after)) = (num("group"), num("index"), num("after"))
        else {
            return Err(bad("cluster.catchup takes {group, index, after, max}"));
        };
        // Clamped as a u64: a `usize` cast first would wrap on 32-bit hosts.
        let max = num("max").map_or(CATCHUP_BATCH_BYTES, |m| {
            m.clamp(1, CATCHUP_BATCH_BYTES as u64) as usize
        });
        let now = sink.now();
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return Err(ApiError::new(Code::NotFound, "no such stream group here"));
        };
        let served = h
            .sources
            .serve(index, after, max, h.core.applied, now, &PACE)
            .map_err(|e| {
                ApiError::new(Code::Internal, format!("reading the stream's files: {e}"))
            })?;
        let body = match served {
            Served::Records(recs, through) => (
                format!(
                    r#"[{{"ok":true,"index":{index},"through":{through},"records":{{"_placeholder":true,"num":0}}}}]"#
                ),
                recs,
            ),
            Served::Gone {
                snapshot_now,
                newer,
            } => {
                if snapshot_now {
                    self.snapshot_now(group);
                }
                let Some((at, small)) = newer else {
                    return Err(ApiError::new(
                        Code::Unavailable,
                        "this node no longer holds that snapshot's state; a newer snapshot follows",
                    ));
                };
                // A later state this node holds: a member whose core is
                // past the snapshot it asked for goes on from it.
                (
                    format!(
                        r#"[{{"ok":true,"index":{at},"snapshot":true,"records":{{"_placeholder":true,"num":0}}}}]"#
                    ),
                    small,
                )
            }
        };
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let (body, recs) = body;
        let head = &mut self.stream_groups.head;
        super::ack::send_ack_with(
            sink,
            head,
            NSP_CONTROL,
            conn,
            ack_id,
            body.as_bytes(),
            &[recs],
        );
        Ok(None)
    }

    /// Takes a snapshot of group `group`'s replica at the index it has
    /// applied: with a durable log, a small one written to a file on a
    /// thread of its own (its state kept to serve members catching up
    /// from it); else the whole state as bytes.
    pub(super) fn snapshot_now(&mut self, group: GroupId) {
        let Some(c) = self.cluster.as_ref().filter(|c| c.running()) else {
            return;
        };
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let index = h.core.applied;
        let compact = |data: Vec<u8>| {
            c.act(Action::Raft(ToRaft::GroupCompact {
                group,
                index,
                data,
                dead: Vec::new(),
            }));
        };
        // A state frozen at this index already has its snapshot written,
        // or on its way (Raft asking while a member's catch-up forced
        // one, or the reverse).
        if h.lost || h.catchup.is_some() || index == 0 || h.sources.at(index).is_some() {
            compact(Vec::new());
            return;
        }
        match c.group_dir(group) {
            Some(dir) => match h.core.replica.freeze() {
                Ok(mut frozen) => {
                    let dead = frozen.take_dead();
                    let frozen = std::sync::Arc::new(frozen);
                    h.sources.keep(index, frozen.clone());
                    c.act(Action::Snapshot(SnapshotJob {
                        group,
                        index,
                        dir,
                        frozen,
                        dead,
                        name: h.name.clone(),
                    }));
                }
                Err(e) => {
                    crate::log_error!("stream {:?}: freezing its state at {index}: {e}", h.name);
                    compact(Vec::new());
                }
            },
            None => {
                h.core.replica.delete_dead();
                let data = h.core.replica.snapshot().unwrap_or_else(|e| {
                    crate::log_error!(
                        "stream {:?}: its snapshot in memory at {index}: {e}",
                        h.name
                    );
                    Vec::new()
                });
                compact(data);
            }
        }
    }
}
