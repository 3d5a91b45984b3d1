//! NCCL's profiling twins: `nccl.h` declares a `pncclX` beside every `ncclX`, and `libnccl.so`
//! exports both (profilers interpose the `ncclX` names and call the `pncclX` ones). Each twin
//! here is the same function as its `ncclX`, so that under `LD_PRELOAD` no `pncclX` call reaches
//! the real NCCL with this library's handle.
#![allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;

/// `pncclAllGather`: [`crate::ncclAllGather`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) }
}

/// `pncclAllReduce`: [`crate::ncclAllReduce`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) }
}

/// `pncclAlltoAll`: [`crate::ncclAlltoAll`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) }
}

/// `pncclBcast`: [`crate::ncclBcast`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclBcast(buff, count, datatype, root, comm, stream) }
}

/// `pncclBroadcast`: [`crate::ncclBroadcast`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) }
}

/// `pncclCommAbort`: [`crate::ncclCommAbort`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommAbort(comm: NcclComm) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommAbort(comm) }
}

/// `pncclCommCount`: [`crate::ncclCommCount`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommCount(comm, count) }
}

/// `pncclCommCuDevice`: [`crate::ncclCommCuDevice`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommCuDevice(comm, device) }
}

/// `pncclCommDeregister`: [`crate::ncclCommDeregister`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommDeregister(comm: NcclComm, handle: *mut c_void) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommDeregister(comm, handle) }
}

/// `pncclCommDestroy`: [`crate::ncclCommDestroy`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommDestroy(comm: NcclComm) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommDestroy(comm) }
}

/// `pncclCommFinalize`: [`crate::ncclCommFinalize`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommFinalize(comm: NcclComm) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommFinalize(comm) }
}

/// `pncclCommGetAsyncError`: [`crate::ncclCommGetAsyncError`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommGetAsyncError(
    comm: NcclComm,
    asyncError: *mut NcclResult,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommGetAsyncError(comm, asyncError) }
}

/// `pncclCommGetUniqueId`: [`crate::exports_229::ncclCommGetUniqueId`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommGetUniqueId(
    comm: NcclComm,
    uniqueId: *mut NcclUniqueId,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommGetUniqueId(comm, uniqueId) }
}

/// `pncclCommGrow`: [`crate::exports_229::ncclCommGrow`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommGrow(
    comm: NcclComm,
    nRanks: c_int,
    uniqueId: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommGrow(comm, nRanks, uniqueId, rank, newcomm, config) }
}

/// `pncclCommInitAll`: [`crate::ncclCommInitAll`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommInitAll(
    comm: *mut NcclComm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommInitAll(comm, ndev, devlist) }
}

/// `pncclCommInitRank`: [`crate::ncclCommInitRank`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    commId: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommInitRank(comm, nranks, commId, rank) }
}

/// `pncclCommInitRankConfig`: [`crate::ncclCommInitRankConfig`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommInitRankConfig(
    comm: *mut NcclComm,
    nranks: c_int,
    commId: NcclUniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommInitRankConfig(comm, nranks, commId, rank, config) }
}

/// `pncclCommInitRankScalable`: [`crate::ncclCommInitRankScalable`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommInitRankScalable(
    newcomm: *mut NcclComm,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut NcclUniqueId,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config) }
}

/// `pncclCommMemStats`: [`crate::exports_229::ncclCommMemStats`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommMemStats(
    comm: NcclComm,
    stat: c_int,
    value: *mut u64,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommMemStats(comm, stat, value) }
}

/// `pncclCommRegister`: [`crate::ncclCommRegister`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommRegister(comm, buff, size, handle) }
}

/// `pncclCommResume`: [`crate::exports_229::ncclCommResume`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommResume(comm: NcclComm) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommResume(comm) }
}

/// `pncclCommRevoke`: [`crate::exports_229::ncclCommRevoke`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommRevoke(comm: NcclComm, revokeFlags: c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommRevoke(comm, revokeFlags) }
}

