//! Run-time loading of the CUDA driver (`libcuda.so.1`) and the calls the probe needs.
//!
//! The library is opened with `libloading`, never linked, so a binary built with the `cuda`
//! feature starts on machines without NVIDIA software; every missing piece becomes an
//! [`Error::Unavailable`] naming the paths tried.

use mscclpp_hal::{Error, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

type CuInit = unsafe extern "C" fn(flags: u32) -> i32;
type CuDriverGetVersion = unsafe extern "C" fn(version: *mut i32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> i32;

/// What the probe found in a working driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub version: i32,
    /// `cuDeviceGetCount`.
    pub devices: i32,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("cuda backend", reason)
}

fn open() -> Result<libloading::Library> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading the vendor's driver library runs its initialisers, which is what every
        // CUDA program does; we pass a plain library name resolved by the dynamic loader.
        match unsafe { libloading::Library::new(*name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => {
                tracing::debug!(
                    library = name,
                    "cannot open the CUDA driver: {}",
                    mscclpp_hal::error::chain(&e)
                );
                tried.push(*name);
            }
        }
    }
    // The loader's messages (one per name, each with the search path) go to the debug log:
    // this line is printed by every tool on a machine without a GPU.
    Err(unavailable(format!(
        "the CUDA driver library could not be opened (tried {}; MSCCLPP_LOG_LEVEL=debug says why)",
        tried.join(", ")
    )))
}

fn check_raw(call: &'static str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Driver {
            backend: "cuda",
            call,
            code: i64::from(code),
            message: match code {
                100 => "no CUDA-capable device is detected".into(),
                35 | 999 => "the driver could not be initialised".into(),
                3 => "the driver is not initialised".into(),
                _ => "see cudaError/CUresult documentation".into(),
            },
        })
    }
}

