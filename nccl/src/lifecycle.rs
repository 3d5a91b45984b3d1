//! Communicator lifecycle: `ncclConfig_t`, blocking and non-blocking creation (init, init-all,
//! split, shrink), finalize, destroy, abort and the state `ncclCommGetAsyncError` reports.
//!
//! **Non-blocking.** With `config.blocking = 0` a creation returns `ncclInProgress` at once
//! with the handle already written; the work runs on a thread of its own and
//! `ncclCommGetAsyncError` says `ncclInProgress` until it ends, then `ncclSuccess` or the
//! error. Any other call on the handle meanwhile is `ncclInvalidArgument`, as NCCL's
//! `ncclCommEnsureReady` answers. A non-blocking split or shrink also marks the parent in
//! progress (PyTorch polls the parent), which keeps a second split on the parent from
//! interleaving its bootstrap messages with the first.
//!
//! **Groups.** Inside `ncclGroupStart`/`ncclGroupEnd` a creation starts at once on its own
//! thread (each rank's init waits for the others: one thread calling `ncclCommInitRank` for
//! every GPU would deadlock if they ran in turn) and the outermost `ncclGroupEnd` waits for the
//! blocking ones, within a deadline.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mscclpp::comm::{BootstrapConfig, UniqueId};
use mscclpp::hal::BackendKind;

use crate::abi::*;
use crate::comm::{Comm, RealComm};
use crate::error::{Failure, Res, set_last_error};
use crate::group::{defer_job, in_group};
use crate::init::{InitPlan, build, init_rank};
use crate::job::Job;
use crate::real::{RealResults, real};
use crate::registry::{self, Slot, register, register_pending, settle};

/// The parts of an `ncclConfig_t` this library keeps (a split or shrink without a config
/// inherits them from the parent, as NCCL does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    /// `blocking` (default 1; `NCCL_COMM_BLOCKING` overrides it, as in NCCL).
    pub blocking: bool,
    /// `cgaClusterSize`, `minCTAs`, `maxCTAs`: recorded and logged; mscclpp's algorithms size
    /// their own grids.
    pub ctas: [Option<c_int>; 3],
    /// `netName`: recorded; the bootstrap and transports are this library's own.
    pub net_name: Option<String>,
    /// `commName`: names the communicator in logs.
    pub comm_name: Option<String>,
    /// `splitShare`, `shrinkShare`: a child never shares the parent's buffers here (it gets
    /// its own scratch), which NCCL permits: sharing is a hint.
    pub share: [bool; 2],
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            blocking: true,
            ctas: [None; 3],
            net_name: None,
            comm_name: None,
            share: [false; 2],
        }
    }
}

