//! The typed HAL: one [`Api`] per backend, naming its device, stream, event, kernel and graph
//! types, and traits whose methods take those sibling types directly.
//!
//! A backend implements these traits ([`DeviceApi`], [`StreamApi`], [`EventApi`],
//! [`KernelApi`], [`GraphApi`]); the object-safe traits the rest of the library holds as
//! `Arc<dyn …>` ([`crate::Device`], [`crate::Stream`], …) are then provided for it by one
//! adapter each ([`erase`]). So a backend's code never downcasts: a stream's `launch_raw` gets
//! the backend's own kernel type, checked by the compiler. The adapter is the one place where a
//! trait object handed to another (a `&dyn Kernel` to a `dyn Stream`) is turned back into the
//! backend's type, with an error naming both sides when it belongs to another backend.
//!
//! Code generic over `A: Api` calls the typed traits and reaches the vendor with no downcast at
//! all; [`typed_device`] gets an `A`'s device out of the `Arc<dyn Device>` a registry opened,
//! once. The contract of every method is the object-safe trait's of the same name.

pub mod erase;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::caps::DeviceInfo;
use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::kernel::{KernelArgs, KernelId, LaunchConfig};
use crate::memory::{BufferSlice, DeviceBuffer, DevicePtr, ExternalAllocation, MemoryKind};
use crate::module::KernelModule;
use crate::multicast::MulticastGroup;
use crate::stream::WaitCmp;

pub use erase::{typed_device, typed_stream};

/// A backend's family of types. Every type is the backend's own (sized): the object-safe
/// traits the layers above hold as `Arc<dyn …>` are derived from the typed ones by one blanket
/// impl each ([`erase`]), and code generic over `A` is compiled once per backend.
pub trait Api: Sized + Send + Sync + fmt::Debug + 'static {
    /// The backend's name in errors ("cuda", "rocm", "host").
    const NAME: &'static str;
    /// An opened device.
    type Device: DeviceApi<A = Self>;
    /// An in-order stream.
    type Stream: StreamApi<A = Self>;
    /// An event.
    type Event: EventApi<A = Self>;
    /// A loaded kernel.
    type Kernel: KernelApi<A = Self>;
    /// A captured graph.
    type Graph: GraphApi<A = Self>;

    /// This backend's device behind a device a registry opened (an error naming both backends
    /// where it is another's): how code written over `A` starts from the `Arc<dyn Device>` the
    /// registry hands out, once at set-up.
    fn device_of(device: &Arc<dyn crate::Device>) -> Result<Arc<Self::Device>> {
        typed_device::<Self>(device)
    }

    /// The same stream as a trait object, for the code that holds the run-time types (timing,
    /// a vendor library beside us on the stream).
    fn erase_stream(stream: Arc<Self::Stream>) -> Arc<dyn crate::Stream> {
        stream
    }

    /// The stream behind a trait object as this backend's type (an error naming the backend
    /// where it is another's): the one check a call that comes in through the trait objects
    /// pays before running on the backend's own types.
    fn stream_of(stream: &crate::DynStream) -> Result<&Self::Stream> {
        typed_stream::<Self>(stream)
    }
}

/// The device of an [`Api`]: [`crate::Device`] with the backend's own stream, event and kernel
/// types.
pub trait DeviceApi: Send + Sync + fmt::Debug + 'static {
    /// The backend.
    type A: Api<Device = Self>;

    /// See [`crate::Device::info`].
    fn info(&self) -> &DeviceInfo;
    /// See [`crate::Device::alloc`].
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer>;
    /// See [`crate::Device::shareable`].
    fn shareable(&self) -> Option<&dyn crate::Shareable> {
        None
    }
    /// See [`crate::Device::alloc_pieces`].
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
    /// See [`crate::Device::lost`].
    fn lost(&self) -> bool {
        false
    }
    /// See [`crate::Device::create_stream`].
    fn create_stream(&self) -> Result<Arc<<Self::A as Api>::Stream>>;
    /// See [`crate::Device::create_event`].
    fn create_event(&self) -> Result<Arc<<Self::A as Api>::Event>>;
    /// See [`crate::Device::create_ordering_event`].
    fn create_ordering_event(&self) -> Result<Arc<<Self::A as Api>::Event>> {
        self.create_event()
    }
    /// See [`crate::Device::ipc_export`].
    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle>;
    /// See [`crate::Device::ipc_import`].
    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer>;
    /// See [`crate::Device::multicast_create`].
    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>>;
    /// See [`crate::Device::multicast_import`].
    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>>;
    /// See [`crate::Device::load`].
    fn load(
        &self,
        module: &'static KernelModule,
        id: KernelId,
    ) -> Result<Arc<<Self::A as Api>::Kernel>>;

    /// See [`crate::Device::wrap_external`].
    ///
    /// # Safety
    /// As for [`crate::Device::wrap_external`].
    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        let a = unsafe { ExternalAllocation::new(self.info(), ptr, len)? };
        Ok(DeviceBuffer::new(Arc::new(a)))
    }
    /// See [`crate::Device::allocation_range`].
    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        let _ = ptr;
        Ok(None)
    }
    /// See [`crate::Device::wrap_stream`].
    ///
    /// # Safety
    /// As for [`crate::Device::wrap_stream`].
    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<<Self::A as Api>::Stream>> {
        let _ = native;
        Err(crate::Error::unavailable(
            "wrapping a native stream",
            format!("the {} backend has no native streams", self.info().backend),
        ))
    }
    /// See [`crate::Device::make_current`].
    fn make_current(&self) -> Result<()> {
        Ok(())
    }
}

