//! The ROCm backend and its devices: enumeration, properties, the peer matrix.
//!
//! **Current device.** HIP has no contexts to retain: each thread has a *current device*
//! (`hipSetDevice`), and allocations, streams, events and module loads go to it. The HAL is
//! called from many threads (the proxy, tests, stream users), so every call that touches the
//! runtime first makes the owning device current on the calling thread ([`DeviceCtx::bind`], one
//! `hipSetDevice`, cheap). Every object that owns runtime resources holds an `Arc<DeviceCtx>`,
//! mirroring the CUDA backend's context handling.

use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex};

use mscclpp_hal::{
    Backend, BackendKind, Capabilities, Device, DeviceBuffer, DeviceInfo, Error, Event, IpcHandle,
    IpcHandleKind, Kernel, KernelId, MemoryKind, MulticastGroup, PeerMatrix, Result, Stream,
};

use crate::ffi::{self, Api, attr, props};
use crate::memory::{self, RocmAllocation};
use crate::module::{self, LoadedModule};
use crate::multicast;
use crate::runtime::{self, DriverInfo};
use crate::stream::{RocmEvent, RocmStream};

/// One device of the runtime, made current on the calling thread before each use.
#[derive(Debug)]
pub struct DeviceCtx {
    ordinal: usize,
    api: &'static Api,
    /// The runtime's major version (IPC flag values differ between 5 and 6).
    runtime_major: i32,
}

impl DeviceCtx {
    /// Makes this device current on the calling thread; call before any runtime call that
    /// needs one (HIP's current device is per thread).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the ordinal is below the device count (checked when the backend enumerated).
        self.api.check("hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal as c_int)
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The runtime.
    pub fn api(&self) -> &'static Api {
        self.api
    }

    /// The runtime's major version.
    pub fn runtime_major(&self) -> i32 {
        self.runtime_major
    }
}

/// The AMD backend: `libamdhip64` opened at run time.
#[derive(Debug)]
pub struct RocmBackend {
    api: &'static Api,
    driver: DriverInfo,
    infos: Vec<DeviceInfo>,
}

fn attribute(api: &Api, ordinal: c_int, a: c_int, name: &'static str) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; the ordinal is below the device count.
    api.check("hipDeviceGetAttribute", unsafe {
        (api.device_get_attribute)(&mut v, a, ordinal)
    })
    .map_err(|e| e.with_context(|| format!("attribute {name}")))?;
    Ok(v)
}

fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Whether `s` looks like an AMD target id: `gfx` + hex digits, optionally `:feature±` parts.
pub fn is_gfx_target(s: &str) -> bool {
    let base = s.split(':').next().unwrap_or("");
    base.len() > 3
        && base.starts_with("gfx")
        && base[3..].bytes().all(|b| b.is_ascii_hexdigit())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'+' | b'-' | b'_'))
}

/// The `gcnArchName` in a `hipDeviceProp_t` buffer: read at the layout's offset when that holds
/// a target id; otherwise found by scanning the buffer past the `name` field for a
/// NUL-delimited `gfx...` string (a guard against a layout that moved in a release we have not
/// seen). `None` when neither finds one.
pub fn arch_from_props(buf: &[u8], offset: usize) -> Option<String> {
    if let Some(field) = buf.get(offset..offset + props::GCN_ARCH_NAME_LEN) {
        let s = c_buf_to_string(field);
        if is_gfx_target(&s) {
            return Some(s);
        }
    }
    // Skip the 256-byte `name` at offset 0 (a marketing name may itself mention "gfx").
    let mut i = 256;
    while i + 4 <= buf.len() {
        if &buf[i..i + 3] == b"gfx" && buf[i - 1] == 0 {
            let end = buf[i..]
                .iter()
                .position(|&b| b == 0)
                .map_or(buf.len(), |p| i + p);
            let s = String::from_utf8_lossy(&buf[i..end]).into_owned();
            if is_gfx_target(&s) {
                return Some(s);
            }
        }
        i += 1;
    }
    None
}

/// The compile target for a device's `gcnArchName`: the processor without its feature suffix
/// (`gfx90a:sramecc+:xnack-` → `gfx90a`). A code object built for the bare processor has every
/// feature in "any" mode, which the loader accepts on each setting of that processor (LLVM's
/// AMDGPU target-id rules), so one cache entry serves all of them; the cost is code that must
/// also be correct with XNACK on.
pub fn compile_target(gcn_arch_name: &str) -> &str {
    gcn_arch_name.split(':').next().unwrap_or(gcn_arch_name)
}

