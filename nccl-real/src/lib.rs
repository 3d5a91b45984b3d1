//! # mscclpp-nccl-real — the real NCCL, opened at run time
//!
//! One binding of NCCL's C API, shared by the benchmark's baseline (`mscclpp-perf --baseline
//! nccl`) and the C library's fallback for the operations it does not serve itself
//! (`libmscclpp_nccl`). Nothing links NCCL: [`RealNccl::open`] loads it where it is asked to.
//!
//! Before loading, [`mscclpp_hal::env::check_nccl_nvls`] makes sure NCCL cannot create NVLink
//! multicast objects where this process has them disabled. After loading, a library that
//! exports [`SHIM_MARKER`] — `libmscclpp_nccl` itself — is refused: forwarding to ourselves
//! would recurse until the stack overflows.
//!
//! The library is opened with `RTLD_LAZY | RTLD_LOCAL | RTLD_DEEPBIND`: its symbols stay out of
//! the global scope, so a process that preloads `libmscclpp_nccl` keeps resolving `ncclAllReduce`
//! & co. to it, and (`RTLD_DEEPBIND`) the real library's calls to its *own* exported functions
//! resolve inside itself rather than to the preloaded ones. Without it, under PyTorch the real
//! NCCL's internal `ncclGroupStart`/`End` landed in the preloaded library and every forwarded
//! `ncclSend` failed with "invalid argument".

#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{CStr, c_char, c_int, c_void};

use mscclpp_hal::{Error, Result};

/// The variable naming the real NCCL to open.
pub const LIB_PATH_VAR: &str = "MSCCLPP_NCCL_LIB_PATH";
/// What is opened when [`LIB_PATH_VAR`] is unset and a caller wants NCCL anyway (the baseline).
pub const DEFAULT_LIB: &str = "libnccl.so.2";
/// A symbol only `libmscclpp_nccl` exports (a C function returning 1), so that it is never
/// taken for the real NCCL.
pub const SHIM_MARKER: &str = "mscclppNcclShim";

