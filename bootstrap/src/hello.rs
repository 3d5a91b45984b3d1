//! A connection's Hello as it arrives, and the refusal of one: what the rendezvous root, the
//! mesh's accept loop and the finished roots kept for stale ids share (a leaf: it uses only the
//! wire protocol).

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::protocol::{
    ErrorCode, FRAME_HEADER_BYTES, FrameKind, HANDSHAKE_MAX_BYTES, Hello, check_payload_len,
    decode_frame_header, decode_hello, encode_error, write_frame,
};

/// How long an accepted but not yet authenticated connection may take to deliver its whole
/// Hello, in total. Legitimate ranks send it right after connecting; the bound keeps a silent
/// or trickling client from holding a handshake slot for the whole bootstrap deadline.
pub(crate) const HELLO_LIMIT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once. The accept loop reads every pending Hello itself (no thread
/// per connection), and a connection beyond this bound is closed at once: a flood of silent
/// clients costs a bounded number of sockets, never a thread each. A legitimate rank's Hello
/// is usually complete when its connection is accepted, so it rarely takes a slot at all.
pub(crate) const MAX_PENDING_HELLOS: usize = 128;

/// Refusals being delivered at once (each drains the client briefly on a thread of its own);
/// beyond this, refused connections are closed without an Error frame.
const MAX_REFUSALS: usize = 32;

/// A connection whose Hello is still arriving (non-blocking).
pub(crate) struct Pending {
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
    /// The bytes so far: the frame header, then the payload.
    buf: Vec<u8>,
    /// When the whole Hello must have arrived.
    pub(crate) deadline: Instant,
    /// The handshake's time limit, for messages.
    limit: Duration,
}

impl Pending {
    /// A handshake that must be complete `limit` from now.
    pub(crate) fn new(stream: TcpStream, from: SocketAddr, limit: Duration) -> Self {
        Pending {
            stream,
            from,
            buf: Vec::with_capacity(FRAME_HEADER_BYTES),
            deadline: Instant::now() + limit,
            limit,
        }
    }

    /// The bytes the Hello needs in all, once the header says.
    fn want(&self) -> Result<usize> {
        if self.buf.len() < FRAME_HEADER_BYTES {
            return Ok(FRAME_HEADER_BYTES);
        }
        let h = decode_frame_header(&self.buf[..FRAME_HEADER_BYTES])?;
        if h.kind != FrameKind::Hello {
            return Err(Error::malformed(
                "bootstrap handshake",
                format!(
                    "{} sent a {:?} frame where a Hello was expected",
                    self.from, h.kind
                ),
            ));
        }
        Ok(FRAME_HEADER_BYTES + check_payload_len(&h, HANDSHAKE_MAX_BYTES)?)
    }

    /// Reads what has arrived; `Some` once the Hello is complete or cannot be.
    pub(crate) fn poll(&mut self) -> Option<Result<Hello>> {
        let mut chunk = [0u8; 256];
        loop {
            let want = match self.want() {
                Ok(w) => w,
                Err(e) => return Some(Err(e)),
            };
            // The header alone gives `want`, so equality past the header means complete.
            if self.buf.len() >= FRAME_HEADER_BYTES && self.buf.len() == want {
                return Some(decode_hello(&self.buf[FRAME_HEADER_BYTES..]));
            }
            let room = (want - self.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => {
                    return Some(Err(Error::Remote {
                        rank: usize::MAX,
                        message: format!(
                            "{} closed the connection after {} of {want} bytes of its hello",
                            self.from,
                            self.buf.len()
                        ),
                    }));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Some(Err(Error::io(
                        format!("reading the hello from {}", self.from),
                        e,
                    )));
                }
            }
        }
    }

    /// The bytes of the Hello received so far.
    pub(crate) fn received(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn timed_out(&self) -> Error {
        let want = self.want().unwrap_or(FRAME_HEADER_BYTES);
        Error::Timeout {
            waiting_for: format!(
                "a complete hello from {}: it sent {} of {want} bytes",
                self.from,
                self.buf.len()
            ),
            after: self.limit,
        }
    }
}

/// Sends an Error frame (best effort, briefly) and closes the connection.
///
/// Runs on its own detached thread: closing a socket that still holds unread input makes the
/// kernel send a reset, which can destroy the Error frame before the client reads it, so the
/// client's leftover bytes are drained first (bounded in time and size).
pub(crate) fn refuse(mut stream: TcpStream, code: ErrorCode, msg: &str) {
    static REFUSING: AtomicUsize = AtomicUsize::new(0);
    struct Slot;
    impl Drop for Slot {
        fn drop(&mut self) {
            REFUSING.fetch_sub(1, Ordering::AcqRel);
        }
    }
    if REFUSING.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSALS {
        REFUSING.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(peer = ?stream.peer_addr().ok(), %msg, "bootstrap connection closed without an error report: too many refusals in progress");
        return;
    }
    let slot = Slot;
    let payload = encode_error(code, msg);
    let spawned = std::thread::Builder::new()
        .name("mscclpp-bootstrap-refuse".into())
        .spawn(move || {
            let _slot = slot;
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_frame(&mut stream, FrameKind::Error, 0, &payload);
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = std::io::copy(
                &mut std::io::Read::take(&mut stream, 1 << 16),
                &mut std::io::sink(),
            );
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start a bootstrap refusal thread");
    }
}
