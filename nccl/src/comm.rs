//! Communicators: set-up, the registry of live handles, and the native/fallback dispatch of
//! operations.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use mscclpp::collectives::{CollectiveCall, CollectiveKind, Collectives, P2pKind, P2pOp};
use mscclpp::comm::{Bootstrap, BootstrapConfig, Communicator, UniqueId};
use mscclpp::hal::{
    BufferSlice, DataType, Device, DeviceBuffer, DevicePtr, MemoryKind, ReduceOp, Stream,
};

use mscclpp_caller::{Caller, buffer_bytes};

use crate::abi::*;
use crate::error::{Failure, Res};
use crate::lifecycle::CommConfig;
use crate::real::{RealNccl, RealResults, no_real, real};

/// The operations this library dispatches (names as in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclReduce`.
    Reduce,
    /// `ncclSend`.
    Send,
    /// `ncclRecv`.
    Recv,
}

impl Op {
    const ALL: [Op; 8] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::AllToAll,
        Op::Reduce,
        Op::Send,
        Op::Recv,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "allreduce",
            Op::AllGather => "allgather",
            Op::ReduceScatter => "reducescatter",
            Op::Broadcast => "broadcast",
            Op::AllToAll => "alltoall",
            Op::Reduce => "reduce",
            Op::Send => "send",
            Op::Recv => "recv",
        }
    }

    /// The collective of mscclpp that serves it, if one does.
    pub fn collective(self) -> Option<CollectiveKind> {
        match self {
            Op::AllReduce => Some(CollectiveKind::AllReduce),
            Op::AllGather => Some(CollectiveKind::AllGather),
            Op::ReduceScatter => Some(CollectiveKind::ReduceScatter),
            Op::Broadcast => Some(CollectiveKind::Broadcast),
            Op::AllToAll => Some(CollectiveKind::AllToAll),
            Op::Reduce | Op::Send | Op::Recv => None,
        }
    }

    fn parse(s: &str) -> Option<Op> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "bcast" => Some(Op::Broadcast),
            "all_reduce" => Some(Op::AllReduce),
            "all_gather" => Some(Op::AllGather),
            "reduce_scatter" => Some(Op::ReduceScatter),
            "all_to_all" | "alltoallv" => Some(Op::AllToAll),
            _ => Op::ALL.into_iter().find(|o| o.name() == s),
        }
    }
}

/// `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`: `all`, or a comma list of operation names.
fn forced() -> Res<&'static HashSet<Op>> {
    static FORCED: OnceLock<Result<HashSet<Op>, Failure>> = OnceLock::new();
    FORCED
        .get_or_init(|| {
            const VAR: &str = "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION";
            let Some(v) = mscclpp::hal::env::get(VAR) else {
                return Ok(HashSet::new());
            };
            let mut set = HashSet::new();
            for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                if part.eq_ignore_ascii_case("all") {
                    set.extend(Op::ALL);
                } else {
                    set.insert(Op::parse(part).ok_or_else(|| {
                        Failure::argument(format!(
                            "{VAR}={v:?}: unknown operation {part:?}; expected `all` or a comma list of {}",
                            Op::ALL.map(Op::name).join(", ")
                        ))
                    })?);
                }
            }
            Ok(set)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Logs once per operation kind which way it went.
fn log_route(op: Op, native: bool, why: &str) {
    static LOGGED: [[AtomicBool; 8]; 2] = [const { [const { AtomicBool::new(false) }; 8] }; 2];
    let slot = &LOGGED[usize::from(native)][Op::ALL.iter().position(|o| *o == op).unwrap_or(0)];
    if !slot.swap(true, Ordering::Relaxed) {
        if native {
            tracing::info!(op = op.name(), "served natively by mscclpp");
        } else {
            tracing::info!(op = op.name(), "falls back to the real NCCL: {why}");
        }
    }
}

/// Element size and HAL type of an `ncclDataType_t` (every NCCL 2.28 type has one).
pub fn dtype_info(code: c_int) -> Res<(usize, Option<DataType>)> {
    use crate::abi::dtype as d;
    let t = match code {
        d::INT8 => DataType::I8,
        d::UINT8 => DataType::U8,
        d::INT32 => DataType::I32,
        d::UINT32 => DataType::U32,
        d::INT64 => DataType::I64,
        d::UINT64 => DataType::U64,
        d::FLOAT16 => DataType::F16,
        d::FLOAT32 => DataType::F32,
        d::FLOAT64 => DataType::F64,
        d::BFLOAT16 => DataType::BF16,
        d::FLOAT8E4M3 => DataType::F8E4M3,
        d::FLOAT8E5M2 => DataType::F8E5M2,
        other => {
            return Err(Failure::argument(format!(
                "unknown ncclDataType_t {other} (this library knows 0..=11: int8 ... float8e5m2)"
            )));
        }
    };
    Ok((t.size(), Some(t)))
}

/// The HAL operator of an `ncclRedOp_t` (`None`: a user-created operator, served by fallback).
pub fn op_info(code: c_int) -> Res<Option<ReduceOp>> {
    use crate::abi::redop as r;
    Ok(match code {
        r::SUM => Some(ReduceOp::Sum),
        r::PROD => Some(ReduceOp::Prod),
        r::MAX => Some(ReduceOp::Max),
        r::MIN => Some(ReduceOp::Min),
        r::AVG => Some(ReduceOp::Avg),
        c if c >= r::NUM_OPS => None,
        other => return Err(Failure::argument(format!("invalid ncclRedOp_t {other}"))),
    })
}

/// The mscclpp side of a communicator.
#[derive(Debug)]
pub struct Native {
    /// The caller side the Python package shares: the communicator, its collectives (none with
    /// one rank, where operations are copies, or where they cannot serve the ranks: then every
    /// operation falls back), its own stream (what `stream == NULL` means on the host backend)
    /// and the wrapped streams of callers.
    caller: Caller,
    /// Where `ncclReduce` leaves the all-reduce's result on the ranks other than the root
    /// ([`REDUCE_CHUNK_BYTES`], allocated with the communicator: nothing is allocated while a
    /// stream may be capturing).
    reduce_sink: Option<DeviceBuffer>,
    /// Execution plans of `MSCCLPP_EXECUTION_PLAN_DIR`, tried ahead of the collectives.
    plans: Option<crate::plans::Plans>,
    /// Where a PreMulSum reduce-scatter or reduce scales this rank's input (the caller's send
    /// buffer is read-only): the current buffer last, grown on demand; the earlier ones stay
    /// allocated with the communicator since calls already enqueued may still read them.
    premul_staging: Mutex<Vec<DeviceBuffer>>,
}

/// Bytes of the all-reduces `ncclReduce` is made of (the last may be shorter).
pub const REDUCE_CHUNK_BYTES: usize = 8 << 20;

impl Native {
    /// The mscclpp communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        self.caller.communicator()
    }

    /// Whether the device is the host backend's.
    pub fn comm_backend_is_host(&self) -> bool {
        self.caller.is_host()
    }

    /// Waits for the communicator's own stream.
    pub fn sync_internal(&self) -> Res<()> {
        Ok(self.caller.internal().synchronize()?)
    }

    /// The stream of a call: NULL is the legacy default stream on GPUs and the communicator's
    /// own on the host backend (which refuses any other).
    fn stream(&self, stream: CudaStream) -> Res<Arc<dyn Stream>> {
        let h = stream as u64;
        if self.caller.is_host() && h != 0 {
            // NCCL's code for a bad argument, as for any other bad pointer.
            return Err(Failure::argument(format!(
                "stream {stream:p}: the host backend has no native streams; pass NULL (the communicator's own stream)"
            )));
        }
        Ok(self.caller.stream((h != 0).then_some(h))?)
    }
}

