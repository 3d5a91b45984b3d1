//! Our own minimal declarations of the HIP runtime API (`libamdhip64`), resolved at run time.
//!
//! Only what this backend calls is declared, each function as a typed pointer whose signature is
//! copied from `hip_runtime_api.h` (checked against ROCm 5.2's header and ROCm 6/7's). Every
//! symbol is resolved when the library is opened ([`Api::open`]): a runtime that lacks any of
//! them is reported as `Unavailable` naming the missing ones, so no call can ever reach a
//! missing entry point.
//!
//! **Why not `hip-sys`.** That crate links `libamdhip64` at build time and needs the ROCm
//! headers to build, which breaks the project's first principle (one binary, no vendor SDK at
//! build time): a default build must start on a machine with no AMD software at all.
//!
//! **ABI notes** (values that differ between ROCm releases, and how we cope):
//! - `hipIpcMemLazyEnablePeerAccess` is `0` up to ROCm 5.x and `0x01` from ROCm 6, and the
//!   runtime rejects any other value with `hipErrorInvalidValue`: the import tries the value of
//!   the runtime's major version first and the other one after (see `memory.rs`).
//! - `hipDeviceMallocUncached` (`0x3`) is missing from ROCm 5.2; older runtimes reject it and the
//!   allocation falls back to fine-grained memory (`hipDeviceMallocFinegrained`, `0x1`).
//! - `hipDeviceProp_t` changed layout in ROCm 6 (`hipDeviceProp_tR0600`); it is read only for
//!   `gcnArchName`, at the offset of whichever layout the resolved symbol fills, into a buffer
//!   larger than either (see `device.rs`). `hipDeviceAttribute_t` values used here are the same
//!   in ROCm 5 and 6/7 (the enum kept placeholders where it removed entries).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use mscclpp_hal::{Error, Result};

/// `hipError_t`: a C enum, i.e. `int`.
pub type HipError = c_int;
/// `hipStream_t`.
pub type HipStream = *mut c_void;
/// `hipEvent_t`.
pub type HipEvent = *mut c_void;
/// `hipModule_t`.
pub type HipModule = *mut c_void;
/// `hipFunction_t`.
pub type HipFunction = *mut c_void;
/// `hipGraph_t`.
pub type HipGraph = *mut c_void;
/// `hipGraphExec_t`.
pub type HipGraphExec = *mut c_void;
/// `hipDevice_t` (an ordinal on AMD).
pub type HipDevice = c_int;

/// `hipError_t` codes this backend tells apart.
pub mod code {
    use super::HipError;
    /// `hipSuccess`.
    pub const SUCCESS: HipError = 0;
    /// `hipErrorInvalidValue`.
    pub const INVALID_VALUE: HipError = 1;
    /// `hipErrorOutOfMemory`.
    pub const OUT_OF_MEMORY: HipError = 2;
    /// `hipErrorNotInitialized`.
    pub const NOT_INITIALIZED: HipError = 3;
    /// `hipErrorNoDevice`.
    pub const NO_DEVICE: HipError = 100;
    /// `hipErrorInvalidDevice` (what ROCm 5.2's `hipInit` returns without a GPU).
    pub const INVALID_DEVICE: HipError = 101;
    /// `hipErrorInvalidHandle` / `hipErrorInvalidResourceHandle`.
    pub const INVALID_HANDLE: HipError = 400;
    /// `hipErrorNotFound`.
    pub const NOT_FOUND: HipError = 500;
    /// `hipErrorNotReady`.
    pub const NOT_READY: HipError = 600;
    /// `hipErrorPeerAccessAlreadyEnabled`.
    pub const PEER_ACCESS_ALREADY_ENABLED: HipError = 704;
}