/// Reads at most 256 bytes of a C string (a name in a config).
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string (or at least 256 readable bytes).
unsafe fn name(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    let mut bytes = Vec::new();
    for i in 0..256 {
        // SAFETY: within the string or its first 256 bytes (caller's contract).
        let b = unsafe { p.add(i).read() } as u8;
        if b == 0 {
            break;
        }
        bytes.push(b);
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn set(v: c_int) -> Option<c_int> {
    (v != NCCL_CONFIG_UNDEF_INT).then_some(v)
}

/// `NCCL_COMM_BLOCKING`: 0 or 1 overrides every config's `blocking`, as it does in NCCL.
fn env_blocking() -> Res<Option<bool>> {
    const VAR: &str = "NCCL_COMM_BLOCKING";
    match mscclpp::hal::env::get(VAR) {
        None => Ok(None),
        Some(v) => match v.trim() {
            "0" => Ok(Some(false)),
            "1" => Ok(Some(true)),
            other => Err(Failure::argument(format!(
                "{VAR}={other:?}: expected 0 (non-blocking) or 1 (blocking)"
            ))),
        },
    }
}

/// Reads a caller's `ncclConfig_t` as NCCL does: `size` bytes of it at most (a newer, longer
/// struct is read as far as this library knows it), the magic checked, and the fields a
/// `version` older than the one that added them is treated as unset. NULL: `inherit` (a split
/// or shrink without a config), else the defaults.
///
/// # Safety
/// `config` must be NULL or point to `size` readable bytes starting with an `ncclConfig_t`
/// header, whose name pointers are NULL or C strings.
pub unsafe fn parse_config(config: *const c_void, inherit: Option<&CommConfig>) -> Res<CommConfig> {
    let mut c = if config.is_null() {
        inherit.cloned().unwrap_or_default()
    } else {
        // SAFETY: every ncclConfig_t starts with its size (caller's contract).
        let size = unsafe { config.cast::<usize>().read_unaligned() };
        let mut raw = NcclConfig::INITIALIZER;
        raw.magic = 0;
        let n = size.min(std::mem::size_of::<NcclConfig>());
        // SAFETY: `n` bytes of the caller's struct (at most its size) into ours, which has room
        // for them; both are plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                (&mut raw as *mut NcclConfig).cast::<u8>(),
                n,
            )
        };
        if raw.magic != NCCL_CONFIG_MAGIC {
            return Err(Failure::argument(format!(
                "ncclConfig_t at {config:p} (size {size}) has magic {:#x}, expected {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER",
                raw.magic
            )));
        }
        let d = NcclConfig::INITIALIZER;
        if raw.version < 21400 {
            raw.blocking = d.blocking;
        }
        if raw.version < 21700 {
            raw.cga_cluster_size = d.cga_cluster_size;
            raw.min_ctas = d.min_ctas;
            raw.max_ctas = d.max_ctas;
            raw.net_name = d.net_name;
        }
        if raw.version < 21800 {
            raw.split_share = d.split_share;
        }
        let blocking = match raw.blocking {
            NCCL_CONFIG_UNDEF_INT | 1 => true,
            0 => false,
            other => {
                tracing::warn!("ncclConfig_t.blocking {other} is not 0 or 1; using 1");
                true
            }
        };
        let c = CommConfig {
            blocking,
            ctas: [
                set(raw.cga_cluster_size),
                set(raw.min_ctas),
                set(raw.max_ctas),
            ],
            // SAFETY: name pointers of the caller's config (contract).
            net_name: unsafe { name(raw.net_name) },
            // SAFETY: as above.
            comm_name: unsafe { name(raw.comm_name) },
            share: [raw.split_share == 1, raw.shrink_share == 1],
        };
        tracing::debug!(
            size,
            version = raw.version,
            config = ?c,
            "ncclConfig_t read (CTA counts and netName are recorded, not applied)"
        );
        c
    };
    if let Some(b) = env_blocking()? {
        c.blocking = b;
    }
    Ok(c)
}

/// How long a group end or an init-all waits for creations it started: every step of a
/// creation is bounded by the bootstrap's timeout, and a creation takes a few of them.
pub fn job_deadline() -> Instant {
    let t = BootstrapConfig::from_env().map_or(Duration::from_secs(60), |c| c.timeout);
    Instant::now() + t.saturating_mul(3) + Duration::from_secs(10)
}

/// What a creation's body returns: the communicator, or `None` for a rank that gets none
/// (`NCCL_SPLIT_NOCOLOR`, a rank shrunk away).
type Made = Res<Option<Comm>>;

