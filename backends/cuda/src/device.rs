//! The CUDA backend and its devices: enumeration, properties, the peer matrix, and the primary
//! context every driver call runs in.
//!
//! **Context handling.** A device is opened by retaining its *primary context*
//! (`cuDevicePrimaryCtxRetain`, released on drop), the context the CUDA runtime and PyTorch use
//! too, so memory and streams are shared with them. The HAL is called from many threads (the
//! proxy, tests, stream users), and the driver's "current context" is per thread: every call
//! that touches the driver first makes the owning context current on the calling thread
//! ([`Context::bind`], one `cuCtxSetCurrent`, cheap). Every object that owns driver resources
//! (allocations, streams, events, modules) holds an `Arc<Context>`, so the context outlives them.

use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use mscclpp_hal::{
    Backend, BackendKind, Capabilities, Device, DeviceBuffer, DeviceInfo, DevicePtr, Error, Event,
    ExternalAllocation, IpcHandle, IpcHandleKind, Kernel, KernelId, MemoryKind, MulticastGroup,
    PeerMatrix, Result, Stream,
};

use crate::driver::{self, check};
use crate::memory::{self, CudaAllocation};
use crate::module::{self, LoadedModule};
use crate::multicast;
use crate::stream::{CudaEvent, CudaStream};

/// Optional driver features found by the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `cuEventElapsedTime_v2` exists (CUDA 12.8+).
    pub elapsed_time_v2: bool,
    /// `cuEventElapsedTime` (the pre-12.8 name) exists.
    pub elapsed_time_v1: bool,
    /// `cuFuncGetParamInfo` exists (CUDA 12.4+): launches check the argument size.
    pub func_param_info: bool,
    /// Every `cuMulticast*` entry point exists (never called by this build).
    pub multicast_symbols: bool,
}

/// A retained primary context of one device.
#[derive(Debug)]
pub struct Context {
    ordinal: usize,
    dev: sys::CUdevice,
    raw: sys::CUcontext,
}

// SAFETY: a CUcontext is a driver handle usable from any thread (each thread makes it current
// before use); the value only stores the handle.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only hands out the handle to driver calls.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`.
    pub(crate) fn retain(ordinal: usize, dev: sys::CUdevice) -> Result<Arc<Self>> {
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `dev` came from cuDeviceGet. Balanced by the release in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, dev)
        })?;
        Ok(Arc::new(Context { ordinal, dev, raw }))
    }

    /// Makes this context current on the calling thread; call before any driver call that
    /// needs one.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained (live) primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.raw) })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Context::retain`; every user of the context holds an
        // `Arc<Context>`, so none is left.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        if let Err(e) = check("cuDevicePrimaryCtxRelease", r) {
            tracing::warn!(device = self.ordinal, "{e}");
        }
    }
}

/// The NVIDIA backend: the CUDA driver opened at run time through cudarc.
#[derive(Debug)]
pub struct CudaBackend {
    driver_version: i32,
    devices: Vec<sys::CUdevice>,
    infos: Vec<DeviceInfo>,
    features: Features,
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute, name: &'static str) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; `dev` is a valid device handle; no context is needed.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })
    .map_err(|e| e.with_context(|| format!("attribute {name}")))?;
    Ok(v)
}

fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn query_info(ordinal: usize, dev: sys::CUdevice, features: &Features) -> Result<DeviceInfo> {
    use sys::CUdevice_attribute as A;
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
    })?;
    let mut total = 0usize;
    // SAFETY: valid out-pointer.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut total, dev)
    })?;
    let mut bus = [0 as c_char; 64];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    let pci_bus_id =
        match unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, dev) } {
            sys::CUresult::CUDA_SUCCESS => Some(c_buf_to_string(&bus)).filter(|s| !s.is_empty()),
            _ => None,
        };
    let major = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "compute capability major",
    )?;
    let minor = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "compute capability minor",
    )?;
    let sms = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "multiprocessor count",
    )?;
    let max_threads = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        "max threads per block",
    )?;
    let warp = attr(dev, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, "warp size")?;
    let multicast = multicast::support(
        mscclpp_hal::env::multicast_disabled(),
        features.multicast_symbols,
        || {
            attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
                "multicast supported",
            )
            .map(|v| v != 0)
        },
    );
    Ok(DeviceInfo {
        backend: BackendKind::Cuda,
        ordinal,
        name: c_buf_to_string(&name),
        arch: format!("sm_{major}{minor}"),
        total_memory: total as u64,
        warp_size: u32::try_from(warp).unwrap_or(32),
        multiprocessors: u32::try_from(sms).unwrap_or(0),
        max_threads_per_block: u32::try_from(max_threads).unwrap_or(0),
        pci_bus_id,
        caps: Capabilities {
            ipc: true,
            host_mapped_memory: true,
            device_memory_host_accessible: false,
            kernels: true,
            multicast,
            ll128: major >= 7,
        },
    })
}

impl CudaBackend {
    /// Opens the backend over a driver the probe has checked: every symbol in
    /// [`driver::REQUIRED_SYMBOLS`] is present and the version is at least
    /// [`driver::MIN_DRIVER_VERSION`]. (Calling it otherwise would let cudarc panic, hence
    /// crate-private; use [`crate::probe`].)
    pub(crate) fn open(driver_version: i32, features: Features) -> Result<Self> {
        // SAFETY: cuInit takes flags that must be 0; the symbol is present (probe).
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        let mut devices = Vec::new();
        let mut infos = Vec::new();
        for ordinal in 0..usize::try_from(count).unwrap_or(0) {
            let mut dev: sys::CUdevice = 0;
            // SAFETY: valid out-pointer; ordinal < count.
            check("cuDeviceGet", unsafe {
                sys::cuDeviceGet(&mut dev, ordinal as c_int)
            })?;
            infos.push(query_info(ordinal, dev, &features)?);
            devices.push(dev);
        }
        // LL128 lines are only known to arrive whole over NVLink: a device qualifies when every
        // other device of the node reaches it with native atomics (NVLink peers have them, PCIe
        // peers do not), so that whichever of them a peer rank runs on, the link is NVLink. A
        // process that sees one device only never uses them.
        for (i, info) in infos.iter_mut().enumerate() {
            let linked = devices.len() > 1
                && (0..devices.len()).filter(|&j| j != i).all(|j| {
                    let mut v: c_int = 0;
                    // SAFETY: valid out-pointer and device handles of this driver.
                    let r = unsafe {
                        sys::cuDeviceGetP2PAttribute(
                        &mut v,
                        sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                        devices[j],
                        devices[i],
                    )
                    };
                    r == sys::CUresult::CUDA_SUCCESS && v != 0
                });
            info.caps.ll128 &= linked;
        }
        Ok(CudaBackend {
            driver_version,
            devices,
            infos,
            features,
        })
    }

    /// The driver's `cuDriverGetVersion`, e.g. 13000.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The optional driver features found.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Opens device `ordinal` as its concrete type.
    pub fn open_cuda_device(&self, ordinal: usize) -> Result<Arc<CudaDevice>> {
        let info = self.device_info(ordinal)?;
        let ctx = Context::retain(ordinal, self.devices[ordinal])?;
        ctx.bind()?;
        Ok(Arc::new(CudaDevice {
            info,
            ctx,
            features: self.features,
            modules: Mutex::new(HashMap::new()),
        }))
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self
            .infos
            .iter()
            .map(|i| format!("{} ({})", i.name, i.arch))
            .collect();
        format!(
            "cuda backend: driver {} (CUDA driver library opened at run time), {} device(s): {}",
            driver::format_version(self.driver_version),
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
                "device {ordinal} does not exist: the cuda backend has {} devices",
                self.infos.len()
            ))
        })
    }

    fn open_device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(self.open_cuda_device(ordinal)?)
    }

    fn current_device(&self) -> Result<Option<usize>> {
        current_device_ordinal()
    }

    fn peer_access(&self) -> Result<PeerMatrix> {
        PeerMatrix::try_from_peers(self.devices.len(), |i, j| {
            let mut can: c_int = 0;
            // SAFETY: valid out-pointer and device handles.
            check("cuDeviceCanAccessPeer", unsafe {
                sys::cuDeviceCanAccessPeer(&mut can, self.devices[i], self.devices[j])
            })?;
            Ok(can != 0)
        })
    }
}

