//! # mscclpp-nccl — an NCCL-compatible C library over mscclpp-rs
//!
//! `libmscclpp_nccl.so` exports NCCL 2.x's C API (every one of the 38 symbols PyTorch 2.11
//! imports from `libnccl.so.2`, plus `ncclCommCuDevice`), so that a program built against NCCL
//! runs on mscclpp with `LD_PRELOAD=libmscclpp_nccl.so`.
//!
//! ## What is served how
//! - **Native** (mscclpp's collectives, enqueued on the caller's stream): `ncclAllReduce`,
//!   `ncclReduceScatter` (every NCCL 2.28 type, 8- to 64-bit and float8; sum, prod, min, max,
//!   avg), `ncclReduce` (all-reduces of at most 8 MiB into the root's output and a sink
//!   elsewhere), `ncclAllGather`, `ncclBroadcast`/`ncclBcast`, `ncclAlltoAll` (every type, in place
//!   too), `ncclSend`/`ncclRecv` (every type, alone or in groups of any mix; see Groups), for
//!   1 to 8 ranks on one host.
//! - **Fallback** to the real NCCL named by `MSCCLPP_NCCL_LIB_PATH` (every rank then also holds
//!   a real communicator, created at `ncclCommInitRank` with an id rank 0 makes and our
//!   bootstrap carries): communicators over several hosts or more than 8 ranks, and every operation
//!   `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` (`all` or e.g. `allreduce,send`) names; also
//!   `ncclDevCommCreate` and `ncclGroupSimulateEnd`. Without a real NCCL these return
//!   `ncclInvalidUsage` and `ncclGetLastError` says to set `MSCCLPP_NCCL_LIB_PATH`.
//! - **PreMulSum** (`ncclRedOpCreatePreMulSum`, module [`premul`]): native, a sum and then the
//!   output scaled on the same stream.
//! - **Registration** (module [`register`]): `ncclCommWindowRegister` of `ncclMemAlloc` memory
//!   registers collectively for zero copy; `ncclCommRegister` (local) records only.
//!
//! ## Communicator lifecycle (native; see [`lifecycle`])
//! `ncclCommInitRank`, `ncclCommInitRankConfig` (`ncclConfig_t` read as NCCL reads it: at most
//! `size` bytes of 2.28's layout, the magic, fields newer than the caller's `version` unset;
//! `NCCL_COMM_BLOCKING` overrides `blocking`), `ncclCommInitRankScalable` (the first id is the
//! root), `ncclCommInitAll` (a thread per device inside the call; a device may repeat; any
//! `ndev` on the host backend), `ncclCommSplit` and `ncclCommShrink` (views of the parent's
//! bootstrap: no new root; a shrink needs no message, so dead ranks can be excluded;
//! `NCCL_SHRINK_ABORT` aborts the parent's operations first). With `blocking = 0` a creation,
//! split, shrink or `ncclCommFinalize` returns `ncclInProgress` at once (handles written) and
//! `ncclCommGetAsyncError` says `ncclInProgress` until it is done; meanwhile other calls on
//! the handle (the parent's too, for a split or shrink) are `ncclInvalidArgument`, as NCCL's.
//! Creations inside a group start at once on their own threads and the outermost
//! `ncclGroupEnd` waits for them (one thread can initialise every GPU, as nccl-tests `-g` does).
//!
//! ## Groups
//! `ncclGroupStart`/`ncclGroupEnd` nest (depth per thread). Inside a group, native collectives
//! are enqueued at once (they are stream-ordered); native `ncclSend`/`ncclRecv` are checked at
//! once and kept until the outermost `ncclGroupEnd`, which launches each communicator's sends and
//! receives as one point-to-point kernel in which none waits for another (so gather, scatter,
//! all-to-all-v, rings and PyTorch's `batch_isend_irecv` do not deadlock; a send and a receive
//! outside a group are a group of one). A group's sends and receives on one communicator must
//! use one stream. Operations that fall back are forwarded inside a real
//! `ncclGroupStart`/`ncclGroupEnd` pair opened at the first of them and closed at the outermost
//! `ncclGroupEnd`. So within one group, fallback operations run after the native collectives on
//! a stream, whatever the call order (NCCL itself gives no order inside a group).
//!
//! ## Streams on the host backend
//! The host backend (`MSCCLPP_BACKEND=host`, or no GPU) has no native streams: `stream` must be
//! NULL, the operation runs on the communicator's own stream and the call returns once it has
//! run. Memory comes from `ncclMemAlloc` (host-backend device memory is host memory).
//!
//! ## Errors
//! No panic crosses the ABI (each export runs under `catch_unwind`: a panic is
//! `ncclInternalError`); pointers are checked (NULL → `ncclInvalidArgument`); communicator
//! handles are looked up in a registry of live ones. `ncclGetLastError` returns the message of
//! the last failing call on the calling thread. Logging: NCCL's `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`
//! and `NCCL_DEBUG_FILE` in NCCL's line format (module [`debug`]); `MSCCLPP_LOG_LEVEL` /
//! `MSCCLPP_DEBUG` take precedence.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]

