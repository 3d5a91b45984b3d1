//! Memory channels: peer-to-peer over mapped memory, the device itself moving the data.

use std::time::Duration;

use super::MemoryDevice2DeviceSemaphoreDeviceHandle;
use super::packet::{PacketKind, put_packets, thread_share, unpack_packets};
use crate::error::{Error, Result};

/// Signal/wait only, between two devices that map each other's memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BaseMemoryChannelDeviceHandle {
    /// The semaphore the channel signals and waits on.
    pub semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle,
}

/// A memory channel: the peer's registered memory (`dst`) is mapped here, with a local source
/// (`src`) and a local packet buffer the peer writes packets into.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryChannelDeviceHandle {
    /// The semaphore.
    pub semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle,
    /// The peer's memory, mapped here.
    pub dst: u64,
    /// Local source memory.
    pub src: u64,
    /// Local packet buffer (written by the peer's `put_packets`), or 0.
    pub packet_buffer: u64,
}

/// Copies thread `tid`'s share of `bytes` from `src` to `dst` in 16-byte units (then the tail).
///
/// # Safety
/// Both ranges must be live and not overlap.
unsafe fn copy_share(dst: u64, src: u64, bytes: usize, tid: usize, nthreads: usize) {
    let units = bytes / 16;
    let r = thread_share(units, tid, nthreads);
    // SAFETY: the share lies within `bytes` of both ranges (caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(
            (src + (r.start * 16) as u64) as *const u8,
            (dst + (r.start * 16) as u64) as *mut u8,
            r.len() * 16,
        );
    }
    // The last thread takes the bytes that do not fill a 16-byte unit.
    if tid + 1 == nthreads.max(1) && bytes % 16 != 0 {
        let done = units * 16;
        // SAFETY: as above; `done..bytes` is within both ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (src + done as u64) as *const u8,
                (dst + done as u64) as *mut u8,
                bytes - done,
            );
        }
    }
}

/// The signalling half of a channel handle: the semaphore's five operations, forwarded. Both
/// handles carry them (a memory channel is a base channel plus its buffers); written once here.
macro_rules! semaphore_forwarders {
    () => {
        /// Signals the peer (release).
        ///
        /// # Safety
        /// The semaphore's addresses must be live (see
        /// [`MemoryDevice2DeviceSemaphoreDeviceHandle`]).
        pub unsafe fn signal(&self) {
            // SAFETY: caller's contract.
            unsafe { self.semaphore.signal() }
        }
        /// Signals without ordering earlier writes.
        ///
        /// # Safety
        /// As for [`Self::signal`].
        pub unsafe fn relaxed_signal(&self) {
            // SAFETY: caller's contract.
            unsafe { self.semaphore.relaxed_signal() }
        }
        /// Waits for the peer's next signal (acquire).
        ///
        /// # Safety
        /// As for [`Self::signal`].
        pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
            // SAFETY: caller's contract.
            unsafe { self.semaphore.wait(timeout) }
        }
        /// Waits without acquiring.
        ///
        /// # Safety
        /// As for [`Self::signal`].
        pub unsafe fn relaxed_wait(&self, timeout: Duration) -> Result<()> {
            // SAFETY: caller's contract.
            unsafe { self.semaphore.relaxed_wait(timeout) }
        }
        /// Consumes a signal if one has arrived.
        ///
        /// # Safety
        /// As for [`Self::signal`].
        pub unsafe fn poll(&self) -> bool {
            // SAFETY: caller's contract.
            unsafe { self.semaphore.poll() }
        }
    };
}

impl BaseMemoryChannelDeviceHandle {
    semaphore_forwarders!();
}

impl MemoryChannelDeviceHandle {
    /// The signalling part of the channel.
    pub fn base(&self) -> BaseMemoryChannelDeviceHandle {
        BaseMemoryChannelDeviceHandle {
            semaphore: self.semaphore,
        }
    }

    semaphore_forwarders!();

    /// Copies `bytes` from local `src + src_off` to the peer's `dst + dst_off`; thread `tid` of
    /// `nthreads` copies its share.
    ///
    /// # Safety
    /// Both ranges must lie within the registered memories the handle was built from.
    pub unsafe fn put(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: usize,
        tid: usize,
        nthreads: usize,
    ) {
        // SAFETY: caller's contract.
        unsafe { copy_share(self.dst + dst_off, self.src + src_off, bytes, tid, nthreads) }
    }

    /// Copies `bytes` from the peer's `dst + remote_off` to local `src + local_off`.
    ///
    /// # Safety
    /// As for [`Self::put`].
    pub unsafe fn get(
        &self,
        remote_off: u64,
        local_off: u64,
        bytes: usize,
        tid: usize,
        nthreads: usize,
    ) {
        // SAFETY: caller's contract.
        unsafe {
            copy_share(
                self.src + local_off,
                self.dst + remote_off,
                bytes,
                tid,
                nthreads,
            )
        }
    }

    /// Writes one element into the peer's memory at element index `index`.
    ///
    /// # Safety
    /// The element must lie within the peer's registered memory and be aligned for `T`.
    pub unsafe fn write<T: Copy>(&self, index: usize, value: T) {
        // SAFETY: caller's contract.
        unsafe { std::ptr::write_volatile((self.dst as *mut T).add(index), value) }
    }

    /// Reads one element of the peer's memory at element index `index`.
    ///
    /// # Safety
    /// As for [`Self::write`].
    pub unsafe fn read<T: Copy>(&self, index: usize) -> T {
        // SAFETY: caller's contract.
        unsafe { std::ptr::read_volatile((self.dst as *const T).add(index)) }
    }

    /// Writes `bytes` of local data at `src + src_off` as packets with `flag` into the peer's
    /// memory at `dst + dst_off` (a packet area: `bytes * 2` bytes).
    ///
    /// # Safety
    /// As for [`Self::put`], with the peer's range `bytes * 2` long.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_packets(
        &self,
        kind: PacketKind,
        dst_off: u64,
        src_off: u64,
        bytes: usize,
        flag: u32,
        tid: usize,
        nthreads: usize,
    ) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe {
            put_packets(
                kind,
                self.dst + dst_off,
                self.src + src_off,
                bytes,
                flag,
                tid,
                nthreads,
            )
        }
    }

    /// Reads packets with `flag` from the local packet buffer at `packet_off` into local data at
    /// `src + src_off`, waiting for each.
    ///
    /// # Safety
    /// As for [`Self::put`], for the local packet buffer and source.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn unpack_packets(
        &self,
        kind: PacketKind,
        src_off: u64,
        packet_off: u64,
        bytes: usize,
        flag: u32,
        tid: usize,
        nthreads: usize,
        timeout: Duration,
    ) -> Result<()> {
        if self.packet_buffer == 0 {
            return Err(Error::invalid(
                "unpack_packets on a channel without a packet buffer",
            ));
        }
        // SAFETY: caller's contract.
        unsafe {
            unpack_packets(
                kind,
                self.src + src_off,
                self.packet_buffer + packet_off,
                bytes,
                flag,
                tid,
                nthreads,
                timeout,
            )
        }
    }
}
