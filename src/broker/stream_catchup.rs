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
//!   tells the broker ([`GroupEvent::Arrived`]); the replica takes the
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
//!   sends in turn: the member keeps what it fetched and goes on;
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

use super::session::NSP_CONTROL;
use super::stream_groups::FROZEN_KEPT;
use super::Broker;
use crate::cluster::node::ToRaft;
use crate::cluster::raft_msg::GroupId;
use crate::cluster::snapshot_file::{self, FileRef};
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};
use crate::stream::replica::{Replica, Target, SMALL_VERSION};

/// Most record bytes one `cluster.catchup` answer carries (at least one
/// record): under the peer's `maxPayload`, which is `-max-payload` plus
/// 64 KiB or more.
pub const CATCHUP_BATCH_BYTES: usize = 512 << 10;
/// How long a `cluster.catchup` call may take before it is asked again.
const CATCHUP_CALL_WAIT: Duration = Duration::from_secs(5);
/// How long a member waits to ask again after a refusal.
const CATCHUP_RETRY: Duration = Duration::from_millis(500);
/// How often a node takes a snapshot unasked for members catching up.
const FORCED_SNAPSHOT_EVERY: Duration = Duration::from_secs(2);

/// A replica fetching what a snapshot names from the group's leader.
#[derive(Debug)]
pub(crate) struct CatchUp {
    /// The snapshot's index: the Raft core takes it once the replica is
    /// whole.
    index: u64,
    target: Target,
    /// The call in flight (its tag) and when it was made.
    asked: Option<(u64, Instant)>,
    /// Not asked again before then.
    retry_at: Option<Instant>,
    since: Instant,
    /// Record bytes received.
    received: u64,
    /// The last entry the core committed meanwhile (it is skipped): past
    /// `index`, the snapshot no longer covers what the core applied.
    skipped_through: u64,
}

