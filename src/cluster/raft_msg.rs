//! Raft's data types (log entries, messages, hard state, snapshots) and
//! their binary encoding, shared by the transport and the durable log.
//!
//! The encoding is hand-written: fixed-width little-endian integers, a
//! one-byte tag per variant, and `u32` length prefixes for byte strings and
//! lists. It is compact (a heartbeat is 49 bytes), needs no schema
//! crate, and every length is checked against the bytes actually present
//! before anything is allocated, so a corrupt or hostile frame is an error,
//! never a panic or a huge allocation. Framing (length + crc32) is the
//! caller's: [`crate::storage::record`].
//!
//! Many Raft groups share one connection (see `raft_multi`). A message of
//! the control group (group 0) is encoded exactly as before groups
//! existed; a message of any other group puts tag 12 and the group id in
//! front of its body's tag. The coalesced heartbeats of all groups
//! between two nodes ([`Body::Beats`], [`Body::BeatsResp`], tags 13 and
//! 14) are node-level messages, always sent as group 0, whose per-group
//! fields are LEB128 varints: an idle group costs a few bytes per beat.
//!
//! [`Body::AppendResp`] carries whether its sender may vote in its tag:
//! 6 (the only tag it had before) when it may, 18 when it may not yet. A
//! voter's answers are therefore unchanged on the wire and older
//! encodings decode as they always did; a node of an older version cannot
//! read tag 18, so every member runs this version before a node is added
//! or a memory-log node restarts.

use std::fmt;

/// A node's numeric id inside the Raft group. The shell maps `-node-id`
/// names to these (the position in the sorted `-raft-peers` list, plus 1).
pub type NodeId = u64;

/// Which Raft group a message belongs to. The control group is 0; every
/// replicated stream has a group of its own.
pub type GroupId = u64;

/// The group that replicates the cluster's control state.
pub const CONTROL_GROUP: GroupId = 0;

/// What an entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Appended by every new leader at the start of its term (Raft §5.4.2,
    /// thesis §6.4): committing it commits everything before it.
    Noop,
    /// A command for the state machine.
    Command,
    /// A new cluster configuration ([`Membership`], encoded by
    /// [`encode_membership`]). It takes effect as soon as it is in a log,
    /// committed or not.
    Config,
}

/// One member of a Raft group's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// A voter counts for elections and commit quorums; a non-voter
    /// (learner) only receives the log.
    pub voter: bool,
    /// What the runtime keeps with the member (its addresses); the core
    /// does not read it.
    pub data: Vec<u8>,
}

/// A group's configuration: its members, sorted by id, each once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    pub members: Vec<Member>,
}

impl Membership {
    /// Every id voting, with no data: the configuration a cluster seeded
    /// by a fixed member list starts from.
    pub fn voters(ids: &[NodeId]) -> Membership {
        let mut members: Vec<Member> = ids
            .iter()
            .map(|&id| Member {
                id,
                voter: true,
                data: Vec::new(),
            })
            .collect();
        Membership::sort(&mut members);
        members.dedup_by_key(|m| m.id);
        Membership { members }
    }

    /// Sorts members by id: the one sort of `Member`s, each call site of
    /// `sort_by_key` being a copy of the standard library's sort (4 KB).
    pub fn sort(members: &mut [Member]) {
        members.sort_by_key(|m| m.id);
    }

    pub fn get(&self, id: NodeId) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.get(id).is_some()
    }

    pub fn is_voter(&self, id: NodeId) -> bool {
        self.get(id).is_some_and(|m| m.voter)
    }

    /// The voting ids, ascending.
    pub fn voter_ids(&self) -> Vec<NodeId> {
        self.members
            .iter()
            .filter(|m| m.voter)
            .map(|m| m.id)
            .collect()
    }

    /// Every id, ascending.
    pub fn ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub term: u64,
    pub index: u64,
    pub kind: EntryKind,
    pub data: Vec<u8>,
}

/// What must be on disk before any message that depends on it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HardState {
    pub term: u64,
    pub vote: Option<NodeId>,
    /// Bumped by the shell at every start. Acks carry it, so a leader can
    /// tell an ack of a node's earlier life (whose log may be gone) from a
    /// current one.
    pub epoch: u64,
}

/// A state-machine snapshot covering every entry up to `index`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub index: u64,
    pub term: u64,
    pub data: Vec<u8>,
}

