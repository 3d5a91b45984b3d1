//! NCCL as the baseline measured in the same run on the same buffers and stream (`--baseline
//! nccl`), through the binding shared with the C library (`mscclpp-nccl-real`).

use std::ffi::{c_int, c_void};

use mscclpp::collectives::CollectiveKind;
use mscclpp::comm::Communicator;
use mscclpp::hal::{DataType, Error, ReduceOp, Result, Stream};
use mscclpp_nccl_real::{Comm, RealNccl, UniqueId};

/// The NCCL library and one communicator.
#[derive(Debug)]
pub struct Nccl {
    lib: RealNccl,
    comm: Comm,
    /// Version string for the table.
    pub version: String,
}

fn dtype_code(d: DataType) -> c_int {
    match d {
        DataType::F32 => 7,
        DataType::F16 => 6,
        DataType::BF16 => 9,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::F64 => 8,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::F8E4M3 => 10,
        DataType::F8E5M2 => 11,
    }
}

fn op_code(o: ReduceOp) -> c_int {
    match o {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

impl Nccl {
    /// Opens `MSCCLPP_NCCL_LIB_PATH` or `libnccl.so.2`; `share` distributes rank 0's id (the
    /// caller's bootstrap broadcast).
    pub fn open(
        rank: usize,
        nranks: usize,
        share: impl FnOnce(Option<[u8; 128]>) -> Result<[u8; 128]>,
    ) -> Result<Nccl> {
        let path =
            mscclpp_nccl_real::env_path().unwrap_or_else(|| mscclpp_nccl_real::DEFAULT_LIB.into());
        let lib = RealNccl::open(&path, "NCCL baseline")?;
        let get_id = lib.entry(lib.get_unique_id, "ncclGetUniqueId")?;
        let init = lib.entry(lib.comm_init_rank, "ncclCommInitRank")?;
        lib.entry(lib.comm_destroy, "ncclCommDestroy")?;
        let id = if rank == 0 {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: a valid out-pointer to a 128-byte struct.
            lib.result("ncclGetUniqueId", unsafe { get_id(&mut id) })?;
            share(Some(id.internal))?
        } else {
            share(None)?
        };
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id came from rank 0's ncclGetUniqueId.
        let r = unsafe {
            init(
                &mut comm,
                nranks as c_int,
                UniqueId { internal: id },
                rank as c_int,
            )
        };
        lib.result("ncclCommInitRank", r)?;
        Ok(Nccl {
            version: lib.version_string(),
            lib,
            comm,
        })
    }

    /// Opens NCCL for the ranks of `comm`, to run on `stream`: rank 0's id goes to the others
    /// through the bootstrap. A backend without a vendor stream (the host) is refused.
    pub fn for_communicator(comm: &Communicator, stream: &dyn Stream) -> Result<Nccl> {
        let device = comm.device();
        if stream.native_handle().is_none() {
            return Err(Error::unavailable(
                "--baseline nccl",
                format!(
                    "the {} backend has no vendor stream to run NCCL on",
                    device.info().backend
                ),
            ));
        }
        device.make_current()?;
        let boot = comm.bootstrap().clone();
        Nccl::open(comm.rank(), comm.nranks(), move |id| {
            let bytes = boot.broadcast(0, id.as_ref().map_or(&[][..], |b| &b[..]))?;
            bytes
                .try_into()
                .map_err(|_| Error::malformed("NCCL unique id", "not 128 bytes"))
        })
    }

    /// Enqueues one collective on `stream` (a `CUstream`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        kind: CollectiveKind,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        let (i, o, s) = (
            input as *const c_void,
            output as *mut c_void,
            stream as *mut c_void,
        );
        let (d, p, c, l) = (dtype_code(dtype), op_code(op), self.comm, &self.lib);
        let (call, r) = match kind {
            CollectiveKind::AllReduce => {
                let f = l.entry(l.all_reduce, "ncclAllReduce")?;
                // SAFETY: the buffers are device allocations of the sizes the collective needs
                // (the same ones our collectives use) and `stream` is a live CUstream.
                ("ncclAllReduce", unsafe { f(i, o, count, d, p, c, s) })
            }
            CollectiveKind::AllGather => {
                let f = l.entry(l.all_gather, "ncclAllGather")?;
                // SAFETY: as above.
                ("ncclAllGather", unsafe { f(i, o, count, d, c, s) })
            }
            CollectiveKind::ReduceScatter => {
                let f = l.entry(l.reduce_scatter, "ncclReduceScatter")?;
                // SAFETY: as above.
                ("ncclReduceScatter", unsafe { f(i, o, count, d, p, c, s) })
            }
            CollectiveKind::Broadcast => {
                let f = l.entry(l.broadcast, "ncclBroadcast")?;
                // SAFETY: as above.
                ("ncclBroadcast", unsafe {
                    f(i, o, count, d, root as c_int, c, s)
                })
            }
            CollectiveKind::AllToAll => {
                // NCCL 2.28 names it ncclAlltoAll; older versions lack it.
                let f = l.entry(l.all_to_all, "ncclAlltoAll")?;
                // SAFETY: as above.
                ("ncclAlltoAll", unsafe { f(i, o, count, d, c, s) })
            }
        };
        l.result(call, r)
    }
}

/// One peer's part of an all-to-all-v: `bytes` from `at` (relative to the call's buffer).
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub at: u64,
    pub bytes: usize,
}

impl Nccl {
    /// Enqueues an all-to-all-v of bytes on `stream`, as PyTorch's `all_to_all_single` with
    /// split sizes does it: one group of a send and a receive per peer (this rank's own part a
    /// send to itself).
    pub fn all_to_all_v(
        &self,
        send: u64,
        sends: &[Part],
        recv: u64,
        recvs: &[Part],
        stream: u64,
    ) -> Result<()> {
        let l = &self.lib;
        let (start, end) = (
            l.entry(l.group_start, "ncclGroupStart")?,
            l.entry(l.group_end, "ncclGroupEnd")?,
        );
        let (snd, rcv) = (l.entry(l.send, "ncclSend")?, l.entry(l.recv, "ncclRecv")?);
        const UINT8: c_int = 1;
        let s = stream as *mut c_void;
        // SAFETY: no arguments.
        l.result("ncclGroupStart", unsafe { start() })?;
        let mut first_err = Ok(());
        for (peer, (o, i)) in sends.iter().zip(recvs).enumerate() {
            // SAFETY: each part lies inside the caller's device buffer; `stream` is live.
            let r = unsafe {
                snd(
                    (send + o.at) as *const c_void,
                    o.bytes,
                    UINT8,
                    peer as c_int,
                    self.comm,
                    s,
                )
            };
            first_err = first_err.and(l.result("ncclSend", r));
            // SAFETY: as above; the receive parts do not overlap.
            let r = unsafe {
                rcv(
                    (recv + i.at) as *mut c_void,
                    i.bytes,
                    UINT8,
                    peer as c_int,
                    self.comm,
                    s,
                )
            };
            first_err = first_err.and(l.result("ncclRecv", r));
        }
        // The group is closed whatever happened inside it.
        // SAFETY: no arguments.
        let closed = l.result("ncclGroupEnd", unsafe { end() });
        first_err.and(closed)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if let Some(destroy) = self.lib.comm_destroy {
            // SAFETY: the communicator was created by ncclCommInitRank and is destroyed once.
            unsafe { destroy(self.comm) };
        }
    }
}