pub mod abi;
pub mod comm;
pub mod config;
pub mod debug;
pub mod error;
mod exports_229;
pub mod group;
pub mod init;
pub mod job;
pub mod lifecycle;
pub mod native;
pub mod plans;
mod pnccl;
pub mod premul;
pub mod real;
pub mod register;
pub mod registry;
pub mod route;
pub mod types;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use mscclpp::hal::{Device, DeviceBuffer, MemoryKind};

use abi::*;
use comm::Comm;
use error::{Failure, Res, guard};
use init::from_real;
use real::RealResults;
use registry::{lookup, lookup_for_op, register};
use route::{Call, Op};

/// The names of every export, in the order of docs/gpu-machines.md's list (PyTorch 2.11's 38
/// imports), then the extra ones.
pub const EXPORTS: &[&str] = &[
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclSend",
    // beyond PyTorch 2.11's list
    "ncclCommCuDevice",
    "ncclGather",
    "ncclScatter",
    mscclpp_nccl_real::SHIM_MARKER,
    "mscclppNcclZeroCopyCalls",
];

/// `int mscclppNcclShim(void)`: 1. Only this library exports it, so that the binding of the real
/// NCCL refuses it when `MSCCLPP_NCCL_LIB_PATH` names this library (forwarding to ourselves
/// would recurse until the stack overflows).
#[unsafe(no_mangle)]
pub extern "C" fn mscclppNcclShim() -> c_int {
    1
}

/// Writes `v` through an out-pointer, or fails naming it when it is NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, name: &str, v: T) -> Res<()> {
    if p.is_null() {
        return Err(Failure::argument(format!("{name} is NULL")));
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Version, errors, ids

/// `ncclResult_t ncclGetVersion(int* version)`: reports [`NCCL_VERSION_CODE`].
///
/// # Safety
/// `version` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: forwarded contract.
    guard("ncclGetVersion", || unsafe {
        out(version, "version", NCCL_VERSION_CODE)
    })
}

/// `const char* ncclGetErrorString(ncclResult_t result)`: a static string.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error::error_string(result).as_ptr()
}

/// `const char* ncclGetLastError(ncclComm_t comm)`: the last failure's message on the calling
/// thread (`comm` is ignored), valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    error::last_error_ptr()
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`: an mscclpp bootstrap id (root
/// address and secret); the root's listener is bound now and run by the first
/// `ncclCommInitRank` of this process with the id.
///
/// # Safety
/// `uniqueId` must be NULL or valid for a write of 128 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        if uniqueId.is_null() {
            return Err(Failure::argument("uniqueId is NULL"));
        }
        crate::debug::show_version();
        let id = mscclpp::comm::UniqueId::new()?;
        let bytes = id.to_bytes();
        // SAFETY: non-null, valid for a 128-byte write (caller's contract).
        unsafe { out(uniqueId, "uniqueId", NcclUniqueId { internal: bytes }) }
    })
}

// ---------------------------------------------------------------------------------------------
// Communicators

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

// ---------------------------------------------------------------------------------------------
// Registration (see `register`: windows of ncclMemAlloc memory register for zero copy)

/// `ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void**
/// handle)`: local, as NCCL's: records the range (keeping `ncclMemAlloc` memory alive until
/// deregistered); the calls copy as without it (only the collective window API maps buffers
/// into the peers, see `register`).
///
/// # Safety
/// `handle` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    guard("ncclCommRegister", || {
        let c = lookup(comm)?;
        check_range(buff, size, handle.is_null(), "handle")?;
        let h = register::register_local(&c, mem_owner(buff, size).map(|(b, _)| b));
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe { out(handle, "handle", h) }
    })
}

