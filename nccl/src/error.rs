//! Result codes, the last-error message, the guard that keeps panics from crossing the C ABI,
//! and `out`, the exports' checked write through an out-pointer (here, not in the crate root,
//! so that modules the root uses can use it without depending on the root).
//!
//! **Last error.** The message of the most recent failing call *on the calling thread* is kept
//! in thread-local storage; `ncclGetLastError` returns a pointer to it, valid until the next
//! failing call on that thread (PyTorch reads it on the thread that saw the failure, right after
//! it). The `comm` argument of `ncclGetLastError` is ignored, as NCCL does.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use mscclpp::hal::{Error, ErrorClass};

use crate::abi::*;

/// A failed call: the NCCL result code and what went wrong.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The `ncclResult_t` returned.
    pub code: NcclResult,
    /// The message `ncclGetLastError` returns.
    pub message: String,
}

impl Failure {
    /// `ncclInvalidArgument`: a bad pointer, count, type, rank or handle.
    pub fn argument(message: impl Into<String>) -> Self {
        Failure {
            code: NCCL_INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    /// `ncclInvalidUsage`: a call this library cannot serve as configured.
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: NCCL_INVALID_USAGE,
            message: message.into(),
        }
    }

    /// `ncclInternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Failure {
            code: NCCL_INTERNAL_ERROR,
            message: message.into(),
        }
    }

    /// `ncclInProgress`: not a failure; a non-blocking call goes on in the background (not
    /// logged, not recorded for `ncclGetLastError`).
    pub fn in_progress() -> Self {
        Failure {
            code: NCCL_IN_PROGRESS,
            message: String::new(),
        }
    }

    /// `ncclSystemError`.
    pub fn system(message: impl Into<String>) -> Self {
        Failure {
            code: NCCL_SYSTEM_ERROR,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    /// Error classes onto result codes: the user's mistake → `ncclInvalidUsage`, the system's
    /// (OS, driver, missing library) → `ncclSystemError`, a peer or a deadline →
    /// `ncclRemoteError`, ours → `ncclInternalError`.
    fn from(e: Error) -> Self {
        let code = match e.class() {
            ErrorClass::InvalidUsage => NCCL_INVALID_USAGE,
            ErrorClass::System | ErrorClass::Unavailable => NCCL_SYSTEM_ERROR,
            ErrorClass::Remote | ErrorClass::Timeout => NCCL_REMOTE_ERROR,
            ErrorClass::Internal => NCCL_INTERNAL_ERROR,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

/// `Result` of the library's internals.
pub type Res<T> = std::result::Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `message` as this thread's last error.
pub fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message (empty if none), valid until the next failing call on this
/// thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// This thread's last error message, as a Rust string (tests and logs).
pub fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// NCCL's description of a result code, as a static C string.
pub fn error_string(code: NcclResult) -> &'static std::ffi::CStr {
    match code {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

/// Installs logging once (`NCCL_DEBUG*`, or `MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG`: see
/// [`crate::debug`]).
pub fn init_logging_once() {
    static ONCE: Once = Once::new();
    // This crate's unit tests provoke refusals on purpose: their WARN lines go to the test's
    // captured output (printed only if it fails), not to the terminal as alarms.
    #[cfg(test)]
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_max_level(tracing::Level::WARN)
            .try_init();
    });
    #[cfg(not(test))]
    ONCE.call_once(crate::debug::init);
}

/// Runs the body of an export: catches panics (→ `ncclInternalError`), records the message of a
/// failure for `ncclGetLastError` and logs it, and returns the result code.
pub fn guard(name: &'static str, body: impl FnOnce() -> Res<()>) -> NcclResult {
    init_logging_once();
    tracing::trace!(target: crate::debug::CALL, "{name}");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(f)) if f.code == NCCL_IN_PROGRESS => NCCL_IN_PROGRESS,
        Ok(Err(f)) => {
            let msg = format!("{name}: {}", f.message);
            tracing::warn!(code = f.code, "{msg}");
            set_last_error(&msg);
            f.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let msg = format!("{name}: internal error (caught panic: {what})");
            tracing::error!("{msg}");
            set_last_error(&msg);
            NCCL_INTERNAL_ERROR
        }
    }
}

/// Writes `v` through an out-pointer, or fails naming it when it is NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, name: &str, v: T) -> Res<()> {
    if p.is_null() {
        return Err(Failure::argument(format!("{name} is NULL")));
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}
