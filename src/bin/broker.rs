//! The `broker` binary: flags (or their GOMBUS_* environment variables)
//! -> Config -> a broker on one event loop (a cluster member when
//! `-raft-peers` is given), stopped cleanly by SIGTERM or SIGINT; SIGHUP
//! reloads the `-users` file.

use std::collections::BTreeMap;
use std::process::ExitCode;

use gombus::broker::cluster::{self, ClusterSettings};
use gombus::broker::dispatch::ENVELOPE_BYTES;
use gombus::broker::{Broker, BrokerConfig};
use gombus::cluster::api::{members, ClusterKey, MemberInfo, NodeConfig};
use gombus::config::{self, ConfigError};
use gombus::net::server::{Server, Settings, IN_BYTES_MAX, POLLING_SESSIONS_MAX};
use gombus::net::signal;
use gombus::{log, log_error, log_info, log_warn, maps};

fn main() -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let cfg = match config::parse_with_env(std::env::args().skip(1), env) {
        Ok(c) => c,
        Err(ConfigError::Help(text)) => {
            println!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("broker: {e} (see -help)");
            return ExitCode::from(2);
        }
    };
    log::set_level(cfg.log_level);
    let mut broker = Broker::new(BrokerConfig {
        node_id: cfg.node_id.clone(),
        control_token: cfg.control_token.clone(),
        auth_token: cfg.auth_token.clone(),
        cluster_token: cfg.cluster_secret().map(str::to_string),
        max_payload: cfg.max_payload,
        connect_timeout: cfg.connect_timeout,
    });
    if let Err(e) = broker.load_users(cfg.users.clone()) {
        eprintln!("broker: -users: {e}");
        return ExitCode::from(2);
    }
    let reload = broker.reload_flag();
    let cluster = cluster_settings(&cfg);
    if let Some(settings) = &cluster {
        broker.enable_cluster(settings.clone());
    }
    if let Err(e) = broker.open_streams(&cfg.data_dir, cfg.sync, cfg.segment_size as u64) {
        log_error!("streams unavailable: {e}");
    }
    let settings = Settings {
        ping_interval: cfg.ping_interval,
        ping_timeout: cfg.ping_timeout,
        message_bytes_max: cfg.max_payload + ENVELOPE_BYTES,
        out_bytes_max: cfg.max_pending,
        out_total_max: cfg.pending_total(),
        cors_origin: cfg.cors_origin.clone(),
        allow_eio3: cfg.allow_eio3,
        polling_sessions_max: POLLING_SESSIONS_MAX,
        in_bytes_max: IN_BYTES_MAX,
    };
    let mut server = match Server::bind(cfg.addr, settings, broker) {
        Ok(s) => s,
        Err(e) => {
            log_error!("cannot listen on {}: {e}", cfg.addr);
            return ExitCode::from(1);
        }
    };
    // A cluster node's helper threads, the Raft thread and the peer links,
    // are started here, with the loop's waker, and handed to the broker.
    // Without them the node cannot serve as a member.
    if let Some(settings) = &cluster {
        let tokens = (
            cfg.cluster_secret().map(str::to_string),
            cfg.auth_token.clone(),
        );
        match cluster::start_threads(settings, server.waker(), tokens.0, tokens.1) {
            Ok((raft, links)) => server.handler_mut().run_cluster_with(raft, links),
            Err(e) => {
                log_error!("cannot start cluster mode: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if let Err(e) = server.attach() {
        // The broker checks it was given what it needs (a cluster
        // member its Raft thread and links) and gives its fsync thread
        // the waker.
        log_error!("{e}");
        return ExitCode::from(1);
    }
    signal::stop_on_terminate(server.stopper());
    signal::flag_on_hangup(reload, server.stopper());
    log_info!("config {}", cfg.summary());
    match server.local_addr() {
        Ok(addr) => log_info!("listening on {addr}"),
        Err(e) => log_warn!("listening, but the address is unknown: {e}"),
    }
    if let Err(e) = server.run() {
        log_error!("event loop stopped: {e}");
        return ExitCode::from(1);
    }
    // Dropping the broker closes the stream stores: their last buffered
    // writes, then a final fsync round before the sync thread ends.
    drop(server);
    log_info!("stopped");
    ExitCode::SUCCESS
}

/// Cluster mode's settings, when `-raft-peers` (or `-join`) is given.
/// Seed members are numbered by their sorted ids, so every node agrees on
/// the numbers; a node that joins takes the id its name hashes to
/// (`cluster::members`).
fn cluster_settings(cfg: &config::Config) -> Option<ClusterSettings> {
    let listen = cfg.raft_addr?;
    let secret = cfg.cluster_secret().map(|t| ClusterKey::new(t.as_bytes()));
    if cfg.join {
        let id = members::joined_id(&cfg.node_id);
        return Some(ClusterSettings {
            raft: NodeConfig {
                id,
                listen,
                members: BTreeMap::new(),
                data: cfg.data_dir.clone(),
                memory_log: cfg.raft_log == config::RaftLogKind::Memory,
                bootstrap: false,
                secret,
                names: BTreeMap::from([(id, cfg.node_id.clone())]),
                infos: BTreeMap::new(),
                join: true,
            },
            names: Vec::new(),
            peers_http: cfg.cluster.clone(),
        });
    }
    if cfg.raft_peers.is_empty() {
        return None;
    }
    let mut names: Vec<String> = cfg.raft_peers.iter().map(|p| p.id.clone()).collect();
    names.sort_unstable();
    let id_of = |n: &str| names.iter().position(|x| x == n).map(|i| i as u64 + 1);
    let members =
        maps::map_of((cfg.raft_peers.iter()).filter_map(|p| Some((id_of(&p.id)?, p.addr))));
    let infos = maps::map_of(cfg.raft_peers.iter().filter_map(|p| {
        let info = MemberInfo {
            name: p.id.clone(),
            raft: p.addr,
            http: cfg.cluster_ids.get(&p.id).copied(),
        };
        Some((id_of(&p.id)?, info))
    }));
    Some(ClusterSettings {
        raft: NodeConfig {
            id: id_of(&cfg.node_id)?,
            listen,
            members,
            data: cfg.data_dir.clone(),
            memory_log: cfg.raft_log == config::RaftLogKind::Memory,
            bootstrap: cfg.bootstrap,
            secret,
            names: maps::map_of((1..).zip(names.iter().cloned())),
            infos,
            join: false,
        },
        names,
        peers_http: cfg.cluster.clone(),
    })
}
