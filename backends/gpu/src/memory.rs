//! Allocations of the GPU backends: device memory, uncached device memory for flags and tokens
//! (vendors without such memory give ordinary device memory), host-mapped memory, imported IPC
//! mappings and same-process aliases; and wrapping caller-owned memory after asking the runtime
//! that it is its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, DevicePtr, Error, ExternalAllocation, MemoryKind, Result,
};

use crate::context::Context;
use crate::runtime::Runtime;

/// Largest allocation (1 TiB): what [`GpuAllocation::new`] accepts, and a bound on what a
/// hostile IPC handle claims (the IPC module re-exports it).
pub const MAX_ALLOCATION: usize = 1 << 40;

/// What owns the memory behind a [`GpuAllocation`].
#[derive(Debug)]
pub(crate) enum Backing {
    /// [`Runtime::mem_alloc`]; freed with [`Runtime::mem_free`].
    Device,
    /// [`Runtime::host_alloc_mapped`]; freed with [`Runtime::host_free`].
    HostMapped { host: *mut u8 },
    /// Another process's memory ([`Runtime::ipc_open_handle`]); closed on drop.
    Imported,
    /// Another allocation of this process (same-process import), or a part of one (an
    /// imported view of wrapped memory); nothing to free here.
    Alias(Arc<dyn Allocation>),
    /// The runtime allocation behind memory a caller wrapped (`Device::wrap_external`),
    /// described so that it can be exported; the caller owns it, nothing to free here.
    External,
    /// [`Runtime::vmm_map_pieces`]; released with [`Runtime::vmm_unmap_pieces`].
    Pieces(crate::runtime::Pieces),
    /// [`Runtime::vmm_alloc_shareable`] (one piece whose handle exports); released with
    /// [`Runtime::vmm_unmap_pieces`].
    Shareable(crate::runtime::Pieces),
}

/// One allocation or imported mapping of a GPU backend.
#[derive(Debug)]
pub struct GpuAllocation<R: Runtime> {
    pub(crate) ctx: Arc<Context<R>>,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    kind: MemoryKind,
    backing: Backing,
    /// Process-unique id, carried in IPC handles to find the allocation again.
    pub(crate) id: u64,
}

// SAFETY: the value owns a runtime allocation (or a reference to one); addresses are plain
// numbers valid in every thread, and the host pointer of host-mapped memory is shared memory
// with device-memory semantics (its users synchronise themselves).
unsafe impl<R: Runtime> Send for GpuAllocation<R> {}
// SAFETY: as above; `&GpuAllocation` only hands out addresses.
unsafe impl<R: Runtime> Sync for GpuAllocation<R> {}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn with_size(e: Error, len: usize) -> Error {
    e.with_context(|| format!("allocating {len} bytes"))
}

impl<R: Runtime> GpuAllocation<R> {
    /// Allocates `len` bytes of `kind` on `ctx`'s device.
    pub fn new(ctx: Arc<Context<R>>, len: usize, kind: MemoryKind) -> Result<Self> {
        if len == 0 || len > MAX_ALLOCATION {
            return Err(Error::invalid(format!(
                "allocation of {len} bytes: the {} backend allocates 1 byte to {MAX_ALLOCATION} bytes",
                R::VENDOR.name
            )));
        }
        ctx.bind()?;
        let rt = ctx.runtime();
        // Allocating while another thread captures a graph (capture.rs).
        let _relaxed = crate::capture::Relaxed::new(rt);
        let (ptr, backing) = match kind {
            MemoryKind::Device | MemoryKind::Uncached => {
                let uncached = kind == MemoryKind::Uncached;
                // SAFETY: the context is current.
                let p = unsafe { rt.mem_alloc(len, uncached) }.map_err(|e| with_size(e, len))?;
                (p, Backing::Device)
            }
            MemoryKind::HostMapped => {
                // SAFETY: the context is current.
                let host = unsafe { rt.host_alloc_mapped(len) }.map_err(|e| with_size(e, len))?;
                // SAFETY: `host` was just allocated mapped; the context is current.
                match unsafe { rt.host_device_pointer(host) } {
                    Ok(p) => (p, Backing::HostMapped { host }),
                    Err(e) => {
                        // SAFETY: `host` came from host_alloc_mapped and is used nowhere else.
                        if let Err(free) = unsafe { rt.host_free(host, len) } {
                            tracing::warn!("{free}");
                        }
                        return Err(e);
                    }
                }
            }
        };
        Ok(Self::from_raw(ctx, ptr, len, kind, backing))
    }

