//! Kernels: identified by name, launched with one `#[repr(C)]` argument struct.
//!
//! Collectives never name a vendor: they ask the device for a kernel by [`KernelId`]. The CUDA
//! and ROCm backends compile the kernel of that name from embedded sources; the host backend
//! runs a Rust function registered under the same name.

use std::fmt;

use crate::error::{Error, Result};

/// The name of a kernel, the same on every backend.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub &'static str);

impl KernelId {
    /// Fills `count` 32-bit words at `dst` with `value` (args: [`FillU32Args`]); used by the
    /// conformance suite to prove launches and argument passing.
    pub const FILL_U32: KernelId = KernelId("mscclpp_fill_u32");
    /// Every thread of the grid atomically adds `value` to the 64-bit counter at `counter`
    /// (args: [`AtomicAddU64Args`]); proves device-side atomics on (possibly shared) memory.
    pub const ATOMIC_ADD_U64: KernelId = KernelId("mscclpp_atomic_add_u64");

    /// Bandwidth benchmark: `iters` times, every block puts its share of `bytes` through a
    /// memory channel, then one thread signals the peer and waits for the peer's signal
    /// (args: [`MemoryChannelPutArgs`]).
    pub const BENCH_MEMORY_CHANNEL_PUT: KernelId = KernelId("mscclpp_bench_memory_channel_put");
    /// Bandwidth benchmark: `iters` times, `put_with_signal` of `bytes` through a port channel,
    /// then wait for the peer's signal (args: [`PortChannelPutArgs`]).
    pub const BENCH_PORT_CHANNEL_PUT: KernelId = KernelId("mscclpp_bench_port_channel_put");

    /// Example: `rounds` signal/wait round trips between two ranks over a base memory channel,
    /// the initiator signalling first (args: [`PingPongArgs`]).
    pub const EXAMPLE_PING_PONG: KernelId = KernelId("mscclpp_example_ping_pong");

    /// The LL-packet algorithm of the copying collectives — all-gather, broadcast, all-to-all
    /// (args: [`crate::LlCollectiveArgs`]; see [`crate::collective`]).
    pub const COLLECTIVE_LL_COPY: KernelId = KernelId("mscclpp_collective_ll_copy");

    /// The LL-packet algorithm of the reducing collectives — all-reduce, reduce-scatter — one
    /// kernel per element type and operator, indexed by their codes (args:
    /// [`crate::LlCollectiveArgs`]). Separate kernels, each compiled for its one case, keep a
    /// small message's path short (2 x H200: 0.15-0.3 µs less per all-reduce than one kernel
    /// for every case).
    pub const COLLECTIVE_LL_REDUCE: [[KernelId; 5]; 5] = [
        [
            KernelId("mscclpp_collective_ll_reduce_f32_sum"),
            KernelId("mscclpp_collective_ll_reduce_f32_prod"),
            KernelId("mscclpp_collective_ll_reduce_f32_min"),
            KernelId("mscclpp_collective_ll_reduce_f32_max"),
            KernelId("mscclpp_collective_ll_reduce_f32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_reduce_f16_sum"),
            KernelId("mscclpp_collective_ll_reduce_f16_prod"),
            KernelId("mscclpp_collective_ll_reduce_f16_min"),
            KernelId("mscclpp_collective_ll_reduce_f16_max"),
            KernelId("mscclpp_collective_ll_reduce_f16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_reduce_bf16_sum"),
            KernelId("mscclpp_collective_ll_reduce_bf16_prod"),
            KernelId("mscclpp_collective_ll_reduce_bf16_min"),
            KernelId("mscclpp_collective_ll_reduce_bf16_max"),
            KernelId("mscclpp_collective_ll_reduce_bf16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_reduce_i32_sum"),
            KernelId("mscclpp_collective_ll_reduce_i32_prod"),
            KernelId("mscclpp_collective_ll_reduce_i32_min"),
            KernelId("mscclpp_collective_ll_reduce_i32_max"),
            KernelId("mscclpp_collective_ll_reduce_i32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_reduce_u32_sum"),
            KernelId("mscclpp_collective_ll_reduce_u32_prod"),
            KernelId("mscclpp_collective_ll_reduce_u32_min"),
            KernelId("mscclpp_collective_ll_reduce_u32_max"),
            KernelId("mscclpp_collective_ll_reduce_u32_avg"),
        ],
    ];

