//! The real NCCL, opened at run time from `MSCCLPP_NCCL_LIB_PATH` for the operations this
//! library does not serve itself.
//!
//! It is opened with `RTLD_LAZY | RTLD_LOCAL | RTLD_DEEPBIND`: its symbols stay out of the
//! global scope, so the process keeps resolving `ncclAllReduce` & co. to this library, and
//! (`RTLD_DEEPBIND`) the real library's calls to its *own* exported functions resolve inside
//! itself rather than to the preloaded ones (ours). Without it, the first run under PyTorch
//! (2 x H200, NCCL 2.28) failed every forwarded `ncclSend` and `ncclCommFinalize` with
//! "invalid argument": the real NCCL's internal `ncclGroupStart`/`End` and friends landed here.
//! This library still never forwards `ncclBcast` (it forwards `ncclBroadcast(buff, buff, ...)`),
//! and every export checks that a communicator handle is one of ours, so a stray call with a
//! real handle fails cleanly instead of crashing.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::abi::*;
use crate::error::{Failure, Res};

type Comm = NcclComm;

/// glibc's `RTLD_DEEPBIND` (not exported by libloading): the opened library resolves its own
/// symbols before the global scope.
#[cfg(unix)]
const RTLD_DEEPBIND: std::ffi::c_int = 0x8;

macro_rules! real_api {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty ;)*) => {
        /// Entry points of the real NCCL (`None` where its version lacks one).
        #[allow(missing_docs)]
        pub struct RealNccl {
            _lib: libloading::Library,
            /// The path it was opened from.
            pub path: String,
            /// Its `ncclGetVersion`.
            pub version: c_int,
            $( pub $field: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        impl RealNccl {
            fn load(path: &str) -> Res<RealNccl> {
                mscclpp::hal::env::check_nccl_nvls(&format!("MSCCLPP_NCCL_LIB_PATH={path}"))
                    .map_err(Failure::from)?;
                #[cfg(unix)]
                // SAFETY: loading NCCL runs its initialisers, as linking it would.
                let lib: libloading::Library = unsafe {
                    libloading::os::unix::Library::open(
                        Some(path),
                        libloading::os::unix::RTLD_LAZY
                            | libloading::os::unix::RTLD_LOCAL
                            | RTLD_DEEPBIND,
                    )
                }
                .map(Into::into)
                .map_err(|e| Failure::system(format!(
                    "MSCCLPP_NCCL_LIB_PATH={path}: cannot open the real NCCL: {}",
                    mscclpp::hal::error::chain(&e)
                )))?;
                #[cfg(not(unix))]
                // SAFETY: as above.
                let lib = unsafe { libloading::Library::new(path) }.map_err(|e| Failure::system(format!(
                    "MSCCLPP_NCCL_LIB_PATH={path}: cannot open the real NCCL: {e}"
                )))?;
                $(
                    // SAFETY: the type is the symbol's C declaration in NCCL 2.28's nccl.h.
                    let $field = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>($sym) }
                        .ok()
                        .map(|s| *s);
                )*
                let mut real = RealNccl { _lib: lib, path: path.to_owned(), version: 0, $($field,)* };
                if real.comm_init_rank.is_none() || real.get_unique_id.is_none() {
                    return Err(Failure::system(format!(
                        "MSCCLPP_NCCL_LIB_PATH={path} does not look like NCCL: it lacks ncclCommInitRank or ncclGetUniqueId"
                    )));
                }
                if let Some(f) = real.get_version {
                    let mut v: c_int = 0;
                    // SAFETY: valid out-pointer.
                    if unsafe { f(&mut v) } == NCCL_SUCCESS {
                        real.version = v;
                    }
                }
                Ok(real)
            }
        }
    };
}

real_api! {
    get_version: b"ncclGetVersion\0" => fn(*mut c_int) -> NcclResult;
    get_unique_id: b"ncclGetUniqueId\0" => fn(*mut NcclUniqueId) -> NcclResult;
    get_last_error: b"ncclGetLastError\0" => fn(Comm) -> *const c_char;
    comm_init_rank: b"ncclCommInitRank\0" => fn(*mut Comm, c_int, NcclUniqueId, c_int) -> NcclResult;
    comm_init_rank_config: b"ncclCommInitRankConfig\0" => fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut c_void) -> NcclResult;
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
    all_reduce: b"ncclAllReduce\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CudaStream) -> NcclResult;
    all_gather: b"ncclAllGather\0" => fn(*const c_void, *mut c_void, usize, c_int, Comm, CudaStream) -> NcclResult;
    reduce_scatter: b"ncclReduceScatter\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CudaStream) -> NcclResult;
    broadcast: b"ncclBroadcast\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CudaStream) -> NcclResult;
    reduce: b"ncclReduce\0" => fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, CudaStream) -> NcclResult;
    all_to_all: b"ncclAlltoAll\0" => fn(*const c_void, *mut c_void, usize, c_int, Comm, CudaStream) -> NcclResult;
    send: b"ncclSend\0" => fn(*const c_void, usize, c_int, c_int, Comm, CudaStream) -> NcclResult;
    recv: b"ncclRecv\0" => fn(*mut c_void, usize, c_int, c_int, Comm, CudaStream) -> NcclResult;
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
    /// Turns a real NCCL result into ours, with its last-error text.
    pub fn check(&self, call: &str, r: NcclResult) -> Res<()> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        let detail = self
            .get_last_error
            // SAFETY: NCCL returns a NUL-terminated string it owns (or null).
            .map(|f| unsafe { f(std::ptr::null_mut()) })
            .filter(|p| !p.is_null())
            // SAFETY: non-null NUL-terminated string owned by NCCL, copied at once.
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        Err(Failure {
            code: r,
            message: format!("real NCCL ({}) {call} failed with {r}: {detail}", self.path),
        })
    }

    /// An entry point, or `ncclInvalidUsage` naming it when this NCCL lacks it.
    pub fn need<T: Copy>(&self, f: Option<T>, name: &str) -> Res<T> {
        f.ok_or_else(|| {
            Failure::usage(format!(
                "the real NCCL at {} (version {}) has no {name}",
                self.path, self.version
            ))
        })
    }
}

/// The real NCCL named by `MSCCLPP_NCCL_LIB_PATH`, opened on first use: `Ok(None)` when the
/// variable is unset; the error when it is set but the library does not open.
pub fn real() -> Res<Option<&'static RealNccl>> {
    static REAL: OnceLock<Res<Option<RealNccl>>> = OnceLock::new();
    REAL.get_or_init(|| match mscclpp::hal::env::get("MSCCLPP_NCCL_LIB_PATH") {
        None => Ok(None),
        Some(path) => {
            let r = RealNccl::load(&path)?;
            tracing::info!(path = %r.path, version = r.version, "real NCCL opened for fallback");
            Ok(Some(r))
        }
    })
    .as_ref()
    .map(Option::as_ref)
    .map_err(Clone::clone)
}

/// What to say when an operation needs the real NCCL and there is none.
pub fn no_real(what: &str) -> Failure {
    Failure::usage(format!(
        "{what} is not served by mscclpp and no real NCCL is loaded for fallback: set MSCCLPP_NCCL_LIB_PATH to the path of libnccl.so.2"
    ))
}
