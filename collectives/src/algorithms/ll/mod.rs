//! LL packets: every rank writes 16-byte packets (8 data bytes and a flag) into its slot of each
//! peer's scratch, and the peers poll for the flag; no separate signalling. Every collective at
//! every size, in rounds of one slot. The scratch and flag counter here serve the short LL
//! kernels and LL128 too, as do the modules of `kernels/collectives/ll.cu` and `ll_wide.cu`
//! ([`module`]).
//!
#![doc = include_str!("spec.md")]

use std::sync::Arc;

use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, DeviceBuffer, KernelId, LaunchConfig, MemoryKind, Result, TypedKernel};

pub(crate) mod args;
pub(crate) mod host;
pub(crate) mod module;

pub(crate) use args::{LL_STATE_BYTES, LlCollectiveArgs};

use super::base::{Algorithm, BASE_TYPES, ByType, LazyKernel, Plan, load};
use super::id::AlgorithmId;
use crate::CollectiveKind;
use crate::call::Checked;
use crate::scratch::Scratch;

/// The LL scratch (slots of every peer, with LL128 halves where LL128 runs), the flag counter
/// the kernels advance, and the slot size.
#[derive(Debug)]
pub(crate) struct LlScratch {
    scratch: Scratch,
    flag: DeviceBuffer,
    slot_bytes: u64,
    round_bytes: u64,
}

impl LlScratch {
    /// Allocates and maps the scratch and zeroes the flag counter (a collective call).
    pub fn new(comm: &Communicator, slot_bytes: u64, ll128: bool) -> Result<Arc<LlScratch>> {
        let scratch = Scratch::exchange(
            comm,
            LlCollectiveArgs::scratch_bytes(slot_bytes, ll128),
            "LL scratch",
        )?;
        let device = comm.device();
        let flag = device.alloc(LL_STATE_BYTES, MemoryKind::Device)?;
        let stream = device.create_stream()?;
        stream.fill(&flag.full(), 0)?;
        stream.synchronize()?;
        let mut shared = LlScratch {
            scratch,
            flag,
            slot_bytes,
            round_bytes: 0,
        };
        shared.round_bytes = shared.template(comm.rank(), comm.nranks()).round_bytes();
        Ok(Arc::new(shared))
    }

    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Data bytes one LL round moves per peer.
    pub fn round_bytes(&self) -> u64 {
        self.round_bytes
    }

    fn template(&self, rank: usize, nranks: usize) -> LlCollectiveArgs {
        LlCollectiveArgs {
            input: 0,
            output: 0,
            count: 0,
            flag: self.flag.ptr().0,
            scratch: self.scratch.addrs[rank],
            slot_bytes: self.slot_bytes,
            peer_scratch: self.scratch.addrs,
            kind: 0,
            dtype: 0,
            op: 0,
            rank: rank as u32,
            nranks: nranks as u32,
            root: 0,
            abort: mscclpp_hal::dev::current_abort(),
        }
    }

    /// The arguments of every LL kernel (general, short, LL128) for `call`.
    pub fn args(&self, call: &Checked) -> LlCollectiveArgs {
        let c = call.call;
        LlCollectiveArgs {
            input: c.input.ptr().0,
            output: c.output.ptr().0,
            count: c.count as u64,
            kind: c.kind as u32,
            dtype: c.dtype as u32,
            op: c.op as u32,
            root: c.root as u32,
            ..self.template(call.rank, call.nranks)
        }
    }

    /// Launches `kernel` with the LL arguments of `call`.
    ///
    /// # Safety
    ///
    /// As [`Algorithm::launch`].
    pub unsafe fn launch<A: Api>(
        &self,
        kernel: &TypedKernel<LlCollectiveArgs, A>,
        call: &Checked,
        cfg: LaunchConfig,
        stream: &A::Stream,
    ) -> Result<()> {
        let args = self.args(call);
        let c = call.call;
        tracing::trace!(collective = c.kind.name(), count = c.count, dtype = %c.dtype, op = %c.op, ?cfg, kernel = %kernel.id(), "launch");
        // SAFETY: the addresses are the caller's checked slices (kept alive by the caller until
        // the stream passes the call), this communicator's scratch and flag, and the peers'
        // scratch mappings, all held in `self`.
        unsafe { kernel.launch(stream, cfg, &args) }
    }
}

/// How LL kernels size their grids on this device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LlGrid {
    pub slot_bytes: u64,
    pub packets_per_block: u64,
    /// `MSCCLPP_LL_THREADS`, when given: the grid keeps that block size.
    pub threads: Option<u32>,
    pub multiprocessors: u32,
    pub max_threads_per_block: u32,
    /// The host: one worker runs any grid.
    pub host: bool,
}

impl LlGrid {
    /// The grid for a call whose larger buffer (or rank block, for the short kernels) holds
    /// `bytes`.
    pub fn config(&self, bytes: u64) -> LaunchConfig {
        if self.host {
            return LaunchConfig::linear(1, 1);
        }
        ll_grid(
            bytes,
            self.slot_bytes,
            self.packets_per_block,
            self.threads,
            self.multiprocessors,
            self.max_threads_per_block,
        )
    }
}