/// `ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle)`.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDeregister(comm: NcclComm, handle: *mut c_void) -> NcclResult {
    guard("ncclCommDeregister", || {
        register::deregister(&lookup(comm)?, handle, register::Kind::Local)
    })
}

/// `ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t*
/// win, int winFlags)`: collective, as NCCL 2.27's. When every rank's buffer came from
/// `ncclMemAlloc`, the buffers are registered with the collectives (mapped into every peer now),
/// and all-reduces whose input lies in the window read it in place where that pays; otherwise
/// the window is recorded and calls copy.
///
/// # Safety
/// `win` must be NULL or valid for a write; `buff` `size` bytes of the caller's device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    win: *mut NcclWindow,
    _winFlags: c_int,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        let c = lookup(comm)?;
        check_range(buff, size, win.is_null(), "win")?;
        let h = register::register_window(&c, mem_owner(buff, size), size)?;
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe { out(win, "win", h) }
    })
}

/// The checks both registration calls make before anything is recorded.
fn check_range(buff: *mut c_void, size: usize, out_null: bool, what: &str) -> Res<()> {
    if buff.is_null() {
        return Err(Failure::argument("buff is NULL"));
    }
    if size == 0 {
        return Err(Failure::argument("size is 0"));
    }
    if (buff as usize).checked_add(size).is_none() {
        return Err(Failure::argument(format!(
            "{size} bytes at {buff:p} wrap around the address space"
        )));
    }
    if out_null {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    Ok(())
}

/// `ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)`: collective when
/// the window was registered for zero copy (every rank, in the same order).
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: NcclComm, win: NcclWindow) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        register::deregister(&lookup(comm)?, win, register::Kind::Window)
    })
}

/// `ncclResult_t mscclppNcclZeroCopyCalls(ncclComm_t comm, uint64_t* calls)` (this library's
/// own): how many all-reduces of the communicator read a registered input in place — what tests
/// and benchmarks check to see the zero-copy path taken.
///
/// # Safety
/// `calls` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppNcclZeroCopyCalls(comm: NcclComm, calls: *mut u64) -> NcclResult {
    guard("mscclppNcclZeroCopyCalls", || {
        let c = lookup(comm)?;
        let n = c
            .native_collectives()
            .map_or(0, |(colls, _)| colls.zero_copy_calls());
        // SAFETY: forwarded contract.
        unsafe { out(calls, "calls", n) }
    })
}

// ---------------------------------------------------------------------------------------------
// Memory

/// Buffers handed out by `ncclMemAlloc`, by address.
fn mem_map() -> &'static Mutex<HashMap<usize, DeviceBuffer>> {
    static M: OnceLock<Mutex<HashMap<usize, DeviceBuffer>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The `ncclMemAlloc` buffer holding `[ptr, ptr + len)` and the range's offset in it.
fn mem_owner(ptr: *mut c_void, len: usize) -> Option<(DeviceBuffer, usize)> {
    let p = ptr as usize;
    let m = mem_map().lock().unwrap_or_else(|e| e.into_inner());
    m.iter().find_map(|(&base, b)| {
        let off = p.checked_sub(base)?;
        (off.checked_add(len)? <= b.len()).then(|| (b.clone(), off))
    })
}

