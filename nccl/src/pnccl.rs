//! NCCL's profiling twins: `nccl.h` declares a `pncclX` beside every `ncclX`, and `libnccl.so`
//! exports both (profilers interpose the `ncclX` names and call the `pncclX` ones). Each twin
//! here is the same function as its `ncclX`, so that under `LD_PRELOAD` no `pncclX` call reaches
//! the real NCCL with this library's handle. The twins are a table: one line per function, its
//! C signature and the `ncclX` it calls; [`twins`] makes each an `extern "C"` export.
#![allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;

/// `fn pncclX(args) -> R = to;` exports `pncclX`, which calls `to` with its arguments
/// (an `unsafe` list for the twins of unsafe functions, a `safe` one for the others).
macro_rules! twins {
    (unsafe: $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $to:path;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: the same function as its `nccl` twin.")]
            ///
            /// # Safety
            /// As its `nccl` twin.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the caller's contract is the twin's.
                unsafe { $to($($arg),*) }
            }
        )*
    };
    (safe: $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $to:path;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: the same function as its `nccl` twin.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
                $to($($arg),*)
            }
        )*
    };
}

twins! {
    unsafe:
    fn pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int,
        comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclAllGather;
    fn pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclAllReduce;
    fn pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclAlltoAll;
    fn pncclBcast(
        buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm,
        stream: CudaStream,
    ) -> NcclResult = crate::ncclBcast;
    fn pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclBroadcast;
    fn pncclCommAbort(comm: NcclComm) -> NcclResult = crate::ncclCommAbort;
    fn pncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult = crate::ncclCommCount;
    fn pncclCommCuDevice(
        comm: NcclComm, device: *mut c_int,
    ) -> NcclResult = crate::ncclCommCuDevice;
    fn pncclCommDeregister(
        comm: NcclComm, handle: *mut c_void,
    ) -> NcclResult = crate::ncclCommDeregister;
    fn pncclCommDestroy(comm: NcclComm) -> NcclResult = crate::ncclCommDestroy;
    fn pncclCommFinalize(comm: NcclComm) -> NcclResult = crate::ncclCommFinalize;
    fn pncclCommGetAsyncError(
        comm: NcclComm, asyncError: *mut NcclResult,
    ) -> NcclResult = crate::ncclCommGetAsyncError;
    fn pncclCommGetUniqueId(
        comm: NcclComm, uniqueId: *mut NcclUniqueId,
    ) -> NcclResult = crate::exports_229::ncclCommGetUniqueId;
    fn pncclCommGrow(
        comm: NcclComm, nRanks: c_int, uniqueId: *const NcclUniqueId, rank: c_int,
        newcomm: *mut NcclComm, config: *mut c_void,
    ) -> NcclResult = crate::exports_229::ncclCommGrow;
    fn pncclCommInitAll(
        comm: *mut NcclComm, ndev: c_int, devlist: *const c_int,
    ) -> NcclResult = crate::ncclCommInitAll;
    fn pncclCommInitRank(
        comm: *mut NcclComm, nranks: c_int, commId: NcclUniqueId, rank: c_int,
    ) -> NcclResult = crate::ncclCommInitRank;
    fn pncclCommInitRankConfig(
        comm: *mut NcclComm, nranks: c_int, commId: NcclUniqueId, rank: c_int, config: *mut c_void,
    ) -> NcclResult = crate::ncclCommInitRankConfig;
    fn pncclCommInitRankScalable(
        newcomm: *mut NcclComm, nranks: c_int, myrank: c_int, nId: c_int,
        commIds: *mut NcclUniqueId, config: *mut c_void,
    ) -> NcclResult = crate::ncclCommInitRankScalable;
    fn pncclCommMemStats(
        comm: NcclComm, stat: c_int, value: *mut u64,
    ) -> NcclResult = crate::exports_229::ncclCommMemStats;
    fn pncclCommRegister(
        comm: NcclComm, buff: *mut c_void, size: usize, handle: *mut *mut c_void,
    ) -> NcclResult = crate::ncclCommRegister;
    fn pncclCommResume(comm: NcclComm) -> NcclResult = crate::exports_229::ncclCommResume;
    fn pncclCommRevoke(
        comm: NcclComm, revokeFlags: c_int,
    ) -> NcclResult = crate::exports_229::ncclCommRevoke;
    fn pncclCommShrink(
        comm: NcclComm, excludeRanksList: *mut c_int, excludeRanksCount: c_int,
        newcomm: *mut NcclComm, config: *mut c_void, shrinkFlags: c_int,
    ) -> NcclResult = crate::ncclCommShrink;
    fn pncclCommSplit(
        comm: NcclComm, color: c_int, key: c_int, newcomm: *mut NcclComm, config: *mut c_void,
    ) -> NcclResult = crate::ncclCommSplit;
    fn pncclCommSuspend(
        comm: NcclComm, flags: c_int,
    ) -> NcclResult = crate::exports_229::ncclCommSuspend;
    fn pncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult = crate::ncclCommUserRank;
    fn pncclCommWindowDeregister(
        comm: NcclComm, win: NcclWindow,
    ) -> NcclResult = crate::ncclCommWindowDeregister;
    fn pncclCommWindowRegister(
        comm: NcclComm, buff: *mut c_void, size: usize, win: *mut NcclWindow, winFlags: c_int,
    ) -> NcclResult = crate::ncclCommWindowRegister;
    fn pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int,
        root: c_int, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclGather;
    fn pncclGetUniqueId(uniqueId: *mut NcclUniqueId) -> NcclResult = crate::ncclGetUniqueId;
    fn pncclGetVersion(version: *mut c_int) -> NcclResult = crate::ncclGetVersion;
    fn pncclGroupSimulateEnd(simInfo: *mut c_void) -> NcclResult = crate::ncclGroupSimulateEnd;
    fn pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult = crate::ncclMemAlloc;
    fn pncclMemFree(ptr: *mut c_void) -> NcclResult = crate::ncclMemFree;
    fn pncclParamBind(
        out: *mut *mut c_void, key: *const c_char,
    ) -> NcclResult = crate::exports_229::ncclParamBind;
    fn pncclParamGet(
        h: *mut c_void, out: *mut c_void, maxLen: c_int, len: *mut c_int,
    ) -> NcclResult = crate::exports_229::ncclParamGet;
    fn pncclParamGetAllParameterKeys(
        table: *mut *const *const c_char, tableLen: *mut c_int,
    ) -> NcclResult = crate::exports_229::ncclParamGetAllParameterKeys;
    fn pncclParamGetI16(
        h: *mut c_void, out: *mut i16,
    ) -> NcclResult = crate::exports_229::ncclParamGetI16;
    fn pncclParamGetI32(
        h: *mut c_void, out: *mut i32,
    ) -> NcclResult = crate::exports_229::ncclParamGetI32;
    fn pncclParamGetI64(
        h: *mut c_void, out: *mut i64,
    ) -> NcclResult = crate::exports_229::ncclParamGetI64;
    fn pncclParamGetI8(
        h: *mut c_void, out: *mut i8,
    ) -> NcclResult = crate::exports_229::ncclParamGetI8;
    fn pncclParamGetParameter(
        key: *const c_char, value: *mut *const c_char, valueLen: *mut c_int,
    ) -> NcclResult = crate::exports_229::ncclParamGetParameter;
    fn pncclParamGetStr(
        h: *mut c_void, out: *mut *const c_char,
    ) -> NcclResult = crate::exports_229::ncclParamGetStr;
    fn pncclParamGetU16(
        h: *mut c_void, out: *mut u16,
    ) -> NcclResult = crate::exports_229::ncclParamGetU16;
    fn pncclParamGetU32(
        h: *mut c_void, out: *mut u32,
    ) -> NcclResult = crate::exports_229::ncclParamGetU32;
    fn pncclParamGetU64(
        h: *mut c_void, out: *mut u64,
    ) -> NcclResult = crate::exports_229::ncclParamGetU64;
    fn pncclParamGetU8(
        h: *mut c_void, out: *mut u8,
    ) -> NcclResult = crate::exports_229::ncclParamGetU8;
    fn pncclPutSignal(
        localbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, peerWin: NcclWindow,
        peerWinOffset: usize, sigIdx: c_int, ctx: c_int, flags: u32, comm: NcclComm,
        stream: CudaStream,
    ) -> NcclResult = crate::exports_229::ncclPutSignal;
    fn pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm,
        stream: CudaStream,
    ) -> NcclResult = crate::ncclRecv;
    fn pncclRedOpCreatePreMulSum(
        op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: NcclComm,
    ) -> NcclResult = crate::ncclRedOpCreatePreMulSum;
    fn pncclRedOpDestroy(op: c_int, comm: NcclComm) -> NcclResult = crate::ncclRedOpDestroy;
    fn pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        root: c_int, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclReduce;
    fn pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int,
        op: c_int, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclReduceScatter;
    fn pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int,
        root: c_int, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::ncclScatter;
    fn pncclSend(
        sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm,
        stream: CudaStream,
    ) -> NcclResult = crate::ncclSend;
    fn pncclSignal(
        peer: c_int, sigIdx: c_int, ctx: c_int, flags: u32, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::exports_229::ncclSignal;
    fn pncclWaitSignal(
        nDesc: c_int, signalDescs: *mut c_void, comm: NcclComm, stream: CudaStream,
    ) -> NcclResult = crate::exports_229::ncclWaitSignal;
    fn pncclWinGetUserPtr(
        comm: NcclComm, win: NcclWindow, outUserPtr: *mut *mut c_void,
    ) -> NcclResult = crate::exports_229::ncclWinGetUserPtr;
    fn pncclAllGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclAllGatherConfig;
    fn pncclAllReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclAllReduceConfig;
    fn pncclAlltoAllConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclAlltoAllConfig;
    fn pncclBroadcastConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclBroadcastConfig;
    fn pncclGatherConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclGatherConfig;
    fn pncclReduceConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int,
        root: c_int, comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclReduceConfig;
    fn pncclReduceScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int,
        op: c_int, comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclReduceScatterConfig;
    fn pncclScatterConfig(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int,
        comm: NcclComm, stream: CudaStream, config: *const NcclCollConfig,
    ) -> NcclResult = crate::exports_232::ncclScatterConfig;
    fn pncclSetEncryption(
        config: *const NcclEncryptionConfig,
    ) -> NcclResult = crate::exports_232::ncclSetEncryption;
}

twins! {
    safe:
    fn pncclGetErrorString(result: NcclResult) -> *const c_char = crate::ncclGetErrorString;
    fn pncclGetLastError(comm: NcclComm) -> *const c_char = crate::ncclGetLastError;
    fn pncclGroupEnd() -> NcclResult = crate::ncclGroupEnd;
    fn pncclGroupStart() -> NcclResult = crate::ncclGroupStart;
    fn pncclParamDumpAll() = crate::exports_229::ncclParamDumpAll;
    fn pncclResetDebugInit() = crate::exports_229::ncclResetDebugInit;
}