/// `pncclCommShrink`: [`crate::ncclCommShrink`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommShrink(
    comm: NcclComm,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
    shrinkFlags: c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe {
        crate::ncclCommShrink(
            comm,
            excludeRanksList,
            excludeRanksCount,
            newcomm,
            config,
            shrinkFlags,
        )
    }
}

/// `pncclCommSplit`: [`crate::ncclCommSplit`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommSplit(
    comm: NcclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommSplit(comm, color, key, newcomm, config) }
}

/// `pncclCommSuspend`: [`crate::exports_229::ncclCommSuspend`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommSuspend(comm: NcclComm, flags: c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclCommSuspend(comm, flags) }
}

/// `pncclCommUserRank`: [`crate::ncclCommUserRank`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommUserRank(comm, rank) }
}

/// `pncclCommWindowDeregister`: [`crate::ncclCommWindowDeregister`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommWindowDeregister(comm: NcclComm, win: NcclWindow) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommWindowDeregister(comm, win) }
}

/// `pncclCommWindowRegister`: [`crate::ncclCommWindowRegister`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclCommWindowRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    win: *mut NcclWindow,
    winFlags: c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclCommWindowRegister(comm, buff, size, win, winFlags) }
}

/// `pncclGather`: [`crate::ncclGather`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclGather(sendbuff, recvbuff, sendcount, datatype, root, comm, stream) }
}

/// `pncclGetErrorString`: [`crate::ncclGetErrorString`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetErrorString(result: NcclResult) -> *const c_char {
    crate::ncclGetErrorString(result)
}

/// `pncclGetLastError`: [`crate::ncclGetLastError`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetLastError(comm: NcclComm) -> *const c_char {
    crate::ncclGetLastError(comm)
}

/// `pncclGetUniqueId`: [`crate::ncclGetUniqueId`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclGetUniqueId(uniqueId: *mut NcclUniqueId) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclGetUniqueId(uniqueId) }
}

/// `pncclGetVersion`: [`crate::ncclGetVersion`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclGetVersion(version) }
}

/// `pncclGroupEnd`: [`crate::ncclGroupEnd`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclGroupEnd() -> NcclResult {
    crate::ncclGroupEnd()
}

/// `pncclGroupSimulateEnd`: [`crate::ncclGroupSimulateEnd`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclGroupSimulateEnd(simInfo: *mut c_void) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclGroupSimulateEnd(simInfo) }
}

/// `pncclGroupStart`: [`crate::ncclGroupStart`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclGroupStart() -> NcclResult {
    crate::ncclGroupStart()
}

/// `pncclMemAlloc`: [`crate::ncclMemAlloc`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclMemAlloc(ptr, size) }
}

/// `pncclMemFree`: [`crate::ncclMemFree`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclMemFree(ptr: *mut c_void) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclMemFree(ptr) }
}

/// `pncclParamBind`: [`crate::exports_229::ncclParamBind`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamBind(out: *mut *mut c_void, key: *const c_char) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamBind(out, key) }
}

/// `pncclParamDumpAll`: [`crate::exports_229::ncclParamDumpAll`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclParamDumpAll() {
    crate::exports_229::ncclParamDumpAll()
}

/// `pncclParamGet`: [`crate::exports_229::ncclParamGet`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGet(
    h: *mut c_void,
    out: *mut c_void,
    maxLen: c_int,
    len: *mut c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGet(h, out, maxLen, len) }
}

/// `pncclParamGetAllParameterKeys`: [`crate::exports_229::ncclParamGetAllParameterKeys`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetAllParameterKeys(
    table: *mut *const *const c_char,
    tableLen: *mut c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetAllParameterKeys(table, tableLen) }
}

/// `pncclParamGetI16`: [`crate::exports_229::ncclParamGetI16`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetI16(h: *mut c_void, out: *mut i16) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetI16(h, out) }
}