    /// The short LL all-reduce: a message that fits one round, one packet per thread of the
    /// grid — the LL all-reduce's packets, halves, flags and counter, in a kernel whose path is
    /// a fraction of the general one's (args: [`crate::LlCollectiveArgs`]; see
    /// [`crate::collective`], "The short kernels"). One per element type and operator.
    pub const COLLECTIVE_LL_SHORT_ALLREDUCE: [[KernelId; 5]; 5] = [
        [
            KernelId("mscclpp_collective_ll_short_allreduce_f32_sum"),
            KernelId("mscclpp_collective_ll_short_allreduce_f32_prod"),
            KernelId("mscclpp_collective_ll_short_allreduce_f32_min"),
            KernelId("mscclpp_collective_ll_short_allreduce_f32_max"),
            KernelId("mscclpp_collective_ll_short_allreduce_f32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_allreduce_f16_sum"),
            KernelId("mscclpp_collective_ll_short_allreduce_f16_prod"),
            KernelId("mscclpp_collective_ll_short_allreduce_f16_min"),
            KernelId("mscclpp_collective_ll_short_allreduce_f16_max"),
            KernelId("mscclpp_collective_ll_short_allreduce_f16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_allreduce_bf16_sum"),
            KernelId("mscclpp_collective_ll_short_allreduce_bf16_prod"),
            KernelId("mscclpp_collective_ll_short_allreduce_bf16_min"),
            KernelId("mscclpp_collective_ll_short_allreduce_bf16_max"),
            KernelId("mscclpp_collective_ll_short_allreduce_bf16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_allreduce_i32_sum"),
            KernelId("mscclpp_collective_ll_short_allreduce_i32_prod"),
            KernelId("mscclpp_collective_ll_short_allreduce_i32_min"),
            KernelId("mscclpp_collective_ll_short_allreduce_i32_max"),
            KernelId("mscclpp_collective_ll_short_allreduce_i32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_allreduce_u32_sum"),
            KernelId("mscclpp_collective_ll_short_allreduce_u32_prod"),
            KernelId("mscclpp_collective_ll_short_allreduce_u32_min"),
            KernelId("mscclpp_collective_ll_short_allreduce_u32_max"),
            KernelId("mscclpp_collective_ll_short_allreduce_u32_avg"),
        ],
    ];

    /// The short LL reduce-scatter: as [`Self::COLLECTIVE_LL_SHORT_ALLREDUCE`], for a
    /// reduce-scatter whose rank block fits one round.
    pub const COLLECTIVE_LL_SHORT_REDUCE_SCATTER: [[KernelId; 5]; 5] = [
        [
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f32_sum"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f32_prod"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f32_min"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f32_max"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f16_sum"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f16_prod"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f16_min"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f16_max"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_f16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_reduce_scatter_bf16_sum"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_bf16_prod"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_bf16_min"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_bf16_max"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_bf16_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_reduce_scatter_i32_sum"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_i32_prod"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_i32_min"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_i32_max"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_i32_avg"),
        ],
        [
            KernelId("mscclpp_collective_ll_short_reduce_scatter_u32_sum"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_u32_prod"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_u32_min"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_u32_max"),
            KernelId("mscclpp_collective_ll_short_reduce_scatter_u32_avg"),
        ],
    ];

    /// The short LL all-gather: as [`Self::COLLECTIVE_LL_SHORT_ALLREDUCE`], for an all-gather
    /// whose rank block fits one round (any type: it copies bytes).
    pub const COLLECTIVE_LL_SHORT_ALLGATHER: KernelId =
        KernelId("mscclpp_collective_ll_short_allgather");

    /// The short LL all-to-all: as [`Self::COLLECTIVE_LL_SHORT_ALLREDUCE`], for an all-to-all
    /// whose rank block fits one round (any type).
    pub const COLLECTIVE_LL_SHORT_ALLTOALL: KernelId =
        KernelId("mscclpp_collective_ll_short_alltoall");

    /// The LL kernel that serves `kind` for `dtype` and `op`.
    pub fn collective_ll(
        kind: crate::CollectiveKind,
        dtype: crate::DataType,
        op: crate::ReduceOp,
    ) -> KernelId {
        if kind.reduces() {
            Self::COLLECTIVE_LL_REDUCE[dtype as usize][op as usize]
        } else {
            Self::COLLECTIVE_LL_COPY
        }
    }

    /// Every LL kernel, the short ones included (one implementation serves them all on the
    /// host).
    pub const COLLECTIVE_LL_ALL: [KernelId; 78] = {
        let mut all = [Self::COLLECTIVE_LL_COPY; 78];
        all[1] = Self::COLLECTIVE_LL_SHORT_ALLGATHER;
        all[2] = Self::COLLECTIVE_LL_SHORT_ALLTOALL;
        let mut i = 0;
        while i < 25 {
            all[i + 3] = Self::COLLECTIVE_LL_REDUCE[i / 5][i % 5];
            all[i + 28] = Self::COLLECTIVE_LL_SHORT_ALLREDUCE[i / 5][i % 5];
            all[i + 53] = Self::COLLECTIVE_LL_SHORT_REDUCE_SCATTER[i / 5][i % 5];
            i += 1;
        }
        all
    };

    /// The direct (bandwidth) algorithm of every collective: plain stores into the peers'
    /// scratch, pipelined in steps (args: [`crate::collective::DirectCollectiveArgs`]; see
    /// [`crate::collective`]).
    pub const COLLECTIVE_DIRECT: KernelId = KernelId("mscclpp_collective_direct");

    /// All-reduce by LL128 lines (one round; args: [`crate::collective::LlCollectiveArgs`]; see
    /// [`crate::collective`]).
    pub const COLLECTIVE_LL128_ALLREDUCE: KernelId = KernelId("mscclpp_collective_ll128_allreduce");

    /// The read algorithm of all-reduce: every rank reads the peers' inputs where they lie
    /// (registered windows, or a staging copy) and reduces locally (args:
    /// [`crate::collective::ReadCollectiveArgs`]; see [`crate::collective`]).
    pub const COLLECTIVE_READ_ALLREDUCE: KernelId = KernelId("mscclpp_collective_read_allreduce");

    /// The kernel's name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelId({})", self.0)
    }
}

