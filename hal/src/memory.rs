//! Device memory: addresses, owning buffers and bounds-checked slices.
//!
//! A [`DeviceBuffer`] is a reference-counted handle to one allocation (or one imported mapping).
//! Asynchronous operations keep a clone until they have run, so dropping the last user handle
//! while a stream still uses the memory is safe: the memory is released after the stream is
//! done with it.

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::caps::{BackendKind, DeviceInfo};
use crate::error::{Error, Result};

/// An address in a device's address space (on the host backend, a process virtual address).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes as u64))
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

/// The kinds of memory a device can allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Ordinary device memory; exportable over IPC.
    Device,
    /// Host memory mapped into the device's address space (the proxy FIFO lives here).
    HostMapped,
    /// Device memory that bypasses caches, for flags and tokens (AMD needs it; elsewhere it
    /// is ordinary device memory).
    Uncached,
}

/// One allocation or imported mapping, implemented by each backend.
pub trait Allocation: Send + Sync + fmt::Debug + 'static {
    /// The backend that owns it.
    fn backend(&self) -> BackendKind;
    /// Ordinal of the device it belongs to.
    fn device_ordinal(&self) -> usize;
    /// Device address of the first byte.
    fn device_ptr(&self) -> DevicePtr;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the allocation has zero length (never, for allocations made by a backend).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What kind of memory it is.
    fn kind(&self) -> MemoryKind;
    /// A host pointer to the first byte, where the host can access it directly.
    fn host_ptr(&self) -> Option<*mut u8>;
    /// Whether this is a mapping of another process's (or allocation's) memory.
    fn is_imported(&self) -> bool;
    /// Backend-specific access for downcasting.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A shared handle to device memory.
#[derive(Clone)]
pub struct DeviceBuffer {
    inner: Arc<dyn Allocation>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("backend", &self.inner.backend())
            .field("device", &self.inner.device_ordinal())
            .field("ptr", &self.inner.device_ptr())
            .field("len", &self.inner.len())
            .field("kind", &self.inner.kind())
            .field("imported", &self.inner.is_imported())
            .finish()
    }
}

thread_local! {
    /// Bytes of memory this thread allocated (imports of other processes' memory excluded):
    /// what [`allocated_here`] reads.
    static ALLOCATED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes of memory the calling thread has allocated through [`DeviceBuffer`]s so far (imported
/// memory excluded; frees not subtracted). The difference across a set-up call is what that
/// set-up allocated on this thread, e.g. a communicator's collectives for
/// `ncclCommMemStats`.
pub fn allocated_here() -> u64 {
    ALLOCATED.with(std::cell::Cell::get)
}

impl DeviceBuffer {
    /// Wraps a backend allocation.
    pub fn new(inner: Arc<dyn Allocation>) -> Self {
        if !inner.is_imported() {
            ALLOCATED.with(|a| a.set(a.get().saturating_add(inner.len() as u64)));
        }
        DeviceBuffer { inner }
    }

    /// The allocation behind the handle.
    pub fn allocation(&self) -> &Arc<dyn Allocation> {
        &self.inner
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.inner.device_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// Memory kind.
    pub fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }

    /// Backend that owns it.
    pub fn backend(&self) -> BackendKind {
        self.inner.backend()
    }

    /// Host pointer, where the host can access the memory directly.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        self.inner.host_ptr()
    }

    /// A bounds-checked view of a byte range.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferSlice> {
        let len = self.len();
        let (start, end) = resolve(&range, len);
        if start > end || end > len {
            return Err(Error::invalid(format!(
                "byte range {start}..{end} is outside a buffer of {len} bytes at {:?}",
                self.ptr()
            )));
        }
        Ok(BufferSlice {
            buf: self.clone(),
            offset: start,
            len: end - start,
        })
    }

    /// A view of the whole buffer.
    pub fn full(&self) -> BufferSlice {
        self.clone().into_full()
    }

    /// A view of the whole buffer, taking this handle (no reference count taken).
    pub fn into_full(self) -> BufferSlice {
        let len = self.len();
        BufferSlice {
            buf: self,
            offset: 0,
            len,
        }
    }
}

/// A byte range of a [`DeviceBuffer`], checked when it was made.
#[derive(Clone, Debug)]
pub struct BufferSlice {
    buf: DeviceBuffer,
    offset: usize,
    len: usize,
}

