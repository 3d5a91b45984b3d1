//! Groups.

use std::ffi::c_void;

use crate::abi::*;
use crate::error::{Failure, guard};
use crate::group;

/// `ncclResult_t ncclGroupStart(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard("ncclGroupStart", group::group_start)
}

/// `ncclResult_t ncclGroupEnd(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard("ncclGroupEnd", group::group_end)
}

/// `ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo)`: native operations have been
/// enqueued already, so this library cannot simulate them: `ncclInvalidUsage` (the group is
/// closed all the same, and a real group opened for fallback operations is ended normally).
///
/// # Safety
/// `simInfo` is only passed on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupSimulateEnd(_simInfo: *mut c_void) -> NcclResult {
    guard("ncclGroupSimulateEnd", || {
        group::group_end()?;
        Err(Failure::usage(
            "mscclpp enqueues operations as they are called and cannot simulate a group; the group was ended normally",
        ))
    })
}