/// A real NCCL communicator and the library it belongs to.
#[derive(Debug)]
pub struct RealComm {
    /// The library.
    pub lib: &'static RealNccl,
    /// Its `ncclComm_t`.
    pub comm: NcclComm,
}

// SAFETY: an ncclComm_t may be used from any thread (NCCL serialises what needs it); we only
// pass the handle to NCCL.
unsafe impl Send for RealComm {}
// SAFETY: as above.
unsafe impl Sync for RealComm {}

/// What an `ncclComm_t` of this library points to.
#[derive(Debug)]
pub struct Comm {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// The CUDA (or host-backend) device ordinal.
    pub device: i32,
    /// The mscclpp communicator (`None` for communicators made by the real NCCL: split,
    /// shrink, init-all).
    pub native: Option<Native>,
    /// The real NCCL communicator, when `MSCCLPP_NCCL_LIB_PATH` is set.
    pub real: Mutex<Option<RealComm>>,
    /// An error that made the communicator unusable (`ncclCommGetAsyncError`).
    pub async_error: AtomicI32,
    /// The `ncclConfig_t` it was made with (a split or shrink without one inherits it).
    pub config: CommConfig,
    /// A non-blocking `ncclCommFinalize` still running: `ncclInProgress` until it is done.
    pub busy: Mutex<Option<Arc<Job>>>,
    /// `ncclCommFinalize` has run: only destroy and abort remain.
    pub finalized: AtomicBool,
}

/// Live communicators by serial number. Every export looks its handle up here, so a stale,
/// foreign or garbage handle is `ncclInvalidArgument` rather than a crash.
///
/// A handle is not an address: it encodes a serial number that is never issued twice
/// (`serial * HANDLE_STRIDE + HANDLE_TAG`), so the handle of a destroyed communicator can never
/// come to name a later one, as a reused allocation address would. NCCL's clients only store,
/// compare and pass `ncclComm_t` values, never dereference them.
///
/// A handle is issued before its communicator exists when the creation runs in the background
/// (non-blocking config, or inside a group): the slot is [`Slot::Pending`] until the job ends.
struct Registry {
    live: HashMap<u64, Slot>,
    /// The next serial number; those below it were issued.
    next: u64,
}

/// What a live handle names.
#[derive(Debug, Clone)]
pub enum Slot {
    /// A usable communicator.
    Ready(Arc<Comm>),
    /// Being created by a background job (`ncclCommGetAsyncError`: `ncclInProgress`).
    Pending(Arc<Job>),
    /// Its creation failed; only `ncclCommGetAsyncError`, destroy and abort make sense.
    Failed(Failure),
}

/// A communicator creation (or a non-blocking finalize) running on its own thread.
#[derive(Debug)]
pub struct Job {
    /// `None` while running, then its result.
    done: Mutex<Option<Res<()>>>,
    cv: Condvar,
}

impl Job {
    /// A job that has not finished.
    pub fn new() -> Arc<Self> {
        Arc::new(Job {
            done: Mutex::new(None),
            cv: Condvar::new(),
        })
    }

    /// Records the result and wakes the waiters.
    pub fn finish(&self, r: Res<()>) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    /// The result, if the job has finished.
    pub fn result(&self) -> Option<Res<()>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the job has finished or `deadline` passes (then an error saying so: the job
    /// goes on and settles its slot when it ends).
    pub fn wait(&self, deadline: Instant, what: &str) -> Res<()> {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Failure {
                    code: NCCL_REMOTE_ERROR,
                    message: format!(
                        "{what} did not finish before its deadline (the bootstrap's timeout, MSCCLPP_BOOTSTRAP_TIMEOUT, per step): a rank never joined?"
                    ),
                });
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Handles are `serial * HANDLE_STRIDE + HANDLE_TAG`: never 0 (NULL), never aligned like a
/// pointer, so a foreign value rarely decodes as one of ours.
const HANDLE_STRIDE: u64 = 16;
const HANDLE_TAG: u64 = 0xd;

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            live: HashMap::new(),
            next: 1,
        })
    })
}

fn lock_registry() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

fn handle_of(serial: u64) -> NcclComm {
    (serial * HANDLE_STRIDE + HANDLE_TAG) as usize as NcclComm
}

fn insert(slot: Slot) -> NcclComm {
    let mut r = lock_registry();
    let serial = r.next;
    r.next += 1;
    r.live.insert(serial, slot);
    handle_of(serial)
}

/// Registers a communicator; returns its handle.
pub fn register(c: Comm) -> NcclComm {
    insert(Slot::Ready(Arc::new(c)))
}

/// Issues the handle of a communicator a background job is creating; the job settles it with
/// [`settle`].
pub fn register_pending(job: &Arc<Job>) -> NcclComm {
    insert(Slot::Pending(Arc::clone(job)))
}

/// Ends a pending slot: the communicator (or the failure) replaces the job. If the handle was
/// destroyed or aborted meanwhile, the communicator is released here instead. The job is
/// finished last, so whoever waits on it finds the slot settled.
pub fn settle(h: NcclComm, job: &Arc<Job>, made: Res<Comm>) {
    let serial = h as usize as u64 / HANDLE_STRIDE;
    let result = made.as_ref().map(|_| ()).map_err(Clone::clone);
    let orphan = {
        let mut r = lock_registry();
        match r.live.get_mut(&serial) {
            Some(slot @ Slot::Pending(_)) => {
                *slot = match made {
                    Ok(c) => Slot::Ready(Arc::new(c)),
                    Err(f) => Slot::Failed(f),
                };
                None
            }
            _ => made.ok(),
        }
    };
    if let Some(c) = orphan {
        tracing::debug!(
            "a communicator finished after its handle {h:p} was destroyed or aborted; releasing it"
        );
        c.abort_native();
        if let Err(e) = c.release_real(true) {
            tracing::warn!("{}", e.message);
        }
    }
    job.finish(result);
}

