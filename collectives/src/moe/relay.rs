//! Ranks on other hosts. The exchange's kernels write into every peer's buffer; a peer of this
//! host is mapped (CUDA IPC), a peer of another host cannot be. For each of those the kernels
//! write instead into a *mirror* here (host memory the device maps) that holds only what this
//! rank writes in that peer's buffer (the header, this rank's dispatch and combine regions), and
//! a relay thread carries what each completed step announces over the transport between hosts
//! (the one the hierarchical collectives pick: IB, an NCCL net plugin or Ethernet), into the
//! peer's real buffer, the data before the word that announces it: a connection's writes land in order, so
//! the peer's kernels see a flag only after the rows and counts it covers.
//!
//! What the kernels write into a peer's buffer, and so what the relay watches in a mirror (rank
//! `r` is this one; `spec.md` has the words): a dispatch (the mirror's dispatch rows into region
//! `r`, count, shape, then the flag), a combine (its combine rows into region `n + r`, count,
//! then the flag), and the two
//! acknowledgements. A mirror's next step is only written after the peer acknowledged the
//! previous one, which it does after the relay's writes landed, so the relay never reads a
//! mirror the kernels are rewriting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_comm::Communicator;
use mscclpp_hal::{DeviceBuffer, Error, MemoryKind, Result};
use mscclpp_transports::{
    AnyConnection, Connection, EndpointConfig, RegisteredMemory, Transport, TransportFlags,
};

use super::args::MOE_MAX_RANKS;
use super::args::{
    combine_region, dispatch_region, hdr, mirror_bytes, mirror_combine, mirror_dispatch,
};
use crate::algorithms::host_common::word;
use crate::scratch::{Scratch, zeroed};

/// How long the last steps may take to land when the exchange is dropped.
const DRAIN: Duration = Duration::from_secs(10);
/// How long the relay keeps polling without sleeping after it last carried something: the
/// steps of a dispatch or combine follow each other within that.
const BUSY: Duration = Duration::from_millis(5);

/// Where the pieces of a buffer lie (the same on every rank).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub row_bytes: u64,
    pub max_tokens: u64,
    pub nranks: u64,
}

/// The words of a mirror the relay has carried to its peer already.
#[derive(Debug, Default)]
struct Carried {
    dispatch: u64,
    combine: u64,
    /// The dispatch and the combine acknowledgements.
    acks: [u64; 2],
}

/// A peer on another host: its buffer there, the mirror of it here, the connection.
struct Remote {
    rank: usize,
    conn: Arc<AnyConnection>,
    theirs: RegisteredMemory,
    mirror: DeviceBuffer,
    mirror_mem: RegisteredMemory,
    carried: Carried,
    /// Its relay failed: nothing more is carried to it.
    failed: bool,
}

impl Remote {
    /// The mirror's word at `off`, read by the host.
    fn word(&self, off: u64) -> u64 {
        let base = self.mirror.full().host_ptr().map_or(0, |p| p as u64);
        word(base, off).load(Ordering::Acquire)
    }

    /// Carries `len` bytes at `from` of the mirror to `to` of the peer's buffer.
    fn write(&self, to: u64, from: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.conn
            .write(&self.theirs, to, &self.mirror_mem, from, len)
    }

    /// Carries the word at `off` (ordered behind every earlier write).
    fn store(&self, off: u64, value: u64) -> Result<()> {
        self.conn.update_and_sync(&self.theirs, off, value)
    }

    /// Carries what the kernels completed since the last pass; whether anything was.
    fn pass(&mut self, me: u64, s: &Shape) -> Result<bool> {
        let mut moved = false;
        let flag = self.word(hdr::dispatch_flag(me));
        if flag > self.carried.dispatch {
            let count = self.word(hdr::dispatch_count(me)).min(s.max_tokens);
            let shape = self.word(hdr::dispatch_shape(me));
            self.write(
                dispatch_region(s.row_bytes, s.max_tokens, me),
                mirror_dispatch(),
                count * s.row_bytes,
            )?;
            self.store(hdr::dispatch_count(me), count)?;
            self.store(hdr::dispatch_shape(me), shape)?;
            self.store(hdr::dispatch_flag(me), flag)?;
            self.carried.dispatch = flag;
            moved = true;
        }
        let flag = self.word(hdr::combine_flag(me));
        if flag > self.carried.combine {
            let count = self.word(hdr::combine_count(me)).min(s.max_tokens);
            self.write(
                combine_region(s.row_bytes, s.max_tokens, s.nranks, me),
                mirror_combine(s.row_bytes, s.max_tokens),
                count * s.row_bytes,
            )?;
            self.store(hdr::combine_count(me), count)?;
            self.store(hdr::combine_flag(me), flag)?;
            self.carried.combine = flag;
            moved = true;
        }
        for (i, off) in [hdr::dispatch_ack(me), hdr::combine_ack(me)]
            .into_iter()
            .enumerate()
        {
            let v = self.word(off);
            if v > self.carried.acks[i] {
                self.store(off, v)?;
                self.carried.acks[i] = v;
                moved = true;
            }
        }
        // No flush: a mirror is rewritten only after the peer acknowledged the step, which it
        // does once the flag, and so everything before it, has landed.
        Ok(moved)
    }
}