/// `gcnArchName` of device `ordinal`, through the properties call whose layout we know.
fn gcn_arch_name(api: &Api, ordinal: c_int) -> Result<String> {
    // 8-byte aligned (the struct holds `size_t`s) and larger than either layout.
    let mut words = vec![0u64; props::BUFFER / 8];
    let (call, f, offset) = match api.get_device_properties_r0600 {
        Some(f) => ("hipGetDevicePropertiesR0600", f, props::R0600_GCN_ARCH_NAME),
        None => (
            "hipGetDeviceProperties",
            api.get_device_properties,
            props::R0000_GCN_ARCH_NAME,
        ),
    };
    // SAFETY: the buffer holds `props::BUFFER` bytes, more than `hipDeviceProp_tR0600` (1472)
    // and `hipDeviceProp_tR0000` (792), so the runtime cannot write past it whichever layout
    // it fills; the ordinal is below the device count.
    api.check(call, unsafe { f(words.as_mut_ptr().cast(), ordinal) })?;
    // SAFETY: viewing initialised `u64`s as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), props::BUFFER) };
    arch_from_props(bytes, offset).ok_or_else(|| {
        Error::unavailable(
            "rocm device architecture",
            format!(
                "{call} returned no gfx target name for device {ordinal} (neither at offset \
                 {offset} nor anywhere in the structure)"
            ),
        )
    })
}

fn query_info(api: &Api, ordinal: usize) -> Result<DeviceInfo> {
    let dev = ordinal as c_int;
    let mut name = [0u8; 256];
    // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within it.
    api.check("hipDeviceGetName", unsafe {
        (api.device_get_name)(name.as_mut_ptr().cast::<c_char>(), name.len() as c_int, dev)
    })?;
    let mut total = 0usize;
    // SAFETY: valid out-pointer.
    api.check("hipDeviceTotalMem", unsafe {
        (api.device_total_mem)(&mut total, dev)
    })?;
    let mut bus = [0u8; 64];
    // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within it.
    let pci_bus_id = match unsafe {
        (api.device_get_pci_bus_id)(bus.as_mut_ptr().cast::<c_char>(), bus.len() as c_int, dev)
    } {
        ffi::code::SUCCESS => Some(c_buf_to_string(&bus)).filter(|s| !s.is_empty()),
        _ => None,
    };
    let cus = attribute(api, dev, attr::MULTIPROCESSOR_COUNT, "multiprocessor count")?;
    let max_threads = attribute(
        api,
        dev,
        attr::MAX_THREADS_PER_BLOCK,
        "max threads per block",
    )?;
    let warp = attribute(api, dev, attr::WARP_SIZE, "warp size")?;
    let arch = gcn_arch_name(api, dev)?;
    Ok(DeviceInfo {
        backend: BackendKind::Rocm,
        ordinal,
        name: c_buf_to_string(&name),
        arch,
        total_memory: total as u64,
        warp_size: u32::try_from(warp).unwrap_or(64),
        multiprocessors: u32::try_from(cus).unwrap_or(0),
        max_threads_per_block: u32::try_from(max_threads).unwrap_or(0),
        pci_bus_id,
        caps: Capabilities {
            ipc: true,
            host_mapped_memory: true,
            device_memory_host_accessible: false,
            kernels: true,
            multicast: multicast::support(),
            // Not established for AMD fabrics: LL128 lines are never used there.
            ll128: false,
        },
    })
}

impl RocmBackend {
    /// Opens the backend over a runtime the probe found working with `driver.devices > 0`.
    pub(crate) fn open(api: &'static Api, driver: DriverInfo) -> Result<Self> {
        let count = usize::try_from(driver.devices).unwrap_or(0);
        let infos = (0..count)
            .map(|ordinal| query_info(api, ordinal))
            .collect::<Result<Vec<_>>>()?;
        Ok(RocmBackend { api, driver, infos })
    }

    /// What the probe found (versions, device count).
    pub fn driver_info(&self) -> DriverInfo {
        self.driver
    }

    /// Opens device `ordinal` as its concrete type.
    pub fn open_rocm_device(&self, ordinal: usize) -> Result<Arc<RocmDevice>> {
        let info = self.device_info(ordinal)?;
        let ctx = Arc::new(DeviceCtx {
            ordinal,
            api: self.api,
            runtime_major: runtime::major(self.driver.runtime_version),
        });
        ctx.bind()?;
        Ok(Arc::new(RocmDevice {
            info,
            ctx,
            modules: Mutex::new(HashMap::new()),
        }))
    }
}