/// `pncclParamGetI32`: [`crate::exports_229::ncclParamGetI32`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetI32(h: *mut c_void, out: *mut i32) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetI32(h, out) }
}

/// `pncclParamGetI64`: [`crate::exports_229::ncclParamGetI64`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetI64(h: *mut c_void, out: *mut i64) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetI64(h, out) }
}

/// `pncclParamGetI8`: [`crate::exports_229::ncclParamGetI8`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetI8(h: *mut c_void, out: *mut i8) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetI8(h, out) }
}

/// `pncclParamGetParameter`: [`crate::exports_229::ncclParamGetParameter`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetParameter(key, value, valueLen) }
}

/// `pncclParamGetStr`: [`crate::exports_229::ncclParamGetStr`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetStr(h: *mut c_void, out: *mut *const c_char) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetStr(h, out) }
}

/// `pncclParamGetU16`: [`crate::exports_229::ncclParamGetU16`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetU16(h: *mut c_void, out: *mut u16) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetU16(h, out) }
}

/// `pncclParamGetU32`: [`crate::exports_229::ncclParamGetU32`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetU32(h: *mut c_void, out: *mut u32) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetU32(h, out) }
}

/// `pncclParamGetU64`: [`crate::exports_229::ncclParamGetU64`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetU64(h: *mut c_void, out: *mut u64) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetU64(h, out) }
}

/// `pncclParamGetU8`: [`crate::exports_229::ncclParamGetU8`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclParamGetU8(h: *mut c_void, out: *mut u8) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclParamGetU8(h, out) }
}

/// `pncclPutSignal`: [`crate::exports_229::ncclPutSignal`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    peerWin: NcclWindow,
    peerWinOffset: usize,
    sigIdx: c_int,
    ctx: c_int,
    flags: u32,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe {
        crate::exports_229::ncclPutSignal(
            localbuff,
            count,
            datatype,
            peer,
            peerWin,
            peerWinOffset,
            sigIdx,
            ctx,
            flags,
            comm,
            stream,
        )
    }
}

/// `pncclRecv`: [`crate::ncclRecv`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclRecv(recvbuff, count, datatype, peer, comm, stream) }
}

/// `pncclRedOpCreatePreMulSum`: [`crate::ncclRedOpCreatePreMulSum`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: NcclComm,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) }
}

/// `pncclRedOpDestroy`: [`crate::ncclRedOpDestroy`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclRedOpDestroy(op: c_int, comm: NcclComm) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclRedOpDestroy(op, comm) }
}

/// `pncclReduce`: [`crate::ncclReduce`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) }
}

/// `pncclReduceScatter`: [`crate::ncclReduceScatter`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) }
}

/// `pncclResetDebugInit`: [`crate::exports_229::ncclResetDebugInit`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclResetDebugInit() {
    crate::exports_229::ncclResetDebugInit()
}

/// `pncclScatter`: [`crate::ncclScatter`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclScatter(sendbuff, recvbuff, recvcount, datatype, root, comm, stream) }
}

/// `pncclSend`: [`crate::ncclSend`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::ncclSend(sendbuff, count, datatype, peer, comm, stream) }
}

/// `pncclSignal`: [`crate::exports_229::ncclSignal`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: u32,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclSignal(peer, sigIdx, ctx, flags, comm, stream) }
}

/// `pncclWaitSignal`: [`crate::exports_229::ncclWaitSignal`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut c_void,
    comm: NcclComm,
    stream: CudaStream,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclWaitSignal(nDesc, signalDescs, comm, stream) }
}

/// `pncclWinGetUserPtr`: [`crate::exports_229::ncclWinGetUserPtr`].
///
/// # Safety
/// As its `nccl` twin.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pncclWinGetUserPtr(
    comm: NcclComm,
    win: NcclWindow,
    outUserPtr: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract is the twin's.
    unsafe { crate::exports_229::ncclWinGetUserPtr(comm, win, outUserPtr) }
}
