//! Communicators: creation, finalize/destroy/abort, split and shrink, and the queries.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res, guard, out};
use crate::init::from_real;
use crate::lifecycle;
use crate::real::{self, RealResults};
use crate::registry::{lookup, register};

/// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)`:
/// blocking; inside a group it starts at once and the outermost `ncclGroupEnd` waits for it
/// (so one thread can create the communicators of several GPUs).
///
/// # Safety
/// `comm` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    commId: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    guard("ncclCommInitRank", || {
        // SAFETY: forwarded contract; no config.
        unsafe { lifecycle::init_rank_config(comm, nranks, &commId, rank, std::ptr::null()) }
    })
}

/// `ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int
/// rank, ncclConfig_t* config)`: `config` is read as NCCL reads it (size, magic, version);
/// `blocking = 0` returns `ncclInProgress` with `*comm` set, and `ncclCommGetAsyncError` tells
/// when it is ready.
///
/// # Safety
/// `comm` must be NULL or valid for a write; `config` NULL or an `ncclConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclComm,
    nranks: c_int,
    commId: NcclUniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommInitRankConfig", || {
        // SAFETY: forwarded contract.
        unsafe { lifecycle::init_rank_config(comm, nranks, &commId, rank, config) }
    })
}

/// `ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
/// ncclUniqueId* commIds, ncclConfig_t* config)`: every rank passes the same ids; the first
/// names our bootstrap's root (the others only spread NCCL's own bootstrap load).
///
/// # Safety
/// `newcomm` must be NULL or valid for a write; `commIds` NULL or `nId` ids.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut NcclComm,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut NcclUniqueId,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommInitRankScalable", || {
        if commIds.is_null() || nId < 1 {
            return Err(Failure::argument(format!(
                "commIds {commIds:p} with nId {nId}: at least one id is needed"
            )));
        }
        // SAFETY: non-null and holds nId >= 1 ids (caller's contract).
        let id = unsafe { commIds.read() };
        // SAFETY: forwarded contract.
        unsafe { lifecycle::init_rank_config(newcomm, nranks, &id, myrank, config) }
    })
}

/// `ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist)`: one process
/// driving several devices (the same one several times too): one communicator per entry of
/// `devlist` (NULL: devices 0..ndev), created together by threads of this call within a
/// deadline.
///
/// # Safety
/// `comm` must be NULL or valid for `ndev` writes; `devlist` NULL or `ndev` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(
    comm: *mut NcclComm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    // SAFETY: forwarded contract.
    guard("ncclCommInitAll", || unsafe {
        lifecycle::init_all(comm, ndev, devlist)
    })
}

/// `ncclResult_t ncclCommFinalize(ncclComm_t comm)`: waits for outstanding work (host backend)
/// and finalizes the real communicator; non-blocking communicators return `ncclInProgress`
/// and finish in the background.
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommFinalize(comm: NcclComm) -> NcclResult {
    guard("ncclCommFinalize", || lifecycle::finalize(comm))
}

/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`: frees the communicator (and the real one).
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDestroy(comm: NcclComm) -> NcclResult {
    guard("ncclCommDestroy", || lifecycle::destroy(comm))
}

/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`: frees the communicator without waiting.
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(comm: NcclComm) -> NcclResult {
    guard("ncclCommAbort", || lifecycle::abort(comm))
}

fn wrap_real_child(
    lib: &'static real::RealNccl,
    child: NcclComm,
    newcomm: *mut NcclComm,
) -> Res<()> {
    let h = if child.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: a communicator the real NCCL just made (split or shrink).
        register(unsafe { from_real(lib, child)? })
    };
    // SAFETY: checked non-null by the caller of this helper.
    unsafe { newcomm.write(h) };
    Ok(())
}

