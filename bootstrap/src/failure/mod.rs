//! Failure handling: what a peer failure is ([`PeerFailure`]), the handlers that hear of one,
//! and the error an operation fails with when a peer is lost.
//!
//! A rank is found dead when its connection ends without a goodbye, its listener refuses a
//! dial, a send to it breaks or stalls past the deadline, or a peer reports it lost.
//! [`record`] is how this rank records such a death in the bootstrap's state and floods the
//! news over every standing connection; [`view`] is what a view offers on top (the first
//! failure, failure handlers) and the report a failed collective sends to its schedule's
//! peers, so that ranks waiting on this one fail naming the dead rank rather than time out.
//! Deadlines themselves are each operation's (`BootstrapConfig::timeout`); the timeouts they
//! produce name the variable that sets them (`config::name_timeout_var`).

mod record;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use mscclpp_base::Error;

/// A handler of peer failures; it receives failures in the numbering of the bootstrap's
/// connections (the root view's ranks), translated by the view that registered it.
pub(super) type FailureHandler = Arc<dyn Fn(&PeerFailure) + Send + Sync>;

/// Handlers to call, with the failure, once no lock is held.
pub(super) type Deferred = (Vec<FailureHandler>, PeerFailure);

/// Calls failure handlers. A handler that panics is reported and the others still run: they
/// run on the event loop every bootstrap of the process depends on.
pub(super) fn run_handlers(deferred: Vec<Deferred>) {
    for (handlers, failure) in deferred {
        for h in handlers {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&failure)));
            if called.is_err() {
                tracing::error!(%failure, "a bootstrap failure handler panicked");
            }
        }
    }
}

/// A rank found dead: its connection ended without a goodbye, or a peer reported it lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    /// The dead rank (in the numbering of the view that reports it).
    pub rank: usize,
    /// Its bootstrap listen address.
    pub addr: SocketAddr,
    /// When this rank learned of it.
    pub at: Instant,
    /// How this rank learned of it, e.g. "its bootstrap connection closed: …" or
    /// "reported by rank 3: …".
    pub how: String,
}

impl std::fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} ({}) died ({})", self.rank, self.addr, self.how)
    }
}

pub(super) fn lost(peer: usize, reason: &str) -> Error {
    Error::Remote {
        rank: peer,
        message: format!("connection lost: {reason}"),
    }
}
