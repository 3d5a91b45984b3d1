//! The HIP runtime as a [`Runtime`] table: each method is the matching `hip*` call through the
//! [`Api`] resolved at open ([`crate::ffi`]), its status mapped by [`Api::check`]. The probe
//! and the device properties are [`crate::probe`]'s.
//!
//! Every missing piece — the library, a symbol, a GPU — is an [`Error::Unavailable`] naming
//! what was tried and what was found, never a panic. On a machine with ROCm's runtime but no
//! AMD GPU (this repository's build machines: Debian's ROCm 5.2) `hipInit` fails with
//! `hipErrorInvalidDevice` (101); ROCm 5.7+ answers `hipErrorNoDevice` (100).
//!
//! **Current device.** HIP has no contexts to retain: each thread has a current device
//! (`hipSetDevice`), which [`Runtime::bind`] sets; the context is the ordinal.

use std::ffi::{CStr, c_int, c_void};

use mscclpp_gpu::device_api::HIP_CORE;
use mscclpp_gpu::runtime::{
    Compiled, Features, Image, IpcBytes, Runtime, Vendor, events_not_reached,
};
use mscclpp_hal::{BackendKind, DeviceInfo, Error, LaunchConfig, Result};

use crate::ffi::{
    self, Api, GraphApi, HipEvent, HipFunction, HipGraph, HipGraphExec, HipModule, HipStream,
    IpcMemHandle, code,
};
use crate::hiprtc;
use crate::probe::query_info;
// The probe's items were this module's before `probe` was split out: their paths stay.
pub use crate::probe::{
    DriverInfo, arch_from_props, compile_target, format_version, is_gfx_target, major,
    probe_driver, probe_with,
};

pub use crate::ffi::LIBRARY_NAMES;

/// The one image kind: an AMDGPU code object.
pub const IMAGE_CODE_OBJECT: u8 = 1;

/// The HIP runtime, opened and initialised by the probe.
#[derive(Debug)]
pub struct RocmRuntime {
    /// The resolved entry points.
    pub api: &'static Api,
    /// What the probe found.
    pub driver: DriverInfo,
}

impl RocmRuntime {
    fn check(&self, call: &'static str, r: ffi::HipError) -> Result<()> {
        self.api.check(call, r)
    }

    fn graphs(&self) -> Result<&GraphApi> {
        self.api.graphs.as_ref().ok_or_else(|| {
            Error::unavailable(
                "graph capture",
                format!(
                    "{} lacks {}",
                    self.api.library,
                    ffi::GRAPH_SYMBOLS.join(", ")
                ),
            )
        })
    }

    /// `hipEventQuery` / `hipStreamQuery` as reached / not yet / sticky error.
    fn ready(&self, call: &'static str, r: ffi::HipError) -> Result<bool> {
        match r {
            code::SUCCESS => Ok(true),
            code::NOT_READY => Ok(false),
            r => self.check(call, r).map(|_| false),
        }
    }
}

/// The `hipIpcMemLazyEnablePeerAccess` values to try, the runtime's own first: the runtime
/// rejects any value but its own (0 in ROCm 5.x, 1 from ROCm 6).
pub fn ipc_open_flags(runtime_major: i32) -> [u32; 2] {
    if runtime_major >= 6 {
        [
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V6,
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V5,
        ]
    } else {
        [
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V5,
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V6,
        ]
    }
}

fn ptr(p: u64) -> *mut c_void {
    p as usize as *mut c_void
}

impl Runtime for RocmRuntime {
    type Context = c_int;
    type Stream = HipStream;
    type Event = HipEvent;
    type Module = HipModule;
    type Function = HipFunction;
    type Graph = HipGraph;
    type GraphExec = HipGraphExec;

    const VENDOR: Vendor = Vendor {
        kind: BackendKind::Rocm,
        name: "rocm",
        runtime: "HIP",
        ipc_magic: *b"MSRO",
        ipc_what: "rocm IPC handle",
        ipc_mechanism: "HIP IPC",
        ipc_export_call: "hipIpcGetMemHandle",
        cache_magic: *b"MSKR",
        image_kinds: &[IMAGE_CODE_OBJECT],
        cache_domain: "mscclpp-rocm kernel cache v1",
        cache_dir: "rocm",
        compiler: "hipRTC",
        core_header: HIP_CORE,
        no_multicast: Some("AMD GPUs have no multicast memory"),
    };

    fn features(&self) -> Features {
        Features {
            graph_capture: self.api.graphs.is_some(),
            borrowed_streams: true,
            multicast_symbols: false,
        }
    }

