//! Users and rights on `/` as the broker applies them (docs/PROTOCOL.md
//! §11): `Access`, the users in force and the `forbidden` counts, and the
//! delivery gate for subscriptions with cuts and for answers to requests.
//! The `Broker`'s side (who a CONNECT is, the refusals, the reload on
//! SIGHUP) is in `access/checks.rs`, above the `Broker` this file's state
//! sits below. The rules themselves live in `crate::auth`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::metrics::Family;
use super::session::Session;
use crate::auth::{users, ConnRights, Users};
use crate::port::ConnId;

mod checks;

/// The users in force and what the rights have refused.
#[derive(Debug, Default)]
pub struct Access {
    /// `-users`: the file SIGHUP reads again.
    pub path: Option<PathBuf>,
    /// The users in force; `None` without `-users`.
    pub users: Option<Users>,
    /// Set by the SIGHUP handler, taken by the loop.
    pub reload: Arc<AtomicBool>,
    /// Sockets with at least one subscription that has cuts: while there
    /// are none, a delivery looks at no rights at all.
    pub cut_sockets: usize,
    /// `forbidden` answers by (user, kind).
    forbidden: HashMap<(Arc<str>, &'static str), u64>,
}

impl Access {
    /// Reads the users file at start; an error stops the process.
    pub fn open(path: Option<PathBuf>) -> Result<Access, String> {
        let mut a = Access::default();
        if let Some(p) = path {
            let (users, loose) = users::read(&p)?;
            if loose {
                crate::log_warn!(
                    "users file {} may be read by its group or others; it holds tokens",
                    p.display()
                );
            }
            crate::log_info!("users file {}: {} users", p.display(), users.len());
            a.users = Some(users);
            a.path = Some(p);
        }
        Ok(a)
    }

    /// `/metrics` families: the users in force and the refusals by user
    /// and kind (names only, never tokens).
    pub(crate) fn families(&self) -> Vec<Family> {
        let mut refused = Family::counter(
            "gombus_forbidden_total",
            "Events answered forbidden (or dropped), by user and kind.",
        );
        let mut counts: Vec<_> = self.forbidden.iter().collect();
        counts.sort_unstable();
        for ((user, kind), n) in counts {
            refused = refused.with(
                vec![("user", user.to_string()), ("kind", kind.to_string())],
                *n as f64,
            );
        }
        let users = Family::gauge("gombus_users", "Users in the users file in force.")
            .with(vec![], self.users.as_ref().map_or(0, Users::len) as f64);
        vec![users, refused]
    }
}

/// What a CONNECT to `/` is admitted as.
pub(crate) enum Admission {
    Refused,
    /// Every right (`-auth-token`, or no token required at all).
    All,
    User(Box<ConnRights>),
}

/// Whether a delivery on `subject` may reach subscription `sid` of `conn`,
/// and, for a request, the answer it opens for a user with
/// `allow_responses`. Called only while some socket has cuts or the
/// message carries a reply subject under a users file.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gate(
    sessions: &mut [Option<Session>],
    conn: ConnId,
    sid: &str,
    subject: &str,
    reply: Option<&str>,
    until: Instant,
    now: Instant,
) -> bool {
    let Some(r) = sessions
        .get_mut(conn)
        .and_then(Option::as_mut)
        .and_then(|s| s.rights.as_deref_mut())
    else {
        return true;
    };
    if r.has_cuts() && !r.deliverable(sid, subject) {
        return false;
    }
    if let Some(reply) = reply {
        r.delivered_request(reply, until, now);
    }
    true
}
