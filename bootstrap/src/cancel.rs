//! [`Cancel`]: how another thread ends a bootstrap that is still joining (NCCL's
//! `ncclCommAbort` of a communicator whose non-blocking init has not finished), instead of
//! leaving it to run to its deadline.
//!
//! A joining rank blocks in two places: connecting to the root (retried until the root
//! listens) and reading the root's answer, which comes only once every rank has joined. The
//! first checks the token between attempts; the second cannot be woken by a flag, so the token
//! keeps a handle on each connection the join has open and shuts it down, which ends the read
//! at once.

use std::fmt;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_base::{Error, Result};

/// A cancellation token shared by a bootstrap's join and whoever may cancel it. Clones share
/// one state; equality is identity.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    /// Connections the join has open (clones of their handles).
    open: Mutex<Vec<TcpStream>>,
}

impl Cancel {
    /// A token nobody has cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the join: its connections are shut down (a blocked read ends) and its next
    /// check fails. Cancelling twice, or after the join finished, does nothing more.
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        for s in self.lock().drain(..) {
            // The peer may have closed it already; nothing to do then.
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// An error naming `what` was being done if the join was cancelled.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        if self.is_cancelled() {
            return Err(cancelled(what));
        }
        Ok(())
    }

    /// Keeps a handle on `s` so that a cancel shuts it down; one cancelled already shuts it
    /// down now.
    pub(crate) fn watch(&self, s: &TcpStream) {
        let Ok(c) = s.try_clone() else {
            return;
        };
        let mut open = self.lock();
        if self.is_cancelled() {
            let _ = c.shutdown(Shutdown::Both);
        } else {
            open.push(c);
        }
    }

    /// Drops the handles kept (the join is over; its connections belong to others now).
    pub(crate) fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        // The vector stays consistent whatever panicked while holding it.
        self.0.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The error of a cancelled join.
pub(crate) fn cancelled(what: &str) -> Error {
    Error::invalid(format!(
        "the bootstrap was cancelled while {what} (the communicator was aborted during its init)"
    ))
}

impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cancel {}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
