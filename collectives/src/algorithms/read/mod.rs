//! Read (all-reduce): every rank reads the peers' inputs where they lie and reduces locally — in
//! place in buffers registered with [`crate::Collectives::register`] (mapped once, at
//! registration), else from a staging copy. Ranks may differ in whether their input is
//! registered: each tells the others in the call. Never chosen by size (it did not beat LL or
//! direct at any size measured, docs/performance.md); it serves when forced. Its kernel is in
//! `kernels/collectives/direct.cu` (the module of `direct/module.rs`), its host kernel in
//! [`host`].
//!
#![doc = include_str!("spec.md")]

use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, BufferSlice, Error, LaunchConfig, Result};

pub(crate) mod args;
pub(crate) mod host;

use args::ReadCollectiveArgs;

use super::base::{
    Algorithm, ByType, LazyKernel, MAX_RANKS, Plan, block_threads, optional_kernel, resident_grid,
};
use super::direct::module::{MODULE, READ_ALLREDUCE, READ_ALLREDUCE_WIDE, WIDE_MODULE};
use super::id::AlgorithmId;
use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;
use crate::policy::Settings;
use crate::scratch::Scratch;
use crate::window::{Window, Windows};

/// Bytes per rank the staging area holds: the largest call served.
const STAGING_BYTES: u64 = 4 << 20;
/// Threads per block: a 1 MiB all-reduce is one 16-byte unit per thread on 128 blocks.
const THREADS: u32 = 512;

#[derive(Debug)]
pub(crate) struct Read<A: Api> {
    scratch: Scratch,
    windows: Windows,
    max_blocks: u32,
    threads: u32,
    /// The base types' kernel and the wide types' (loaded at their first call).
    kernels: ByType<ReadCollectiveArgs, A>,
}

impl<A: Api> Read<A> {
    /// The scratch, window table and kernel (`None` where the backend lacks the kernel); a
    /// collective call.
    pub fn setup(comm: &Communicator, settings: &Settings) -> Result<Option<Read<A>>> {
        let info = comm.device().info().clone();
        const SETTINGS: &str = "read algorithm settings";
        let Some(kernel) = optional_kernel(comm, &MODULE, READ_ALLREDUCE, SETTINGS)? else {
            return Ok(None);
        };
        let threads = block_threads(&info, &**kernel.kernel(), settings.read_threads, THREADS);
        let (max_blocks, threads) = resident_grid(&info, threads);
        agree(
            comm,
            SETTINGS,
            format!("{max_blocks} blocks of {threads} threads, {STAGING_BYTES} B staging"),
        )?;
        let scratch = Scratch::exchange(
            comm,
            ReadCollectiveArgs::scratch_bytes(STAGING_BYTES, max_blocks),
            "read scratch",
        )?;
        // Window 0: every rank's staging area.
        let staging = ReadCollectiveArgs::staging_offset(max_blocks);
        let mut bases = [0u64; MAX_RANKS];
        let mut lens = [0u64; MAX_RANKS];
        for p in 0..comm.nranks() {
            bases[p] = scratch.addrs[p] + staging;
            lens[p] = STAGING_BYTES;
        }
        let windows = Windows::new(comm, &bases, &lens)?;
        Ok(Some(Read {
            scratch,
            windows,
            max_blocks,
            threads,
            kernels: ByType::new(
                kernel,
                LazyKernel::new(comm, &WIDE_MODULE, READ_ALLREDUCE_WIDE)?,
            ),
        }))
    }

    /// Blocks of a call of `bytes` per rank, `None` when the staging area or the grid cannot
    /// hold it (the host's one worker holds what the staging area does).
    fn blocks(&self, bytes: u64, threads: u32) -> Option<u32> {
        if bytes > STAGING_BYTES {
            None
        } else if threads == 1 {
            Some(1)
        } else {
            ReadCollectiveArgs::grid(bytes, threads, self.max_blocks)
        }
    }

    pub fn register(
        &self,
        comm: &Communicator,
        slice: &BufferSlice,
        mapped: Option<&[(u64, u64)]>,
    ) -> Result<Window> {
        self.windows.register(comm, slice, mapped)
    }

    pub fn deregister(&self, comm: &Communicator, window: Window) -> Result<()> {
        self.windows.deregister(comm, window)
    }

    /// Whether `[ptr, ptr + bytes)` lies in a registered window here.
    pub fn holds(&self, ptr: u64, bytes: u64) -> bool {
        self.windows.key_of(ptr, bytes) != 0
    }
}

impl<A: Api> Algorithm<A> for Read<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Read
    }

    fn fits(&self, kind: CollectiveKind, block_bytes: u64) -> bool {
        kind == CollectiveKind::AllReduce && self.blocks(block_bytes, self.threads).is_some()
    }

    fn plan(&self, call: &Checked) -> Result<Plan> {
        let (_, threads) = self.kernels.with_threads(call.call.dtype, self.threads)?;
        let blocks = self.blocks(call.block_bytes, threads).ok_or_else(|| {
            Error::invalid(format!(
                "allreduce: {} bytes exceed what the read algorithm holds ({STAGING_BYTES} B, \
                 {threads} threads per block)",
                call.block_bytes
            ))
        })?;
        Ok(Plan::grid(LaunchConfig::linear(blocks, threads)))
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let c = call.call;
        let input = c.input.ptr().0;
        let args = ReadCollectiveArgs {
            input,
            output: c.output.ptr().0,
            count: c.count as u64,
            scratch: self.scratch.addrs[call.rank],
            table: self.windows.table(),
            in_key: self.windows.key_of(input, call.in_bytes),
            staging_bytes: STAGING_BYTES,
            peer_scratch: self.scratch.addrs,
            dtype: c.dtype as u32,
            op: c.op as u32,
            rank: call.rank as u32,
            nranks: call.nranks as u32,
            max_blocks: self.max_blocks,
            _pad: 0,
            abort: mscclpp_hal::dev::current_abort(),
        };
        let cfg = plan.config;
        tracing::trace!(collective = c.kind.name(), count = c.count, dtype = %c.dtype, op = %c.op, ?cfg, key = args.in_key, "launch read");
        let (kernel, _) = self.kernels.with_threads(c.dtype, cfg.block[0])?;
        // SAFETY: the caller's checked slices (kept alive until the stream passes the call), the
        // read scratch, table and window mappings held in `self` (a window stays mapped until
        // deregistered, which the caller does only after its calls have finished).
        unsafe { kernel.launch(stream, cfg, &args) }
    }
}
