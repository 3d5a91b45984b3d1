//! The host side of the proxy FIFO: the memory and the consumer operations.
//!
//! The protocol is the one of [`mscclpp_hal::dev::fifo`]: producers (device code, or host
//! threads standing in for it) claim positions with an atomic add on `head` and publish each
//! 16-byte trigger with a lap-parity bit; the one consumer reads them in order and advances
//! `tail`. This module owns the three pieces of host-mapped memory and the consumer half.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mscclpp_hal::dev::{FifoDeviceHandle, ProxyTrigger};
use mscclpp_hal::{Device, DeviceBuffer, Error, MemoryKind, Result};

/// Most slots a FIFO may have (2^20, 16 MiB of triggers): far more than the in-flight requests
/// of any kernel, and small enough that the size fits the device handle's `u32`.
pub const MAX_FIFO_SIZE: usize = 1 << 20;

/// Slots of the FIFO MSCCL++ uses by default.
pub const DEFAULT_FIFO_SIZE: usize = 512;

/// One slot as the consumer sees it: the two words of a [`ProxyTrigger`], accessed atomically
/// because producers write them concurrently.
#[repr(C, align(16))]
struct Slot {
    fst: AtomicU64,
    snd: AtomicU64,
}

/// A proxy FIFO: a ring of [`ProxyTrigger`] slots plus `head` and `tail` words, all in
/// host-mapped memory of one device.
///
/// Producers use the [`FifoDeviceHandle`] from [`Fifo::device_handle`]; the consumer (normally
/// a [`super::Proxy`]) uses [`Fifo::poll`] and [`Fifo::pop`]. There must be one consumer at a
/// time: [`super::Proxy::start`] refuses a FIFO that already has a running proxy, but nothing
/// stops other code calling `poll`/`pop` alongside one, which would hand triggers out of order.
///
/// The memory lives as long as the `Fifo`: device handles and imported mappings of its buffers
/// must not be used after it is dropped (share it through an `Arc` with whatever outlives the
/// kernels that push into it).
pub struct Fifo {
    triggers: DeviceBuffer,
    head: DeviceBuffer,
    tail: DeviceBuffer,
    ring: NonNull<Slot>,
    head_word: NonNull<AtomicU64>,
    tail_word: NonNull<AtomicU64>,
    size: u64,
    mask: u64,
    /// Whether a proxy is consuming this FIFO now.
    consumer: AtomicBool,
}

// SAFETY: the pointers point into the buffers the `Fifo` owns (kept alive with it) and every
// access through them is atomic, so the FIFO may be moved to and shared between threads.
unsafe impl Send for Fifo {}
// SAFETY: as above: shared access is only ever atomic loads and stores.
unsafe impl Sync for Fifo {}

impl std::fmt::Debug for Fifo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fifo")
            .field("size", &self.size)
            .field("tail", &self.tail())
            .field("triggers", &self.triggers.ptr())
            .field("head", &self.head.ptr())
            .field("tail_word", &self.tail.ptr())
            .finish()
    }
}

/// The host address of `buf`, checked for the alignment the FIFO needs.
fn host_word(buf: &DeviceBuffer, what: &str, align: usize) -> Result<NonNull<u8>> {
    let p = buf.host_ptr().ok_or_else(|| {
        Error::unavailable(
            format!("host access to {what} of the proxy FIFO"),
            format!(
                "the {} backend gave host-mapped memory without a host pointer",
                buf.backend()
            ),
        )
    })?;
    let p = NonNull::new(p).ok_or_else(|| {
        Error::Internal(format!(
            "the {} backend gave a null host pointer for {what}",
            buf.backend()
        ))
    })?;
    if p.as_ptr() as usize % align != 0 {
        return Err(Error::Internal(format!(
            "the {} backend gave {what} at host address {:p}, not {align}-byte aligned",
            buf.backend(),
            p
        )));
    }
    Ok(p)
}

impl Fifo {
    /// Allocates a FIFO of `size` slots (a power of two, at most [`MAX_FIFO_SIZE`]) in
    /// host-mapped memory of `device`, zeroed (an empty ring).
    ///
    /// Fails with `Error::Unavailable` when the backend's host-mapped memory has no host
    /// pointer (the proxy could not read it).
    pub fn new(device: &Arc<dyn Device>, size: usize) -> Result<Fifo> {
        if size == 0 || !size.is_power_of_two() || size > MAX_FIFO_SIZE {
            return Err(Error::invalid(format!(
                "proxy FIFO of {size} slots: the size must be a power of two from 1 to {MAX_FIFO_SIZE}"
            )));
        }
        // Three allocations rather than one: `head` is hammered by producers and `tail` by the
        // proxy, and separate allocations keep them off each other's (and the ring's) cache
        // lines; it also lets each be exported on its own.
        let triggers = device.alloc(size * size_of::<Slot>(), MemoryKind::HostMapped)?;
        let head = device.alloc(size_of::<u64>(), MemoryKind::HostMapped)?;
        let tail = device.alloc(size_of::<u64>(), MemoryKind::HostMapped)?;
        let ring = host_word(&triggers, "the trigger ring", align_of::<Slot>())?;
        let head_word = host_word(&head, "the head word", align_of::<u64>())?;
        let tail_word = host_word(&tail, "the tail word", align_of::<u64>())?;
        // SAFETY: each pointer is the start of an allocation of at least the bytes written
        // (checked sizes above), aligned (checked), and nobody else can reach the memory yet:
        // no handle has been given out. Allocations' contents are unspecified, hence the zeros.
        unsafe {
            std::ptr::write_bytes(ring.as_ptr(), 0, size * size_of::<Slot>());
            std::ptr::write_bytes(head_word.as_ptr(), 0, size_of::<u64>());
            std::ptr::write_bytes(tail_word.as_ptr(), 0, size_of::<u64>());
        }
        Ok(Fifo {
            triggers,
            head,
            tail,
            ring: ring.cast(),
            head_word: head_word.cast(),
            tail_word: tail_word.cast(),
            size: size as u64,
            mask: size as u64 - 1,
            consumer: AtomicBool::new(false),
        })
    }