/// The ordinal of the device whose context is current on the calling thread (`cuCtxGetDevice`),
/// or `None` when no context is current. Reached through [`Backend::current_device`] of a probed
/// backend (the probe checks that the driver has the entry point).
pub(crate) fn current_device_ordinal() -> Result<Option<usize>> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; the probe checked the symbol exists.
    match unsafe { sys::cuCtxGetDevice(&mut dev) } {
        sys::CUresult::CUDA_SUCCESS => Ok(usize::try_from(dev).ok()),
        sys::CUresult::CUDA_ERROR_INVALID_CONTEXT => Ok(None),
        r => check("cuCtxGetDevice", r).map(|_| None),
    }
}

/// One opened CUDA device (its primary context).
#[derive(Debug)]
pub struct CudaDevice {
    info: DeviceInfo,
    ctx: Arc<Context>,
    features: Features,
    /// Modules loaded into this device's context, by module name; each is loaded once.
    modules: Mutex<HashMap<&'static str, Arc<LoadedModule>>>,
}

impl CudaDevice {
    /// The device's primary context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Creates a stream as its concrete type.
    pub fn create_cuda_stream(&self) -> Result<CudaStream> {
        CudaStream::new(self.ctx.clone(), self.info.max_threads_per_block)
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn make_current(&self) -> Result<()> {
        self.ctx.bind()
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer::new(Arc::new(CudaAllocation::new(
            self.ctx.clone(),
            bytes,
            kind,
        )?)))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(Arc::new(self.create_cuda_stream()?))
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(CudaEvent::new(self.ctx.clone(), self.features)?))
    }

    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        memory::export(&self.ctx, buf)
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        handle.expect(BackendKind::Cuda, IpcHandleKind::Memory)?;
        memory::import(&self.ctx, handle)
    }

    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        multicast::create(&self.info.caps.multicast, bytes, members)
    }

    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        multicast::import(&self.info.caps.multicast, handle)
    }

    /// Checks with `cuMemGetAddressRange` that the whole range lies inside one allocation the
    /// driver knows (device memory of any context, or registered/mapped host memory), then wraps
    /// it without taking ownership.
    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> Result<DeviceBuffer> {
        self.ctx.bind()?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; the context is current; the driver only looks the address up.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr.0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            let e = check("cuMemGetAddressRange", r).err();
            return Err(Error::invalid(format!(
                "address {ptr:?} ({len} bytes) is not memory the CUDA driver knows on device {} (a host pointer, a freed buffer or memory of another process?){}",
                self.info.ordinal,
                e.map(|e| format!(": {e}")).unwrap_or_default()
            )));
        }
        let end = ptr.0.checked_add(len as u64);
        if end.is_none_or(|end| end > base.saturating_add(size as u64)) {
            return Err(Error::invalid(format!(
                "{len} bytes at {ptr:?} run past the end of their allocation ({size} bytes at {:#x})",
                base
            )));
        }
        // SAFETY: forwarded contract; the range was just checked to be driver memory.
        let a = unsafe { ExternalAllocation::new(&self.info, ptr, len)? };
        Ok(DeviceBuffer::new(Arc::new(a)))
    }

    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<dyn Stream>> {
        // SAFETY: forwarded contract (a live stream of this device that outlives the wrapper).
        Ok(Arc::new(unsafe {
            CudaStream::borrowed(
                self.ctx.clone(),
                native as usize as sys::CUstream,
                self.info.max_threads_per_block,
            )
        }))
    }

    fn load_kernel(&self, id: KernelId) -> Result<Arc<dyn Kernel>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Arc::new(module::load_kernel(
            &self.ctx,
            &self.info.arch,
            self.features,
            &mut modules,
            id,
        )?))
    }
}
