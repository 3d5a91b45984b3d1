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

/// The minimum mapping granularity of allocations of `prop` (at least 1).
fn granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    let mut gran = 0usize;
    // SAFETY: valid out-pointer and properties.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut gran,
            prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(gran.max(1))
}

/// `count` pieces of at least `piece` bytes of device `dev`, back to back in one range.
pub fn map_pieces(dev: sys::CUdevice, piece: usize, count: usize) -> Result<Pieces> {
    let prop = properties(dev);
    let gran = granularity(&prop)?;
    let piece = piece
        .checked_next_multiple_of(gran)
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

/// Device memory of `dev` whose handle exports as a POSIX file descriptor (symmetric memory).
fn shareable_properties(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    let mut prop = properties(dev);
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop
}

/// The mapping granularity of shareable memory of `dev`.
pub fn shareable_granularity(dev: sys::CUdevice) -> Result<usize> {
    granularity(&shareable_properties(dev))
}

/// One allocation of at least `bytes` of `dev` with a shareable handle, mapped read-write for
/// `dev` in a range of its own (a range of one piece).
pub fn alloc_shareable(dev: sys::CUdevice, bytes: usize) -> Result<Pieces> {
    let gran = shareable_granularity(dev)?;
    let len = bytes
        .checked_next_multiple_of(gran)
        .filter(|&l| l > 0)
        .ok_or_else(|| Error::invalid(format!("a shareable allocation of {bytes} bytes")))?;
    let prop = shareable_properties(dev);
    let mut p = Partial {
        ptr: 0,
        reserved: 0,
        piece: len,
        handles: Vec::with_capacity(1),
    };
    let made = (|| {
        // SAFETY: valid out-pointer; any address, aligned to the granularity, no flags.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut p.ptr, len, gran, 0, 0)
        })?;
        p.reserved = len;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; no flags.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut h, len, &prop, 0)
        })?;
        p.handles.push((h, false));
        // SAFETY: the range was reserved above and holds no mapping yet.
        check("cuMemMap", unsafe { sys::cuMemMap(p.ptr, len, 0, h, 0) })?;
        p.handles[0].1 = true;
        set_access(dev, p.ptr, len)
    })();
    match made {
        Ok(()) => Ok(Pieces {
            ptr: p.ptr,
            piece: len,
            handles: vec![p.handles[0].0],
        }),
        Err(e) => {
            if let Err(r) = p.release() {
                tracing::warn!("releasing a partly made shareable allocation: {r}");
            }
            Err(e.with_context(|| format!("allocating {len} bytes of shareable memory")))
        }
    }
}

fn set_access(dev: sys::CUdevice, ptr: u64, len: usize) -> Result<()> {
    let access = sys::CUmemAccessDesc {
        location: properties(dev).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range is mapped (the caller's); one valid descriptor.
    check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(ptr, len, &access, 1)
    })
}

/// A POSIX file descriptor for the allocation `handle` (of [`alloc_shareable`]).
pub fn export_fd(handle: u64) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: the out-pointer holds an int, as the POSIX handle type writes; `handle` is live.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    if fd < 0 {
        return Err(Error::Internal(
            "cuMemExportToShareableHandle returned no descriptor".into(),
        ));
    }
    // SAFETY: the driver made this descriptor for us; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Reserves `bytes` of address space.
pub fn reserve(bytes: usize, align: usize) -> Result<u64> {
    let mut ptr = 0u64;
    // SAFETY: valid out-pointer; any address; no flags.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut ptr, bytes, align, 0, 0)
    })
    .map_err(|e| e.with_context(|| format!("reserving {bytes} bytes of address space")))?;
    Ok(ptr)
}

/// Releases a range of [`reserve`] (nothing mapped in it any more).
pub fn free_reserve(ptr: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's range of `reserve`, with no mapping left.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(ptr, bytes)
    })
}

/// Maps `bytes` of the memory behind descriptor `fd` at `at` (reserved, unmapped), read-write
/// for `dev`.
pub fn map_fd(
    dev: sys::CUdevice,
    at: u64,
    fd: std::os::fd::BorrowedFd<'_>,
    bytes: usize,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer; the POSIX handle type takes the descriptor's number as the
    // pointer-sized handle; the descriptor stays open for the call.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd.as_raw_fd() as isize as *mut std::ffi::c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    // SAFETY: `at..at + bytes` is reserved and unmapped (the caller's contract).
    let mapped = check("cuMemMap", unsafe { sys::cuMemMap(at, bytes, 0, h, 0) });
    // The mapping holds the memory; the handle is not needed past it.
    // SAFETY: `h` came from the import above and is released once.
    let released = check("cuMemRelease", unsafe { sys::cuMemRelease(h) });
    mapped?;
    released?;
    if let Err(e) = set_access(dev, at, bytes) {
        // SAFETY: mapped just above; nothing uses it yet.
        let _ = check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, bytes) });
        return Err(e);
    }
    Ok(())
}

/// Removes a mapping of [`map_fd`].
pub fn unmap(at: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's mapping, unused now.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, bytes) })
}
