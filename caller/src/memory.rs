//! Caller memory wrapped once per communicator.
//!
//! Wrapping a caller's pointer costs a driver query on GPUs (the range must be runtime memory)
//! and an allocation for the buffer's description. Steady-state callers — a training step, a
//! benchmark loop — pass the same few buffers on every call, so the wrappers are kept: a call
//! whose pointer and length were wrapped before reuses that wrapper, which needs neither the
//! driver nor the allocator.
//!
//! Not every caller passes the same pointers, though: a framework's caching allocator carves
//! tensors out of a few large segments, and nccl-tests moves its buffers by the message size on
//! every iteration (thousands of distinct pointers at small sizes). So the cache also keeps the
//! allocations the driver named for the ranges it checked ([`Device::allocation_range`]; several
//! mappings back to back count as one, see [`mscclpp_hal::mapped`]): a call's new range inside
//! one of them is a slice of that memory, with neither a driver query nor an allocation; a
//! buffer of exactly the range (registration) costs one allocation.
//!
//! A wrapper only describes the range (it owns nothing and holds no driver state), so a kept
//! one stays right for any memory later allocated at the same address. What keeping it skips is
//! the check that the range is still runtime memory: a call on memory freed since is then not
//! refused with a message but reaches the device, as it would with NCCL, which never checks.
//! The same holds for a range inside a kept allocation. Frees the library sees
//! ([`memory_freed`]: `ncclMemFree`, the Python package's buffers) drop every kept wrapper and
//! allocation, so those pointers are checked again; `MSCCLPP_WRAP_CACHE=0` checks every call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_hal::{
    BufferSlice, Device, DeviceBuffer, DevicePtr, Error, ExternalAllocation, Result,
};
use std::sync::Arc;

/// Wrappers one communicator keeps: enough for the buffers of a step (inputs, outputs, the
/// buckets of a data-parallel step); the least recently used goes first.
pub const WRAP_CACHE_ENTRIES: usize = 32;

/// Allocations one communicator keeps (the least recently used goes first).
pub const WRAP_CACHE_ALLOCATIONS: usize = 16;

/// The variable that turns the cache off (`0`).
pub const WRAP_CACHE_VAR: &str = "MSCCLPP_WRAP_CACHE";

/// Frees of memory the front ends made, so far; a cache that saw fewer forgets its wrappers.
static FREES: AtomicU64 = AtomicU64::new(0);

/// Tells every communicator's cache that memory the library allocated was freed: each drops its
/// wrappers at its next call, so a pointer into the freed memory is checked again.
pub fn memory_freed() {
    FREES.fetch_add(1, Ordering::AcqRel);
}

#[derive(Debug)]
struct Entry {
    ptr: u64,
    len: usize,
    buffer: DeviceBuffer,
    last_use: u64,
}

/// An allocation the driver named for a range it checked.
#[derive(Debug)]
struct Span {
    /// The whole allocation, described (not owned): calls take slices of it.
    buffer: DeviceBuffer,
    last_use: u64,
}

/// What [`WrapCache::find`] found.
enum Found {
    /// A wrapper of exactly the range.
    Wrapper(DeviceBuffer),
    /// The range, inside a kept allocation.
    InAllocation(BufferSlice),
}

/// Keeps `buffer` as the wrapper of (`ptr`, `bytes`), in place of the least recently used one.
fn keep(k: &mut Kept, ptr: u64, bytes: usize, buffer: &DeviceBuffer) {
    let entry = Entry {
        ptr,
        len: bytes,
        buffer: buffer.clone(),
        last_use: k.clock,
    };
    keep_bounded(&mut k.entries, WRAP_CACHE_ENTRIES, entry, |e| e.last_use);
}

/// Pushes `item` while `kept` holds fewer than `cap`, else puts it in place of the least
/// recently used one.
fn keep_bounded<T>(kept: &mut Vec<T>, cap: usize, item: T, last_use: impl Fn(&T) -> u64) {
    if kept.len() < cap {
        kept.push(item);
    } else if let Some(oldest) = kept.iter_mut().min_by_key(|t| last_use(t)) {
        *oldest = item;
    }
}

impl Span {
    fn holds(&self, ptr: u64, bytes: usize) -> bool {
        inside((self.buffer.ptr().0, self.buffer.len()), ptr, bytes)
    }
}

/// Whether `bytes` at `ptr` lie inside the `len` bytes at `base`.
fn inside((base, len): (u64, usize), ptr: u64, bytes: usize) -> bool {
    ptr >= base
        && (ptr - base)
            .checked_add(bytes as u64)
            .is_some_and(|end| end <= len as u64)
}

#[derive(Debug)]
struct Kept {
    /// At most [`WRAP_CACHE_ENTRIES`]; allocated once, with the cache.
    entries: Vec<Entry>,
    /// At most [`WRAP_CACHE_ALLOCATIONS`]; allocated once, with the cache.
    spans: Vec<Span>,
    /// [`FREES`] when the entries were last known good.
    frees: u64,
    clock: u64,
}

/// One communicator's wrappers of caller memory, by (address, length).
#[derive(Debug)]
pub(crate) struct WrapCache {
    kept: Option<Mutex<Kept>>,
}

impl WrapCache {
    /// An empty cache, or none where [`WRAP_CACHE_VAR`] says `0`.
    pub(crate) fn from_env() -> Result<WrapCache> {
        let on = match std::env::var(WRAP_CACHE_VAR) {
            Err(_) => true,
            Ok(v) => match v.trim() {
                "" | "1" => true,
                "0" => false,
                other => {
                    return Err(Error::invalid(format!(
                        "{WRAP_CACHE_VAR}={other:?}: expected 0 (wrap caller memory on every call) or 1 (keep the wrappers, the default)"
                    )));
                }
            },
        };
        Ok(WrapCache {
            kept: on.then(|| {
                Mutex::new(Kept {
                    entries: Vec::with_capacity(WRAP_CACHE_ENTRIES),
                    spans: Vec::with_capacity(WRAP_CACHE_ALLOCATIONS),
                    frees: FREES.load(Ordering::Acquire),
                    clock: 0,
                })
            }),
        })
    }

