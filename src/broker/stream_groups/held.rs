//! The stream groups held on this node, kept to the control state's
//! placements, and where a replicated stream's event is served: here on
//! the group's leader, or relayed to it.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// Makes the held replicated streams match the control state: a
    /// stream placed on this node gets its replica and its group held by
    /// the Raft thread; a deleted one is dropped.
    pub(crate) fn sync_stream_groups(&mut self) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        let me = c.me();
        let mut placed = HashSet::new();
        for (name, s) in &self.fsm.streams {
            let Some(p) = s.placement.as_ref().filter(|p| p.holds(me)) else {
                continue;
            };
            placed.insert(p.group);
            if self.stream_groups.held.contains_key(&p.group) {
                continue;
            }
            let mut fields = match s.config.as_object() {
                Some(f) => f.clone(),
                None => continue,
            };
            fields.remove("replicas");
            let cfg: StreamConfig = match sm::read_config(fields) {
                Ok(cfg) => cfg,
                Err(e) => {
                    crate::log_error!("replicated stream {name:?}: {e}");
                    continue;
                }
            };
            let log = self.cluster.as_ref().and_then(|c| c.group_dir(p.group));
            let store = self
                .stream_groups
                .store_of(p.group, self.streams.data_dir())
                .map(|(dir, segment_bytes)| (dir, segment_bytes, log));
            self.stream_groups.held.insert(
                p.group,
                Held {
                    name: name.clone(),
                    core: Group::new(Replica::new(cfg)),
                    waits: VecDeque::new(),
                    opened: store.is_none(),
                    store,
                    catchup: None,
                    installed: None,
                    lost: false,
                    sources: Default::default(),
                },
            );
            c.act(Action::Raft(crate::broker::stream_moves::hold_group(p, me)));
        }
        let gone: Vec<GroupId> = (self.stream_groups.held.keys())
            .filter(|g| !placed.contains(g))
            .copied()
            .collect();
        for g in gone {
            if let Some(h) = self.stream_groups.held.remove(&g) {
                h.core.replica.destroy();
            }
        }
        self.want_group_members();
    }

    /// The peer link to `node` came up (it may have restarted, perhaps
    /// without its files): each stream group this node leads that `node`
    /// is a member of gets an empty entry this turn. Heartbeats do not
    /// tell a leader that a follower's log is shorter than it was; an
    /// Append does, and a follower that lost its log is then sent the
    /// snapshot it needs at once rather than at the stream's next write.
    pub(in crate::broker) fn nudge_stream_groups(&mut self, node: u64) {
        let groups: Vec<GroupId> = (self.fsm.streams.values())
            .filter_map(|s| s.placement.as_ref())
            .filter(|p| p.replicas.len() > 1 && p.replicas.contains(&node))
            .map(|p| p.group)
            .collect();
        for g in groups {
            if let Some(h) = self.stream_groups.held.get_mut(&g) {
                if h.core.leads() {
                    h.core.take(Op::Expire { now_ms: 0 }, None);
                }
            }
        }
    }

    /// The group and members of replicated stream `name`, if it is one.
    pub(in crate::broker) fn placed(&self, name: &str) -> Option<(GroupId, Vec<u64>)> {
        let p = self.fsm.streams.get(name)?.placement.as_ref()?;
        (p.replicas.len() > 1).then(|| (p.group, p.replicas.clone()))
    }

    pub(in crate::broker) fn route(
        &self,
        group: GroupId,
        members: &[u64],
    ) -> Result<Route, ApiError> {
        let c = self
            .cluster
            .as_ref()
            .ok_or_else(|| unavailable("not in a cluster"))?;
        let me = c.me();
        if let Some(h) = self.stream_groups.held.get(&group) {
            if h.core.leads() {
                return Ok(Route::Here);
            }
            return match h.core.leader() {
                Some(l) if l != me => Ok(Route::Relay(l)),
                _ => Err(unavailable(
                    "the stream has no leader (its replicas are electing one)",
                )),
            };
        }
        // Not a member: one of the members relays on to the leader.
        members
            .iter()
            .copied()
            .find(|&n| c.reachable(n))
            .map(Route::Relay)
            .ok_or_else(|| unavailable("no replica of the stream is reachable"))
    }
}
