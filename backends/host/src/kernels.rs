//! Kernels of the host backend: Rust functions registered under the kernel ids that the GPU
//! backends compile from `kernels/cuda` and `kernels/hip`.
//!
//! A host kernel receives the launch shape and the bytes of its `#[repr(C)]` argument struct.
//! Blocks run concurrently on worker threads ([`for_each_block`]); device addresses in the
//! arguments are addresses of this process's mappings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

use mscclpp_hal::dev::DEFAULT_WAIT;
use mscclpp_hal::kernel::{
    AtomicAddU64Args, FillU32Args, MemoryChannelPutArgs, PingPongArgs, PortChannelPutArgs,
};
use mscclpp_hal::{Error, KernelArgs, KernelId, LaunchConfig, Result};

pub use mscclpp_hal::HostKernelFn;

/// A kernel loaded on the host backend.
#[derive(Debug, Clone, Copy)]
pub struct HostKernel {
    pub(crate) id: KernelId,
    pub(crate) func: HostKernelFn,
}

impl mscclpp_hal::Kernel for HostKernel {
    fn id(&self) -> KernelId {
        self.id
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Every kernel the host backend implements.
pub const KERNELS: &[(KernelId, HostKernelFn)] = &[
    (KernelId::FILL_U32, fill_u32),
    (KernelId::ATOMIC_ADD_U64, atomic_add_u64),
    (KernelId::BENCH_MEMORY_CHANNEL_PUT, bench_memory_channel_put),
    (KernelId::BENCH_PORT_CHANNEL_PUT, bench_port_channel_put),
    (KernelId::EXAMPLE_PING_PONG, example_ping_pong),
    (
        KernelId::COLLECTIVE_DIRECT,
        crate::collectives_direct::collective_direct,
    ),
    (
        KernelId::COLLECTIVE_LL128_ALLREDUCE,
        crate::collectives_ll128::collective_ll128_allreduce,
    ),
    (
        KernelId::COLLECTIVE_READ_ALLREDUCE,
        crate::collectives_read::collective_read_allreduce,
    ),
];

fn user_kernels() -> &'static RwLock<HashMap<KernelId, HostKernelFn>> {
    static USER: OnceLock<RwLock<HashMap<KernelId, HostKernelFn>>> = OnceLock::new();
    USER.get_or_init(|| RwLock::new(HashMap::new()))
}

/// The built-in kernel `id`: [`KERNELS`], or one of the LL collective kernels (all served by one
/// implementation, which reads the kind, type and operator from its arguments).
fn builtin(id: KernelId) -> Option<HostKernelFn> {
    if KernelId::COLLECTIVE_LL_ALL.contains(&id) {
        return Some(crate::collectives::collective_ll);
    }
    KERNELS.iter().find(|(k, _)| *k == id).map(|(_, f)| *f)
}

/// Registers a host kernel under `id`, for users' own kernels (the host counterpart of
/// compiling a `.cu` file that includes the device API). Built-in ids cannot be replaced.
pub fn register(id: KernelId, func: HostKernelFn) -> Result<()> {
    if builtin(id).is_some() {
        return Err(Error::invalid(format!(
            "kernel {id} is built into the host backend and cannot be replaced"
        )));
    }
    user_kernels()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, func);
    Ok(())
}

/// Looks a kernel up by id: built-in ones first, then those added with [`register`].
pub fn lookup(id: KernelId) -> Result<HostKernel> {
    let user = || {
        user_kernels()
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
    };
    builtin(id)
        .or_else(user)
        .map(|func| HostKernel { id, func })
        .ok_or_else(|| {
            Error::unavailable(
                format!("kernel {id}"),
                "the host backend has no implementation of it",
            )
        })
}