/// One message between two nodes. `term` is the sender's term (for
/// `PreVote`, the term it would campaign in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The group whose cores exchange it ([`CONTROL_GROUP`] for the
    /// node-level [`Body::Beats`] and [`Body::BeatsResp`]).
    pub group: GroupId,
    pub from: NodeId,
    pub to: NodeId,
    pub term: u64,
    pub body: Body,
}

/// The message kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// "Would you vote for me?" without raising anyone's term (thesis §9.6).
    PreVote {
        last_index: u64,
        last_term: u64,
    },
    PreVoteResp {
        granted: bool,
    },
    /// RequestVote (Raft §5.2).
    Vote {
        last_index: u64,
        last_term: u64,
    },
    VoteResp {
        granted: bool,
    },
    /// AppendEntries (Raft §5.3). `epoch` is the follower's epoch as the
    /// leader knows it: a follower that lost its log votes again only
    /// once the leader has seen its new epoch (and so stopped counting
    /// acks of its earlier life).
    Append {
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
        epoch: u64,
    },
    /// `ok`: `index` is the last index now known to match. Refused:
    /// `index` is the `prev_index` that did not match, and the hint says
    /// where the leader should back up to (the first index of the
    /// conflicting term, or the follower's last index + 1). `voter`: the
    /// follower may vote; a leader promotes a non-voter only once it says
    /// so. Encoded with tag 6 when `voter` is set (the encoding from
    /// before the flag existed, which always meant a node that votes or
    /// did not say), tag 18 with the same fields when it is not.
    AppendResp {
        ok: bool,
        index: u64,
        hint_index: u64,
        hint_term: u64,
        epoch: u64,
        voter: bool,
    },
    /// Keeps followers from campaigning, carries the commit index (only
    /// used if the follower holds `commit_term` at `commit`) and the
    /// ReadIndex round number.
    Heartbeat {
        commit: u64,
        commit_term: u64,
        read_seq: u64,
    },
    /// The answer to a heartbeat, with the answering core's life (see
    /// [`Body::AppendResp`]): a leader that learns of a new life from it
    /// stops trusting what the old one acked.
    HeartbeatResp {
        read_seq: u64,
        epoch: u64,
    },
    /// InstallSnapshot (Raft §7), the whole snapshot in one message.
    Snapshot {
        snapshot: Snapshot,
    },
    /// A proposal forwarded by a follower; `seq` is the follower's own
    /// number for it.
    Propose {
        seq: u64,
        data: Vec<u8>,
    },
    /// The leader's answer: appended at `index` in term `term` of the
    /// message, or refused (`index` 0: not the leader of that term).
    ProposeResp {
        seq: u64,
        index: u64,
    },
    /// The heartbeats of every group the sender leads with the receiver as
    /// a follower, gathered into one message per node pair and tick (the
    /// message's own term is unused: each beat carries its group's).
    Beats {
        beats: Vec<Beat>,
    },
    /// The answers to heartbeats of many groups, gathered likewise.
    BeatsResp {
        acks: Vec<BeatAck>,
    },
    /// RequestVote from a candidate its leader told to campaign at once
    /// (leadership transfer, thesis §3.10): voters answer it even while
    /// they still hear from a leader.
    TransferVote {
        last_index: u64,
        last_term: u64,
    },
    /// A leader handing over: "campaign now" (thesis §3.10).
    TimeoutNow,
    /// InstallSnapshot for a group whose configuration changed since it
    /// was seeded: the snapshot and the configuration at its index.
    ConfSnapshot {
        snapshot: Snapshot,
        config: Membership,
    },
    /// A piece of a snapshot kept in a file (see `cluster/snapshot_file.rs`):
    /// `data` is the file's bytes from `offset` on, of `total` in all, of
    /// the group's snapshot at `index` in term `snap_term`. The pieces go
    /// out in order ahead of the [`Body::Snapshot`] (or
    /// [`Body::ConfSnapshot`]) that names the file; the shells handle them,
    /// the core never sees one.
    SnapshotChunk {
        index: u64,
        snap_term: u64,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    },
}

/// One group's [`Body::Heartbeat`] inside [`Body::Beats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    pub group: GroupId,
    pub term: u64,
    pub commit: u64,
    pub commit_term: u64,
    pub read_seq: u64,
}

/// One group's [`Body::HeartbeatResp`] inside [`Body::BeatsResp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatAck {
    pub group: GroupId,
    pub term: u64,
    pub read_seq: u64,
    pub epoch: u64,
}

