//! The CUDA driver as a [`Runtime`] table: each method is the matching `cu*` call through
//! cudarc's dynamically loaded `sys` bindings, its status mapped by [`check`].
//!
//! Every call here is reached only through a [`CudaRuntime`] made by [`crate::probe_cuda`],
//! which first checked that the library is present and has every symbol called below
//! ([`crate::driver::REQUIRED_SYMBOLS`]), so cudarc never panics on a missing one.

use std::ffi::{CStr, c_char, c_int};

use cudarc::driver::sys;
use mscclpp_gpu::device_api::CUDA_CORE;
use mscclpp_gpu::runtime::{
    Compiled, Features, Image, IpcBytes, Runtime, Vendor, events_not_reached,
};
use mscclpp_hal::{BackendKind, DeviceInfo, LaunchConfig, Result};

use crate::driver::{self, check, describe};
use crate::nvrtc;
use crate::vmm;

/// Cache image kinds.
pub mod image {
    /// A cubin for the exact architecture.
    pub const CUBIN: u8 = 1;
    /// NUL-terminated PTX, JIT-compiled by the driver at load.
    pub const PTX: u8 = 2;
}

/// Optional driver features found by the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverFeatures {
    /// `cuEventElapsedTime_v2` exists (CUDA 12.8+).
    pub elapsed_time_v2: bool,
    /// `cuEventElapsedTime` (the pre-12.8 name) exists.
    pub elapsed_time_v1: bool,
    /// `cuFuncGetParamInfo` exists (CUDA 12.4+): launches check the argument size.
    pub func_param_info: bool,
    /// Every `cuMulticast*` entry point exists (never called by this build).
    pub multicast_symbols: bool,
}

/// The CUDA driver, opened and checked by the probe.
#[derive(Debug)]
pub struct CudaRuntime {
    /// `cuDriverGetVersion`, e.g. 13000.
    pub driver_version: i32,
    /// What the driver offers beyond the required entry points.
    pub features: DriverFeatures,
}

/// A retained primary context and its device.
#[derive(Debug, Clone, Copy)]
pub struct CudaContext {
    dev: sys::CUdevice,
    raw: sys::CUcontext,
}

/// The range the driver records for `ptr` through the pointer's attributes (start and size),
/// where it has one.
fn pointer_range(ptr: u64) -> Option<(u64, usize)> {
    let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: each out-pointer is valid for the attribute's type (a CUdeviceptr and a size_t);
    // the driver only looks the address up.
    let ok = unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut start).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr,
        ) == sys::CUresult::CUDA_SUCCESS
            && sys::cuPointerGetAttribute(
                (&raw mut size).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr,
            ) == sys::CUresult::CUDA_SUCCESS
    };
    (ok && size > 0 && start <= ptr && ptr - start < size as u64).then_some((start, size))
}

fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; an out-of-range ordinal is an error status, not UB.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as c_int)
    })?;
    Ok(dev)
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

fn query_info(ordinal: usize, dev: sys::CUdevice) -> Result<DeviceInfo> {
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
        caps: mscclpp_gpu::device::capabilities(major >= 7),
    })
}

type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

impl Runtime for CudaRuntime {
    type Context = CudaContext;
    type Stream = sys::CUstream;
    type Event = sys::CUevent;
    type Module = sys::CUmodule;
    type Function = sys::CUfunction;
    type Graph = sys::CUgraph;
    type GraphExec = sys::CUgraphExec;

    const VENDOR: Vendor = Vendor {
        kind: BackendKind::Cuda,
        name: "cuda",
        runtime: "CUDA",
        ipc_magic: *b"MSCU",
        ipc_what: "cuda IPC handle",
        ipc_mechanism: "CUDA IPC",
        ipc_export_call: "cuIpcGetMemHandle",
        cache_magic: *b"MSKC",
        image_kinds: &[image::CUBIN, image::PTX],
        cache_domain: "mscclpp-cuda kernel cache v1",
        cache_dir: "cuda",
        compiler: "NVRTC",
        core_header: CUDA_CORE,
        no_multicast: None,
    };

    fn features(&self) -> Features {
        Features {
            graph_capture: true,
            borrowed_streams: true,
            multicast_symbols: self.features.multicast_symbols,
        }
    }

    fn describe(&self) -> String {
        format!(
            "driver {} (CUDA driver library opened at run time)",
            driver::format_version(self.driver_version)
        )
    }

