//! The `broker` binary: flags -> Config -> a single-node broker on one
//! event loop.

use std::process::ExitCode;

use gombus::broker::dispatch::ENVELOPE_BYTES;
use gombus::broker::{Broker, BrokerConfig};
use gombus::config::{self, ConfigError};
use gombus::net::server::{Server, Settings, POLLING_SESSIONS_MAX};

fn main() -> ExitCode {
    let cfg = match config::parse(std::env::args().skip(1)) {
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
    let mut broker = Broker::new(BrokerConfig {
        node_id: cfg.node_id.clone(),
        control_token: cfg.control_token.clone(),
        auth_token: cfg.auth_token.clone(),
        max_payload: cfg.max_payload,
        connect_timeout: cfg.connect_timeout,
    });
    if let Err(e) = broker.open_streams(&cfg.data_dir, cfg.sync, cfg.segment_size as u64) {
        eprintln!("[error] streams unavailable: {e}");
    }
    let settings = Settings {
        ping_interval: cfg.ping_interval,
        ping_timeout: cfg.ping_timeout,
        message_bytes_max: cfg.max_payload + ENVELOPE_BYTES,
        out_bytes_max: cfg.max_pending,
        cors_origin: cfg.cors_origin.clone(),
        allow_eio3: cfg.allow_eio3,
        polling_sessions_max: POLLING_SESSIONS_MAX,
    };
    let mut server = match Server::bind(cfg.addr, settings, broker) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("broker: cannot listen on {}: {e}", cfg.addr);
            return ExitCode::from(1);
        }
    };
    eprintln!("[info] config {}", cfg.summary());
    match server.local_addr() {
        Ok(addr) => eprintln!("[info] listening on {addr}"),
        Err(e) => eprintln!("[warn] listening, but the address is unknown: {e}"),
    }
    if let Err(e) = server.run() {
        eprintln!("[error] event loop stopped: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
