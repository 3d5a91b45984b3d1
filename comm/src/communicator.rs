//! The communicator: one rank's bootstrap, device and transport context, and the set-up
//! exchanges (registered memory, endpoints) that channels are built from.
//!
//! Set-up with a given peer is a conversation: both ranks must make the same set-up calls with
//! each other in the same order (as MSCCL++ programs do). Each call uses the next tag of a
//! per-peer sequence in the range `SETUP_TAG_BIT | n`, which user messages on the bootstrap must
//! leave alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_hal::dev::ABORTED_LOCALLY;
use mscclpp_hal::{BufferSlice, Device, Error, MemoryKind, Result};
use mscclpp_transports::{
    AnyConnection, Endpoint, EndpointConfig, RegisteredMemory, TransportContext, TransportFlags,
};

use crate::bootstrap::{Bootstrap, PeerFailure};

/// Bootstrap tags with this bit set (and bit 63 clear) carry the communicator's set-up messages.
pub const SETUP_TAG_BIT: u64 = 1 << 62;

/// A rank's handle on the communication layer.
#[derive(Debug)]
pub struct Communicator {
    boot: Arc<Bootstrap>,
    ctx: Arc<TransportContext>,
    setup_seq: Mutex<HashMap<usize, u64>>,
    abort: Arc<AbortState>,
    handler: u64,
    /// The status service, on rank 0 where `MSCCLPP_STATUS` asks for it.
    _status: Option<mscclpp_bootstrap::StatusServer>,
}

/// The status service of `boot` when `MSCCLPP_STATUS` asks for it (`1`: any address, a port
/// chosen; `HOST:PORT`: there) and this is rank 0; tells the operator how to ask it (standard
/// error, and a line appended to `MSCCLPP_STATUS_FILE` when set). A failure to start it is
/// logged: the job runs without it.
fn status_service(boot: &Arc<Bootstrap>) -> Option<mscclpp_bootstrap::StatusServer> {
    let v = mscclpp_hal::env::get("MSCCLPP_STATUS")?;
    if boot.rank() != 0 || matches!(v.as_str(), "0" | "off" | "no" | "false") {
        return None;
    }
    let bind: std::net::SocketAddr = if matches!(v.as_str(), "1" | "on" | "yes" | "true") {
        std::net::SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        match v.parse() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(
                    "MSCCLPP_STATUS={v:?} is malformed ({e}): expected 1 or HOST:PORT; no status service"
                );
                return None;
            }
        }
    };
    match boot.serve_status(bind) {
        Ok(s) => {
            let line = format!("mscclpp-perf status {} {}", s.addr(), s.token());
            eprintln!(
                "mscclpp: status of this job's {} ranks: {line}",
                boot.nranks()
            );
            if let Some(f) = mscclpp_hal::env::get("MSCCLPP_STATUS_FILE") {
                use std::io::Write;
                let wrote = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&f)
                    .and_then(|mut h| writeln!(h, "{line}"));
                if let Err(e) = wrote {
                    tracing::warn!("MSCCLPP_STATUS_FILE={f}: {e}");
                }
            }
            Some(s)
        }
        Err(e) => {
            tracing::warn!("no status service: {e}");
            None
        }
    }
}

/// The communicator's failure state: a host copy, and the device-visible abort word that
/// kernels poll (0 = live, `r + 1` = rank r died, `u64::MAX` = aborted locally).
#[derive(Debug)]
struct AbortState {
    /// The same value as the word; kept for a communicator whose word could not be allocated.
    host: AtomicU64,
    /// 8 bytes of host-mapped memory; `None` when the device could not allocate it.
    word: Option<BufferSlice>,
    /// Whose memory the word is: a reset of it frees the word.
    device: Arc<dyn Device>,
    /// The first failure, with how it was learned.
    failure: Mutex<Option<PeerFailure>>,
    /// Called once, when the first failure is stored ([`Communicator::on_abort`]), by id.
    listeners: Mutex<AbortListeners>,
}

/// A callback run when a communicator fails: the work that cannot poll the abort word (stream
/// waits on memory) is released by it.
pub type AbortListener = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct AbortListeners {
    next: u64,
    by_id: Vec<(u64, AbortListener)>,
}

impl std::fmt::Debug for AbortListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} abort listeners", self.by_id.len())
    }
}

impl AbortState {
    /// Stores `v` unless a failure is stored already (the first cause wins).
    fn set(&self, v: u64) {
        if self
            .host
            .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // At process exit the vendor runtime may have freed the word already, and nothing is
        // left to release (see `mscclpp_hal::exit`): the host copy above is all that is kept.
        let Some(_live) = mscclpp_hal::exit::enter() else {
            return;
        };
        // Nor after the application reset the device under us (nccl-tests' cudaDeviceReset
        // before exit, its communicators never destroyed): the reset freed the word.
        if self.device.lost() {
            return;
        }
        if let Some(p) = self.word.as_ref().and_then(|w| w.host_ptr()) {
            // SAFETY: `p` is the host pointer of the 8-byte, 8-aligned allocation this state
            // keeps alive; the word is only accessed atomically (here and by kernels' polls).
            unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.store(v, Ordering::Release);
        }
        // Run outside the lock: a listener may register or remove listeners itself.
        let listeners: Vec<AbortListener> = self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .iter()
            .map(|(_, l)| Arc::clone(l))
            .collect();
        for l in listeners {
            l();
        }
    }
}

