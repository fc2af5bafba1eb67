//! One client's Socket.IO state on top of its Engine.IO session: which
//! namespaces it joined, binary attachments being collected, and the sids
//! the server assigns.

use crate::protocol::socketio::Reassembly;

/// Namespaces a client may join.
pub const NSP_ROOT: &str = "/";
pub const NSP_CONTROL: &str = "/control";

#[derive(Debug, Default)]
pub struct Session {
    /// Joined `/` (the messaging namespace).
    pub root: bool,
    /// Joined `/control`.
    pub control: bool,
    /// Joined `/control` with the cluster token (or none is set): may send
    /// the node-to-node events.
    pub peer: bool,
    pub attachments: Reassembly,
    /// Counter for server-assigned subscription sids.
    pub next_sid: u64,
    /// This socket's serial in `/` (see [`crate::routing::subs::Owner`]); a new one
    /// each time it joins, 0 while it is not in `/`.
    pub serial: u64,
    /// A subscribe was made under `serial` (it may still be on its way
    /// through the cluster when the socket closes).
    pub subscribed: bool,
    /// The user's rights while in `/`; `None` for every right.
    pub rights: Option<Box<crate::auth::ConnRights>>,
}

impl Session {
    pub fn joined_any(&self) -> bool {
        self.root || self.control
    }

    /// The next server-chosen sid not yet used by this socket.
    pub fn assign_sid(&mut self, taken: impl Fn(&str) -> bool) -> String {
        loop {
            self.next_sid += 1;
            let sid = format!("s{}", self.next_sid);
            if !taken(&sid) {
                return sid;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigned_sids_skip_taken_ones() {
        let mut s = Session::default();
        assert_eq!(s.assign_sid(|_| false), "s1");
        assert_eq!(s.assign_sid(|x| x == "s2"), "s3");
    }
}
