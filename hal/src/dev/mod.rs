//! Device-visible layouts and their device-side operations.
//!
//! Every struct a kernel reads or writes — semaphore and channel handles, FIFO triggers, LL
//! packets — is defined here once, `#[repr(C)]`, with addresses as `u64` device pointers. The
//! device headers (`kernels/include/mscclpp/`, compiled for CUDA and, with HIP's own
//! `core.cuh`, for HIP) mirror these definitions; [`layout_table`] lists every size and field
//! offset so that a generated header can `static_assert` them, and CI compiles that header for
//! each vendor. Owners of kernels check their argument structs the same way ([`layout`]).
//!
//! The methods on the handles are the **device-side operations for host-backend kernels**: the
//! same semantics as the `.cuh` functions, carried out with Rust atomics on shared memory. They
//! are `unsafe` because they dereference the device addresses inside the handles; a handle
//! made by the communication layer for the host backend satisfies their contracts. Waits take
//! a deadline: on a CPU a missing peer must become an error, not a spinning thread.

pub mod fifo;
pub mod layout;
pub mod memory_channel;
pub mod packet;
pub mod port_channel;
pub mod semaphore;
pub mod switch_channel;

pub use fifo::{FifoDeviceHandle, ProxyTrigger, TriggerType};
pub use layout::{LayoutEntry, layout_table};
pub use memory_channel::{BaseMemoryChannelDeviceHandle, MemoryChannelDeviceHandle};
pub use packet::{LL8Packet, LL16Packet};
pub use port_channel::PortChannelDeviceHandle;
pub use semaphore::{Host2DeviceSemaphoreDeviceHandle, MemoryDevice2DeviceSemaphoreDeviceHandle};
pub use switch_channel::SwitchChannelDeviceHandle;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::kernel::LaunchConfig;

/// How long device-side waits on the host backend spin before giving up (one minute: far
/// beyond any legitimate wait between live ranks).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// The atomic 64-bit word at a device address.
///
/// # Safety
/// `addr` must be an 8-byte aligned address of live memory in this process that is only
/// accessed atomically while the returned reference is used.
pub(crate) unsafe fn atomic_u64<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: forwarded contract.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// The atomic 64-bit word at a device address, for backends' kernels.
///
/// # Safety
/// As for the crate-internal `atomic_u64`: an 8-byte aligned address of live memory in this
/// process, only accessed atomically while the reference is used.
pub unsafe fn atomic_u64_at<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: forwarded contract.
    unsafe { atomic_u64(addr) }
}

/// Spins (then yields) until `done()` holds or `timeout` passes; `what` names the wait (a
/// [`Error::Timeout`] then). Host-side waits of the backends' reference kernels use it too.
pub fn spin_until(
    timeout: Duration,
    what: impl Fn() -> String,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let mut spins = 0u32;
    let start = Instant::now();
    loop {
        if done() {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        if spins % 64 == 0 {
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    waiting_for: what(),
                    after: timeout,
                });
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Runs `body(block_index)` for every block of the grid of a host kernel, blocks spread over up
/// to one thread per CPU core; returns the first error. (Host kernels live with their owners;
/// this is the grid they all run on.)
///
/// Kernels that synchronise across blocks need every block resident at once; they must keep
/// their grid within [`std::thread::available_parallelism`] blocks.
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
