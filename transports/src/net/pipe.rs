//! A byte stream over a net plugin's send and receive comms: what the frame protocol of
//! `crate::ethernet` runs on for Net connections.
//!
//! A write is one `isend` (split when longer than the bounce buffer) of bytes copied into host
//! memory registered with the send comm; a read serves what the last completed `irecv` left,
//! else posts the next one into the receive comm's registered buffer. Both sides use the same
//! buffer size, so a receive always fits the message it matches. Requests are polled with
//! `test`, spinning briefly, then yielding, then sleeping up to a millisecond while idle.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mscclpp_hal::Result;

use super::plugin::{Comm, Mr, Plugin, Request};
use crate::ethernet::Pipe;

/// How long a pipe keeps completing its requests after the peer closed the connection's link:
/// the link and the plugin's own channel are separate paths, so the link's end can overtake the
/// last messages the peer sent before closing it. A peer that died sends nothing more, so the
/// wait ends here.
const DRAIN_AFTER_PEER_CLOSED: Duration = Duration::from_millis(500);

/// Bytes of each side's registered buffer: the largest message either side sends (a frame
/// header and a 4 MiB chunk fit with room to spare).
pub(crate) const BOUNCE: usize = 8 << 20;

/// What the pipes of one connection share: the plugin, its two comms, and the shutdown flag.
pub(crate) struct NetShared {
    plugin: Arc<Plugin>,
    send: Option<Comm>,
    recv: Option<Comm>,
    /// The pipes' registered buffers once the pipes are gone: freed only after the comms are
    /// closed (see `Drop for NetPipe`).
    retired: Mutex<Vec<Box<[u8]>>>,
    /// Shut down by this side: requests give up at once.
    closed: AtomicBool,
    /// When the peer closed the link (see [`DRAIN_AFTER_PEER_CLOSED`]).
    peer_closed: OnceLock<Instant>,
    me: usize,
    peer: usize,
    io_timeout: Duration,
}

impl NetShared {
    pub(crate) fn new(
        plugin: Arc<Plugin>,
        send: Comm,
        recv: Comm,
        me: usize,
        peer: usize,
        io_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(NetShared {
            plugin,
            send: Some(send),
            recv: Some(recv),
            retired: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            peer_closed: OnceLock::new(),
            me,
            peer,
            io_timeout,
        })
    }

    /// Ends both directions: blocked reads and writes return an error at their next poll.
    pub(crate) fn shut(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The peer closed the link: requests still complete for a short while, then give up.
    pub(crate) fn peer_closed(&self) {
        let _ = self.peer_closed.set(Instant::now());
    }

    /// Whether requests are to give up now.
    fn is_shut(&self) -> bool {
        self.closed.load(Ordering::Acquire)
            || self
                .peer_closed
                .get()
                .is_some_and(|t| t.elapsed() > DRAIN_AFTER_PEER_CLOSED)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> io::Error {
        io::Error::other(format!(
            "{what} of the net connection {}->{} ({}): {e}",
            self.me, self.peer, self.plugin.name
        ))
    }
}

impl Drop for NetShared {
    fn drop(&mut self) {
        if let Some(c) = self.send.take() {
            if let Err(e) = self.plugin.close_send(c) {
                tracing::debug!("{e}");
            }
        }
        if let Some(c) = self.recv.take() {
            if let Err(e) = self.plugin.close_recv(c) {
                tracing::debug!("{e}");
            }
        }
        // Only now, with both comms closed, can no request of the plugin still reach them.
        self.retired
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// Which half of the connection a pipe is.
enum Half {
    /// Reads: the registered buffer and the unread part of the last message.
    Read { at: usize, end: usize },
    /// Writes.
    Write,
    /// Only shuts down (and holds the TCP link, the connection's liveness).
    Control(TcpStream),
}

/// One half of the byte stream (see the module doc).
pub(crate) struct NetPipe {
    shared: Arc<NetShared>,
    half: Half,
    /// The registered host buffer (empty for the control half).
    buf: Box<[u8]>,
    mr: Option<Mr>,
}

impl NetPipe {
    fn with_buffer(shared: &Arc<NetShared>, half: Half) -> Result<NetPipe> {
        let mut buf = vec![0u8; BOUNCE].into_boxed_slice();
        let comm = match half {
            Half::Read { .. } => shared.recv.as_ref(),
            _ => shared.send.as_ref(),
        };
        let comm = comm.ok_or_else(|| mscclpp_hal::Error::Internal("net comm missing".into()))?;
        // SAFETY: the buffer is owned by this pipe and lives (unmoved: a boxed slice) until the
        // registration is ended in Drop.
        let mr = unsafe { shared.plugin.reg_mr(comm, buf.as_mut_ptr(), buf.len()) }?;
        Ok(NetPipe {
            shared: shared.clone(),
            half,
            buf,
            mr: Some(mr),
        })
    }

    /// The receiving half.
    pub(crate) fn reader(shared: &Arc<NetShared>) -> Result<NetPipe> {
        Self::with_buffer(shared, Half::Read { at: 0, end: 0 })
    }

    /// The sending half.
    pub(crate) fn writer(shared: &Arc<NetShared>) -> Result<NetPipe> {
        Self::with_buffer(shared, Half::Write)
    }

    /// A handle that shuts both halves down; it keeps the TCP `link` open.
    pub(crate) fn control(shared: &Arc<NetShared>, link: TcpStream) -> NetPipe {
        NetPipe {
            shared: shared.clone(),
            half: Half::Control(link),
            buf: Box::new([]),
            mr: None,
        }
    }

    /// Polls `req` until it completes (its byte count), the pipe is shut down, or `deadline`.
    fn wait(&self, req: Request, deadline: Option<Instant>, what: &str) -> io::Result<usize> {
        let mut polls: u32 = 0;
        loop {
            match self.shared.plugin.test(&req) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(self.shared.err(what, e)),
            }
            if self.shared.is_shut() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "the net connection {}->{} was shut down",
                        self.shared.me, self.shared.peer
                    ),
                ));
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{what}: no completion within {:?} (rank {} is not receiving)",
                        self.shared.io_timeout, self.shared.peer
                    ),
                ));
            }
            backoff(&mut polls);
        }
    }

    /// Posts with `post` until the plugin takes it (it may answer "not now").
    fn post(
        &self,
        what: &str,
        mut post: impl FnMut() -> Result<Option<Request>>,
    ) -> io::Result<Request> {
        let mut polls: u32 = 0;
        loop {
            match post() {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => return Err(self.shared.err(what, e)),
            }
            if self.shared.is_shut() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "net connection shut down",
                ));
            }
            backoff(&mut polls);
        }
    }
}

