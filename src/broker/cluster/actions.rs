//! The broker's effects on the rest of a cluster node, in one place. Every
//! command to the Raft thread, every call and forward batch on a peer
//! link, every link dialled and every thread that writes a stream's
//! snapshot file is an [`Action`], and [`Handles::act`] is the only code
//! in the broker that carries one out. It holds the Raft thread's handle
//! and the links in private fields; `cluster/turn.rs` borrows them only to
//! read what they report. `tests/module_rules.rs` fails if another broker
//! file names their types or calls `send`, `call` or `forward`. Answers
//! to clients go out through `broker/ack.rs`.
//!
//! An action is carried out when it is made, in the order the broker
//! makes them; what comes back (Raft's outcomes, link events) reaches the
//! broker later as the loop's `Handler::woken`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::cluster::api::{
    snapshot_file, GroupId, LinkOut, Links, RaftNode, RaftSender, ToRaft, View,
};
use crate::stream::replica::Frozen;

/// One effect of the broker on its cluster node.
pub(crate) enum Action {
    /// A command for the Raft thread.
    Raft(ToRaft),
    /// A call (or an emit) on peer link `link`.
    Call { link: usize, out: LinkOut },
    /// A batch of forwarded messages (`cluster.forward`) on peer link `link`.
    Forward { link: usize, batch: Vec<u8> },
    /// Write a stream group's small snapshot file on a thread of its own.
    Snapshot(SnapshotJob),
}

/// Group `group`'s small snapshot at `index` (`frozen`), to be written
/// into `dir` after the payload files it names are fsynced; the Raft
/// thread is then handed the file's reference (empty if it could not be
/// written: the thread asks again later) and the payload files `dead` to
/// delete once it is stored. `name` is the stream's, for log lines.
pub(crate) struct SnapshotJob {
    pub group: GroupId,
    pub index: u64,
    pub dir: PathBuf,
    pub frozen: Arc<Frozen>,
    pub dead: Vec<PathBuf>,
    pub name: String,
}

/// The Raft thread's handle and the peer links, once the node runs
/// ([`Handles::run_with`]); before that every action is refused.
#[derive(Default)]
pub(crate) struct Handles {
    raft: Option<RaftNode>,
    links: Option<Links>,
    /// The last snapshot thread started (the next one joins it).
    snapshots: std::cell::Cell<Option<JoinHandle<()>>>,
}

impl Handles {
    /// Carries out `a`. Whether it was taken: false when the node does not
    /// run yet, or a link is down or its queue full.
    pub(crate) fn act(&self, a: Action) -> bool {
        match a {
            Action::Raft(m) => match &self.raft {
                Some(r) => {
                    r.send(m);
                    true
                }
                None => false,
            },
            Action::Call { link, out } => self.links.as_ref().is_some_and(|l| l.call(link, out)),
            Action::Forward { link, batch } => {
                self.links.as_ref().is_some_and(|l| l.forward(link, batch))
            }
            Action::Snapshot(job) => match &self.raft {
                Some(r) => {
                    let before = self.snapshots.take();
                    self.snapshots.set(write_snapshot(r.sender(), job, before));
                    true
                }
                None => false,
            },
        }
    }

    /// Dials a link to the peer whose HTTP address is `http`; false when
    /// the node does not run yet.
    pub(crate) fn dial(&mut self, http: SocketAddr) -> bool {
        match self.links.as_mut() {
            Some(l) => {
                l.add(http);
                true
            }
            None => false,
        }
    }

    /// Talks to Raft through `raft` and to the peers through `links`.
    pub(crate) fn run_with(&mut self, raft: RaftNode, links: Links) {
        self.raft = Some(raft);
        self.links = Some(links);
    }

    /// Whether it was given its Raft handle and links.
    pub(crate) fn running(&self) -> bool {
        self.raft.is_some() && self.links.is_some()
    }

    /// The Raft thread's handle, for `cluster/turn.rs` to read its reports
    /// (`try_recv`) and nothing else: every send is an [`Action`].
    pub(super) fn raft_node(&self) -> Option<&RaftNode> {
        self.raft.as_ref()
    }

    /// The links, for `cluster/turn.rs` to read their events (`try_recv`)
    /// and nothing else: every call and forward is an [`Action`].
    pub(super) fn links(&self) -> Option<&Links> {
        self.links.as_ref()
    }

    /// The Raft thread's view as it is now.
    pub(crate) fn view(&self) -> Option<View> {
        self.raft.as_ref().map(RaftNode::view)
    }

    /// Where stream group `group` keeps its snapshot files, when its log
    /// is durable (else its snapshots are bytes handed to Raft).
    pub(crate) fn group_dir(&self, group: GroupId) -> Option<PathBuf> {
        self.raft.as_ref().and_then(|r| r.group_dir(group))
    }
}

/// [`Action::Snapshot`]: writes the file on a thread named after the
/// group, then hands its reference to the Raft thread through `raft`.
///
/// Snapshots are written one at a time, in the order they were taken
/// (those of all groups: their writes share the disk anyway): each
/// thread first waits for the one before it (`before`). Two of a group
/// at once would break the rule a snapshot stands on, that every payload
/// file written before it is fsynced: a later snapshot syncs only the
/// files written since the earlier one froze, so it must not be stored
/// before the earlier one's are synced. (Two at the same index, which
/// would also share a temporary file, are not taken: see
/// `Broker::snapshot_now`.)
fn write_snapshot(
    raft: RaftSender,
    job: SnapshotJob,
    before: Option<JoinHandle<()>>,
) -> Option<JoinHandle<()>> {
    let SnapshotJob {
        group,
        index,
        dir,
        frozen,
        dead,
        name,
    } = job;
    let again = raft.clone();
    let dead_again = dead.clone();
    let job = move || {
        if let Some(t) = before {
            // The writer returns its errors; a panic would be a bug, and
            // was reported on stderr.
            let _ = t.join();
        }
        let written = snapshot_file::Writer::create(&dir, index).and_then(|mut w| {
            frozen.store(&mut w)?;
            w.finish()
        });
        let data = match written {
            Ok(r) => r.encode(),
            Err(e) => {
                crate::log_error!("stream {name:?}: writing its snapshot at {index}: {e}");
                Vec::new()
            }
        };
        raft.send(ToRaft::GroupCompact {
            group,
            index,
            data,
            dead,
        });
    };
    let spawned = std::thread::Builder::new()
        .name(format!("snapshot-g{group}"))
        .spawn(job);
    match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            crate::log_error!("snapshot of stream group {group}: {e}");
            again.send(ToRaft::GroupCompact {
                group,
                index,
                data: Vec::new(),
                dead: dead_again,
            });
            None
        }
    }
}