/// Every rank's buffer as the kernels address it, and the relay to the other hosts.
pub(crate) struct Buffers {
    // First: dropped (stopped) before the memory it reads and writes.
    relay: Option<Relay>,
    /// Where the kernels write rank `p`'s buffer: its own (this rank), its mapping (this host),
    /// its mirror (another host).
    pub addrs: [u64; MOE_MAX_RANKS],
    /// Where this rank's dispatch rows (combine rows) for rank `p` go: its region of `p`'s
    /// buffer, or of `p`'s compact mirror.
    pub dispatch_at: [u64; MOE_MAX_RANKS],
    pub combine_at: [u64; MOE_MAX_RANKS],
    _held: Held,
}

/// What the addresses point into, kept alive.
enum Held {
    /// One host: every rank's buffer mapped (the collectives' scratch exchange).
    OneHost(#[allow(dead_code)] Box<Scratch<MOE_MAX_RANKS>>),
    /// Several: this rank's buffer, the mappings of this host's peers, the registrations.
    Hosts {
        _mapped: Vec<RegisteredMemory>,
        _own: DeviceBuffer,
    },
}

impl std::fmt::Debug for Buffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffers")
            .field("addrs", &self.addrs)
            .field("relayed", &self.relay.as_ref().map(|r| r.peers.clone()))
            .finish()
    }
}

impl Buffers {
    /// Allocates and zeroes this rank's buffer of `bytes`, maps those of this host's ranks, and
    /// where the ranks span hosts, connects to the others, makes their mirrors and starts the
    /// relay (a collective call: every rank, the same `bytes`).
    pub fn exchange(comm: &Communicator, bytes: u64, shape: Shape) -> Result<Buffers> {
        let (rank, n) = (comm.rank(), comm.nranks());
        let hosts = comm.bootstrap().hosts().to_vec();
        let device = &**comm.device();
        const WHAT: &str = "expert-parallel buffer";
        // This rank's regions in a buffer at `base` (every rank's on one host, and this host's).
        let (me, nr) = (rank as u64, n as u64);
        let regions = |base: u64| {
            (
                base + dispatch_region(shape.row_bytes, shape.max_tokens, me),
                base + combine_region(shape.row_bytes, shape.max_tokens, nr, me),
            )
        };
        let mut dispatch_at = [0u64; MOE_MAX_RANKS];
        let mut combine_at = [0u64; MOE_MAX_RANKS];
        if hosts.iter().all(|&h| h == hosts[0]) {
            let scratch = Scratch::exchange(comm, bytes, WHAT)?;
            for p in 0..n {
                (dispatch_at[p], combine_at[p]) = regions(scratch.addrs[p]);
            }
            return Ok(Buffers {
                relay: None,
                addrs: scratch.addrs,
                dispatch_at,
                combine_at,
                _held: Held::OneHost(Box::new(scratch)),
            });
        }
        let own = zeroed(device, bytes, MemoryKind::Device, WHAT)?;
        // Every rank takes the same transport between hosts (collective over the communicator).
        let transport = mscclpp_comm::inter_host_transport(comm, &own.full())?;
        if transport == Transport::CudaIpc {
            return Err(Error::Internal("CUDA IPC chosen between hosts".into()));
        }
        let ipc = comm.register_memory(&own.full(), TransportFlags::single(Transport::CudaIpc))?;
        let net = comm.register_memory(&own.full(), TransportFlags::single(transport))?;
        let mut addrs = [0u64; MOE_MAX_RANKS];
        addrs[rank] = own.full().ptr().0;
        (dispatch_at[rank], combine_at[rank]) = regions(addrs[rank]);
        let mut mapped = Vec::new();
        let mut remotes = Vec::new();
        // Peers in ascending order on every rank: each pair's steps meet.
        for p in (0..n).filter(|&p| p != rank) {
            if hosts[p] == hosts[rank] {
                let theirs = comm.exchange_memory(&ipc, p)?;
                let view = theirs.mapped_slice().ok_or_else(|| {
                    Error::invalid(format!(
                        "rank {p}'s expert-parallel buffer is not mapped on rank {rank}, on the same host (CUDA IPC)"
                    ))
                })?;
                same_size(p, view.len() as u64, bytes)?;
                addrs[p] = view.ptr().0;
                (dispatch_at[p], combine_at[p]) = regions(addrs[p]);
                mapped.push(theirs);
                continue;
            }
            let theirs = comm.exchange_memory(&net, p)?;
            same_size(p, theirs.len(), bytes)?;
            let mut cfg = EndpointConfig::new(transport);
            cfg.connect_timeout = comm.bootstrap().timeout();
            let conn = comm.connect(p, cfg).map_err(|e| {
                Error::unavailable(
                    "an expert-parallel exchange across hosts",
                    format!("rank {rank} to rank {p} over {transport}: {e}"),
                )
            })?;
            // Only the header and this rank's two regions: what the kernels write there.
            let mirror = zeroed(
                device,
                mirror_bytes(shape.row_bytes, shape.max_tokens),
                MemoryKind::HostMapped,
                WHAT,
            )?;
            if mirror.full().host_ptr().is_none() {
                return Err(Error::Internal(
                    "host-mapped memory without a host address".into(),
                ));
            }
            let mirror_mem =
                comm.register_memory(&mirror.full(), TransportFlags::single(transport))?;
            addrs[p] = mirror.full().ptr().0;
            dispatch_at[p] = addrs[p] + mirror_dispatch();
            combine_at[p] = addrs[p] + mirror_combine(shape.row_bytes, shape.max_tokens);
            remotes.push(Remote {
                rank: p,
                conn,
                theirs,
                mirror,
                mirror_mem,
                carried: Carried::default(),
                failed: false,
            });
        }
        tracing::debug!(
            rank,
            %transport,
            relayed = remotes.len(),
            "expert-parallel exchange across hosts"
        );
        let relay = Relay::start(rank as u64, shape, remotes)?;
        mapped.push(ipc);
        mapped.push(net);
        Ok(Buffers {
            addrs,
            dispatch_at,
            combine_at,
            _held: Held::Hosts {
                _mapped: mapped,
                _own: own,
            },
            relay: Some(relay),
        })
    }