/// Spin, then yield, then sleep (up to 1 ms) while a request is pending.
fn backoff(polls: &mut u32) {
    *polls = polls.saturating_add(1);
    match *polls {
        0..=256 => std::hint::spin_loop(),
        257..=4096 => std::thread::yield_now(),
        n => std::thread::sleep(Duration::from_micros(u64::from((n - 4096).min(1000)))),
    }
}

impl io::Read for NetPipe {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let Half::Read { at, end } = self.half else {
            return Err(io::Error::other("not the receiving half of a net pipe"));
        };
        if at == end {
            let (comm, mr) = match (self.shared.recv.as_ref(), self.mr.as_ref()) {
                (Some(c), Some(m)) => (c, m),
                _ => return Err(io::Error::other("net pipe without its comm")),
            };
            let data = self.buf.as_mut_ptr();
            let cap = self.buf.len();
            let plugin = self.shared.plugin.clone();
            // SAFETY: the registered buffer is not touched until the request completes (this
            // thread waits for it below before reading it).
            let req = self.post("posting a receive", || unsafe {
                plugin.irecv(comm, data, cap, mr)
            })?;
            let n = self.wait(req, None, "a receive")?;
            if n == 0 {
                // A zero-byte message carries nothing; the stream has not ended.
                self.half = Half::Read { at: 0, end: 0 };
                return self.read(out);
            }
            self.half = Half::Read {
                at: 0,
                end: n.min(cap),
            };
        }
        let Half::Read { at, end } = self.half else {
            return Err(io::Error::other("net pipe half changed"));
        };
        let n = out.len().min(end - at);
        out[..n].copy_from_slice(&self.buf[at..at + n]);
        self.half = Half::Read { at: at + n, end };
        Ok(n)
    }
}

impl io::Write for NetPipe {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if !matches!(self.half, Half::Write) {
            return Err(io::Error::other("not the sending half of a net pipe"));
        }
        if data.is_empty() {
            return Ok(0);
        }
        let n = data.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&data[..n]);
        let (comm, mr) = match (self.shared.send.as_ref(), self.mr.as_ref()) {
            (Some(c), Some(m)) => (c, m),
            _ => return Err(io::Error::other("net pipe without its comm")),
        };
        let ptr = self.buf.as_mut_ptr();
        let plugin = self.shared.plugin.clone();
        // SAFETY: the registered buffer holds the `n` bytes and is not written again until the
        // request completes (waited for below).
        let req = self.post("posting a send", || unsafe {
            plugin.isend(comm, ptr, n, mr)
        })?;
        let deadline = Instant::now() + self.shared.io_timeout;
        self.wait(req, Some(deadline), "a send")?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Pipe for NetPipe {
    fn shutdown(&self) {
        self.shared.shut();
        if let Half::Control(link) = &self.half {
            let _ = link.shutdown(Shutdown::Both);
        }
    }
}

/// A pipe can go while a request of its own is still posted: the reader always has a receive
/// waiting for the next frame, and a shut-down wait leaves its request behind (the ABI has no
/// cancel). So, in NCCL's order: the registration ends here, the comms are closed when the last
/// pipe of the connection is gone, and only then is the buffer freed; until the close, a late
/// message lands in memory that is still this connection's.
impl Drop for NetPipe {
    fn drop(&mut self) {
        let comm = match self.half {
            Half::Read { .. } => self.shared.recv.as_ref(),
            _ => self.shared.send.as_ref(),
        };
        if let (Some(mr), Some(comm)) = (self.mr.take(), comm) {
            if let Err(e) = self.shared.plugin.dereg_mr(comm, mr) {
                tracing::debug!("{e}");
            }
        }
        let buf = std::mem::take(&mut self.buf);
        if !buf.is_empty() {
            self.shared
                .retired
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(buf);
        }
    }
}
