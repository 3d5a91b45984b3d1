//! One connection between two ranks: a non-blocking socket with its write queue (frames the
//! kernel has not taken yet, bounded by [`MAX_QUEUED_BYTES`]) and its read state (the frame
//! being assembled). Whoever reads it (the loop, or the [`Waiter`](super::waiter::Waiter) that
//! owns it) handles the connection's own frames (an Error report, a goodbye) and hands every
//! other whole frame, and the end of the connection, to the rank's [`Endpoint`] (which files a
//! message under `(view, peer, tag)`, records a Lost report, marks an ended peer dead).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};
use rustix::event::{PollFd, PollFlags, epoll};

use super::super::failure::{Deferred, run_handlers};
use super::super::protocol::{self, FRAME_HEADER_BYTES, FrameHeader, FrameKind, Truncated};
use super::endpoint::Endpoint;
use super::{Reactor, timespec};

/// Bytes one pass reads from a connection before it lets the others have a turn.
const READ_BUDGET: usize = 8 << 20;

/// Unsent bytes a connection may hold before a sender waits for the peer to read: enough for
/// any all-gather a bootstrap carries, bounded so that a peer that stops reading cannot make a
/// rank buffer without limit.
pub(crate) const MAX_QUEUED_BYTES: usize = 64 << 20;

/// Scratch buffer of one read; a payload left larger than this is read in place.
const SCRATCH: usize = 16 << 10;

/// One frame's bytes: header and payload.
pub(crate) fn frame(kind: FrameKind, tag: u64, payload: &[u8]) -> Vec<u8> {
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
pub(crate) fn data_frame(comm: u64, tag: u64, data: &[u8]) -> Vec<u8> {
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
pub(crate) enum SendError {
    /// The connection is broken (the text says how).
    Broken(String),
    /// The peer has not read for the whole deadline.
    Stalled,
}

/// An open connection to a peer.
pub(crate) struct Conn {
    pub(crate) peer: usize,
    /// The peer's address, known before the connection can have been reset (after which the
    /// socket no longer reports it).
    pub(crate) addr: SocketAddr,
    pub(crate) token: u64,
    pub(super) stream: TcpStream,
    /// Largest payload accepted from the peer.
    max: usize,
    /// A waiting operation reads this connection ([`Waiter`](super::waiter::Waiter)); the loop leaves it alone.
    /// Changed under `rx`.
    pub(super) owned: AtomicBool,
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
pub(super) struct Tx {
    queue: VecDeque<Vec<u8>>,
    head_sent: usize,
    queued: usize,
    /// When the queue last made progress (or became non-empty).
    since: Instant,
    broken: Option<String>,
}

impl Conn {
    pub(crate) fn new(
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

    pub(super) fn tx(&self) -> MutexGuard<'_, Tx> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the connection both ways (the loop or the owner then reads its end).
    pub(crate) fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// What the loop waits for: input unless a waiter owns it, output while some is queued.
    /// `ONESHOT` alone disables the descriptor (not even a hang-up is reported).
    pub(super) fn interest(&self, tx: &Tx) -> epoll::EventFlags {
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
    pub(crate) fn send_nowait(
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
    pub(crate) fn send(
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
    pub(crate) fn flush_until(&self, deadline: Instant) {
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
    pub(super) fn on_loop_event(
        self: &Arc<Self>,
        ep: &dyn Endpoint,
        r: &Reactor,
        flags: epoll::EventFlags,
    ) {
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
                self.read(ep, r, &mut rx, &mut deferred);
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
    pub(super) fn read_owned(self: &Arc<Self>, ep: &dyn Endpoint, r: &Reactor) -> bool {
        let mut deferred = Vec::new();
        let mut rx = self.rx();
        if !rx.ended {
            self.read(ep, r, &mut rx, &mut deferred);
        }
        let ended = rx.ended;
        drop(rx);
        run_handlers(deferred);
        ended
    }

    /// Takes the reading of this connection from the loop; false if it ended or another
    /// waiter has it.
    pub(super) fn acquire(&self, r: &Reactor) -> bool {
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
    pub(super) fn release(&self, r: &Reactor) {
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
        ep: &dyn Endpoint,
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
                    self.end(ep, r, rx, format!("{} {t}", self.addr), false, deferred);
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    if direct {
                        rx.body_got += n;
                        if rx.body_got == rx.body.len() {
                            self.complete(ep, r, rx, deferred);
                        }
                    } else {
                        self.feed(ep, r, rx, &scratch[..n], deferred);
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
                    self.end(ep, r, rx, why.to_string(), false, deferred);
                }
            }
        }
    }

    /// Takes bytes into the frame being assembled, handling every frame they complete.
    fn feed(
        self: &Arc<Self>,
        ep: &dyn Endpoint,
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
                        self.end(ep, r, rx, e.to_string(), false, deferred);
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
                self.complete(ep, r, rx, deferred);
            }
        }
    }

    /// Handles the frame just assembled.
    fn complete(
        self: &Arc<Self>,
        ep: &dyn Endpoint,
        r: &Reactor,
        rx: &mut Rx,
        deferred: &mut Vec<Deferred>,
    ) {
        let Some(h) = rx.head.take() else {
            return;
        };
        let payload = std::mem::take(&mut rx.body);
        rx.body_got = 0;
        match h.kind {
            // The connection's own frames: they end it (a goodbye gracefully).
            FrameKind::Error => {
                let why = match protocol::decode_error(&payload) {
                    Ok((_, msg)) => format!("the peer reported: {msg}"),
                    Err(e) => format!("the peer sent an undecodable error report: {e}"),
                };
                self.end(ep, r, rx, why, false, deferred);
            }
            FrameKind::Bye => {
                let why = format!("{} closed its bootstrap (an orderly exit)", self.addr);
                self.end(ep, r, rx, why, true, deferred);
            }
            // Everything else is the rank's (still under `rx`, so that frames are handled in
            // the order they came); what it cannot take ends the connection.
            kind => {
                if let Err(why) = ep.frame(self, r, kind, h.tag, payload, deferred) {
                    self.end(ep, r, rx, why, false, deferred);
                }
            }
        }
    }

    /// The connection ended: out of the loop, and (the rank's part, [`Endpoint::ended`]) its
    /// peer dead, a failure unless it said goodbye.
    fn end(
        self: &Arc<Self>,
        ep: &dyn Endpoint,
        r: &Reactor,
        rx: &mut Rx,
        reason: String,
        graceful: bool,
        deferred: &mut Vec<Deferred>,
    ) {
        rx.ended = true;
        r.remove_conn(self);
        self.shutdown();
        ep.ended(self, reason, graceful, deferred);
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
