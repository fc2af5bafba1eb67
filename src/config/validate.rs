//! Every bound and cross-flag rule of a finished [`Config`], in one place:
//! [`parse`](super::parse) calls [`Config::validate`] once every flag is
//! set, and code that builds a `Config` by hand can call it too.

use super::values::{check_addr_list, check_peers, format_duration, format_size};
use super::{
    invalid, validate_node_id, Config, ConfigError, MAX_MAX_PAYLOAD, MAX_MAX_PENDING,
    MAX_MAX_PENDING_TOTAL, MAX_TIMER, MIN_MAX_PENDING, MIN_TIMER, SEGMENT_SIZE_MAX,
    SEGMENT_SIZE_MIN,
};

impl Config {
    /// Checks every bound and cross-flag rule. [`parse`](super::parse)
    /// calls this; code that builds a `Config` by hand can call it too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&self.segment_size) {
            return Err(invalid(format!(
                "-segment-size: {:?} is outside 4KiB..1GiB",
                format_size(self.segment_size)
            )));
        }
        validate_node_id(&self.node_id).map_err(|e| invalid(format!("-node-id: {e}")))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("-data: must not be empty"));
        }
        if self.control_token.as_deref() == Some("") {
            return Err(invalid("-control-token: must not be empty"));
        }
        if self.auth_token.as_deref() == Some("") {
            return Err(invalid("-auth-token: must not be empty"));
        }
        if self.cluster_token.as_deref() == Some("") {
            return Err(invalid("-cluster-token: must not be empty"));
        }
        let relays_unproven = self.auth_token.is_none() && self.cluster_secret().is_none();
        if self.users.is_some() && !self.raft_peers.is_empty() && relays_unproven {
            // Nodes relay clients' events to each other on `/` with the
            // cluster token (or -auth-token): with neither, a peer's
            // relays could not be told from an unknown client.
            return Err(invalid(
                "-users: cluster mode needs a cluster token (-cluster-token or -control-token) \
                 for the nodes' relays",
            ));
        }
        if self.max_payload == 0 || self.max_payload > MAX_MAX_PAYLOAD {
            return Err(invalid(format!(
                "-max-payload: {} is out of range (1B to 64MiB)",
                format_size(self.max_payload)
            )));
        }
        if self.max_pending < MIN_MAX_PENDING || self.max_pending as u64 > MAX_MAX_PENDING {
            return Err(invalid(format!(
                "-max-pending: {} is out of range (64KiB to 4GiB)",
                format_size(self.max_pending)
            )));
        }
        if let Some(total) = self.max_pending_total {
            if total < self.max_pending || total as u64 > MAX_MAX_PENDING_TOTAL {
                return Err(invalid(format!(
                    "-max-pending-total: {} is out of range (-max-pending, {}, to 1024GiB)",
                    format_size(total),
                    format_size(self.max_pending)
                )));
            }
        }
        for (name, d) in [
            ("ping-interval", self.ping_interval),
            ("ping-timeout", self.ping_timeout),
            ("connect-timeout", self.connect_timeout),
        ] {
            if !(MIN_TIMER..=MAX_TIMER).contains(&d) {
                return Err(invalid(format!(
                    "-{name}: {} is out of range (10ms to 1h)",
                    format_duration(d)
                )));
            }
        }
        if !self.raft_peers.is_empty() && self.raft_addr.is_none() {
            return Err(invalid("-raft-peers: requires -raft-addr"));
        }
        if self.join {
            if !self.raft_peers.is_empty() || self.bootstrap {
                return Err(invalid(
                    "-join: a node that joins takes neither -raft-peers nor -bootstrap \
                     (the cluster's stored membership says who the members are)",
                ));
            }
            if self.raft_addr.is_none() {
                return Err(invalid("-join: requires -raft-addr"));
            }
            if self.cluster.is_empty() {
                return Err(invalid(
                    "-join: requires -cluster naming at least one current member",
                ));
            }
        }
        check_peers(&self.raft_peers).map_err(|e| invalid(format!("-raft-peers: {e}")))?;
        if !self.raft_peers.is_empty() && !self.raft_peers.iter().any(|p| p.id == self.node_id) {
            return Err(invalid(format!(
                "-raft-peers: this node ({}) is not one of the members",
                self.node_id
            )));
        }
        if !self.join
            && !self.raft_peers.is_empty()
            && self.cluster.len() + 1 != self.raft_peers.len()
        {
            return Err(invalid(format!(
                "-cluster: give the HTTP addresses of the {} other members ({} given)",
                self.raft_peers.len() - 1,
                self.cluster.len()
            )));
        }
        check_addr_list(&self.cluster).map_err(|e| invalid(format!("-cluster: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{bad, ok, sock};
    use crate::config::Peer;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn size_bounds() {
        assert_eq!(ok(&["-max-payload=1"]).max_payload, 1);
        assert_eq!(ok(&["-max-payload=64MiB"]).max_payload, 64 << 20);
        assert!(bad(&["-max-payload=0"]).contains("out of range"));
        assert!(bad(&["-max-payload=67108865"]).contains("out of range"));
        assert_eq!(ok(&["-max-pending=64KiB"]).max_pending, 64 << 10);
        assert!(bad(&["-max-pending=65535"]).starts_with("-max-pending: "));
        assert!(bad(&["-max-pending=64KB"]).contains("out of range"));
        if usize::BITS >= 64 {
            assert_eq!(ok(&["-max-pending=4GiB"]).max_pending as u64, 4 << 30);
            assert!(bad(&["-max-pending=4097MiB"]).contains("out of range"));
        }
    }

    #[test]
    fn duration_bounds() {
        assert_eq!(
            ok(&["-ping-interval=10ms"]).ping_interval,
            Duration::from_millis(10)
        );
        assert_eq!(
            ok(&["-ping-timeout=1h"]).ping_timeout,
            Duration::from_secs(3600)
        );
        assert!(bad(&["-ping-interval=9ms"]).starts_with("-ping-interval: "));
        assert!(bad(&["-ping-timeout=61m"]).contains("out of range"));
        assert!(bad(&["-ping-interval=2h"]).contains("out of range"));
        assert!(bad(&["-connect-timeout=0s"]).starts_with("-connect-timeout: "));
        assert!(bad(&["-ping-timeout=abc"]).starts_with("-ping-timeout: \"abc\""));
    }

    #[test]
    fn segment_size_bounds() {
        assert_eq!(ok(&["-segment-size=4KiB"]).segment_size, 4 << 10);
        assert_eq!(ok(&["-segment-size=1GiB"]).segment_size, 1 << 30);
        assert!(bad(&["-segment-size=1KiB"]).contains("outside"));
        assert!(bad(&["-segment-size=2GiB"]).contains("outside"));
        assert_eq!(
            bad(&["-segment-size=4095"]),
            "-segment-size: \"4095B\" is outside 4KiB..1GiB"
        );
        // A Config built by hand is held to the same bound.
        for (size, valid) in [
            (4 << 10, true),
            ((4 << 10) - 1, false),
            ((1 << 30) + 1, false),
        ] {
            let cfg = Config {
                segment_size: size,
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), valid, "{size}");
        }
    }

    #[test]
    fn users_flag_and_its_cluster_rule() {
        let cfg = ok(&["-users=/etc/gombus/users.json"]);
        assert_eq!(cfg.users, Some(PathBuf::from("/etc/gombus/users.json")));
        assert!(cfg.summary().contains("users=/etc/gombus/users.json"));
        assert_eq!(ok(&["-users="]).users, None);
        let cluster = [
            "-node-id=node-1",
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=node-1=127.0.0.1:7001,node-2=127.0.0.1:7002",
            "-cluster=127.0.0.1:8002",
            "-users=u.json",
        ];
        assert!(bad(&cluster).contains("cluster token"));
        // The relays prove the cluster token (or use -auth-token): no
        // user with every right is needed.
        for token in ["-auth-token=relay", "-cluster-token=c", "-control-token=k"] {
            let mut with_token = cluster.to_vec();
            with_token.push(token);
            assert!(ok(&with_token).users.is_some(), "{token}");
        }
    }

    #[test]
    fn raft_peers() {
        let cfg = ok(&[
            "-node-id=node-1",
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=node-1=127.0.0.1:7001, node-2=127.0.0.1:7002,node-3=localhost:7003",
            "-cluster=127.0.0.1:8002,127.0.0.1:8003",
        ]);
        assert_eq!(
            bad(&[
                "-node-id=node-1",
                "-raft-addr=127.0.0.1:7001",
                "-raft-peers=node-1=127.0.0.1:7001,node-2=127.0.0.1:7002",
            ]),
            "-cluster: give the HTTP addresses of the 1 other members (0 given)"
        );
        assert_eq!(cfg.raft_addr, Some(sock("127.0.0.1:7001")));
        assert_eq!(
            cfg.raft_peers,
            vec![
                Peer {
                    id: "node-1".into(),
                    addr: sock("127.0.0.1:7001")
                },
                Peer {
                    id: "node-2".into(),
                    addr: sock("127.0.0.1:7002")
                },
                Peer {
                    id: "node-3".into(),
                    addr: sock("127.0.0.1:7003")
                },
            ]
        );

        let msg = bad(&[
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=a=127.0.0.1:7001,a=127.0.0.1:7002",
        ]);
        assert_eq!(msg, "-raft-peers: peer id \"a\" appears more than once");
        let msg = bad(&[
            "-raft-addr=127.0.0.1:7001",
            "-raft-peers=a=127.0.0.1:7001,b=127.0.0.1:7001",
        ]);
        assert!(msg.contains("appears more than once"), "{msg}");
        assert_eq!(
            bad(&[
                "-node-id=c",
                "-raft-addr=127.0.0.1:7001",
                "-raft-peers=a=127.0.0.1:7001,b=127.0.0.1:7002",
            ]),
            "-raft-peers: this node (c) is not one of the members"
        );
        assert_eq!(
            bad(&["-raft-peers=a=127.0.0.1:7001"]),
            "-raft-peers: requires -raft-addr"
        );
        for value in [
            "a",
            "a=",
            "=127.0.0.1:1",
            "a b=127.0.0.1:1",
            "a=127.0.0.1:0",
            "a=127.0.0.1:1,,b=127.0.0.1:2",
        ] {
            let msg = bad(&["-raft-addr=127.0.0.1:7001", "-raft-peers", value]);
            assert!(msg.starts_with("-raft-peers: "), "{value}: {msg}");
        }
        assert!(ok(&["-raft-peers="]).raft_peers.is_empty());
    }
}
