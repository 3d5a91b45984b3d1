//! Direct: plain 16-byte stores into the peers' scratch, pipelined in chunks with per-block
//! flags, the next chunk pushed while this one is consumed; every collective (all-reduce as
//! reduce-scatter then all-gather). The bandwidth path for large messages. Its kernels are in
//! `kernels/collectives/direct.cu` and, for the wide element types, `direct_wide.cu` (loaded at
//! their first call) ([`module`], shared with `read`), its host kernel in [`host`].
//!
#![doc = include_str!("spec.md")]

use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, LaunchConfig, Result};

pub(crate) mod args;
pub(crate) mod host;
pub(crate) mod module;

use args::DirectCollectiveArgs;

use super::base::{
    Algorithm, ByType, LazyKernel, Plan, block_threads, optional_kernel, resident_grid,
};
use super::id::AlgorithmId;
use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;
use crate::policy::Settings;
use crate::scratch::Scratch;

/// Calls whose larger buffer (per rank) holds at most this many bytes launch blocks of
/// [`SMALL_THREADS`] unless `MSCCLPP_DIRECT_THREADS` says otherwise: smaller blocks start
/// sooner, larger ones carry more bytes in flight (docs/performance.md). Only the blocks and
/// chunks must match across ranks, so the threads may differ per call.
const SMALL_BYTES: u64 = 8 << 20;
const SMALL_THREADS: u32 = 512;
/// Threads per block of larger calls, or as many as the kernel's register use allows.
const THREADS: u32 = 896;

#[derive(Debug)]
pub(crate) struct Direct<A: Api> {
    scratch: Scratch,
    slot_bytes: u64,
    max_blocks: u32,
    /// Threads per block of calls whose larger buffer exceeds [`SMALL_BYTES`], and up to it.
    threads: u32,
    small_threads: u32,
    /// The base types' kernel and the wide types' (loaded at their first call).
    kernels: ByType<DirectCollectiveArgs, A>,
}

impl<A: Api> Direct<A> {
    /// The scratch and kernel (`None` where the backend lacks the kernel); a collective call.
    pub fn setup(comm: &Communicator, settings: &Settings) -> Result<Option<Direct<A>>> {
        let info = comm.device().info().clone();
        let n = comm.nranks() as u32;
        const SETTINGS: &str = "direct algorithm settings";
        let Some(kernel) = optional_kernel(comm, &module::MODULE, module::DIRECT, SETTINGS)? else {
            return Ok(None);
        };
        let forced = settings.direct_threads;
        let threads = block_threads(&info, &**kernel.kernel(), forced, THREADS);
        let (max_blocks, threads) = resident_grid(&info, threads);
        let small_threads = match forced {
            Some(_) => threads,
            None => SMALL_THREADS.min(threads),
        };
        // More ranks get smaller slots, which keeps the scratch (6 slots per rank and block) at
        // 384 MiB.
        let slot_bytes = settings.direct_slot_bytes.unwrap_or(match n {
            5.. => 64 << 10,
            3..=4 => 128 << 10,
            _ => 256 << 10,
        });
        agree(
            comm,
            SETTINGS,
            format!(
                "{max_blocks} blocks of {threads} threads ({small_threads} up to {SMALL_BYTES} B of buffer), {slot_bytes} B slots"
            ),
        )?;
        let scratch = Scratch::exchange(
            comm,
            DirectCollectiveArgs::scratch_bytes(slot_bytes, n, max_blocks),
            "direct scratch",
        )?;
        Ok(Some(Direct {
            scratch,
            slot_bytes,
            max_blocks,
            threads,
            small_threads,
            kernels: ByType::new(
                kernel,
                LazyKernel::new(comm, &module::WIDE_MODULE, module::DIRECT_WIDE)?,
            ),
        }))
    }
}

impl<A: Api> Algorithm<A> for Direct<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Direct
    }

    fn fits(&self, _kind: CollectiveKind, _block_bytes: u64) -> bool {
        true
    }

    fn plan(&self, call: &Checked) -> Result<Plan> {
        let (blocks, chunk_bytes) = DirectCollectiveArgs::plan(
            call.kind(),
            call.block_bytes,
            call.nranks as u32,
            self.slot_bytes,
            self.max_blocks,
        );
        let threads = if call.buffer_bytes() <= SMALL_BYTES {
            self.small_threads
        } else {
            self.threads
        };
        let (_, threads) = self.kernels.with_threads(call.call.dtype, threads)?;
        Ok(Plan {
            config: LaunchConfig::linear(blocks, threads),
            chunk_bytes,
        })
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let c = call.call;
        let args = DirectCollectiveArgs {
            input: c.input.ptr().0,
            output: c.output.ptr().0,
            count: c.count as u64,
            scratch: self.scratch.addrs[call.rank],
            slot_bytes: self.slot_bytes,
            chunk_bytes: plan.chunk_bytes,
            peer_scratch: self.scratch.addrs,
            kind: c.kind as u32,
            dtype: c.dtype as u32,
            op: c.op as u32,
            rank: call.rank as u32,
            nranks: call.nranks as u32,
            root: c.root as u32,
            max_blocks: self.max_blocks,
            _pad: 0,
            abort: mscclpp_hal::dev::current_abort(),
        };
        let cfg = plan.config;
        tracing::trace!(collective = c.kind.name(), count = c.count, dtype = %c.dtype, op = %c.op, ?cfg, chunk = plan.chunk_bytes, "launch direct");
        let (kernel, _) = self.kernels.with_threads(c.dtype, cfg.block[0])?;
        // SAFETY: the caller's checked slices (kept alive until the stream passes the call) and
        // the direct scratch mappings held in `self`.
        unsafe { kernel.launch(stream, cfg, &args) }
    }
}
