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

/// `MSCCLPP_HOST_WAIT`: seconds a device-side wait on the host backend may spin at most
/// (default [`DEFAULT_WAIT`]); what jobs and tests that diagnose hangs lower. Read once.
pub fn host_wait() -> Result<Duration> {
    static WAIT: std::sync::OnceLock<std::result::Result<Duration, String>> =
        std::sync::OnceLock::new();
    WAIT.get_or_init(|| {
        match crate::env::parse::<f64>("MSCCLPP_HOST_WAIT", "seconds (a number above 0)") {
            Ok(None) => Ok(DEFAULT_WAIT),
            Ok(Some(s)) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
            Ok(Some(s)) => Err(format!(
                "environment variable MSCCLPP_HOST_WAIT={s} is malformed: expected seconds above 0"
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .clone()
    .map_err(Error::invalid)
}

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

/// The value of a communicator's abort word once it was aborted locally (`ncclCommAbort`);
/// `r + 1` means rank `r` died, 0 that the communicator is live.
pub const ABORTED_LOCALLY: u64 = u64::MAX;

thread_local! {
    /// Device address of the abort word the waits of this thread poll (0: none). Host kernels
    /// run on stream workers and grid threads, not on the thread that launched them: the
    /// backend captures the launching thread's word at launch ([`current_abort`]) and installs
    /// it around the kernel ([`abort_scope`]); [`for_each_block`] hands it to its block threads.
    static ABORT_WORD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Restores the previous abort word of the thread when dropped.
#[derive(Debug)]
pub struct AbortScope {
    prev: u64,
}

impl Drop for AbortScope {
    fn drop(&mut self) {
        ABORT_WORD.with(|w| w.set(self.prev));
    }
}

/// Makes every [`spin_until`] of this thread poll the 8-byte abort word at device address
/// `addr` (0: none) until the returned guard is dropped.
///
/// The word must stay allocated, in host-visible memory of this process, for as long as the
/// guard lives and any kernel launched under it runs: a communicator's word lives as long as
/// the communicator, and launches hold the communicator.
pub fn abort_scope(addr: u64) -> AbortScope {
    let prev = ABORT_WORD.with(|w| w.replace(addr));
    AbortScope { prev }
}

/// The abort word this thread's waits poll (0: none): what a backend captures at launch.
pub fn current_abort() -> u64 {
    ABORT_WORD.with(|w| w.get())
}

/// The error a wait returns when the abort word it polls holds `v` (non-zero).
pub fn abort_error(v: u64, what: &str) -> Error {
    if v == ABORTED_LOCALLY {
        Error::invalid(format!(
            "the communicator was aborted (ncclCommAbort or Communicator::abort) while waiting for {what}"
        ))
    } else {
        Error::Remote {
            rank: (v - 1) as usize,
            message: format!("died while this rank waited for {what}"),
        }
    }
}

/// Fails with the abort error when this thread's abort word ([`abort_scope`]) is set: for
/// kernels' own polling loops that do not go through [`spin_until`].
pub fn check_abort(what: impl Fn() -> String) -> Result<()> {
    match abort_value(current_abort()) {
        0 => Ok(()),
        v => Err(abort_error(v, &what())),
    }
}

/// Reads the abort word at `addr` (0: none; 0 is returned then).
fn abort_value(addr: u64) -> u64 {
    if addr == 0 {
        return 0;
    }
    // SAFETY: a non-zero address was installed by `abort_scope`, whose contract keeps an
    // aligned word of host-visible memory alive while waits of this thread can read it; the
    // word is only written atomically.
    unsafe { atomic_u64(addr) }.load(Ordering::Acquire)
}

/// Spins (then yields) until `done()` holds or `timeout` passes; `what` names the wait (a
/// [`Error::Timeout`] then). Host-side waits of the backends' reference kernels use it too.
///
/// It also polls the thread's abort word ([`abort_scope`]) every few dozen spins: once a
/// peer is known dead (or the communicator was aborted) the wait ends with an error naming
/// that rank instead of running to its timeout.
pub fn spin_until(
    timeout: Duration,
    what: impl Fn() -> String,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let timeout = timeout.min(host_wait()?);
    let mut spins = 0u32;
    let start = Instant::now();
    let abort = current_abort();
    loop {
        if done() {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        if spins % 64 == 0 {
            let v = abort_value(abort);
            if v != 0 {
                return Err(abort_error(v, &what()));
            }
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
    let abort = current_abort();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let _abort = abort_scope(abort);
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