/// Runs `body(block_index)` for every block of the grid, blocks spread over up to one thread per
/// CPU core; returns the first error.
///
/// Kernels that synchronise across blocks need every block resident at once; they must keep
/// their grid within [`std::thread::available_parallelism`] blocks on this backend.
pub fn for_each_block(cfg: &LaunchConfig, body: impl Fn(u64) -> Result<()> + Sync) -> Result<()> {
    let blocks = cfg.num_blocks();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let workers = blocks.min(cores).max(1);
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= blocks {
                            return Ok(());
                        }
                        body(b)?;
                    }
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| Error::Internal("a host kernel block panicked".into()))?
        })
    })
}

fn check_aligned(addr: u64, align: u64, what: &str) -> Result<()> {
    if addr == 0 || addr % align != 0 {
        return Err(Error::invalid(format!(
            "{what} address {addr:#x} is null or not {align}-byte aligned"
        )));
    }
    Ok(())
}

/// A raw device address shared by the blocks of one launch.
#[derive(Clone, Copy)]
struct Addr(u64);

fn fill_u32(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = FillU32Args::from_bytes(args)?;
    check_aligned(a.dst, 4, "fill destination")?;
    let blocks = cfg.num_blocks();
    let per_block = a.count.div_ceil(blocks);
    let dst = Addr(a.dst);
    for_each_block(cfg, |b| {
        let start = b * per_block;
        let end = (start + per_block).min(a.count);
        for i in start..end {
            // SAFETY: the launcher promised (Stream::launch_raw's contract) that `dst` addresses
            // `count` live, aligned 32-bit words; `i < count`.
            unsafe { (dst.0 as *mut u32).add(i as usize).write_volatile(a.value) };
        }
        Ok(())
    })
}

fn atomic_add_u64(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = AtomicAddU64Args::from_bytes(args)?;
    check_aligned(a.counter, 8, "atomic counter")?;
    let threads = cfg.threads_per_block();
    let counter = Addr(a.counter);
    for_each_block(cfg, |_| {
        // SAFETY: the launcher promised a live, 8-byte aligned u64 (alignment checked above);
        // all accesses to it during the kernel are atomic.
        let c = unsafe { AtomicU64::from_ptr(counter.0 as *mut u64) };
        for _ in 0..threads {
            c.fetch_add(a.value, Ordering::AcqRel);
        }
        Ok(())
    })
}

fn bench_memory_channel_put(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = MemoryChannelPutArgs::from_bytes(args)?;
    let blocks = cfg.num_blocks() as usize;
    let bytes = usize::try_from(a.bytes)
        .map_err(|_| Error::invalid(format!("{} bytes do not fit this host", a.bytes)))?;
    for _ in 0..a.iters {
        for_each_block(cfg, |b| {
            // SAFETY: the launcher vouches that the channel's memories hold `bytes` (launch
            // contract); each block copies its own share.
            unsafe { a.chan.put(0, 0, bytes, b as usize, blocks) };
            Ok(())
        })?;
        // SAFETY: the channel's semaphore tokens are live (launch contract).
        unsafe {
            a.chan.signal();
            a.chan.wait(DEFAULT_WAIT)?;
        }
    }
    Ok(())
}

fn bench_port_channel_put(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = PortChannelPutArgs::from_bytes(args)?;
    for _ in 0..a.iters {
        // SAFETY: the channel's FIFO and semaphore are live (launch contract).
        unsafe {
            a.chan.put_with_signal(0, 0, a.bytes, DEFAULT_WAIT)?;
            a.chan.wait(DEFAULT_WAIT)?;
        }
    }
    Ok(())
}

fn example_ping_pong(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = PingPongArgs::from_bytes(args)?;
    let (c, relaxed) = (a.chan, a.relaxed != 0);
    for _ in 0..a.rounds {
        // SAFETY: the channel's semaphore tokens are live (launch contract).
        unsafe {
            if a.initiator != 0 {
                if relaxed {
                    c.relaxed_signal()
                } else {
                    c.signal()
                }
            }
            if relaxed {
                c.relaxed_wait(DEFAULT_WAIT)?
            } else {
                c.wait(DEFAULT_WAIT)?
            }
            if a.initiator == 0 {
                if relaxed {
                    c.relaxed_signal()
                } else {
                    c.signal()
                }
            }
        }
    }
    Ok(())
}
