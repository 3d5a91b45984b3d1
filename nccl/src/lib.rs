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
//! - **NCCL 2.29–2.32's additions** (`exports_229`, `exports_232`): every host function of 2.32.6's
//!   `nccl.h` and `nccl_device/host.h` is exported, served or refused naming itself; the
//!   `nccl*Config` collectives run the plain calls with what their `ncclCollConfig_t` asks
//!   (module [`collconfig`]). `ncclGetVersion` says 2.32.6.
//! - **Registration** (module [`register`]): `ncclCommWindowRegister` of `ncclMemAlloc` memory
//!   registers collectively for zero copy; `ncclCommRegister` (local) records only.
//!
//! ## Communicator lifecycle (native; see [`lifecycle`])
//! `ncclCommInitRank`, `ncclCommInitRankConfig` (`ncclConfig_t` read as NCCL reads it: at most
//! `size` bytes of 2.32's layout, the magic, fields newer than the caller's `version` unset;
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
pub mod collconfig;
pub mod comm;
pub mod config;
pub mod debug;
pub mod devapi;
pub mod error;
mod exports;
mod exports_229;
/// `ncclCommProperties_t` as this library writes it (its offsets are checked against the headers).
pub use exports_229::CommProperties;
mod exports_232;
pub mod group;
pub mod headers;
pub mod init;
pub mod job;
pub mod lifecycle;
pub mod native;
pub mod plans;
mod pnccl;
pub mod premul;
pub mod profiler;
pub mod ras;
pub mod real;
pub mod register;
pub mod registry;
pub mod route;
pub mod types;

pub use exports::*;

use comm::Comm;

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

#[allow(dead_code)]
fn _assert_comm_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Comm>();
}
