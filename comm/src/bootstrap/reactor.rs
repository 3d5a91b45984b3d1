//! The bootstrap's event loop and its connections.
//!
//! One thread per process (started with the first bootstrap of more than one rank, shared by
//! every bootstrap of the process) waits on one `epoll` set holding every rank listener, every
//! handshake in progress and every bootstrap connection. Sockets are non-blocking; each
//! connection has its own read state (a frame being assembled) and write queue.
//!
//! A thread waiting in an operation (`wait_all`) reads the connections it waits on itself: it
//! takes them out of the loop's set ([`Waiter`]), polls them, and gives them back when the
//! operation ends. A message then wakes only the thread that wants it, where a reader thread
//! per connection (or a loop feeding a condition variable) wakes two: with a thousand ranks
//! on two cores the number of wake-ups, not the depth of the schedule, sets the time. The loop
//! keeps reading every connection no operation is waiting on, so a peer's death is still seen
//! at once with no operation running.
//!
//! Lock order: a connection's `rx`, then the bootstrap's `forwarding`, then its `State`, then
//! a connection's `tx`. Failure handlers run with no lock held.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, epoll};

use super::protocol::{
    self, ErrorCode, FRAME_HEADER_BYTES, FrameHeader, FrameKind, HelloRole, Truncated,
};
use super::root::{self, Pending};
use super::{CROSSED, Deferred, Link, Shared, run_handlers};

/// Bytes one pass reads from a connection before it lets the others have a turn.
const READ_BUDGET: usize = 8 << 20;

/// Unsent bytes a connection may hold before a sender waits for the peer to read: enough for
/// any all-gather a bootstrap carries, bounded so that a peer that stops reading cannot make a
/// rank buffer without limit.
pub(super) const MAX_QUEUED_BYTES: usize = 64 << 20;

/// Connections accepted per listener event, so that handshakes and data get turns in between.
const ACCEPTS_PER_PASS: usize = 64;

/// How long a listener that failed to accept (out of descriptors and the like) rests.
const LISTENER_REST: Duration = Duration::from_millis(10);

/// Events taken from the kernel per wait.
const EVENTS: usize = 256;

/// Stack of the loop thread: it decodes frames in a 16 KiB buffer and calls failure handlers.
const LOOP_STACK: usize = 512 << 10;

/// Scratch buffer of one read; a payload left larger than this is read in place.
const SCRATCH: usize = 16 << 10;

/// The process's event loop: its epoll set, what each registered descriptor is, and the
/// eventfd that wakes the thread polling in an operation.
pub(super) struct Reactor {
    ep: OwnedFd,
    /// Written when a bootstrap learns of a failure: a thread polling its own connections
    /// ([`Waiter`]) would otherwise not look at the state the loop changed.
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

