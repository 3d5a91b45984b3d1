//! The bootstrap's event loop and its connections: the loop itself is here (the epoll set,
//! what each descriptor is, accepting on the listeners); `handshake` checks an accepted
//! connection's Hello, `conn` is one connection (write queue, frame reader), and `waiter` is
//! the side an operation takes to read its own connections.
//!
//! One thread per process (started with the first bootstrap of more than one rank, shared by
//! every bootstrap of the process) waits on one `epoll` set holding every rank listener, every
//! handshake in progress and every bootstrap connection. Sockets are non-blocking; each
//! connection has its own read state (a frame being assembled) and write queue.
//!
//! A thread waiting in an operation (`wait_all`) reads the connections it waits on itself: it
//! takes them out of the loop's set ([`Waiter`](waiter::Waiter)), polls them, and gives them back when the
//! operation ends. A message then wakes only the thread that wants it, where a reader thread
//! per connection (or a loop feeding a condition variable) wakes two: with a thousand ranks
//! on two cores the number of wake-ups, not the depth of the schedule, sets the time. The loop
//! keeps reading every connection no operation is waiting on, so a peer's death is still seen
//! at once with no operation running.
//!
//! Lock order: a connection's `rx`, then the bootstrap's `forwarding`, then its `State`, then
//! a connection's `tx`. Failure handlers run with no lock held.

pub(super) mod conn;
mod handshake;
pub(super) mod waiter;

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};
use rustix::event::{EventfdFlags, Timespec, epoll};

use super::hello::{self, Pending};
use super::protocol::ErrorCode;
use super::state::Shared;
use conn::Conn;

/// Connections accepted per listener event, so that handshakes and data get turns in between.
const ACCEPTS_PER_PASS: usize = 64;

/// How long a listener that failed to accept (out of descriptors and the like) rests.
const LISTENER_REST: Duration = Duration::from_millis(10);

/// Events taken from the kernel per wait.
const EVENTS: usize = 256;

/// Stack of the loop thread: it decodes frames in a 16 KiB buffer and calls failure handlers.
const LOOP_STACK: usize = 512 << 10;

/// The process's event loop: its epoll set, what each registered descriptor is, and the
/// eventfd that wakes the thread polling in an operation.
pub(super) struct Reactor {
    ep: OwnedFd,
    /// Written when a bootstrap learns of a failure: a thread polling its own connections
    /// ([`Waiter`](waiter::Waiter)) would otherwise not look at the state the loop changed.
    wake: OwnedFd,
    entries: Mutex<HashMap<u64, Entry>>,
    next_token: AtomicU64,
    /// Whether a thread polls its connections now. One at a time per process: it alone drains
    /// `wake`; other waiters wait on their bootstrap's condition variable.
    poller: AtomicBool,
    /// The process that started the loop: after a fork the child starts its own.
    pid: u32,
}

#[derive(Clone)]
enum Entry {
    Listener(Weak<Shared>),
    Conn(Arc<Conn>, Weak<Shared>),
}

/// A connection whose Hello is still arriving (the loop thread's alone).
struct Handshake {
    pending: Pending,
    shared: Weak<Shared>,
}

static REACTOR: Mutex<Option<Arc<Reactor>>> = Mutex::new(None);

/// The process's event loop, started on first use.
pub(super) fn reactor() -> Result<Arc<Reactor>> {
    let mut g = REACTOR.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some(r) = g.as_ref()
        && r.pid == pid
    {
        return Ok(Arc::clone(r));
    }
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
        .map_err(|e| Error::io("creating the bootstrap's epoll set", e.into()))?;
    let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(|e| Error::io("creating the bootstrap's eventfd", e.into()))?;
    let r = Arc::new(Reactor {
        ep,
        wake,
        entries: Mutex::new(HashMap::new()),
        next_token: AtomicU64::new(1),
        poller: AtomicBool::new(false),
        pid,
    });
    let r2 = Arc::clone(&r);
    std::thread::Builder::new()
        .name("mscclpp-bs-loop".into())
        .stack_size(LOOP_STACK)
        .spawn(move || r2.run())
        .map_err(|e| Error::io("starting the bootstrap's event loop thread", e))?;
    *g = Some(Arc::clone(&r));
    Ok(r)
}

