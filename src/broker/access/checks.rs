//! The broker applying users and rights: a CONNECT admitted as a user,
//! the `forbidden` answers and their counts, the rights a subscription or
//! a stream event needs, and the users file read again on SIGHUP.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;

use super::{Access, Admission};
use crate::auth::{rights, users, ConnRights, Rights, StreamNeed, Users};
use crate::broker::cluster::Listing;
use crate::broker::Broker;
use crate::cluster::api::Cmd;
use crate::port::{ConnId, Sink};
use crate::protocol::errors::{ApiError, Code};
use crate::routing::subs::Command;

impl Broker {
    /// Loads `-users` (nothing without it); an error stops the process.
    pub fn load_users(&mut self, path: Option<PathBuf>) -> Result<(), String> {
        self.access = Access::open(path)?;
        Ok(())
    }

    /// The flag a SIGHUP handler sets to have the users file read again
    /// (at the loop's next wake-up).
    pub fn reload_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.access.reload)
    }

    /// Who a CONNECT to `/` with `given` as its token is. `-auth-token`
    /// stays valid beside `-users` as a user with every right; in a
    /// cluster so is the cluster token, with which the other members'
    /// links relay their clients' events (rights are enforced on the
    /// node each client is connected to).
    pub(crate) fn admit_root(&self, given: &str) -> Admission {
        let holds = |t: &str| crate::crypto::token_eq(given.as_bytes(), t.as_bytes());
        let auth_token = self.cfg.auth_token.as_deref();
        let cluster_token = self.cluster.as_ref().and(self.cfg.cluster_token.as_deref());
        if auth_token.is_some_and(holds) || cluster_token.is_some_and(holds) {
            return Admission::All;
        }
        match &self.access.users {
            Some(users) => match users.find(given) {
                Some(u) => Admission::User(Box::new(ConnRights::new(
                    Arc::clone(&u.name),
                    Arc::clone(&u.rights),
                ))),
                None => Admission::Refused,
            },
            None if auth_token.is_some() => Admission::Refused,
            None => Admission::All,
        }
    }

    /// Counts and logs a refusal, and returns its error.
    fn forbid(&mut self, conn: ConnId, kind: &'static str, what: &str) -> ApiError {
        let user = self
            .sessions
            .get(conn)
            .and_then(Option::as_ref)
            .and_then(|s| s.rights.as_ref())
            .map_or_else(|| Arc::from("?"), |r| Arc::clone(&r.user));
        crate::log_debug!("conn {conn}: user {user:?} may not {kind} {what}");
        *self.access.forbidden.entry((user, kind)).or_default() += 1;
        ApiError::new(Code::Forbidden, format!("not allowed to {kind} {what}"))
    }

    fn conn_rights(&mut self, conn: ConnId) -> Option<&mut ConnRights> {
        self.sessions.get_mut(conn)?.as_mut()?.rights.as_deref_mut()
    }

    /// A `pub` or `request` to `subject` (kind names which, for counts).
    #[inline]
    pub(crate) fn check_publish(
        &mut self,
        conn: ConnId,
        kind: &'static str,
        subject: &str,
        now: Instant,
    ) -> Result<(), ApiError> {
        let allowed = self
            .conn_rights(conn)
            .is_none_or(|r| r.may_publish(subject, now));
        if allowed {
            Ok(())
        } else {
            Err(self.forbid(conn, kind, subject))
        }
    }

    /// A `sub`: decided once, its cuts kept for delivery.
    pub(crate) fn check_subscribe(
        &mut self,
        conn: ConnId,
        sid: &str,
        pattern: &str,
    ) -> Result<(), ApiError> {
        let Some(r) = self.conn_rights(conn) else {
            return Ok(());
        };
        let had = r.has_cuts();
        let ok = r.subscribe(sid, pattern);
        let has = r.has_cuts();
        self.count_cut_socket(had, has);
        if ok {
            Ok(())
        } else {
            Err(self.forbid(conn, "subscribe to", pattern))
        }
    }

    fn count_cut_socket(&mut self, had: bool, has: bool) {
        match (had, has) {
            (false, true) => self.access.cut_sockets += 1,
            (true, false) => self.access.cut_sockets = self.access.cut_sockets.saturating_sub(1),
            _ => {}
        }
    }

    /// A stream or consumer event: the stream it names must be among the
    /// user's, and administration needs `stream_admin`.
    pub(crate) fn check_stream(
        &mut self,
        conn: ConnId,
        event: &str,
        arg: Option<&RawValue>,
    ) -> Result<(), ApiError> {
        let Some((need, field)) = rights::stream_need(event) else {
            return Ok(());
        };
        let Some(r) = self.conn_rights(conn) else {
            return Ok(());
        };
        let name = arg
            .and_then(|a| serde_json::from_str::<serde_json::Value>(a.get()).ok())
            .and_then(|v| v.get(field)?.as_str().map(str::to_string));
        let Some(name) = name else {
            // No stream named: the event's own check answers bad_request,
            // and it cannot reach any stream.
            return Ok(());
        };
        if r.may_stream(&name, need) {
            return Ok(());
        }
        let kind = match need {
            StreamNeed::Use => "use stream",
            StreamNeed::Admin => "administer stream",
        };
        Err(self.forbid(conn, kind, &format!("{name:?} with {event}")))
    }

    /// A `stream.list` answer shows only the user's streams.
    pub(crate) fn filter_stream_list(&mut self, conn: ConnId, body: String) -> String {
        self.filter_list(conn, body, Listing::Streams)
    }

    /// A `stream.list` or `kv.list` answer shows only the entries whose
    /// stream is among the user's `streams`.
    pub(crate) fn filter_list(&mut self, conn: ConnId, body: String, listing: Listing) -> String {
        let Some(r) = self.conn_rights(conn) else {
            return body;
        };
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&body) else {
            return body;
        };
        if let Some(list) = v
            .get_mut(0)
            .and_then(|a| a.get_mut(listing.field()))
            .and_then(|s| s.as_array_mut())
        {
            list.retain(|s| {
                let name = listing.stream_of(s).unwrap_or_default();
                r.rights().streams.allows(&name)
            });
        }
        v.to_string()
    }

    /// This socket's rights end with it.
    pub(crate) fn end_rights(&mut self, conn: ConnId) {
        let had = self
            .sessions
            .get_mut(conn)
            .and_then(Option::as_mut)
            .and_then(|s| s.rights.take())
            .is_some_and(|r| r.has_cuts());
        self.count_cut_socket(had, false);
    }

    /// Takes a pending SIGHUP and reloads the users file.
    pub(crate) fn reload_if_asked(&mut self, sink: &mut dyn Sink) {
        if self.access.reload.swap(false, Ordering::AcqRel) {
            self.reload_users(sink);
        }
    }

    /// Reads the users file again. A file that does not parse changes
    /// nothing; otherwise the new rights hold from the next event, a user
    /// who is gone (or whose token changed) has its connections closed,
    /// and subscriptions the new rights forbid are removed through the
    /// same path as an unsubscribe.
    pub(crate) fn reload_users(&mut self, sink: &mut dyn Sink) {
        let Some(path) = self.access.path.clone() else {
            crate::log_info!("SIGHUP: no users file to reload");
            return;
        };
        let (fresh, loose) = match users::read(&path) {
            Ok(v) => v,
            Err(e) => {
                crate::log_error!("users file refused, the rights in force stay: {e}");
                return;
            }
        };
        if loose {
            crate::log_warn!(
                "users file {} may be read by its group or others; it holds tokens",
                path.display()
            );
        }
        let old = self.access.users.replace(fresh);
        let mut close = Vec::new();
        for (conn, slot) in self.sessions.iter_mut().enumerate() {
            let Some(r) = slot.as_mut().and_then(|s| s.rights.as_mut()) else {
                continue;
            };
            let now = self.access.users.as_ref().and_then(|u| u.by_name(&r.user));
            let before = old.as_ref().and_then(|u| u.by_name(&r.user));
            match (now, before) {
                (Some(n), Some(b)) if n.same_token(b) => r.replace(Arc::clone(&n.rights)),
                _ => {
                    // Nothing more until the close completes.
                    r.replace(Arc::new(Rights::none()));
                    close.push(conn);
                }
            }
        }
        let removed = self.redecide_subscriptions();
        self.access.cut_sockets = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| s.rights.as_ref().is_some_and(|r| r.has_cuts()))
            .count();
        crate::log_info!(
            "users file {} reloaded: {} users, {} connections closed, {} subscriptions removed",
            path.display(),
            self.access.users.as_ref().map_or(0, Users::len),
            close.len(),
            removed.len()
        );
        for cmd in removed {
            self.submit_internal(sink, Cmd::Subs(cmd));
        }
        for conn in close {
            sink.close(conn);
        }
    }

    /// Decides every local subscription of a socket with rights again;
    /// returns the unsubscribes for those now forbidden.
    fn redecide_subscriptions(&mut self) -> Vec<Command> {
        let mut removed = Vec::new();
        for s in self.fsm.subs.iter() {
            if !s.local {
                continue;
            }
            let Some(Some(session)) = self.sessions.get_mut(s.conn) else {
                continue;
            };
            if self.fsm.subs.local_owner(session.serial) != s.owner {
                continue;
            }
            let Some(r) = session.rights.as_mut() else {
                continue;
            };
            if !r.subscribe(&s.sid, &s.pattern) {
                removed.push(Command::Unsubscribe {
                    owner: s.owner,
                    sid: s.sid.to_string(),
                    after: None,
                });
            }
        }
        removed
    }
}
