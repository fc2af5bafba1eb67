//! Queue-group rules: whether a group load-balances (each message to one
//! member, the default) or broadcasts (to every member).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// The most queue-group rules the broker keeps.
pub const GROUP_RULES_MAX: usize = 10_000;

/// The rules set with `group.set`; a queue without one load-balances.
#[derive(Debug, Default)]
pub struct Groups {
    rules: BTreeMap<String, GroupMode>,
    /// Round-robin position for load-balanced picks.
    turn: usize,
}

impl Groups {
    /// Sets a queue's mode; false (and nothing changes) when the rule is
    /// new and `GROUP_RULES_MAX` rules exist already.
    pub fn set(&mut self, queue: &str, mode: GroupMode) -> bool {
        if self.rules.len() >= GROUP_RULES_MAX && !self.rules.contains_key(queue) {
            return false;
        }
        self.rules.insert(queue.to_string(), mode);
        true
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

    /// Every rule set, by queue name (queues never set load-balance too).
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
        assert_eq!(
            g.list().collect::<Vec<_>>(),
            vec![("q", GroupMode::LoadBalance)]
        );
        assert_eq!(GroupMode::parse("broadcast"), Some(GroupMode::Broadcast));
        assert_eq!(GroupMode::parse("x"), None);
    }

    #[test]
    fn rules_are_bounded() {
        let mut g = Groups::default();
        for i in 0..GROUP_RULES_MAX {
            assert!(g.set(&format!("q{i}"), GroupMode::Broadcast));
        }
        assert!(!g.set("one-too-many", GroupMode::Broadcast));
        assert!(
            g.set("q0", GroupMode::LoadBalance),
            "changing a rule is always allowed"
        );
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
