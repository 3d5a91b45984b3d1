//! What every algorithm is built on, and nothing of any one of them: the [`Algorithm`] trait and
//! the [`Plan`] of a call, the limits every argument struct is sized by ([`MAX_RANKS`]), the
//! headers every collective module compiles with ([`HEADERS`]), the split of the element types
//! into base and wide modules ([`BASE_TYPES`]), the kernels of a wide module loaded at their first
//! call ([`LazyKernel`], [`ByType`]) and the grid helpers. It is a module of its own so that the
//! algorithms, the kernel modules and the rest of the crate can share it without depending on
//! `algorithms/mod.rs`, which lists them all: it uses no algorithm.

use std::sync::{Arc, OnceLock};

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    Api, DataType, DeviceApi, DeviceInfo, KernelApi, KernelArgs, KernelId, KernelModule,
    LaunchConfig, Result, TypedKernel,
};

use super::id::AlgorithmId;
use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;

/// Most ranks the intra-node collectives serve (one node of GPUs): the size of the per-rank
/// arrays in every argument struct.
pub const MAX_RANKS: usize = 8;

/// The headers of the collective modules: the argument structs and their layout checks, the
/// element-type set of a module (`dtypes.cuh`) and the bodies the base and wide modules share.
pub(crate) const HEADERS: &[(&str, &str)] = &[
    (
        "collectives/args.cuh",
        include_str!("../../../kernels/collectives/args.cuh"),
    ),
    (
        "collectives/args_check.h",
        include_str!("../../../kernels/collectives/args_check.h"),
    ),
    (
        "collectives/dtypes.cuh",
        include_str!("../../../kernels/collectives/dtypes.cuh"),
    ),
    (
        "collectives/ll.cuh",
        include_str!("../../../kernels/collectives/ll.cuh"),
    ),
    (
        "collectives/direct.cuh",
        include_str!("../../../kernels/collectives/direct.cuh"),
    ),
    (
        "collectives/direct_entry.cuh",
        include_str!("../../../kernels/collectives/direct_entry.cuh"),
    ),
];

/// Element types of the base modules: codes below this (f32, f16, bf16, i32, u32); the others
/// are the wide modules'.
pub(crate) const BASE_TYPES: usize = 5;

/// Whether `dtype`'s kernels are in the wide modules (loaded at first use).
pub(crate) fn is_wide(dtype: DataType) -> bool {
    dtype as usize >= BASE_TYPES
}

/// A kernel of a wide module, loaded at its first use: the module is compiled (GPUs) only when a
/// call of one of its element types comes. A failed load is not remembered (the next call tries
/// again); a loaded kernel is kept with the most threads per block it may launch with here.
pub(crate) struct LazyKernel<T, A: Api> {
    device: Arc<A::Device>,
    module: &'static KernelModule,
    id: KernelId,
    loaded: OnceLock<(TypedKernel<T, A>, u32)>,
}

impl<T, A: Api> std::fmt::Debug for LazyKernel<T, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyKernel")
            .field("module", &self.module.name)
            .field("id", &self.id)
            .field("loaded", &self.loaded.get().is_some())
            .finish()
    }
}

impl<T: KernelArgs, A: Api> LazyKernel<T, A> {
    /// Kernel `id` of `module` on `comm`'s device, not loaded yet (an `id` the module lacks is
    /// an error at [`LazyKernel::get`]; the modules' tests check every id).
    pub fn new(comm: &Communicator, module: &'static KernelModule, id: KernelId) -> Result<Self> {
        Ok(LazyKernel {
            device: A::device_of(comm.device())?,
            module,
            id,
            loaded: OnceLock::new(),
        })
    }