    /// The wrapper of `bytes` at `ptr` on `device`: a kept one, or a new one (then kept).
    ///
    /// # Safety
    /// As for [`Device::wrap_external`].
    pub(crate) unsafe fn wrap(
        &self,
        device: &dyn Device,
        ptr: u64,
        bytes: usize,
    ) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        match unsafe { self.find(device, ptr, bytes)? } {
            Found::Wrapper(b) => Ok(b),
            // A buffer of exactly the range (registration, IPC): a wrapper of its own, made
            // without the driver since the range lies inside an allocation it named.
            Found::InAllocation(_) => {
                // SAFETY: forwarded contract; the range lies inside an allocation the device
                // named, so this is the wrapper its `wrap_external` makes once it has checked.
                let a = unsafe { ExternalAllocation::new(device.info(), DevicePtr(ptr), bytes)? };
                let buffer = DeviceBuffer::new(Arc::new(a));
                if let Some(kept) = &self.kept {
                    let mut k = kept.lock().unwrap_or_else(|p| p.into_inner());
                    keep(&mut k, ptr, bytes, &buffer);
                }
                Ok(buffer)
            }
        }
    }

    /// `bytes` at `ptr` on `device` as a slice for a call: of a kept wrapper of the range, or
    /// of a kept allocation that holds it — no driver query and no allocation either way.
    ///
    /// # Safety
    /// As for [`Device::wrap_external`].
    pub(crate) unsafe fn wrap_slice(
        &self,
        device: &dyn Device,
        ptr: u64,
        bytes: usize,
    ) -> Result<BufferSlice> {
        // SAFETY: forwarded contract.
        Ok(match unsafe { self.find(device, ptr, bytes)? } {
            Found::Wrapper(b) => b.into_full(),
            Found::InAllocation(s) => s,
        })
    }

    /// A kept wrapper of the range; else a slice of a kept allocation holding it; else a new
    /// wrapper checked by the device (then kept, with the allocation the device names for it).
    ///
    /// # Safety
    /// As for [`Device::wrap_external`].
    unsafe fn find(&self, device: &dyn Device, ptr: u64, bytes: usize) -> Result<Found> {
        let Some(kept) = &self.kept.as_ref().filter(|_| bytes > 0) else {
            // Off, or an empty range (which the device refuses as it would on every call).
            // SAFETY: forwarded contract.
            return unsafe { device.wrap_external(DevicePtr(ptr), bytes) }.map(Found::Wrapper);
        };
        let mut k = kept.lock().unwrap_or_else(|p| p.into_inner());
        let frees = FREES.load(Ordering::Acquire);
        if frees != k.frees {
            k.entries.clear();
            k.spans.clear();
            k.frees = frees;
        }
        k.clock += 1;
        let now = k.clock;
        if let Some(e) = k
            .entries
            .iter_mut()
            .find(|e| e.ptr == ptr && e.len == bytes)
        {
            e.last_use = now;
            return Ok(Found::Wrapper(e.buffer.clone()));
        }
        if let Some(span) = k.spans.iter_mut().find(|s| s.holds(ptr, bytes)) {
            span.last_use = now;
            let off = (ptr - span.buffer.ptr().0) as usize;
            return span.buffer.slice(off..off + bytes).map(Found::InAllocation);
        }
        // A range seen for the first time: the memory the device names for it — one allocation,
        // or several mappings back to back (a virtual-memory allocator's range, such as
        // PyTorch's expandable segments) — is the check (a driver query per mapping) and is
        // kept; otherwise the device's own check decides and says what is wrong. Memory that
        // cannot be learnt is not kept, and does not fail a range the device accepts.
        let named = mscclpp_hal::mapped::mapped_extent(ptr, bytes, |p| {
            device
                .allocation_range(DevicePtr(p))
                .map(|r| r.map(|(base, len)| (base.0, len)))
        })
        .ok()
        .flatten()
        .map(|e| (DevicePtr(e.base), e.len));
        let buffer = match named {
            Some((base, len)) => {
                // SAFETY: forwarded contract; the device named this allocation and it holds
                // the range, which is what its `wrap_external` checks.
                let a = unsafe { ExternalAllocation::new(device.info(), DevicePtr(ptr), bytes)? };
                // SAFETY: as above: the allocation is described, not owned.
                if let Ok(whole) = unsafe { ExternalAllocation::new(device.info(), base, len) } {
                    let span = Span {
                        buffer: DeviceBuffer::new(Arc::new(whole)),
                        last_use: now,
                    };
                    keep_bounded(&mut k.spans, WRAP_CACHE_ALLOCATIONS, span, |s| s.last_use);
                }
                DeviceBuffer::new(Arc::new(a))
            }
            // SAFETY: forwarded contract.
            None => unsafe { device.wrap_external(DevicePtr(ptr), bytes)? },
        };
        keep(&mut k, ptr, bytes, &buffer);
        Ok(Found::Wrapper(buffer))
    }

    /// How many wrappers are kept (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| {
            k.lock().unwrap_or_else(|p| p.into_inner()).entries.len()
        })
    }

    /// How many allocations are kept (tests).
    #[cfg(test)]
    pub(crate) fn allocations(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| {
            k.lock().unwrap_or_else(|p| p.into_inner()).spans.len()
        })
    }
}