/// `ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
/// ncclConfig_t* config)`: natively, a view of the parent's bootstrap (ranks ordered by key,
/// then parent rank) and a full communicator on the parent's device; `NCCL_SPLIT_NOCOLOR`
/// gives NULL; config NULL inherits the parent's. A communicator the real NCCL made is split
/// by it.
///
/// # Safety
/// `newcomm` must be NULL or valid for a write; `config` NULL or an `ncclConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: NcclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommSplit", || {
        let c = lookup(comm)?;
        if c.native.is_some() {
            // SAFETY: forwarded contract.
            return unsafe { lifecycle::split(&c, color, key, newcomm, config) };
        }
        if newcomm.is_null() {
            return Err(Failure::argument("newcomm is NULL"));
        }
        let (lib, rc) = c.require_real("ncclCommSplit")?;
        let f = lib.need(lib.comm_split, "ncclCommSplit")?;
        let mut child: NcclComm = std::ptr::null_mut();
        // SAFETY: the real parent, a valid out-pointer and the caller's config.
        lib.check("ncclCommSplit", unsafe {
            f(rc, color, key, &mut child, config)
        })?;
        wrap_real_child(lib, child, newcomm)
    })
}

/// `ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
/// ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags)`: natively, the parent's
/// bootstrap without the excluded ranks (dead ones included: no message reaches them);
/// `NCCL_SHRINK_ABORT` first ends the parent's outstanding operations.
///
/// # Safety
/// As NCCL's: `excludeRanksList` holds `excludeRanksCount` ints; `newcomm` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NcclComm,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
    shrinkFlags: c_int,
) -> NcclResult {
    guard("ncclCommShrink", || {
        let c = lookup(comm)?;
        if c.native.is_some() {
            // SAFETY: forwarded contract.
            return unsafe {
                lifecycle::shrink(
                    &c,
                    excludeRanksList,
                    excludeRanksCount,
                    newcomm,
                    config,
                    shrinkFlags,
                )
            };
        }
        if newcomm.is_null() {
            return Err(Failure::argument("newcomm is NULL"));
        }
        if excludeRanksList.is_null() && excludeRanksCount > 0 {
            return Err(Failure::argument("excludeRanksList is NULL"));
        }
        let (lib, rc) = c.require_real("ncclCommShrink")?;
        let f = lib.need(lib.comm_shrink, "ncclCommShrink")?;
        let mut child: NcclComm = std::ptr::null_mut();
        // SAFETY: the real parent and the caller's arguments.
        lib.check("ncclCommShrink", unsafe {
            f(
                rc,
                excludeRanksList,
                excludeRanksCount,
                &mut child,
                config,
                shrinkFlags,
            )
        })?;
        wrap_real_child(lib, child, newcomm)
    })
}

/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError)`:
/// `ncclInProgress` while a non-blocking creation, split, shrink or finalize runs; then its
/// failure, a dead peer, a stored native error, the real communicator's, or `ncclSuccess`.
///
/// # Safety
/// `asyncError` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: NcclComm,
    asyncError: *mut NcclResult,
) -> NcclResult {
    guard("ncclCommGetAsyncError", || {
        if asyncError.is_null() {
            return Err(Failure::argument("asyncError is NULL"));
        }
        let e = lifecycle::async_error(comm)?;
        // SAFETY: forwarded contract.
        unsafe { out(asyncError, "asyncError", e) }
    })
}

/// `ncclResult_t ncclCommCount(const ncclComm_t comm, int* count)`.
///
/// # Safety
/// `count` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
    guard("ncclCommCount", || {
        let n = lookup(comm)?.nranks as c_int;
        // SAFETY: forwarded contract.
        unsafe { out(count, "count", n) }
    })
}

/// `ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank)`.
///
/// # Safety
/// `rank` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    guard("ncclCommUserRank", || {
        let r = lookup(comm)?.rank as c_int;
        // SAFETY: forwarded contract.
        unsafe { out(rank, "rank", r) }
    })
}

/// `ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device)`.
///
/// # Safety
/// `device` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
    guard("ncclCommCuDevice", || {
        let d = lookup(comm)?.device;
        // SAFETY: forwarded contract.
        unsafe { out(device, "device", d) }
    })
}
