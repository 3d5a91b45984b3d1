//! The state a rank's bootstrap shares among all its views, the event loop and the threads in
//! its operations: the connections by peer, the messages filed by `(view, peer, tag)`, the
//! peers found dead, the failure handlers; and the closing of it all when the last view is
//! dropped (the news of failures, then a goodbye on every connection).
//!
//! The state is above the event loop: it holds the loop and its connections and uses them
//! (to close, to send its news), while the loop knows it only as an `Endpoint`, implemented
//! in `inbound`, which files into this state what the loop reads.
//!
//! Lock order (see `reactor` and `inbound`): a connection's `rx`, then `forwarding`, then
//! `state`, then a connection's `tx`.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::config::BootstrapConfig;
use super::failure::{FailureHandler, PeerFailure};
use super::protocol::{self, FrameKind};
use super::reactor::Reactor;
use super::reactor::conn::{Conn, frame};
use super::shm::segment::Registered;

/// Owns the connections of a bootstrap and every view of it; dropping the last view closes
/// them.
pub(super) struct Core {
    pub(super) shared: Arc<Shared>,
    /// Counts this bootstrap among its id's in this process (see `successor`).
    pub(super) _member: super::successor::Member,
}

pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) secret: [u8; protocol::SECRET_BYTES],
    /// Listen address of every rank, from the root.
    pub(super) table: Vec<SocketAddr>,
    pub(super) listen: SocketAddr,
    /// This rank's listener (non-blocking, in the event loop's set while `nranks > 1`).
    pub(super) listener: TcpListener,
    /// The listener's token in the event loop.
    pub(super) listen_token: u64,
    /// The process's event loop; `None` for a bootstrap of one rank, which has no peers.
    pub(super) reactor: Option<Arc<Reactor>>,
    pub(super) cfg: BootstrapConfig,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    pub(super) closing: AtomicBool,
    /// Inbound handshakes in progress (bounded by `hello::MAX_PENDING_HELLOS`).
    pub(super) handshakes: AtomicUsize,
    /// Held while a failure is forwarded (see [`Shared::peer_failed`]).
    pub(super) forwarding: Mutex<()>,
    /// This rank's host identity (`MSCCLPP_HOSTID`, else the boot id, else the host name).
    pub(super) host_id: String,
    /// The shared-memory barrier segments of this rank's views, with each view's members
    /// (bootstrap ranks): a death is written into those it concerns.
    pub(super) segments: Mutex<Vec<Registered>>,
    /// This rank's last call, as surveys report it.
    pub(super) progress: super::progress::Record,
    /// The last survey id this rank used.
    pub(super) surveys: AtomicU64,
}

/// A connection to one peer.
pub(super) enum Link {
    /// Being dialled by this rank.
    Dialling,
    /// Open.
    Up(Arc<Conn>),
}

pub(super) struct State {
    /// Messages by (communicator id, peer, tag).
    pub(super) queues: HashMap<(u64, usize, u64), VecDeque<Vec<u8>>>,
    /// Surveys of this rank still waiting for answers (others' answers are dropped).
    pub(super) open_surveys: std::collections::HashSet<u64>,
    /// Open or opening connections; absent: none yet. Sparse: a rank talks to few peers.
    pub(super) links: HashMap<usize, Link>,
    /// Why each peer's connection ended (or the peer was reported lost), if it did.
    pub(super) dead: HashMap<usize, String>,
    /// Dead peers in the order their connections ended: a collective names the first, which is
    /// the cause when the others only followed it.
    pub(super) dead_order: Vec<usize>,
    /// Peers that reported an operation failed because of another rank: (that rank, why).
    pub(super) reported: HashMap<usize, (usize, String)>,
    /// Every connection in the event loop, by token (open links, and any not yet seen to end).
    pub(super) conns: HashMap<u64, Arc<Conn>>,
    /// Threads waiting on `Shared::cv`: a change wakes them only when there are some.
    pub(super) cv_waiters: usize,
    /// Connections opened so far (either direction).
    pub(super) opened: usize,
    /// Ranks known to have died (not merely left in order), first learned first, with how.
    pub(super) failures: Vec<PeerFailure>,
    /// Failure handlers ([`Bootstrap::on_failure`]) by id.
    pub(super) handlers: Vec<(u64, FailureHandler)>,
    pub(super) next_handler: u64,
}