/// Why bytes are not a message (or an entry, or a snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The bytes end before the value does.
    Short,
    /// An unknown tag at this offset.
    Tag(usize, u8),
    /// Bytes left over after the value.
    Trailing(usize),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Short => write!(f, "raft message cut short"),
            CodecError::Tag(at, t) => write!(f, "unknown tag {t} at offset {at}"),
            CodecError::Trailing(n) => write!(f, "{n} bytes after the message"),
        }
    }
}

impl std::error::Error for CodecError {}

impl Body {
    /// A short name for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Body::PreVote { .. } => "PreVote",
            Body::PreVoteResp { .. } => "PreVoteResp",
            Body::Vote { .. } => "Vote",
            Body::VoteResp { .. } => "VoteResp",
            Body::Append { .. } => "Append",
            Body::AppendResp { .. } => "AppendResp",
            Body::Heartbeat { .. } => "Heartbeat",
            Body::HeartbeatResp { .. } => "HeartbeatResp",
            Body::Snapshot { .. } => "Snapshot",
            Body::Propose { .. } => "Propose",
            Body::ProposeResp { .. } => "ProposeResp",
            Body::Beats { .. } => "Beats",
            Body::BeatsResp { .. } => "BeatsResp",
            Body::TransferVote { .. } => "TransferVote",
            Body::TimeoutNow => "TimeoutNow",
            Body::ConfSnapshot { .. } => "ConfSnapshot",
            Body::SnapshotChunk { .. } => "SnapshotChunk",
        }
    }
}

// ---- encoding ----

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// LEB128: seven bits a byte, low bits first, the top bit set on every
/// byte but the last.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends the encoding of `e` to `out`.
pub fn encode_entry(out: &mut Vec<u8>, e: &Entry) {
    put_u64(out, e.term);
    put_u64(out, e.index);
    out.push(match e.kind {
        EntryKind::Noop => 0,
        EntryKind::Command => 1,
        EntryKind::Config => 2,
    });
    put_bytes(out, &e.data);
}

/// Appends the encoding of `c` to `out`: a varint count, then per member
/// its id (u64), a voter byte and its data (length-prefixed).
pub fn encode_membership(out: &mut Vec<u8>, c: &Membership) {
    put_varint(out, c.members.len() as u64);
    for m in &c.members {
        put_u64(out, m.id);
        out.push(m.voter as u8);
        put_bytes(out, &m.data);
    }
}

/// Decodes a whole [`encode_membership`] value; ids must ascend.
pub fn decode_membership(buf: &[u8]) -> Result<Membership, CodecError> {
    let mut r = Reader::new(buf);
    let c = r.membership()?;
    r.finish()?;
    Ok(c)
}

/// Appends the encoding of `s` to `out`.
pub fn encode_snapshot(out: &mut Vec<u8>, s: &Snapshot) {
    put_u64(out, s.index);
    put_u64(out, s.term);
    put_bytes(out, &s.data);
}

/// Appends the encoding of `h` to `out`.
pub fn encode_hard_state(out: &mut Vec<u8>, h: &HardState) {
    put_u64(out, h.term);
    put_u64(out, h.vote.unwrap_or(0));
    put_u64(out, h.epoch);
}

/// Tag of a body that belongs to a group other than the control group.
const TAG_GROUP: u8 = 12;
/// Tags of [`Body::AppendResp`]: from a node that may vote (the tag the
/// message had before the flag existed, so every older encoding still
/// decodes, and a voter's answers are byte for byte what they were), and
/// from one that may not vote yet.
const TAG_APPEND_RESP: u8 = 6;
const TAG_APPEND_RESP_NOT_VOTER: u8 = 18;
/// Tag of [`Body::SnapshotChunk`].
const TAG_SNAPSHOT_CHUNK: u8 = 19;

/// Appends the encoding of `m` to `out`. A message of a group other than
/// [`CONTROL_GROUP`] cannot carry [`Body::Beats`] or [`Body::BeatsResp`]
/// (they are node-level; such a message would not decode).
pub fn encode(out: &mut Vec<u8>, m: &Message) {
    put_u64(out, m.from);
    put_u64(out, m.to);
    put_u64(out, m.term);
    if m.group != CONTROL_GROUP {
        debug_assert!(
            !matches!(m.body, Body::Beats { .. } | Body::BeatsResp { .. }),
            "beats are sent as group 0"
        );
        out.push(TAG_GROUP);
        put_u64(out, m.group);
    }
    encode_body(out, &m.body);
}