    /// `count` mappings of at least `piece` bytes each, back to back in one range of `ctx`'s
    /// device ([`mscclpp_hal::Device::alloc_pieces`]).
    pub fn pieces(ctx: Arc<Context<R>>, piece: usize, count: usize) -> Result<Self> {
        let total = piece.checked_mul(count).filter(|&t| t <= MAX_ALLOCATION);
        if piece == 0 || count == 0 || total.is_none() {
            return Err(Error::invalid(format!(
                "a range of {count} pieces of {piece} bytes: the {} backend maps 1 byte to \
                 {MAX_ALLOCATION} bytes in at least one piece",
                R::VENDOR.name
            )));
        }
        ctx.bind()?;
        // SAFETY: the context is current.
        let p = unsafe { ctx.runtime().vmm_map_pieces(ctx.ordinal(), piece, count) }?;
        let (ptr, len) = (p.ptr, p.len());
        Ok(Self::from_raw(
            ctx,
            ptr,
            len,
            MemoryKind::Device,
            Backing::Pieces(p),
        ))
    }

    /// The handle of shareable memory ([`crate::shareable`]), if it is such memory.
    pub(crate) fn shareable_handle(&self) -> Option<u64> {
        match &self.backing {
            Backing::Shareable(p) => p.handles.first().copied(),
            _ => None,
        }
    }

    /// Whether the allocation is a range of several mappings.
    pub(crate) fn is_pieces(&self) -> bool {
        matches!(self.backing, Backing::Pieces(_))
    }

    pub(crate) fn from_raw(
        ctx: Arc<Context<R>>,
        ptr: u64,
        len: usize,
        kind: MemoryKind,
        backing: Backing,
    ) -> Self {
        GpuAllocation {
            ctx,
            ptr,
            len,
            kind,
            backing,
            id: next_id(),
        }
    }

    /// An alias of `original` (an allocation of this process) seen through `ctx`'s device.
    pub(crate) fn alias(ctx: &Arc<Context<R>>, original: Arc<dyn Allocation>) -> Self {
        let (ptr, len, kind) = (original.device_ptr().0, original.len(), original.kind());
        Self::from_raw(ctx.clone(), ptr, len, kind, Backing::Alias(original))
    }

    /// `len` bytes at `offset` of `original` (checked by the caller), seen through `ctx`'s
    /// device; keeps `original` alive.
    pub(crate) fn view(
        ctx: &Arc<Context<R>>,
        original: Arc<dyn Allocation>,
        offset: usize,
        len: usize,
    ) -> Self {
        let (ptr, kind) = (original.device_ptr().0 + offset as u64, original.kind());
        Self::from_raw(ctx.clone(), ptr, len, kind, Backing::Alias(original))
    }

    /// The context the allocation belongs to.
    pub fn context(&self) -> &Arc<Context<R>> {
        &self.ctx
    }
}

impl<R: Runtime> Drop for GpuAllocation<R> {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Alias(_) | Backing::External) {
            return;
        }
        if self.ctx.lost() {
            return; // a device reset freed it already
        }
        if self.ctx.bind().is_err() {
            tracing::warn!(
                ptr = self.ptr,
                len = self.len,
                "cannot make the {} device current to free its memory; leaking it",
                R::VENDOR.name
            );
            return;
        }
        let rt = self.ctx.runtime();
        // Freed whenever the last clone goes, on any thread, perhaps while another captures.
        let _relaxed = crate::capture::Relaxed::new(rt);
        // The memory was obtained by the matching call in `new` / `ipc::open` and is released
        // once, here; no stream uses it any more, since every enqueued operation keeps a clone
        // of the buffer until it has run.
        let r = match &self.backing {
            Backing::Alias(_) | Backing::External => Ok(()),
            // SAFETY: see above; `ptr` came from mem_alloc.
            Backing::Device => unsafe { rt.mem_free(self.ptr) },
            // SAFETY: see above; `host` came from host_alloc_mapped.
            Backing::HostMapped { host } => unsafe { rt.host_free(*host, self.len) },
            // SAFETY: see above; `ptr` came from ipc_open_handle.
            Backing::Imported => unsafe { rt.ipc_close_handle(self.ptr) },
            // SAFETY: see above; the pieces came from vmm_map_pieces.
            Backing::Pieces(p) | Backing::Shareable(p) => unsafe { rt.vmm_unmap_pieces(p) },
        };
        if let Err(e) = r {
            tracing::warn!(ptr = self.ptr, len = self.len, "{e}");
        }
    }
}