/// Runs a creation whose handle goes to `*out`: here and now when blocking outside a group;
/// otherwise on a new thread, with the handle issued at once (pending) and, for a split or
/// shrink, the parent marked in progress until it ends. `yields`: whether this rank gets a
/// communicator at all (else `*out` is NULL).
///
/// # Safety
/// `out` must be valid for a write (checked non-NULL by the caller).
unsafe fn launch(
    out: *mut NcclComm,
    blocking: bool,
    parent: Option<&Arc<Comm>>,
    yields: bool,
    what: &'static str,
    body: impl FnOnce() -> Made + Send + 'static,
) -> Res<()> {
    let in_group = in_group();
    if blocking && !in_group {
        let h = match body()? {
            Some(c) => register(c),
            None => std::ptr::null_mut(),
        };
        // SAFETY: caller's contract.
        unsafe { out.write(h) };
        return Ok(());
    }
    let job = Job::new();
    let h = if yields {
        register_pending(&job)
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: caller's contract; written before the job can settle the handle.
    unsafe { out.write(h) };
    if let Some(p) = parent {
        p.set_busy(Arc::clone(&job));
    }
    let (hv, j) = (h as usize, Arc::clone(&job));
    let spawned = std::thread::Builder::new()
        .name(format!("nccl-{what}"))
        .spawn(move || {
            let made = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Err(Failure::internal(format!("{what}: caught panic: {why}")))
            });
            finish(hv as NcclComm, &j, made);
        });
    if let Err(e) = spawned {
        finish(
            h,
            &job,
            Err(Failure::system(format!("{what}: spawning its thread: {e}"))),
        );
    }
    if in_group {
        defer_job(job, blocking, what);
        return Ok(());
    }
    Err(Failure::in_progress())
}

/// Ends a background creation: settles its handle, or (a rank without one) releases anything
/// it made and finishes the job.
fn finish(h: NcclComm, job: &Arc<Job>, made: Made) {
    if !h.is_null() {
        let made = made.and_then(|c| {
            c.ok_or_else(|| {
                Failure::internal("a creation that should yield a communicator made none")
            })
        });
        settle(h, job, made);
        return;
    }
    let result = match made {
        Ok(Some(c)) => {
            c.abort_native();
            c.release_real(true)
        }
        Ok(None) => Ok(()),
        Err(f) => Err(f),
    };
    job.finish(result);
}

/// `ncclCommInitRank` / `ncclCommInitRankConfig` / `ncclCommInitRankScalable`.
///
/// # Safety
/// `out` must be NULL or valid for a write; `config` as for [`parse_config`].
pub unsafe fn init_rank_config(
    out: *mut NcclComm,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    config: *const c_void,
) -> Res<()> {
    if out.is_null() {
        return Err(Failure::argument("comm (the output pointer) is NULL"));
    }
    // SAFETY: forwarded contract.
    let cfg = unsafe { parse_config(config, None)? };
    let blocking = cfg.blocking;
    let plan = InitPlan::new(nranks, id, rank, cfg)?;
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, None, true, "init", move || {
            init_rank(plan).map(Some)
        })
    }
}