    /// The kernel, loaded now if it is not yet, and its thread limit on this device
    /// ([`thread_limit`]: per loaded kernel, since the wide kernels use more registers).
    pub fn get(&self) -> Result<(&TypedKernel<T, A>, u32)> {
        if let Some((k, limit)) = self.loaded.get() {
            return Ok((k, *limit));
        }
        tracing::debug!(module = self.module.name, kernel = %self.id, "loading at first use");
        let kernel = TypedKernel::load(&*self.device, self.module, self.id)?;
        let limit = thread_limit(self.device.info(), &**kernel.kernel());
        // Two threads may have loaded it at once: either result serves.
        let (k, limit) = self.loaded.get_or_init(|| (kernel, limit));
        Ok((k, *limit))
    }
}

/// A kernel per element type: the base types' loaded at set-up, the wide types' at first use.
#[derive(Debug)]
pub(crate) struct ByType<T, A: Api> {
    base: TypedKernel<T, A>,
    wide: LazyKernel<T, A>,
}

impl<T: KernelArgs, A: Api> ByType<T, A> {
    /// `base` of `base_module` (loaded now) and `wide` of `wide_module` (at first use).
    pub fn load(
        comm: &Communicator,
        (base_module, base): (&'static KernelModule, KernelId),
        (wide_module, wide): (&'static KernelModule, KernelId),
    ) -> Result<Self> {
        Ok(ByType::new(
            load(comm, base_module, base)?,
            LazyKernel::new(comm, wide_module, wide)?,
        ))
    }

    /// `base`, loaded already, and `wide`.
    pub fn new(base: TypedKernel<T, A>, wide: LazyKernel<T, A>) -> Self {
        ByType { base, wide }
    }

    /// The kernel of `dtype` and the threads per block its calls take: `threads`, within the
    /// wide kernel's own limit for a wide type (more registers). Only the blocks and chunks
    /// must match across ranks, so a rank's thread count may differ.
    pub fn with_threads(&self, dtype: DataType, threads: u32) -> Result<(&TypedKernel<T, A>, u32)> {
        if is_wide(dtype) {
            let (k, limit) = self.wide.get()?;
            Ok((k, threads.min(limit)))
        } else {
            Ok((&self.base, threads))
        }
    }

    /// The kernel of `dtype` (its users' grids keep within every kernel's limit: the LL ones).
    pub fn get(&self, dtype: DataType) -> Result<&TypedKernel<T, A>> {
        if is_wide(dtype) {
            Ok(self.wide.get()?.0)
        } else {
            Ok(&self.base)
        }
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

/// One algorithm, set up on a communicator, launching on the streams of backend `A`.
pub(crate) trait Algorithm<A: Api>: std::fmt::Debug + Send + Sync {
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
    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()>;
}

/// The most threads (whole warps) a block of `kernel` may have on this device.
fn thread_limit<K: KernelApi>(info: &DeviceInfo, kernel: &K) -> u32 {
    let limit = kernel
        .max_threads_per_block()
        .unwrap_or(info.max_threads_per_block)
        .min(info.max_threads_per_block);
    (limit / 32 * 32).max(32)
}

/// Threads per block: `forced` (from the environment) or `default`, from 32 to 1024 and within
/// what `kernel` may launch with on this device.
pub(crate) fn block_threads<K: KernelApi>(
    info: &DeviceInfo,
    kernel: &K,
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

/// Kernel `id` of `module` on `comm`'s device of backend `A`, taking a `T`.
pub(crate) fn load<T: KernelArgs, A: Api>(
    comm: &Communicator,
    module: &'static KernelModule,
    id: KernelId,
) -> Result<TypedKernel<T, A>> {
    TypedKernel::load(&*A::device_of(comm.device())?, module, id)
}

/// Kernel `id` of `module`, or `None` where the backend lacks it — then every rank must lack it
/// too (`what` names the settings agreed).
pub(crate) fn optional_kernel<T: KernelArgs, A: Api>(
    comm: &Communicator,
    module: &'static KernelModule,
    id: KernelId,
    what: &str,
) -> Result<Option<TypedKernel<T, A>>> {
    match load(comm, module, id) {
        Ok(k) => Ok(Some(k)),
        Err(e) => {
            tracing::info!("{id} unavailable: {e}");
            agree(comm, what, "unavailable".into())?;
            Ok(None)
        }
    }
}
