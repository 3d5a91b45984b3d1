//! Backends and their devices.

use std::fmt;
use std::sync::Arc;

use crate::caps::{BackendKind, DeviceInfo, PeerMatrix};
use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::kernel::{Kernel, KernelId};
use crate::memory::{DeviceBuffer, MemoryKind};
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
}

/// One opened device.
pub trait Device: Send + Sync + fmt::Debug {
    /// Its properties and capabilities.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `bytes` (more than zero) of memory of `kind`. Contents are unspecified.
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer>;

    /// Creates an in-order stream.
    fn create_stream(&self) -> Result<Arc<dyn Stream>>;

    /// Creates an event that records timing.
    fn create_event(&self) -> Result<Arc<dyn Event>>;

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

    /// Loads (compiling or looking up as the backend needs) the kernel `id`.
    fn load_kernel(&self, id: KernelId) -> Result<Arc<dyn Kernel>>;

    /// Makes this device current on the calling thread for vendor libraries used beside the
    /// HAL (NCCL reads the current CUDA context); a no-op where there is no such notion.
    fn make_current(&self) -> Result<()> {
        Ok(())
    }
}