impl Backend for RocmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Rocm
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self
            .infos
            .iter()
            .map(|i| format!("{} ({})", i.name, i.arch))
            .collect();
        format!(
            "rocm backend: HIP runtime {} ({} opened at run time), {} device(s): {}",
            runtime::format_version(self.driver.runtime_version),
            self.api.library,
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
                "device {ordinal} does not exist: the rocm backend has {} devices",
                self.infos.len()
            ))
        })
    }

    fn open_device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        Ok(self.open_rocm_device(ordinal)?)
    }

    fn peer_access(&self) -> Result<PeerMatrix> {
        PeerMatrix::try_from_peers(self.infos.len(), |i, j| {
            let mut can: c_int = 0;
            // SAFETY: valid out-pointer; both ordinals are below the device count.
            self.api.check("hipDeviceCanAccessPeer", unsafe {
                (self.api.device_can_access_peer)(&mut can, i as c_int, j as c_int)
            })?;
            Ok(can != 0)
        })
    }
}

/// One opened AMD GPU.
#[derive(Debug)]
pub struct RocmDevice {
    info: DeviceInfo,
    ctx: Arc<DeviceCtx>,
    /// Modules loaded on this device, by module name; each is loaded once.
    modules: Mutex<HashMap<&'static str, Arc<LoadedModule>>>,
}

impl RocmDevice {
    /// The device handle every resource of it holds.
    pub fn context(&self) -> &Arc<DeviceCtx> {
        &self.ctx
    }

    /// Creates a stream as its concrete type.
    pub fn create_rocm_stream(&self) -> Result<RocmStream> {
        RocmStream::new(self.ctx.clone(), self.info.max_threads_per_block)
    }
}

impl Device for RocmDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn make_current(&self) -> Result<()> {
        self.ctx.bind()
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer::new(Arc::new(RocmAllocation::new(
            self.ctx.clone(),
            bytes,
            kind,
        )?)))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(Arc::new(self.create_rocm_stream()?))
    }

    fn create_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(RocmEvent::new(self.ctx.clone())?))
    }

    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        memory::export(&self.ctx, buf)
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        handle.expect(BackendKind::Rocm, IpcHandleKind::Memory)?;
        memory::import(&self.ctx, handle)
    }

    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        multicast::create(bytes, members)
    }

    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        multicast::import(handle)
    }

    fn load_kernel(&self, id: KernelId) -> Result<Arc<dyn Kernel>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Arc::new(module::load_kernel(
            &self.ctx,
            &self.info.arch,
            &mut modules,
            id,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_targets_are_recognised_and_stripped() {
        for ok in [
            "gfx90a",
            "gfx942",
            "gfx908",
            "gfx90a:sramecc+:xnack-",
            "gfx1100",
        ] {
            assert!(is_gfx_target(ok), "{ok}");
        }
        for bad in ["", "gfx", "AMD Instinct", "gfx90a extra", "gfxzz", "sm_90"] {
            assert!(!is_gfx_target(bad), "{bad}");
        }
        assert_eq!(compile_target("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(compile_target("gfx942"), "gfx942");
    }

    fn props_with(offset: usize, name: &[u8], arch: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; props::BUFFER];
        b[..name.len()].copy_from_slice(name);
        b[offset..offset + arch.len()].copy_from_slice(arch);
        b
    }

    #[test]
    fn arch_is_read_at_the_layout_offset_or_found_by_scanning() {
        let b = props_with(
            props::R0000_GCN_ARCH_NAME,
            b"AMD Instinct MI250X",
            b"gfx90a:sramecc+:xnack-",
        );
        assert_eq!(
            arch_from_props(&b, props::R0000_GCN_ARCH_NAME).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        // The R0600 layout read as R0000: found by the scan.
        let b = props_with(
            props::R0600_GCN_ARCH_NAME,
            b"AMD Instinct MI300X",
            b"gfx942:sramecc+:xnack-",
        );
        assert_eq!(
            arch_from_props(&b, props::R0000_GCN_ARCH_NAME).as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        // A name mentioning gfx is not taken for the arch.
        let b = props_with(props::R0000_GCN_ARCH_NAME, b"gfx90a board", b"");
        assert_eq!(arch_from_props(&b, props::R0000_GCN_ARCH_NAME), None);
        // Garbage everywhere: none, and no panic at the buffer's end.
        let mut b = vec![0xffu8; props::BUFFER];
        let n = b.len();
        b[n - 4..].copy_from_slice(b"\0gfx");
        assert_eq!(arch_from_props(&b, props::R0000_GCN_ARCH_NAME), None);
        assert_eq!(arch_from_props(&b[..10], props::R0600_GCN_ARCH_NAME), None);
    }
}