/// The serial number a handle encodes, or why it names no communicator.
fn serial_of(h: NcclComm, r: &Registry) -> Res<u64> {
    if h.is_null() {
        return Err(Failure::argument("comm is NULL"));
    }
    let v = h as usize as u64;
    let serial = v / HANDLE_STRIDE;
    if v % HANDLE_STRIDE != HANDLE_TAG || serial == 0 || serial >= r.next {
        return Err(Failure::argument(format!(
            "comm {h:p} is not a communicator of this library (not made by its \
             ncclCommInitRank, or corrupted)"
        )));
    }
    if !r.live.contains_key(&serial) {
        return Err(Failure::argument(format!(
            "comm {h:p} was destroyed (ncclCommDestroy/ncclCommAbort): a stale handle"
        )));
    }
    Ok(serial)
}

/// What a handle names now, whatever its state.
pub fn slot(h: NcclComm) -> Res<Slot> {
    let r = lock_registry();
    let serial = serial_of(h, &r)?;
    r.live
        .get(&serial)
        .cloned()
        .ok_or_else(|| Failure::argument(format!("comm {h:p} was destroyed")))
}

/// Why a slot that is not [`Slot::Ready`] cannot be used, as NCCL says it.
fn not_ready(h: NcclComm, s: Slot) -> Res<Arc<Comm>> {
    match s {
        Slot::Ready(c) => match c.busy_job() {
            None => Ok(c),
            Some(_) => Err(in_progress_misuse(h)),
        },
        Slot::Pending(_) => Err(in_progress_misuse(h)),
        Slot::Failed(f) => Err(Failure {
            code: f.code,
            message: format!("comm {h:p} failed to initialise: {}", f.message),
        }),
    }
}

/// NCCL's answer to a call on a communicator whose last non-blocking operation is still
/// running: `ncclInvalidArgument` (its `ncclCommEnsureReady`).
fn in_progress_misuse(h: NcclComm) -> Failure {
    Failure::argument(format!(
        "attempt to use communicator {h:p} before the previous operation returned ncclSuccess: \
         poll ncclCommGetAsyncError until it is no longer ncclInProgress"
    ))
}

/// The communicator behind a handle, ready for use (not pending, not finalizing).
pub fn lookup(h: NcclComm) -> Res<Arc<Comm>> {
    not_ready(h, slot(h)?)
}

/// As [`lookup`], for operations: also refuses a finalized communicator.
pub fn lookup_for_op(h: NcclComm) -> Res<Arc<Comm>> {
    let c = lookup(h)?;
    if c.finalized.load(Ordering::Acquire) {
        return Err(Failure::usage(format!(
            "comm {h:p} was finalized (ncclCommFinalize): only ncclCommDestroy or ncclCommAbort may follow"
        )));
    }
    Ok(c)
}

/// Removes a handle from the registry (destroy / abort), whatever its state.
pub fn unregister(h: NcclComm) -> Res<Slot> {
    let mut r = lock_registry();
    let serial = serial_of(h, &r)?;
    r.live
        .remove(&serial)
        .ok_or_else(|| Failure::argument(format!("comm {h:p} was destroyed")))
}

/// The checked `(nranks, rank)` of an init call.
pub fn check_ranks(nranks: c_int, rank: c_int) -> Res<(usize, usize)> {
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| Failure::argument(format!("nranks {nranks}: must be at least 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Failure::argument(format!("rank {rank} is not in 0..{n}")))?;
    Ok((n, r))
}

/// Decodes an `ncclUniqueId` made by this library's `ncclGetUniqueId`.
pub fn decode_id(id: &NcclUniqueId) -> Res<UniqueId> {
    UniqueId::from_bytes(&id.internal).map_err(|e| {
        Failure::argument(format!(
            "the ncclUniqueId was not made by this library's ncclGetUniqueId: {e}"
        ))
    })
}

/// What an init call settles on the calling thread before the work may move to another one:
/// the checked arguments and the device (the caller's current one: CUDA's current device is
/// per thread, so a background job cannot ask for it).
#[derive(Debug, Clone)]
pub struct InitPlan {
    /// Ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The bootstrap id.
    pub uid: UniqueId,
    /// The device ordinal; `None`: pick by the rank's position on its host.
    pub ordinal: Option<usize>,
    /// The communicator's configuration.
    pub config: CommConfig,
}

impl InitPlan {
    /// Checks the arguments and reads the calling thread's current device.
    pub fn new(nranks: c_int, id: &NcclUniqueId, rank: c_int, config: CommConfig) -> Res<Self> {
        crate::debug::show_version();
        let (n, r) = check_ranks(nranks, rank)?;
        forced()?;
        let uid = decode_id(id)?;
        real()?;
        let ordinal = mscclpp::registry::select()?.current_device()?;
        Ok(InitPlan {
            nranks: n,
            rank: r,
            uid,
            ordinal,
            config,
        })
    }
}

/// Creates this rank's communicator (`ncclCommInitRank*`): bootstrap, device, real NCCL
/// (when configured), collectives. Blocks until every rank has joined (or the bootstrap's
/// deadline).
pub fn init_rank(plan: InitPlan) -> Res<Comm> {
    let (n, r) = (plan.nranks, plan.rank);
    let real_lib = real()?;
    let boot = Arc::new(Bootstrap::new(
        &plan.uid,
        r,
        n,
        BootstrapConfig::from_env()?,
    )?);
    let backend = mscclpp::registry::select()?;
    let ordinal = match plan.ordinal {
        Some(d) => d,
        None => {
            let count = backend.device_count().max(1);
            boot.host_rank() % count
        }
    };
    let device: Arc<dyn Device> = backend.open_device(ordinal)?;
    crate::debug::set_device(ordinal as i32);
    tracing::info!(
        target: crate::debug::INIT,
        "ncclCommInitRank rank {r} nranks {n} cudaDev {ordinal} backend {} ({}) - Init START",
        device.info().backend,
        backend.describe()
    );
    // The real NCCL communicator: rank 0 makes its id, the bootstrap carries it.
    let real_comm = match real_lib {
        None => None,
        Some(lib) => {
            device.make_current()?;
            let mut rid = NcclUniqueId {
                internal: [0; NCCL_UNIQUE_ID_BYTES],
            };
            let mut status = vec![1u8];
            if r == 0 {
                let get = lib.need(lib.get_unique_id, "ncclGetUniqueId")?;
                // SAFETY: valid out-pointer to a 128-byte struct.
                if let Err(e) = lib.check("ncclGetUniqueId", unsafe { get(&mut rid) }) {
                    tracing::warn!("{}", e.message);
                    status[0] = 0;
                }
                status.extend_from_slice(&rid.internal);
            }
            let got = boot.broadcast(0, &status)?;
            if got.first() != Some(&1) || got.len() != 1 + NCCL_UNIQUE_ID_BYTES {
                return Err(Failure::system(
                    "rank 0 could not create the real NCCL's unique id (see rank 0's log)",
                ));
            }
            rid.internal.copy_from_slice(&got[1..]);
            let init = lib.need(lib.comm_init_rank, "ncclCommInitRank")?;
            let mut c: NcclComm = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the id came from rank 0's real ncclGetUniqueId; the
            // caller's device is current.
            lib.check("ncclCommInitRank", unsafe {
                init(&mut c, n as c_int, rid, r as c_int)
            })?;
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: real NCCL communicator for fallback operations ready ({}, version {})",
                lib.path,
                lib.version
            );
            Some(RealComm { lib, comm: c })
        }
    };
    build(boot, device, real_comm, plan.config)
}

/// A communicator of this library over `boot` (a fresh bootstrap, or a split or shrunk view of
/// a parent's) on `device`: its stream, collectives and reduce sink. Collective over `boot`'s
/// ranks. If anything fails, `real_comm` is released here.
pub fn build(
    boot: Arc<Bootstrap>,
    device: Arc<dyn Device>,
    real_comm: Option<RealComm>,
    config: CommConfig,
) -> Res<Comm> {
    let (r, n) = (boot.rank(), boot.nranks());
    let ordinal = device.info().ordinal;
    let one_host = boot.hosts().iter().all(|&h| h == boot.hosts()[r]);
    let made = (|| -> Res<Native> {
        let caller = Caller::new(Arc::new(Communicator::new(boot, device)))?;
        if let Some(why) = caller.no_collectives() {
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: every collective of this communicator falls back to the real NCCL: {why}"
            );
        }
        let reduce_sink = match caller.collectives() {
            Some(_) => Some(
                caller
                    .communicator()
                    .device()
                    .alloc(REDUCE_CHUNK_BYTES, MemoryKind::Device)?,
            ),
            None => None,
        };
        // Execution plans connect the ranks of one host.
        let plans = caller
            .collectives()
            .filter(|_| one_host)
            .and_then(|_| crate::plans::Plans::from_env(&caller));
        Ok(Native {
            caller,
            reduce_sink,
            plans,
            premul_staging: Mutex::new(Vec::new()),
        })
    })();
    crate::debug::set_device(ordinal as i32);
    if let Ok(native) = &made {
        log_served(r, n, ordinal, native, real_comm.is_some());
    }
    let c = Comm {
        rank: r,
        nranks: n,
        device: ordinal as i32,
        native: None,
        real: Mutex::new(real_comm),
        async_error: AtomicI32::new(NCCL_SUCCESS),
        config,
        busy: Mutex::new(None),
        finalized: AtomicBool::new(false),
    };
    match made {
        Ok(native) => Ok(Comm {
            native: Some(native),
            ..c
        }),
        Err(f) => {
            if let Err(e) = c.release_real(true) {
                tracing::warn!("{}", e.message);
            }
            Err(f)
        }
    }
}

