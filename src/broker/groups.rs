//! Queue-group rules: whether a group load-balances (each message to one
//! member, the default) or broadcasts (to every member).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupMode {
    LoadBalance,
    Broadcast,
}

impl GroupMode {
    pub fn parse(s: &str) -> Option<GroupMode> {
        match s {
            "loadbalance" => Some(GroupMode::LoadBalance),
            "broadcast" => Some(GroupMode::Broadcast),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupMode::LoadBalance => "loadbalance",
            GroupMode::Broadcast => "broadcast",
        }
    }
}

/// The rules set with `group.set`; a queue without one load-balances.
#[derive(Debug, Default)]
pub struct Groups {
    rules: BTreeMap<String, GroupMode>,
    /// Round-robin position for load-balanced picks.
    turn: usize,
}

impl Groups {
    pub fn set(&mut self, queue: &str, mode: GroupMode) {
        if mode == GroupMode::LoadBalance {
            self.rules.remove(queue);
        } else {
            self.rules.insert(queue.to_string(), mode);
        }
    }

    pub fn mode(&self, queue: &str) -> GroupMode {
        if self.rules.is_empty() {
            return GroupMode::LoadBalance;
        }
        self.rules
            .get(queue)
            .copied()
            .unwrap_or(GroupMode::LoadBalance)
    }

    /// Every rule, by queue name (load-balanced queues have no rule).
    pub fn list(&self) -> impl Iterator<Item = (&str, GroupMode)> {
        self.rules.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The member index to use among `n` for the next load-balanced message.
    pub fn pick(&mut self, n: usize) -> usize {
        self.turn = self.turn.wrapping_add(1);
        self.turn % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_default_to_loadbalance() {
        let mut g = Groups::default();
        assert_eq!(g.mode("q"), GroupMode::LoadBalance);
        g.set("q", GroupMode::Broadcast);
        assert_eq!(g.mode("q"), GroupMode::Broadcast);
        assert_eq!(
            g.list().collect::<Vec<_>>(),
            vec![("q", GroupMode::Broadcast)]
        );
        g.set("q", GroupMode::LoadBalance);
        assert_eq!(g.mode("q"), GroupMode::LoadBalance);
        assert_eq!(GroupMode::parse("broadcast"), Some(GroupMode::Broadcast));
        assert_eq!(GroupMode::parse("x"), None);
    }

    #[test]
    fn picks_rotate_over_members() {
        let mut g = Groups::default();
        let picks: Vec<usize> = (0..6).map(|_| g.pick(3)).collect();
        let mut counts = [0; 3];
        for p in picks {
            counts[p] += 1;
        }
        assert_eq!(counts, [2, 2, 2]);
    }
}
