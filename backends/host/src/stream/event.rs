//! Events of the host backend: a record marks a point in a stream (a generation), reached when
//! the worker gets there, and a wait (another stream's, or the caller's) blocks until it is.
//! Also [`relay`], the copy of an error that lets an event carry a failed stream's error to
//! its waiters (and the worker hand it to the jobs it skips).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, EventApi, Result};

#[derive(Debug, Default)]
pub(super) struct EventState {
    pub(super) recorded: u64,
    reached: u64,
    at: Option<Instant>,
    /// The error of the stream that reached the last generation, when it reached it skipping
    /// its work behind that error.
    failed: Option<Error>,
}

#[derive(Debug, Default)]
pub(super) struct EventInner {
    state: Mutex<EventState>,
    changed: Condvar,
}

impl EventInner {
    pub(super) fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `generation` reached (`failed`: behind that error of the recording stream).
    pub(super) fn reach(&self, generation: u64, failed: Option<Error>) {
        let mut s = self.lock();
        if generation > s.reached {
            s.reached = generation;
            s.at = Some(Instant::now());
            s.failed = failed;
        }
        drop(s);
        self.changed.notify_all();
    }

    pub(super) fn wait_for(&self, generation: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.reached < generation {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    waiting_for: "a host event".into(),
                    after: timeout,
                });
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match &s.failed {
            Some(e) => Err(relay(e)),
            None => Ok(()),
        }
    }
}

/// A copy of `e` for another stream (errors are not `Clone`: an I/O error keeps its kind and
/// message).
pub(super) fn relay(e: &Error) -> Error {
    match e {
        Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
        Error::Unavailable { what, reason } => Error::Unavailable {
            what: what.clone(),
            reason: reason.clone(),
        },
        Error::Io { context, source } => Error::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Driver {
            backend,
            call,
            code,
            message,
        } => Error::Driver {
            backend,
            call,
            code: *code,
            message: message.clone(),
        },
        Error::Timeout { waiting_for, after } => Error::Timeout {
            waiting_for: waiting_for.clone(),
            after: *after,
        },
        Error::Remote { rank, message } => Error::Remote {
            rank: *rank,
            message: message.clone(),
        },
        Error::Malformed { what, why } => Error::Malformed {
            what,
            why: why.clone(),
        },
        Error::Internal(m) => Error::Internal(m.clone()),
    }
}

/// An event of the host backend.
#[derive(Debug, Default)]
pub struct HostEvent {
    pub(super) inner: Arc<EventInner>,
}

impl EventApi for HostEvent {
    type A = crate::Host;

    fn query(&self) -> Result<bool> {
        let s = self.inner.lock();
        Ok(s.reached >= s.recorded)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        let generation = self.inner.lock().recorded;
        self.inner.wait_for(generation, timeout)
    }

    fn elapsed_ms_since(&self, start: &HostEvent) -> Result<f64> {
        let t0 = start.inner.lock().at;
        let t1 = self.inner.lock().at;
        match (t0, t1) {
            (Some(a), Some(b)) => Ok(if b >= a {
                (b - a).as_secs_f64() * 1e3
            } else {
                -((a - b).as_secs_f64() * 1e3)
            }),
            _ => Err(Error::invalid(
                "elapsed time asked of an event that has not been reached",
            )),
        }
    }
}