/// The stream of an [`Api`]: [`crate::Stream`] with the backend's own kernel, event and graph
/// types.
pub trait StreamApi: Send + Sync + fmt::Debug + 'static {
    /// The backend.
    type A: Api<Stream = Self>;

    /// See [`crate::Stream::copy`].
    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()>;
    /// See [`crate::Stream::fill`].
    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()>;
    /// See [`crate::Stream::write_value64`].
    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()>;
    /// See [`crate::Stream::wait_value64`].
    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        let _ = (flag, value, cmp);
        Err(crate::Error::unavailable(
            "stream wait on a value",
            "this backend's streams cannot wait on a memory word",
        ))
    }
    /// See [`crate::Stream::write_from_host`].
    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()>;
    /// See [`crate::Stream::read_to_host`].
    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()>;

    /// See [`crate::Stream::launch_raw`].
    ///
    /// # Safety
    /// As for [`crate::Stream::launch_raw`].
    unsafe fn launch_raw(
        &self,
        kernel: &<Self::A as Api>::Kernel,
        cfg: LaunchConfig,
        args: &[u8],
    ) -> Result<()>;

    /// Enqueues a kernel with a typed argument struct.
    ///
    /// # Safety
    /// As for [`crate::Stream::launch_raw`].
    unsafe fn launch<T: KernelArgs>(
        &self,
        kernel: &<Self::A as Api>::Kernel,
        cfg: LaunchConfig,
        args: &T,
    ) -> Result<()>
    where
        Self: Sized,
    {
        // SAFETY: forwarded contract.
        unsafe { self.launch_raw(kernel, cfg, args.as_bytes()) }
    }

    /// See [`crate::Stream::record`].
    fn record(&self, event: &<Self::A as Api>::Event) -> Result<()>;
    /// See [`crate::Stream::wait_event`].
    fn wait_event(&self, event: &<Self::A as Api>::Event) -> Result<()>;
    /// See [`crate::Stream::synchronize_timeout`].
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()>;
    /// See [`crate::Stream::synchronize`].
    fn synchronize(&self) -> Result<()> {
        self.synchronize_timeout(Duration::from_secs(3600))
    }
    /// See [`crate::Stream::begin_capture`].
    fn begin_capture(&self) -> Result<()> {
        Err(crate::Error::unavailable(
            "graph capture",
            "this backend does not capture streams into graphs",
        ))
    }
    /// See [`crate::Stream::end_capture`].
    fn end_capture(&self) -> Result<Box<<Self::A as Api>::Graph>> {
        Err(crate::Error::unavailable(
            "graph capture",
            "this backend does not capture streams into graphs",
        ))
    }
    /// See [`crate::Stream::is_capturing`].
    fn is_capturing(&self) -> Result<bool> {
        Ok(false)
    }
    /// See [`crate::Stream::device_lost`].
    fn device_lost(&self) -> bool {
        false
    }
    /// See [`crate::Stream::native_handle`].
    fn native_handle(&self) -> Option<u64> {
        None
    }
    /// See [`crate::Stream::record_native_event`].
    ///
    /// # Safety
    /// As there.
    unsafe fn record_native_event(&self, native: u64) -> Result<()> {
        let _ = native;
        Err(crate::Error::unavailable(
            "recording a native event",
            "this backend has no native events",
        ))
    }
}

/// The event of an [`Api`].
pub trait EventApi: Send + Sync + fmt::Debug + 'static {
    /// The backend.
    type A: Api<Event = Self>;

    /// See [`crate::Event::query`].
    fn query(&self) -> Result<bool>;
    /// See [`crate::Event::synchronize_timeout`].
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()>;
    /// See [`crate::Event::elapsed_ms_since`].
    fn elapsed_ms_since(&self, start: &<Self::A as Api>::Event) -> Result<f64>;
}

/// The loaded kernel of an [`Api`].
pub trait KernelApi: Send + Sync + fmt::Debug + 'static {
    /// The backend.
    type A: Api<Kernel = Self>;

    /// See [`crate::Kernel::id`].
    fn id(&self) -> KernelId;
    /// See [`crate::Kernel::max_threads_per_block`].
    fn max_threads_per_block(&self) -> Option<u32> {
        None
    }
}

/// The captured graph of an [`Api`].
pub trait GraphApi: Send + Sync + fmt::Debug + 'static {
    /// The backend.
    type A: Api<Graph = Self>;

    /// See [`crate::Graph::launch`].
    fn launch(&self, stream: &<Self::A as Api>::Stream) -> Result<()>;
}