fn encode_body(out: &mut Vec<u8>, body: &Body) {
    match body {
        Body::PreVote {
            last_index,
            last_term,
        } => {
            out.push(1);
            put_u64(out, *last_index);
            put_u64(out, *last_term);
        }
        Body::PreVoteResp { granted } => {
            out.push(2);
            out.push(*granted as u8);
        }
        Body::Vote {
            last_index,
            last_term,
        } => {
            out.push(3);
            put_u64(out, *last_index);
            put_u64(out, *last_term);
        }
        Body::VoteResp { granted } => {
            out.push(4);
            out.push(*granted as u8);
        }
        Body::Append {
            prev_index,
            prev_term,
            entries,
            commit,
            epoch,
        } => {
            out.push(5);
            put_u64(out, *prev_index);
            put_u64(out, *prev_term);
            put_u64(out, *commit);
            put_u64(out, *epoch);
            out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for e in entries {
                encode_entry(out, e);
            }
        }
        Body::AppendResp {
            ok,
            index,
            hint_index,
            hint_term,
            epoch,
            voter,
        } => {
            out.push(if *voter {
                TAG_APPEND_RESP
            } else {
                TAG_APPEND_RESP_NOT_VOTER
            });
            out.push(*ok as u8);
            put_u64(out, *index);
            put_u64(out, *hint_index);
            put_u64(out, *hint_term);
            put_u64(out, *epoch);
        }
        Body::Heartbeat {
            commit,
            commit_term,
            read_seq,
        } => {
            out.push(7);
            put_u64(out, *commit);
            put_u64(out, *commit_term);
            put_u64(out, *read_seq);
        }
        Body::HeartbeatResp { read_seq, epoch } => {
            out.push(8);
            put_u64(out, *read_seq);
            put_u64(out, *epoch);
        }
        Body::Snapshot { snapshot } => {
            out.push(9);
            encode_snapshot(out, snapshot);
        }
        Body::Propose { seq, data } => {
            out.push(10);
            put_u64(out, *seq);
            put_bytes(out, data);
        }
        Body::ProposeResp { seq, index } => {
            out.push(11);
            put_u64(out, *seq);
            put_u64(out, *index);
        }
        Body::Beats { beats } => {
            out.push(13);
            put_varint(out, beats.len() as u64);
            for b in beats {
                for v in [b.group, b.term, b.commit, b.commit_term, b.read_seq] {
                    put_varint(out, v);
                }
            }
        }
        Body::BeatsResp { acks } => {
            out.push(14);
            put_varint(out, acks.len() as u64);
            for a in acks {
                for v in [a.group, a.term, a.read_seq, a.epoch] {
                    put_varint(out, v);
                }
            }
        }
        Body::TransferVote {
            last_index,
            last_term,
        } => {
            out.push(15);
            put_u64(out, *last_index);
            put_u64(out, *last_term);
        }
        Body::TimeoutNow => out.push(16),
        Body::ConfSnapshot { snapshot, config } => {
            out.push(17);
            encode_snapshot(out, snapshot);
            encode_membership(out, config);
        }
        Body::SnapshotChunk {
            index,
            snap_term,
            offset,
            total,
            data,
        } => {
            out.push(TAG_SNAPSHOT_CHUNK);
            put_u64(out, *index);
            put_u64(out, *snap_term);
            put_u64(out, *offset);
            put_u64(out, *total);
            put_bytes(out, data);
        }
    }
}

// ---- decoding ----

