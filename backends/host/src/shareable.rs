//! Shareable memory of the host backend ([`mscclpp_hal::Shareable`]): its device memory is
//! already a shared-memory file (memfd), so the handle is a duplicate of the file's descriptor,
//! and mapping one is a fixed `mmap` of that file into a reserved range — the same steps a GPU
//! runtime's virtual-memory calls take, on the host, so that symmetric windows run in CI.

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;

use mscclpp_hal::{AddressSpace, DeviceBuffer, DevicePtr, Error, MemoryKind, Result, Shareable};
use rustix::mm::{MapFlags, ProtFlags};

use crate::memory::{
    MAX_ALLOCATION, ShmAllocation, forget_mapping, host_allocation, into_buffer, note_mapping,
};

/// Pages: the unit of `mmap`.
pub const GRANULARITY: usize = 4096;

/// The host device's shareable memory.
#[derive(Debug)]
pub struct HostShareable {
    pub(crate) device: usize,
}

impl Shareable for HostShareable {
    fn granularity(&self) -> usize {
        GRANULARITY
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let len = bytes
            .checked_next_multiple_of(GRANULARITY)
            .filter(|&l| l > 0 && l <= MAX_ALLOCATION)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "shareable allocation of {bytes} bytes: the host backend allocates 1 byte to {MAX_ALLOCATION} bytes"
                ))
            })?;
        Ok(into_buffer(ShmAllocation::new(
            len,
            MemoryKind::Device,
            self.device,
        )?))
    }

    fn export(&self, buf: &DeviceBuffer) -> Result<OwnedFd> {
        let a = host_allocation(buf)?;
        a.file()
            .try_clone_to_owned()
            .map_err(|e| Error::io("duplicating the descriptor of host device memory", e))
    }

    fn reserve(&self, bytes: usize) -> Result<Box<dyn AddressSpace>> {
        if bytes == 0 || bytes % GRANULARITY != 0 {
            return Err(Error::invalid(format!(
                "reserving {bytes} bytes: a positive multiple of {GRANULARITY} is needed"
            )));
        }
        // SAFETY: a fresh private reservation of address space; no existing memory is affected.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                bytes,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| {
            Error::io(
                format!("reserving {bytes} bytes of address space"),
                e.into(),
            )
        })?;
        Ok(Box::new(HostSpace {
            base: base as usize,
            len: bytes,
            mapped: Mutex::new(BTreeMap::new()),
        }))
    }
}

/// A reserved range of the host backend.
#[derive(Debug)]
struct HostSpace {
    base: usize,
    len: usize,
    /// Offset → length of each mapping in it.
    mapped: Mutex<BTreeMap<usize, usize>>,
}

impl AddressSpace for HostSpace {
    fn base(&self) -> DevicePtr {
        DevicePtr(self.base as u64)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn map(&self, offset: usize, handle: BorrowedFd<'_>, bytes: usize) -> Result<()> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
        mscclpp_hal::symmetric::check_map(self.len, GRANULARITY, &mapped, offset, bytes)?;
        let st = rustix::fs::fstat(handle)
            .map_err(|e| Error::io("fstat of a shareable handle", e.into()))?;
        if (st.st_size as u64) < bytes as u64 {
            return Err(Error::invalid(format!(
                "mapping {bytes} bytes of a shareable handle of {} bytes",
                st.st_size
            )));
        }
        let at = self.base + offset;
        // SAFETY: `at..at + bytes` lies in this reservation (checked), which this value owns and
        // where nothing is mapped (checked): the fixed mapping replaces only reserved space.
        unsafe {
            rustix::mm::mmap(
                at as *mut _,
                bytes,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                handle,
                0,
            )
        }
        .map_err(|e| {
            Error::io(
                format!("mapping {bytes} bytes at offset {offset}"),
                e.into(),
            )
        })?;
        mapped.insert(offset, bytes);
        note_mapping(at, bytes);
        Ok(())
    }

    fn unmap(&self, offset: usize, bytes: usize) -> Result<()> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
        if mapped.get(&offset) != Some(&bytes) {
            return Err(Error::invalid(format!(
                "unmapping {bytes} bytes at offset {offset}: no such mapping in the range"
            )));
        }
        let at = self.base + offset;
        // SAFETY: the mapping made by `map` at this place; an inaccessible reservation replaces
        // it, so the range stays reserved for this value.
        unsafe {
            rustix::mm::mmap_anonymous(
                at as *mut _,
                bytes,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
            )
        }
        .map_err(|e| {
            Error::io(
                format!("unmapping {bytes} bytes at offset {offset}"),
                e.into(),
            )
        })?;
        mapped.remove(&offset);
        forget_mapping(at);
        Ok(())
    }
}

impl Drop for HostSpace {
    fn drop(&mut self) {
        let mapped = self.mapped.get_mut().unwrap_or_else(|p| p.into_inner());
        for (&o, _) in mapped.iter() {
            forget_mapping(self.base + o);
        }
        // SAFETY: the whole reservation this value owns; nothing uses it any more (its users
        // hold the value being dropped).
        if let Err(e) = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) } {
            tracing::warn!("releasing a reserved range of {} bytes: {e}", self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::allocation_range;

    /// Two allocations mapped into one range at a stride: each byte written through the range
    /// is the allocation's, mappings cannot overlap or leave the range, and an unmapped part is
    /// forgotten.
    #[test]
    fn handles_map_at_chosen_places() {
        let s = HostShareable { device: 0 };
        let (a, b) = (s.alloc(5000).unwrap(), s.alloc(8192).unwrap());
        assert_eq!(a.len(), 8192);
        let space = s.reserve(4 * 8192).unwrap();
        let (fa, fb) = (s.export(&a).unwrap(), s.export(&b).unwrap());
        use std::os::fd::AsFd;
        space.map(0, fa.as_fd(), 8192).unwrap();
        space.map(2 * 8192, fb.as_fd(), 8192).unwrap();
        assert!(
            space.map(4096, fa.as_fd(), 8192).is_err(),
            "an overlap was mapped"
        );
        assert!(
            space.map(3 * 8192, fa.as_fd(), 2 * 8192).is_err(),
            "left the range"
        );
        let base = space.base().0 as *mut u8;
        // SAFETY: both parts are mapped read-write (above) and used by this test alone.
        unsafe {
            base.add(100).write(7);
            base.add(2 * 8192 + 5).write(9);
            assert_eq!(a.full().host_ptr().unwrap().add(100).read(), 7);
            assert_eq!(b.full().host_ptr().unwrap().add(5).read(), 9);
        }
        let at = DevicePtr(space.base().0 + 2 * 8192 + 10);
        assert_eq!(
            allocation_range(at),
            Some((DevicePtr(space.base().0 + 2 * 8192), 8192))
        );
        space.unmap(2 * 8192, 8192).unwrap();
        assert_eq!(allocation_range(at), None);
        assert!(space.unmap(2 * 8192, 8192).is_err());
    }
}