fn timespec(d: Duration) -> Timespec {
    Timespec::try_from(d).unwrap_or(Timespec {
        tv_sec: i64::MAX / 2,
        tv_nsec: 0,
    })
}

impl Reactor {
    /// A token no other descriptor of the loop has had.
    pub(super) fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        // Every update is a single insert or remove: consistent across a panicking holder.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the thread polling in an operation, if any, to look at its bootstrap's state.
    pub(super) fn wake_poller(&self) {
        if self.poller.load(Ordering::SeqCst) {
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// Adds a rank's listener (under `sh.listen_token`).
    pub(super) fn add_listener(&self, sh: &Arc<Shared>) -> Result<()> {
        sh.listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("making this rank's bootstrap listener non-blocking", e))?;
        let token = sh.listen_token;
        self.entries()
            .insert(token, Entry::Listener(Arc::downgrade(sh)));
        let flags = epoll::EventFlags::IN | epoll::EventFlags::ONESHOT;
        if let Err(e) = epoll::add(
            &self.ep,
            &sh.listener,
            epoll::EventData::new_u64(token),
            flags,
        ) {
            self.entries().remove(&token);
            return Err(Error::io(
                "adding this rank's bootstrap listener to the event loop",
                e.into(),
            ));
        }
        Ok(())
    }

    /// Removes a closing bootstrap's listener.
    pub(super) fn remove_listener(&self, sh: &Shared) {
        let _ = epoll::delete(&self.ep, &sh.listener);
        self.entries().remove(&sh.listen_token);
    }

    /// Adds an open connection (`in_set`: its descriptor is in the set already, under the same
    /// token, as a handshake was).
    pub(super) fn add_conn(&self, c: &Arc<Conn>, sh: &Arc<Shared>, in_set: bool) -> Result<()> {
        self.entries()
            .insert(c.token, Entry::Conn(Arc::clone(c), Arc::downgrade(sh)));
        let tx = c.tx();
        let flags = c.interest(&tx);
        let data = epoll::EventData::new_u64(c.token);
        let r = if in_set {
            epoll::modify(&self.ep, &c.stream, data, flags)
        } else {
            epoll::add(&self.ep, &c.stream, data, flags)
        };
        drop(tx);
        r.map_err(|e| {
            self.entries().remove(&c.token);
            Error::io(
                format!(
                    "adding the connection with rank {} to the event loop",
                    c.peer
                ),
                e.into(),
            )
        })
    }

    /// Takes a connection out of the loop for good (it ended, or its bootstrap is closing).
    pub(super) fn remove_conn(&self, c: &Conn) {
        let _ = epoll::delete(&self.ep, &c.stream);
        self.entries().remove(&c.token);
    }

    fn run(self: Arc<Self>) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(EVENTS);
        let mut hs: HashMap<u64, Handshake> = HashMap::new();
        // Listeners resting after a failed accept: when to re-arm them.
        let mut resting: Vec<(Instant, u64, Weak<Shared>)> = Vec::new();
        loop {
            let now = Instant::now();
            let next = hs
                .values()
                .map(|h| h.pending.deadline)
                .chain(resting.iter().map(|r| r.0))
                .min();
            // Rounded up, so that a deadline is past when the wait returns.
            let ts =
                next.map(|t| timespec(t.saturating_duration_since(now) + Duration::from_millis(1)));
            events.clear();
            if let Err(e) = epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                ts.as_ref(),
            ) && e != rustix::io::Errno::INTR
            {
                tracing::warn!(error = %e, "bootstrap event loop: epoll_wait failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            for ev in events.drain(..) {
                let (flags, data) = (ev.flags, ev.data);
                // Every bootstrap of the process depends on this thread: a bug met on one
                // connection must not stop the others.
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.event(data.u64(), flags, &mut hs, &mut resting)
                }));
                if handled.is_err() {
                    tracing::error!(
                        token = data.u64(),
                        "bootstrap event loop: handling an event panicked"
                    );
                }
            }
            self.expire(&mut hs, &mut resting);
        }
    }

    fn event(
        &self,
        token: u64,
        flags: epoll::EventFlags,
        hs: &mut HashMap<u64, Handshake>,
        resting: &mut Vec<(Instant, u64, Weak<Shared>)>,
    ) {
        if let Some(h) = hs.get_mut(&token) {
            if let Some(result) = h.pending.poll() {
                if let Some(h) = hs.remove(&token) {
                    if let Some(sh) = h.shared.upgrade() {
                        sh.handshakes.fetch_sub(1, Ordering::AcqRel);
                        self.finish_handshake(&sh, token, h.pending, result, true);
                    } else {
                        let _ = epoll::delete(&self.ep, &h.pending.stream);
                    }
                }
            }
            return;
        }
        let entry = self.entries().get(&token).cloned();
        match entry {
            Some(Entry::Listener(w)) => match w.upgrade() {
                Some(sh) => self.accept(token, &sh, hs, resting),
                None => {
                    self.entries().remove(&token);
                }
            },
            Some(Entry::Conn(c, w)) => match w.upgrade() {
                Some(sh) => c.on_loop_event(&sh, self, flags),
                None => {
                    c.shutdown();
                    self.remove_conn(&c);
                }
            },
            None => {}
        }
    }

    fn accept(
        &self,
        token: u64,
        sh: &Arc<Shared>,
        hs: &mut HashMap<u64, Handshake>,
        resting: &mut Vec<(Instant, u64, Weak<Shared>)>,
    ) {
        for _ in 0..ACCEPTS_PER_PASS {
            match sh.listener.accept() {
                Ok((stream, from)) => self.accepted(sh, stream, from, hs),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    if sh.closing.load(Ordering::Acquire) {
                        return;
                    }
                    // Out of descriptors and the like: a level-triggered listener would spin.
                    tracing::debug!(error = %e, rank = sh.rank, "bootstrap accept failed");
                    resting.push((Instant::now() + LISTENER_REST, token, Arc::downgrade(sh)));
                    return;
                }
            }
        }
        self.arm_listener(sh, token);
    }

    fn arm_listener(&self, sh: &Shared, token: u64) {
        if sh.closing.load(Ordering::Acquire) {
            return;
        }
        let _ = epoll::modify(
            &self.ep,
            &sh.listener,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN | epoll::EventFlags::ONESHOT,
        );
    }

    /// Handshakes past their deadline are refused; rested listeners are re-armed.
    fn expire(
        &self,
        hs: &mut HashMap<u64, Handshake>,
        resting: &mut Vec<(Instant, u64, Weak<Shared>)>,
    ) {
        let now = Instant::now();
        let late: Vec<u64> = hs
            .iter()
            .filter(|(_, h)| now >= h.pending.deadline)
            .map(|(&t, _)| t)
            .collect();
        for t in late {
            if let Some(h) = hs.remove(&t) {
                let _ = epoll::delete(&self.ep, &h.pending.stream);
                let e = h.pending.timed_out();
                match h.shared.upgrade() {
                    Some(sh) => {
                        sh.handshakes.fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!(from = %h.pending.from, rank = sh.rank, error = %e, "bootstrap connection refused");
                        hello::refuse(
                            h.pending.stream,
                            ErrorCode::Timeout,
                            &format!("refused by rank {}: {e}", sh.rank),
                        );
                    }
                    None => drop(h),
                }
            }
        }
        resting.retain(|(at, token, w)| {
            if now < *at {
                return true;
            }
            if let Some(sh) = w.upgrade() {
                self.arm_listener(&sh, *token);
            }
            false
        });
    }
}
