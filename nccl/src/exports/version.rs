//! Version, errors, ids, and the marker that tells the real NCCL's binding this library from
//! NCCL.

use std::ffi::{c_char, c_int};

use crate::abi::*;
use crate::error::{self, Failure, guard, out};

/// `int mscclppNcclShim(void)`: 1. Only this library exports it, so that the binding of the real
/// NCCL refuses it when `MSCCLPP_NCCL_LIB_PATH` names this library (forwarding to ourselves
/// would recurse until the stack overflows).
#[unsafe(no_mangle)]
pub extern "C" fn mscclppNcclShim() -> c_int {
    1
}

/// `ncclResult_t ncclGetVersion(int* version)`: reports [`NCCL_VERSION_CODE`], or the release
/// `MSCCLPP_NCCL_VERSION` names ([`crate::headers`]: a client built against NCCL 2.28 uses its
/// device API only on a 2.28 library).
///
/// # Safety
/// `version` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: forwarded contract.
    guard("ncclGetVersion", || unsafe {
        out(version, "version", crate::headers::reported()? as c_int)
    })
}

/// `const char* ncclGetErrorString(ncclResult_t result)`: a static string.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error::error_string(result).as_ptr()
}

/// `const char* ncclGetLastError(ncclComm_t comm)`: the last failure's message on the calling
/// thread (`comm` is ignored), valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    error::last_error_ptr()
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`: an mscclpp bootstrap id (root
/// address and secret); the root's listener is bound now and run by the first
/// `ncclCommInitRank` of this process with the id.
///
/// # Safety
/// `uniqueId` must be NULL or valid for a write of 128 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        if uniqueId.is_null() {
            return Err(Failure::argument("uniqueId is NULL"));
        }
        crate::debug::show_version();
        let id = mscclpp::comm::UniqueId::new()?;
        let bytes = id.to_bytes();
        // SAFETY: non-null, valid for a 128-byte write (caller's contract).
        unsafe { out(uniqueId, "uniqueId", NcclUniqueId { internal: bytes }) }
    })
}
