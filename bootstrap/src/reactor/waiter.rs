//! The side of the event loop an operation takes: a thread waiting for messages reads the
//! connections it waits on itself (one thread per process at a time, the *poller*), so that a
//! message wakes the thread that wants it and no other; everything is given back to the loop
//! when the wait ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::conn::Conn;
use super::endpoint::Endpoint;
use super::{Reactor, timespec};

/// The connections one waiting operation reads itself, and the process's poller slot; both are
/// given back to the loop when it is dropped.
pub(crate) struct Waiter<'a> {
    /// The rank the owned connections' frames go to.
    ep: &'a dyn Endpoint,
    /// `None` for a bootstrap of one rank (no loop, nothing to read).
    r: Option<&'a Reactor>,
    owned: Vec<Arc<Conn>>,
    poller: bool,
}

impl<'a> Waiter<'a> {
    /// A waiter for `ep`'s connections in the loop `r` (`None`: a rank without peers).
    pub(crate) fn new(ep: &'a dyn Endpoint, r: Option<&'a Reactor>) -> Self {
        Waiter {
            ep,
            r,
            owned: Vec::new(),
            poller: false,
        }
    }

    /// Whether this waiter holds anything to give back.
    pub(crate) fn holds(&self) -> bool {
        self.poller || !self.owned.is_empty()
    }

    /// Whether this waiter reads every one of `conns` already.
    pub(crate) fn owns_all(&self, conns: &[Arc<Conn>]) -> bool {
        self.poller
            && conns
                .iter()
                .all(|c| self.owned.iter().any(|o| Arc::ptr_eq(o, c)))
    }

    /// Takes the poller slot and the reading of `conns`; false, holding nothing, when another
    /// thread has either.
    pub(crate) fn take(&mut self, conns: &[Arc<Conn>]) -> bool {
        let Some(r) = self.r else {
            return false;
        };
        if !self.poller {
            if r.poller
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return false;
            }
            self.poller = true;
        }
        for c in conns {
            if self.owned.iter().any(|o| Arc::ptr_eq(o, c)) {
                continue;
            }
            if !c.acquire(r) {
                self.release();
                return false;
            }
            self.owned.push(Arc::clone(c));
        }
        true
    }

    /// Waits until one of the owned connections has input (and reads it), the loop reports a
    /// failure, or `deadline`.
    pub(crate) fn poll(&mut self, deadline: Instant) {
        let Some(r) = self.r else {
            return;
        };
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = self
                .owned
                .iter()
                .map(|c| PollFd::new(&c.stream, PollFlags::IN))
                .collect();
            fds.push(PollFd::new(&r.wake, PollFlags::IN));
            let left = deadline.saturating_duration_since(Instant::now());
            match rustix::event::poll(&mut fds, Some(&timespec(left))) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => return,
                Err(e) => {
                    // Not expected; the state is looked at again, so do not spin.
                    tracing::debug!(error = %e, "bootstrap poll failed");
                    std::thread::sleep(Duration::from_millis(1));
                    return;
                }
            }
            fds.iter().map(|f| !f.revents().is_empty()).collect()
        };
        if ready.last() == Some(&true) {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&r.wake, &mut b);
        }
        let mut ended = Vec::new();
        for (i, c) in self.owned.iter().enumerate() {
            if ready[i] && c.read_owned(self.ep, r) {
                ended.push(i);
            }
        }
        for i in ended.into_iter().rev() {
            self.owned.swap_remove(i);
        }
    }

    /// Gives everything back to the loop.
    pub(crate) fn release(&mut self) {
        let Some(r) = self.r else {
            return;
        };
        for c in self.owned.drain(..) {
            c.release(r);
        }
        if self.poller {
            self.poller = false;
            r.poller.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