    fn device_infos(&self) -> Result<Vec<DeviceInfo>> {
        // SAFETY: cuInit takes flags that must be 0.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        let devices = (0..usize::try_from(count).unwrap_or(0))
            .map(device)
            .collect::<Result<Vec<_>>>()?;
        let mut infos = devices
            .iter()
            .enumerate()
            .map(|(ordinal, &dev)| query_info(ordinal, dev))
            .collect::<Result<Vec<_>>>()?;
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
        Ok(infos)
    }

    fn can_access_peer(&self, i: usize, j: usize) -> Result<bool> {
        let (a, b) = (device(i)?, device(j)?);
        let mut can: c_int = 0;
        // SAFETY: valid out-pointer and device handles.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, a, b)
        })?;
        Ok(can != 0)
    }

    fn current_device(&self) -> Result<Option<usize>> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointer.
        match unsafe { sys::cuCtxGetDevice(&mut dev) } {
            sys::CUresult::CUDA_SUCCESS => Ok(usize::try_from(dev).ok()),
            sys::CUresult::CUDA_ERROR_INVALID_CONTEXT => Ok(None),
            r => check("cuCtxGetDevice", r).map(|_| None),
        }
    }

    fn multicast_supported(&self, ordinal: usize) -> Result<bool> {
        let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED;
        Ok(attr(device(ordinal)?, a, "multicast supported")? != 0)
    }

    fn retain_context(&self, ordinal: usize) -> Result<CudaContext> {
        let dev = device(ordinal)?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `dev` came from cuDeviceGet. Balanced by release_context.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, dev)
        })?;
        Ok(CudaContext { dev, raw })
    }

    unsafe fn release_context(&self, _ordinal: usize, ctx: CudaContext) -> Result<()> {
        // SAFETY: balances the retain (caller's contract).
        check("cuDevicePrimaryCtxRelease", unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(ctx.dev)
        })
    }

    fn context_lost(&self, ctx: CudaContext) -> bool {
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: valid out-pointers; `ctx.dev` came from cuDeviceGet. The call takes the device,
        // not the (possibly destroyed) context, so it is safe after a reset.
        let r = unsafe { sys::cuDevicePrimaryCtxGetState(ctx.dev, &mut flags, &mut active) };
        // While our retain holds, only a reset (cudaDeviceReset, cuDevicePrimaryCtxReset)
        // leaves the primary context inactive.
        r == sys::CUresult::CUDA_SUCCESS && active == 0
    }

    unsafe fn bind(&self, ctx: CudaContext) -> Result<()> {
        // SAFETY: `ctx.raw` is a retained (live) primary context (caller's contract).
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.raw) })
    }

    unsafe fn mem_alloc(&self, len: usize, _uncached: bool) -> Result<u64> {
        // NVIDIA needs no separate uncached kind: flags and tokens in ordinary device memory are
        // made visible with fences / system-scope atomics.
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current (caller's contract).
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, len) })?;
        Ok(p)
    }

    unsafe fn mem_free(&self, ptr: u64) -> Result<()> {
        // SAFETY: `ptr` came from cuMemAlloc and is freed once (caller's contract).
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
    }

    unsafe fn host_alloc_mapped(&self, len: usize) -> Result<*mut u8> {
        // The library's own pages, registered with the driver, rather than cuMemHostAlloc's: a
        // caller's cudaDeviceReset (nccl-tests ends with one, communicators still alive) or the
        // runtime's teardown at exit frees the driver's allocations, and the library's
        // background threads (the bootstrap's event loop storing a peer's death into the abort
        // word) would then fault on them. Registered pages only lose their device mapping.
        let layout = host_layout(len)?;
        // SAFETY: a non-zero size (host_layout rounds up to whole pages).
        let host = unsafe { std::alloc::alloc_zeroed(layout) };
        if host.is_null() {
            return Err(mscclpp_hal::Error::unavailable(
                "host memory",
                format!(
                    "allocating {} bytes of pages to map into the device failed",
                    layout.size()
                ),
            ));
        }
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `host` is a fresh allocation of `layout.size()` bytes; the context is current
        // (caller's contract).
        let r = check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(host.cast(), layout.size(), flags)
        });
        if let Err(e) = r {
            // SAFETY: allocated above with this layout, not registered, used nowhere else.
            unsafe { std::alloc::dealloc(host, layout) };
            return Err(e);
        }
        Ok(host)
    }

    unsafe fn host_device_pointer(&self, host: *mut u8) -> Result<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP (caller's contract); valid out-pointer.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut p, host.cast(), 0)
        })?;
        Ok(p)
    }

    unsafe fn host_free(&self, host: *mut u8, len: usize) -> Result<()> {
        let layout = host_layout(len)?;
        // SAFETY: `host` came from host_alloc_mapped (registered) and is freed once (caller's
        // contract).
        let r = check("cuMemHostUnregister", unsafe {
            sys::cuMemHostUnregister(host.cast())
        });
        // On an error it may still be registered for all we know (or its context is gone): it
        // stays allocated, so that no later allocation reuses pages the driver may still map.
        if r.is_ok() {
            // SAFETY: allocated with this layout in host_alloc_mapped; no longer registered.
            unsafe { std::alloc::dealloc(host, layout) };
        }
        r
    }

    unsafe fn mem_address_range(&self, ptr: u64) -> Result<(u64, usize)> {
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; the driver only looks the address up.
        let r = check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
        });
        match r {
            Ok(()) => Ok((base, size)),
            // Page-locked host memory (cudaHostAlloc, cudaHostRegister) is not a device
            // allocation, yet the driver knows its range: ask the pointer's attributes.
            Err(e) => pointer_range(ptr).ok_or(e),
        }
    }

    unsafe fn vmm_map_pieces(
        &self,
        ordinal: usize,
        piece: usize,
        count: usize,
    ) -> Result<mscclpp_gpu::runtime::Pieces> {
        vmm::map_pieces(device(ordinal)?, piece, count)
    }

    unsafe fn vmm_unmap_pieces(&self, pieces: &mscclpp_gpu::runtime::Pieces) -> Result<()> {
        vmm::unmap_pieces(pieces)
    }

    fn vmm_shareable_granularity(&self, ordinal: usize) -> Result<usize> {
        vmm::shareable_granularity(device(ordinal)?)
    }

    unsafe fn vmm_alloc_shareable(
        &self,
        ordinal: usize,
        bytes: usize,
    ) -> Result<mscclpp_gpu::runtime::Pieces> {
        vmm::alloc_shareable(device(ordinal)?, bytes)
    }

    unsafe fn vmm_export(&self, handle: u64) -> Result<std::os::fd::OwnedFd> {
        vmm::export_fd(handle)
    }

    unsafe fn vmm_reserve(&self, bytes: usize, align: usize) -> Result<u64> {
        vmm::reserve(bytes, align)
    }

    unsafe fn vmm_free_reserve(&self, ptr: u64, bytes: usize) -> Result<()> {
        vmm::free_reserve(ptr, bytes)
    }

    unsafe fn vmm_map_fd(
        &self,
        ordinal: usize,
        at: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<()> {
        vmm::map_fd(device(ordinal)?, at, fd, bytes)
    }

    unsafe fn vmm_unmap(&self, at: u64, bytes: usize) -> Result<()> {
        vmm::unmap(at, bytes)
    }

    unsafe fn ipc_get_handle(&self, ptr: u64) -> Result<IpcBytes> {
        // SAFETY: an all-zero CUipcMemHandle is a valid value of this plain byte array struct.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; `ptr` is the base of a live allocation (caller's contract).
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, ptr)
        })?;
        let mut out = [0u8; 64];
        for (d, s) in out.iter_mut().zip(h.reserved.iter()) {
            *d = *s as u8;
        }
        Ok(out)
    }

    unsafe fn ipc_open_handle(&self, handle: &IpcBytes) -> Result<u64> {
        // SAFETY: an all-zero CUipcMemHandle is a valid value; we then fill its bytes.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(handle.iter()) {
            *d = *s as c_char;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: valid out-pointer; the handle is plain bytes the driver validates itself.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags)
        })?;
        Ok(ptr)
    }

    unsafe fn ipc_close_handle(&self, ptr: u64) -> Result<()> {
        // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once (caller's contract).
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(ptr)
        })
    }

    unsafe fn stream_create(&self) -> Result<sys::CUstream> {
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; the context is current (caller's contract).
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, flags)
        })?;
        Ok(raw)
    }

    unsafe fn stream_destroy(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: destroyed once (caller's contract); the driver defers the release past
        // pending work.
        check("cuStreamDestroy", unsafe {
            sys::cuStreamDestroy_v2(stream)
        })
    }

    unsafe fn stream_query(&self, stream: sys::CUstream) -> Result<bool> {
        // SAFETY: live stream (caller's contract).
        match unsafe { sys::cuStreamQuery(stream) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuStreamQuery", r).map(|_| false),
        }
    }

    fn stream_to_native(stream: sys::CUstream) -> u64 {
        stream as u64
    }

    fn stream_from_native(native: u64) -> sys::CUstream {
        native as usize as sys::CUstream
    }

    fn event_from_native(native: u64) -> sys::CUevent {
        native as usize as sys::CUevent
    }

    unsafe fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, s: sys::CUstream) -> Result<()> {
        // SAFETY: in-bounds ranges kept alive until the copy ran (caller's contract).
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, len, s)
        })
    }

    unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: as above.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, s)
        })
    }

    unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: as above.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, s)
        })
    }

    unsafe fn memset_d8(&self, dst: u64, value: u8, len: usize, s: sys::CUstream) -> Result<()> {
        // SAFETY: as above.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(dst, value, len, s)
        })
    }

    unsafe fn write_value64(&self, dst: u64, value: u64, s: sys::CUstream) -> Result<()> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: an aligned live 8-byte location (caller's contract).
        check("cuStreamWriteValue64", unsafe {
            sys::cuStreamWriteValue64_v2(s, dst, value, flags)
        })
    }

    unsafe fn wait_value64(
        &self,
        dst: u64,
        value: u64,
        cmp: mscclpp_hal::WaitCmp,
        s: sys::CUstream,
    ) -> Result<()> {
        let flags = match cmp {
            mscclpp_hal::WaitCmp::Geq => sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ,
            mscclpp_hal::WaitCmp::Eq => sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ,
        } as u32;
        // SAFETY: an aligned live 8-byte location (caller's contract).
        check("cuStreamWaitValue64", unsafe {
            sys::cuStreamWaitValue64_v2(s, dst, value, flags)
        })
    }

    unsafe fn stream_wait_event(&self, stream: sys::CUstream, event: sys::CUevent) -> Result<()> {
        // SAFETY: live event and stream (caller's contract).
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, event, 0)
        })
    }

    unsafe fn event_create(&self, timing: bool) -> Result<sys::CUevent> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (caller's contract).
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags as u32)
        })?;
        Ok(raw)
    }

    unsafe fn event_destroy(&self, event: sys::CUevent) -> Result<()> {
        // SAFETY: destroyed once (caller's contract).
        check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(event) })
    }

    unsafe fn event_record(&self, event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
        // SAFETY: live event and stream of the current context (caller's contract).
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event, stream)
        })
    }

    unsafe fn event_query(&self, event: sys::CUevent) -> Result<bool> {
        // SAFETY: live event (caller's contract).
        match unsafe { sys::cuEventQuery(event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuEventQuery", r).map(|_| false),
        }
    }

    unsafe fn event_elapsed_ms(&self, start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
        let mut ms = 0f32;
        let r = if self.features.elapsed_time_v2 {
            // SAFETY: valid out-pointer and live events; the symbol exists (probe).
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) }
        } else if self.features.elapsed_time_v1 {
            // SAFETY: the probe found the library and this symbol; the type is the C declaration
            // `CUresult cuEventElapsedTime(float*, CUevent, CUevent)`.
            let f = unsafe {
                sys::culib().get::<ElapsedFn>(driver::optional::EVENT_ELAPSED_TIME_V1.as_bytes())
            }
            .map_err(|e| mscclpp_hal::Error::unavailable("cuEventElapsedTime", e.to_string()))?;
            // SAFETY: as above.
            unsafe { f(&mut ms, start, end) }
        } else {
            return Err(mscclpp_hal::Error::unavailable(
                "event timing",
                "the CUDA driver has neither cuEventElapsedTime_v2 nor cuEventElapsedTime",
            ));
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(ms),
            sys::CUresult::CUDA_ERROR_NOT_READY | sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
                Err(events_not_reached(describe(r)))
            }
            r => check("cuEventElapsedTime", r).map(|_| 0.0),
        }
    }

    unsafe fn relax_thread_capture(&self) -> Option<i32> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; the call concerns this thread only.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(mode as i32)
    }

    unsafe fn restore_thread_capture(&self, mode: i32) {
        use sys::CUstreamCaptureMode as M;
        let mut m = match mode {
            0 => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            1 => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            _ => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: as above. Nothing to do if it fails: the mode stays relaxed, which refuses
        // nothing.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
    }

    unsafe fn stream_begin_capture(&self, stream: sys::CUstream) -> Result<()> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: live stream of the current context (caller's contract).
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(stream, mode)
        })
    }

    unsafe fn stream_is_capturing(&self, stream: sys::CUstream) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream of the current context (caller's contract); valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(stream, &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    unsafe fn stream_end_capture(&self, stream: sys::CUstream) -> Result<sys::CUgraph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: live capturing stream (caller's contract); valid out-pointer.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(stream, &mut graph)
        })?;
        Ok(graph)
    }

    unsafe fn graph_instantiate(&self, graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a captured graph (caller's contract); valid out-pointer.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        })?;
        Ok(exec)
    }

    unsafe fn graph_launch(&self, exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
        // SAFETY: live graph exec and stream (caller's contract).
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec, stream) })
    }

    unsafe fn graph_exec_destroy(&self, exec: sys::CUgraphExec) -> Result<()> {
        // SAFETY: destroyed once, nothing pending (caller's contract).
        check("cuGraphExecDestroy", unsafe {
            sys::cuGraphExecDestroy(exec)
        })
    }

    unsafe fn graph_destroy(&self, graph: sys::CUgraph) -> Result<()> {
        // SAFETY: destroyed once (caller's contract).
        check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) })
    }

    unsafe fn module_load(&self, image: &[u8]) -> Result<sys::CUmodule> {
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a complete cubin, or NUL-terminated PTX (caller's contract); the
        // context is current.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, image.as_ptr().cast())
        })?;
        Ok(raw)
    }

    unsafe fn module_unload(&self, module: sys::CUmodule) -> Result<()> {
        // SAFETY: unloaded once, nothing pending (caller's contract).
        check("cuModuleUnload", unsafe { sys::cuModuleUnload(module) })
    }

    unsafe fn module_function(
        &self,
        module: sys::CUmodule,
        name: &CStr,
    ) -> Result<sys::CUfunction> {
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: live module of the current context; NUL-terminated name; valid out-pointer.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut func, module, name.as_ptr())
        })?;
        Ok(func)
    }

    unsafe fn function_max_threads(&self, f: sys::CUfunction) -> Result<Option<u32>> {
        let mut max_threads: c_int = 0;
        let a = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
        // SAFETY: live function; valid out-pointer.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut max_threads, a, f)
        })?;
        Ok(u32::try_from(max_threads).ok())
    }

    unsafe fn function_param_size(&self, f: sys::CUfunction) -> Option<usize> {
        if !self.features.func_param_info {
            return None;
        }
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: live function; valid out-pointers; the symbol exists (probe).
        match unsafe { sys::cuFuncGetParamInfo(f, 0, &mut offset, &mut size) } {
            sys::CUresult::CUDA_SUCCESS => Some(offset + size),
            // No parameter 0: the kernel takes no arguments.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => Some(0),
            _ => None,
        }
    }

    unsafe fn launch(
        &self,
        f: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        args: &mut [u64],
        len: usize,
    ) -> Result<()> {
        // cuLaunchKernel reads the one struct parameter through kernelParams[0] during the call.
        let mut param: *mut std::ffi::c_void = args.as_mut_ptr().cast();
        let params: *mut *mut std::ffi::c_void = if len == 0 {
            std::ptr::null_mut()
        } else {
            &mut param
        };
        // SAFETY: `f` is live; `params` points to one pointer to the argument bytes, read during
        // the call; device addresses inside them are the caller's contract.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                cfg.grid[0],
                cfg.grid[1],
                cfg.grid[2],
                cfg.block[0],
                cfg.block[1],
                cfg.block[2],
                cfg.shared_mem_bytes,
                stream,
                params,
                std::ptr::null_mut(),
            )
        })
    }

    fn rtc_version(&self) -> Result<(i32, i32)> {
        nvrtc::nvrtc_version()
    }

    fn rtc_options(&self) -> String {
        nvrtc::options().join(" ")
    }

    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        target: &str,
    ) -> Result<Compiled> {
        let c = nvrtc::compile(name, source, headers, target)?;
        let image = match c.cubin {
            Some(bytes) => Image {
                kind: image::CUBIN,
                bytes,
            },
            None => {
                let mut ptx = c.ptx;
                if ptx.last() != Some(&0) {
                    ptx.push(0);
                }
                Image {
                    kind: image::PTX,
                    bytes: ptx,
                }
            }
        };
        Ok(Compiled {
            image,
            log: c.log,
            elapsed: c.elapsed,
        })
    }
}

/// The layout of [`Runtime::host_alloc_mapped`]'s pages for `len` bytes: whole pages, aligned.
fn host_layout(len: usize) -> Result<std::alloc::Layout> {
    // The largest page size of the platforms CUDA runs on (4 KiB on x86-64; up to 64 KiB on
    // aarch64): registration works on whole pages.
    const PAGE: usize = if cfg!(target_arch = "x86_64") {
        4096
    } else {
        65536
    };
    let size = len.max(1).checked_next_multiple_of(PAGE);
    size.and_then(|s| std::alloc::Layout::from_size_align(s, PAGE).ok())
        .ok_or_else(|| mscclpp_hal::Error::invalid(format!("{len} bytes of mapped host memory")))
}
