//! The driver's virtual memory calls, for ranges of several mappings
//! ([`mscclpp_gpu::runtime::Runtime::vmm_map_pieces`]): one reserved range, one physical
//! allocation per piece mapped into it, read-write access for the device — what PyTorch's
//! expandable segments make.

use cudarc::driver::sys;
use mscclpp_gpu::runtime::Pieces;
use mscclpp_hal::{Error, Result};

use crate::driver::check;

/// Device memory of `dev`, no shareable handle (the pieces are never exported).
fn properties(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is a valid value of this plain C struct (no
    // handle types, no flags, a null Windows metadata pointer).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop
}

/// What is mapped so far, released in reverse on an error (and by [`unmap_pieces`]).
struct Partial {
    ptr: u64,
    reserved: usize,
    piece: usize,
    /// (handle, mapped) per piece created.
    handles: Vec<(u64, bool)>,
}

impl Partial {
    fn release(&self) -> Result<()> {
        let mut first = Ok(());
        for (i, &(h, mapped)) in self.handles.iter().enumerate() {
            if mapped {
                // SAFETY: this piece was mapped at this place by `map_pieces`; nothing uses it.
                let r = check("cuMemUnmap", unsafe {
                    sys::cuMemUnmap(self.ptr + (i * self.piece) as u64, self.piece)
                });
                first = first.and(r);
            }
            // SAFETY: `h` came from cuMemCreate and is released once, here.
            first = first.and(check("cuMemRelease", unsafe { sys::cuMemRelease(h) }));
        }
        if self.reserved > 0 {
            // SAFETY: the range came from cuMemAddressReserve with this size; no piece is mapped.
            first = first.and(check("cuMemAddressFree", unsafe {
                sys::cuMemAddressFree(self.ptr, self.reserved)
            }));
        }
        first
    }
}

/// `count` pieces of at least `piece` bytes of device `dev`, back to back in one range.
pub fn map_pieces(dev: sys::CUdevice, piece: usize, count: usize) -> Result<Pieces> {
    let prop = properties(dev);
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and properties.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut gran,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    let piece = piece
        .checked_next_multiple_of(gran.max(1))
        .ok_or_else(|| Error::invalid(format!("pieces of {piece} bytes are too large")))?;
    let total = piece
        .checked_mul(count)
        .ok_or_else(|| Error::invalid(format!("{count} pieces of {piece} bytes are too large")))?;
    let mut p = Partial {
        ptr: 0,
        reserved: 0,
        piece,
        handles: Vec::with_capacity(count),
    };
    let made = (|| {
        // SAFETY: valid out-pointer; any address, default alignment, no flags.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut p.ptr, total, 0, 0, 0)
        })?;
        p.reserved = total;
        for i in 0..count {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer and properties; no flags.
            check("cuMemCreate", unsafe {
                sys::cuMemCreate(&mut h, piece, &prop, 0)
            })?;
            p.handles.push((h, false));
            // SAFETY: the place lies in the range reserved above and holds no mapping yet.
            check("cuMemMap", unsafe {
                sys::cuMemMap(p.ptr + (i * piece) as u64, piece, 0, h, 0)
            })?;
            p.handles[i].1 = true;
        }
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole range is mapped (above); one valid descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(p.ptr, total, &access, 1)
        })
    })();
    match made {
        Ok(()) => Ok(Pieces {
            ptr: p.ptr,
            piece,
            handles: p.handles.iter().map(|&(h, _)| h).collect(),
        }),
        Err(e) => {
            if let Err(r) = p.release() {
                tracing::warn!("releasing a partly mapped range: {r}");
            }
            Err(e.with_context(|| format!("mapping {count} pieces of {piece} bytes")))
        }
    }
}

/// Unmaps and frees what [`map_pieces`] made.
pub fn unmap_pieces(pieces: &Pieces) -> Result<()> {
    Partial {
        ptr: pieces.ptr,
        reserved: pieces.len(),
        piece: pieces.piece,
        handles: pieces.handles.iter().map(|&h| (h, true)).collect(),
    }
    .release()
}