/// The device `ncclMemAlloc` allocates on: the caller's current one (CUDA), else device 0.
fn mem_device() -> Res<Arc<dyn Device>> {
    type Devices = Mutex<HashMap<usize, Arc<dyn Device>>>;
    static BACKEND: OnceLock<Result<Arc<dyn mscclpp::hal::Backend>, Failure>> = OnceLock::new();
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    let backend = BACKEND
        .get_or_init(|| mscclpp::registry::select().map_err(Failure::from))
        .as_ref()
        .map_err(Clone::clone)?;
    let ordinal = backend.current_device()?.unwrap_or(0);
    let mut devs = DEVICES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = devs.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = backend.open_device(ordinal)?;
    devs.insert(ordinal, d.clone());
    Ok(d)
}

/// `ncclResult_t ncclMemAlloc(void** ptr, size_t size)`: device memory of the current device
/// through the HAL (host backend: shared host memory).
///
/// # Safety
/// `ptr` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Failure::argument("ptr is NULL"));
        }
        if size == 0 {
            return Err(Failure::argument("size is 0"));
        }
        let buf = mem_device()?.alloc(size, MemoryKind::Device)?;
        let p = buf.ptr().0 as usize;
        mem_map()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p, buf);
        // SAFETY: forwarded contract.
        unsafe { out(ptr, "ptr", p as *mut c_void) }
    })
}

/// `ncclResult_t ncclMemFree(void* ptr)`: frees what `ncclMemAlloc` returned.
///
/// # Safety
/// No outstanding work may use the memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Err(Failure::argument("ptr is NULL"));
        }
        mem_map()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr as usize))
            .map(|buf| {
                drop(buf);
                // Communicators drop their wrappers of caller memory: a call on a pointer into
                // this memory is checked (and refused) again, not trusted.
                mscclpp_caller::memory_freed();
            })
            .ok_or_else(|| Failure::argument(format!("{ptr:p} was not allocated by ncclMemAlloc")))
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives and point-to-point

fn run(op: Op, comm: NcclComm, call: impl FnOnce(Op) -> Call) -> Res<()> {
    lookup_for_op(comm)?.run(call(op))
}

/// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's contract: device buffers of the sizes the operation needs; a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclAllReduce", || {
        run(Op::AllReduce, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count,
            dtype: datatype,
            redop: op,
            root: 0,
            stream,
        })
    })
}

/// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
/// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclAllGather", || {
        run(Op::AllGather, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count: sendcount,
            dtype: datatype,
            redop: 0,
            root: 0,
            stream,
        })
    })
}

/// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclReduceScatter", || {
        run(Op::ReduceScatter, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count: recvcount,
            dtype: datatype,
            redop: op,
            root: 0,
            stream,
        })
    })
}

/// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclBroadcast", || {
        run(Op::Broadcast, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count,
            dtype: datatype,
            redop: 0,
            root,
            stream,
        })
    })
}

/// `ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
/// ncclComm_t comm, cudaStream_t stream)`: in-place broadcast (forwarded as
/// `ncclBroadcast(buff, buff, ...)` when it falls back).
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclBcast", || {
        run(Op::Broadcast, comm, |o| Call {
            op: o,
            send: buff,
            recv: buff,
            count,
            dtype: datatype,
            redop: 0,
            root,
            stream,
        })
    })
}

/// `ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`: `count` elements per peer.
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclAlltoAll", || {
        run(Op::AllToAll, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count,
            dtype: datatype,
            redop: 0,
            root: 0,
            stream,
        })
    })
}

/// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t
/// datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)`: native
/// (all-reduces into the root's `recvbuff`; the others' `recvbuff` is not touched).
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclReduce", || {
        run(Op::Reduce, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: recvbuff,
            count,
            dtype: datatype,
            redop: op,
            root,
            stream,
        })
    })
}

/// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int
/// peer, ncclComm_t comm, cudaStream_t stream)`: native (launched at the outermost
/// `ncclGroupEnd` inside a group).
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclSend", || {
        run(Op::Send, comm, |o| Call {
            op: o,
            send: sendbuff,
            recv: std::ptr::null_mut(),
            count,
            dtype: datatype,
            redop: 0,
            root: peer,
            stream,
        })
    })
}