/// `hipStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `hipEventDefault`.
pub const EVENT_DEFAULT: c_uint = 0x0;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipHostMallocPortable`.
pub const HOST_MALLOC_PORTABLE: c_uint = 0x1;
/// `hipHostMallocMapped`.
pub const HOST_MALLOC_MAPPED: c_uint = 0x2;
/// `hipDeviceMallocFinegrained`.
pub const DEVICE_MALLOC_FINEGRAINED: c_uint = 0x1;
/// `hipDeviceMallocUncached` (ROCm 5.3+).
pub const DEVICE_MALLOC_UNCACHED: c_uint = 0x3;
/// `hipIpcMemLazyEnablePeerAccess` of ROCm 6 and later.
pub const IPC_LAZY_ENABLE_PEER_ACCESS_V6: c_uint = 0x1;
/// `hipIpcMemLazyEnablePeerAccess` of ROCm 5.x.
pub const IPC_LAZY_ENABLE_PEER_ACCESS_V5: c_uint = 0x0;
/// `hipMemcpyDefault`: direction inferred from the pointers (unified addressing).
pub const MEMCPY_DEFAULT: c_int = 4;
/// `HIP_IPC_HANDLE_SIZE`.
pub const IPC_HANDLE_SIZE: usize = 64;
/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`.
pub const LAUNCH_PARAM_BUFFER_POINTER: *mut c_void = std::ptr::without_provenance_mut(0x1);
/// `HIP_LAUNCH_PARAM_BUFFER_SIZE`.
pub const LAUNCH_PARAM_BUFFER_SIZE: *mut c_void = std::ptr::without_provenance_mut(0x2);
/// `HIP_LAUNCH_PARAM_END`.
pub const LAUNCH_PARAM_END: *mut c_void = std::ptr::without_provenance_mut(0x3);
/// `HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
pub const FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;

/// `hipDeviceAttribute_t` values used (identical in ROCm 5.x, 6.x and 7.x headers).
pub mod attr {
    use std::ffi::c_int;
    /// `hipDeviceAttributeMaxThreadsPerBlock`.
    pub const MAX_THREADS_PER_BLOCK: c_int = 56;
    /// `hipDeviceAttributeMultiprocessorCount`.
    pub const MULTIPROCESSOR_COUNT: c_int = 63;
    /// `hipDeviceAttributeWarpSize`.
    pub const WARP_SIZE: c_int = 87;
}

/// `hipDeviceProp_t` layouts: where `gcnArchName` (256 bytes) sits in each.
pub mod props {
    /// Offset of `gcnArchName` in the pre-6.0 layout (`hipDeviceProp_tR0000`, filled by the
    /// unversioned `hipGetDeviceProperties` symbol in ROCm 5.x and 6.x); from `offsetof` against
    /// ROCm 5.2's header.
    pub const R0000_GCN_ARCH_NAME: usize = 396;
    /// Size of `hipDeviceProp_tR0000`.
    pub const R0000_SIZE: usize = 792;
    /// Offset of `gcnArchName` in `hipDeviceProp_tR0600` (filled by
    /// `hipGetDevicePropertiesR0600`, ROCm 6+); from `offsetof` against the ROCm 6/7 header's
    /// struct.
    pub const R0600_GCN_ARCH_NAME: usize = 1160;
    /// Size of `hipDeviceProp_tR0600`.
    pub const R0600_SIZE: usize = 1472;
    /// Length of `gcnArchName`.
    pub const GCN_ARCH_NAME_LEN: usize = 256;
    /// The buffer handed to either call: larger than both layouts, so a layout we got wrong
    /// can never make the runtime write past it.
    pub const BUFFER: usize = 4096;
}

type Init = unsafe extern "C" fn(flags: c_uint) -> HipError;
type GetInt = unsafe extern "C" fn(out: *mut c_int) -> HipError;
type GetDeviceProperties = unsafe extern "C" fn(prop: *mut c_void, device: c_int) -> HipError;
type DeviceGetAttribute =
    unsafe extern "C" fn(value: *mut c_int, attr: c_int, device: c_int) -> HipError;