/// A cursor over bytes that refuses to read past the end.
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.at.checked_add(n).ok_or(CodecError::Short)?;
        let s = self.buf.get(self.at..end).ok_or(CodecError::Short)?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bool(&mut self) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(CodecError::Tag(self.at - 1, t)),
        }
    }

    /// A LEB128 varint in its shortest form: a longer spelling of the same
    /// number (a last byte of 0) or one past 64 bits is refused, so the
    /// encoding stays canonical.
    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for k in 0..10 {
            let at = self.at;
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if k == 9 && b > 1 {
                return Err(CodecError::Tag(at, b));
            }
            v |= bits << (7 * k);
            if b & 0x80 == 0 {
                if k > 0 && b == 0 {
                    return Err(CodecError::Tag(at, b));
                }
                return Ok(v);
            }
        }
        unreachable!("the tenth byte ends the varint or is refused")
    }

    /// A list length that the remaining bytes can hold at `min_each`
    /// bytes an item.
    fn count(&mut self, min_each: usize) -> Result<usize, CodecError> {
        let n = self.varint()?;
        if n > ((self.buf.len() - self.at) / min_each) as u64 {
            return Err(CodecError::Short);
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, CodecError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), CodecError> {
        match self.buf.len() - self.at {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }

    pub fn entry(&mut self) -> Result<Entry, CodecError> {
        let term = self.u64()?;
        let index = self.u64()?;
        let kind = match self.u8()? {
            0 => EntryKind::Noop,
            1 => EntryKind::Command,
            2 => EntryKind::Config,
            t => return Err(CodecError::Tag(self.at - 1, t)),
        };
        let data = self.bytes()?;
        Ok(Entry {
            term,
            index,
            kind,
            data,
        })
    }

    pub fn membership(&mut self) -> Result<Membership, CodecError> {
        let n = self.count(13)?;
        let mut members: Vec<Member> = Vec::with_capacity(n);
        for _ in 0..n {
            let at = self.at;
            let id = self.u64()?;
            if members.last().is_some_and(|m| m.id >= id) {
                return Err(CodecError::Tag(at, self.buf[at]));
            }
            let voter = self.bool()?;
            let data = self.bytes()?;
            members.push(Member { id, voter, data });
        }
        Ok(Membership { members })
    }

    pub fn snapshot(&mut self) -> Result<Snapshot, CodecError> {
        Ok(Snapshot {
            index: self.u64()?,
            term: self.u64()?,
            data: self.bytes()?,
        })
    }

    pub fn hard_state(&mut self) -> Result<HardState, CodecError> {
        let term = self.u64()?;
        let vote = Some(self.u64()?).filter(|&v| v != 0);
        let epoch = self.u64()?;
        Ok(HardState { term, vote, epoch })
    }

    fn body(&mut self) -> Result<Body, CodecError> {
        let tag_at = self.at;
        Ok(match self.u8()? {
            1 => Body::PreVote {
                last_index: self.u64()?,
                last_term: self.u64()?,
            },
            2 => Body::PreVoteResp {
                granted: self.bool()?,
            },
            3 => Body::Vote {
                last_index: self.u64()?,
                last_term: self.u64()?,
            },
            4 => Body::VoteResp {
                granted: self.bool()?,
            },
            5 => {
                let prev_index = self.u64()?;
                let prev_term = self.u64()?;
                let commit = self.u64()?;
                let epoch = self.u64()?;
                let n = self.u32()? as usize;
                // Each entry takes at least 21 bytes: refuse a count the
                // remaining bytes cannot hold before reserving room.
                if n > (self.buf.len() - self.at) / 21 {
                    return Err(CodecError::Short);
                }
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(self.entry()?);
                }
                Body::Append {
                    prev_index,
                    prev_term,
                    entries,
                    commit,
                    epoch,
                }
            }
            t @ (TAG_APPEND_RESP | TAG_APPEND_RESP_NOT_VOTER) => Body::AppendResp {
                ok: self.bool()?,
                index: self.u64()?,
                hint_index: self.u64()?,
                hint_term: self.u64()?,
                epoch: self.u64()?,
                voter: t == TAG_APPEND_RESP,
            },
            7 => Body::Heartbeat {
                commit: self.u64()?,
                commit_term: self.u64()?,
                read_seq: self.u64()?,
            },
            8 => Body::HeartbeatResp {
                read_seq: self.u64()?,
                epoch: self.u64()?,
            },
            9 => Body::Snapshot {
                snapshot: self.snapshot()?,
            },
            10 => Body::Propose {
                seq: self.u64()?,
                data: self.bytes()?,
            },
            11 => Body::ProposeResp {
                seq: self.u64()?,
                index: self.u64()?,
            },
            13 => {
                let n = self.count(5)?;
                let mut beats = Vec::with_capacity(n);
                for _ in 0..n {
                    beats.push(Beat {
                        group: self.varint()?,
                        term: self.varint()?,
                        commit: self.varint()?,
                        commit_term: self.varint()?,
                        read_seq: self.varint()?,
                    });
                }
                Body::Beats { beats }
            }
            14 => {
                let n = self.count(4)?;
                let mut acks = Vec::with_capacity(n);
                for _ in 0..n {
                    acks.push(BeatAck {
                        group: self.varint()?,
                        term: self.varint()?,
                        read_seq: self.varint()?,
                        epoch: self.varint()?,
                    });
                }
                Body::BeatsResp { acks }
            }
            15 => Body::TransferVote {
                last_index: self.u64()?,
                last_term: self.u64()?,
            },
            16 => Body::TimeoutNow,
            17 => Body::ConfSnapshot {
                snapshot: self.snapshot()?,
                config: self.membership()?,
            },
            TAG_SNAPSHOT_CHUNK => Body::SnapshotChunk {
                index: self.u64()?,
                snap_term: self.u64()?,
                offset: self.u64()?,
                total: self.u64()?,
                data: self.bytes()?,
            },
            t => return Err(CodecError::Tag(tag_at, t)),
        })
    }
}