    fn describe(&self) -> String {
        format!(
            "HIP runtime {} ({} opened at run time)",
            format_version(self.driver.runtime_version),
            self.api.library
        )
    }

    fn device_infos(&self) -> Result<Vec<DeviceInfo>> {
        let count = usize::try_from(self.driver.devices).unwrap_or(0);
        (0..count).map(|o| query_info(self.api, o)).collect()
    }

    fn can_access_peer(&self, i: usize, j: usize) -> Result<bool> {
        let mut can: c_int = 0;
        // SAFETY: valid out-pointer; the runtime checks the ordinals.
        self.check("hipDeviceCanAccessPeer", unsafe {
            (self.api.device_can_access_peer)(&mut can, i as c_int, j as c_int)
        })?;
        Ok(can != 0)
    }

    fn current_device(&self) -> Result<Option<usize>> {
        Ok(None)
    }

    fn retain_context(&self, ordinal: usize) -> Result<c_int> {
        c_int::try_from(ordinal)
            .map_err(|_| Error::invalid(format!("device ordinal {ordinal} is out of range")))
    }

    unsafe fn release_context(&self, _ordinal: usize, _ctx: c_int) -> Result<()> {
        Ok(())
    }

    unsafe fn bind(&self, ctx: c_int) -> Result<()> {
        // SAFETY: the ordinal is below the device count (checked when the backend enumerated).
        self.check("hipSetDevice", unsafe { (self.api.set_device)(ctx) })
    }

    unsafe fn mem_alloc(&self, len: usize, uncached: bool) -> Result<u64> {
        let api = self.api;
        let mut p: *mut c_void = std::ptr::null_mut();
        if !uncached {
            // SAFETY: valid out-pointer; the device is current (caller's contract).
            self.check("hipMalloc", unsafe { (api.malloc)(&mut p, len) })?;
            return Ok(p as u64);
        }
        // AMD GPUs cache device memory in L2 per device (and, on MI300, per XCD): flags written
        // by a peer or the host are not seen through a stale line, hence uncached memory for
        // them, as MSCCL++ allocates its semaphores.
        // SAFETY: valid out-pointer; the device is current (caller's contract).
        let r = unsafe { (api.ext_malloc_with_flags)(&mut p, len, ffi::DEVICE_MALLOC_UNCACHED) };
        if r == code::INVALID_VALUE {
            tracing::info!(
                "hipDeviceMallocUncached refused (ROCm < 5.3); allocating fine-grained memory for flags"
            );
            // SAFETY: as above.
            let r =
                unsafe { (api.ext_malloc_with_flags)(&mut p, len, ffi::DEVICE_MALLOC_FINEGRAINED) };
            self.check("hipExtMallocWithFlags(hipDeviceMallocFinegrained)", r)?;
        } else {
            self.check("hipExtMallocWithFlags(hipDeviceMallocUncached)", r)?;
        }
        Ok(p as u64)
    }

    unsafe fn mem_free(&self, p: u64) -> Result<()> {
        // SAFETY: `p` came from hipMalloc / hipExtMallocWithFlags, freed once (caller's contract).
        self.check("hipFree", unsafe { (self.api.free)(ptr(p)) })
    }