/// Opens the driver, initialises it and counts devices.
pub fn probe_driver() -> Result<DriverInfo> {
    let lib = open()?;
    // SAFETY: the symbol types match the CUDA driver API's C declarations
    // (`CUresult cuInit(unsigned)`, `cuDriverGetVersion(int*)`, `cuDeviceGetCount(int*)`).
    let (init, get_version, get_count) = unsafe {
        let init = lib.get::<CuInit>(b"cuInit\0").map_err(|e| {
            unavailable(format!(
                "libcuda lacks cuInit: {}",
                mscclpp_hal::error::chain(&e)
            ))
        })?;
        let ver = lib
            .get::<CuDriverGetVersion>(b"cuDriverGetVersion\0")
            .map_err(|e| {
                unavailable(format!(
                    "libcuda lacks cuDriverGetVersion: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        let count = lib
            .get::<CuDeviceGetCount>(b"cuDeviceGetCount\0")
            .map_err(|e| {
                unavailable(format!(
                    "libcuda lacks cuDeviceGetCount: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        (*init, *ver, *count)
    };
    let mut version = 0i32;
    // SAFETY: valid out-pointer to a local; the library stays loaded (`lib` lives to the end).
    check_raw("cuDriverGetVersion", unsafe { get_version(&mut version) })?;
    // SAFETY: cuInit takes flags that must be 0.
    check_raw("cuInit", unsafe { init(0) }).map_err(|e| {
        unavailable(format!(
            "CUDA driver {} present but {e}",
            format_version(version)
        ))
    })?;
    let mut devices = 0i32;
    // SAFETY: valid out-pointer to a local.
    check_raw("cuDeviceGetCount", unsafe { get_count(&mut devices) })?;
    drop(lib);
    Ok(DriverInfo { version, devices })
}

/// The oldest driver API this backend accepts (CUDA 12.0).
pub const MIN_DRIVER_VERSION: i32 = 12000;

/// Every driver entry point this backend calls through cudarc, under the exact symbol names
/// cudarc's `cuda-13000` bindings resolve. cudarc panics when a symbol is missing, so the probe
/// checks each of them first and reports the missing ones as `Unavailable`.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuStreamBeginCapture_v2",
    "cuThreadExchangeStreamCaptureMode",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxGetState",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuMemGetAddressRange_v2",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuPointerGetAttribute",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamWriteValue64_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuLaunchKernel",
];

/// Entry points used when present (newer drivers), with a fallback otherwise.
pub mod optional {
    /// `cuEventElapsedTime_v2` (CUDA 12.8+); older drivers have `cuEventElapsedTime`.
    pub const EVENT_ELAPSED_TIME_V2: &str = "cuEventElapsedTime_v2";
    /// The pre-12.8 name of the same call.
    pub const EVENT_ELAPSED_TIME_V1: &str = "cuEventElapsedTime";
    /// `cuFuncGetParamInfo` (CUDA 12.4+): lets launches check the argument struct's size.
    pub const FUNC_GET_PARAM_INFO: &str = "cuFuncGetParamInfo";
    /// The multicast entry points (CUDA 12.1+). Listed only to report their presence: this
    /// build never calls them.
    pub const MULTICAST: &[&str] = &[
        "cuMulticastCreate",
        "cuMulticastAddDevice",
        "cuMulticastBindMem",
        "cuMulticastGetGranularity",
    ];
}

/// Which of `names` the library that cudarc opened lacks.
///
/// Returns `Err` when cudarc would not find the library at all (so that `culib()`, which panics
/// in that case, is never reached).
pub fn missing_symbols(names: &[&str]) -> Result<Vec<String>> {
    // SAFETY: `is_culib_present` only tries to open candidate library names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(unavailable(
            "cudarc could not open the CUDA driver library under any of its candidate names".into(),
        ));
    }
    // SAFETY: the library is present (checked just above), so `culib` returns it instead of
    // panicking; it stays loaded for the life of the process.
    let lib = unsafe { cudarc::driver::sys::culib() };
    Ok(names
        .iter()
        .filter(|name| {
            // SAFETY: we only look the symbol up (typed as an opaque pointer) and never call it.
            unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_err()
        })
        .map(|n| (*n).to_owned())
        .collect())
}

/// Whether the library cudarc opened has `name` (false when it has no library at all).
pub fn has_symbol(name: &str) -> bool {
    matches!(missing_symbols(&[name]), Ok(m) if m.is_empty())
}

/// Maps a driver status to `Ok` or an [`Error::Driver`] naming `call`, with the driver's own
/// name and description of the code.
pub fn check(call: &'static str, r: cudarc::driver::sys::CUresult) -> Result<()> {
    use cudarc::driver::sys;
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Driver {
        backend: "cuda",
        call,
        code: r as i64,
        message: describe(r),
    })
}

/// `"CUDA_ERROR_NAME: description"` for a status, from cuGetErrorName / cuGetErrorString.
pub fn describe(r: cudarc::driver::sys::CUresult) -> String {
    use cudarc::driver::sys;
    use std::ffi::{CStr, c_char};
    let text = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: valid out-pointer; the driver is loaded (the backend exists only after the
        // probe checked these symbols) and returns a static string or an error.
        let ok = unsafe { f(r, &mut p) } == sys::CUresult::CUDA_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: non-null, NUL-terminated static string owned by the driver.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        }
    };
    let name = text(sys::cuGetErrorName);
    let desc = text(sys::cuGetErrorString);
    match (name, desc) {
        (Some(n), Some(d)) => format!("{n}: {d}"),
        (Some(n), None) => n,
        (None, Some(d)) => d,
        // Past the driver's shutdown (a process exiting) even the names are refused.
        (None, None) if r == sys::CUresult::CUDA_ERROR_DEINITIALIZED => {
            "CUDA_ERROR_DEINITIALIZED: the driver is shutting down (the process is exiting)".into()
        }
        (None, None) => format!("unknown CUresult {}", r as i64),
    }
}

/// `13000` → `"13.0"`.
pub fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}