/// `ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
/// ncclComm_t comm, cudaStream_t stream)`: fallback.
///
/// # Safety
/// As for [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclRecv", || {
        run(Op::Recv, comm, |o| Call {
            op: o,
            send: std::ptr::null(),
            recv: recvbuff,
            count,
            dtype: datatype,
            redop: 0,
            root: peer,
            stream,
        })
    })
}

/// Which of NCCL 2.28's rooted data movements [`rooted`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rooted {
    /// Every rank's `count` elements land in block `rank` of the root's `recvbuff`.
    Gather,
    /// Block `rank` of the root's `sendbuff` lands in every rank's `recvbuff`.
    Scatter,
}

/// NCCL 2.28's `ncclGather` / `ncclScatter` as one group of native sends and receives: the root
/// exchanges with every rank (itself included: a stream copy), every other rank with the root.
/// A client built against NCCL 2.28's header calls these symbols directly, so leaving them out
/// would hand our communicator to the real NCCL.
///
/// # Safety
/// As for [`ncclAllReduce`]: device buffers of the communicator's device, of `count` elements
/// (the root's `recvbuff` / `sendbuff`: `nranks * count`).
#[allow(clippy::too_many_arguments)]
unsafe fn rooted(
    what: Rooted,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> Res<()> {
    let c = lookup(comm)?;
    let (size, _) = types::dtype_info(datatype)?;
    let (rank, n) = (c.rank, c.nranks);
    let root_rank = usize::try_from(root)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Failure::argument(format!("root {root} is not a rank of {n}")))?;
    let block = count
        .checked_mul(size)
        .ok_or_else(|| Failure::argument(format!("{count} elements of {size} bytes overflow")))?;
    // The inner call has already recorded its own message; keep its code.
    let check = |r: NcclResult, what: &str| -> Res<()> {
        if r == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(Failure {
                code: r,
                message: format!("{what} inside ncclGather/ncclScatter failed (code {r})"),
            })
        }
    };
    check(ncclGroupStart(), "ncclGroupStart")?;
    let mut result = Ok(());
    for peer in 0..n {
        if rank != root_rank && peer != root_rank {
            continue;
        }
        let p = peer as c_int;
        // SAFETY: the caller's buffers, offset within the root's nranks * count elements.
        let r = unsafe {
            match (what, rank == root_rank) {
                (Rooted::Gather, true) => {
                    let dst = recvbuff.cast::<u8>().wrapping_add(peer * block).cast();
                    let r = ncclRecv(dst, count, datatype, p, comm, stream);
                    if r == NCCL_SUCCESS && peer == rank {
                        ncclSend(sendbuff, count, datatype, p, comm, stream)
                    } else {
                        r
                    }
                }
                (Rooted::Gather, false) => ncclSend(sendbuff, count, datatype, p, comm, stream),
                (Rooted::Scatter, true) => {
                    let src = sendbuff.cast::<u8>().wrapping_add(peer * block).cast();
                    let r = ncclSend(src, count, datatype, p, comm, stream);
                    if r == NCCL_SUCCESS && peer == rank {
                        ncclRecv(recvbuff, count, datatype, p, comm, stream)
                    } else {
                        r
                    }
                }
                (Rooted::Scatter, false) => ncclRecv(recvbuff, count, datatype, p, comm, stream),
            }
        };
        if let Err(e) = check(r, "a send or receive") {
            result = Err(e);
            break;
        }
    }
    // The group is closed whatever happened inside it, so the thread's group state stays sane.
    let end = check(ncclGroupEnd(), "ncclGroupEnd");
    result.and(end)
}

/// `ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t sendcount,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)` (NCCL 2.28): native.
///
/// # Safety
/// As for [`ncclAllReduce`]; the root's `recvbuff` holds `nranks * sendcount` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclGather", || {
        // SAFETY: forwarded contract.
        unsafe {
            rooted(
                Rooted::Gather,
                sendbuff,
                recvbuff,
                sendcount,
                datatype,
                root,
                comm,
                stream,
            )
        }
    })
}

