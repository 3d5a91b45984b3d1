//! What a view offers on peer failures ([`Bootstrap::failure`], [`Bootstrap::on_failure`]),
//! and what a collective does when it fails because a rank was lost: it tells the peers of
//! this rank's schedule, so that the failure reaches every rank waiting on this one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::super::Bootstrap;
use super::super::config::{name_timeout_var, schedule_peers};
use super::super::protocol::{self, FrameKind};
use super::super::reactor::conn::frame;
use super::{FailureHandler, PeerFailure};

impl Bootstrap {
    /// Translates a failure in the connections' numbering into this view's; `None` when the
    /// dead rank is not a member of this view.
    pub(crate) fn in_view(&self, f: &PeerFailure) -> Option<PeerFailure> {
        let rank = self.members.iter().position(|&m| m == f.rank)?;
        Some(PeerFailure { rank, ..f.clone() })
    }

    /// The first rank of this view found dead — its bootstrap connection ended without a
    /// goodbye, or a peer reported it lost — whether or not any operation waited on it.
    pub fn failure(&self) -> Option<PeerFailure> {
        let st = self.shared().lock();
        st.failures.iter().find_map(|f| self.in_view(f))
    }

    /// Calls `handler` for every rank of this view found dead from now on (and at once for
    /// those already found), on the thread that learned it (the process's bootstrap event
    /// loop, or a thread waiting in an operation of this bootstrap): it must not block, and
    /// must not wait for a lock its operations' callers may hold. Returns an id for
    /// [`Bootstrap::remove_failure_handler`].
    pub fn on_failure(&self, handler: Box<dyn Fn(&PeerFailure) + Send + Sync>) -> u64 {
        let members = Arc::clone(&self.members);
        let wrapped: FailureHandler = Arc::new(move |f: &PeerFailure| {
            if let Some(rank) = members.iter().position(|&m| m == f.rank) {
                handler(&PeerFailure { rank, ..f.clone() });
            }
        });
        let mut st = self.shared().lock();
        let id = st.next_handler;
        st.next_handler += 1;
        st.handlers.push((id, Arc::clone(&wrapped)));
        let past = st.failures.clone();
        drop(st);
        for f in &past {
            wrapped(f);
        }
        id
    }

    /// Unregisters a handler of [`Bootstrap::on_failure`]; an unknown id is ignored.
    pub fn remove_failure_handler(&self, id: u64) {
        self.shared().lock().handlers.retain(|(h, _)| *h != id);
    }

    /// Runs a collective; if it fails because a rank was lost, tells the peers of this rank's
    /// schedule, so that ranks waiting on this one fail naming that rank rather than time out.
    pub(crate) fn coll<T>(&self, tag: u64, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        tracing::debug!(rank = self.rank, tag, op = name, "bootstrap collective");
        let r = f();
        if let Err(Error::Remote { rank, message }) = &r
            && *rank < self.nranks
        {
            self.report_loss(self.members[*rank], message);
        }
        r.map_err(name_timeout_var)
    }

    pub(crate) fn report_loss(&self, lost_rank: usize, message: &str) {
        let Some(r) = &self.shared().reactor else {
            return;
        };
        let frame = frame(
            FrameKind::Lost,
            0,
            &protocol::encode_lost(lost_rank, message),
        );
        let deadline = Instant::now() + self.cfg.timeout.min(Duration::from_secs(2));
        for p in schedule_peers(self.cfg.schedule, self.rank, self.nranks) {
            let peer = self.members[p];
            if peer == lost_rank {
                continue;
            }
            if let Ok(c) = self.link(peer, deadline) {
                let _ = c.send_nowait(r, frame.clone());
            }
        }
    }
}
