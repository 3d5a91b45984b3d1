//! Shareable memory of a GPU backend ([`mscclpp_hal::Shareable`]) over the runtime's virtual
//! memory calls: an allocation is one physical piece whose handle exports as a file
//! descriptor; a reserved range takes such handles (this process's or a peer's) at chosen
//! offsets.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use mscclpp_hal::{AddressSpace, DeviceBuffer, DevicePtr, Error, MemoryKind, Result, Shareable};

use crate::context::Context;
use crate::memory::{Backing, GpuAllocation};
use crate::runtime::Runtime;

/// A GPU device's shareable memory.
#[derive(Debug)]
pub struct GpuShareable<R: Runtime> {
    pub(crate) ctx: Arc<Context<R>>,
}

impl<R: Runtime> Shareable for GpuShareable<R> {
    fn granularity(&self) -> usize {
        self.ctx
            .runtime()
            .vmm_shareable_granularity(self.ctx.ordinal())
            .unwrap_or(1 << 21)
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 || bytes > crate::memory::MAX_ALLOCATION {
            return Err(Error::invalid(format!(
                "shareable allocation of {bytes} bytes: the {} backend allocates 1 byte to {} bytes",
                R::VENDOR.name,
                crate::memory::MAX_ALLOCATION
            )));
        }
        self.ctx.bind()?;
        // SAFETY: the context is current.
        let p = unsafe {
            self.ctx
                .runtime()
                .vmm_alloc_shareable(self.ctx.ordinal(), bytes)
        }?;
        let (ptr, len) = (p.ptr, p.len());
        Ok(DeviceBuffer::new(Arc::new(GpuAllocation::from_raw(
            self.ctx.clone(),
            ptr,
            len,
            MemoryKind::Device,
            Backing::Shareable(p),
        ))))
    }

    fn export(&self, buf: &DeviceBuffer) -> Result<OwnedFd> {
        let a = buf
            .allocation()
            .as_any()
            .downcast_ref::<GpuAllocation<R>>()
            .ok_or_else(|| Error::invalid("export: the buffer is not of this backend"))?;
        let handle = a.shareable_handle().ok_or_else(|| {
            Error::invalid(format!(
                "export: the {} bytes at {:#x} are not shareable memory (allocate them with Shareable::alloc)",
                buf.len(),
                buf.ptr().0
            ))
        })?;
        // SAFETY: the handle is live while `buf` is.
        unsafe { self.ctx.runtime().vmm_export(handle) }
    }

    fn reserve(&self, bytes: usize) -> Result<Box<dyn AddressSpace>> {
        let gran = self
            .ctx
            .runtime()
            .vmm_shareable_granularity(self.ctx.ordinal())?;
        if bytes == 0 || bytes % gran != 0 {
            return Err(Error::invalid(format!(
                "reserving {bytes} bytes: a positive multiple of {gran} is needed"
            )));
        }
        self.ctx.bind()?;
        // SAFETY: the context is current.
        let base = unsafe { self.ctx.runtime().vmm_reserve(bytes, gran) }?;
        Ok(Box::new(GpuSpace {
            ctx: self.ctx.clone(),
            base,
            len: bytes,
            gran,
            mapped: Mutex::new(std::collections::BTreeMap::new()),
        }))
    }
}

/// A reserved range of a GPU backend.
#[derive(Debug)]
struct GpuSpace<R: Runtime> {
    ctx: Arc<Context<R>>,
    base: u64,
    len: usize,
    gran: usize,
    /// Offset → length of each mapping in it.
    mapped: Mutex<std::collections::BTreeMap<usize, usize>>,
}

impl<R: Runtime> AddressSpace for GpuSpace<R> {
    fn base(&self) -> DevicePtr {
        DevicePtr(self.base)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn map(&self, offset: usize, handle: BorrowedFd<'_>, bytes: usize) -> Result<()> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
        mscclpp_hal::symmetric::check_map(self.len, self.gran, &mapped, offset, bytes)?;
        self.ctx.bind()?;
        // SAFETY: the place lies in this reservation and holds no mapping (both checked).
        unsafe {
            self.ctx.runtime().vmm_map_fd(
                self.ctx.ordinal(),
                self.base + offset as u64,
                handle,
                bytes,
            )
        }?;
        mapped.insert(offset, bytes);
        Ok(())
    }

    fn unmap(&self, offset: usize, bytes: usize) -> Result<()> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner());
        if mapped.get(&offset) != Some(&bytes) {
            return Err(Error::invalid(format!(
                "unmapping {bytes} bytes at offset {offset}: no such mapping in the range"
            )));
        }
        // SAFETY: a mapping of `map`, unused now (the caller's contract).
        unsafe {
            self.ctx
                .runtime()
                .vmm_unmap(self.base + offset as u64, bytes)
        }?;
        mapped.remove(&offset);
        Ok(())
    }
}

impl<R: Runtime> Drop for GpuSpace<R> {
    fn drop(&mut self) {
        let rt = self.ctx.runtime();
        let mapped = self.mapped.get_mut().unwrap_or_else(|p| p.into_inner());
        for (&o, &l) in mapped.iter() {
            // SAFETY: the mappings of this range; nothing uses them (their users hold `self`).
            if let Err(e) = unsafe { rt.vmm_unmap(self.base + o as u64, l) } {
                tracing::warn!("unmapping {l} bytes of a reserved range: {e}");
            }
        }
        // SAFETY: the reservation of `reserve`, with nothing mapped in it now.
        if let Err(e) = unsafe { rt.vmm_free_reserve(self.base, self.len) } {
            tracing::warn!("releasing a reserved range of {} bytes: {e}", self.len);
        }
    }
}