impl fmt::Display for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_mem_bytes: 0,
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| u64::from(b)).product()
    }

    /// Checks the shape against a device's limit on threads per block.
    pub fn validate(&self, max_threads_per_block: u32) -> Result<()> {
        if self.num_blocks() == 0 || self.threads_per_block() == 0 {
            return Err(Error::invalid(format!(
                "launch with an empty grid or block: grid {:?}, block {:?}",
                self.grid, self.block
            )));
        }
        if self.threads_per_block() > u64::from(max_threads_per_block) {
            return Err(Error::invalid(format!(
                "block of {} threads exceeds the device limit of {max_threads_per_block}",
                self.threads_per_block()
            )));
        }
        Ok(())
    }
}

/// Checks a launch of kernel `id` on a GPU backend before the vendor call: the shape against
/// `max_threads_per_block`, and the argument bytes against the kernel's argument struct size
/// where it is known (`param_size`).
pub fn check_launch(
    id: KernelId,
    cfg: &LaunchConfig,
    max_threads_per_block: u32,
    param_size: Option<usize>,
    args: &[u8],
) -> Result<()> {
    cfg.validate(max_threads_per_block)?;
    if let Some(expected) = param_size {
        if expected != args.len() {
            return Err(Error::invalid(format!(
                "kernel {id} takes a {expected}-byte argument struct; {} bytes were given",
                args.len()
            )));
        }
    }
    Ok(())
}

/// The argument bytes in 8-byte aligned words (at least one word, zero-padded): a copy with
/// the layout a kernel expects of its one struct parameter, whatever the caller's alignment.
pub fn aligned_args(args: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; args.len().div_ceil(8).max(1)];
    for (word, chunk) in words.iter_mut().zip(args.chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        *word = u64::from_ne_bytes(bytes);
    }
    words
}

/// The argument struct size of the kernels whose struct the HAL defines (for backends that
/// cannot ask the compiled kernel).
pub fn known_param_size(id: KernelId) -> Option<usize> {
    use std::mem::size_of;
    match id {
        KernelId::FILL_U32 => Some(size_of::<FillU32Args>()),
        KernelId::ATOMIC_ADD_U64 => Some(size_of::<AtomicAddU64Args>()),
        KernelId::BENCH_MEMORY_CHANNEL_PUT => Some(size_of::<MemoryChannelPutArgs>()),
        KernelId::BENCH_PORT_CHANNEL_PUT => Some(size_of::<PortChannelPutArgs>()),
        KernelId::COLLECTIVE_DIRECT => Some(size_of::<crate::collective::DirectCollectiveArgs>()),
        KernelId::COLLECTIVE_READ_ALLREDUCE => {
            Some(size_of::<crate::collective::ReadCollectiveArgs>())
        }
        id if KernelId::COLLECTIVE_LL_ALL.contains(&id)
            || id == KernelId::COLLECTIVE_LL128_ALLREDUCE =>
        {
            Some(size_of::<crate::collective::LlCollectiveArgs>())
        }
        _ => None,
    }
}