/// `ncclCommInitAll`: one communicator per device of `devlist` (NULL: devices 0..ndev; on the
/// host backend, any ndev: its devices are reused in turn), created together by threads of
/// this call, which waits for all of them within [`job_deadline`]. On any failure every
/// communicator made is released and no handle is written.
///
/// # Safety
/// `out` must be NULL or valid for `ndev` writes; `devlist` NULL or `ndev` ints.
pub unsafe fn init_all(out: *mut NcclComm, ndev: c_int, devlist: *const c_int) -> Res<()> {
    let n = usize::try_from(ndev)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| Failure::argument(format!("ndev {ndev}: must be at least 1")))?;
    if out.is_null() {
        return Err(Failure::argument("comm (the output array) is NULL"));
    }
    let backend = mscclpp::registry::select()?;
    let count = backend.device_count();
    let host = backend.kind() == BackendKind::Host;
    let devices: Vec<usize> = if devlist.is_null() {
        if !host && n > count {
            return Err(Failure::argument(format!(
                "ndev {n} with devlist NULL: only {count} devices are visible"
            )));
        }
        (0..n).map(|i| i % count.max(1)).collect()
    } else {
        (0..n)
            .map(|i| {
                // SAFETY: `devlist` holds ndev ints (caller's contract).
                let d = unsafe { devlist.add(i).read() };
                usize::try_from(d)
                    .ok()
                    .filter(|&d| d < count)
                    .ok_or_else(|| {
                        Failure::argument(format!(
                            "devlist[{i}] = {d}: not a device (0..{count} are visible)"
                        ))
                    })
            })
            .collect::<Res<_>>()?
    };
    for &d in &devices {
        backend.open_device(d)?;
    }
    let uid = UniqueId::new()?;
    real()?;
    let deadline = job_deadline();
    let mut started: Vec<(NcclComm, Arc<Job>)> = Vec::with_capacity(n);
    for (rank, &d) in devices.iter().enumerate() {
        let plan = InitPlan {
            nranks: n,
            rank,
            uid,
            ordinal: Some(d),
            config: CommConfig::default(),
        };
        let job = Job::new();
        let h = register_pending(&job);
        let j = Arc::clone(&job);
        let hv = h as usize;
        let spawned = std::thread::Builder::new()
            .name(format!("nccl-init-all-{rank}"))
            .spawn(move || {
                let made = catch_unwind(AssertUnwindSafe(|| init_rank(plan)))
                    .unwrap_or_else(|_| Err(Failure::internal("init-all: caught panic")));
                settle(hv as NcclComm, &j, made);
            });
        if let Err(e) = spawned {
            settle(
                h,
                &job,
                Err(Failure::system(format!("init-all: spawning a thread: {e}"))),
            );
        }
        started.push((h, job));
    }
    let mut first: Option<Failure> = None;
    for (rank, (_, job)) in started.iter().enumerate() {
        if let Err(f) = job.wait(deadline, "ncclCommInitAll") {
            first.get_or_insert(Failure {
                code: f.code,
                message: format!("rank {rank} (device {}): {}", devices[rank], f.message),
            });
        }
    }
    if let Some(f) = first {
        for (h, _) in &started {
            if let Ok(Slot::Ready(c)) = registry::unregister(*h) {
                c.abort_native();
                if let Err(e) = c.release_real(true) {
                    tracing::warn!("{}", e.message);
                }
            }
        }
        return Err(f);
    }
    for (i, (h, _)) in started.into_iter().enumerate() {
        // SAFETY: the caller's array of ndev handles.
        unsafe { out.add(i).write(h) };
    }
    Ok(())
}

/// Keys are C ints ordered as such; the bootstrap orders unsigned keys.
fn key_order(key: c_int) -> u32 {
    (key as u32) ^ 0x8000_0000
}

/// The real NCCL child of a split or shrink, made beside ours when the parent has a real
/// communicator (every parent rank calls it, a rank that gets no child too).
type RealChild = Box<dyn FnOnce() -> Res<Option<RealComm>> + Send>;

/// `ncclCommSplit` of a communicator of this library: a view of the parent's bootstrap (no new
/// root; ranks ordered by key, then parent rank) and a full communicator on the parent's
/// device.
///
/// # Safety
/// `out` must be NULL or valid for a write; `config` as for [`parse_config`].
pub unsafe fn split(
    parent: &Arc<Comm>,
    color: c_int,
    key: c_int,
    out: *mut NcclComm,
    config: *const c_void,
) -> Res<()> {
    if out.is_null() {
        return Err(Failure::argument("newcomm is NULL"));
    }
    if color < 0 && color != NCCL_SPLIT_NOCOLOR {
        return Err(Failure::argument(format!(
            "color {color}: must be non-negative or NCCL_SPLIT_NOCOLOR (-1)"
        )));
    }
    // SAFETY: forwarded contract.
    let cfg = unsafe { parse_config(config, Some(&parent.config))? };
    let native = parent
        .native
        .as_ref()
        .ok_or_else(|| Failure::internal("split of a communicator without a native part"))?;
    let boot = Arc::clone(native.communicator().bootstrap());
    let device = Arc::clone(native.communicator().device());
    let real_child: Option<RealChild> = parent.real_parts().map(|(lib, rc)| {
        let (dev, rcv) = (Arc::clone(&device), rc as usize);
        Box::new(move || {
            let f = lib.need(lib.comm_split, "ncclCommSplit")?;
            dev.make_current()?;
            let mut child: NcclComm = std::ptr::null_mut();
            // SAFETY: the live real parent, a valid out-pointer; NULL config: the child
            // inherits the parent's (blocking) configuration.
            lib.check("ncclCommSplit", unsafe {
                f(
                    rcv as NcclComm,
                    color,
                    key,
                    &mut child,
                    std::ptr::null_mut(),
                )
            })?;
            Ok((!child.is_null()).then_some(RealComm { lib, comm: child }))
        }) as RealChild
    });
    let blocking = cfg.blocking;
    let yields = color != NCCL_SPLIT_NOCOLOR;
    let bcolor = u32::try_from(color).ok();
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, Some(parent), yields, "split", move || {
            let view = boot.split(bcolor, key_order(key))?;
            let rc = match real_child {
                Some(f) => f()?,
                None => None,
            };
            child(view, device, rc, cfg)
        })
    }
}

