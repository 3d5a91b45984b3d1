//! Ethernet: TCP between two ranks. The sender reads the local source through the HAL in
//! bounded chunks and queues frames for a writer thread; the peer's receiver thread lands them
//! in its registered memory ([`receiver`]) and answers flushes once everything before them has
//! landed.
//!
//! The frames run over a [`Pipe`], a duplex byte stream: the TCP socket for Ethernet, or a net
//! plugin's send and receive comms for Net (`crate::net`), which reuses this whole protocol.

mod frame;
mod receiver;

use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver as Queue, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result, Stream};

use crate::link::{self, Health};
use crate::memory::RegisteredMemory;
use crate::offer::{Endpoint, LocalEndpoint, MAX_FRAME_PAYLOAD};
use crate::ops::{Connection, check_dst, check_token, check_write};
use crate::transport::Transport;
use frame::{Frame, HEADER_LEN};

/// A duplex byte stream that frames run over. Reads block until bytes arrive (or the pipe is
/// shut down); writes may block up to the connection's I/O timeout.
pub(crate) trait Pipe: Read + Write + Send + 'static {
    /// Ends it in both directions: blocked reads and writes return an error.
    fn shutdown(&self);
}

impl Pipe for TcpStream {
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
}

/// The pipes of one connection: what the receiver reads, what the writer writes, and a handle to
/// shut both down.
pub(crate) struct Pipes {
    pub(crate) read: Box<dyn Pipe>,
    pub(crate) write: Box<dyn Pipe>,
    pub(crate) control: Box<dyn Pipe + Sync>,
    /// What the pipe runs over, for `Debug` (the peer's address, the plugin's device).
    pub(crate) describe: String,
}

/// One frame, encoded, waiting for the writer thread.
pub(crate) struct Out {
    bytes: Vec<u8>,
    /// Payload bytes it holds against the in-flight budget (0 for control frames).
    counted: usize,
    /// Close the socket after sending it (the error frame).
    last: bool,
}

impl Out {
    fn control(f: Frame) -> Out {
        Out {
            bytes: f.header().to_vec(),
            counted: 0,
            last: false,
        }
    }
}

/// Reused send buffers, so that a large write does not fault in fresh pages per chunk.
#[derive(Default)]
struct Pool {
    bufs: Mutex<Vec<Vec<u8>>>,
}

impl Pool {
    const KEEP: usize = 8;
    fn take(&self) -> Vec<u8> {
        self.bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default()
    }
    fn put(&self, v: Vec<u8>) {
        let mut b = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if b.len() < Self::KEEP {
            b.push(v);
        }
    }
}

/// An Ethernet connection (see the module documentation).
pub struct EthernetConnection {
    local_rank: usize,
    remote_rank: usize,
    chunk: usize,
    max_in_flight: usize,
    io_timeout: Duration,
    /// Reads sources into host memory.
    stream: Arc<dyn Stream>,
    health: Arc<Health>,
    tx: Option<Sender<Out>>,
    pool: Arc<Pool>,
    next_seq: AtomicU64,
    control: Box<dyn Pipe + Sync>,
    describe: String,
    transport: Transport,
    receiver: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl fmt::Debug for EthernetConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EthernetConnection")
            .field("local_rank", &self.local_rank)
            .field("remote_rank", &self.remote_rank)
            .field("transport", &self.transport)
            .field("over", &self.describe)
            .field("dead", &self.health.lock().dead)
            .finish()
    }
}