    /// Whether some peer is on another host (its steps go through the relay).
    pub fn spans_hosts(&self) -> bool {
        self.relay.is_some()
    }

    /// Why the relay stopped, if it did (the calls are refused from then on: a peer on another
    /// host would wait for what can no longer arrive).
    pub fn check(&self) -> Result<()> {
        if let Some(r) = &self.relay
            && !r.running.load(Ordering::Acquire)
            && r.failed.lock().unwrap_or_else(|p| p.into_inner()).is_none()
        {
            return Err(Error::Internal(
                "the expert-parallel relay to other hosts ended unexpectedly".into(),
            ));
        }
        match self
            .relay
            .as_ref()
            .and_then(|r| r.failed.lock().unwrap_or_else(|p| p.into_inner()).clone())
        {
            None => Ok(()),
            Some((rank, message)) => Err(Error::Remote { rank, message }),
        }
    }
}

/// Refuses rank `p`'s buffer of `len` bytes where this rank's has `bytes`.
fn same_size(p: usize, len: u64, bytes: u64) -> Result<()> {
    if len == bytes {
        return Ok(());
    }
    Err(Error::Remote {
        rank: p,
        message: format!("an expert-parallel buffer of {len} bytes, expected {bytes}"),
    })
}

/// The relay thread of one exchange.
struct Relay {
    peers: Vec<usize>,
    stop: Arc<AtomicBool>,
    /// The first peer the relay failed to reach and why (calls are refused from then on).
    failed: Arc<Mutex<Option<(usize, String)>>>,
    /// False once the thread ended (returned or panicked).
    running: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Clears the relay's running flag when its thread ends, however it ends.
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Relay {
    fn start(me: u64, shape: Shape, mut remotes: Vec<Remote>) -> Result<Relay> {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let peers = remotes.iter().map(|r| r.rank).collect();
        let (st, fl) = (Arc::clone(&stop), Arc::clone(&failed));
        let alive = Arc::new(AtomicBool::new(true));
        let running = Arc::clone(&alive);
        let thread = std::thread::Builder::new()
            .name(format!("moe-relay-{me}"))
            .spawn(move || {
                let _alive = Alive(alive);
                let mut last = Instant::now();
                loop {
                    // A stop still carries what the kernels completed before it (a rank's last
                    // dispatch may end, and its process exit, before its peers have its rows).
                    let stopping = st.load(Ordering::Acquire);
                    let mut moved = false;
                    // A peer whose relay failed is left (a peer that exited first, at the
                    // end of a job); the others are still served.
                    for r in remotes.iter_mut().filter(|r| !r.failed) {
                        match r.pass(me, &shape) {
                            Ok(m) => moved |= m,
                            Err(e) => {
                                r.failed = true;
                                let message = format!(
                                    "the expert-parallel relay from rank {me} stopped: {e}"
                                );
                                // Said by the next call (`Buffers::check`); a peer that ends
                                // its job first fails the last acknowledgements, which nobody
                                // needs, so this is no warning of itself.
                                tracing::info!(peer = r.rank, "{message}");
                                fl.lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert((r.rank, message));
                            }
                        }
                    }
                    if stopping {
                        for r in remotes.iter().filter(|r| !r.failed) {
                            let _ = r.conn.flush(DRAIN);
                        }
                        return;
                    }
                    // Poll without sleeping while steps follow each other, then sleep a little
                    // between polls.
                    if moved {
                        last = Instant::now();
                    }
                    if last.elapsed() > BUSY {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("the expert-parallel relay thread: {e}")))?;
        Ok(Relay {
            peers,
            stop,
            failed,
            running,
            thread: Some(thread),
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