/// The child over `view` (`None`: this rank has none; a real child made anyway is released).
fn child(
    view: Option<mscclpp::comm::Bootstrap>,
    device: Arc<dyn mscclpp::hal::Device>,
    rc: Option<RealComm>,
    cfg: CommConfig,
) -> Made {
    match view {
        Some(v) => build(Arc::new(v), device, rc, cfg).map(Some),
        None => {
            if let Some(rc) = rc {
                let f = rc.lib.need(rc.lib.comm_destroy, "ncclCommDestroy")?;
                // SAFETY: a real communicator nobody else holds.
                rc.lib.check("ncclCommDestroy", unsafe { f(rc.comm) })?;
            }
            Ok(None)
        }
    }
}

/// `ncclCommShrink` of a communicator of this library: the parent's bootstrap without the
/// excluded ranks (no message is needed, so dead ranks can be excluded). `NCCL_SHRINK_ABORT`
/// first aborts the parent's outstanding operations (its kernels' waits end); the parent stays
/// to be destroyed. An excluded rank that calls it gets NULL.
///
/// # Safety
/// `exclude` must be NULL or hold `count` ints; `out` NULL or valid for a write; `config` as
/// for [`parse_config`].
pub unsafe fn shrink(
    parent: &Arc<Comm>,
    exclude: *const c_int,
    count: c_int,
    out: *mut NcclComm,
    config: *const c_void,
    flags: c_int,
) -> Res<()> {
    if out.is_null() {
        return Err(Failure::argument("newcomm is NULL"));
    }
    let k = usize::try_from(count)
        .map_err(|_| Failure::argument(format!("excludeRanksCount {count} is negative")))?;
    if exclude.is_null() && k > 0 {
        return Err(Failure::argument(format!(
            "excludeRanksList is NULL with excludeRanksCount {k}"
        )));
    }
    if k > parent.nranks {
        return Err(Failure::argument(format!(
            "excludeRanksCount {k} exceeds the {} ranks of the communicator",
            parent.nranks
        )));
    }
    if flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT {
        return Err(Failure::argument(format!(
            "shrinkFlags {flags}: expected NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
        )));
    }
    let mut ex = Vec::with_capacity(k);
    for i in 0..k {
        // SAFETY: `exclude` holds `count` ints (caller's contract).
        let r = unsafe { exclude.add(i).read() };
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < parent.nranks)
            .ok_or_else(|| {
                Failure::argument(format!(
                    "excludeRanksList[{i}] = {r} is not a rank of {}",
                    parent.nranks
                ))
            })?;
        ex.push(r);
    }
    ex.sort_unstable();
    ex.dedup();
    if ex.len() == parent.nranks {
        return Err(Failure::argument("excludeRanksList excludes every rank"));
    }
    // SAFETY: forwarded contract.
    let cfg = unsafe { parse_config(config, Some(&parent.config))? };
    let native = parent
        .native
        .as_ref()
        .ok_or_else(|| Failure::internal("shrink of a communicator without a native part"))?;
    if flags == NCCL_SHRINK_ABORT {
        parent.abort_native();
    }
    let boot = Arc::clone(native.communicator().bootstrap());
    let device = Arc::clone(native.communicator().device());
    let excluded_c: Vec<c_int> = ex.iter().map(|&r| r as c_int).collect();
    let real_child: Option<RealChild> = parent.real_parts().map(|(lib, rc)| {
        let (dev, rcv) = (Arc::clone(&device), rc as usize);
        let mut list = excluded_c.clone();
        Box::new(move || {
            let f = lib.need(lib.comm_shrink, "ncclCommShrink")?;
            dev.make_current()?;
            let mut child: NcclComm = std::ptr::null_mut();
            // SAFETY: the live real parent, the checked list, a valid out-pointer; NULL
            // config: the child inherits the parent's.
            lib.check("ncclCommShrink", unsafe {
                f(
                    rcv as NcclComm,
                    list.as_mut_ptr(),
                    list.len() as c_int,
                    &mut child,
                    std::ptr::null_mut(),
                    flags,
                )
            })?;
            Ok((!child.is_null()).then_some(RealComm { lib, comm: child }))
        }) as RealChild
    });
    let blocking = cfg.blocking;
    let yields = !ex.contains(&parent.rank);
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, Some(parent), yields, "shrink", move || {
            let view = boot.shrink(&ex)?;
            let rc = match real_child {
                Some(f) if view.is_some() => f()?,
                _ => None,
            };
            child(view, device, rc, cfg)
        })
    }
}

