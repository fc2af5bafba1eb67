//! Replicated streams as this node sees their groups: a stream's
//! `cluster` field (leader, each replica's lag) and the `stream.list`
//! entries.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// The `cluster` field of replicated stream `name`, from its group as
    /// this node sees it: on the leader, each other member's lag.
    pub(crate) fn group_cluster_field(&self, name: &str) -> Option<Value> {
        let (group, members) = self.placed(name)?;
        let c = self.cluster.as_ref()?;
        let leader = self.stream_groups.leader(group);
        let view = c.fresh_view();
        let g = view.as_ref().and_then(|v| v.groups.get(&group));
        let replicas: Vec<Value> = members
            .iter()
            .filter(|&&n| Some(n) != leader)
            .map(|&n| {
                let upto = |g: &crate::cluster::api::GroupView| {
                    self.stream_groups.lag_as_of.unwrap_or(g.last_index)
                };
                let lag = g
                    .filter(|g| g.role == Role::Leader)
                    .and_then(|g| g.progress.get(&n).map(|m| upto(g).saturating_sub(*m)));
                // Current: holds everything, answers, and may vote (a
                // replica restarted without its files may not until its
                // catch-up is done).
                let votes = g.is_some_and(|g| g.voting.contains(&n));
                let current = lag.is_some_and(|l| l == 0) && c.reachable(n) && votes;
                json!({"node": crate::broker::replicated::node_id(c, n), "current": current, "lag": lag})
            })
            .collect();
        // Only the group's leader knows each member's lag; elsewhere this
        // is what this node knows, and says so (`from_leader: false`).
        let from_leader = g.is_some_and(|g| g.role == Role::Leader);
        let leader = leader.map(|l| crate::broker::replicated::node_id(c, l));
        Some(json!({"leader": leader, "replicas": replicas, "from_leader": from_leader}))
    }

    /// `stream.list` entries of the replicated streams, from the replicas
    /// held here (zero state where this node holds none); with `led_only`,
    /// only those of the groups this node leads (what a peer gathering
    /// the list takes over its own view, see `cluster/relays.rs`).
    pub(crate) fn replicated_list_entries(&self, led_only: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for (name, s) in &self.fsm.streams {
            let Some((group, _)) = self.placed(name) else {
                continue;
            };
            let leads = self
                .stream_groups
                .held
                .get(&group)
                .is_some_and(|h| h.core.leads());
            if led_only && !leads {
                continue;
            }
            let mut config = s.config.clone();
            if let Some(o) = config.as_object_mut() {
                o.remove("replicas");
            }
            let state = self.stream_groups.state(group).unwrap_or_else(|| {
                json!({"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0, "consumer_count": 0})
            });
            let mut entry = json!({"config": config, "state": state});
            if let Some(cl) = self.group_cluster_field(name) {
                entry["cluster"] = cl;
            }
            out.push(entry);
        }
        out
    }
}