/// [`LIB_PATH_VAR`], when set.
pub fn env_path() -> Option<String> {
    mscclpp_hal::env::get(LIB_PATH_VAR)
}

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t`.
pub type Stream = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// glibc's `RTLD_DEEPBIND` (not exported by libloading).
#[cfg(unix)]
const RTLD_DEEPBIND: c_int = 0x8;

macro_rules! real_api {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty ;)*) => {
        /// The real NCCL: its entry points (`None` where its version lacks one).
        #[allow(missing_docs)]
        pub struct RealNccl {
            _lib: libloading::Library,
            /// The path it was opened from.
            pub path: String,
            /// Its `ncclGetVersion` (major * 10000 + minor * 100 + patch).
            pub version: c_int,
            $( pub $field: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        impl RealNccl {
            fn bind(lib: libloading::Library, path: &str) -> RealNccl {
                $(
                    // SAFETY: the type is the symbol's C declaration in NCCL 2.28's nccl.h.
                    let $field = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>($sym) }
                        .ok()
                        .map(|s| *s);
                )*
                RealNccl { _lib: lib, path: path.to_owned(), version: 0, $($field,)* }
            }
        }
    };
}

real_api! {
    get_version: b"ncclGetVersion\0" => fn(*mut c_int) -> NcclResult;
    get_unique_id: b"ncclGetUniqueId\0" => fn(*mut UniqueId) -> NcclResult;
    get_error_string: b"ncclGetErrorString\0" => fn(NcclResult) -> *const c_char;
    get_last_error: b"ncclGetLastError\0" => fn(Comm) -> *const c_char;
    comm_init_rank: b"ncclCommInitRank\0" => fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
    comm_init_rank_config: b"ncclCommInitRankConfig\0" => fn(*mut Comm, c_int, UniqueId, c_int, *mut c_void) -> NcclResult;
    comm_init_all: b"ncclCommInitAll\0" => fn(*mut Comm, c_int, *const c_int) -> NcclResult;
    comm_finalize: b"ncclCommFinalize\0" => fn(Comm) -> NcclResult;
    comm_destroy: b"ncclCommDestroy\0" => fn(Comm) -> NcclResult;
    comm_abort: b"ncclCommAbort\0" => fn(Comm) -> NcclResult;
    comm_split: b"ncclCommSplit\0" => fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> NcclResult;
    comm_shrink: b"ncclCommShrink\0" => fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> NcclResult;
    comm_get_async_error: b"ncclCommGetAsyncError\0" => fn(Comm, *mut NcclResult) -> NcclResult;
    comm_count: b"ncclCommCount\0" => fn(Comm, *mut c_int) -> NcclResult;
    comm_user_rank: b"ncclCommUserRank\0" => fn(Comm, *mut c_int) -> NcclResult;
    comm_cu_device: b"ncclCommCuDevice\0" => fn(Comm, *mut c_int) -> NcclResult;
    all_reduce: b"ncclAllReduce\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
    all_gather: b"ncclAllGather\0" => fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
    reduce_scatter: b"ncclReduceScatter\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
    broadcast: b"ncclBroadcast\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
    reduce: b"ncclReduce\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Stream) -> NcclResult;
    all_to_all: b"ncclAlltoAll\0" => fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
    send: b"ncclSend\0" => fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
    recv: b"ncclRecv\0" => fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
    group_start: b"ncclGroupStart\0" => fn() -> NcclResult;
    group_end: b"ncclGroupEnd\0" => fn() -> NcclResult;
    group_simulate_end: b"ncclGroupSimulateEnd\0" => fn(*mut c_void) -> NcclResult;
    red_op_create_pre_mul_sum: b"ncclRedOpCreatePreMulSum\0" => fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> NcclResult;
    red_op_destroy: b"ncclRedOpDestroy\0" => fn(c_int, Comm) -> NcclResult;
    dev_comm_create: b"ncclDevCommCreate\0" => fn(Comm, *const c_void, *mut c_void) -> NcclResult;
    dev_comm_destroy: b"ncclDevCommDestroy\0" => fn(Comm, *const c_void) -> NcclResult;
}

impl std::fmt::Debug for RealNccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl RealNccl {
    /// Opens the NCCL at `path` (a file name is looked up as `dlopen` does) for `purpose`,
    /// which the errors name. Refuses to load it where NCCL could create NVLink multicast
    /// objects this process has disabled, and refuses `libmscclpp_nccl`.
    pub fn open(path: &str, purpose: &str) -> Result<RealNccl> {
        mscclpp_hal::env::check_nccl_nvls(purpose)?;
        let cannot = |e: &dyn std::error::Error| {
            Error::unavailable(
                purpose,
                format!(
                    "{path}: cannot open the real NCCL: {}",
                    mscclpp_hal::error::chain(e)
                ),
            )
        };
        #[cfg(unix)]
        // SAFETY: loading NCCL runs its initialisers, as linking it would.
        let lib: libloading::Library = unsafe {
            libloading::os::unix::Library::open(
                Some(path),
                libloading::os::unix::RTLD_LAZY | libloading::os::unix::RTLD_LOCAL | RTLD_DEEPBIND,
            )
        }
        .map(Into::into)
        .map_err(|e| cannot(&e))?;
        #[cfg(not(unix))]
        // SAFETY: as above.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| cannot(&e))?;
        let marker = format!("{SHIM_MARKER}\0");
        // SAFETY: only the address is looked up.
        if unsafe { lib.get::<*const c_void>(marker.as_bytes()) }.is_ok() {
            return Err(Error::invalid(format!(
                "{purpose}: {path} is libmscclpp_nccl (it exports {SHIM_MARKER}), not the real NCCL; \
                 {LIB_PATH_VAR} must name NCCL's own library (libnccl.so.2)"
            )));
        }
        let mut real = RealNccl::bind(lib, path);
        if real.comm_init_rank.is_none() || real.get_unique_id.is_none() {
            return Err(Error::unavailable(
                purpose,
                format!(
                    "{path} does not look like NCCL: it lacks ncclCommInitRank or ncclGetUniqueId"
                ),
            ));
        }
        if let Some(f) = real.get_version {
            let mut v: c_int = 0;
            // SAFETY: a valid out-pointer.
            if unsafe { f(&mut v) } == NCCL_SUCCESS {
                real.version = v;
            }
        }
        tracing::info!(path, version = real.version, purpose, "real NCCL opened");
        Ok(real)
    }

    /// The version as `major.minor.patch`.
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    }

    /// An entry point, or an error naming it when this NCCL lacks it.
    pub fn entry<T: Copy>(&self, f: Option<T>, name: &str) -> Result<T> {
        f.ok_or_else(|| {
            Error::unavailable(
                name,
                format!(
                    "the real NCCL at {} (version {}) lacks it",
                    self.path,
                    self.version_string()
                ),
            )
        })
    }

    /// What NCCL says about result `r`: its last error, else its text for the code.
    pub fn describe(&self, r: NcclResult) -> String {
        let text = |p: *const c_char| {
            // SAFETY: NCCL returns a NUL-terminated string it owns, copied at once.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        self.get_last_error
            // SAFETY: a null communicator asks for the last error of any.
            .and_then(|f| text(unsafe { f(std::ptr::null_mut()) }))
            .filter(|s| !s.is_empty())
            // SAFETY: NCCL returns a static string for every result code.
            .or_else(|| self.get_error_string.and_then(|f| text(unsafe { f(r) })))
            .unwrap_or_default()
    }

    /// `Ok` for `ncclSuccess`, else a driver error of `call` with NCCL's description.
    pub fn result(&self, call: &'static str, r: NcclResult) -> Result<()> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        Err(Error::Driver {
            backend: "nccl",
            call,
            code: i64::from(r),
            message: self.describe(r),
        })
    }
}