type DeviceTotalMem = unsafe extern "C" fn(bytes: *mut usize, device: HipDevice) -> HipError;
type DeviceGetString =
    unsafe extern "C" fn(out: *mut c_char, len: c_int, device: c_int) -> HipError;
type SetDevice = unsafe extern "C" fn(device: c_int) -> HipError;
type Malloc = unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize) -> HipError;
type MallocFlags =
    unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> HipError;
type HostGetDevicePointer =
    unsafe extern "C" fn(dev: *mut *mut c_void, host: *mut c_void, flags: c_uint) -> HipError;
type Free = unsafe extern "C" fn(ptr: *mut c_void) -> HipError;
type StreamCreateWithFlags =
    unsafe extern "C" fn(stream: *mut HipStream, flags: c_uint) -> HipError;
type StreamFn = unsafe extern "C" fn(stream: HipStream) -> HipError;
type MemcpyAsync = unsafe extern "C" fn(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    stream: HipStream,
) -> HipError;
type MemsetD8Async =
    unsafe extern "C" fn(dst: *mut c_void, value: u8, count: usize, stream: HipStream) -> HipError;
type StreamWriteValue64 = unsafe extern "C" fn(
    stream: HipStream,
    ptr: *mut c_void,
    value: u64,
    flags: c_uint,
) -> HipError;
type StreamWaitValue64 = unsafe extern "C" fn(
    stream: HipStream,
    ptr: *mut c_void,
    value: u64,
    flags: c_uint,
    mask: u64,
) -> HipError;
/// `hipStreamWaitValueGte`, `hipStreamWaitValueEq` (hip_runtime_api.h).
pub(crate) const STREAM_WAIT_VALUE_GTE: c_uint = 0;
pub(crate) const STREAM_WAIT_VALUE_EQ: c_uint = 1;
type StreamWaitEvent =
    unsafe extern "C" fn(stream: HipStream, event: HipEvent, flags: c_uint) -> HipError;
type EventCreateWithFlags = unsafe extern "C" fn(event: *mut HipEvent, flags: c_uint) -> HipError;
type EventRecord = unsafe extern "C" fn(event: HipEvent, stream: HipStream) -> HipError;
type EventFn = unsafe extern "C" fn(event: HipEvent) -> HipError;
type EventElapsedTime =
    unsafe extern "C" fn(ms: *mut f32, start: HipEvent, stop: HipEvent) -> HipError;
/// `hipIpcMemHandle_t` is a struct of 64 `char`s passed by value: the same in the C ABI as a
/// `#[repr(C)]` struct holding `[u8; 64]`.
type IpcGetMemHandle =
    unsafe extern "C" fn(handle: *mut IpcMemHandle, ptr: *mut c_void) -> HipError;
type IpcOpenMemHandle =
    unsafe extern "C" fn(ptr: *mut *mut c_void, handle: IpcMemHandle, flags: c_uint) -> HipError;
type DeviceCanAccessPeer =
    unsafe extern "C" fn(can: *mut c_int, device: c_int, peer: c_int) -> HipError;
type MemGetAddressRange =
    unsafe extern "C" fn(base: *mut *mut c_void, size: *mut usize, ptr: *mut c_void) -> HipError;
type ModuleLoadData =
    unsafe extern "C" fn(module: *mut HipModule, image: *const c_void) -> HipError;
type ModuleGetFunction =
    unsafe extern "C" fn(f: *mut HipFunction, module: HipModule, name: *const c_char) -> HipError;
