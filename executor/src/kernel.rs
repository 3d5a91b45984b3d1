//! The interpreter kernel: one launch runs a rank's flattened plan, one block per threadblock of
//! the plan. [`EXECUTOR_MODULE`] hands it to the HAL: its host function is the private
//! `kernel::host` module's; its device source is `kernels/executor/executor.cu`, which reads the
//! same [`DevicePlan`] and [`ExecutorArgs`] (mirrored in `kernels/executor/args.cuh`, whose
//! layout `kernels/executor/args_check.h` checks in every compile).
//!
//! Semantics follow MSCCL++'s executor kernel, op by op (see `docs/executor.md`). The host
//! version runs each block on a thread of its own: blocks of one rank wait for each other
//! (barriers, semaphores) and for the peers' blocks, so all must run at once.

use mscclpp_hal::{KernelArgs, KernelDef, KernelId, KernelModule};

mod host;

pub use host::combine;
use host::host_executor;

/// The interpreter's entry point.
pub const EXECUTOR_KERNEL: KernelId = KernelId("mscclpp_executor");

/// Most threads per block of the device interpreter (its `__launch_bounds__`): the planner
/// clamps a plan's `num_threads_per_block` to it.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// The module of the interpreter: the device source and its headers, and the host function.
pub static EXECUTOR_MODULE: KernelModule = KernelModule {
    name: "executor/executor.cu",
    source: include_str!("../../kernels/executor/executor.cu"),
    headers: &[
        (
            "executor/args.cuh",
            include_str!("../../kernels/executor/args.cuh"),
        ),
        (
            "executor/args_check.h",
            include_str!("../../kernels/executor/args_check.h"),
        ),
    ],
    kernels: &[KernelDef::new::<ExecutorArgs>(
        "mscclpp_executor",
        host_executor,
    )],
};

/// Words of the per-context state before the semaphores: the last flag, the count of blocks
/// done with the current launch, and (count, generation) of every barrier.
pub const STATE_HEADER_WORDS: usize = 2 + 2 * crate::plan::MAX_BARRIERS as usize;

/// Most members of one emulated switch channel (a rank group of a plan).
pub const MAX_SWITCH_MEMBERS: usize = crate::plan::MAX_GPUS;

/// The host interpreter's emulated switch channels, as the words that follow the semaphores in
/// the state block: their count, then per channel its member count and each member's address
/// of the channel's buffer (group order). GPUs never get switch channels (the executor refuses
/// them there), so the device interpreter never reads past the semaphores.
pub fn switch_table_words(members: &[Vec<u64>]) -> Vec<u64> {
    let mut w = vec![members.len() as u64];
    for m in members {
        w.push(m.len() as u64);
        w.extend_from_slice(m);
    }
    w
}

/// A rank's flattened plan and the tables its ops index, in device memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevicePlan {
    /// Threadblocks.
    pub n_blocks: u32,
    /// Ops of all blocks.
    pub n_ops: u32,
    /// `[FlatBlock; n_blocks]`.
    pub blocks: u64,
    /// `[FlatOp; n_ops]`.
    pub ops: u64,
    /// `[BaseMemoryChannelDeviceHandle; n_memory]`, by the rank's memory channel index.
    pub memory_channels: u64,
    /// `[PortChannelDeviceHandle; n_port]`, by the rank's port channel index.
    pub port_channels: u64,
    /// `[u64; n_remote]`: where each remote buffer is mapped here (0: not mapped).
    pub remote_addrs: u64,
    /// `[u32; n_remote]`: each remote buffer's proxy memory id (`u32::MAX`: none).
    pub remote_ids: u64,
    /// Proxy memory ids of the local input, output and scratch (and a spare).
    pub local_ids: [u32; 4],
    /// Entries of `memory_channels`.
    pub n_memory: u32,
    /// Entries of `port_channels`.
    pub n_port: u32,
    /// Entries of `remote_addrs` and `remote_ids`.
    pub n_remote: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

/// The interpreter's argument struct.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorArgs {
    /// The [`DevicePlan`].
    pub plan: u64,
    /// The context's state words (see [`STATE_HEADER_WORDS`]), then its semaphores.
    pub state: u64,
    /// The send buffer.
    pub input: u64,
    /// The receive buffer.
    pub output: u64,
    /// The scratch buffer (both halves).
    pub scratch: u64,
    /// Bytes of the scratch buffer.
    pub scratch_bytes: u64,
    /// [`DataType`](mscclpp_hal::DataType) code.
    pub dtype: u32,
    /// [`ReduceOp`](mscclpp_hal::ReduceOp) code that overrides every op's, or `u32::MAX`: each
    /// op's own.
    pub op: u32,
    /// 1: the scratch is two halves, used by alternate flags.
    pub double_scratch: u32,
    /// Semaphores after the state header.
    pub n_semaphores: u32,
    /// Device address of the communicator's abort word (0: none): the device interpreter's
    /// waits give up once it is set. Filled at launch from the launching thread's abort scope
    /// ([`mscclpp_hal::dev::current_abort`]), which the host interpreter polls directly.
    pub abort: u64,
}

// SAFETY: both are `#[repr(C)]` plain data without implicit padding (explicit `_pad` fields), with
// no host references, valid for every bit pattern.
unsafe impl KernelArgs for ExecutorArgs {}
// SAFETY: as above.
unsafe impl KernelArgs for DevicePlan {}