impl BufferSlice {
    /// The buffer it is a view of.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// Offset of the first byte within the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.buf.ptr().offset(self.offset)
    }

    /// Host pointer of the first byte, where the host can access the memory directly.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        // The offset is within the allocation (checked at construction), so `add` stays in bounds.
        self.buf.host_ptr().map(|p| p.wrapping_add(self.offset))
    }

    /// A narrower view, relative to this one.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferSlice> {
        let (start, end) = resolve(&range, self.len);
        if start > end || end > self.len {
            return Err(Error::invalid(format!(
                "byte range {start}..{end} is outside a slice of {} bytes",
                self.len
            )));
        }
        Ok(BufferSlice {
            buf: self.buf.clone(),
            offset: self.offset + start,
            len: end - start,
        })
    }
}

/// Memory the caller owns, wrapped without taking ownership ([`crate::Device::wrap_external`]):
/// dropping it frees nothing. This is how the NCCL-compatible library hands user buffers (raw
/// device pointers) to the collectives.
#[derive(Debug)]
pub struct ExternalAllocation {
    backend: BackendKind,
    ordinal: usize,
    ptr: DevicePtr,
    len: usize,
    host_accessible: bool,
}

impl ExternalAllocation {
    /// Describes `len` bytes at `ptr` of the device `info`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be memory of that device that stays allocated while the returned
    /// value, every buffer made from it and every operation enqueued with them are in use; where
    /// the device's memory is host accessible, the host may read and write it through `ptr`.
    pub unsafe fn new(info: &DeviceInfo, ptr: DevicePtr, len: usize) -> Result<Self> {
        if ptr.0 == 0 {
            return Err(Error::invalid(
                "external memory at address 0 (a null pointer)",
            ));
        }
        if len == 0 {
            return Err(Error::invalid(format!(
                "external memory of 0 bytes at {ptr:?}: wrap at least 1 byte"
            )));
        }
        if ptr.0.checked_add(len as u64).is_none() || len > isize::MAX as usize {
            return Err(Error::invalid(format!(
                "external memory of {len} bytes at {ptr:?} runs past the end of the address space"
            )));
        }
        Ok(ExternalAllocation {
            backend: info.backend,
            ordinal: info.ordinal,
            ptr,
            len,
            host_accessible: info.caps.device_memory_host_accessible,
        })
    }
}

impl Allocation for ExternalAllocation {
    fn backend(&self) -> BackendKind {
        self.backend
    }
    fn device_ordinal(&self) -> usize {
        self.ordinal
    }
    fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        self.host_accessible
            .then_some(self.ptr.0 as usize as *mut u8)
    }
    fn is_imported(&self) -> bool {
        false
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Turns any range expression into `start..end` (unchecked; callers validate against `len`).
fn resolve(range: &impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::{Capabilities, MulticastSupport};

    fn info(host_accessible: bool) -> DeviceInfo {
        DeviceInfo {
            backend: BackendKind::Host,
            ordinal: 3,
            name: "test".into(),
            arch: "test".into(),
            total_memory: 0,
            warp_size: 1,
            multiprocessors: 1,
            max_threads_per_block: 1,
            pci_bus_id: None,
            caps: Capabilities {
                ipc: false,
                host_mapped_memory: false,
                device_memory_host_accessible: host_accessible,
                kernels: false,
                multicast: MulticastSupport::Unsupported("test".into()),
                ll128: false,
            },
        }
    }

    #[test]
    fn external_allocation_wraps_without_owning() {
        let mut backing = vec![7u8; 64];
        let ptr = DevicePtr(backing.as_mut_ptr() as u64);
        // SAFETY: `backing` outlives the buffer and is host memory.
        let a = unsafe { ExternalAllocation::new(&info(true), ptr, 64) }.unwrap();
        let buf = DeviceBuffer::new(Arc::new(a));
        assert_eq!(buf.ptr(), ptr);
        assert_eq!(buf.len(), 64);
        assert_eq!(buf.backend(), BackendKind::Host);
        assert_eq!(buf.allocation().device_ordinal(), 3);
        assert_eq!(buf.host_ptr(), Some(backing.as_mut_ptr()));
        assert_eq!(buf.slice(8..16).unwrap().ptr(), ptr.offset(8));
        drop(buf);
        assert_eq!(
            backing[0], 7,
            "dropping the wrapper must not touch the memory"
        );
        // SAFETY: never dereferenced.
        let gpu = unsafe { ExternalAllocation::new(&info(false), DevicePtr(0x1000), 8) }.unwrap();
        assert_eq!(gpu.host_ptr(), None);
    }

    #[test]
    fn external_allocation_rejects_bad_ranges() {
        // SAFETY: nothing is dereferenced; the constructor rejects these.
        unsafe {
            assert!(ExternalAllocation::new(&info(true), DevicePtr(0), 8).is_err());
            assert!(ExternalAllocation::new(&info(true), DevicePtr(0x1000), 0).is_err());
            assert!(ExternalAllocation::new(&info(true), DevicePtr(u64::MAX - 4), 8).is_err());
        }
    }
}