impl EthernetConnection {
    pub(crate) fn connect(local: LocalEndpoint, remote: &Endpoint) -> Result<Self> {
        let sock = link::establish(&local, remote)?;
        let (me, peer) = (local.endpoint.rank, remote.rank);
        let fail = |what: &str, e: std::io::Error| {
            // Unblocks any thread already started on the socket.
            let _ = sock.shutdown(Shutdown::Both);
            Error::io(format!("{what} of the Ethernet connection {me}->{peer}"), e)
        };
        let rd = sock
            .try_clone()
            .map_err(|e| fail("cloning the socket", e))?;
        let wr = sock
            .try_clone()
            .map_err(|e| fail("cloning the socket", e))?;
        // A send blocked this long means the peer stopped reading: fail instead of hanging.
        wr.set_write_timeout(Some(local.cfg.io_timeout))
            .map_err(|e| fail("setting the send timeout", e))?;
        let describe = format!("TCP to {:?}", sock.peer_addr().ok());
        let pipes = Pipes {
            read: Box::new(rd),
            write: Box::new(wr),
            control: Box::new(sock),
            describe,
        };
        Self::over(local, remote, pipes, Transport::Ethernet)
    }

    /// The connection's protocol over `pipes` (already joined to the peer), named `transport`.
    pub(crate) fn over(
        local: LocalEndpoint,
        remote: &Endpoint,
        pipes: Pipes,
        transport: Transport,
    ) -> Result<Self> {
        let peer = remote.rank;
        let me = local.endpoint.rank;
        let cfg = &local.cfg;
        let Pipes {
            read: rd,
            write: wr,
            control,
            describe,
        } = pipes;
        let fail = |what: &str, e: std::io::Error| {
            control.shutdown();
            Error::io(
                format!("{what} of the {transport} connection {me}->{peer}"),
                e,
            )
        };
        let health = Arc::new(Health::new(peer));
        let pool = Arc::new(Pool::default());
        let (tx, rx) = mpsc::channel();
        let recv_stream = local.ctx.device().create_stream()?;
        let stream = local.ctx.device().create_stream()?;
        let r = receiver::Receiver {
            ctx: local.ctx.clone(),
            stream: recv_stream,
            sock: rd,
            tx: tx.clone(),
            health: health.clone(),
            peer,
            io_timeout: cfg.io_timeout,
        };
        let receiver = std::thread::Builder::new()
            .name(format!(
                "mscclpp-{}-recv-{me}-{peer}",
                thread_tag(transport)
            ))
            .spawn(move || r.run())
            .map_err(|e| fail("spawning the receiver", e))?;
        let (h, p) = (health.clone(), pool.clone());
        let writer = std::thread::Builder::new()
            .name(format!(
                "mscclpp-{}-send-{me}-{peer}",
                thread_tag(transport)
            ))
            .spawn(move || write_loop(wr, rx, h, p, me, peer))
            .map_err(|e| fail("spawning the writer", e))?;
        Ok(EthernetConnection {
            local_rank: me,
            remote_rank: peer,
            chunk: cfg.max_write_chunk.clamp(4096, MAX_FRAME_PAYLOAD),
            max_in_flight: cfg.max_in_flight,
            io_timeout: cfg.io_timeout,
            stream,
            health,
            tx: Some(tx),
            pool,
            next_seq: AtomicU64::new(0),
            control,
            describe,
            transport,
            receiver: Some(receiver),
            writer: Some(writer),
        })
    }

    fn send(&self, out: Out) -> Result<()> {
        let sent = self.tx.as_ref().map(|tx| tx.send(out));
        match sent {
            Some(Ok(())) => Ok(()),
            // The writer only exits after marking the connection dead or sending the last frame.
            _ => {
                self.health.check()?;
                Err(self.health.error(&format!(
                    "the {} connection's writer has stopped",
                    self.transport
                )))
            }
        }
    }

    /// Waits for room for `n` more payload bytes in flight, and takes it.
    fn reserve(&self, n: usize) -> Result<()> {
        let max = self.max_in_flight;
        let deadline = Instant::now() + self.io_timeout;
        let got = self.health.wait_until(deadline, |s| {
            let fits = s.in_flight == 0 || s.in_flight + n <= max;
            if fits {
                s.in_flight += n;
            }
            fits
        });
        got.unwrap_or_else(|| {
            Err(Error::Timeout {
                waiting_for: format!(
                    "room to send to rank {} (the peer is not reading)",
                    self.remote_rank
                ),
                after: self.io_timeout,
            })
        })
    }