impl Communicator {
    /// A communicator over an established bootstrap, using `device`.
    pub fn new(boot: Arc<Bootstrap>, device: Arc<dyn Device>) -> Self {
        // The device is open, so its runtime's own exit handlers are registered: ours goes after
        // them and runs before them.
        mscclpp_hal::exit::install();
        let word = device
            .alloc(8, MemoryKind::HostMapped)
            .and_then(|b| b.slice(0..8))
            .and_then(|w| match w.host_ptr() {
                Some(p) if (p as usize) % 8 == 0 => {
                    // SAFETY: a fresh 8-byte, host-accessible allocation, aligned (checked);
                    // nothing else refers to it yet.
                    unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.store(0, Ordering::Release);
                    Ok(w)
                }
                _ => Err(Error::Internal(
                    "host-mapped memory without an aligned host pointer".into(),
                )),
            });
        let word = match word {
            Ok(w) => Some(w),
            Err(e) => {
                // Failures are still recorded and refused on the host; only kernels already
                // waiting would not see them before their own deadline.
                tracing::warn!(error = %e, "no device-visible abort word for this communicator");
                None
            }
        };
        let abort = Arc::new(AbortState {
            host: AtomicU64::new(0),
            word,
            device: Arc::clone(&device),
            failure: Mutex::new(None),
            listeners: Mutex::new(AbortListeners::default()),
        });
        let a = Arc::clone(&abort);
        let handler = boot.on_failure(Box::new(move |f: &PeerFailure| {
            let mut first = a.failure.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some(f.clone());
            }
            drop(first);
            a.set(f.rank as u64 + 1);
        }));
        let ctx = TransportContext::new(boot.rank(), device);
        let status = status_service(&boot);
        Communicator {
            boot,
            ctx,
            setup_seq: Mutex::new(HashMap::new()),
            abort,
            handler,
            _status: status,
        }
    }

    /// The communicator's abort word (8 bytes of host-mapped memory): 0 while live, `r + 1`
    /// once rank `r` is known dead, `u64::MAX` after [`Communicator::abort`]. Kernels poll it
    /// in their waits; `None` when the device could not allocate it.
    pub fn abort_word(&self) -> Option<&BufferSlice> {
        self.abort.word.as_ref()
    }

    /// The abort word's device address, 0 when there is none (what kernels are given).
    pub fn abort_addr(&self) -> u64 {
        self.abort.word.as_ref().map_or(0, |w| w.ptr().0)
    }

    /// Why this communicator can no longer be used, if it cannot: a rank died (named, with
    /// how this rank learned it) or it was aborted.
    pub fn failure(&self) -> Option<Error> {
        let v = self.abort.host.load(Ordering::Acquire);
        if v == 0 {
            return None;
        }
        if v == ABORTED_LOCALLY {
            return Some(Error::invalid(format!(
                "rank {}: the communicator was aborted",
                self.rank()
            )));
        }
        let f = self
            .abort
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let rank = (v - 1) as usize;
        Some(Error::Remote {
            rank,
            message: match f {
                Some(f) => format!(
                    "died ({}, {}); rank {} learned it {:.3} s ago",
                    f.addr,
                    f.how,
                    self.rank(),
                    f.at.elapsed().as_secs_f64()
                ),
                None => "died".into(),
            },
        })
    }

    /// [`Communicator::failure`] as a `Result`, naming `what` was refused.
    pub fn check_live(&self) -> Result<()> {
        match self.failure() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Marks the communicator aborted: kernels waiting on it return an error at their next
    /// poll, and every later operation is refused. Callable from any thread, any number of
    /// times; a failure already recorded stays the reported cause.
    pub fn abort(&self) {
        self.abort.set(ABORTED_LOCALLY);
    }

    /// Calls `listener` once when this communicator fails (a peer found dead or
    /// [`Communicator::abort`]), at once if it has failed already; returns its id for
    /// [`Communicator::remove_abort_listener`]. For device work that cannot poll the abort word
    /// (a stream's wait on a memory word): the listener releases it. It runs on the thread that
    /// learned the failure (the bootstrap's event loop, or the caller of `abort`), so it must
    /// not block.
    pub fn on_abort(&self, listener: AbortListener) -> u64 {
        let id = {
            let mut ls = self
                .abort
                .listeners
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            ls.next += 1;
            let id = ls.next;
            ls.by_id.push((id, Arc::clone(&listener)));
            id
        };
        // A failure stored before the registration has already run the listeners; this one
        // missed it. One stored in between may run it twice: listeners must be idempotent.
        if self.abort.host.load(Ordering::Acquire) != 0 {
            listener();
        }
        id
    }

    /// Forgets the listener `id` of [`Communicator::on_abort`] (unknown ids are ignored).
    pub fn remove_abort_listener(&self, id: u64) {
        self.abort
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .retain(|(i, _)| *i != id);
    }

    /// Makes the waits of kernels launched from this thread poll this communicator's abort
    /// word until the guard is dropped (see [`mscclpp_hal::dev::abort_scope`]).
    pub fn abort_scope(&self) -> mscclpp_hal::dev::AbortScope {
        mscclpp_hal::dev::abort_scope(self.abort_addr())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.boot.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.boot.nranks()
    }

    /// The bootstrap.
    pub fn bootstrap(&self) -> &Arc<Bootstrap> {
        &self.boot
    }

    /// The device this rank uses.
    pub fn device(&self) -> &Arc<dyn Device> {
        self.ctx.device()
    }

    /// The transport context shared by this rank's connections and memories.
    pub fn context(&self) -> &Arc<TransportContext> {
        &self.ctx
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks() || peer == self.rank() {
            return Err(Error::invalid(format!(
                "peer {peer} is not another rank of this communicator (rank {} of {})",
                self.rank(),
                self.nranks()
            )));
        }
        Ok(())
    }

    /// The tag of the next set-up message exchanged with `peer`.
    fn next_setup_tag(&self, peer: usize) -> u64 {
        let mut seq = self.setup_seq.lock().unwrap_or_else(|p| p.into_inner());
        let n = seq.entry(peer).or_insert(0);
        *n += 1;
        SETUP_TAG_BIT | *n
    }

    /// Sends `bytes` to `peer` and receives the peer's bytes of the same set-up step.
    pub fn exchange(&self, peer: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let tag = self.next_setup_tag(peer);
        self.boot.send(peer, tag, bytes)?;
        self.boot.recv(peer, tag)
    }

    /// Registers local memory for the given transports.
    pub fn register_memory(
        &self,
        slice: &BufferSlice,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        RegisteredMemory::register(&self.ctx, slice, transports)
    }

    /// Sends a registered memory to `peer` and receives the one `peer` sends in the same step
    /// (mapped here where the transport maps memory).
    pub fn exchange_memory(&self, mem: &RegisteredMemory, peer: usize) -> Result<RegisteredMemory> {
        let bytes = self.exchange(peer, &mem.to_bytes())?;
        RegisteredMemory::from_bytes(&self.ctx, &bytes)
    }

    /// Connects to `peer` with the transport of `cfg` (both ranks call this with each other).
    pub fn connect(&self, peer: usize, cfg: EndpointConfig) -> Result<Arc<AnyConnection>> {
        self.check_peer(peer)?;
        let local = Endpoint::new(&self.ctx, cfg)?;
        let remote_bytes = self.exchange(peer, &local.endpoint().to_bytes())?;
        let remote = Endpoint::from_bytes(&remote_bytes)?;
        if remote.rank != peer {
            return Err(Error::Remote {
                rank: peer,
                message: format!("sent an endpoint of rank {}", remote.rank),
            });
        }
        Ok(Arc::new(mscclpp_transports::connect(local, &remote)?))
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.boot.remove_failure_handler(self.handler);
        if self.abort.host.load(Ordering::Acquire) != 0 {
            // A failed or aborted communicator is freed without waiting for its kernels
            // (ncclCommAbort); one may still be polling the word, so it is never unmapped.
            std::mem::forget(self.abort.word.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use mscclpp_hal::Backend;

    use super::*;
    use crate::bootstrap::{BootstrapConfig, BootstrapRoot};

    fn one_rank() -> (BootstrapRoot, Communicator) {
        let cfg = BootstrapConfig::default();
        let (root, uid) =
            BootstrapRoot::start("127.0.0.1:0".parse().unwrap(), 1, &cfg).expect("root");
        let boot = Arc::new(Bootstrap::new(&uid, 0, 1, cfg).expect("bootstrap"));
        let device = mscclpp_host::HostBackend::new()
            .open_device(0)
            .expect("host device");
        (root, Communicator::new(boot, device))
    }

    /// A listener runs once at the first failure (not again at a second), at once when
    /// registered after it, and never once removed.
    #[test]
    fn abort_listeners_run_once_at_the_first_failure() {
        let (_root, comm) = one_rank();
        let count = |c: &Arc<AtomicUsize>| {
            let c = Arc::clone(c);
            Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }) as AbortListener
        };
        let (a, gone) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        comm.on_abort(count(&a));
        let id = comm.on_abort(count(&gone));
        comm.remove_abort_listener(id);
        assert_eq!(a.load(Ordering::SeqCst), 0);
        comm.abort();
        comm.abort();
        assert_eq!(a.load(Ordering::SeqCst), 1);
        assert_eq!(gone.load(Ordering::SeqCst), 0);
        let late = Arc::new(AtomicUsize::new(0));
        comm.on_abort(count(&late));
        assert_eq!(late.load(Ordering::SeqCst), 1);
        assert!(comm.check_live().is_err());
    }
}
