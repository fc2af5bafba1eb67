//! Who the members of the control group are, as the runtime sees them:
//! each member's name (`-node-id`), Raft address and HTTP address, kept in
//! the [`Member::data`] of the replicated configuration, and the rule that
//! gives a member its numeric Raft id.
//!
//! Ids: the members that seed a cluster (`-raft-peers`) are numbered by
//! their sorted names, 1..=n, as every seed node computes alike. A node
//! added later (`-join`) has the id [`joined_id`] of its name: a 64-bit
//! hash with the top bit set, so it never meets a seed's small number and
//! the new node knows its own id before anyone has told it anything.
//! Either way an id, once in the configuration, never changes: restarts
//! read it back from the stored configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::raft_msg::{Member, Membership, NodeId};

/// What the runtime keeps about one member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its `-node-id`.
    pub name: String,
    /// Its `-raft-addr`.
    pub raft: SocketAddr,
    /// Its HTTP address (`-addr`), where the peer links reach it; unknown
    /// for a seed member given by a plain `-cluster host:port` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
}

impl MemberInfo {
    /// The bytes stored in [`Member::data`].
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads [`Member::data`]; `None` for data that is not ours (empty,
    /// as in a configuration seeded before members carried addresses).
    pub fn decode(data: &[u8]) -> Option<MemberInfo> {
        crate::protocol::json_from_bytes(data).ok()
    }
}

/// The id of a node that joins by name `name`: FNV-1a of the name with
/// the top bit set (seed ids are small positions).
pub fn joined_id(name: &str) -> NodeId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

/// The configuration a cluster seeded by `members` (id → info) starts
/// from: every one a voter, each with its addresses.
pub fn seed(members: &BTreeMap<NodeId, MemberInfo>) -> Membership {
    Membership {
        members: members
            .iter()
            .map(|(&id, info)| Member {
                id,
                voter: true,
                data: info.encode(),
            })
            .collect(),
    }
}

/// The members of `conf` whose data this runtime can read, by id.
pub fn directory(conf: &Membership) -> BTreeMap<NodeId, MemberInfo> {
    crate::maps::map_of(
        (conf.members.iter()).filter_map(|m| Some((m.id, MemberInfo::decode(&m.data)?))),
    )
}

/// Why an add is refused before it reaches the Raft core: an id, name or
/// address some member already has.
pub fn check_add(conf: &Membership, id: NodeId, info: &MemberInfo) -> Result<(), String> {
    if conf.contains(id) {
        return Err(format!("node {} is a member already", info.name));
    }
    for (_, m) in directory(conf) {
        if m.name == info.name {
            return Err(format!("node {} is a member already", info.name));
        }
        if m.raft == info.raft {
            return Err(format!(
                "raft address {} is member {}'s already",
                info.raft, m.name
            ));
        }
        if info.http.is_some() && m.http == info.http {
            return Err(format!(
                "address {} is member {}'s already",
                info.http.map(|a| a.to_string()).unwrap_or_default(),
                m.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, raft: &str, http: &str) -> MemberInfo {
        MemberInfo {
            name: name.into(),
            raft: raft.parse().unwrap(),
            http: Some(http.parse().unwrap()),
        }
    }

    #[test]
    fn joined_ids_are_stable_and_apart_from_seed_positions() {
        assert_eq!(joined_id("n4"), joined_id("n4"));
        assert_ne!(joined_id("n4"), joined_id("n5"));
        assert!(joined_id("n4") > 1 << 62);
    }

    #[test]
    fn member_data_round_trips_and_foreign_data_is_none() {
        let i = info("n1", "127.0.0.1:9091", "127.0.0.1:8081");
        assert_eq!(MemberInfo::decode(&i.encode()), Some(i));
        assert_eq!(MemberInfo::decode(b""), None);
        assert_eq!(MemberInfo::decode(b"\x00\x01"), None);
    }

    #[test]
    fn an_add_with_a_taken_name_or_address_is_refused() {
        let seeds: BTreeMap<NodeId, MemberInfo> = [
            (1, info("n1", "127.0.0.1:9091", "127.0.0.1:8081")),
            (2, info("n2", "127.0.0.1:9092", "127.0.0.1:8082")),
        ]
        .into();
        let conf = seed(&seeds);
        assert_eq!(directory(&conf), seeds);
        let fresh = info("n3", "127.0.0.1:9093", "127.0.0.1:8083");
        assert!(check_add(&conf, joined_id("n3"), &fresh).is_ok());
        assert!(check_add(&conf, 1, &fresh).is_err());
        let same_name = info("n2", "127.0.0.1:9093", "127.0.0.1:8083");
        assert!(check_add(&conf, joined_id("n2"), &same_name).is_err());
        let same_raft = info("n3", "127.0.0.1:9092", "127.0.0.1:8083");
        assert!(check_add(&conf, joined_id("n3"), &same_raft)
            .unwrap_err()
            .contains("raft address"));
        let same_http = info("n3", "127.0.0.1:9093", "127.0.0.1:8081");
        assert!(check_add(&conf, joined_id("n3"), &same_http).is_err());
    }
}