    fn ethernet_id(&self, dst: &RegisteredMemory) -> Result<u64> {
        check_dst(self.remote_rank, dst)?;
        dst.ethernet_id().ok_or_else(|| {
            Error::invalid(format!(
                "destination memory of rank {} was registered for {}, not {}",
                dst.rank(),
                dst.transports(),
                self.transport
            ))
        })
    }
}

fn write_loop(
    mut sock: Box<dyn Pipe>,
    rx: Queue<Out>,
    health: Arc<Health>,
    pool: Arc<Pool>,
    me: usize,
    peer: usize,
) {
    while let Ok(out) = rx.recv() {
        let sent = sock.write_all(&out.bytes);
        if out.counted > 0 {
            health.update(|s| s.in_flight = s.in_flight.saturating_sub(out.counted));
            pool.put(out.bytes);
        }
        if let Err(e) = sent {
            health.mark_dead(link::describe_end(peer, me, Some(e)));
            sock.shutdown();
            return;
        }
        if out.last {
            sock.shutdown();
            return;
        }
    }
}

impl Connection for EthernetConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Result<()> {
        self.health.check()?;
        let mem = self.ethernet_id(dst)?;
        let src = check_write(
            self.local_rank,
            self.remote_rank,
            dst,
            dst_off,
            src,
            src_off,
            len,
        )?;
        let mut off = 0usize;
        while off < src.len() {
            let n = self.chunk.min(src.len() - off);
            self.reserve(n)?;
            let mut buf = self.pool.take();
            buf.resize(HEADER_LEN + n, 0);
            let frame = Frame::Write {
                mem,
                offset: dst_off + off as u64,
                len: n as u64,
            };
            buf[..HEADER_LEN].copy_from_slice(&frame.header());
            let read = src
                .slice(off..off + n)
                .and_then(|s| self.stream.read_to_host(&mut buf[HEADER_LEN..], &s));
            if let Err(e) = read {
                self.health
                    .update(|s| s.in_flight = s.in_flight.saturating_sub(n));
                return Err(e);
            }
            self.send(Out {
                bytes: buf,
                counted: n,
                last: false,
            })?;
            off += n;
        }
        Ok(())
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_off: u64, new_value: u64) -> Result<()> {
        self.health.check()?;
        let mem = self.ethernet_id(dst)?;
        check_token(dst, dst_off)?;
        self.send(Out::control(Frame::Update {
            mem,
            offset: dst_off,
            value: new_value,
        }))
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        self.health.check()?;
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
        self.send(Out::control(Frame::FlushReq { seq }))?;
        match self
            .health
            .wait_until(started + timeout, |s| s.acked >= seq)
        {
            Some(r) => r?,
            None => {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "rank {} to acknowledge flush {seq} of its {} connection from rank {}",
                        self.remote_rank, self.transport, self.local_rank
                    ),
                    after: timeout,
                });
            }
        }
        tracing::debug!(
            rank = self.local_rank,
            peer = self.remote_rank,
            seq,
            elapsed = ?started.elapsed(),
            transport = %self.transport,
            "flush"
        );
        Ok(())
    }

    fn transport(&self) -> Transport {
        self.transport
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn remote_rank(&self) -> usize {
        self.remote_rank
    }
}

/// How long dropping a connection waits for what was already issued to land.
const DROP_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        // Writes and signals already issued are delivered if the peer is alive: a bounded flush
        // first (it fails at once on a dead connection). Then the shutdown ends the receiver's
        // read and any blocked send; closing the queue ends the writer once the receiver, which
        // holds the other sender, is gone.
        if let Err(e) = self.flush(DROP_FLUSH_TIMEOUT) {
            tracing::debug!(
                peer = self.remote_rank(),
                "Ethernet connection dropped unflushed: {e}"
            );
        }
        self.control.shutdown();
        self.tx.take();
        if let Some(r) = self.receiver.take() {
            let _ = r.join();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The short name in the connection's thread names.
fn thread_tag(t: Transport) -> &'static str {
    match t {
        Transport::Net(_) => "net",
        _ => "eth",
    }
}
