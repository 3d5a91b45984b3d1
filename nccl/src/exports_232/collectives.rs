//! The `nccl*Config` collectives (NCCL 2.31): the plain call's body (`exports/collectives.rs`)
//! with what the call's `ncclCollConfig_t` asks for; a NULL config is the plain call.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::collconfig;
use crate::error::guard;
use crate::exports::collectives as plain;
use crate::registry::lookup;
use crate::route::Op;

/// `ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclAllReduce`
/// with `config` applied ([`collconfig`]); NULL: `ncclAllReduce` itself.
///
/// # Safety
/// As `ncclAllReduce`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclAllReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclAllReduceConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning =
            unsafe { collconfig::read(config, Some(Op::AllReduce), "ncclAllReduceConfig")? };
        plain::all_reduce(
            sendbuff, recvbuff, count, datatype, op, comm, stream, tuning,
        )
    })
}

/// `ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclBroadcast`
/// with `config` applied ([`collconfig`]); NULL: `ncclBroadcast` itself.
///
/// # Safety
/// As `ncclBroadcast`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclBroadcastConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclBroadcastConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning =
            unsafe { collconfig::read(config, Some(Op::Broadcast), "ncclBroadcastConfig")? };
        plain::broadcast(
            sendbuff, recvbuff, count, datatype, root, comm, stream, tuning,
        )
    })
}

/// `ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclReduce`
/// with `config` applied ([`collconfig`]); NULL: `ncclReduce` itself.
///
/// # Safety
/// As `ncclReduce`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclReduceConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning = unsafe { collconfig::read(config, Some(Op::Reduce), "ncclReduceConfig")? };
        plain::reduce(
            sendbuff, recvbuff, count, datatype, op, root, comm, stream, tuning,
        )
    })
}

/// `ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclAllGather`
/// with `config` applied ([`collconfig`]); NULL: `ncclAllGather` itself.
///
/// # Safety
/// As `ncclAllGather`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclAllGatherConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning =
            unsafe { collconfig::read(config, Some(Op::AllGather), "ncclAllGatherConfig")? };
        plain::all_gather(
            sendbuff, recvbuff, sendcount, datatype, comm, stream, tuning,
        )
    })
}

/// `ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclReduceScatter`
/// with `config` applied ([`collconfig`]); NULL: `ncclReduceScatter` itself.
///
/// # Safety
/// As `ncclReduceScatter`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduceScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclReduceScatterConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning = unsafe {
            collconfig::read(config, Some(Op::ReduceScatter), "ncclReduceScatterConfig")?
        };
        plain::reduce_scatter(
            sendbuff, recvbuff, recvcount, datatype, op, comm, stream, tuning,
        )
    })
}

/// `ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclAlltoAll`
/// with `config` applied ([`collconfig`]); NULL: `ncclAlltoAll` itself.
///
/// # Safety
/// As `ncclAlltoAll`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAlltoAllConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclAlltoAllConfig", || {
        // SAFETY: the caller's contract for `config`.
        let tuning = unsafe { collconfig::read(config, Some(Op::AllToAll), "ncclAlltoAllConfig")? };
        plain::all_to_all(sendbuff, recvbuff, count, datatype, comm, stream, tuning)
    })
}

/// `ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclGather`
/// with `config` applied ([`collconfig`]); NULL: `ncclGather` itself.
///
/// # Safety
/// As `ncclGather`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclGatherConfig", || {
        // SAFETY: the caller's contract for `config`. What it asks of the algorithm is only
        // logged: the call runs as one group of sends and receives, which has none to choose.
        let tuning = unsafe { collconfig::read(config, None, "ncclGatherConfig")? };
        // SAFETY: forwarded contract.
        unsafe {
            plain::rooted(
                plain::Rooted::Gather,
                sendbuff,
                recvbuff,
                count,
                datatype,
                root,
                comm,
                stream,
            )?
        };
        lookup(comm)?.record_launch(stream, tuning)
    })
}

/// `ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config)` (NCCL 2.31): `ncclScatter`
/// with `config` applied ([`collconfig`]); NULL: `ncclScatter` itself.
///
/// # Safety
/// As `ncclScatter`; `config` is NULL or an `ncclCollConfig_t` made with
/// `NCCL_COLLCONFIG_INITIALIZER` (its `size` bytes readable).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    config: *const NcclCollConfig,
) -> NcclResult {
    guard("ncclScatterConfig", || {
        // SAFETY: the caller's contract for `config`. What it asks of the algorithm is only
        // logged: the call runs as one group of sends and receives, which has none to choose.
        let tuning = unsafe { collconfig::read(config, None, "ncclScatterConfig")? };
        // SAFETY: forwarded contract.
        unsafe {
            plain::rooted(
                plain::Rooted::Scatter,
                sendbuff,
                recvbuff,
                count,
                datatype,
                root,
                comm,
                stream,
            )?
        };
        lookup(comm)?.record_launch(stream, tuning)
    })
}
