//! The host proxy: a thread that consumes a [`Fifo`] of [`ProxyTrigger`]s in order and hands
//! each to a handler.
//!
//! A [`Proxy`] with a user handler is MSCCL++'s *custom proxy*; the port-channel service is
//! the same thing with a handler that moves data over connections.
//!
//! # Ordering and acknowledgement
//!
//! Triggers reach the handler strictly in FIFO order, one at a time, on the proxy thread. The
//! tail is advanced **after** the handler returns, so when a producer's
//! [`FifoDeviceHandle::sync`](mscclpp_hal::dev::FifoDeviceHandle::sync)`(pos)` returns, the
//! handler has finished with the trigger at `pos` (and every one before it), and whatever it
//! wrote is visible to the producer (release/acquire through the tail word).
//!
//! # Ending
//!
//! The proxy ends when its handler returns [`ProxyHandlerResult::Stop`] (that trigger counts as
//! handled), when its handler fails or panics (that trigger is **not** handled: its slot stays
//! occupied and a `sync` on it times out rather than lying), or when asked to with
//! [`Proxy::stop`]. A stop does not drain the FIFO: triggers still in it stay there, and a new
//! proxy started on the same FIFO carries on from the tail; [`Proxy::drain`] first waits for
//! them (the proxy service does at its stop).
//!
//! # Idling
//!
//! With work in the FIFO the loop does no more per trigger than a relaxed load of the stop flag,
//! the acquire load of the slot, the handler call and a release store of the tail. When the
//! FIFO is empty it polls flat out (yielding the core every 64 polls, so a producer sharing it
//! can run) for [`ProxyConfig::busy_poll`], then sleeps between polls, doubling the sleep up to
//! [`ProxyConfig::max_sleep`]. Any trigger resets it to polling flat out.

mod fifo;
mod observer;
mod service;

#[cfg(test)]
mod tests;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::dev::ProxyTrigger;
use mscclpp_hal::{Error, Result};

pub use fifo::{DEFAULT_FIFO_SIZE, Fifo, MAX_FIFO_SIZE};
pub use observer::{ProxyObserver, ProxyOpInfo};
pub use service::{FLUSH_TIMEOUT, MemoryId, ProxyService, SemaphoreId};

/// Name of every proxy thread (as seen by `top -H`, debuggers and panic messages).
pub const PROXY_THREAD_NAME: &str = "mscclpp-proxy";

/// First sleep of an idle proxy once it stops polling flat out: near the shortest sleep the OS
/// timer honours (Linux's default timer slack is 50 µs).
const MIN_SLEEP: Duration = Duration::from_micros(20);

/// What the handler tells the proxy after a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHandlerResult {
    /// Go on with the next trigger.
    Continue,
    /// The trigger is handled; end the proxy thread.
    Stop,
}

/// How an idle proxy waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// How long the proxy keeps polling flat out after its last trigger before it sleeps.
    /// Triggers within this window are picked up within a fraction of a microsecond; the
    /// price is a busy core for that long after each burst of work.
    pub busy_poll: Duration,
    /// Longest sleep between polls of an idle proxy: the worst extra latency of the first
    /// trigger after a long idle, traded against the CPU an idle proxy uses.
    pub max_sleep: Duration,
}

impl Default for ProxyConfig {
    /// 1 ms of busy polling, sleeps of at most 1 ms (see the crate tests for measured costs).
    fn default() -> Self {
        ProxyConfig {
            busy_poll: Duration::from_millis(1),
            max_sleep: Duration::from_millis(1),
        }
    }
}

/// State shared between a [`Proxy`] and its thread.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    state: Mutex<State>,
    ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Whether the thread has finished.
    finished: bool,
    /// How it finished, until taken by `stop`/`join`.
    outcome: Option<Result<()>>,
    /// The message of the error it finished with, for `Proxy::error`.
    error: Option<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data written in one step, so a panic elsewhere cannot leave it
        // half-updated: carry on with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running proxy thread consuming one [`Fifo`].
