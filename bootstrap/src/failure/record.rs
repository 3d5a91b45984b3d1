//! How this rank records a peer's death in its bootstrap's state, and floods the news.
//!
//! Called by whoever learns it: the event loop (a connection that ended, a Lost report), a
//! dial that was refused, a send that broke. Recording wakes every operation waiting in this
//! process (on the condition variable, in its own poll, or in a shared-memory barrier).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::protocol::{self, FrameKind};
use super::super::reactor::conn::{Conn, frame};
use super::super::state::{Link, Shared};
use super::{Deferred, FailureHandler, PeerFailure};

impl Shared {
    pub(crate) fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = self.lock();
        if let std::collections::hash_map::Entry::Vacant(e) = st.dead.entry(peer) {
            e.insert(reason);
            st.dead_order.push(peer);
        }
        // A link that ended is not used again; a dead peer is never redialled.
        st.links.remove(&peer);
        self.notify_failure(st);
    }

    /// Records that `peer` (a rank of the connections' numbering) died, learned `how`; the
    /// first time for that rank, forwards a Lost frame over every standing connection (so the
    /// news floods the job: the connections the init all-gather left form a connected graph
    /// even without any one rank) and returns the failure handlers to call (by the caller,
    /// once it holds no lock).
    pub(crate) fn peer_failed(&self, peer: usize, how: String) -> Option<Deferred> {
        if self.closing.load(Ordering::Acquire) || peer == self.rank || peer >= self.nranks {
            return None;
        }
        // Held until the news is forwarded: closing the bootstrap (which says goodbye to every
        // peer) waits for it, so no peer sees this rank's orderly exit before the failure.
        let _fwd = self.forwarding.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.lock();
        if st.failures.iter().any(|f| f.rank == peer) {
            return None;
        }
        let failure = PeerFailure {
            rank: peer,
            addr: self.table[peer],
            at: Instant::now(),
            how,
        };
        st.failures.push(failure.clone());
        let handlers: Vec<FailureHandler> =
            st.handlers.iter().map(|(_, h)| Arc::clone(h)).collect();
        let conns: Vec<(usize, Arc<Conn>)> = st
            .links
            .iter()
            .filter_map(|(&p, l)| match l {
                Link::Up(c) if p != peer && !st.dead.contains_key(&p) => Some((p, Arc::clone(c))),
                _ => None,
            })
            .collect();
        self.notify_failure(st);
        // Ranks of this host waiting in a shared-memory barrier learn it at once.
        self.post_failure(peer);
        tracing::warn!(rank = self.rank, dead = peer, how = %failure.how, "bootstrap peer failed");
        // Forwarded before the handlers run: a handler may end this rank's work, and the rank
        // may then exit before the news went on. Queued without waiting; what the kernel does
        // not take at once the event loop writes.
        if let Some(r) = &self.reactor {
            let frame = frame(
                FrameKind::Lost,
                0,
                &protocol::encode_lost(peer, &failure.how),
            );
            for (_, c) in conns {
                let _ = c.send_nowait(r, frame.clone());
            }
        }
        Some((handlers, failure))
    }
}