impl CatchUp {
    /// The core committed the entry at `index` during the catch-up.
    pub(crate) fn skipped(&mut self, index: u64) {
        self.skipped_through = self.skipped_through.max(index);
    }
}

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
        let Some(raft) = self.cluster.as_ref().and_then(|c| c.raft_node()) else {
            return;
        };
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let install_now = |h: &mut super::stream_groups::Held| {
            h.catchup = None;
            h.lost = false;
            h.installed = None;
            raft.send(ToRaft::GroupInstall { group, index });
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
            Some((dir, segment_bytes)) if !h.opened => {
                Replica::restore_files(&mut read, r.size, now, dir, *segment_bytes).map(
                    |(rep, target)| {
                        h.core.replica = rep;
                        h.opened = true;
                        target
                    },
                )
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
                h.installed = None;
                h.catchup = Some(CatchUp {
                    index,
                    target,
                    asked: None,
                    retry_at: None,
                    since: now,
                    received: 0,
                    skipped_through: 0,
                });
                self.catch_up(group, now);
            }
            Err(e) => crate::log_error!("stream {:?}: snapshot at {index}: {e}", h.name),
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
        if cu.skipped_through > cu.index {
            // A leader fed the core entries past the snapshot (it holds
            // a longer log than the one that sent it): they were not
            // applied, so the replica starts again from a fresh snapshot.
            crate::log_warn!(
                "stream {:?}: entries past its snapshot at {} came during its catch-up; \
                 fetching again",
                h.name,
                cu.index
            );
            h.catchup = None;
            h.lost = true;
            if let Some(raft) = c.raft_node() {
                raft.send(ToRaft::GroupLost { group });
            }
            return;
        }
        let held = h.core.replica.held_through();
        if !cu.target.wants_after(held) {
            if !h.core.replica.is_whole(&cu.target) {
                crate::log_warn!(
                    "stream {:?}: its messages disagree with the snapshot at {}; starting over",
                    h.name,
                    cu.index
                );
                h.core.replica.start_over();
                return;
            }
            if let Err(e) = h.core.replica.sync() {
                crate::log_error!("stream {:?}: syncing its files: {e}", h.name);
                return;
            }
            let index = cu.index;
            crate::log_info!(
                "stream {:?}: caught up to its snapshot at {index}: {} bytes fetched in {} ms",
                h.name,
                cu.received,
                now.saturating_duration_since(cu.since).as_millis()
            );
            h.catchup = None;
            h.core.applied = index;
            h.installed = Some(index);
            if let Some(raft) = c.raft_node() {
                raft.send(ToRaft::GroupInstall { group, index });
            }
            return;
        }
        let waiting = cu
            .asked
            .is_some_and(|(_, at)| now.saturating_duration_since(at) < CATCHUP_CALL_WAIT);
        if waiting || cu.retry_at.is_some_and(|t| now < t) {
            return;
        }
        let Some(leader) = h.core.leader().filter(|&l| l != me) else {
            return;
        };
        let args = json!({
            "group": group,
            "index": cu.index,
            "after": held,
            "max": CATCHUP_BATCH_BYTES,
        })
        .to_string();
        cu.asked = c
            .call_node(
                leader,
                super::cluster::Tag::Catchup,
                "cluster.catchup",
                args,
                Vec::new(),
                CATCHUP_CALL_WAIT,
                false,
            )
            .map(|tag| (tag, now));
        if cu.asked.is_none() {
            cu.retry_at = Some(now + CATCHUP_RETRY);
        }
    }

    /// The leader's answer to a `cluster.catchup` call.
    pub(crate) fn catchup_answered(
        &mut self,
        now: Instant,
        tag: u64,
        result: Result<(String, Vec<Vec<u8>>), crate::cluster::link::CallError>,
    ) {
        let found = (self.stream_groups.held.iter_mut()).find(|(_, h)| {
            h.catchup
                .as_ref()
                .and_then(|c| c.asked)
                .is_some_and(|(t, _)| t == tag)
        });
        let Some((&group, h)) = found else {
            return;
        };
        let Some(cu) = h.catchup.as_mut() else {
            return;
        };
        cu.asked = None;
        let (text, attachments) = match result {
            Ok(r) => r,
            Err(e) => {
                crate::log_warn!("stream {:?}: catching up: {}", h.name, e.message);
                cu.retry_at = Some(now + CATCHUP_RETRY);
                return;
            }
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if v.get("ok") != Some(&Value::Bool(true)) || v.get("index") != Some(&json!(cu.index)) {
            cu.retry_at = Some(now + CATCHUP_RETRY);
            return;
        }
        let recs = attachments.first().map_or(&[][..], Vec::as_slice);
        cu.received += recs.len() as u64;
        let target = cu.target.clone();
        if let Err(e) = h.core.replica.take_records(recs, &target) {
            crate::log_warn!("stream {:?}: catching up: {e}; starting over", h.name);
            h.core.replica.start_over();
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
        let Some(frozen) = (h.frozen.iter())
            .find(|(i, _)| *i == index)
            .map(|(_, f)| f.clone())
        else {
            let due = h
                .forced_at
                .is_none_or(|t| now.saturating_duration_since(t) >= FORCED_SNAPSHOT_EVERY);
            if due && h.core.applied >= index {
                h.forced_at = Some(now);
                self.snapshot_now(group);
            }
            return Err(ApiError::new(
                Code::Unavailable,
                "this node no longer holds that snapshot's state; a newer snapshot follows",
            ));
        };
        let (recs, through) = frozen.records_after(after, max).map_err(|e| {
            ApiError::new(Code::Internal, format!("reading the stream's files: {e}"))
        })?;
        let Some(ack_id) = ack_id else {
            return Ok(None);
        };
        let body = format!(
            r#"[{{"ok":true,"index":{index},"through":{through},"records":{{"_placeholder":true,"num":0}}}}]"#
        );
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
        let Some(raft) = self.cluster.as_ref().and_then(|c| c.raft_node()) else {
            return;
        };
        let Some(h) = self.stream_groups.held.get_mut(&group) else {
            return;
        };
        let index = h.core.applied;
        let empty = |raft: &crate::cluster::node::RaftNode| {
            raft.send(ToRaft::GroupCompact {
                group,
                index,
                data: Vec::new(),
                dead: Vec::new(),
            })
        };
        if h.lost || h.catchup.is_some() || index == 0 {
            empty(raft);
            return;
        }
        match raft.group_dir(group) {
            Some(dir) => match h.core.replica.freeze() {
                Ok(mut frozen) => {
                    let dead = frozen.take_dead();
                    let frozen = std::sync::Arc::new(frozen);
                    h.frozen.retain(|(i, _)| *i != index);
                    h.frozen.push_back((index, frozen.clone()));
                    while h.frozen.len() > FROZEN_KEPT {
                        h.frozen.pop_front();
                    }
                    super::stream_groups::write_snapshot(
                        raft.sender(),
                        group,
                        index,
                        dir,
                        frozen,
                        dead,
                        &h.name,
                    );
                }
                Err(e) => {
                    crate::log_error!("stream {:?}: snapshot at {index}: {e}", h.name);
                    empty(raft);
                }
            },
            None => {
                h.core.replica.delete_dead();
                let data = h.core.replica.snapshot().unwrap_or_else(|e| {
                    crate::log_error!("stream {:?}: snapshot at {index}: {e}", h.name);
                    Vec::new()
                });
                raft.send(ToRaft::GroupCompact {
                    group,
                    index,
                    data,
                    dead: Vec::new(),
                });
            }
        }
    }
}