    fn accepted(
        &self,
        sh: &Arc<Shared>,
        stream: TcpStream,
        from: SocketAddr,
        hs: &mut HashMap<u64, Handshake>,
    ) {
        if sh.closing.load(Ordering::Acquire) {
            return;
        }
        if sh.handshakes.load(Ordering::Acquire) >= root::MAX_PENDING_HELLOS {
            tracing::debug!(%from, rank = sh.rank, "bootstrap connection closed at once: too many handshakes in progress");
            return;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!(%from, error = %e, "bootstrap connection dropped");
            return;
        }
        let limit = root::HELLO_LIMIT.min(sh.cfg.timeout);
        let mut p = Pending::new(stream, from, limit);
        let token = self.token();
        match p.poll() {
            Some(result) => self.finish_handshake(sh, token, p, result, false),
            None => {
                if let Err(e) = epoll::add(
                    &self.ep,
                    &p.stream,
                    epoll::EventData::new_u64(token),
                    epoll::EventFlags::IN,
                ) {
                    tracing::debug!(%from, error = %e, "bootstrap connection dropped");
                    return;
                }
                sh.handshakes.fetch_add(1, Ordering::AcqRel);
                hs.insert(
                    token,
                    Handshake {
                        pending: p,
                        shared: Arc::downgrade(sh),
                    },
                );
            }
        }
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
                        root::refuse(
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

    /// Checks a dialling peer's Hello, then either acknowledges it and adds the connection, or
    /// refuses it. Of two ranks dialling each other at once, the lower rank's connection is
    /// kept: a higher rank's dial is refused as Crossed while this rank has its own connection
    /// with it open or opening.
    fn finish_handshake(
        &self,
        sh: &Arc<Shared>,
        token: u64,
        p: Pending,
        hello: Result<protocol::Hello>,
        in_set: bool,
    ) {
        let who = format!("rank {}", sh.rank);
        let from = p.from;
        let stream = p.stream;
        let hello = hello.and_then(|h| {
            let refuse = |why: String| Err(Error::invalid(why));
            if !protocol::secrets_equal(&h.secret, &sh.secret) {
                return refuse("wrong secret: the peer belongs to a different bootstrap".into());
            }
            if h.role != HelloRole::Peer {
                return refuse(format!("a {:?} hello sent to a Peer listener", h.role));
            }
            if h.nranks != sh.nranks {
                return refuse(format!(
                    "rank {} says nranks = {}, this bootstrap has {}",
                    h.rank, h.nranks, sh.nranks
                ));
            }
            if h.rank >= sh.nranks || h.rank == sh.rank {
                return refuse(format!(
                    "rank {} is not expected here (a peer of rank {} of {})",
                    h.rank, sh.rank, sh.nranks
                ));
            }
            Ok(h)
        });
        let unset = |s: &TcpStream| {
            if in_set {
                let _ = epoll::delete(&self.ep, s);
            }
        };
        let h = match hello {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(%from, who = %who, error = %e, "bootstrap connection refused");
                let code = if matches!(e, Error::Timeout { .. }) {
                    ErrorCode::Timeout
                } else {
                    ErrorCode::Refused
                };
                unset(&stream);
                root::refuse(stream, code, &format!("refused by {who}: {e}"));
                return;
            }
        };
        let peer = h.rank;
        let mut st = sh.lock();
        if sh.closing.load(Ordering::Acquire) {
            drop(st);
            unset(&stream);
            return;
        }
        let verdict = match st.links.get(&peer) {
            None if st.dead.contains_key(&peer) => {
                Err(format!("rank {peer}'s connection already ended"))
            }
            None => Ok(()),
            Some(Link::Dialling) if peer < sh.rank => Ok(()),
            Some(_) if peer > sh.rank => Err(CROSSED.to_string()),
            Some(_) => Err(format!("rank {peer} is already connected (duplicate rank)")),
        };
        if let Err(why) = verdict {
            drop(st);
            unset(&stream);
            if why == CROSSED {
                // Its whole Hello has been read, so closing right after the report sends no
                // reset; answered here rather than by the bounded refusal threads, which may
                // close without a report when busy, and the dialler must learn why. A report
                // of a hundred bytes fits the empty send buffer of a new connection.
                let payload =
                    protocol::encode_error(ErrorCode::Crossed, &format!("refused by {who}: {why}"));
                let _ = (&stream).write_all(&frame(FrameKind::Error, 0, &payload));
            } else {
                root::refuse(
                    stream,
                    ErrorCode::Refused,
                    &format!("refused by {who}: {why}"),
                );
            }
            return;
        }
        let c = match Conn::new(peer, from, token, stream, sh.max_payload()) {
            Ok(c) => c,
            Err(e) => {
                drop(st);
                tracing::warn!(%from, error = %e, "bootstrap connection dropped");
                return;
            }
        };
        // The Ack goes first: the connection is published (and so written by others) only
        // once it is queued.
        if let Err(e) = c.send_nowait(self, frame(FrameKind::Ack, 0, &[])) {
            drop(st);
            unset(&c.stream);
            sh.mark_dead(peer, format!("acknowledging its hello failed: {e}"));
            return;
        }
        st.links.insert(peer, Link::Up(Arc::clone(&c)));
        st.conns.insert(token, Arc::clone(&c));
        st.opened += 1;
        sh.notify(st);
        if let Err(e) = self.add_conn(&c, sh, in_set) {
            tracing::warn!(peer, error = %e, "bootstrap connection dropped");
            c.shutdown();
            sh.mark_dead(peer, e.to_string());
            return;
        }
        tracing::debug!(peer, "bootstrap connection up (accepted)");
    }
}

/// One frame's bytes: header and payload.
pub(super) fn frame(kind: FrameKind, tag: u64, payload: &[u8]) -> Vec<u8> {
    let h = FrameHeader {
        kind,
        tag,
        len: payload.len() as u64,
    };
    let mut v = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    v.extend_from_slice(&protocol::encode_frame_header(&h));
    v.extend_from_slice(payload);
    v
}

/// A Data frame carrying `data` for the view `comm` (one copy of `data`).
pub(super) fn data_frame(comm: u64, tag: u64, data: &[u8]) -> Vec<u8> {
    let len = protocol::COMM_ID_BYTES + data.len();
    let h = FrameHeader {
        kind: FrameKind::Data,
        tag,
        len: len as u64,
    };
    let mut v = Vec::with_capacity(FRAME_HEADER_BYTES + len);
    v.extend_from_slice(&protocol::encode_frame_header(&h));
    v.extend_from_slice(&comm.to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// Why a send failed.
pub(super) enum SendError {
    /// The connection is broken (the text says how).
    Broken(String),
    /// The peer has not read for the whole deadline.
    Stalled,
}

/// An open connection to a peer.
pub(super) struct Conn {
    pub(super) peer: usize,
    /// The peer's address, known before the connection can have been reset (after which the
    /// socket no longer reports it).
    pub(super) addr: SocketAddr,
    pub(super) token: u64,
    stream: TcpStream,
    /// Largest payload accepted from the peer.
    max: usize,
    /// A waiting operation reads this connection ([`Waiter`]); the loop leaves it alone.
    /// Changed under `rx`.
    owned: AtomicBool,
    rx: Mutex<Rx>,
    tx: Mutex<Tx>,
}

/// The read side: the frame being assembled.
struct Rx {
    hdr: [u8; FRAME_HEADER_BYTES],
    hdr_len: usize,
    head: Option<FrameHeader>,
    body: Vec<u8>,
    body_got: usize,
    /// The connection ended; nothing reads it again.
    ended: bool,
}

/// The write side: frames not yet taken by the kernel, oldest first (with the bytes of the
/// first already written).
struct Tx {
    queue: VecDeque<Vec<u8>>,
    head_sent: usize,
    queued: usize,
    /// When the queue last made progress (or became non-empty).
    since: Instant,
    broken: Option<String>,
}

impl Conn {
    pub(super) fn new(
        peer: usize,
        addr: SocketAddr,
        token: u64,
        stream: TcpStream,
        max: usize,
    ) -> Result<Arc<Self>> {
        stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| Error::io(format!("configuring the connection with rank {peer}"), e))?;
        Ok(Arc::new(Conn {
            peer,
            addr,
            token,
            stream,
            max,
            owned: AtomicBool::new(false),
            rx: Mutex::new(Rx {
                hdr: [0; FRAME_HEADER_BYTES],
                hdr_len: 0,
                head: None,
                body: Vec::new(),
                body_got: 0,
                ended: false,
            }),
            tx: Mutex::new(Tx {
                queue: VecDeque::new(),
                head_sent: 0,
                queued: 0,
                since: Instant::now(),
                broken: None,
            }),
        }))
    }

    fn rx(&self) -> MutexGuard<'_, Rx> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tx(&self) -> MutexGuard<'_, Tx> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the connection both ways (the loop or the owner then reads its end).
    pub(super) fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// What the loop waits for: input unless a waiter owns it, output while some is queued.
    /// `ONESHOT` alone disables the descriptor (not even a hang-up is reported).
    fn interest(&self, tx: &Tx) -> epoll::EventFlags {
        let mut f = epoll::EventFlags::ONESHOT;
        if !self.owned.load(Ordering::Acquire) {
            f |= epoll::EventFlags::IN;
        }
        if !tx.queue.is_empty() && tx.broken.is_none() {
            f |= epoll::EventFlags::OUT;
        }
        f
    }

    /// Sets the loop's interest; called under `tx`, so that the last call sees the last state.
    fn arm(&self, r: &Reactor, tx: &Tx) {
        let _ = epoll::modify(
            &r.ep,
            &self.stream,
            epoll::EventData::new_u64(self.token),
            self.interest(tx),
        );
    }

    /// Writes what the queue holds, as far as the kernel takes it.
    fn flush_locked(&self, tx: &mut Tx) {
        while tx.broken.is_none() {
            let Some(front) = tx.queue.front() else {
                break;
            };
            match write_some(&self.stream, &front[tx.head_sent..]) {
                Ok(n) => {
                    if n > 0 {
                        tx.since = Instant::now();
                    }
                    tx.head_sent += n;
                    tx.queued -= n;
                    if tx.head_sent < front.len() {
                        break;
                    }
                    tx.queue.pop_front();
                    tx.head_sent = 0;
                }
                Err(e) => {
                    tx.broken = Some(e.to_string());
                    tx.queue.clear();
                    tx.queued = 0;
                    tx.head_sent = 0;
                }
            }
        }
    }

    /// Appends a frame: written at once if nothing is queued before it, else (or for what the
    /// kernel did not take) queued for the loop to write when the socket has room.
    fn push_locked(
        &self,
        r: &Reactor,
        tx: &mut Tx,
        frame: Vec<u8>,
        stall: Option<Duration>,
    ) -> std::result::Result<(), SendError> {
        if let Some(b) = &tx.broken {
            return Err(SendError::Broken(b.clone()));
        }
        if tx.queue.is_empty() {
            let n = match write_some(&self.stream, &frame) {
                Ok(n) => n,
                Err(e) => {
                    let why = e.to_string();
                    tx.broken = Some(why.clone());
                    return Err(SendError::Broken(why));
                }
            };
            if n == frame.len() {
                return Ok(());
            }
            tx.queued = frame.len() - n;
            tx.head_sent = n;
            tx.queue.push_back(frame);
            tx.since = Instant::now();
            self.arm(r, tx);
            return Ok(());
        }
        if let Some(limit) = stall
            && tx.since.elapsed() >= limit
        {
            return Err(SendError::Stalled);
        }
        tx.queued += frame.len();
        tx.queue.push_back(frame);
        Ok(())
    }

    /// Queues a frame without ever waiting (the loop's Acks, and failure reports and goodbyes).
    pub(super) fn send_nowait(
        &self,
        r: &Reactor,
        frame: Vec<u8>,
    ) -> std::result::Result<(), String> {
        let mut tx = self.tx();
        self.push_locked(r, &mut tx, frame, None)
            .map_err(|e| match e {
                SendError::Broken(s) => s,
                SendError::Stalled => "the peer stopped reading".into(),
            })
    }

    /// Sends a frame for an operation: waits (until `deadline`) only while more than
    /// [`MAX_QUEUED_BYTES`] are queued; `Stalled` when the peer took nothing for `timeout`.
    pub(super) fn send(
        &self,
        r: &Reactor,
        frame: Vec<u8>,
        deadline: Instant,
        timeout: Duration,
    ) -> std::result::Result<(), SendError> {
        loop {
            let mut tx = self.tx();
            if tx.queued > MAX_QUEUED_BYTES && tx.broken.is_none() {
                self.flush_locked(&mut tx);
            }
            if tx.queued <= MAX_QUEUED_BYTES || tx.broken.is_some() {
                return self.push_locked(r, &mut tx, frame, Some(timeout));
            }
            let now = Instant::now();
            if now >= deadline || tx.since.elapsed() >= timeout {
                return Err(SendError::Stalled);
            }
            drop(tx);
            let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
            let _ = rustix::event::poll(&mut fds, Some(&timespec(deadline - now)));
        }
    }

    /// Writes what is queued, waiting for room until `deadline` (a closing bootstrap's goodbyes).
    pub(super) fn flush_until(&self, deadline: Instant) {
        loop {
            let mut tx = self.tx();
            self.flush_locked(&mut tx);
            if tx.queue.is_empty() || tx.broken.is_some() {
                return;
            }
            drop(tx);
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
            let _ = rustix::event::poll(&mut fds, Some(&timespec(deadline - now)));
        }
    }

    /// The loop's turn on this connection: write what is queued, read what arrived (unless a
    /// waiter owns the reading), and re-arm.
    fn on_loop_event(self: &Arc<Self>, sh: &Arc<Shared>, r: &Reactor, flags: epoll::EventFlags) {
        if flags
            .intersects(epoll::EventFlags::OUT | epoll::EventFlags::ERR | epoll::EventFlags::HUP)
        {
            let mut tx = self.tx();
            self.flush_locked(&mut tx);
        }
        let mut deferred = Vec::new();
        let mut rx = self.rx();
        if !rx.ended {
            if !self.owned.load(Ordering::Acquire) {
                self.read(sh, r, &mut rx, &mut deferred);
            }
            if !rx.ended {
                let tx = self.tx();
                self.arm(r, &tx);
            }
        }
        drop(rx);
        run_handlers(deferred);
    }

    /// Reads what the owner's poll said arrived; true when the connection ended.
    fn read_owned(self: &Arc<Self>, sh: &Arc<Shared>, r: &Reactor) -> bool {
        let mut deferred = Vec::new();
        let mut rx = self.rx();
        if !rx.ended {
            self.read(sh, r, &mut rx, &mut deferred);
        }
        let ended = rx.ended;
        drop(rx);
        run_handlers(deferred);
        ended
    }

    /// Takes the reading of this connection from the loop; false if it ended or another
    /// waiter has it.
    fn acquire(&self, r: &Reactor) -> bool {
        let rx = self.rx();
        if rx.ended || self.owned.load(Ordering::Acquire) {
            return false;
        }
        self.owned.store(true, Ordering::Release);
        let tx = self.tx();
        self.arm(r, &tx);
        true
    }

    /// Gives the reading back to the loop (re-armed: what arrived meanwhile wakes it).
    fn release(&self, r: &Reactor) {
        let rx = self.rx();
        self.owned.store(false, Ordering::Release);
        if !rx.ended {
            let tx = self.tx();
            self.arm(r, &tx);
        }
    }

    /// Reads until the socket is empty (or the budget is spent), handling each whole frame.
    fn read(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        r: &Reactor,
        rx: &mut Rx,
        deferred: &mut Vec<Deferred>,
    ) {
        let mut scratch = [0u8; SCRATCH];
        let mut budget = READ_BUDGET;
        while !rx.ended && budget > 0 {
            // A large remainder of a payload is read in place.
            let direct = rx.head.is_some() && rx.body.len() - rx.body_got >= SCRATCH;
            let got = if direct {
                let at = rx.body_got;
                (&self.stream).read(&mut rx.body[at..])
            } else {
                (&self.stream).read(&mut scratch)
            };
            match got {
                Ok(0) => {
                    let t = if let Some(h) = rx.head {
                        Truncated {
                            got: FRAME_HEADER_BYTES + rx.body_got,
                            want: FRAME_HEADER_BYTES + rx.body.len(),
                            kind: Some(h.kind),
                        }
                    } else {
                        Truncated {
                            got: rx.hdr_len,
                            want: FRAME_HEADER_BYTES,
                            kind: None,
                        }
                    };
                    self.end(sh, r, rx, format!("{} {t}", self.addr), false, deferred);
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    if direct {
                        rx.body_got += n;
                        if rx.body_got == rx.body.len() {
                            self.complete(sh, r, rx, deferred);
                        }
                    } else {
                        self.feed(sh, r, rx, &scratch[..n], deferred);
                        // A short read almost always emptied the socket: skip the read that
                        // would say so (level-triggered waits come back if it did not).
                        if n < SCRATCH {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    let why = protocol::from_io(e, format!("reading from {}", self.addr));
                    self.end(sh, r, rx, why.to_string(), false, deferred);
                }
            }
        }
    }

    /// Takes bytes into the frame being assembled, handling every frame they complete.
    fn feed(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        r: &Reactor,
        rx: &mut Rx,
        mut bytes: &[u8],
        deferred: &mut Vec<Deferred>,
    ) {
        while !bytes.is_empty() && !rx.ended {
            if rx.head.is_none() {
                let take = (FRAME_HEADER_BYTES - rx.hdr_len).min(bytes.len());
                let at = rx.hdr_len;
                rx.hdr[at..at + take].copy_from_slice(&bytes[..take]);
                rx.hdr_len += take;
                bytes = &bytes[take..];
                if rx.hdr_len < FRAME_HEADER_BYTES {
                    continue;
                }
                rx.hdr_len = 0;
                let h = match protocol::decode_frame_header(&rx.hdr)
                    .and_then(|h| protocol::check_payload_len(&h, self.max).map(|n| (h, n)))
                {
                    Ok(x) => x,
                    Err(e) => {
                        self.end(sh, r, rx, e.to_string(), false, deferred);
                        return;
                    }
                };
                rx.head = Some(h.0);
                // Bounded by `max` above, before anything is allocated.
                rx.body = vec![0; h.1];
                rx.body_got = 0;
            } else {
                let take = (rx.body.len() - rx.body_got).min(bytes.len());
                let at = rx.body_got;
                rx.body[at..at + take].copy_from_slice(&bytes[..take]);
                rx.body_got += take;
                bytes = &bytes[take..];
            }
            if rx.head.is_some() && rx.body_got == rx.body.len() {
                self.complete(sh, r, rx, deferred);
            }
        }
    }

    /// Handles the frame just assembled.
    fn complete(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        r: &Reactor,
        rx: &mut Rx,
        deferred: &mut Vec<Deferred>,
    ) {
        let Some(h) = rx.head.take() else {
            return;
        };
        let payload = std::mem::take(&mut rx.body);
        rx.body_got = 0;
        let peer = self.peer;
        match h.kind {
            FrameKind::Data => match protocol::decode_data(payload) {
                Ok((comm, msg)) => {
                    let mut st = sh.lock();
                    st.queues
                        .entry((comm, peer, h.tag))
                        .or_default()
                        .push_back(msg);
                    sh.notify(st);
                }
                Err(e) => self.end(sh, r, rx, e.to_string(), false, deferred),
            },
            FrameKind::Lost => match protocol::decode_lost(&payload, sh.nranks) {
                Ok((k, msg)) => {
                    // Forwarded first: a wait woken by the report may end this rank before
                    // the news went on.
                    deferred.extend(sh.peer_failed(k, format!("reported by rank {peer}: {msg}")));
                    let mut st = sh.lock();
                    st.reported
                        .entry(peer)
                        .or_insert((k, format!("{msg} (reported by rank {peer})")));
                    sh.notify_failure(st);
                }
                Err(e) => self.end(sh, r, rx, e.to_string(), false, deferred),
            },
            FrameKind::Error => {
                let why = match protocol::decode_error(&payload) {
                    Ok((_, msg)) => format!("the peer reported: {msg}"),
                    Err(e) => format!("the peer sent an undecodable error report: {e}"),
                };
                self.end(sh, r, rx, why, false, deferred);
            }
            FrameKind::Bye => {
                let why = format!("{} closed its bootstrap (an orderly exit)", self.addr);
                self.end(sh, r, rx, why, true, deferred);
            }
            kind => {
                let why = format!("unexpected {kind:?} frame after setup");
                self.end(sh, r, rx, why, false, deferred);
            }
        }
    }

    /// The connection ended: out of the loop, and its peer dead (a failure unless it said
    /// goodbye).
    fn end(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        r: &Reactor,
        rx: &mut Rx,
        reason: String,
        graceful: bool,
        deferred: &mut Vec<Deferred>,
    ) {
        rx.ended = true;
        r.remove_conn(self);
        self.shutdown();
        sh.lock().conns.remove(&self.token);
        if !sh.closing.load(Ordering::Acquire) {
            tracing::debug!(peer = self.peer, %reason, "bootstrap connection ended");
        }
        if !graceful {
            deferred.extend(sh.peer_failed(
                self.peer,
                format!("its bootstrap connection closed: {reason}"),
            ));
        }
        sh.mark_dead(self.peer, reason);
    }
}

/// Writes as much of `buf` as the socket takes now.
fn write_some(s: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match (&*s).write(&buf[done..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The connections one waiting operation reads itself, and the process's poller slot; both are
/// given back to the loop when it is dropped.
pub(super) struct Waiter<'a> {
    sh: &'a Arc<Shared>,
    r: Option<&'a Reactor>,
    owned: Vec<Arc<Conn>>,
    poller: bool,
}

impl<'a> Waiter<'a> {
    pub(super) fn new(sh: &'a Arc<Shared>) -> Self {
        Waiter {
            sh,
            r: sh.reactor.as_deref(),
            owned: Vec::new(),
            poller: false,
        }
    }

    /// Whether this waiter holds anything to give back.
    pub(super) fn holds(&self) -> bool {
        self.poller || !self.owned.is_empty()
    }

    /// Whether this waiter reads every one of `conns` already.
    pub(super) fn owns_all(&self, conns: &[Arc<Conn>]) -> bool {
        self.poller
            && conns
                .iter()
                .all(|c| self.owned.iter().any(|o| Arc::ptr_eq(o, c)))
    }

    /// Takes the poller slot and the reading of `conns`; false, holding nothing, when another
    /// thread has either.
    pub(super) fn take(&mut self, conns: &[Arc<Conn>]) -> bool {
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
    pub(super) fn poll(&mut self, deadline: Instant) {
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
            if ready[i] && c.read_owned(self.sh, r) {
                ended.push(i);
            }
        }
        for i in ended.into_iter().rev() {
            self.owned.swap_remove(i);
        }
    }

    /// Gives everything back to the loop.
    pub(super) fn release(&mut self) {
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
