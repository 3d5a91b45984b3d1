//! [`Dyn`]: the object-safe traits as an [`Api`], so that code written once over `A: Api` also
//! runs on whatever backend a registry opened at run time (`dyn Device`, `dyn Stream`, …), with
//! the backend's adapter checking each handed-over object, as before the typed layer existed.

use std::sync::Arc;
use std::time::Duration;

use super::{Api, DeviceApi, EventApi, GraphApi, KernelApi, StreamApi};
use crate::caps::DeviceInfo;
use crate::device::Device;
use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::kernel::{Kernel, KernelId, LaunchConfig};
use crate::memory::{BufferSlice, DeviceBuffer, DevicePtr, MemoryKind};
use crate::module::KernelModule;
use crate::multicast::MulticastGroup;
use crate::stream::{Event, Graph, Stream, WaitCmp};

/// [`Dyn`]'s stream, `dyn Stream + 'static` (what an `Arc<dyn Stream>` holds): how a function
/// that launches through [`crate::TypedKernel`] over `Dyn` names the stream it takes, since a
/// bare `&dyn Stream` parameter would be `&'a (dyn Stream + 'a)`.
pub type DynStream = dyn Stream;

/// The backend chosen at run time: its types are the trait objects.
#[derive(Debug, Clone, Copy)]
pub struct Dyn;

impl Api for Dyn {
    const NAME: &'static str = "run-time";
    type Device = dyn Device;
    type Stream = dyn Stream;
    type Event = dyn Event;
    type Kernel = dyn Kernel;
    type Graph = dyn Graph;

    fn device_of(device: &Arc<dyn Device>) -> Result<Arc<dyn Device>> {
        Ok(device.clone())
    }

    fn erase_stream(stream: Arc<dyn Stream>) -> Arc<dyn Stream> {
        stream
    }

    fn stream_of(stream: &DynStream) -> Result<&DynStream> {
        Ok(stream)
    }
}

impl DeviceApi for dyn Device {
    type A = Dyn;

    fn info(&self) -> &DeviceInfo {
        Device::info(self)
    }
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        Device::alloc(self, bytes, kind)
    }
    fn lost(&self) -> bool {
        Device::lost(self)
    }
    fn alloc_pieces(&self, piece_bytes: usize, count: usize) -> Result<DeviceBuffer> {
        Device::alloc_pieces(self, piece_bytes, count)
    }
    fn shareable(&self) -> Option<&dyn crate::Shareable> {
        Device::shareable(self)
    }
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Device::create_stream(self)
    }
    fn create_event(&self) -> Result<Arc<dyn Event>> {
        Device::create_event(self)
    }
    fn create_ordering_event(&self) -> Result<Arc<dyn Event>> {
        Device::create_ordering_event(self)
    }
    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        Device::ipc_export(self, buf)
    }
    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        Device::ipc_import(self, handle)
    }
    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        Device::multicast_create(self, bytes, members)
    }
    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        Device::multicast_import(self, handle)
    }
    fn load(&self, module: &'static KernelModule, id: KernelId) -> Result<Arc<dyn Kernel>> {
        Device::load(self, module, id)
    }
    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        unsafe { Device::wrap_external(self, ptr, len) }
    }
    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        Device::allocation_range(self, ptr)
    }
    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<dyn Stream>> {
        // SAFETY: forwarded contract.
        unsafe { Device::wrap_stream(self, native) }
    }
    fn make_current(&self) -> Result<()> {
        Device::make_current(self)
    }
}

impl StreamApi for dyn Stream {
    type A = Dyn;

    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        Stream::copy(self, dst, src)
    }
    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        Stream::fill(self, dst, value)
    }
    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        Stream::write_value64(self, dst, value)
    }
    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        Stream::wait_value64(self, flag, value, cmp)
    }
    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        Stream::write_from_host(self, dst, src)
    }
    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        Stream::read_to_host(self, dst, src)
    }
    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Stream::launch_raw(self, kernel, cfg, args) }
    }
    fn record(&self, event: &dyn Event) -> Result<()> {
        Stream::record(self, event)
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        Stream::wait_event(self, event)
    }
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        Stream::synchronize_timeout(self, timeout)
    }
    fn synchronize(&self) -> Result<()> {
        Stream::synchronize(self)
    }
    fn begin_capture(&self) -> Result<()> {
        Stream::begin_capture(self)
    }
    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        Stream::end_capture(self)
    }
    fn is_capturing(&self) -> Result<bool> {
        Stream::is_capturing(self)
    }
    fn device_lost(&self) -> bool {
        Stream::device_lost(self)
    }
    fn native_handle(&self) -> Option<u64> {
        Stream::native_handle(self)
    }
    unsafe fn record_native_event(&self, native: u64) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Stream::record_native_event(self, native) }
    }
}

impl EventApi for dyn Event {
    type A = Dyn;

    fn query(&self) -> Result<bool> {
        Event::query(self)
    }
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        Event::synchronize_timeout(self, timeout)
    }
    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64> {
        Event::elapsed_ms_since(self, start)
    }
}

impl KernelApi for dyn Kernel {
    type A = Dyn;

    fn id(&self) -> KernelId {
        Kernel::id(self)
    }
    fn max_threads_per_block(&self) -> Option<u32> {
        Kernel::max_threads_per_block(self)
    }
}

impl GraphApi for dyn Graph {
    type A = Dyn;

    fn launch(&self, stream: &dyn Stream) -> Result<()> {
        Graph::launch(self, stream)
    }
}