/// The LL grid of a GPU for a call whose larger buffer holds `bytes`: one block per
/// `packets_per_block` packets of a round, up to one block per SM (the blocks of a multi-round
/// call meet at grid barriers, so all must be resident); when that leaves a thread more than one
/// packet, larger blocks (up to the device's limit), since a thread's packets are sent and
/// awaited one after the other. A block has as many threads as packets (whole warps): padding
/// small calls to a fixed block size costs latency. `ll_threads` (`MSCCLPP_LL_THREADS`) forces
/// the block size.
pub(crate) fn ll_grid(
    bytes: u64,
    slot_bytes: u64,
    packets_per_block: u64,
    ll_threads: Option<u32>,
    multiprocessors: u32,
    max_threads_per_block: u32,
) -> LaunchConfig {
    let max_threads = max_threads_per_block.clamp(32, 1024);
    let packets = bytes.div_ceil(8).min(slot_bytes / 16);
    let blocks = packets
        .div_ceil(packets_per_block.max(1))
        .clamp(1, u64::from(multiprocessors.max(1)));
    let threads = match ll_threads {
        Some(t) => t.min(max_threads),
        None => {
            let per_block = packets.div_ceil(blocks).next_multiple_of(32);
            per_block.clamp(32, u64::from(max_threads)) as u32
        }
    };
    LaunchConfig::linear(blocks as u32, threads)
}

/// The general LL kernels: one copying every collective (per module), and one per element type
/// and operator reducing.
#[derive(Debug)]
pub(crate) struct Ll<A: Api> {
    shared: Arc<LlScratch>,
    grid: LlGrid,
    copy: ByType<LlCollectiveArgs, A>,
    reduce: ByTypeAndOp<A>,
}

impl<A: Api> Ll<A> {
    pub fn new(comm: &Communicator, shared: Arc<LlScratch>, grid: LlGrid) -> Result<Ll<A>> {
        Ok(Ll {
            copy: ByType::load(
                comm,
                (&module::MODULE, module::COPY),
                (&module::WIDE_MODULE, module::COPY_WIDE),
            )?,
            reduce: load_all(comm, &module::REDUCE)?,
            shared,
            grid,
        })
    }
}

/// The kernels of one reducing family by element type and operator, in `dtype * 5 + op` order:
/// the base types' loaded at set-up, the wide types' at their first call. (The LL grids keep
/// within the device's limit, which every LL kernel reaches: 64 registers at most.)
#[derive(Debug)]
pub(crate) struct ByTypeAndOp<A: Api> {
    base: Vec<TypedKernel<LlCollectiveArgs, A>>,
    wide: Vec<LazyKernel<LlCollectiveArgs, A>>,
}

impl<A: Api> ByTypeAndOp<A> {
    /// The kernel of `call`'s element type and operator.
    pub fn get(&self, call: &Checked) -> Result<&TypedKernel<LlCollectiveArgs, A>> {
        let i = call.reduce_index();
        match i.checked_sub(self.base.len()) {
            None => Ok(&self.base[i]),
            Some(w) => {
                let lazy = self.wide.get(w).ok_or_else(|| {
                    mscclpp_hal::Error::Internal(format!("no LL kernel for reduce index {i}"))
                })?;
                Ok(lazy.get()?.0)
            }
        }
    }
}

/// The kernels of the LL modules by element type and operator (see [`ByTypeAndOp`]).
pub(crate) fn load_all<A: Api>(
    comm: &Communicator,
    ids: &[[KernelId; 5]; module::NTYPES],
) -> Result<ByTypeAndOp<A>> {
    let (base, wide) = ids.split_at(BASE_TYPES);
    Ok(ByTypeAndOp {
        base: base
            .iter()
            .flatten()
            .map(|&id| load(comm, &module::MODULE, id))
            .collect::<Result<_>>()?,
        wide: wide
            .iter()
            .flatten()
            .map(|&id| LazyKernel::new(comm, &module::WIDE_MODULE, id))
            .collect::<Result<_>>()?,
    })
}

impl<A: Api> Algorithm<A> for Ll<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Ll
    }

    fn fits(&self, _kind: CollectiveKind, _block_bytes: u64) -> bool {
        true
    }

    fn plan(&self, call: &Checked) -> Result<Plan> {
        Ok(Plan::grid(self.grid.config(call.buffer_bytes())))
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let kernel = if call.kind().reduces() {
            self.reduce.get(call)?
        } else {
            self.copy.get(call.call.dtype)?
        };
        // SAFETY: the caller's contract.
        unsafe { self.shared.launch(kernel, call, plan.config, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200: 132 SMs, 1024 threads per block.
    fn h200(bytes: u64) -> LaunchConfig {
        ll_grid(bytes, crate::DEFAULT_SLOT_BYTES, 256, None, 132, 1024)
    }

    #[test]
    fn the_1_kib_grid_is_one_block_of_its_packets() {
        assert_eq!(h200(1024), LaunchConfig::linear(1, 128));
        assert_eq!(h200(64 << 10), LaunchConfig::linear(32, 256));
    }

    #[test]
    fn a_multi_round_grid_stays_resident() {
        let cfg = h200(64 << 20);
        assert_eq!(cfg.grid[0], 132);
        assert!(cfg.block[0] <= 1024 && cfg.block[0] % 32 == 0);
    }
}
