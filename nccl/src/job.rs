//! Work on a thread of its own (a communicator creation, a non-blocking finalize) that others
//! wait for, and how long they wait ([`job_deadline`]).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mscclpp::comm::{BootstrapConfig, Cancel};

use crate::abi::NCCL_REMOTE_ERROR;
use crate::error::{Failure, Res};

/// A communicator creation (or a non-blocking finalize) running on its own thread.
#[derive(Debug)]
pub struct Job {
    /// `None` while running, then its result.
    done: Mutex<Option<Res<()>>>,
    cv: Condvar,
    /// Ends a creation's bootstrap join early (`ncclCommAbort` of its pending handle).
    cancel: Cancel,
}

impl Job {
    /// A job that has not finished.
    pub fn new() -> Arc<Self> {
        Arc::new(Job {
            done: Mutex::new(None),
            cv: Condvar::new(),
            cancel: Cancel::new(),
        })
    }

    /// The token that cancels the job's bootstrap join.
    pub fn token(&self) -> Cancel {
        self.cancel.clone()
    }

    /// Cancels the job's bootstrap join, if it is still joining: it then fails at once.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Records the result and wakes the waiters.
    pub fn finish(&self, r: Res<()>) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    /// The result, if the job has finished.
    pub fn result(&self) -> Option<Res<()>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the job has finished or `deadline` passes (then an error saying so: the job
    /// goes on and settles its slot when it ends).
    pub fn wait(&self, deadline: Instant, what: &str) -> Res<()> {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Failure {
                    code: NCCL_REMOTE_ERROR,
                    message: format!(
                        "{what} did not finish before its deadline (the bootstrap's timeout, MSCCLPP_BOOTSTRAP_TIMEOUT, per step): a rank never joined?"
                    ),
                });
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// How long a group end or an init-all waits for creations it started: every step of a
/// creation is bounded by the bootstrap's timeout, and a creation takes a few of them.
pub fn job_deadline() -> Instant {
    let t = BootstrapConfig::from_env().map_or(Duration::from_secs(60), |c| c.timeout);
    Instant::now() + t.saturating_mul(3) + Duration::from_secs(10)
}