///
/// Dropping it stops the thread as [`Proxy::stop`] does, logging (with `tracing`) an error
/// the handler returned that nobody collected.
#[derive(Debug)]
pub struct Proxy {
    fifo: Arc<Fifo>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy thread on `fifo` with the default [`ProxyConfig`].
    ///
    /// `handler(trigger, pos)` is called for each trigger in FIFO order, on the proxy thread,
    /// with the trigger (without its parity bit) and its FIFO position (what the producer's
    /// `push` returned; a service can use it to tell which `sync` a trigger answers). See
    /// the [module documentation](self) for what its results do.
    ///
    /// Fails if another proxy is consuming `fifo` or the thread cannot be started.
    pub fn start<H>(fifo: Arc<Fifo>, handler: H) -> Result<Proxy>
    where
        H: FnMut(ProxyTrigger, u64) -> Result<ProxyHandlerResult> + Send + 'static,
    {
        Self::start_with(fifo, ProxyConfig::default(), handler)
    }

    /// [`Proxy::start`] with an explicit idle behaviour.
    pub fn start_with<H>(fifo: Arc<Fifo>, config: ProxyConfig, mut handler: H) -> Result<Proxy>
    where
        H: FnMut(ProxyTrigger, u64) -> Result<ProxyHandlerResult> + Send + 'static,
    {
        if !fifo.claim_consumer() {
            return Err(Error::invalid(format!(
                "the proxy FIFO at {:?} already has a running proxy: a FIFO has one consumer",
                fifo.triggers_buffer().ptr()
            )));
        }
        let shared = Arc::new(Shared::default());
        let thread = {
            let (fifo, shared) = (Arc::clone(&fifo), Arc::clone(&shared));
            std::thread::Builder::new()
                .name(PROXY_THREAD_NAME.to_owned())
                .spawn(move || {
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        run(&fifo, &shared, config, &mut handler)
                    }))
                    .unwrap_or_else(|panic| {
                        Err(Error::Internal(format!(
                            "proxy handler panicked at FIFO position {}: {}",
                            fifo.tail(),
                            panic_message(&*panic)
                        )))
                    });
                    // Give the FIFO back before announcing the end, so that once `stop`
                    // returns a new proxy can start on it.
                    fifo.release_consumer();
                    let mut st = shared.lock();
                    if let Err(e) = &outcome {
                        tracing::error!(position = fifo.tail(), "proxy stopped: {e}");
                        st.error = Some(e.to_string());
                    }
                    st.outcome = Some(outcome);
                    st.finished = true;
                    shared.ended.notify_all();
                })
        };
        match thread {
            Ok(t) => Ok(Proxy {
                fifo,
                shared,
                thread: Some(t),
            }),
            Err(e) => {
                fifo.release_consumer();
                Err(Error::io("starting the proxy thread", e))
            }
        }
    }

    /// The FIFO it consumes.
    pub fn fifo(&self) -> &Arc<Fifo> {
        &self.fifo
    }

    /// Whether the thread is still running (false once the handler stopped or failed).
    pub fn is_running(&self) -> bool {
        !self.shared.lock().finished
    }

    /// The message of the error the proxy ended with, if it ended with one. The error itself
    /// is returned by [`Proxy::stop`] or [`Proxy::join`].
    pub fn error(&self) -> Option<String> {
        self.shared.lock().error.clone()
    }

    /// Waits until every trigger claimed so far is handled, the proxy ends, or `timeout`;
    /// whether the FIFO was drained. A kernel's last triggers (a signal it does not wait for)
    /// can still be queued when the kernel is done: an owner that stops the proxy at teardown
    /// drains first, or those triggers are never carried out and the peer waits for them.
    pub fn drain(&self, timeout: Duration) -> bool {
        let target = self.fifo.head();
        let deadline = Instant::now() + timeout;
        loop {
            if self.fifo.tail() >= target {
                return true;
            }
            if !self.is_running() || Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Asks the thread to finish and waits for it, for at most
    /// [`mscclpp_hal::dev::DEFAULT_WAIT`]; see [`Proxy::stop_timeout`].
    pub fn stop(self) -> Result<()> {
        self.stop_timeout(mscclpp_hal::dev::DEFAULT_WAIT)
    }

    /// Asks the thread to finish and waits for it, for at most `timeout`.
    ///
    /// An idle proxy, or one between triggers, stops within microseconds. The thread checks
    /// the request only between triggers, so a handler that does not return keeps it running:
    /// after `timeout` this returns `Error::Timeout` naming the position being handled and
    /// leaves the thread detached (it still owns its `Arc<Fifo>`, so the memory stays valid,
    /// and it ends as soon as the handler returns).
    ///
    /// Returns the handler's error (or panic, as `Error::Internal`) if the proxy ended with one.
    pub fn stop_timeout(mut self, timeout: Duration) -> Result<()> {
        self.shutdown(Some(timeout))
    }

    /// Waits, without asking it to stop, until the proxy ends by itself (its handler returned
    /// [`ProxyHandlerResult::Stop`] or failed), and returns how it ended.
    pub fn join(mut self) -> Result<()> {
        self.shutdown(None)
    }

    fn shutdown(&mut self, timeout: Option<Duration>) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if timeout.is_some() {
            self.shared.stop.store(true, Ordering::Relaxed);
            // Cut an idle sleep short.
            thread.thread().unpark();
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.shared.lock();
        while !st.finished {
            st = match deadline {
                None => self
                    .shared
                    .ended
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        drop(st);
                        // Dropping the handle detaches the thread; see `stop_timeout`.
                        drop(thread);
                        return Err(Error::Timeout {
                            waiting_for: format!(
                                "the proxy handler of FIFO position {} to return so the proxy thread can stop",
                                self.fifo.tail()
                            ),
                            after: timeout.unwrap_or_default(),
                        });
                    }
                    self.shared
                        .ended
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        let outcome = st.outcome.take().unwrap_or(Ok(()));
        drop(st);
        // The thread has announced its end and only returns now: a short join.
        if thread.join().is_err() {
            return Err(Error::Internal(
                "the proxy thread panicked outside its handler".into(),
            ));
        }
        outcome
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.shutdown(Some(mscclpp_hal::dev::DEFAULT_WAIT)) {
                tracing::warn!("proxy dropped: {e}");
            }
        }
    }
}

/// The proxy loop: returns when asked to stop, when the handler says stop, or with its error.
fn run<H>(fifo: &Fifo, shared: &Shared, config: ProxyConfig, handler: &mut H) -> Result<()>
where
    H: FnMut(ProxyTrigger, u64) -> Result<ProxyHandlerResult>,
{
    // Kept here rather than re-read from the shared tail word: we are its only writer.
    let mut pos = fifo.tail();
    let mut idle = Idle::new(config);
    loop {
        // At process exit the FIFO's host-mapped memory may be gone (`mscclpp_hal::exit`).
        if shared.stop.load(Ordering::Relaxed) || mscclpp_hal::exit::exiting() {
            return Ok(());
        }
        let Some(trigger) = fifo.poll_at(pos) else {
            idle.wait();
            continue;
        };
        idle.reset();
        let result = handler(trigger, pos)?;
        pos += 1;
        fifo.pop_to(pos);
        if result == ProxyHandlerResult::Stop {
            return Ok(());
        }
    }
}

/// The back-off of an idle proxy (see the module documentation).
struct Idle {
    config: ProxyConfig,
    polls: u32,
    since: Option<Instant>,
    sleep: Option<Duration>,
}

impl Idle {
    fn new(config: ProxyConfig) -> Self {
        Idle {
            config,
            polls: 0,
            since: None,
            sleep: None,
        }
    }

    #[inline]
    fn reset(&mut self) {
        if self.polls != 0 {
            self.polls = 0;
            self.since = None;
            self.sleep = None;
        }
    }

    #[cold]
    fn wait(&mut self) {
        if let Some(sleep) = self.sleep {
            // A stop request unparks us, so it does not wait for the sleep to end.
            std::thread::park_timeout(sleep);
            self.sleep = Some((sleep * 2).min(self.config.max_sleep));
            return;
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 64 != 0 {
            std::hint::spin_loop();
            return;
        }
        // Reading the clock only every 64 polls keeps it off the polling path.
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < self.config.busy_poll {
            std::thread::yield_now();
        } else {
            self.sleep = Some(MIN_SLEEP.min(self.config.max_sleep));
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