/// A `#[repr(C)]` kernel argument struct that is plain old data.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain no padding bytes that the device reads, no
/// references or pointers into host memory the device cannot see, and be valid for every bit
/// pattern (so that [`KernelArgs::from_bytes`] may rebuild one from bytes).
pub unsafe trait KernelArgs: Copy + Send + 'static {
    /// The bytes of the struct, exactly as the device sees them.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Self` is plain old data (trait contract), so viewing it as
        // `size_of::<Self>()` initialised bytes is sound.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }

    /// Rebuilds the struct from bytes, checking the length.
    fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != std::mem::size_of::<Self>() {
            return Err(Error::invalid(format!(
                "kernel arguments of {} bytes where {} bytes of {} were expected",
                bytes.len(),
                std::mem::size_of::<Self>(),
                std::any::type_name::<Self>()
            )));
        }
        // SAFETY: the length matches, and every bit pattern is a valid `Self` (trait contract);
        // `read_unaligned` copes with the byte slice's alignment.
        Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// Arguments of [`KernelId::FILL_U32`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillU32Args {
    /// Device address of the first word.
    pub dst: u64,
    /// Number of 32-bit words.
    pub count: u64,
    /// The value to store.
    pub value: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

// SAFETY: repr(C), integers only, explicit padding; every bit pattern is valid.
unsafe impl KernelArgs for FillU32Args {}

/// Arguments of [`KernelId::ATOMIC_ADD_U64`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAddU64Args {
    /// Device address of an 8-byte-aligned counter.
    pub counter: u64,
    /// Added once by every thread of the grid.
    pub value: u64,
}

// SAFETY: repr(C), integers only, no padding; every bit pattern is valid.
unsafe impl KernelArgs for AtomicAddU64Args {}

/// A loaded kernel, ready to launch on a stream of the device that loaded it.
pub trait Kernel: Send + Sync + fmt::Debug {
    /// Which kernel this is.
    fn id(&self) -> KernelId;
    /// Backend-specific access for downcasting by the stream that launches it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The most threads per block this kernel can be launched with (its register use limits
    /// it), where the backend knows; `None`: the device's limit applies.
    fn max_threads_per_block(&self) -> Option<u32> {
        None
    }
}

/// Arguments of [`KernelId::BENCH_MEMORY_CHANNEL_PUT`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryChannelPutArgs {
    /// The channel (its `src` is sent to its `dst`).
    pub chan: crate::dev::MemoryChannelDeviceHandle,
    /// Bytes per put.
    pub bytes: u64,
    /// Number of put/signal/wait rounds.
    pub iters: u64,
}

// SAFETY: repr(C) of integer-only structs, no implicit padding; every bit pattern is valid.
unsafe impl KernelArgs for MemoryChannelPutArgs {}

/// Arguments of [`KernelId::BENCH_PORT_CHANNEL_PUT`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortChannelPutArgs {
    /// The channel.
    pub chan: crate::dev::PortChannelDeviceHandle,
    /// Bytes per put.
    pub bytes: u64,
    /// Number of put-with-signal/wait rounds.
    pub iters: u64,
}

// SAFETY: as above.
unsafe impl KernelArgs for PortChannelPutArgs {}

/// Arguments of [`KernelId::EXAMPLE_PING_PONG`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingPongArgs {
    /// The channel.
    pub chan: crate::dev::BaseMemoryChannelDeviceHandle,
    /// Number of round trips.
    pub rounds: u64,
    /// Nonzero on the rank that signals first.
    pub initiator: u32,
    /// Nonzero to use the relaxed signal/wait.
    pub relaxed: u32,
}

// SAFETY: as above.
unsafe impl KernelArgs for PingPongArgs {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_args_keep_the_bytes_in_order_and_pad_with_zeros() {
        let words = aligned_args(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(words.len(), 2);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert!(bytes[9..].iter().all(|&b| b == 0));
        assert_eq!(aligned_args(&[]), vec![0]);
    }

    #[test]
    fn launches_are_checked_against_the_limit_and_the_struct_size() {
        let cfg = LaunchConfig::linear(1, 64);
        let id = KernelId::FILL_U32;
        assert!(check_launch(id, &cfg, 64, Some(3), &[0; 3]).is_ok());
        assert!(check_launch(id, &cfg, 64, None, &[0; 5]).is_ok());
        assert!(check_launch(id, &cfg, 32, None, &[]).is_err());
        let e = check_launch(id, &cfg, 64, Some(24), &[0; 8]).unwrap_err();
        assert!(e.to_string().contains("24-byte argument struct"), "{e}");
        assert_eq!(known_param_size(KernelId::FILL_U32), Some(24));
        assert_eq!(known_param_size(KernelId("no_such_kernel")), None);
    }
}