/// The init lines (`NCCL_DEBUG=INFO`) of a native communicator: who serves it, and the
/// algorithm each collective takes (forced by `MSCCLPP_ALGO_*` or chosen by size).
fn log_served(r: usize, n: usize, ordinal: usize, native: &Native, has_real: bool) {
    if !tracing::enabled!(target: crate::debug::INIT, tracing::Level::INFO) {
        return;
    }
    let forced = forced().map(|f| f.iter().map(|o| o.name()).collect::<Vec<_>>());
    let forced = match forced {
        Ok(mut f) if !f.is_empty() => {
            f.sort_unstable();
            format!(
                "; forced to the real NCCL by MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION: {}",
                f.join(",")
            )
        }
        _ => String::new(),
    };
    let fallback = if has_real {
        "the real NCCL for the rest"
    } else {
        "no real NCCL loaded (MSCCLPP_NCCL_LIB_PATH unset)"
    };
    let served = match (native.caller.collectives(), n) {
        (Some(_), _) => "natively by mscclpp-rs",
        (None, 1) => "natively by mscclpp-rs (one rank: operations are copies)",
        (None, _) => "by the real NCCL (no native collectives)",
    };
    tracing::info!(
        target: crate::debug::INIT,
        "comm rank {r} nranks {n} cudaDev {ordinal} - Init COMPLETE: served {served}; {fallback}{forced}"
    );
    if let Some(colls) = native.caller.collectives() {
        const KIB: u64 = 1 << 10;
        for kind in CollectiveKind::ALL {
            let by_size = [4 * KIB, 256 * KIB, 16 * KIB * KIB]
                .map(|b| format!("{}:{}", size_label(b), colls.algorithm(kind, b).name()));
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: {kind:?} algorithm by rank-block size {}",
                by_size.join(" ")
            );
        }
    }
}

fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

/// A communicator made by the real NCCL (split, shrink, init-all): every operation falls back.
///
/// # Safety
/// `c` must be a live communicator of `lib`; the result takes it over (destroys it).
pub unsafe fn from_real(lib: &'static RealNccl, c: NcclComm) -> Res<Comm> {
    let (mut rank, mut count, mut dev) = (0, 0, -1);
    // SAFETY: valid out-pointers; `c` is a live real communicator.
    unsafe {
        lib.check(
            "ncclCommUserRank",
            lib.need(lib.comm_user_rank, "ncclCommUserRank")?(c, &mut rank),
        )?;
        lib.check(
            "ncclCommCount",
            lib.need(lib.comm_count, "ncclCommCount")?(c, &mut count),
        )?;
        if let Some(f) = lib.comm_cu_device {
            f(c, &mut dev);
        }
    }
    Ok(Comm {
        rank: usize::try_from(rank).unwrap_or(0),
        nranks: usize::try_from(count).unwrap_or(0),
        device: dev,
        native: None,
        real: Mutex::new(Some(RealComm { lib, comm: c })),
        async_error: AtomicI32::new(NCCL_SUCCESS),
        config: CommConfig::default(),
        busy: Mutex::new(None),
        finalized: AtomicBool::new(false),
    })
}

