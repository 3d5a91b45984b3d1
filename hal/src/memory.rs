//! Device memory: addresses, owning buffers and bounds-checked slices.
//!
//! A [`DeviceBuffer`] is a reference-counted handle to one allocation (or one imported mapping).
//! Asynchronous operations keep a clone until they have run, so dropping the last user handle
//! while a stream still uses the memory is safe: the memory is released after the stream is
//! done with it.

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::caps::BackendKind;
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

impl DeviceBuffer {
    /// Wraps a backend allocation.
    pub fn new(inner: Arc<dyn Allocation>) -> Self {
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
        BufferSlice {
            buf: self.clone(),
            offset: 0,
            len: self.len(),
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