/// `ncclCommFinalize`: waits for the communicator's outstanding work (host backend: its own
/// stream) and finalizes the real one; non-blocking: on a thread, `ncclInProgress` until done.
/// Afterwards only destroy and abort are accepted.
pub fn finalize(h: NcclComm) -> Res<()> {
    let c = registry::lookup(h)?;
    if c.finalized.load(Ordering::Acquire) {
        return Ok(());
    }
    if c.config.blocking {
        let r = c.finalize();
        c.finalized.store(true, Ordering::Release);
        return r;
    }
    let job = Job::new();
    c.set_busy(Arc::clone(&job));
    let (c2, j) = (Arc::clone(&c), Arc::clone(&job));
    let spawned = std::thread::Builder::new()
        .name("nccl-finalize".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| c2.finalize()))
                .unwrap_or_else(|_| Err(Failure::internal("finalize: caught panic")));
            c2.finalized.store(true, Ordering::Release);
            j.finish(r);
        });
    if let Err(e) = spawned {
        c.finalized.store(true, Ordering::Release);
        job.finish(Err(Failure::system(format!(
            "finalize: spawning its thread: {e}"
        ))));
    }
    Err(Failure::in_progress())
}

/// `ncclCommDestroy`: frees the communicator once its own work is done (a non-blocking finalize
/// still running is waited for, within [`job_deadline`]). A handle still being created is
/// released by its job when that ends.
pub fn destroy(h: NcclComm) -> Res<()> {
    match registry::unregister(h)? {
        Slot::Ready(c) => {
            if let Some(job) = c.take_busy() {
                job.wait(job_deadline(), "the finalize before ncclCommDestroy")?;
            }
            if let Some(n) = &c.native {
                if n.comm_backend_is_host() {
                    n.sync_internal()?;
                }
            }
            c.release_real(false)
        }
        Slot::Pending(_) | Slot::Failed(_) => Ok(()),
    }
}

/// `ncclCommAbort`: frees the communicator without waiting for anything; kernels of it still
/// waiting (on any thread) end at their next poll of the abort word.
pub fn abort(h: NcclComm) -> Res<()> {
    match registry::unregister(h)? {
        Slot::Ready(c) => {
            c.abort_native();
            c.release_real(true)
        }
        Slot::Pending(_) | Slot::Failed(_) => Ok(()),
    }
}