thread_local! {
    /// `ncclGroupStart` nesting depth on this thread.
    static GROUP_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The real NCCL library whose group this thread has opened (lazily, at the first
    /// fallback operation inside our group), to be closed at the outermost `ncclGroupEnd`.
    static REAL_GROUP: std::cell::Cell<Option<&'static RealNccl>> = const { std::cell::Cell::new(None) };
    /// Native sends and receives of this thread's open group, in call order: launched at the
    /// outermost `ncclGroupEnd`, one launch per communicator.
    static PENDING: std::cell::RefCell<Vec<(Arc<Comm>, Call)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Communicator creations started inside this thread's open group (job, blocking, what):
    /// the outermost `ncclGroupEnd` waits for the blocking ones.
    static GROUP_JOBS: std::cell::RefCell<Vec<(Arc<Job>, bool, &'static str)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Leaves a creation started inside the open group to the outermost `ncclGroupEnd`.
pub fn defer_job(job: Arc<Job>, blocking: bool, what: &'static str) {
    GROUP_JOBS.with(|g| g.borrow_mut().push((job, blocking, what)));
}

/// The outermost `ncclGroupEnd`'s wait for the group's creations: the blocking ones must end
/// (within the deadline); a non-blocking one makes the group end `ncclInProgress`.
fn end_group_jobs() -> Res<()> {
    let jobs = GROUP_JOBS.with(|g| std::mem::take(&mut *g.borrow_mut()));
    if jobs.is_empty() {
        return Ok(());
    }
    let deadline = crate::lifecycle::job_deadline();
    let mut first: Option<Failure> = None;
    let mut in_progress = false;
    for (job, blocking, what) in &jobs {
        if !blocking {
            in_progress |= job.result().is_none();
            continue;
        }
        if let Err(f) = job.wait(deadline, what) {
            first.get_or_insert(Failure {
                code: f.code,
                message: format!("{what} inside the group: {}", f.message),
            });
        }
    }
    match first {
        Some(f) => Err(f),
        None if in_progress => Err(Failure::in_progress()),
        None => Ok(()),
    }
}

/// `ncclGroupStart`.
pub fn group_start() -> Res<()> {
    GROUP_DEPTH.with(|d| d.set(d.get().saturating_add(1)));
    Ok(())
}

/// `ncclGroupEnd`.
pub fn group_end() -> Res<()> {
    let depth = GROUP_DEPTH.with(|d| d.get());
    if depth == 0 {
        return Err(Failure::usage(
            "ncclGroupEnd without a matching ncclGroupStart",
        ));
    }
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    if depth == 1 {
        // Creations first: operations in the same group may use what they create.
        let created = end_group_jobs();
        // The group's native sends and receives: one launch per communicator.
        let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        let mut first_error: Option<Failure> = None;
        let mut done: Vec<*const Comm> = Vec::new();
        for (c, _) in &pending {
            if done.contains(&Arc::as_ptr(c)) {
                continue;
            }
            done.push(Arc::as_ptr(c));
            let calls: Vec<Call> = pending
                .iter()
                .filter(|(d, _)| Arc::ptr_eq(c, d))
                .map(|(_, call)| *call)
                .collect();
            if let Err(e) = c.run_p2p(&calls) {
                first_error.get_or_insert(e);
            }
        }
        if let Some(lib) = REAL_GROUP.with(|g| g.take()) {
            let end = lib.need(lib.group_end, "ncclGroupEnd")?;
            // SAFETY: closes the group this thread opened in the real NCCL.
            lib.check("ncclGroupEnd", unsafe { end() })?;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        created?;
    }
    Ok(())
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    GROUP_DEPTH.with(|d| d.get()) > 0
}

/// Inside our group, opens the real NCCL's group once, before the first forwarded operation.
fn enter_real_group(lib: &'static RealNccl) -> Res<()> {
    if !in_group() || REAL_GROUP.with(|g| g.get()).is_some() {
        return Ok(());
    }
    let start = lib.need(lib.group_start, "ncclGroupStart")?;
    // SAFETY: no arguments; balanced at the outermost ncclGroupEnd.
    lib.check("ncclGroupStart", unsafe { start() })?;
    REAL_GROUP.with(|g| g.set(Some(lib)));
    Ok(())
}

/// One collective call, as the C API gave it.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Which operation.
    pub op: Op,
    /// Send buffer.
    pub send: *const c_void,
    /// Receive buffer.
    pub recv: *mut c_void,
    /// Element count (per rank block, as NCCL defines it per operation).
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// `ncclRedOp_t` (reducing operations).
    pub redop: c_int,
    /// Root (broadcast, reduce) or peer (send, recv).
    pub root: c_int,
    /// `cudaStream_t`.
    pub stream: CudaStream,
}

impl Comm {
    /// The real communicator, if any.
    fn real_comm(&self) -> Option<(&'static RealNccl, NcclComm)> {
        self.real
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| (r.lib, r.comm))
    }

    /// The real communicator and its library, if any (split, shrink, async errors).
    pub fn real_parts(&self) -> Option<(&'static RealNccl, NcclComm)> {
        self.real_comm()
    }

    /// Marks the communicator in progress until `job` ends (a non-blocking finalize, or a
    /// split or shrink of it).
    pub fn set_busy(&self, job: Arc<Job>) {
        *self.busy.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
    }

    /// The job that keeps the communicator in progress, if it is still running.
    pub fn busy_job(&self) -> Option<Arc<Job>> {
        let g = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().filter(|j| j.result().is_none()).cloned()
    }

    /// Takes the last in-progress job, finished or not.
    pub fn take_busy(&self) -> Option<Arc<Job>> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Runs one operation natively or through the real NCCL (a native send or receive inside a
    /// group waits for the outermost `ncclGroupEnd`).
    pub fn run(self: &Arc<Self>, call: Call) -> Res<()> {
        let (esize, hal_dtype) = dtype_info(call.dtype)?;
        let reduces = matches!(call.op, Op::AllReduce | Op::ReduceScatter | Op::Reduce);
        let hal_op = if reduces { op_info(call.redop)? } else { None };
        // A PreMulSum operator: a sum, then the output scaled (or the real NCCL's operator).
        let user = match (reduces, hal_op) {
            (true, None) => Some(crate::premul::resolve(self, call.redop, call.dtype)?),
            _ => None,
        };
        let hal_op = hal_op.or(user.as_ref().map(|_| ReduceOp::Sum));
        let n = self.nranks;
        if matches!(call.op, Op::Broadcast | Op::Reduce | Op::Send | Op::Recv) {
            let r = usize::try_from(call.root).ok().filter(|&r| r < n);
            if r.is_none() {
                return Err(Failure::argument(format!(
                    "{} {} {} is not a rank of {n}",
                    call.op.name(),
                    if matches!(call.op, Op::Send | Op::Recv) {
                        "peer"
                    } else {
                        "root"
                    },
                    call.root
                )));
            }
        }
        let needs_send = !matches!(call.op, Op::Recv);
        let needs_recv = !matches!(call.op, Op::Send);
        if call.count > 0 {
            let root_only_send = call.op == Op::Broadcast && call.root as usize != self.rank;
            if needs_send && !root_only_send && call.send.is_null() {
                return Err(Failure::argument(format!(
                    "{}: sendbuff is NULL",
                    call.op.name()
                )));
            }
            let root_only_recv = call.op == Op::Reduce && call.root as usize != self.rank;
            if needs_recv && !root_only_recv && call.recv.is_null() {
                return Err(Failure::argument(format!(
                    "{}: recvbuff is NULL",
                    call.op.name()
                )));
            }
        }
        // The native plan: which HAL type moves the bytes, or why not.
        let forced = forced()?;
        let plan = (|| -> Result<(DataType, usize, ReduceOp), String> {
            if forced.contains(&call.op) {
                return Err("forced by MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION".into());
            }
            let native = self
                .native
                .as_ref()
                .ok_or("the communicator was made by the real NCCL")?;
            if !native.caller.serves() {
                return Err(native
                    .caller
                    .no_collectives()
                    .unwrap_or_default()
                    .to_owned());
            }
            match call.op {
                Op::Send | Op::Recv
                    if native
                        .caller
                        .collectives()
                        .is_some_and(|c| c.hosts().is_some()) =>
                {
                    Err("sends and receives between hosts are not served natively yet".into())
                }
                Op::Send | Op::Recv => {
                    call.count.checked_mul(esize).ok_or("count overflows")?;
                    let dt = hal_dtype.ok_or_else(|| {
                        format!("no native type for ncclDataType_t {}", call.dtype)
                    })?;
                    Ok((dt, call.count, ReduceOp::Sum))
                }
                Op::AllReduce | Op::ReduceScatter | Op::Reduce => {
                    if user.as_ref().is_some_and(|u| u.scaler.is_none()) {
                        return Err("a PreMulSum operator of a fallback communicator".into());
                    }
                    let op = hal_op.ok_or("no native reduction operator")?;
                    let dt = hal_dtype.ok_or_else(|| {
                        format!("no native reduction of ncclDataType_t {}", call.dtype)
                    })?;
                    Ok((dt, call.count, op))
                }
                Op::AllGather | Op::Broadcast | Op::AllToAll => {
                    // Pure data movement: any type.
                    call.count.checked_mul(esize).ok_or("count overflows")?;
                    let dt = hal_dtype.ok_or_else(|| {
                        format!("no native type for ncclDataType_t {}", call.dtype)
                    })?;
                    Ok((dt, call.count, ReduceOp::Sum))
                }
            }
        })();
        match plan {
            Ok((dt, count, op)) => {
                log_route(call.op, true, "");
                self.log_call(&call, || {
                    let algo = call
                        .op
                        .collective()
                        .zip(self.native.as_ref()?.caller.collectives())
                        .map(|(kind, colls)| {
                            colls.algorithm(kind, count as u64 * dt.size() as u64)
                        });
                    match algo {
                        Some(a) => Some(format!("native ({a})")),
                        None => Some("native".into()),
                    }
                });
                if matches!(call.op, Op::Send | Op::Recv) {
                    if in_group() {
                        PENDING.with(|p| p.borrow_mut().push((self.clone(), call)));
                        return Ok(());
                    }
                    return self.run_p2p(&[call]);
                }
                if call.count == 0 {
                    return Ok(());
                }
                match &user {
                    Some(u) => {
                        let scaled = self.pre_scale(call, dt, count, u)?;
                        self.run_native(scaled, dt, count, op)
                    }
                    None => self.run_native(call, dt, count, op),
                }
            }
            Err(why) => {
                log_route(call.op, false, &why);
                self.log_call(&call, || Some(format!("real NCCL ({why})")));
                let call = match &user {
                    None => call,
                    Some(u) => Call {
                        redop: u.real.ok_or_else(|| {
                            no_real(&format!(
                                "{} with PreMulSum operator {} ({why})",
                                call.op.name(),
                                call.redop
                            ))
                        })?,
                        ..call
                    },
                };
                self.run_real(call, &why)
            }
        }
    }

    /// The per-operation line of `NCCL_DEBUG=INFO` under `COLL` (`P2P` for sends and
    /// receives), in NCCL's words, with the route `route` names (computed only when printed).
    fn log_call(&self, call: &Call, route: impl FnOnce() -> Option<String>) {
        let name = match call.op {
            Op::AllReduce => "AllReduce",
            Op::AllGather => "AllGather",
            Op::ReduceScatter => "ReduceScatter",
            Op::Broadcast => "Broadcast",
            Op::AllToAll => "AllToAll",
            Op::Reduce => "Reduce",
            Op::Send => "Send",
            Op::Recv => "Recv",
        };
        let p2p = matches!(call.op, Op::Send | Op::Recv);
        let on = if p2p {
            tracing::enabled!(target: crate::debug::P2P, tracing::Level::INFO)
        } else {
            tracing::enabled!(target: crate::debug::COLL, tracing::Level::INFO)
        };
        if !on {
            return;
        }
        let line = format!(
            "{name}: sendbuff {:p} recvbuff {:p} count {} datatype {} op {} root {} rank {} [nranks={}] stream {:p} - {}",
            call.send,
            call.recv,
            call.count,
            call.dtype,
            call.redop,
            call.root,
            self.rank,
            self.nranks,
            call.stream,
            route().unwrap_or_default()
        );
        if p2p {
            tracing::info!(target: crate::debug::P2P, "{line}");
        } else {
            tracing::info!(target: crate::debug::COLL, "{line}");
        }
    }

    /// The native communicator's failure (a dead rank, named, or an abort), if any.
    pub fn native_failure(&self) -> Option<mscclpp::hal::Error> {
        self.native
            .as_ref()
            .and_then(|n| n.communicator().failure())
    }

    /// Marks the native communicator aborted: its kernels' waits end at their next poll.
    pub fn abort_native(&self) {
        if let Some(n) = &self.native {
            n.communicator().abort();
        }
    }

    /// Records a failure that made the communicator unusable (`ncclCommGetAsyncError`).
    fn note(&self, e: mscclpp::hal::Error) -> Failure {
        let f = Failure::from(e);
        if matches!(f.code, NCCL_REMOTE_ERROR | NCCL_SYSTEM_ERROR) {
            self.async_error.store(f.code, Ordering::Relaxed);
        }
        f
    }

    fn run_native(&self, call: Call, dt: DataType, count: usize, op: ReduceOp) -> Res<()> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let caller = &native.caller;
        let stream = native.stream(call.stream)?;
        let root = usize::try_from(call.root).unwrap_or(0);
        if call.op == Op::Reduce {
            let (block, _) = buffer_bytes(CollectiveKind::AllReduce, count, dt, self.nranks)?;
            // SAFETY: NCCL's contract: `count` elements at `sendbuff` on every rank, and at
            // `recvbuff` on the root, alive until the operation has run on `stream`.
            let input = unsafe { caller.wrap(call.send as u64, block)? };
            let output = if root == self.rank {
                // SAFETY: as above.
                Some(unsafe { caller.wrap(call.recv as u64, block)? })
            } else {
                None
            };
            let res = self.reduce(native, &input, output.as_ref(), count, dt, op, &*stream);
            let res = res.and_then(|()| caller.finish(&*stream));
            return res.map_err(|e| self.note(e));
        }
        let kind = call
            .op
            .collective()
            .ok_or_else(|| Failure::internal("not a native operation"))?;
        let (in_bytes, out_bytes) = buffer_bytes(kind, count, dt, self.nranks)?;
        // Broadcast: only the root's send buffer is read; the others may pass anything.
        let send_ptr = if call.op == Op::Broadcast && root != self.rank {
            call.recv as u64
        } else {
            call.send as u64
        };
        // SAFETY: NCCL's contract: the caller's buffers are device memory of these sizes that
        // stays allocated until the operation has run on `stream` (the CUDA backend checks the
        // ranges with the driver).
        let input = unsafe { caller.wrap(send_ptr, in_bytes)? };
        // SAFETY: as above.
        let output = unsafe { caller.wrap(call.recv as u64, out_bytes)? };
        let (i, o) = (input.full(), output.full());
        // A plan of MSCCLPP_EXECUTION_PLAN_DIR that fits the call goes first (plans have no root).
        let planned = match &native.plans {
            Some(p) if kind != CollectiveKind::Broadcast => {
                let pc = crate::plans::PlanCall {
                    collective: call.op.name(),
                    send: &i,
                    recv: &o,
                    dtype: dt,
                    op: kind.reduces().then_some(op),
                };
                p.run(caller, &pc, &*stream)
            }
            _ => Ok(false),
        };
        let res = match planned {
            Ok(true) => Ok(()),
            Err(e) => Err(e),
            Ok(false) => caller.collective(
                // NCCL's rule: every rank passes registered buffers or none.
                &CollectiveCall::new(kind, &i, &o, count, dt)
                    .op(op)
                    .root(root)
                    .registered(true),
                &*stream,
            ),
        };
        res.map_err(|e| self.note(e))
    }

    /// `ncclReduce`: all-reduces of at most [`REDUCE_CHUNK_BYTES`], into the root's output there
    /// and into the communicator's sink elsewhere (the same calls on every rank, so the same
    /// algorithms). Stream-ordered, no host synchronisation, nothing allocated: capturable.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        native: &Native,
        input: &DeviceBuffer,
        output: Option<&DeviceBuffer>,
        count: usize,
        dt: DataType,
        op: ReduceOp,
        stream: &dyn Stream,
    ) -> mscclpp::hal::Result<()> {
        let esz = dt.size();
        let Some(c) = native.caller.collectives() else {
            // One rank: a copy on the root (in place: nothing to do).
            return match output {
                Some(o) if o.ptr() != input.ptr() => stream.copy(&o.full(), &input.full()),
                _ => Ok(()),
            };
        };
        let sink = native.reduce_sink.as_ref().ok_or_else(|| {
            mscclpp::hal::Error::Internal("ncclReduce without its sink buffer".into())
        })?;
        let chunk = (REDUCE_CHUNK_BYTES / esz).max(1);
        let mut at = 0;
        while at < count {
            let m = chunk.min(count - at);
            let range = at * esz..(at + m) * esz;
            let i: BufferSlice = input.slice(range.clone())?;
            let o: BufferSlice = match output {
                Some(o) => o.slice(range)?,
                None => sink.slice(..m * esz)?,
            };
            c.all_reduce(&i, &o, m, dt, op, stream)?;
            at += m;
        }
        Ok(())
    }

    /// A group's native sends and receives on this communicator (checked when they were
    /// called): one launch of the point-to-point kernel on their stream.
    fn run_p2p(&self, calls: &[Call]) -> Res<()> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let Some(first) = calls.first() else {
            return Ok(());
        };
        if let Some(other) = calls.iter().find(|c| c.stream != first.stream) {
            return Err(Failure::usage(format!(
                "a group's sends and receives on one communicator run on one stream here: {:p} and {:p} were given",
                first.stream, other.stream
            )));
        }
        let caller = &native.caller;
        let stream = native.stream(first.stream)?;
        let mut buffers = Vec::with_capacity(calls.len());
        for c in calls {
            let (esize, _) = dtype_info(c.dtype)?;
            let bytes = c
                .count
                .checked_mul(esize)
                .ok_or_else(|| Failure::argument("count overflows"))?;
            let ptr = if c.op == Op::Send {
                c.send as u64
            } else {
                c.recv as u64
            };
            let buf = if bytes == 0 {
                None
            } else {
                // SAFETY: NCCL's contract: `count` elements at the buffer, alive until the
                // operation has run on `stream`.
                Some(unsafe { caller.wrap(ptr, bytes)? })
            };
            buffers.push((buf, bytes));
        }
        let slices: Vec<Option<BufferSlice>> = buffers
            .iter()
            .map(|(b, _)| b.as_ref().map(|b| b.full()))
            .collect();
        let ops: Vec<P2pOp> = calls
            .iter()
            .zip(&slices)
            .zip(&buffers)
            .filter_map(|((c, s), (_, bytes))| {
                s.as_ref().map(|s| P2pOp {
                    kind: if c.op == Op::Send {
                        P2pKind::Send
                    } else {
                        P2pKind::Recv
                    },
                    peer: usize::try_from(c.root).unwrap_or(usize::MAX),
                    buffer: s,
                    bytes: *bytes,
                })
            })
            .collect();
        caller.send_recv(&ops, &*stream).map_err(|e| self.note(e))
    }

    fn run_real(&self, call: Call, why: &str) -> Res<()> {
        let (lib, c) = self
            .real_comm()
            .ok_or_else(|| no_real(&format!("{} ({why})", call.op.name())))?;
        enter_real_group(lib)?;
        let (s, r, cnt, dt, rop, root, st) = (
            call.send,
            call.recv,
            call.count,
            call.dtype,
            call.redop,
            call.root,
            call.stream,
        );
        // SAFETY: the caller's arguments, as given, to the same function of the real NCCL with
        // its own communicator.
        let rc = unsafe {
            match call.op {
                Op::AllReduce => {
                    lib.need(lib.all_reduce, "ncclAllReduce")?(s, r, cnt, dt, rop, c, st)
                }
                Op::AllGather => lib.need(lib.all_gather, "ncclAllGather")?(s, r, cnt, dt, c, st),
                Op::ReduceScatter => {
                    lib.need(lib.reduce_scatter, "ncclReduceScatter")?(s, r, cnt, dt, rop, c, st)
                }
                Op::Broadcast => {
                    lib.need(lib.broadcast, "ncclBroadcast")?(s, r, cnt, dt, root, c, st)
                }
                Op::Reduce => lib.need(lib.reduce, "ncclReduce")?(s, r, cnt, dt, rop, root, c, st),
                Op::AllToAll => lib.need(lib.all_to_all, "ncclAlltoAll")?(s, r, cnt, dt, c, st),
                Op::Send => lib.need(lib.send, "ncclSend")?(s, cnt, dt, root, c, st),
                Op::Recv => lib.need(lib.recv, "ncclRecv")?(r, cnt, dt, root, c, st),
            }
        };
        lib.check(call.op.name(), rc)
    }

    /// Frees the real communicator (destroy or abort).
    pub fn release_real(&self, abort: bool) -> Res<()> {
        let taken = self.real.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(rc) = taken {
            let (f, name) = if abort {
                (rc.lib.comm_abort, "ncclCommAbort")
            } else {
                (rc.lib.comm_destroy, "ncclCommDestroy")
            };
            let f = rc.lib.need(f, name)?;
            // SAFETY: the real communicator, released once (taken out of the slot).
            rc.lib.check(name, unsafe { f(rc.comm) })?;
        }
        Ok(())
    }

    /// `ncclCommFinalize`: waits for the native work on the internal stream and finalizes the
    /// real communicator.
    pub fn finalize(&self) -> Res<()> {
        if let Some(n) = &self.native {
            if n.comm_backend_is_host() {
                n.sync_internal()?;
            }
        }
        if let Some((lib, c)) = self.real_comm() {
            if let Some(f) = lib.comm_finalize {
                // SAFETY: live real communicator.
                lib.check("ncclCommFinalize", unsafe { f(c) })?;
            }
        }
        Ok(())
    }

    /// The real communicator for an operation that only the real NCCL serves.
    pub fn require_real(&self, what: &str) -> Res<(&'static RealNccl, NcclComm)> {
        self.real_comm().ok_or_else(|| no_real(what))
    }
}