/// `ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)` (NCCL 2.28): native.
///
/// # Safety
/// As for [`ncclAllReduce`]; the root's `sendbuff` holds `nranks * recvcount` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    guard("ncclScatter", || {
        // SAFETY: forwarded contract.
        unsafe {
            rooted(
                Rooted::Scatter,
                sendbuff,
                recvbuff,
                recvcount,
                datatype,
                root,
                comm,
                stream,
            )
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Groups

/// `ncclResult_t ncclGroupStart(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard("ncclGroupStart", group::group_start)
}

/// `ncclResult_t ncclGroupEnd(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard("ncclGroupEnd", group::group_end)
}

/// `ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo)`: native operations have been
/// enqueued already, so this library cannot simulate them: `ncclInvalidUsage` (the group is
/// closed all the same, and a real group opened for fallback operations is ended normally).
///
/// # Safety
/// `simInfo` is only passed on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupSimulateEnd(_simInfo: *mut c_void) -> NcclResult {
    guard("ncclGroupSimulateEnd", || {
        group::group_end()?;
        Err(Failure::usage(
            "mscclpp enqueues operations as they are called and cannot simulate a group; the group was ended normally",
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// User-defined operators and device communicators: the real NCCL's

/// `ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t
/// datatype, ncclScalarResidence_t residence, ncclComm_t comm)`: native — `sum(scalar * x_i)`
/// served as `scalar * sum(x_i)` (a sum, then the output scaled on the same stream). A host
/// scalar (`ncclScalarHostImmediate`) is copied now; a device one (`ncclScalarDevice`) is read
/// when each operation runs, so graph replays see its current value. With a real NCCL, its own
/// operator is made beside ours for the operations that fall back.
///
/// # Safety
/// As NCCL's: `op` valid for a write; `scalar` a host or device scalar per `residence`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: NcclComm,
) -> NcclResult {
    guard("ncclRedOpCreatePreMulSum", || {
        let c = lookup(comm)?;
        if op.is_null() {
            return Err(Failure::argument("op is NULL"));
        }
        // SAFETY: forwarded contract.
        let code = unsafe { premul::create(&c, comm, scalar, datatype, residence)? };
        // SAFETY: non-null; the caller's out-pointer.
        unsafe { out(op, "op", code) }
    })
}

/// `ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)`: frees an operator made by
/// `ncclRedOpCreatePreMulSum` for this communicator.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, comm: NcclComm) -> NcclResult {
    guard("ncclRedOpDestroy", || premul::destroy(&lookup(comm)?, op))
}

/// `ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
/// ncclDevComm_t* outDevComm)` (NCCL 2.28 device API): through the real NCCL.
///
/// # Safety
/// As NCCL's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: NcclComm,
    reqs: *const c_void,
    outDevComm: *mut c_void,
) -> NcclResult {
    guard("ncclDevCommCreate", || {
        let c = lookup(comm)?;
        if reqs.is_null() || outDevComm.is_null() {
            return Err(Failure::argument("reqs or outDevComm is NULL"));
        }
        let (lib, rc) = c.require_real("ncclDevCommCreate (NCCL's device API)")?;
        let f = lib.need(lib.dev_comm_create, "ncclDevCommCreate")?;
        // SAFETY: the caller's arguments with the real communicator.
        lib.check("ncclDevCommCreate", unsafe { f(rc, reqs, outDevComm) })
    })
}

/// `ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm)`.
///
/// # Safety
/// As NCCL's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommDestroy(comm: NcclComm, devComm: *const c_void) -> NcclResult {
    guard("ncclDevCommDestroy", || {
        let c = lookup(comm)?;
        if devComm.is_null() {
            return Err(Failure::argument("devComm is NULL"));
        }
        let (lib, rc) = c.require_real("ncclDevCommDestroy (NCCL's device API)")?;
        let f = lib.need(lib.dev_comm_destroy, "ncclDevCommDestroy")?;
        // SAFETY: a device communicator the real NCCL made for this communicator.
        lib.check("ncclDevCommDestroy", unsafe { f(rc, devComm) })
    })
}

#[allow(dead_code)]
fn _assert_comm_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Comm>();
}