/// Decodes one whole message from `buf`.
pub fn decode(buf: &[u8]) -> Result<Message, CodecError> {
    let mut r = Reader::new(buf);
    let from = r.u64()?;
    let to = r.u64()?;
    let term = r.u64()?;
    let mut group = CONTROL_GROUP;
    if r.buf.get(r.at) == Some(&TAG_GROUP) {
        r.at += 1;
        let at = r.at;
        group = r.u64()?;
        // Group 0 is spelled without the tag: one encoding per message.
        if group == CONTROL_GROUP {
            return Err(CodecError::Tag(at, 0));
        }
    }
    let tag_at = r.at;
    let body = r.body()?;
    if group != CONTROL_GROUP && matches!(body, Body::Beats { .. } | Body::BeatsResp { .. }) {
        return Err(CodecError::Tag(tag_at, r.buf[tag_at]));
    }
    r.finish()?;
    Ok(Message {
        group,
        from,
        to,
        term,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        let e = |i: u64, d: &[u8]| Entry {
            term: 3,
            index: i,
            kind: if d.is_empty() {
                EntryKind::Noop
            } else {
                EntryKind::Command
            },
            data: d.to_vec(),
        };
        let bodies = vec![
            Body::PreVote {
                last_index: 9,
                last_term: 2,
            },
            Body::PreVoteResp { granted: true },
            Body::Vote {
                last_index: 1,
                last_term: 1,
            },
            Body::VoteResp { granted: false },
            Body::Append {
                prev_index: 4,
                prev_term: 2,
                entries: vec![e(5, b""), e(6, b"set x 1")],
                commit: 4,
                epoch: 2,
            },
            Body::AppendResp {
                ok: false,
                index: 4,
                hint_index: 3,
                hint_term: 1,
                epoch: 7,
                voter: true,
            },
            Body::AppendResp {
                ok: true,
                index: 9,
                hint_index: 0,
                hint_term: 0,
                epoch: 2,
                voter: false,
            },
            Body::Heartbeat {
                commit: 6,
                commit_term: 3,
                read_seq: 12,
            },
            Body::HeartbeatResp {
                read_seq: 12,
                epoch: 3,
            },
            Body::Snapshot {
                snapshot: Snapshot {
                    index: 100,
                    term: 3,
                    data: vec![1, 2, 3],
                },
            },
            Body::Propose {
                seq: 5,
                data: b"incr".to_vec(),
            },
            Body::ProposeResp { seq: 5, index: 77 },
            Body::TransferVote {
                last_index: 8,
                last_term: 3,
            },
            Body::TimeoutNow,
            Body::ConfSnapshot {
                snapshot: Snapshot {
                    index: 40,
                    term: 2,
                    data: vec![9],
                },
                config: Membership {
                    members: vec![
                        Member {
                            id: 1,
                            voter: true,
                            data: b"a".to_vec(),
                        },
                        Member {
                            id: 4,
                            voter: false,
                            data: Vec::new(),
                        },
                    ],
                },
            },
            Body::SnapshotChunk {
                index: 40,
                snap_term: 2,
                offset: 1 << 20,
                total: 3 << 20,
                data: vec![7; 300],
            },
        ];
        let mut out: Vec<Message> = Vec::new();
        for group in [CONTROL_GROUP, 7, u64::MAX] {
            out.extend(bodies.iter().cloned().map(|body| Message {
                group,
                from: 1,
                to: 2,
                term: 3,
                body,
            }));
        }
        for body in [
            Body::Beats {
                beats: vec![
                    Beat {
                        group: 1,
                        term: 2,
                        commit: 300,
                        commit_term: 2,
                        read_seq: 0,
                    },
                    Beat {
                        group: u64::MAX,
                        term: 1 << 40,
                        commit: 127,
                        commit_term: 128,
                        read_seq: 16_384,
                    },
                ],
            },
            Body::Beats { beats: vec![] },
            Body::BeatsResp {
                acks: vec![BeatAck {
                    group: 9,
                    term: 4,
                    read_seq: 1,
                    epoch: 2,
                }],
            },
        ] {
            out.push(Message {
                group: CONTROL_GROUP,
                from: 1,
                to: 2,
                term: 0,
                body,
            });
        }
        out
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            let mut out = Vec::new();
            encode(&mut out, &m);
            assert_eq!(decode(&out), Ok(m));
        }
    }

    #[test]
    fn every_cut_is_an_error_not_a_panic() {
        for m in samples() {
            let mut out = Vec::new();
            encode(&mut out, &m);
            for cut in 0..out.len() {
                assert!(
                    decode(&out[..cut]).is_err(),
                    "{} cut at {cut}",
                    m.body.name()
                );
            }
            out.push(0);
            assert_eq!(decode(&out), Err(CodecError::Trailing(1)));
        }
    }

    #[test]
    fn a_heartbeat_is_49_bytes() {
        let m = Message {
            group: CONTROL_GROUP,
            from: 1,
            to: 2,
            term: 3,
            body: Body::Heartbeat {
                commit: 4,
                commit_term: 3,
                read_seq: 0,
            },
        };
        let mut out = Vec::new();
        encode(&mut out, &m);
        assert_eq!(out.len(), 49);
    }

    #[test]
    fn known_bytes_of_a_heartbeat_response() {
        let m = Message {
            group: CONTROL_GROUP,
            from: 1,
            to: 2,
            term: 3,
            body: Body::HeartbeatResp {
                read_seq: 4,
                epoch: 1,
            },
        };
        let mut out = Vec::new();
        encode(&mut out, &m);
        let mut want = Vec::new();
        for v in [1u64, 2, 3] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.push(8);
        want.extend_from_slice(&4u64.to_le_bytes());
        want.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(out, want);
    }

    /// A voter's answer keeps the bytes it had before the flag existed
    /// (tag 6); a node that may not vote yet answers with tag 18 and the
    /// same fields after it.
    #[test]
    fn known_bytes_of_append_responses_with_and_without_the_vote() {
        let resp = |voter: bool| Message {
            group: CONTROL_GROUP,
            from: 4,
            to: 1,
            term: 3,
            body: Body::AppendResp {
                ok: true,
                index: 9,
                hint_index: 0,
                hint_term: 0,
                epoch: 2,
                voter,
            },
        };
        let bytes = |tag: u8| {
            let mut want = Vec::new();
            for v in [4u64, 1, 3] {
                want.extend_from_slice(&v.to_le_bytes());
            }
            want.push(tag);
            want.push(1);
            for v in [9u64, 0, 0, 2] {
                want.extend_from_slice(&v.to_le_bytes());
            }
            want
        };
        for (voter, tag) in [(true, 6), (false, 18)] {
            let mut out = Vec::new();
            encode(&mut out, &resp(voter));
            assert_eq!(out, bytes(tag), "voter {voter}");
            assert_eq!(decode(&out), Ok(resp(voter)));
        }
    }

    #[test]
    fn known_bytes_of_timeout_now_and_a_config_entry() {
        let m = Message {
            group: CONTROL_GROUP,
            from: 1,
            to: 2,
            term: 3,
            body: Body::TimeoutNow,
        };
        let mut out = Vec::new();
        encode(&mut out, &m);
        let mut want = Vec::new();
        for v in [1u64, 2, 3] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.push(16);
        assert_eq!(out, want);

        let c = Membership {
            members: vec![Member {
                id: 5,
                voter: false,
                data: b"ab".to_vec(),
            }],
        };
        let mut out = Vec::new();
        encode_membership(&mut out, &c);
        let mut want = vec![1];
        want.extend_from_slice(&5u64.to_le_bytes());
        want.push(0);
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"ab");
        assert_eq!(out, want);
        assert_eq!(decode_membership(&out), Ok(c));

        let e = Entry {
            term: 1,
            index: 2,
            kind: EntryKind::Config,
            data: Vec::new(),
        };
        let mut out = Vec::new();
        encode_entry(&mut out, &e);
        assert_eq!(out[16], 2);
        assert_eq!(Reader::new(&out).entry(), Ok(e));
    }

    #[test]
    fn a_membership_with_ids_out_of_order_or_repeated_is_refused() {
        let mut out = vec![2];
        for _ in 0..2 {
            out.extend_from_slice(&5u64.to_le_bytes());
            out.push(1);
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        assert!(decode_membership(&out).is_err());
        // A count the bytes cannot hold is refused before allocating.
        assert_eq!(
            decode_membership(&[0xff, 0xff, 0x03]),
            Err(CodecError::Short)
        );
    }

    #[test]
    fn a_stream_group_message_is_the_control_encoding_with_its_group_in_front() {
        let body = Body::HeartbeatResp {
            read_seq: 4,
            epoch: 1,
        };
        let mut control = Vec::new();
        encode(
            &mut control,
            &Message {
                group: CONTROL_GROUP,
                from: 1,
                to: 2,
                term: 3,
                body: body.clone(),
            },
        );
        let mut grouped = Vec::new();
        encode(
            &mut grouped,
            &Message {
                group: 5,
                from: 1,
                to: 2,
                term: 3,
                body,
            },
        );
        let mut want = control[..24].to_vec();
        want.push(12);
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&control[24..]);
        assert_eq!(grouped, want);
    }

    #[test]
    fn group_zero_spelled_with_the_group_tag_is_refused() {
        let mut out = Vec::new();
        for v in [1u64, 2, 3] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(12);
        out.extend_from_slice(&0u64.to_le_bytes());
        out.push(8);
        out.extend_from_slice(&4u64.to_le_bytes());
        assert_eq!(decode(&out), Err(CodecError::Tag(25, 0)));
    }

    #[test]
    fn beats_inside_a_group_or_a_group_inside_a_group_are_refused() {
        let mut head = Vec::new();
        for v in [1u64, 2, 3] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        head.push(12);
        head.extend_from_slice(&6u64.to_le_bytes());
        let mut beats = head.clone();
        beats.extend_from_slice(&[13, 0]);
        assert_eq!(decode(&beats), Err(CodecError::Tag(33, 13)));
        let mut nested = head.clone();
        nested.push(12);
        nested.extend_from_slice(&6u64.to_le_bytes());
        nested.push(8);
        nested.extend_from_slice(&4u64.to_le_bytes());
        assert_eq!(decode(&nested), Err(CodecError::Tag(33, 12)));
    }

    #[test]
    fn known_bytes_of_beats() {
        let m = Message {
            group: CONTROL_GROUP,
            from: 1,
            to: 2,
            term: 0,
            body: Body::Beats {
                beats: vec![Beat {
                    group: 3,
                    term: 2,
                    commit: 200,
                    commit_term: 2,
                    read_seq: 0,
                }],
            },
        };
        let mut out = Vec::new();
        encode(&mut out, &m);
        let mut want = Vec::new();
        for v in [1u64, 2, 0] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        // Tag, count 1, then group 3, term 2, commit 200 (two bytes),
        // commit term 2, read seq 0.
        want.extend_from_slice(&[13, 1, 3, 2, 0xc8, 0x01, 2, 0]);
        assert_eq!(out, want);
    }

    #[test]
    fn a_varint_in_a_longer_form_than_needed_is_refused() {
        for (bytes, ok) in [
            (&[0x00][..], Some(0)),
            (&[0x7f][..], Some(127)),
            (&[0x80, 0x01][..], Some(128)),
            (&[0x80, 0x00][..], None),
            (&[0xff; 9][..], None),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..],
                Some(u64::MAX),
            ),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..],
                None,
            ),
        ] {
            let mut r = Reader::new(bytes);
            assert_eq!(r.varint().ok(), ok, "{bytes:02x?}");
            if let Some(v) = ok {
                let mut again = Vec::new();
                put_varint(&mut again, v);
                assert_eq!(again, bytes);
            }
        }
    }

    #[test]
    fn a_huge_beat_count_is_refused_without_allocating() {
        let mut out = Vec::new();
        for v in [1u64, 2, 3] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(13);
        put_varint(&mut out, u64::MAX);
        out.extend_from_slice(&[0; 9]);
        assert_eq!(decode(&out), Err(CodecError::Short));
    }

    #[test]
    fn a_huge_entry_count_is_refused_without_allocating() {
        let mut out = Vec::new();
        for v in [1u64, 2, 3] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(5);
        out.extend_from_slice(&[0; 32]);
        out.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&out), Err(CodecError::Short));
    }
}