impl<R: Runtime> Allocation for GpuAllocation<R> {
    fn backend(&self) -> BackendKind {
        R::VENDOR.kind
    }
    fn device_ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        self.kind
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        match &self.backing {
            Backing::HostMapped { host } => Some(*host),
            // A view starts `ptr - original's ptr` bytes into the original.
            Backing::Alias(a) => a
                .host_ptr()
                .map(|h| h.wrapping_add(self.ptr.wrapping_sub(a.device_ptr().0) as usize)),
            _ => None,
        }
    }
    fn is_imported(&self) -> bool {
        matches!(self.backing, Backing::Imported | Backing::Alias(_))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The runtime allocation holding `ptr` ([`mscclpp_hal::Device::allocation_range`]), or `None`
/// where the runtime does not know the address (it is then not this device's memory).
pub fn allocation_range<R: Runtime>(
    ctx: &Context<R>,
    ptr: DevicePtr,
) -> Result<Option<(DevicePtr, usize)>> {
    ctx.bind()?;
    // SAFETY: the context is current; the runtime only looks the address up.
    match unsafe { ctx.runtime().mem_address_range(ptr.0) } {
        Ok((base, len)) => Ok(Some((DevicePtr(base), len))),
        Err(e) => {
            tracing::debug!(?ptr, "no allocation range: {e}");
            Ok(None)
        }
    }
}

/// The allocation of backend `R` behind a buffer, or an error naming the buffer's backend.
pub fn gpu_allocation<R: Runtime>(buf: &DeviceBuffer) -> Result<&GpuAllocation<R>> {
    buf.allocation()
        .as_any()
        .downcast_ref::<GpuAllocation<R>>()
        .ok_or_else(|| {
            if buf.backend() == R::VENDOR.kind {
                // Wrapped memory (`ExternalAllocation`) is exported by the IPC module itself.
                Error::invalid(format!(
                    "a {} buffer that is neither this library's allocation nor a wrapped pointer \
                     ({:?}) cannot be shared with peers",
                    R::VENDOR.name,
                    buf.allocation()
                ))
            } else {
                Error::invalid(format!(
                    "buffer of the {} backend used with the {} backend",
                    buf.backend(),
                    R::VENDOR.name
                ))
            }
        })
}

/// `Device::wrap_external`: checks with [`Runtime::mem_address_range`] that every byte of the
/// range is mapped memory the runtime knows — one allocation, or several mappings back to back
/// (a virtual-memory allocator's range, see [`mscclpp_hal::mapped`]) — then wraps it without
/// taking ownership.
///
/// # Safety
/// As for [`ExternalAllocation::new`].
pub unsafe fn wrap_external<R: Runtime>(
    ctx: &Context<R>,
    info: &mscclpp_hal::DeviceInfo,
    ptr: DevicePtr,
    len: usize,
) -> Result<DeviceBuffer> {
    ctx.bind()?;
    let mut first_error = None;
    let extent = mscclpp_hal::mapped::mapped_extent(ptr.0, len, |p| {
        // SAFETY: the context is current; the runtime only looks the address up.
        match unsafe { ctx.runtime().mem_address_range(p) } {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                first_error.get_or_insert(e);
                Ok(None)
            }
        }
    })?;
    if extent.is_none() {
        let why = first_error.map_or_else(String::new, |e| format!(": {e}"));
        return Err(Error::invalid(format!(
            "address {ptr:?} ({len} bytes) is not memory the {} runtime knows on device {} (a host pointer, a freed buffer or memory of another process?){why}",
            R::VENDOR.runtime,
            info.ordinal
        )));
    }
    // SAFETY: forwarded contract; the range was just checked to be runtime memory.
    let a = unsafe { ExternalAllocation::new(info, ptr, len)? };
    Ok(DeviceBuffer::new(Arc::new(a)))
}