    /// What producers use to push into this FIFO (device addresses).
    ///
    /// The handle must not be used after the `Fifo` is dropped.
    pub fn device_handle(&self) -> FifoDeviceHandle {
        FifoDeviceHandle {
            triggers: self.triggers.ptr().0,
            head: self.head.ptr().0,
            tail: self.tail.ptr().0,
            // `size <= MAX_FIFO_SIZE` (checked in `new`), so it fits.
            size: self.size as u32,
            _pad: 0,
        }
    }

    /// Number of slots.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// Positions claimed by producers so far (published or about to be).
    pub fn head(&self) -> u64 {
        // SAFETY: the head word is an aligned, live (owned by `self`) 8-byte word that is only
        // accessed atomically.
        unsafe { self.head_word.as_ref() }.load(Ordering::Acquire)
    }

    /// Positions handled so far: the position of the next trigger the consumer will take.
    pub fn tail(&self) -> u64 {
        self.tail_ref().load(Ordering::Acquire)
    }

    /// The trigger at the tail, without its parity bit, if it has been published.
    ///
    /// Consumer-side: call from the one consumer only (see the type's documentation).
    pub fn poll(&self) -> Option<ProxyTrigger> {
        // Only the consumer writes `tail`, so its own last store is what a relaxed load sees.
        self.poll_at(self.tail_ref().load(Ordering::Relaxed))
    }

    /// Marks the trigger at the tail handled, freeing its slot and releasing `sync` waiters.
    ///
    /// Consumer-side, and only after [`Fifo::poll`] returned a trigger: advancing past an
    /// unpublished position lets its producer's write land on a slot the consumer has passed.
    pub fn pop(&self) {
        let t = self.tail_ref().load(Ordering::Relaxed);
        self.pop_to(t + 1);
    }

    /// The buffer holding the ring of `size` 16-byte slots (to export it to another process).
    pub fn triggers_buffer(&self) -> &DeviceBuffer {
        &self.triggers
    }

    /// The buffer holding the 8-byte `head` word.
    pub fn head_buffer(&self) -> &DeviceBuffer {
        &self.head
    }

    /// The buffer holding the 8-byte `tail` word.
    pub fn tail_buffer(&self) -> &DeviceBuffer {
        &self.tail
    }

    /// The trigger at position `pos` if published; `pos` must be the consumer's tail.
    #[inline]
    pub(crate) fn poll_at(&self, pos: u64) -> Option<ProxyTrigger> {
        // SAFETY: `pos & mask < size`, the ring holds `size` slots, and `self` keeps it mapped.
        let slot = unsafe { &*self.ring.as_ptr().add((pos & self.mask) as usize) };
        // Acquire pairs with the producer's release store of `snd`, so `fst` (written before
        // it) is visible; the producer of the next lap cannot touch the slot before our `pop`.
        let snd = slot.snd.load(Ordering::Acquire);
        if !ProxyTrigger::is_published(snd, pos, self.size) {
            return None;
        }
        let fst = slot.fst.load(Ordering::Relaxed);
        Some(ProxyTrigger { fst, snd }.without_parity())
    }

    /// Publishes `tail = new_tail`.
    #[inline]
    pub(crate) fn pop_to(&self, new_tail: u64) {
        // Release: our reads of the slot happen before a producer, seeing the new tail,
        // overwrites it; and the handler's effects happen before `sync` returns.
        self.tail_ref().store(new_tail, Ordering::Release);
    }

    /// Claims the consumer role; false if a proxy already holds it.
    pub(crate) fn claim_consumer(&self) -> bool {
        self.consumer
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the consumer role back.
    pub(crate) fn release_consumer(&self) {
        self.consumer.store(false, Ordering::Release);
    }

    fn tail_ref(&self) -> &AtomicU64 {
        // SAFETY: the tail word is an aligned, live (owned by `self`) 8-byte word that is only
        // accessed atomically.
        unsafe { self.tail_word.as_ref() }
    }
}
