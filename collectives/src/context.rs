//! A communicator's collectives: scratch buffers mapped by every peer, the flag counter, the
//! kernel, and argument checking.

use std::sync::Arc;

use mscclpp_comm::Communicator;
use mscclpp_hal::collective::MAX_RANKS;
use mscclpp_hal::{
    BufferSlice, CollectiveKind, DataType, DeviceBuffer, Error, Kernel, KernelArgs, KernelId,
    LaunchConfig, LlCollectiveArgs, MemoryKind, ReduceOp, Result, Stream,
};
use mscclpp_transports::{RegisteredMemory, Transport, TransportFlags};

/// Packet bytes of one scratch slot: 1 MiB of packets carries 512 KiB of data per peer per round.
pub const DEFAULT_SLOT_BYTES: u64 = 1 << 20;

/// The collectives of one communicator (all ranks create it together).
#[derive(Debug)]
pub struct Collectives {
    comm: Arc<Communicator>,
    _scratch: DeviceBuffer,
    flag: DeviceBuffer,
    _peers: Vec<RegisteredMemory>,
    peer_scratch: [u64; MAX_RANKS],
    slot_bytes: u64,
    kernel: Arc<dyn Kernel>,
}

impl Collectives {
    /// Sets up the collectives of `comm` (a collective call: every rank makes it).
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        Self::with_slot_bytes(comm, DEFAULT_SLOT_BYTES)
    }

    /// As [`Collectives::new`] with a chosen slot size (tests use small slots to exercise
    /// messages that take many rounds).
    pub fn with_slot_bytes(comm: Arc<Communicator>, slot_bytes: u64) -> Result<Self> {
        let (rank, n) = (comm.rank(), comm.nranks());
        if !(2..=MAX_RANKS).contains(&n) {
            return Err(Error::invalid(format!(
                "collectives serve 2 to {MAX_RANKS} ranks of one node; this communicator has {n}"
            )));
        }
        if slot_bytes < 16 || slot_bytes % 16 != 0 {
            return Err(Error::invalid(format!(
                "slot of {slot_bytes} bytes: a positive multiple of 16 is needed"
            )));
        }
        let device = comm.device().clone();
        let bytes = usize::try_from(LlCollectiveArgs::scratch_bytes(slot_bytes))
            .map_err(|_| Error::invalid("scratch does not fit this host"))?;
        let scratch = device.alloc(bytes, MemoryKind::Device)?;
        let flag = device.alloc(8, MemoryKind::Device)?;
        let stream = device.create_stream()?;
        // Zeroed before anyone can see it: packets with flag 0 never match.
        stream.fill(&scratch.full(), 0)?;
        stream.fill(&flag.full(), 0)?;
        stream.synchronize()?;
        let mine =
            comm.register_memory(&scratch.full(), TransportFlags::single(Transport::CudaIpc))?;
        let mut peer_scratch = [0u64; MAX_RANKS];
        peer_scratch[rank] = scratch.ptr().0;
        let mut peers = Vec::with_capacity(n - 1);
        for p in (0..n).filter(|&p| p != rank) {
            let theirs = comm.exchange_memory(&mine, p)?;
            let mapped = theirs.mapped_slice().ok_or_else(|| {
                Error::invalid(format!(
                    "rank {p}'s scratch is not mapped on rank {rank}: collectives need every rank on one host (CudaIpc)"
                ))
            })?;
            if mapped.len() != bytes {
                return Err(Error::Remote {
                    rank: p,
                    message: format!("scratch of {} bytes, expected {bytes}", mapped.len()),
                });
            }
            peer_scratch[p] = mapped.ptr().0;
            peers.push(theirs);
        }
        let kernel = device.load_kernel(KernelId::COLLECTIVE_LL)?;
        // Nobody writes into a peer's scratch before that peer has zeroed it.
        comm.bootstrap().barrier()?;
        tracing::debug!(rank, nranks = n, slot_bytes, "collectives ready");
        Ok(Collectives {
            comm,
            _scratch: scratch,
            flag,
            _peers: peers,
            peer_scratch,
            slot_bytes,
            kernel,
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// `output = reduce(op, input of every rank)`; `count` elements each. In place when both
    /// slices are the same memory.
    pub fn all_reduce(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllReduce,
            input,
            output,
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// `output` (`nranks * count` elements) = every rank's `input` (`count`), by rank.
    pub fn all_gather(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllGather,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            0,
            stream,
        )
    }

    /// `output` (`count`) = reduction over ranks of block `rank` of `input` (`nranks * count`).
    pub fn reduce_scatter(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::ReduceScatter,
            input,
            output,
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// `output` = `input` of `root` (`count` elements; only the root's input is read).
    pub fn broadcast(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::Broadcast,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            root,
            stream,
        )
    }

    /// Block `p` of `output` = block `rank` of rank `p`'s `input` (`nranks * count` each).
    pub fn all_to_all(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllToAll,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            0,
            stream,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        kind: CollectiveKind,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &dyn Stream,
    ) -> Result<()> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        if root >= n {
            return Err(Error::invalid(format!(
                "{}: root {root} is not a rank of {n}",
                kind.name()
            )));
        }
        let (in_elems, out_elems) = kind.buffer_elements(count as u64, n as u64);
        let need = |elems: u64| {
            elems
                .checked_mul(dtype.size() as u64)
                .filter(|b| *b <= isize::MAX as u64)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{}: count {count} of {dtype} overflows",
                        kind.name()
                    ))
                })
        };
        let (in_bytes, out_bytes) = (need(in_elems)?, need(out_elems)?);
        for (what, s, bytes) in [("input", input, in_bytes), ("output", output, out_bytes)] {
            if (s.len() as u64) < bytes {
                return Err(Error::invalid(format!(
                    "{}: {what} of {} bytes is too small for {count} {dtype} elements ({bytes} bytes needed on {n} ranks)",
                    kind.name(),
                    s.len()
                )));
            }
            if s.buffer().backend() != self.comm.device().info().backend {
                return Err(Error::invalid(format!(
                    "{}: {what} belongs to the {} backend, the communicator to {}",
                    kind.name(),
                    s.buffer().backend(),
                    self.comm.device().info().backend
                )));
            }
        }
        let (i0, o0) = (input.ptr().0, output.ptr().0);
        let overlap = i0 < o0 + out_bytes && o0 < i0 + in_bytes;
        if overlap {
            let ok = match kind {
                CollectiveKind::AllReduce | CollectiveKind::Broadcast => i0 == o0,
                CollectiveKind::AllGather => i0 == o0 + rank as u64 * in_bytes,
                CollectiveKind::ReduceScatter => o0 == i0 + rank as u64 * out_bytes,
                CollectiveKind::AllToAll => false,
            };
            if !ok {
                return Err(Error::invalid(format!(
                    "{}: input and output overlap in a way the collective does not support (in place means: {})",
                    kind.name(),
                    match kind {
                        CollectiveKind::AllReduce | CollectiveKind::Broadcast => "the same buffer",
                        CollectiveKind::AllGather => "input = output block `rank`",
                        CollectiveKind::ReduceScatter => "output = input block `rank`",
                        CollectiveKind::AllToAll => "not supported for all-to-all",
                    }
                )));
            }
        }
        let args = LlCollectiveArgs {
            input: i0,
            output: o0,
            count: count as u64,
            flag: self.flag.ptr().0,
            scratch: self.peer_scratch[rank],
            slot_bytes: self.slot_bytes,
            peer_scratch: self.peer_scratch,
            kind: kind as u32,
            dtype: dtype as u32,
            op: op as u32,
            rank: rank as u32,
            nranks: n as u32,
            root: root as u32,
        };
        let cfg = self.grid(in_bytes.max(out_bytes));
        tracing::trace!(collective = kind.name(), count, %dtype, %op, ?cfg, "launch");
        // SAFETY: the addresses are the caller's checked slices (kept alive by the caller until
        // the stream passes the call, as for every stream operation), this communicator's scratch
        // and flag, and the peers' scratch mappings held in `self`.
        unsafe { stream.launch_raw(&*self.kernel, cfg, args.as_bytes()) }
    }

    fn grid(&self, bytes: u64) -> LaunchConfig {
        let info = self.comm.device().info();
        if info.warp_size == 1 {
            return LaunchConfig::linear(1, 1);
        }
        // One packet (8 data bytes) per thread per peer, up to one block per SM.
        let threads = 512u32.min(info.max_threads_per_block);
        let packets = bytes.div_ceil(8).min(self.slot_bytes / 16);
        let blocks = packets
            .div_ceil(u64::from(threads))
            .clamp(1, u64::from(info.multiprocessors.max(1)));
        LaunchConfig::linear(blocks as u32, threads)
    }
}
