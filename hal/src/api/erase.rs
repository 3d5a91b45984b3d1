//! The object-safe traits for every [`Api`]'s types: one adapter per trait, and the only place
//! where a trait object handed to another is turned back into the backend's own type.
//!
//! The rest of the library holds `Arc<dyn Device>`, `Arc<dyn Stream>`, … and may hand a kernel
//! of one backend to a stream of another; the adapter answers that with an error naming both,
//! never with the wrong type.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::{Api, DeviceApi, EventApi, GraphApi, KernelApi, StreamApi};
use crate::caps::DeviceInfo;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ipc::IpcHandle;
use crate::kernel::{Kernel, KernelId, LaunchConfig};
use crate::memory::{BufferSlice, DeviceBuffer, DevicePtr, MemoryKind};
use crate::module::KernelModule;
use crate::multicast::MulticastGroup;
use crate::stream::{DynStream, Event, Graph, Stream, WaitCmp};

/// The `A` device behind a device a registry opened: how code generic over `A` starts from the
/// `Arc<dyn Device>` the rest of the library holds (once, not per call).
pub fn typed_device<A: Api>(device: &Arc<dyn Device>) -> Result<Arc<A::Device>> {
    let name = device.info().backend;
    device
        .clone()
        .into_any()
        .downcast::<A::Device>()
        .map_err(|_| {
            Error::invalid(format!(
                "a device of the {name} backend is not a device of the {} backend",
                A::NAME
            ))
        })
}

/// The `A` stream behind a stream trait object: what [`Api::stream_of`] is for a backend.
pub fn typed_stream<A: Api>(stream: &DynStream) -> Result<&A::Stream> {
    stream.as_any().downcast_ref::<A::Stream>().ok_or_else(|| {
        Error::invalid(format!(
            "a stream of another backend was handed to the {} backend",
            A::NAME
        ))
    })
}

impl<D: DeviceApi> Device for D {
    fn info(&self) -> &DeviceInfo {
        DeviceApi::info(self)
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        DeviceApi::alloc(self, bytes, kind)
    }

    fn lost(&self) -> bool {
        DeviceApi::lost(self)
    }

    fn alloc_pieces(&self, piece_bytes: usize, count: usize) -> Result<DeviceBuffer> {
        DeviceApi::alloc_pieces(self, piece_bytes, count)
    }

    fn shareable(&self) -> Option<&dyn crate::Shareable> {
        DeviceApi::shareable(self)
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(DeviceApi::create_stream(self)?)
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        Ok(DeviceApi::create_event(self)?)
    }

    fn create_ordering_event(&self) -> Result<Arc<dyn Event>> {
        Ok(DeviceApi::create_ordering_event(self)?)
    }

    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        DeviceApi::ipc_export(self, buf)
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        DeviceApi::ipc_import(self, handle)
    }

    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        DeviceApi::multicast_create(self, bytes, members)
    }

    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        DeviceApi::multicast_import(self, handle)
    }

    fn load(&self, module: &'static KernelModule, id: KernelId) -> Result<Arc<dyn Kernel>> {
        Ok(DeviceApi::load(self, module, id)?)
    }

    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        unsafe { DeviceApi::wrap_external(self, ptr, len) }
    }

    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        DeviceApi::allocation_range(self, ptr)
    }

    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<dyn Stream>> {
        // SAFETY: forwarded contract.
        Ok(unsafe { DeviceApi::wrap_stream(self, native) }?)
    }

    fn make_current(&self) -> Result<()> {
        DeviceApi::make_current(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl<S: StreamApi> Stream for S {
    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        StreamApi::copy(self, dst, src)
    }

    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        StreamApi::fill(self, dst, value)
    }

    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        StreamApi::write_value64(self, dst, value)
    }

    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        StreamApi::wait_value64(self, flag, value, cmp)
    }

    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        StreamApi::write_from_host(self, dst, src)
    }

    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        StreamApi::read_to_host(self, dst, src)
    }

    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let name = <S::A as Api>::NAME;
        let k = kernel
            .as_any()
            .downcast_ref::<<S::A as Api>::Kernel>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel {} was not loaded by the {name} backend of the stream it was \
                     launched on",
                    kernel.id()
                ))
            })?;
        // SAFETY: forwarded contract.
        unsafe { StreamApi::launch_raw(self, k, cfg, args) }
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        StreamApi::record(self, event_of::<S::A>(event)?)
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        StreamApi::wait_event(self, event_of::<S::A>(event)?)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        StreamApi::synchronize_timeout(self, timeout)
    }

    fn synchronize(&self) -> Result<()> {
        StreamApi::synchronize(self)
    }

    fn begin_capture(&self) -> Result<()> {
        StreamApi::begin_capture(self)
    }

    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        Ok(StreamApi::end_capture(self)?)
    }

    fn is_capturing(&self) -> Result<bool> {
        StreamApi::is_capturing(self)
    }

    fn device_lost(&self) -> bool {
        StreamApi::device_lost(self)
    }

    fn native_handle(&self) -> Option<u64> {
        StreamApi::native_handle(self)
    }

    unsafe fn record_native_event(&self, native: u64) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { StreamApi::record_native_event(self, native) }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `event` as an `A` event.
fn event_of<A: Api>(event: &dyn Event) -> Result<&A::Event> {
    event.as_any().downcast_ref::<A::Event>().ok_or_else(|| {
        Error::invalid(format!(
            "event was not created by the {} backend it was handed to",
            A::NAME
        ))
    })
}

impl<E: EventApi> Event for E {
    fn query(&self) -> Result<bool> {
        EventApi::query(self)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        EventApi::synchronize_timeout(self, timeout)
    }

    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64> {
        EventApi::elapsed_ms_since(self, event_of::<E::A>(start)?)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<K: KernelApi> Kernel for K {
    fn id(&self) -> KernelId {
        KernelApi::id(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn max_threads_per_block(&self) -> Option<u32> {
        KernelApi::max_threads_per_block(self)
    }
}

impl<G: GraphApi> Graph for G {
    fn launch(&self, stream: &dyn Stream) -> Result<()> {
        let name = <G::A as Api>::NAME;
        let s = stream
            .as_any()
            .downcast_ref::<<G::A as Api>::Stream>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "a {name} graph launched on a stream of another backend"
                ))
            })?;
        GraphApi::launch(self, s)
    }
}