/// `ncclCommGetAsyncError`'s answer: `ncclInProgress` while a creation or a non-blocking
/// split, shrink or finalize runs; a creation's failure; a dead peer (`ncclRemoteError`, the
/// rank named in `ncclGetLastError`); a stored error; the real communicator's; else success.
pub fn async_error(h: NcclComm) -> Res<NcclResult> {
    let c = match registry::slot(h)? {
        Slot::Pending(_) => return Ok(NCCL_IN_PROGRESS),
        Slot::Failed(f) => {
            set_last_error(&format!("comm {h:p}: {}", f.message));
            return Ok(f.code);
        }
        Slot::Ready(c) => c,
    };
    if let Some(job) = c.busy_job() {
        match job.result() {
            None => return Ok(NCCL_IN_PROGRESS),
            Some(Ok(())) => {
                c.take_busy();
            }
            Some(Err(f)) => {
                c.take_busy();
                set_last_error(&format!("comm {h:p}: {}", f.message));
                return Ok(f.code);
            }
        }
    }
    let mut e = c.async_error.load(Ordering::Relaxed);
    // A dead peer makes the communicator unusable as soon as the bootstrap learns it, whether
    // or not an operation has failed yet.
    // A revoked communicator whose only failure is its own revocation is quiescent, which NCCL
    // reports as success (the revoke, poll, shrink sequence polls for exactly that); a peer that
    // died meanwhile is still reported.
    let revoked_only = |f: &mscclpp::hal::Error| {
        crate::exports_229::is_revoked(h) && !matches!(f, mscclpp::hal::Error::Remote { .. })
    };
    if let Some(f) = c.native_failure().filter(|f| !revoked_only(f)) {
        set_last_error(&format!("rank {}: {f}", c.rank));
        if e == NCCL_SUCCESS {
            e = NCCL_REMOTE_ERROR;
        }
    }
    if e == NCCL_SUCCESS && !crate::exports_229::is_revoked(h) {
        if let Some((lib, rc)) = c.real_parts() {
            if let Some(f) = lib.comm_get_async_error {
                let mut re = NCCL_SUCCESS;
                // SAFETY: live real communicator, valid out-pointer.
                lib.check("ncclCommGetAsyncError", unsafe { f(rc, &mut re) })?;
                e = re;
            }
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_versions_and_sizes() {
        let mut raw = NcclConfig::INITIALIZER;
        raw.blocking = 0;
        raw.max_ctas = 4;
        let comm_name = c"pg-7";
        raw.comm_name = comm_name.as_ptr();
        // SAFETY: a full, initialised config.
        let c = unsafe { parse_config((&raw as *const NcclConfig).cast(), None) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.ctas, [None, None, Some(4)]);
        assert_eq!(c.comm_name.as_deref(), Some("pg-7"));

        // A 2.13 caller knew no `blocking`: its value is ignored.
        let mut old = raw;
        old.version = 21300;
        // SAFETY: as above.
        let c = unsafe { parse_config((&old as *const NcclConfig).cast(), None) }.unwrap();
        assert!(c.blocking);

        // A struct of only the header and `blocking`: nothing beyond is read.
        let mut short = raw;
        short.size = 20;
        short.comm_name = 0x10 as *const c_char;
        // SAFETY: only 20 bytes are read, and the name pointer is past them.
        let c = unsafe { parse_config((&short as *const NcclConfig).cast(), None) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.comm_name, None);
        assert_eq!(c.ctas, [None; 3]);

        // No magic (too short to hold it, or not initialised).
        let mut bad = raw;
        bad.size = 8;
        // SAFETY: as above.
        let e = unsafe { parse_config((&bad as *const NcclConfig).cast(), None) }.unwrap_err();
        assert_eq!(e.code, NCCL_INVALID_ARGUMENT);
        bad.size = 80;
        bad.magic = 7;
        // SAFETY: as above.
        let e = unsafe { parse_config((&bad as *const NcclConfig).cast(), None) }.unwrap_err();
        assert!(
            e.message.contains("NCCL_CONFIG_INITIALIZER"),
            "{}",
            e.message
        );

        // NULL inherits.
        let parent = CommConfig {
            blocking: false,
            ..CommConfig::default()
        };
        // SAFETY: NULL.
        let c = unsafe { parse_config(std::ptr::null(), Some(&parent)) }.unwrap();
        assert_eq!(c, parent);
    }

    #[test]
    fn keys_keep_their_order() {
        let keys = [i32::MIN, -5, -1, 0, 3, i32::MAX];
        for w in keys.windows(2) {
            assert!(key_order(w[0]) < key_order(w[1]), "{w:?}");
        }
    }
}