type ModuleLaunchKernel = unsafe extern "C" fn(
    f: HipFunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: HipStream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> HipError;
type ModuleUnload = unsafe extern "C" fn(module: HipModule) -> HipError;
type FuncGetAttribute =
    unsafe extern "C" fn(value: *mut c_int, attr: c_int, f: HipFunction) -> HipError;
type ErrorText = unsafe extern "C" fn(code: HipError) -> *const c_char;
type StreamBeginCapture = unsafe extern "C" fn(stream: HipStream, mode: c_int) -> HipError;
type StreamEndCapture = unsafe extern "C" fn(stream: HipStream, graph: *mut HipGraph) -> HipError;
/// `hipStreamCaptureStatus` is a C enum (int); 0 is `hipStreamCaptureStatusNone`.
type StreamIsCapturing = unsafe extern "C" fn(stream: HipStream, status: *mut c_int) -> HipError;
type GraphInstantiate = unsafe extern "C" fn(
    exec: *mut HipGraphExec,
    graph: HipGraph,
    error_node: *mut *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> HipError;
type GraphLaunch = unsafe extern "C" fn(exec: HipGraphExec, stream: HipStream) -> HipError;
type GraphExecDestroy = unsafe extern "C" fn(exec: HipGraphExec) -> HipError;
type GraphDestroy = unsafe extern "C" fn(graph: HipGraph) -> HipError;
/// `hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode)` (a C enum, int).
pub(crate) type ThreadExchangeCaptureMode = unsafe extern "C" fn(mode: *mut c_int) -> HipError;

/// The stream-capture and graph entry points, present together or not at all: a runtime
/// without them opens, without graph capture.
#[derive(Debug, Clone, Copy)]
pub struct GraphApi {
    pub(crate) stream_begin_capture: StreamBeginCapture,
    pub(crate) stream_end_capture: StreamEndCapture,
    pub(crate) stream_is_capturing: StreamIsCapturing,
    pub(crate) graph_instantiate: GraphInstantiate,
    pub(crate) graph_launch: GraphLaunch,
    pub(crate) graph_exec_destroy: GraphExecDestroy,
    pub(crate) graph_destroy: GraphDestroy,
}

/// The symbols of [`GraphApi`].
pub const GRAPH_SYMBOLS: &[&str] = &[
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipGraphInstantiate",
    "hipGraphLaunch",
    "hipGraphExecDestroy",
    "hipGraphDestroy",
    "hipStreamIsCapturing",
];

/// `hipStreamCaptureModeRelaxed`.
pub const STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `hipIpcMemHandle_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcMemHandle {
    /// The opaque handle bytes.
    pub reserved: [u8; IPC_HANDLE_SIZE],
}

/// Declares [`Api`] (one field per entry point), [`REQUIRED_SYMBOLS`] and the resolution of an
/// opened library, from one table: field, C signature (from hip_runtime_api.h), symbol.
macro_rules! hip_api {
    ($($field:ident: $t:ty = $name:literal;)*) => {
        /// Every HIP runtime entry point this backend calls, resolved from one opened library.
        #[derive(Debug)]
        pub struct Api {
            /// The library name or path that opened.
            pub library: String,
            $(pub(crate) $field: $t,)*
            /// `hipGetDevicePropertiesR0600` (ROCm 6+), where present.
            pub(crate) get_device_properties_r0600: Option<GetDeviceProperties>,
            /// Stream capture and graphs, where present.
            pub(crate) graphs: Option<GraphApi>,
            /// `hipThreadExchangeStreamCaptureMode`, where present.
            pub(crate) thread_capture_mode: Option<ThreadExchangeCaptureMode>,
            /// Keeps every pointer above valid. Never unloaded: the HIP runtime does not support
            /// being unloaded while the process runs.
            _lib: libloading::Library,
        }

        /// Every symbol [`Api`] requires, in declaration order (for reports and tests).
        pub const REQUIRED_SYMBOLS: &[&str] = &[$($name,)*];

        impl Api {
            /// Resolves every symbol of `lib` (opened from `library`); the error lists all the
            /// missing ones.
            fn resolve(
                lib: libloading::Library,
                library: &str,
            ) -> std::result::Result<Api, OpenError> {
                let mut missing: Vec<&'static str> = Vec::new();
                $(
                    // SAFETY: `$t` is the exact C signature of this function in
                    // hip_runtime_api.h (hipError_t is a C enum = int; handles are pointers;
                    // hipDevice_t is int). The pointer is stored next to `lib` in `Api`, which
                    // keeps the library loaded for as long as the pointer can be used.
                    let $field = match unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) } {
                        Ok(f) => Some(*f),
                        Err(_) => {
                            missing.push($name);
                            None
                        }
                    };
                )*
                // This one is optional, so its absence is not recorded.
                let get_device_properties_r0600 =
                    // SAFETY: as above (the signature of hipGetDevicePropertiesR0600).
                    unsafe { lib.get::<GetDeviceProperties>(b"hipGetDevicePropertiesR0600\0") }
                        .ok()
                        .map(|f| *f);
                /// Looks up an optional symbol.
                ///
                /// # Safety
                /// `T` is the symbol's exact C signature; the pointer is used only while `lib`
                /// is loaded.
                unsafe fn optional<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
                    // SAFETY: forwarded contract.
                    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|f| *f)
                }
                // SAFETY: each type is the C signature of that function in hip_runtime_api.h
                // (graphs and graph execs are pointers); `Api` keeps `lib` loaded.
                let graphs = unsafe {
                    (|| {
                        Some(GraphApi {
                            stream_begin_capture: optional(&lib, GRAPH_SYMBOLS[0])?,
                            stream_end_capture: optional(&lib, GRAPH_SYMBOLS[1])?,
                            graph_instantiate: optional(&lib, GRAPH_SYMBOLS[2])?,
                            graph_launch: optional(&lib, GRAPH_SYMBOLS[3])?,
                            graph_exec_destroy: optional(&lib, GRAPH_SYMBOLS[4])?,
                            graph_destroy: optional(&lib, GRAPH_SYMBOLS[5])?,
                            stream_is_capturing: optional(&lib, GRAPH_SYMBOLS[6])?,
                        })
                    })()
                };
                // SAFETY: as above (the signature of hipThreadExchangeStreamCaptureMode).
                let thread_capture_mode = unsafe {
                    optional::<ThreadExchangeCaptureMode>(
                        &lib,
                        "hipThreadExchangeStreamCaptureMode",
                    )
                };
                if !missing.is_empty() {
                    return Err(OpenError::MissingSymbols(missing));
                }
                Ok(Api {
                    library: library.to_owned(),
                    $($field: match $field {
                        Some(f) => f,
                        // Unreachable: every `None` above recorded its name.
                        None => return Err(OpenError::MissingSymbols(vec![$name])),
                    },)*
                    get_device_properties_r0600,
                    graphs,
                    thread_capture_mode,
                    _lib: lib,
                })
            }
        }
    };
}

hip_api! {
    init: Init = "hipInit";
    driver_get_version: GetInt = "hipDriverGetVersion";
    runtime_get_version: GetInt = "hipRuntimeGetVersion";
    get_device_count: GetInt = "hipGetDeviceCount";
    get_device_properties: GetDeviceProperties = "hipGetDeviceProperties";
    device_get_attribute: DeviceGetAttribute = "hipDeviceGetAttribute";
    device_total_mem: DeviceTotalMem = "hipDeviceTotalMem";
    device_get_pci_bus_id: DeviceGetString = "hipDeviceGetPCIBusId";
    device_get_name: DeviceGetString = "hipDeviceGetName";
    set_device: SetDevice = "hipSetDevice";
    malloc: Malloc = "hipMalloc";
    ext_malloc_with_flags: MallocFlags = "hipExtMallocWithFlags";
    host_malloc: MallocFlags = "hipHostMalloc";
    host_get_device_pointer: HostGetDevicePointer = "hipHostGetDevicePointer";
    free: Free = "hipFree";
    host_free: Free = "hipHostFree";
    stream_create_with_flags: StreamCreateWithFlags = "hipStreamCreateWithFlags";
    stream_destroy: StreamFn = "hipStreamDestroy";
    stream_query: StreamFn = "hipStreamQuery";
    stream_wait_event: StreamWaitEvent = "hipStreamWaitEvent";
    memcpy_async: MemcpyAsync = "hipMemcpyAsync";
    memset_d8_async: MemsetD8Async = "hipMemsetD8Async";
    stream_write_value64: StreamWriteValue64 = "hipStreamWriteValue64";
    stream_wait_value64: StreamWaitValue64 = "hipStreamWaitValue64";
    event_create_with_flags: EventCreateWithFlags = "hipEventCreateWithFlags";
    event_record: EventRecord = "hipEventRecord";
    event_query: EventFn = "hipEventQuery";
    event_elapsed_time: EventElapsedTime = "hipEventElapsedTime";
    event_destroy: EventFn = "hipEventDestroy";
    ipc_get_mem_handle: IpcGetMemHandle = "hipIpcGetMemHandle";
    ipc_open_mem_handle: IpcOpenMemHandle = "hipIpcOpenMemHandle";
    ipc_close_mem_handle: Free = "hipIpcCloseMemHandle";
    device_can_access_peer: DeviceCanAccessPeer = "hipDeviceCanAccessPeer";
    mem_get_address_range: MemGetAddressRange = "hipMemGetAddressRange";
    module_load_data: ModuleLoadData = "hipModuleLoadData";
    module_get_function: ModuleGetFunction = "hipModuleGetFunction";
    module_launch_kernel: ModuleLaunchKernel = "hipModuleLaunchKernel";
    module_unload: ModuleUnload = "hipModuleUnload";
    func_get_attribute: FuncGetAttribute = "hipFuncGetAttribute";
    get_error_name: ErrorText = "hipGetErrorName";
    get_error_string: ErrorText = "hipGetErrorString";
}

/// Symbols used when present (with [`GRAPH_SYMBOLS`]).
pub const OPTIONAL_SYMBOLS: &[&str] = &["hipGetDevicePropertiesR0600"];

/// Library names tried by [`api`], in order.
pub const LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
    "/opt/rocm/lib/libamdhip64.so",
];

/// Why a library could not serve as the HIP runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// The dynamic loader could not open it.
    NotLoadable(String),
    /// It opened but lacks these required symbols.
    MissingSymbols(Vec<&'static str>),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NotLoadable(e) => write!(f, "cannot be opened: {e}"),
            OpenError::MissingSymbols(m) => write!(
                f,
                "opened but lacks {} entry point(s) this backend needs: {}",
                m.len(),
                m.join(", ")
            ),
        }
    }
}

impl Api {
    /// Opens `library` (a name for the dynamic loader or a path) and resolves every symbol.
    /// Never panics; a missing symbol is reported with all the others that are missing.
    pub fn open(library: &str) -> std::result::Result<Api, OpenError> {
        // SAFETY: loading a shared library runs its initialisers; for the HIP runtime this is
        // what every HIP program does, and the tests only point this at system libraries.
        let lib = unsafe { libloading::Library::new(library) }
            .map_err(|e| OpenError::NotLoadable(mscclpp_hal::error::chain(&e)))?;
        Api::resolve(lib, library)
    }

    /// Tries each of `names` in order; the first library with every symbol wins. The error
    /// names what each candidate lacked.
    pub fn open_first(names: &[&str]) -> std::result::Result<Api, String> {
        let mut tried = Vec::new();
        let mut lacking = Vec::new();
        for name in names {
            match Api::open(name) {
                Ok(api) => return Ok(api),
                Err(e) => {
                    tracing::debug!(library = name, "not a usable HIP runtime: {e}");
                    if let OpenError::MissingSymbols(m) = &e {
                        lacking.push(format!("{name} lacks {} entry point(s)", m.len()));
                    }
                    tried.push(*name);
                }
            }
        }
        // Each loader message repeats the search path: they go to the debug log, since this
        // line is printed by every tool on a machine without an AMD GPU.
        let lacking = if lacking.is_empty() {
            String::new()
        } else {
            format!("; {}", lacking.join(", "))
        };
        Err(format!(
            "no usable HIP runtime library (tried {}{lacking}; MSCCLPP_LOG_LEVEL=debug says why)",
            tried.join(", ")
        ))
    }

    fn text(&self, f: ErrorText, code: HipError) -> Option<String> {
        // SAFETY: hipGetErrorName/hipGetErrorString accept any value and return a pointer to a
        // static NUL-terminated string (or null), whether or not hipInit succeeded.
        let p = unsafe { f(code) };
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null, NUL-terminated and static (see above).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    }

    /// `"hipErrorName: description"` for a code.
    pub fn describe(&self, code: HipError) -> String {
        let name = self.text(self.get_error_name, code);
        let desc = self.text(self.get_error_string, code);
        let base = match (name, desc) {
            (Some(n), Some(d)) if n != d => format!("{n}: {d}"),
            (Some(n), _) => n,
            (None, Some(d)) => d,
            (None, None) => format!("unknown hipError_t {code}"),
        };
        match code {
            code::NO_DEVICE | code::INVALID_DEVICE => {
                format!("{base} (no usable AMD GPU: is /dev/kfd present and readable?)")
            }
            _ => base,
        }
    }

    /// Maps a status to `Ok` or an [`Error::Driver`] naming `call`.
    pub fn check(&self, call: &'static str, code: HipError) -> Result<()> {
        if code == code::SUCCESS {
            Ok(())
        } else {
            Err(Error::Driver {
                backend: "rocm",
                call,
                code: i64::from(code),
                message: self.describe(code),
            })
        }
    }
}

/// The process's HIP runtime, opened once from [`LIBRARY_NAMES`].
pub fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| Api::open_first(LIBRARY_NAMES))
        .as_ref()
        .map_err(|reason| Error::unavailable("rocm backend", reason.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc opens but has none of the HIP symbols: the error lists every one, in order.
    #[test]
    fn a_library_without_the_symbols_is_reported_with_every_missing_name() {
        let e = Api::open("libc.so.6").unwrap_err();
        match &e {
            OpenError::MissingSymbols(m) => assert_eq!(m.as_slice(), REQUIRED_SYMBOLS),
            other => panic!("expected missing symbols, got {other:?}"),
        }
        let text = e.to_string();
        for name in [
            "hipInit",
            "hipMalloc",
            "hipModuleLaunchKernel",
            "hipGetErrorString",
        ] {
            assert!(text.contains(name), "{text}");
        }
        let all = Api::open_first(&["libc.so.6", "libdoes-not-exist-mscclpp.so"]).unwrap_err();
        assert!(all.contains("libc.so.6 lacks"), "{all}");
        assert!(all.contains("libdoes-not-exist-mscclpp.so"), "{all}");
        // One short line: the loader's messages are at debug level.
        let every = Api::open_first(LIBRARY_NAMES);
        if let Err(e) = every {
            assert!(e.len() < 200 && !e.contains('\n'), "{} chars: {e}", e.len());
        }
    }

    /// Where ROCm's runtime is installed (this repository's build machines: Debian's ROCm 5.2),
    /// every required symbol resolves.
    #[test]
    fn the_installed_runtime_has_every_symbol_or_is_absent() {
        match Api::open_first(LIBRARY_NAMES) {
            Ok(api) => {
                let d = api.describe(code::INVALID_DEVICE);
                assert!(d.contains("/dev/kfd"), "{d}");
                assert!(api.check("hipInit", code::SUCCESS).is_ok());
            }
            Err(e) => assert!(e.contains("tried"), "{e}"),
        }
    }
}
