//! Backends and their devices.

use std::fmt;
use std::sync::Arc;

use crate::caps::{BackendKind, DeviceInfo, PeerMatrix};
use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::kernel::{Kernel, KernelId};
use crate::memory::{DeviceBuffer, DevicePtr, ExternalAllocation, MemoryKind};
use crate::module::KernelModule;
use crate::multicast::MulticastGroup;
use crate::stream::{Event, Stream};

/// A vendor runtime (or the host), probed and opened at run time.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// A one-line description: library paths, driver version, device count.
    fn describe(&self) -> String;
    /// Number of devices.
    fn device_count(&self) -> usize;
    /// Properties of device `ordinal`.
    fn device_info(&self, ordinal: usize) -> Result<DeviceInfo>;
    /// Opens device `ordinal` (a context / a handle to it).
    fn open_device(&self, ordinal: usize) -> Result<Arc<dyn Device>>;
    /// Which devices can map each other's memory.
    fn peer_access(&self) -> Result<PeerMatrix>;

    /// The ordinal of the device current on the calling thread (CUDA: the device of the current
    /// context), for libraries that follow the caller's choice of device (the NCCL-compatible
    /// library). `None` where there is no current device or the backend has no such notion.
    fn current_device(&self) -> Result<Option<usize>> {
        Ok(None)
    }
}

/// One opened device.
pub trait Device: Send + Sync + fmt::Debug {
    /// Its properties and capabilities.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `bytes` (more than zero) of memory of `kind`. Contents are unspecified.
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer>;

    /// Allocates one contiguous range made of `count` separate mappings of at least
    /// `piece_bytes` each (rounded up to the backend's mapping granularity), as virtual-memory
    /// allocators make (PyTorch's expandable segments): [`Device::allocation_range`] names each
    /// piece as its own allocation, while the range is one buffer to every other call. Freed as
    /// one. For tests and callers that must reproduce such memory; `Unavailable` where the
    /// backend cannot map pieces into one range.
    fn alloc_pieces(&self, piece_bytes: usize, count: usize) -> Result<DeviceBuffer> {
        let _ = (piece_bytes, count);
        Err(crate::Error::unavailable(
            "a range of several mappings",
            format!(
                "the {} backend cannot map pieces into one range",
                self.info().backend
            ),
        ))
    }

    /// Its shareable memory ([`crate::Shareable`]: memory other processes of the host map at
    /// addresses they choose), where the backend has it; `None` otherwise.
    fn shareable(&self) -> Option<&dyn crate::Shareable> {
        None
    }

    /// Whether the device was reset under us by someone else (the application's
    /// `cudaDeviceReset` while our objects live): its memory, host-mapped memory included, is
    /// freed. See [`Stream::device_lost`]. Never on the host backend.
    fn lost(&self) -> bool {
        false
    }

    /// Creates an in-order stream.
    fn create_stream(&self) -> Result<Arc<dyn Stream>>;

    /// Creates an event that records timing.
    fn create_event(&self) -> Result<Arc<dyn Event>>;

    /// Creates an event for ordering only (no timing, which makes recording it cheaper on
    /// GPUs); backends without the distinction return a timing event.
    fn create_ordering_event(&self) -> Result<Arc<dyn Event>> {
        self.create_event()
    }

    /// Exports an allocation made by this device (not an imported one) for other processes.
    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle>;

    /// Maps an allocation exported by another process (or this one) of the same host.
    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer>;

    /// Creates a multicast group of `members` buffers of `bytes` each (see
    /// [`crate::multicast`]); fails with `Unavailable` where multicast is not supported or is
    /// disabled.
    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>>;

    /// Opens a multicast group exported by another member.
    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>>;

    /// Loads kernel `id` of `module`: GPU backends compile the module's source for the device
    /// (once per device, cached on disk), the host backend takes the kernel's host function.
    /// [`crate::TypedKernel::load`] ties the result to the kernel's argument struct.
    fn load(&self, module: &'static KernelModule, id: KernelId) -> Result<Arc<dyn Kernel>>;

    /// Wraps `len` bytes of caller-owned memory at `ptr` as a buffer of this device without
    /// taking ownership: dropping the buffer frees nothing. The default describes the memory
    /// with [`ExternalAllocation`] after checking only that the range is well formed; backends
    /// that can ask their driver about an address (CUDA) check that it is their memory.
    ///
    /// # Safety
    /// As for [`ExternalAllocation::new`]: the memory must belong to this device and stay
    /// allocated while the buffer and any work enqueued with it are in use.
    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        let a = unsafe { ExternalAllocation::new(self.info(), ptr, len)? };
        Ok(DeviceBuffer::new(Arc::new(a)))
    }

    /// The allocation that holds `ptr` (its start and length), where this backend can tell:
    /// GPU backends ask their runtime, which names any of its allocations (a framework's
    /// included); the host backend knows the memory it mapped itself. `Ok(None)` where it cannot
    /// (an address the runtime does not know, host memory the host backend did not map, or a
    /// backend without the notion). Callers that
    /// wrap many ranges of a few allocations (a framework's caching allocator carves tensors out
    /// of large segments) learn each allocation once and wrap the ranges inside it without asking
    /// again.
    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        let _ = ptr;
        Ok(None)
    }

    /// Wraps a stream the caller owns (`CUstream`, `hipStream_t` as an integer; 0 is the
    /// vendor's default stream) without taking ownership: dropping the result neither destroys
    /// the stream nor waits for it. Work enqueued through the wrapper does not keep buffers
    /// alive: the stream's owner orders frees after the work, as NCCL callers do. Backends
    /// without native streams (the host) return an error.
    ///
    /// # Safety
    /// `native` must be a live stream of this device that outlives the returned value.
    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<dyn Stream>> {
        let _ = native;
        Err(crate::Error::unavailable(
            "wrapping a native stream",
            format!("the {} backend has no native streams", self.info().backend),
        ))
    }

    /// Makes this device current on the calling thread for vendor libraries used beside the
    /// HAL (NCCL reads the current CUDA context); a no-op where there is no such notion.
    fn make_current(&self) -> Result<()> {
        Ok(())
    }

    /// Backend-specific access for downcasting.
    fn as_any(&self) -> &dyn std::any::Any;

    /// The device as a shared `Any`, for [`crate::api::typed_device`]: how code generic over a
    /// backend's [`crate::api::Api`] gets the backend's own device type, once.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}