    unsafe fn host_alloc_mapped(&self, len: usize) -> Result<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = ffi::HOST_MALLOC_MAPPED | ffi::HOST_MALLOC_PORTABLE;
        // SAFETY: valid out-pointer; the device is current. Host memory from hipHostMalloc is
        // coherent by default on ROCm (no hipHostMallocNonCoherent), which the proxy FIFO
        // relies on.
        self.check("hipHostMalloc", unsafe {
            (self.api.host_malloc)(&mut p, len, flags)
        })?;
        Ok(p.cast())
    }

    unsafe fn host_device_pointer(&self, host: *mut u8) -> Result<u64> {
        let mut d: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` was allocated mapped (caller's contract); valid out-pointer; flags 0.
        self.check("hipHostGetDevicePointer", unsafe {
            (self.api.host_get_device_pointer)(&mut d, host.cast(), 0)
        })?;
        Ok(d as u64)
    }

    unsafe fn host_free(&self, host: *mut u8, _len: usize) -> Result<()> {
        // SAFETY: `host` came from hipHostMalloc, freed once (caller's contract).
        self.check("hipHostFree", unsafe { (self.api.host_free)(host.cast()) })
    }

    unsafe fn mem_address_range(&self, p: u64) -> Result<(u64, usize)> {
        let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers; the runtime only looks the address up.
        self.check("hipMemGetAddressRange", unsafe {
            (self.api.mem_get_address_range)(&mut base, &mut size, ptr(p))
        })?;
        Ok((base as u64, size))
    }

    unsafe fn ipc_get_handle(&self, p: u64) -> Result<IpcBytes> {
        let mut h = IpcMemHandle {
            reserved: [0; ffi::IPC_HANDLE_SIZE],
        };
        // SAFETY: valid out-pointer to a 64-byte handle; `p` is the base of a live allocation.
        self.check("hipIpcGetMemHandle", unsafe {
            (self.api.ipc_get_mem_handle)(&mut h, ptr(p))
        })?;
        Ok(h.reserved)
    }

    unsafe fn ipc_open_handle(&self, handle: &IpcBytes) -> Result<u64> {
        let h = IpcMemHandle { reserved: *handle };
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut r = code::INVALID_VALUE;
        for flags in ipc_open_flags(major(self.driver.runtime_version)) {
            // SAFETY: valid out-pointer; the handle is plain bytes the runtime validates
            // itself; the device is current.
            r = unsafe { (self.api.ipc_open_mem_handle)(&mut p, h, flags) };
            if r != code::INVALID_VALUE {
                break;
            }
        }
        self.check("hipIpcOpenMemHandle", r)?;
        Ok(p as u64)
    }

    unsafe fn ipc_close_handle(&self, p: u64) -> Result<()> {
        // SAFETY: `p` came from hipIpcOpenMemHandle, closed once (caller's contract).
        self.check("hipIpcCloseMemHandle", unsafe {
            (self.api.ipc_close_mem_handle)(ptr(p))
        })
    }

    unsafe fn stream_create(&self) -> Result<HipStream> {
        let mut raw: HipStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is current.
        self.check("hipStreamCreateWithFlags", unsafe {
            (self.api.stream_create_with_flags)(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(raw)
    }

    unsafe fn stream_destroy(&self, stream: HipStream) -> Result<()> {
        // SAFETY: destroyed once (caller's contract); hipStreamDestroy waits for pending work.
        self.check("hipStreamDestroy", unsafe {
            (self.api.stream_destroy)(stream)
        })
    }

    unsafe fn stream_query(&self, stream: HipStream) -> Result<bool> {
        // SAFETY: live stream (caller's contract).
        let r = unsafe { (self.api.stream_query)(stream) };
        self.ready("hipStreamQuery", r)
    }

    fn stream_to_native(stream: HipStream) -> u64 {
        stream as u64
    }

    fn stream_from_native(native: u64) -> HipStream {
        ptr(native)
    }

    fn event_from_native(native: u64) -> Self::Event {
        ptr(native)
    }

    unsafe fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, s: HipStream) -> Result<()> {
        // SAFETY: in-bounds ranges kept alive until the copy ran (caller's contract);
        // hipMemcpyDefault lets the runtime find each pointer's device.
        self.check("hipMemcpyAsync", unsafe {
            (self.api.memcpy_async)(ptr(dst), ptr(src), len, ffi::MEMCPY_DEFAULT, s)
        })
    }

    unsafe fn memcpy_htod(&self, dst: u64, src: *const u8, len: usize, s: HipStream) -> Result<()> {
        // SAFETY: as above.
        self.check("hipMemcpyAsync", unsafe {
            (self.api.memcpy_async)(ptr(dst), src.cast(), len, ffi::MEMCPY_DEFAULT, s)
        })
    }

    unsafe fn memcpy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: HipStream) -> Result<()> {
        // SAFETY: as above.
        self.check("hipMemcpyAsync", unsafe {
            (self.api.memcpy_async)(dst.cast(), ptr(src), len, ffi::MEMCPY_DEFAULT, s)
        })
    }

    unsafe fn memset_d8(&self, dst: u64, value: u8, len: usize, s: HipStream) -> Result<()> {
        // SAFETY: as above.
        self.check("hipMemsetD8Async", unsafe {
            (self.api.memset_d8_async)(ptr(dst), value, len, s)
        })
    }

    unsafe fn write_value64(&self, dst: u64, value: u64, s: HipStream) -> Result<()> {
        // SAFETY: an aligned live 8-byte location (caller's contract); flags 0 is the plain
        // ordered write.
        self.check("hipStreamWriteValue64", unsafe {
            (self.api.stream_write_value64)(s, ptr(dst), value, 0)
        })
    }

    unsafe fn wait_value64(
        &self,
        dst: u64,
        value: u64,
        cmp: mscclpp_hal::WaitCmp,
        s: HipStream,
    ) -> Result<()> {
        let flags = match cmp {
            mscclpp_hal::WaitCmp::Geq => ffi::STREAM_WAIT_VALUE_GTE,
            mscclpp_hal::WaitCmp::Eq => ffi::STREAM_WAIT_VALUE_EQ,
        };
        // SAFETY: an aligned live 8-byte location (caller's contract); the mask of all ones
        // compares the whole word.
        self.check("hipStreamWaitValue64", unsafe {
            (self.api.stream_wait_value64)(s, ptr(dst), value, flags, u64::MAX)
        })
    }

    unsafe fn stream_wait_event(&self, stream: HipStream, event: HipEvent) -> Result<()> {
        // SAFETY: live event and stream (caller's contract).
        self.check("hipStreamWaitEvent", unsafe {
            (self.api.stream_wait_event)(stream, event, 0)
        })
    }

    unsafe fn event_create(&self, timing: bool) -> Result<HipEvent> {
        let flags = if timing {
            ffi::EVENT_DEFAULT
        } else {
            ffi::EVENT_DISABLE_TIMING
        };
        let mut raw: HipEvent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is current.
        self.check("hipEventCreateWithFlags", unsafe {
            (self.api.event_create_with_flags)(&mut raw, flags)
        })?;
        Ok(raw)
    }

    unsafe fn event_destroy(&self, event: HipEvent) -> Result<()> {
        // SAFETY: destroyed once (caller's contract).
        self.check("hipEventDestroy", unsafe {
            (self.api.event_destroy)(event)
        })
    }

    unsafe fn event_record(&self, event: HipEvent, stream: HipStream) -> Result<()> {
        // SAFETY: live event and stream of the current device (caller's contract).
        self.check("hipEventRecord", unsafe {
            (self.api.event_record)(event, stream)
        })
    }

    unsafe fn event_query(&self, event: HipEvent) -> Result<bool> {
        // SAFETY: live event (caller's contract).
        let r = unsafe { (self.api.event_query)(event) };
        self.ready("hipEventQuery", r)
    }

    unsafe fn event_elapsed_ms(&self, start: HipEvent, end: HipEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer and live events (caller's contract).
        let r = unsafe { (self.api.event_elapsed_time)(&mut ms, start, end) };
        match r {
            code::SUCCESS => Ok(ms),
            code::NOT_READY | code::INVALID_HANDLE => Err(events_not_reached(self.api.describe(r))),
            r => self.check("hipEventElapsedTime", r).map(|_| 0.0),
        }
    }

    unsafe fn relax_thread_capture(&self) -> Option<i32> {
        let f = self.api.thread_capture_mode?;
        let mut mode: c_int = ffi::STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; the call concerns this thread only.
        (unsafe { f(&mut mode) } == code::SUCCESS).then_some(mode)
    }

    unsafe fn restore_thread_capture(&self, mode: i32) {
        if let Some(f) = self.api.thread_capture_mode {
            let mut m: c_int = mode;
            // SAFETY: as above; a failure leaves the thread relaxed, which refuses nothing.
            let _ = unsafe { f(&mut m) };
        }
    }

    unsafe fn stream_begin_capture(&self, stream: HipStream) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: live stream of the current device (caller's contract). Relaxed mode: other
        // threads keep making unrelated runtime calls while this one captures.
        self.check("hipStreamBeginCapture", unsafe {
            (g.stream_begin_capture)(stream, ffi::STREAM_CAPTURE_MODE_RELAXED)
        })
    }

    unsafe fn stream_is_capturing(&self, stream: HipStream) -> Result<bool> {
        let g = self.graphs()?;
        let mut status: c_int = 0;
        // SAFETY: live stream of the current device (caller's contract); valid out-pointer.
        self.check("hipStreamIsCapturing", unsafe {
            (g.stream_is_capturing)(stream, &mut status)
        })?;
        Ok(status != 0)
    }

    unsafe fn stream_end_capture(&self, stream: HipStream) -> Result<HipGraph> {
        let g = self.graphs()?;
        let mut graph: HipGraph = std::ptr::null_mut();
        // SAFETY: live capturing stream (caller's contract); valid out-pointer.
        self.check("hipStreamEndCapture", unsafe {
            (g.stream_end_capture)(stream, &mut graph)
        })?;
        Ok(graph)
    }

    unsafe fn graph_instantiate(&self, graph: HipGraph) -> Result<HipGraphExec> {
        let g = self.graphs()?;
        let mut exec: HipGraphExec = std::ptr::null_mut();
        // SAFETY: a captured graph (caller's contract); valid out-pointer; no error node or log
        // buffer is asked for (null with size 0).
        self.check("hipGraphInstantiate", unsafe {
            (g.graph_instantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })?;
        Ok(exec)
    }

    unsafe fn graph_launch(&self, exec: HipGraphExec, stream: HipStream) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: live graph exec and stream (caller's contract).
        self.check("hipGraphLaunch", unsafe { (g.graph_launch)(exec, stream) })
    }

    unsafe fn graph_exec_destroy(&self, exec: HipGraphExec) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: destroyed once, nothing pending (caller's contract).
        self.check("hipGraphExecDestroy", unsafe {
            (g.graph_exec_destroy)(exec)
        })
    }

    unsafe fn graph_destroy(&self, graph: HipGraph) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: destroyed once (caller's contract).
        self.check("hipGraphDestroy", unsafe { (g.graph_destroy)(graph) })
    }

    unsafe fn module_load(&self, image: &[u8]) -> Result<HipModule> {
        let mut raw: HipModule = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object (caller's contract); valid out-pointer; the
        // device is current.
        self.check("hipModuleLoadData", unsafe {
            (self.api.module_load_data)(&mut raw, image.as_ptr().cast())
        })?;
        Ok(raw)
    }

    unsafe fn module_unload(&self, module: HipModule) -> Result<()> {
        // SAFETY: unloaded once, nothing pending (caller's contract).
        self.check("hipModuleUnload", unsafe {
            (self.api.module_unload)(module)
        })
    }

    unsafe fn module_function(&self, module: HipModule, name: &CStr) -> Result<HipFunction> {
        let mut func: HipFunction = std::ptr::null_mut();
        // SAFETY: live module; NUL-terminated name; valid out-pointer.
        self.check("hipModuleGetFunction", unsafe {
            (self.api.module_get_function)(&mut func, module, name.as_ptr())
        })?;
        Ok(func)
    }

    unsafe fn function_max_threads(&self, f: HipFunction) -> Result<Option<u32>> {
        let mut max_threads: c_int = 0;
        // SAFETY: live function; valid out-pointer.
        let r = unsafe {
            (self.api.func_get_attribute)(
                &mut max_threads,
                ffi::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                f,
            )
        };
        // Some runtimes do not answer this for module functions.
        Ok(match r {
            code::SUCCESS => u32::try_from(max_threads).ok(),
            _ => None,
        })
    }

    unsafe fn launch(
        &self,
        f: HipFunction,
        cfg: &LaunchConfig,
        stream: HipStream,
        args: &mut [u64],
        len: usize,
    ) -> Result<()> {
        // The kernel's argument segment holds the one struct parameter at offset 0; HIP copies
        // the buffer named by HIP_LAUNCH_PARAM_BUFFER_POINTER (of HIP_LAUNCH_PARAM_BUFFER_SIZE
        // bytes) into it during hipModuleLaunchKernel.
        let mut size: usize = len;
        let mut extra: [*mut c_void; 5] = [
            ffi::LAUNCH_PARAM_BUFFER_POINTER,
            args.as_mut_ptr().cast(),
            ffi::LAUNCH_PARAM_BUFFER_SIZE,
            (&mut size as *mut usize).cast(),
            ffi::LAUNCH_PARAM_END,
        ];
        let extra_ptr: *mut *mut c_void = if len == 0 {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        // SAFETY: `f` is live; `extra` is the documented BUFFER_POINTER/BUFFER_SIZE/END triple,
        // read during the call, pointing to `size` bytes; device addresses inside them are the
        // caller's contract.
        self.check("hipModuleLaunchKernel", unsafe {
            (self.api.module_launch_kernel)(
                f,
                cfg.grid[0],
                cfg.grid[1],
                cfg.grid[2],
                cfg.block[0],
                cfg.block[1],
                cfg.block[2],
                cfg.shared_mem_bytes,
                stream,
                std::ptr::null_mut(),
                extra_ptr,
            )
        })
    }

    fn rtc_version(&self) -> Result<(i32, i32)> {
        hiprtc::hiprtc_version()
    }

    fn rtc_target(arch: &str) -> &str {
        compile_target(arch)
    }

    fn rtc_options(&self) -> String {
        hiprtc::COMPILE_OPTIONS.to_owned()
    }

    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        target: &str,
    ) -> Result<Compiled> {
        let c = hiprtc::compile(name, source, headers, target)?;
        Ok(Compiled {
            image: Image {
                kind: IMAGE_CODE_OBJECT,
                bytes: c.code,
            },
            log: c.log,
            elapsed: c.elapsed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_flags_try_the_runtimes_own_value_first() {
        assert_eq!(ipc_open_flags(5), [0, 1]);
        assert_eq!(ipc_open_flags(6), [1, 0]);
        assert_eq!(ipc_open_flags(7), [1, 0]);
    }
}