impl Shared {
    /// A fresh survey id, open for answers until [`Shared::close_survey`].
    pub(super) fn next_survey(&self) -> u64 {
        let id = self.surveys.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().open_surveys.insert(id);
        id
    }

    /// Closes survey `id`: its queued answers are dropped, and later ones on arrival.
    pub(super) fn close_survey(&self, id: u64, st: &mut State) {
        st.open_surveys.remove(&id);
        st.queues
            .retain(|&(view, _, tag), _| view != super::progress::SURVEY_COMM || tag != id);
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // State stays consistent across a panicking holder: every update is a single insert.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the threads waiting on the condition variable, if any (decided under the lock).
    pub(super) fn notify(&self, st: MutexGuard<'_, State>) {
        let waiting = st.cv_waiters > 0;
        drop(st);
        if waiting {
            self.cv.notify_all();
        }
    }

    /// As [`Shared::notify`], for a change that fails operations (a death, a report): the
    /// thread polling its own connections is woken too.
    pub(super) fn notify_failure(&self, st: MutexGuard<'_, State>) {
        self.notify(st);
        if let Some(r) = &self.reactor {
            r.wake_poller();
        }
    }

    /// The largest payload a peer may send (a message and its view id).
    pub(super) fn max_payload(&self) -> usize {
        self.cfg.max_frame_bytes + protocol::COMM_ID_BYTES
    }

    pub(super) fn wait<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> (MutexGuard<'a, State>, bool) {
        let now = Instant::now();
        if now >= deadline {
            return (st, false);
        }
        st.cv_waiters += 1;
        let mut st = self
            .cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        st.cv_waiters -= 1;
        (st, true)
    }
}

/// A bootstrap's connection count, for the scale benchmark and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    /// Connections open now.
    pub open: usize,
    /// Connections opened since the rendezvous (either direction).
    pub opened: usize,
}

impl Drop for Core {
    fn drop(&mut self) {
        let sh = &self.shared;
        let Some(r) = &sh.reactor else {
            return;
        };
        let fwd = sh.forwarding.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = sh.lock();
        sh.closing.store(true, Ordering::Release);
        st.handlers.clear();
        // The failures this rank knows of go before its goodbye on every link: a link opened
        // after the news was flooded has not carried it, and a peer that saw only the goodbye
        // in the middle of an operation would blame this rank's orderly exit instead of the
        // dead one (the chaos test caught 2 such survivors in 1 026).
        let news: Vec<Vec<u8>> = st
            .failures
            .iter()
            .map(|f| frame(FrameKind::Lost, 0, &protocol::encode_lost(f.rank, &f.how)))
            .collect();
        for l in st.links.values() {
            if let Link::Up(c) = l {
                for f in &news {
                    let _ = c.send_nowait(r, f.clone());
                }
                // Tells the peer this end is orderly, not a death.
                let _ = c.send_nowait(r, frame(FrameKind::Bye, 0, &[]));
            }
        }
        let conns: Vec<Arc<Conn>> = st.conns.drain().map(|(_, c)| c).collect();
        drop(st);
        drop(fwd);
        r.remove_listener(&**sh);
        // What the kernel did not take at once (a goodbye is a few bytes into an almost always
        // empty buffer) is written here, within the bootstrap's deadline, before the shutdown.
        let deadline = Instant::now() + sh.cfg.timeout;
        for c in &conns {
            c.flush_until(deadline);
            r.remove_conn(c);
            c.shutdown();
        }
    }
}
