//! The bootstrap's event loop and its connections: the loop itself is here (the epoll set,
//! what each descriptor is, accepting on the listeners); `handshake` checks an accepted
//! connection's Hello, `conn` is one connection (write queue, frame reader), `waiter` is the
//! side an operation takes to read its own connections, and `endpoint` is what the loop needs
//! of a rank it serves.
//!
//! The loop is the lower layer: it names no part of a bootstrap's state, only the
//! [`Endpoint`](endpoint::Endpoint) trait, through which it hands up checked Hellos, frames
//! and ended connections (`inbound` implements it for the state and files what arrives).
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
//! Lock order: a connection's `rx`, then the endpoint's own locks, taken in its events (for a
//! bootstrap: its `forwarding`, then its state; see `inbound`), then a connection's `tx`. The
//! loop's `entries` is innermost: nothing else is taken while it is held. Failure handlers run
//! with no lock held.

pub(super) mod conn;
pub(super) mod endpoint;
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
use conn::Conn;
use endpoint::Endpoint;

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

/// What a token names, with the rank it serves (weak: a closing bootstrap is not kept alive
/// by its descriptors).
#[derive(Clone)]
enum Entry {
    Listener(Weak<dyn Endpoint>),
    Conn(Arc<Conn>, Weak<dyn Endpoint>),
}

/// A connection whose Hello is still arriving (the loop thread's alone).
struct Handshake {
    pending: Pending,
    ep: Weak<dyn Endpoint>,
}

/// Listeners resting after a failed accept: when to re-arm them, their token, their rank.
type Resting = Vec<(Instant, u64, Weak<dyn Endpoint>)>;

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

    /// Adds a rank's listener (under its [`Endpoint::listen_token`]).
    pub(super) fn add_listener<E: Endpoint + 'static>(&self, ep: &Arc<E>) -> Result<()> {
        ep.listener()
            .set_nonblocking(true)
            .map_err(|e| Error::io("making this rank's bootstrap listener non-blocking", e))?;
        let token = ep.listen_token();
        let w: Weak<dyn Endpoint> = Arc::<E>::downgrade(ep);
        self.entries().insert(token, Entry::Listener(w));
        let flags = epoll::EventFlags::IN | epoll::EventFlags::ONESHOT;
        if let Err(e) = epoll::add(
            &self.ep,
            ep.listener(),
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
    pub(super) fn remove_listener(&self, ep: &dyn Endpoint) {
        let _ = epoll::delete(&self.ep, ep.listener());
        self.entries().remove(&ep.listen_token());
    }

    /// Adds an open connection of `ep`'s (`in_set`: its descriptor is in the set already, under
    /// the same token, as a handshake was).
    pub(super) fn add_conn<E: Endpoint + 'static>(
        &self,
        c: &Arc<Conn>,
        ep: &Arc<E>,
        in_set: bool,
    ) -> Result<()> {
        let w: Weak<dyn Endpoint> = Arc::<E>::downgrade(ep);
        self.entries()
            .insert(c.token, Entry::Conn(Arc::clone(c), w));
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

    /// Takes a handshake's descriptor out of the set (one [`Endpoint::admit`] was given
    /// `in_set` and does not keep), so that closing it leaves nothing registered.
    pub(super) fn unset(&self, stream: &std::net::TcpStream) {
        let _ = epoll::delete(&self.ep, stream);
    }

    /// As [`Reactor::unset`], for a handshake already made a [`Conn`] that is not kept after
    /// all (its Ack could not be queued): it was never added with [`Reactor::add_conn`].
    pub(super) fn unset_conn(&self, c: &Conn) {
        let _ = epoll::delete(&self.ep, &c.stream);
    }

    fn run(self: Arc<Self>) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(EVENTS);
        let mut hs: HashMap<u64, Handshake> = HashMap::new();
        // Listeners resting after a failed accept.
        let mut resting: Resting = Vec::new();
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
        resting: &mut Resting,
    ) {
        if let Some(h) = hs.get_mut(&token) {
            if let Some(result) = h.pending.poll() {
                if let Some(h) = hs.remove(&token) {
                    if let Some(ep) = h.ep.upgrade() {
                        ep.handshakes().fetch_sub(1, Ordering::AcqRel);
                        self.finish_handshake(ep, token, h.pending, result, true);
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
                Some(ep) => self.accept(token, &ep, hs, resting),
                None => {
                    self.entries().remove(&token);
                }
            },
            Some(Entry::Conn(c, w)) => match w.upgrade() {
                Some(ep) => c.on_loop_event(&*ep, self, flags),
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
        ep: &Arc<dyn Endpoint>,
        hs: &mut HashMap<u64, Handshake>,
        resting: &mut Resting,
    ) {
        for _ in 0..ACCEPTS_PER_PASS {
            match ep.listener().accept() {
                Ok((stream, from)) => self.accepted(ep, stream, from, hs),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    if ep.closing() {
                        return;
                    }
                    // Out of descriptors and the like: a level-triggered listener would spin.
                    tracing::debug!(error = %e, rank = ep.rank(), "bootstrap accept failed");
                    resting.push((Instant::now() + LISTENER_REST, token, Arc::downgrade(ep)));
                    return;
                }
            }
        }
        self.arm_listener(&**ep, token);
    }

    fn arm_listener(&self, ep: &dyn Endpoint, token: u64) {
        if ep.closing() {
            return;
        }
        let _ = epoll::modify(
            &self.ep,
            ep.listener(),
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN | epoll::EventFlags::ONESHOT,
        );
    }

    /// Handshakes past their deadline are refused; rested listeners are re-armed.
    fn expire(&self, hs: &mut HashMap<u64, Handshake>, resting: &mut Resting) {
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
                match h.ep.upgrade() {
                    Some(ep) => {
                        ep.handshakes().fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!(from = %h.pending.from, rank = ep.rank(), error = %e, "bootstrap connection refused");
                        hello::refuse(
                            h.pending.stream,
                            ErrorCode::Timeout,
                            &format!("refused by rank {}: {e}", ep.rank()),
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
            if let Some(ep) = w.upgrade() {
                self.arm_listener(&*ep, *token);
            }
            false
        });
    }
}
