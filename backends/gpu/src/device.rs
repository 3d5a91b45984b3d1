//! The backend and its devices; the per-device context they hold is [`crate::context`]'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_hal::{
    Backend, Capabilities, Device, DeviceApi, DeviceBuffer, DeviceInfo, DevicePtr, Error,
    IpcHandle, KernelId, KernelModule, MemoryKind, MulticastGroup, MulticastSupport, PeerMatrix,
    Result,
};

pub use crate::context::Context;
use crate::memory::{self, GpuAllocation};
use crate::module::{self, GpuKernel, LoadedModule, ModuleKey};
use crate::multicast;
use crate::runtime::{Features, Runtime};
use crate::stream::{GpuEvent, GpuStream};
use crate::{ipc, multicast::support};

/// What every GPU device offers (IPC, mapped host memory, kernels); `caps.multicast` is decided
/// by [`GpuBackend::open`], LL128 by the vendor.
pub fn capabilities(ll128: bool) -> Capabilities {
    Capabilities {
        ipc: true,
        host_mapped_memory: true,
        device_memory_host_accessible: false,
        kernels: true,
        multicast: MulticastSupport::Unsupported(String::new()),
        ll128,
    }
}

/// A GPU backend over runtime `R`.
#[derive(Debug)]
pub struct GpuBackend<R: Runtime> {
    rt: &'static R,
    infos: Vec<DeviceInfo>,
}

impl<R: Runtime> GpuBackend<R> {
    /// Enumerates the devices of an opened runtime (the vendor's probe has checked it).
    pub fn open(rt: &'static R) -> Result<Self> {
        let features = rt.features();
        let mut infos = rt.device_infos()?;
        for info in &mut infos {
            let ordinal = info.ordinal;
            info.caps.multicast = support(
                &R::VENDOR,
                mscclpp_hal::env::multicast_disabled(),
                features.multicast_symbols,
                || rt.multicast_supported(ordinal),
            );
        }
        Ok(GpuBackend { rt, infos })
    }

    /// The runtime.
    pub fn runtime(&self) -> &'static R {
        self.rt
    }

    /// What the runtime offers beyond the required calls.
    pub fn features(&self) -> Features {
        self.rt.features()
    }

    /// Opens device `ordinal` as its concrete type.
    pub fn open_gpu_device(&self, ordinal: usize) -> Result<Arc<GpuDevice<R>>> {
        let info = self.device_info(ordinal)?;
        let ctx = Context::retain(self.rt, ordinal)?;
        ctx.bind()?;
        let shareable = self
            .rt
            .vmm_shareable_granularity(ordinal)
            .ok()
            .map(|_| crate::shareable::GpuShareable { ctx: ctx.clone() });
        Ok(Arc::new(GpuDevice {
            info,
            shareable,
            ctx,
            modules: Mutex::new(HashMap::new()),
        }))
    }
}

impl<R: Runtime> Backend for GpuBackend<R> {
    fn kind(&self) -> mscclpp_hal::BackendKind {
        R::VENDOR.kind
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self
            .infos
            .iter()
            .map(|i| format!("{} ({})", i.name, i.arch))
            .collect();
        format!(
            "{} backend: {}, {} device(s): {}",
            R::VENDOR.name,
            self.rt.describe(),
            self.infos.len(),
            names.join(", ")
        )
    }

    fn device_count(&self) -> usize {
        self.infos.len()
    }

    fn device_info(&self, ordinal: usize) -> Result<DeviceInfo> {
        self.infos.get(ordinal).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "device {ordinal} does not exist: the {} backend has {} devices",
                R::VENDOR.name,
                self.infos.len()
            ))
        })
    }

    fn open_device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(self.open_gpu_device(ordinal)?)
    }

    fn current_device(&self) -> Result<Option<usize>> {
        self.rt.current_device()
    }

    fn peer_access(&self) -> Result<PeerMatrix> {
        PeerMatrix::try_from_peers(self.infos.len(), |i, j| self.rt.can_access_peer(i, j))
    }
}

/// One opened device of a GPU backend.
#[derive(Debug)]
pub struct GpuDevice<R: Runtime> {
    info: DeviceInfo,
    ctx: Arc<Context<R>>,
    /// Its shareable memory, where the runtime has it (`None`: see `Device::shareable`).
    shareable: Option<crate::shareable::GpuShareable<R>>,
    /// Modules loaded into this device's context, by module name and source hash; each is
    /// loaded once.
    modules: Mutex<HashMap<ModuleKey, Arc<LoadedModule<R>>>>,
}

impl<R: Runtime> GpuDevice<R> {
    /// The device's context.
    pub fn context(&self) -> &Arc<Context<R>> {
        &self.ctx
    }

    /// Creates a stream as its concrete type.
    pub fn create_gpu_stream(&self) -> Result<GpuStream<R>> {
        GpuStream::new(self.ctx.clone(), self.info.max_threads_per_block)
    }
}

impl<R: Runtime> DeviceApi for GpuDevice<R> {
    type A = crate::Gpu<R>;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn lost(&self) -> bool {
        self.ctx.lost()
    }

    fn make_current(&self) -> Result<()> {
        self.ctx.bind()
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer::new(Arc::new(GpuAllocation::new(
            self.ctx.clone(),
            bytes,
            kind,
        )?)))
    }

    fn create_stream(&self) -> Result<Arc<GpuStream<R>>> {
        Ok(Arc::new(self.create_gpu_stream()?))
    }

    fn create_event(&self) -> Result<Arc<GpuEvent<R>>> {
        Ok(Arc::new(GpuEvent::new(self.ctx.clone())?))
    }

    fn create_ordering_event(&self) -> Result<Arc<GpuEvent<R>>> {
        Ok(Arc::new(GpuEvent::new_untimed(self.ctx.clone())?))
    }

    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        ipc::export(&self.ctx, buf)
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        ipc::import(&self.ctx, handle)
    }

    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        multicast::create::<R>(&self.info.caps.multicast, bytes, members)
    }

    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        multicast::import::<R>(&self.info.caps.multicast, handle)
    }

    fn shareable(&self) -> Option<&dyn mscclpp_hal::Shareable> {
        self.shareable
            .as_ref()
            .map(|s| s as &dyn mscclpp_hal::Shareable)
    }

    fn alloc_pieces(&self, piece_bytes: usize, count: usize) -> Result<DeviceBuffer> {
        let a = GpuAllocation::pieces(self.ctx.clone(), piece_bytes, count)?;
        Ok(DeviceBuffer::new(Arc::new(a)))
    }

    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        memory::allocation_range(&self.ctx, ptr)
    }

    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        unsafe { memory::wrap_external(&self.ctx, &self.info, ptr, len) }
    }

    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<GpuStream<R>>> {
        if !self.ctx.runtime().features().borrowed_streams {
            return Err(Error::unavailable(
                "wrapping a native stream",
                format!(
                    "the {} runtime in use cannot lend its streams",
                    R::VENDOR.runtime
                ),
            ));
        }
        // SAFETY: forwarded contract (a live stream of this device that outlives the wrapper).
        Ok(Arc::new(unsafe {
            GpuStream::borrowed(
                self.ctx.clone(),
                R::stream_from_native(native),
                self.info.max_threads_per_block,
            )
        }))
    }

    fn load(&self, module: &'static KernelModule, id: KernelId) -> Result<Arc<GpuKernel<R>>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Arc::new(module::load_kernel(
            &self.ctx,
            &self.info.arch,
            &mut modules,
            module,
            id,
        )?))
    }
}
