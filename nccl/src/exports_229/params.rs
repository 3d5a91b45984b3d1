//! The parameter registry of NCCL 2.30 (`ncclParam*`). This library's registry of NCCL
//! parameters is empty (NCCL_* variables are NCCL's; this library reads MSCCLPP_* ones), so every
//! key is unknown, answered as NCCL answers an unknown key (`ncclInvalidArgument`), and no
//! parameter handle exists.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write;

use crate::abi::*;
use crate::error::{Failure, guard, out};

/// The key of a parameter call, for messages.
///
/// # Safety
/// `key` must be non-NULL and NUL-terminated.
unsafe fn key_text(key: *const c_char) -> String {
    // SAFETY: non-NULL and NUL-terminated (caller's contract).
    unsafe { CStr::from_ptr(key) }
        .to_string_lossy()
        .into_owned()
}

/// No handle of this library's `ncclParamBind` exists: what the getters answer.
fn no_handle(h: *mut c_void) -> Failure {
    if h.is_null() {
        Failure::argument("h is NULL")
    } else {
        Failure::argument(format!(
            "h {h:p} is not a parameter handle of this library: its ncclParamBind binds none (no NCCL parameter is registered here)"
        ))
    }
}

/// An unknown key, as NCCL answers it.
fn no_key(key: &str) -> Failure {
    Failure::argument(format!(
        "key \"{key}\" not found: this library registers no NCCL parameters (it is configured by MSCCLPP_* variables)"
    ))
}

/// `ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key)` (NCCL 2.30): every key
/// is unknown here: `ncclInvalidArgument`, as NCCL for a key not in its registry.
///
/// # Safety
/// `key` must be NULL or NUL-terminated; `out` is not written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclParamBind(out: *mut *mut c_void, key: *const c_char) -> NcclResult {
    guard("ncclParamBind", || {
        if out.is_null() {
            return Err(Failure::argument("out is NULL"));
        }
        if key.is_null() {
            return Err(Failure::argument("key is NULL"));
        }
        // SAFETY: non-null, NUL-terminated (caller's contract).
        Err(no_key(&unsafe { key_text(key) }))
    })
}

macro_rules! param_getter {
    ($($name:ident : $t:ty;)*) => {$(
        #[doc = concat!("`ncclResult_t ", stringify!($name), "(ncclParamHandle_t h, ", stringify!($t),
            "* out)` (NCCL 2.30): no handle exists here: `ncclInvalidArgument`.")]
        ///
        /// # Safety
        /// Nothing is read or written through the pointers.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(h: *mut c_void, out: *mut $t) -> NcclResult {
            guard(stringify!($name), || {
                if out.is_null() {
                    return Err(Failure::argument("out is NULL"));
                }
                Err(no_handle(h))
            })
        }
    )*};
}

param_getter! {
    ncclParamGetI8: i8;
    ncclParamGetI16: i16;
    ncclParamGetI32: i32;
    ncclParamGetI64: i64;
    ncclParamGetU8: u8;
    ncclParamGetU16: u16;
    ncclParamGetU32: u32;
    ncclParamGetU64: u64;
    ncclParamGetStr: *const c_char;
}

/// `ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len)` (NCCL
/// 2.30): no handle exists here: `ncclInvalidArgument`.
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclParamGet(
    h: *mut c_void,
    out: *mut c_void,
    _maxLen: c_int,
    _len: *mut c_int,
) -> NcclResult {
    guard("ncclParamGet", || {
        if out.is_null() {
            return Err(Failure::argument("out is NULL"));
        }
        Err(no_handle(h))
    })
}

/// `ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen)`
/// (NCCL 2.30): every key is unknown here: `*value = NULL`, `*valueLen = 0` and
/// `ncclInvalidArgument`, as NCCL for a key not in its registry.
///
/// # Safety
/// `key` must be NULL or NUL-terminated; `value` and `valueLen` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    valueLen: *mut c_int,
) -> NcclResult {
    guard("ncclParamGetParameter", || {
        if key.is_null() || value.is_null() || valueLen.is_null() {
            return Err(Failure::argument("key, value or valueLen is NULL"));
        }
        // SAFETY: non-null (checked); the caller's out-pointers.
        unsafe {
            out(value, "value", std::ptr::null())?;
            out(valueLen, "valueLen", 0)?;
        }
        // SAFETY: non-null, NUL-terminated (caller's contract).
        Err(no_key(&unsafe { key_text(key) }))
    })
}

/// The (empty) table `ncclParamGetAllParameterKeys` returns: never written, never freed.
struct KeyTable([*const c_char; 1]);
// SAFETY: a NULL pointer that is only ever read.
unsafe impl Sync for KeyTable {}
static NO_KEYS: KeyTable = KeyTable([std::ptr::null()]);

/// `ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen)` (NCCL 2.30):
/// native: this library registers no NCCL parameters, so the table is empty (`*tableLen = 0`,
/// `*table` a valid pointer to no keys).
///
/// # Safety
/// `table` and `tableLen` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *const *const c_char,
    tableLen: *mut c_int,
) -> NcclResult {
    guard("ncclParamGetAllParameterKeys", || {
        if table.is_null() || tableLen.is_null() {
            return Err(Failure::argument("table or tableLen is NULL"));
        }
        // SAFETY: non-null (checked); the caller's out-pointers.
        unsafe {
            out(table, "table", NO_KEYS.0.as_ptr())?;
            out(tableLen, "tableLen", 0)
        }
    })
}

/// `void ncclParamDumpAll(void)` (NCCL 2.30): prints NCCL's dump header to stdout, followed by no
/// parameter (this library registers none).
#[unsafe(no_mangle)]
pub extern "C" fn ncclParamDumpAll() {
    guard("ncclParamDumpAll", || {
        let mut o = std::io::stdout().lock();
        writeln!(o, "=== ncclParam Registry Dump ===")
            .and_then(|()| o.flush())
            .map_err(|e| Failure::system(format!("writing to stdout: {e}")))
    });
}
