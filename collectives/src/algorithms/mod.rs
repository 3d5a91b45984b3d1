//! The algorithms, one folder each, behind one [`Algorithm`] trait.
//!
//! An algorithm says which calls it serves here ([`Algorithm::fits`]: its collectives, its
//! sizes, and what it was set up with on this communicator), plans the grid of one call
//! ([`Algorithm::plan`]) and launches its kernel ([`Algorithm::launch`]). Which of the fitting
//! ones serves a call is the policy's choice. Each folder is the home of everything that
//! belongs to its algorithm: its protocol spec (`spec.md`, its module documentation), argument
//! struct (`args.rs`), set-up and planner (`mod.rs`), host kernel (`host.rs`) and the
//! [`KernelModule`] of its device source (`module.rs`). Two modules serve the five algorithms:
//! `kernels/collectives/ll.cu` (LL, the short LL kernels, LL128; defined in `ll/module.rs`) and
//! `kernels/collectives/direct.cu` (direct and read; `direct/module.rs`). What the host kernels
//! share is in `host_common.rs`.

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    DeviceInfo, Kernel, KernelArgs, KernelId, KernelModule, LaunchConfig, Result, Stream,
    TypedKernel,
};

use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;

pub(crate) mod direct;
pub(crate) mod host_common;
#[cfg(test)]
mod layout;
pub(crate) mod ll;
pub(crate) mod ll128;
pub(crate) mod ll_short;
pub(crate) mod p2p;
pub(crate) mod read;

/// Most ranks the intra-node collectives serve (one node of GPUs): the size of the per-rank
/// arrays in every argument struct.
pub const MAX_RANKS: usize = 8;

/// Every kernel module of the collectives: what the kernel compile tests compile for every
/// target.
pub static MODULES: &[&KernelModule] =
    &[&ll::module::MODULE, &direct::module::MODULE, &p2p::MODULE];

/// The headers of the collective modules: the argument structs and their layout checks.
pub(crate) const HEADERS: &[(&str, &str)] = &[
    (
        "collectives/args.cuh",
        include_str!("../../../kernels/collectives/args.cuh"),
    ),
    (
        "collectives/args_check.h",
        include_str!("../../../kernels/collectives/args_check.h"),
    ),
];

/// Which algorithm serves a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmId {
    /// LL packets through scratch: data and flag written together into the peers' scratch, in
    /// rounds when a message exceeds a slot (every collective; small messages).
    Ll,
    /// The LL protocol in one round with a thread per packet of a rank block (all-reduce,
    /// reduce-scatter, all-gather, all-to-all): chosen instead of [`AlgorithmId::Ll`] wherever
    /// it fits, and interoperable with it.
    LlShort,
    /// LL128 lines through the same scratch: 120 data bytes per 128 instead of 8 per 16
    /// (all-reduce of one round, on devices with `Capabilities::ll128`).
    Ll128,
    /// Plain stores into the peers' scratch, pipelined (every collective; large messages).
    Direct,
    /// Every rank reads the peers' inputs where they lie — registered windows, or a staging
    /// copy — and reduces locally (all-reduce).
    Read,
}

impl AlgorithmId {
    /// Every algorithm.
    pub const ALL: [AlgorithmId; 5] = [
        AlgorithmId::Ll,
        AlgorithmId::LlShort,
        AlgorithmId::Ll128,
        AlgorithmId::Direct,
        AlgorithmId::Read,
    ];

    /// Its name (as `MSCCLPP_ALGO_*` spells the ones that can be forced).
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmId::Ll => "ll",
            AlgorithmId::LlShort => "ll-short",
            AlgorithmId::Ll128 => "ll128",
            AlgorithmId::Direct => "direct",
            AlgorithmId::Read => "read",
        }
    }
}

impl std::fmt::Display for AlgorithmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How one call is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub config: LaunchConfig,
    /// Bytes per peer of one pipelined chunk (direct; 0 elsewhere).
    pub chunk_bytes: u64,
}

impl Plan {
    pub fn grid(config: LaunchConfig) -> Plan {
        Plan {
            config,
            chunk_bytes: 0,
        }
    }
}

/// One algorithm, set up on a communicator.
pub(crate) trait Algorithm: std::fmt::Debug + Send + Sync {
    fn id(&self) -> AlgorithmId;

    /// Whether it serves `kind` with rank blocks of `block_bytes` here. Must depend on nothing
    /// a rank could see differently from its peers, except where the algorithm interoperates
    /// with the one chosen otherwise (the short LL kernels).
    fn fits(&self, kind: CollectiveKind, block_bytes: u64) -> bool;

    /// The grid of `call`, which it fits; the same on every rank.
    fn plan(&self, call: &Checked) -> Result<Plan>;

    /// Enqueues the kernel of `call` on `stream`.
    ///
    /// # Safety
    ///
    /// `call` was made by [`crate::call::check`] for this communicator, `plan` by
    /// [`Algorithm::plan`] of this algorithm for it, and the caller keeps the call's buffers
    /// alive until the stream has passed it.
    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &dyn Stream) -> Result<()>;
}

/// The most threads (whole warps) a block of `kernel` may have on this device.
fn thread_limit(info: &DeviceInfo, kernel: &dyn Kernel) -> u32 {
    let limit = kernel
        .max_threads_per_block()
        .unwrap_or(info.max_threads_per_block)
        .min(info.max_threads_per_block);
    (limit / 32 * 32).max(32)
}

/// Threads per block: `forced` (from the environment) or `default`, from 32 to 1024 and within
/// what `kernel` may launch with on this device.
pub(crate) fn block_threads(
    info: &DeviceInfo,
    kernel: &dyn Kernel,
    forced: Option<u32>,
    default: u32,
) -> u32 {
    let limit = thread_limit(info, kernel);
    let threads = forced.unwrap_or(default).clamp(32, 1024);
    if threads > limit {
        tracing::info!(
            kernel = %kernel.id(),
            threads,
            limit,
            "fewer threads per block than asked: the kernel's limit on this device"
        );
    }
    threads.min(limit)
}

/// Blocks and threads of a grid whose blocks wait for the peers' blocks: GPUs at most one block
/// per SM (128 at most; all resident) of `threads`; the host one worker.
pub(crate) fn resident_grid(info: &DeviceInfo, threads: u32) -> (u32, u32) {
    if info.warp_size == 1 {
        (1, 1)
    } else {
        (info.multiprocessors.clamp(1, 128), threads)
    }
}

/// Kernel `id` of `module`, taking an `A`.
pub(crate) fn load<A: KernelArgs>(
    comm: &Communicator,
    module: &'static KernelModule,
    id: KernelId,
) -> Result<TypedKernel<A>> {
    TypedKernel::load(&**comm.device(), module, id)
}

/// Kernel `id` of `module`, or `None` where the backend lacks it — then every rank must lack it
/// too (`what` names the settings agreed).
pub(crate) fn optional_kernel<A: KernelArgs>(
    comm: &Communicator,
    module: &'static KernelModule,
    id: KernelId,
    what: &str,
) -> Result<Option<TypedKernel<A>>> {
    match load(comm, module, id) {
        Ok(k) => Ok(Some(k)),
        Err(e) => {
            tracing::info!("{id} unavailable: {e}");
            agree(comm, what, "unavailable".into())?;
            Ok(None)
        }
    }
}