impl Comm {
    /// The native collectives and communicator, where the collectives serve (several ranks of
    /// one host).
    pub fn native_collectives(&self) -> Option<(&Collectives, &Arc<Communicator>)> {
        let n = self.native.as_ref()?;
        Some((n.caller.collectives()?, n.communicator()))
    }

    /// The native communicator's device, if it has a native side.
    pub fn native_device(&self) -> Option<Arc<dyn Device>> {
        self.native
            .as_ref()
            .map(|n| n.communicator().device().clone())
    }

    /// The real NCCL's PreMulSum operator made beside ours (for the operations that fall
    /// back), when this communicator has a real one.
    ///
    /// # Safety
    /// As `ncclRedOpCreatePreMulSum`'s arguments.
    pub unsafe fn create_real_premul(
        &self,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
    ) -> Res<Option<c_int>> {
        let Some((lib, rc)) = self.real_comm() else {
            return Ok(None);
        };
        let made = (|| -> Res<c_int> {
            let f = lib.need(lib.red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum")?;
            let mut op: c_int = 0;
            // SAFETY: the caller's arguments with the real communicator and a valid out-pointer.
            lib.check("ncclRedOpCreatePreMulSum", unsafe {
                f(&mut op, scalar, datatype, residence, rc)
            })?;
            Ok(op)
        })();
        match made {
            Ok(op) => Ok(Some(op)),
            // The native side serves the operator; only fallbacks will lack it.
            Err(e) if self.native.is_some() => {
                tracing::warn!("{}", e.message);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Destroys the real NCCL's operator `op` of this communicator.
    pub fn destroy_real_premul(&self, op: c_int) -> Res<()> {
        let Some((lib, rc)) = self.real_comm() else {
            return Ok(());
        };
        let f = lib.need(lib.red_op_destroy, "ncclRedOpDestroy")?;
        // SAFETY: an operator the real NCCL made for this communicator.
        lib.check("ncclRedOpDestroy", unsafe { f(op, rc) })
    }

    /// The first half of a PreMulSum reduction: this rank's input times its own factor (NCCL
    /// sums `factor_r * x_r`, and ranks may pass different factors), enqueued on the operation's
    /// stream. All-reduce scales into the receive buffer and then runs in place there;
    /// reduce-scatter and reduce scale into the communicator's staging buffer. Returns the call
    /// that sums the scaled input.
    fn pre_scale(
        &self,
        call: Call,
        dt: DataType,
        count: usize,
        u: &crate::premul::UserOp,
    ) -> Res<Call> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let (Some(scaler), Some(factor)) = (&u.scaler, &u.factor) else {
            return Err(Failure::internal("a PreMulSum operator without its factor"));
        };
        let in_elems = match call.op {
            Op::ReduceScatter => count.checked_mul(self.nranks),
            _ => Some(count),
        }
        .ok_or_else(|| Failure::argument("count overflows"))?;
        let bytes = in_elems
            .checked_mul(dt.size())
            .ok_or_else(|| Failure::argument("count overflows"))?;
        let device = native.communicator().device();
        let stream = native.stream(call.stream)?;
        // SAFETY: NCCL's contract: `in_elems` elements at `sendbuff`, alive until the operation
        // has run on `stream`.
        let src = unsafe { device.wrap_external(DevicePtr(call.send as u64), bytes)? };
        let (dst, dst_ptr): (DeviceBuffer, u64) = if call.op == Op::AllReduce {
            // SAFETY: as above, for the `count` elements at `recvbuff`.
            let out = unsafe { device.wrap_external(DevicePtr(call.recv as u64), bytes)? };
            (out, call.recv as u64)
        } else {
            let mut staged = self
                .native
                .as_ref()
                .map(|n| n.premul_staging.lock().unwrap_or_else(|p| p.into_inner()))
                .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
            if staged.last().is_none_or(|b| b.len() < bytes) {
                let b = device.alloc(bytes.max(4096), MemoryKind::Device)?;
                staged.push(b);
            }
            let b = staged
                .last()
                .cloned()
                .ok_or_else(|| Failure::internal("PreMulSum staging buffer missing"))?;
            let p = b.ptr().0;
            (b, p)
        };
        let (s, d) = (src.full(), dst.full());
        let same = s.ptr() == d.ptr();
        let enqueue =
            || scaler.scale_from(&d, (!same).then_some(&s), in_elems, dt, factor, &*stream);
        // The staging buffer is the communicator's: ordered as its collectives are.
        let res = native.caller.ordered(&*stream, enqueue);
        res.map_err(|e| self.note(e))?;
        Ok(Call {
            send: dst_ptr as *const c_void,
            ..call
        })
    }
}
