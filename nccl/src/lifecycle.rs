//! Communicator lifecycle: blocking and non-blocking creation (init, init-all, split, shrink;
//! the `ncclConfig_t` they take is read by [`crate::config`]), finalize, destroy, abort and the
//! state `ncclCommGetAsyncError` reports.
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

use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mscclpp::comm::{Cancel, UniqueId};
use mscclpp::hal::BackendKind;

use crate::abi::*;
use crate::comm::{Comm, RealComm};
use crate::config::{CommConfig, parse_config};
use crate::error::{Failure, Res, set_last_error};
use crate::group::{defer_job, in_group};
use crate::init::{InitPlan, build, init_rank};
use crate::job::{Job, job_deadline};
use crate::real::{RealResults, real};
use crate::registry::{self, Slot, register, register_pending, settle};

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
    body: impl FnOnce(Cancel) -> Made + Send + 'static,
) -> Res<()> {
    let in_group = in_group();
    if blocking && !in_group {
        // Nobody else holds the handle yet, so nobody can cancel this one.
        let h = match body(Cancel::new())? {
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
    let token = job.token();
    let spawned = std::thread::Builder::new()
        .name(format!("nccl-{what}"))
        .spawn(move || {
            let made = catch_unwind(AssertUnwindSafe(|| body(token))).unwrap_or_else(|p| {
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
        launch(out, blocking, None, true, "init", move |cancel| {
            init_rank(InitPlan { cancel, ..plan }).map(Some)
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
        let job = Job::new();
        let plan = InitPlan {
            nranks: n,
            rank,
            uid,
            ordinal: Some(d),
            config: CommConfig::default(),
            cancel: job.token(),
        };
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
    let id = parent.child_id(color as u32 as u64);
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, Some(parent), yields, "split", move |_| {
            let view = boot.split(bcolor, key_order(key))?;
            let rc = match real_child {
                Some(f) => f()?,
                None => None,
            };
            child(view, device, rc, cfg, id)
        })
    }
}

/// The child over `view` (`None`: this rank has none; a real child made anyway is released).
fn child(
    view: Option<mscclpp::comm::Bootstrap>,
    device: Arc<dyn mscclpp::hal::Device>,
    rc: Option<RealComm>,
    cfg: CommConfig,
    id: u64,
) -> Made {
    match view {
        Some(v) => build(Arc::new(v), device, rc, cfg, id).map(Some),
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
    let id = parent.child_id(
        ex.iter()
            .fold(0x5348_5249_4e4b, |h, &r| crate::comm::mix_id(h, r as u64)),
    );
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, Some(parent), yields, "shrink", move |_| {
            let view = boot.shrink(&ex)?;
            let rc = match real_child {
                Some(f) if view.is_some() => f()?,
                _ => None,
            };
            child(view, device, rc, cfg, id)
        })
    }
}

/// `ncclCommGetUniqueId`: a fresh bootstrap id for growing `parent`, its root listener parked
/// in this process (this rank's grown communicator runs the root). As NCCL, each call makes a
/// new id; the one made before, if never used, is dropped (its listener closed).
pub fn grow_id(parent: &Arc<Comm>) -> Res<UniqueId> {
    let native = parent.native.as_ref().ok_or_else(|| {
        Failure::usage(
            "this communicator was made by the real NCCL, whose ncclCommGetUniqueId this library does not bind",
        )
    })?;
    let id = UniqueId::new()?;
    let mut pending = native.grow_id.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(old) = pending.replace(id) {
        old.release_root();
    }
    Ok(id)
}

/// The grow id an existing rank passed.
#[derive(Clone, Copy)]
enum GrowId {
    /// NULL, and this rank made no id: another existing rank made it.
    None,
    /// The id this rank's `ncclCommGetUniqueId` made (passed, or NULL while one is pending).
    Made(UniqueId),
    /// An id this rank did not make (the maker's, passed along: accepted if it is).
    Passed(UniqueId),
    /// Bytes that are no id of this library's.
    Bad,
}

/// What each existing rank tells the others before a grow: which [`GrowId`] it has (0, 1, 2),
/// the size it asks for, and the id.
fn grow_card(nranks: usize, id: GrowId) -> Vec<u8> {
    let (tag, bytes) = match id {
        GrowId::None => (0, [0; mscclpp::comm::UNIQUE_ID_BYTES]),
        GrowId::Made(i) => (1, i.to_bytes()),
        GrowId::Passed(i) => (2, i.to_bytes()),
        GrowId::Bad => (3, [0; mscclpp::comm::UNIQUE_ID_BYTES]),
    };
    let mut card = Vec::with_capacity(1 + 8 + mscclpp::comm::UNIQUE_ID_BYTES);
    card.push(tag);
    card.extend_from_slice(&(nranks as u64).to_le_bytes());
    card.extend_from_slice(&bytes);
    card
}

/// The id and size the existing ranks agreed on, from every rank's [`grow_card`]: exactly one
/// made the id, any other that passed one passed that one, and every one asks for the same
/// size; otherwise an error naming the ranks.
fn agree_grow(cards: &[Vec<u8>]) -> Res<(UniqueId, usize)> {
    let mut makers = Vec::new();
    let mut passed = Vec::new();
    let mut sizes = Vec::with_capacity(cards.len());
    for (r, c) in cards.iter().enumerate() {
        if c.len() != 1 + 8 + mscclpp::comm::UNIQUE_ID_BYTES {
            return Err(Failure::internal(format!(
                "ncclCommGrow: rank {r} sent a {}-byte card",
                c.len()
            )));
        }
        let n = u64::from_le_bytes(c[1..9].try_into().unwrap_or([0; 8])) as usize;
        sizes.push(n);
        match c[0] {
            1 => makers.push((r, UniqueId::from_bytes(&c[9..])?)),
            2 => passed.push((r, UniqueId::from_bytes(&c[9..])?)),
            3 => {
                return Err(Failure::argument(format!(
                    "ncclCommGrow: existing rank {r} passed a uniqueId that was not made by this library's ncclCommGetUniqueId"
                )));
            }
            _ => {}
        }
    }
    if let Some((r, n)) = sizes.iter().enumerate().find(|(_, n)| **n != sizes[0]) {
        return Err(Failure::argument(format!(
            "ncclCommGrow: existing rank 0 asks for {} ranks, rank {r} for {n}",
            sizes[0]
        )));
    }
    let id = match makers.as_slice() {
        [(_, id)] => *id,
        [] => {
            return Err(Failure::usage(
                "ncclCommGrow: no existing rank made the grow id (one existing rank calls ncclCommGetUniqueId and passes its id; the others pass NULL)",
            ));
        }
        many => {
            let ranks: Vec<usize> = many.iter().map(|(r, _)| *r).collect();
            return Err(Failure::usage(format!(
                "ncclCommGrow: existing ranks {ranks:?} each made a grow id; one existing rank makes it, the others pass NULL or that id"
            )));
        }
    };
    if let Some((r, _)) = passed.iter().find(|(_, p)| *p != id) {
        return Err(Failure::argument(format!(
            "ncclCommGrow: existing rank {r} passed a uniqueId that is not the grow id rank {} made",
            makers[0].0
        )));
    }
    Ok((id, sizes[0]))
}

/// After a grow, every rank of the grown communicator checks that the existing ranks kept
/// their numbers (`0..parent size`) and the new ones took the rest; otherwise every rank fails
/// naming the ranks out of place. `parent`: this rank's parent size, `None` for a new rank.
fn check_grown(c: &Comm, parent: Option<usize>) -> Res<()> {
    let native = c
        .native
        .as_ref()
        .ok_or_else(|| Failure::internal("a grown communicator without a native part"))?;
    let card = (parent.map_or(0u64, |n| n as u64 + 1)).to_le_bytes();
    let cards = native.communicator().bootstrap().all_gather(&card)?;
    let olds: Vec<Option<usize>> = cards
        .iter()
        .map(|b| {
            let v = u64::from_le_bytes(b.as_slice().try_into().unwrap_or([0; 8]));
            (v > 0).then(|| (v - 1) as usize)
        })
        .collect();
    let old_n = olds.iter().flatten().copied().next().unwrap_or(0);
    if let Some((r, n)) = olds
        .iter()
        .enumerate()
        .find_map(|(r, o)| o.filter(|&n| n != old_n).map(|n| (r, n)))
    {
        return Err(Failure::argument(format!(
            "ncclCommGrow: existing ranks disagree on the parent's size ({old_n} and {n} at rank {r})"
        )));
    }
    let misplaced: Vec<String> = olds
        .iter()
        .enumerate()
        .filter(|(r, o)| o.is_some() != (*r < old_n))
        .map(|(r, o)| {
            if o.is_some() {
                format!("rank {r} is an existing rank")
            } else {
                format!("new rank {r} takes an existing rank's number")
            }
        })
        .collect();
    if !misplaced.is_empty() {
        return Err(Failure::argument(format!(
            "ncclCommGrow: the existing ranks keep 0..{old_n} and the new ranks take {old_n}..{}: {}",
            olds.len(),
            misplaced.join(", ")
        )));
    }
    Ok(())
}

/// A communicator made by `init_rank` for a grow, checked by [`check_grown`]; released if the
/// check fails.
fn grown(plan: InitPlan, parent: Option<usize>) -> Made {
    let c = init_rank(plan)?;
    if let Err(f) = check_grown(&c, parent) {
        c.abort_native();
        if let Err(e) = c.release_real(true) {
            tracing::warn!(target: crate::debug::COMM_MODULE, "{}", e.message);
        }
        return Err(f);
    }
    Ok(Some(c))
}

/// `ncclCommGrow`: a communicator of `nranks` over the parent's ranks (which keep their
/// numbers) and new ones. Existing ranks pass their communicator and rank -1 (the one that
/// called `ncclCommGetUniqueId` passes its id, the others NULL: the existing ranks agree on it
/// over the parent's bootstrap); new ranks pass NULL, the id and their rank. Everyone then
/// joins a fresh bootstrap on that id, as `ncclCommInitRank` does.
///
/// # Safety
/// `out` must be NULL or valid for a write; `id` NULL or a valid id; `config` as for
/// [`parse_config`].
pub unsafe fn grow(
    parent: Option<&Arc<Comm>>,
    nranks: c_int,
    id: Option<&NcclUniqueId>,
    rank: c_int,
    out: *mut NcclComm,
    config: *const c_void,
) -> Res<()> {
    if out.is_null() {
        return Err(Failure::argument("newcomm is NULL"));
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            Failure::argument(format!(
                "nRanks {nranks}: the grown communicator's size must be positive"
            ))
        })?;
    let Some(parent) = parent else {
        // A new rank.
        let id = id.ok_or_else(|| {
            Failure::argument("uniqueId is NULL: a new rank (comm NULL) needs the grow id")
        })?;
        // SAFETY: forwarded contract.
        let cfg = unsafe { parse_config(config, None)? };
        let blocking = cfg.blocking;
        let plan = InitPlan::new(nranks, id, rank, cfg)?;
        // SAFETY: checked non-NULL; caller's contract.
        return unsafe {
            launch(out, blocking, None, true, "grow", move |cancel| {
                grown(InitPlan { cancel, ..plan }, None)
            })
        };
    };
    if n <= parent.nranks {
        return Err(Failure::argument(format!(
            "nRanks {nranks}: not more than the communicator's {} ranks",
            parent.nranks
        )));
    }
    if rank != -1 {
        return Err(Failure::argument(format!(
            "rank {rank}: an existing rank passes -1 (it keeps its rank, {})",
            parent.rank
        )));
    }
    let native = parent.native.as_ref().ok_or_else(|| {
        Failure::usage(
            "this communicator was made by the real NCCL, whose ncclCommGrow this library does not bind",
        )
    })?;
    // SAFETY: forwarded contract.
    let cfg = unsafe { parse_config(config, Some(&parent.config))? };
    let blocking = cfg.blocking;
    crate::debug::show_version();
    crate::route::forced()?;
    crate::real::real()?;
    let boot = Arc::clone(native.communicator().bootstrap());
    let (old_n, old_rank) = (parent.nranks, parent.rank);
    let ordinal = usize::try_from(parent.device).ok();
    // Every local check is done: the id this rank made, if any, is consumed now, and what it
    // holds is told to the other existing ranks.
    let mine = {
        let mut pending = native.grow_id.lock().unwrap_or_else(|p| p.into_inner());
        // Undecodable bytes are told too (every rank then fails naming this one) rather than
        // leaving the others waiting at the exchange.
        let passed = match id {
            None => Ok(None),
            Some(id) => crate::init::decode_id(id).map(Some),
        };
        match passed {
            Err(_) => GrowId::Bad,
            Ok(passed) => match (passed, pending.take()) {
                (None, None) => GrowId::None,
                (None, Some(p)) => GrowId::Made(p),
                (Some(x), Some(p)) if x == p => GrowId::Made(p),
                (Some(x), p) => {
                    // Not this rank's id: the one it made (if any) stays pending.
                    *pending = p;
                    GrowId::Passed(x)
                }
            },
        }
    };
    // SAFETY: checked non-NULL; caller's contract.
    unsafe {
        launch(out, blocking, Some(parent), true, "grow", move |cancel| {
            let cards = boot.all_gather(&grow_card(n, mine))?;
            let (uid, size) = agree_grow(&cards).inspect_err(|_| {
                // New ranks waiting on this rank's root are refused at once.
                if let GrowId::Made(u) = mine {
                    u.release_root();
                }
            })?;
            let plan = InitPlan {
                nranks: size,
                rank: old_rank,
                uid,
                ordinal,
                config: cfg,
                cancel,
            };
            grown(plan, Some(old_n))
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
        crate::ras::publish(&c, false, false);
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
            crate::ras::publish(&c2, false, false);
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
            crate::ras::publish(&c, true, false);
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
/// waiting (on any thread) end at their next poll of the abort word. A communicator still
/// being created (non-blocking init or grow, NVIDIA/nccl#289) has its bootstrap join cancelled:
/// it fails at once rather than at the bootstrap's deadline, and whatever it made is released
/// as it settles (the handle is gone); this waits briefly for that, so that its thread and
/// sockets are gone when abort returns.
pub fn abort(h: NcclComm) -> Res<()> {
    match registry::unregister(h)? {
        Slot::Ready(c) => {
            crate::ras::publish(&c, false, true);
            c.abort_native();
            c.release_real(true)
        }
        Slot::Pending(job) => {
            job.cancel();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            if let Err(f) = job.wait(until, "the creation ncclCommAbort cancelled") {
                tracing::debug!(target: crate::debug::COMM_MODULE, "ncclCommAbort {h:p}: {}", f.message);
            }
            Ok(())
        }
        Slot::Failed(_) => Ok(()),
    }
}

/// `ncclCommGetAsyncError`'s answer: `ncclInProgress` while a creation or a non-blocking
/// split, shrink or finalize runs; a creation's failure; a dead peer (`ncclRemoteError`, the
/// rank named in `ncclGetLastError`); a stored error; the real communicator's; a stall past
/// `MSCCLPP_WATCHDOG_SECONDS` behind a laggard (`ncclRemoteError`, the laggard named); else
/// success.
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
    // The watchdog (MSCCLPP_WATCHDOG_SECONDS): a call stuck that long behind a laggard is this
    // communicator's error, the laggard named, so that a client polling here (PyTorch's
    // watchdog) aborts it with the reason long before a kernel's own deadline.
    if e == NCCL_SUCCESS
        && let Some(n) = &c.native
    {
        match n.caller.stalled() {
            Ok(Some(why)) => {
                set_last_error(&format!("rank {}: {why}", c.rank));
                e = NCCL_REMOTE_ERROR;
            }
            Ok(None) => {}
            Err(err) => {
                set_last_error(&err.to_string());
                e = NCCL_INVALID_ARGUMENT;
            }
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order() {
        let keys = [i32::MIN, -5, -1, 0, 3, i32::MAX];
        for w in keys.windows(2) {
            assert!(key_order(w[0]) < key_order(w[1]), "{w:?}");
        }
    }
}
