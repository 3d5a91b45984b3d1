//! A range of several mappings on the host backend: what a virtual-memory allocator makes on a
//! GPU (PyTorch's expandable segments map pieces into one reserved range), made of the host
//! backend's own shared-memory mappings, so that the whole stack's handling of such ranges runs
//! in CI without a GPU.
//!
//! The range is reserved first (inaccessible anonymous memory), then each piece is a memfd
//! mapping placed over its part. Each piece is a live mapping of its own, so
//! [`crate::memory::allocation_range`] names the piece, exactly as a GPU runtime names one
//! mapping of a virtual range.

use mscclpp_hal::{Allocation, BackendKind, DevicePtr, Error, MemoryKind, Result};
use rustix::mm::{MapFlags, ProtFlags};

use crate::memory::ShmAllocation;

/// The host backend's mapping granularity: pieces are whole pages.
pub const PIECE_ALIGN: usize = 4096;

/// `count` pieces mapped back to back into one reserved range.
#[derive(Debug)]
pub struct PiecesAllocation {
    /// In address order; their mappings cover the whole range, so dropping them (each unmaps
    /// its own part) releases the reservation too.
    pieces: Vec<ShmAllocation>,
    ptr: *mut u8,
    len: usize,
    device: usize,
}

// SAFETY: as for `ShmAllocation`: plain shared memory owned by this value until drop.
unsafe impl Send for PiecesAllocation {}
// SAFETY: as above; `&PiecesAllocation` only hands out the address.
unsafe impl Sync for PiecesAllocation {}

impl PiecesAllocation {
    /// Maps `count` zero-filled pieces of `piece_bytes` (rounded up to whole pages) into one
    /// range.
    pub fn new(piece_bytes: usize, count: usize, device: usize) -> Result<Self> {
        let piece = piece_bytes
            .checked_next_multiple_of(PIECE_ALIGN)
            .filter(|&p| p > 0);
        let total = piece
            .and_then(|p| p.checked_mul(count))
            .filter(|&t| count > 0 && t <= crate::memory::MAX_ALLOCATION);
        let (Some(piece), Some(total)) = (piece, total) else {
            return Err(Error::invalid(format!(
                "a range of {count} pieces of {piece_bytes} bytes: the host backend maps 1 to \
                 {} bytes in at least one piece of at least 1 byte",
                crate::memory::MAX_ALLOCATION
            )));
        };
        // SAFETY: a fresh private reservation of address space; no existing memory is affected.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| {
            Error::io(
                format!("reserving {total} bytes of address space"),
                e.into(),
            )
        })?
        .cast::<u8>();
        let mut pieces = Vec::with_capacity(count);
        for i in 0..count {
            let at = base.wrapping_add(i * piece);
            // SAFETY: `at..at + piece` lies in the reservation made above, which nothing else
            // uses; each piece gets its own part.
            match unsafe { ShmAllocation::new_at(piece, device, at) } {
                Ok(p) => pieces.push(p),
                Err(e) => {
                    // The pieces mapped so far unmap their parts when dropped; the rest of the
                    // reservation is released here.
                    drop(pieces);
                    // SAFETY: the part of the reservation no piece took; nothing uses it.
                    if let Err(u) = unsafe { rustix::mm::munmap(at.cast(), total - i * piece) } {
                        tracing::warn!("releasing reserved address space: {u}");
                    }
                    return Err(e.with_context(|| format!("mapping piece {i} of {count}")));
                }
            }
        }
        Ok(PiecesAllocation {
            pieces,
            ptr: base,
            len: total,
            device,
        })
    }

    /// How many mappings the range is made of.
    pub fn pieces(&self) -> usize {
        self.pieces.len()
    }
}

impl Allocation for PiecesAllocation {
    fn backend(&self) -> BackendKind {
        BackendKind::Host
    }
    fn device_ordinal(&self) -> usize {
        self.device
    }
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.ptr)
    }
    fn is_imported(&self) -> bool {
        false
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::allocation_range;

    #[test]
    fn each_piece_is_its_own_mapping_and_the_range_is_one_memory() {
        let a = PiecesAllocation::new(5000, 3, 0).unwrap();
        assert_eq!(a.pieces(), 3);
        assert_eq!(a.len(), 3 * 8192);
        let base = a.device_ptr().0;
        // The runtime's answer names the piece, not the range.
        assert_eq!(
            allocation_range(DevicePtr(base + 8192 + 10)),
            Some((DevicePtr(base + 8192), 8192))
        );
        // Every byte is writable through the one pointer, across the boundaries.
        let p = a.host_ptr().unwrap();
        // SAFETY: `p` holds `a.len()` bytes of shared memory that only this test uses.
        let all = unsafe { std::slice::from_raw_parts_mut(p, a.len()) };
        for (i, b) in all.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert!(all.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        drop(a);
        assert_eq!(allocation_range(DevicePtr(base + 8192 + 10)), None);
    }

    #[test]
    fn empty_or_oversized_ranges_are_refused() {
        assert!(PiecesAllocation::new(4096, 0, 0).is_err());
        assert!(PiecesAllocation::new(0, 2, 0).is_err());
        assert!(PiecesAllocation::new(1 << 40, 2, 0).is_err());
    }
}
