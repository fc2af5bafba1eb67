//! The rights one connection holds while its socket is in `/`: its user's
//! [`Rights`], the publish decisions made so far, the answers its
//! delivered requests allow, and the cuts of its subscriptions. A
//! connection with every right holds none of this (the broker keeps
//! `None`), so it pays nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::responses::Responses;
use super::rights::{Cuts, PubCache, Rights, StreamNeed, SubDecision};

#[derive(Debug)]
pub struct ConnRights {
    /// The user's name, for metrics and logs (never its token).
    pub user: Arc<str>,
    rights: Arc<Rights>,
    pubs: PubCache,
    responses: Responses,
    /// Cuts of this socket's subscriptions that have any, by sid.
    cuts: HashMap<Box<str>, Cuts>,
}

impl ConnRights {
    pub fn new(user: Arc<str>, rights: Arc<Rights>) -> ConnRights {
        ConnRights {
            user,
            rights,
            pubs: PubCache::default(),
            responses: Responses::default(),
            cuts: HashMap::new(),
        }
    }

    pub fn rights(&self) -> &Rights {
        &self.rights
    }

    /// New rights (a reload): decisions made under the old ones go. The
    /// caller re-decides the subscriptions with [`ConnRights::subscribe`].
    pub fn replace(&mut self, rights: Arc<Rights>) {
        self.rights = rights;
        self.pubs.clear();
        self.cuts.clear();
        if !self.rights.allow_responses {
            self.responses.clear();
        }
    }

    /// May this socket publish to `subject` now? An open answer to a
    /// delivered request is used up by it.
    pub fn may_publish(&mut self, subject: &str, now: Instant) -> bool {
        if self.pubs.allows(&self.rights.publish, subject) {
            return true;
        }
        self.rights.allow_responses && self.responses.take(subject, now)
    }

    /// Decides a subscription (sid, pattern) and keeps its cuts; false
    /// when it is forbidden.
    pub fn subscribe(&mut self, sid: &str, pattern: &str) -> bool {
        match self.rights.subscribe.decide_sub(pattern) {
            SubDecision::Forbidden => false,
            SubDecision::Allowed(cuts) => {
                if cuts.is_empty() {
                    self.cuts.remove(sid);
                } else {
                    self.cuts.insert(sid.into(), cuts);
                }
                true
            }
        }
    }

    /// True while some subscription of this socket has cuts.
    pub fn has_cuts(&self) -> bool {
        !self.cuts.is_empty()
    }

    /// May a message on `subject` reach subscription `sid`?
    pub fn deliverable(&self, sid: &str, subject: &str) -> bool {
        self.cuts.get(sid).is_none_or(|c| !c.denies(subject))
    }

    /// A request with reply subject `reply` was delivered to this socket.
    pub fn delivered_request(&mut self, reply: &str, until: Instant, now: Instant) {
        if self.rights.allow_responses {
            self.responses.grant(reply, until, now);
        }
    }

    /// May this stream event be used on `stream`?
    pub fn may_stream(&self, stream: &str, need: StreamNeed) -> bool {
        self.rights.may_stream(stream, need)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::rights::Rules;
    use std::time::Duration;

    fn conn(allow_pub: &[&str], allow_sub: &[&str], deny_sub: &[&str]) -> ConnRights {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        let mut r = Rights::all();
        r.publish = Rules::new(v(allow_pub), vec![]).unwrap();
        r.subscribe = Rules::new(v(allow_sub), v(deny_sub)).unwrap();
        ConnRights::new("u".into(), Arc::new(r))
    }

    #[test]
    fn answers_go_through_once_whatever_the_publish_list_says() {
        let now = Instant::now();
        let mut c = conn(&[], &["svc.>"], &[]);
        assert!(!c.may_publish("_INBOX.x.1", now));
        c.delivered_request("_INBOX.x.1", now + Duration::from_secs(1), now);
        assert!(c.may_publish("_INBOX.x.1", now));
        assert!(!c.may_publish("_INBOX.x.1", now), "one answer per request");
    }

    #[test]
    fn cuts_are_kept_per_subscription_and_reset_by_new_rights() {
        let mut c = conn(&[">"], &["orders.>"], &["orders.internal.>"]);
        assert!(c.subscribe("1", "orders.>"));
        assert!(c.subscribe("2", "orders.new"));
        assert!(!c.subscribe("3", "orders.internal.x"));
        assert!(c.has_cuts());
        assert!(!c.deliverable("1", "orders.internal.audit"));
        assert!(c.deliverable("1", "orders.new"));
        assert!(c.deliverable("2", "orders.new"));
        c.replace(Arc::new(Rights::all()));
        assert!(!c.has_cuts());
        assert!(c.subscribe("1", "orders.>"));
        assert!(c.deliverable("1", "orders.internal.audit"));
    }
}
