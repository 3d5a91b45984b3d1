//! Collectives and point-to-point.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::collconfig::Tuning;
use crate::error::{Failure, Res, guard};
use crate::registry::{lookup, lookup_for_op};
use crate::route::{Call, Op};
use crate::types;

use crate::group;

fn run(op: Op, comm: NcclComm, call: impl FnOnce(Op) -> Call) -> Res<()> {
    lookup_for_op(comm)?.run(call(op))
}

// The bodies of the collectives, shared by the plain exports (no per-call configuration) and
// their `nccl*Config` variants (`exports_232`), which pass what the call's `ncclCollConfig_t`
// asks for.

/// `ncclAllReduce`'s body.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::AllReduce, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count,
        dtype: datatype,
        redop: op,
        root: 0,
        stream,
        tuning,
    })
}

/// `ncclAllGather`'s body.
pub(crate) fn all_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::AllGather, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count: sendcount,
        dtype: datatype,
        redop: 0,
        root: 0,
        stream,
        tuning,
    })
}

/// `ncclReduceScatter`'s body.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::ReduceScatter, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count: recvcount,
        dtype: datatype,
        redop: op,
        root: 0,
        stream,
        tuning,
    })
}

/// `ncclBroadcast`'s body (and `ncclBcast`'s, with `sendbuff == recvbuff`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn broadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::Broadcast, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count,
        dtype: datatype,
        redop: 0,
        root,
        stream,
        tuning,
    })
}

/// `ncclAlltoAll`'s body.
pub(crate) fn all_to_all(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::AllToAll, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count,
        dtype: datatype,
        redop: 0,
        root: 0,
        stream,
        tuning,
    })
}

/// `ncclReduce`'s body.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CudaStream,
    tuning: Tuning,
) -> Res<()> {
    run(Op::Reduce, comm, |o| Call {
        op: o,
        send: sendbuff,
        recv: recvbuff,
        count,
        dtype: datatype,
        redop: op,
        root,
        stream,
        tuning,
    })
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
        all_reduce(
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            comm,
            stream,
            Tuning::default(),
        )
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
        all_gather(
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            comm,
            stream,
            Tuning::default(),
        )
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
        reduce_scatter(
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
            comm,
            stream,
            Tuning::default(),
        )
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
        broadcast(
            sendbuff,
            recvbuff,
            count,
            datatype,
            root,
            comm,
            stream,
            Tuning::default(),
        )
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
        broadcast(
            buff,
            buff,
            count,
            datatype,
            root,
            comm,
            stream,
            Tuning::default(),
        )
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
        all_to_all(
            sendbuff,
            recvbuff,
            count,
            datatype,
            comm,
            stream,
            Tuning::default(),
        )
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
        reduce(
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            root,
            comm,
            stream,
            Tuning::default(),
        )
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
            tuning: Tuning::default(),
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
            tuning: Tuning::default(),
        })
    })
}

/// Which of NCCL 2.28's rooted data movements [`rooted`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rooted {
    /// Every rank's `count` elements land in block `rank` of the root's `recvbuff`.
    Gather,
    /// Block `rank` of the root's `sendbuff` lands in every rank's `recvbuff`.
    Scatter,
}

/// NCCL 2.28's `ncclGather` / `ncclScatter` as one group of sends and receives on the p2p path
/// (called directly, not through our exported `ncclSend`/`ncclRecv`): the root exchanges with
/// every rank (itself included: a stream copy), every other rank with the root.
/// A client built against NCCL 2.28's header calls these symbols directly, so leaving them out
/// would hand our communicator to the real NCCL.
///
/// # Safety
/// As for [`ncclAllReduce`]: device buffers of the communicator's device, of `count` elements
/// (the root's `recvbuff` / `sendbuff`: `nranks * count`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rooted(
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
    let send = |buf: *const c_void, peer: usize| {
        run(Op::Send, comm, |o| Call {
            op: o,
            send: buf,
            recv: std::ptr::null_mut(),
            count,
            dtype: datatype,
            redop: 0,
            root: peer as c_int,
            stream,
            tuning: Tuning::default(),
        })
    };
    let recv = |buf: *mut c_void, peer: usize| {
        run(Op::Recv, comm, |o| Call {
            op: o,
            send: std::ptr::null(),
            recv: buf,
            count,
            dtype: datatype,
            redop: 0,
            root: peer as c_int,
            stream,
            tuning: Tuning::default(),
        })
    };
    group::group_start()?;
    // Should a send or receive panic (the export's guard catches it), the group still ends:
    // otherwise this thread's later calls would queue in it and never run.
    struct EndOnUnwind;
    impl Drop for EndOnUnwind {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = group::group_end();
            }
        }
    }
    let _end_on_unwind = EndOnUnwind;
    let mut result = Ok(());
    for peer in 0..n {
        if rank != root_rank && peer != root_rank {
            continue;
        }
        // The root's block of `peer`, offset within its nranks * count elements (the caller's
        // contract); the pointer is only formed here, the device reads or writes it.
        let at = |base: *const c_void| {
            base.cast::<u8>()
                .wrapping_add(peer * block)
                .cast::<c_void>()
        };
        let r = match (what, rank == root_rank) {
            (Rooted::Gather, true) => recv(at(recvbuff).cast_mut(), peer).and_then(|()| {
                if peer == rank {
                    send(sendbuff, peer)
                } else {
                    Ok(())
                }
            }),
            (Rooted::Gather, false) => send(sendbuff, peer),
            (Rooted::Scatter, true) => send(at(sendbuff), peer).and_then(|()| {
                if peer == rank {
                    recv(recvbuff, peer)
                } else {
                    Ok(())
                }
            }),
            (Rooted::Scatter, false) => recv(recvbuff, peer),
        };
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    // The group is closed whatever happened inside it, so the thread's group state stays sane.
    let end = group::group_end();
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
