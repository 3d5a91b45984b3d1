//! Semaphores: monotonically increasing 64-bit tokens in device memory, never reset — which is
//! what makes kernels that use them replayable (CUDA graphs): every launch continues the count.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{atomic_u64, spin_until};
use crate::error::Result;

/// Device side of a semaphore signalled by the host (through the proxy's `update_and_sync`)
/// and waited on by the device.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Host2DeviceSemaphoreDeviceHandle {
    /// Address of the token the signaller advances (in this device's memory).
    pub inbound_token: u64,
    /// Address of the count of waits completed so far (device memory, persists across launches).
    pub expected_inbound_token: u64,
}

impl Host2DeviceSemaphoreDeviceHandle {
    /// Consumes one signal if it has arrived; returns whether it had.
    ///
    /// # Safety
    /// Both addresses must be live, 8-byte aligned and only accessed atomically; one thread
    /// waits on a semaphore at a time.
    pub unsafe fn poll(&self) -> bool {
        // SAFETY: caller's contract.
        unsafe { poll_inbound(self.inbound_token, self.expected_inbound_token) }
    }

    /// Waits for the next signal, at most `timeout`.
    ///
    /// # Safety
    /// As for [`Self::poll`].
    pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe {
            wait_inbound(
                self.inbound_token,
                self.expected_inbound_token,
                Ordering::Acquire,
                timeout,
                "host-to-device",
            )
        }
    }
}

/// Device side of a semaphore between two devices that map each other's memory: the signaller
/// stores its advanced outbound count straight into the peer's inbound token.
///
/// One thread signals and one thread waits per direction at a time.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryDevice2DeviceSemaphoreDeviceHandle {
    /// Address of this side's inbound token (the peer writes it).
    pub inbound_token: u64,
    /// Address of this side's count of signals sent.
    pub outbound_token: u64,
    /// The peer's inbound token, mapped here.
    pub remote_inbound_token: u64,
    /// Address of the count of waits completed so far.
    pub expected_inbound_token: u64,
}

impl MemoryDevice2DeviceSemaphoreDeviceHandle {
    /// Signals the peer; every write this thread made before is visible to the peer once it
    /// sees the signal (release).
    ///
    /// # Safety
    /// All four addresses must be live, 8-byte aligned and only accessed atomically.
    pub unsafe fn signal(&self) {
        // SAFETY: caller's contract.
        unsafe { self.signal_with(Ordering::Release) }
    }

    /// Signals without ordering earlier writes (for signals that guard nothing, or whose data
    /// is ordered by other means).
    ///
    /// # Safety
    /// As for [`Self::signal`].
    pub unsafe fn relaxed_signal(&self) {
        // SAFETY: caller's contract.
        unsafe { self.signal_with(Ordering::Relaxed) }
    }

    unsafe fn signal_with(&self, order: Ordering) {
        // SAFETY: caller's contract.
        let (outbound, remote) = unsafe {
            (
                atomic_u64(self.outbound_token),
                atomic_u64(self.remote_inbound_token),
            )
        };
        let v = outbound.load(Ordering::Relaxed) + 1;
        outbound.store(v, Ordering::Relaxed);
        remote.store(v, order);
    }

    /// Consumes one signal if it has arrived; returns whether it had.
    ///
    /// # Safety
    /// As for [`Self::signal`].
    pub unsafe fn poll(&self) -> bool {
        // SAFETY: caller's contract.
        unsafe { poll_inbound(self.inbound_token, self.expected_inbound_token) }
    }

    /// Waits for the next signal (acquire: the peer's writes before it are visible after).
    ///
    /// # Safety
    /// As for [`Self::signal`].
    pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe { self.wait_with(Ordering::Acquire, timeout) }
    }

    /// Waits for the next signal without acquiring the peer's earlier writes.
    ///
    /// # Safety
    /// As for [`Self::signal`].
    pub unsafe fn relaxed_wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe { self.wait_with(Ordering::Relaxed, timeout) }
    }

    unsafe fn wait_with(&self, order: Ordering, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe {
            wait_inbound(
                self.inbound_token,
                self.expected_inbound_token,
                order,
                timeout,
                "device-to-device",
            )
        }
    }
}

/// The waiting side every semaphore shares: an inbound token the signaller advances and the
/// count of waits completed so far. Consumes one signal if it has arrived.
///
/// # Safety
/// Both addresses must be live, 8-byte aligned and only accessed atomically; one thread waits on
/// a semaphore at a time.
unsafe fn poll_inbound(inbound: u64, expected: u64) -> bool {
    // SAFETY: caller's contract.
    let (inbound, expected) = unsafe { (atomic_u64(inbound), atomic_u64(expected)) };
    let next = expected.load(Ordering::Relaxed) + 1;
    if inbound.load(Ordering::Acquire) >= next {
        expected.store(next, Ordering::Relaxed);
        true
    } else {
        false
    }
}

/// Waits (at most `timeout`) for the next signal of the pair of [`poll_inbound`], loading the
/// token with `order`; `kind` names the semaphore in the timeout error.
///
/// # Safety
/// As for [`poll_inbound`].
unsafe fn wait_inbound(
    inbound: u64,
    expected: u64,
    order: Ordering,
    timeout: Duration,
    kind: &str,
) -> Result<()> {
    // SAFETY: caller's contract.
    let (inbound, expected) = unsafe { (atomic_u64(inbound), atomic_u64(expected)) };
    let next = expected.load(Ordering::Relaxed) + 1;
    expected.store(next, Ordering::Relaxed);
    spin_until(
        timeout,
        || {
            format!(
                "{kind} semaphore to reach {next} (it is at {})",
                inbound.load(Ordering::Relaxed)
            )
        },
        || inbound.load(order) >= next,
    )
}
