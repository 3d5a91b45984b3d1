//! The window calls of NCCL 2.29 and its one-sided operations: `ncclWinGetUserPtr` served
//! natively, the device-API pointers and the host-initiated one-sided calls refused.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res, guard, out};
use crate::register;
use crate::registry::{lookup, lookup_for_op};

/// `ncclTeam_t`, passed by value by the device-API requirement calls.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclTeam {
    /// Ranks in the team.
    pub n_ranks: c_int,
    /// This rank in the team.
    pub rank: c_int,
    /// World-rank stride between team members.
    pub stride: c_int,
}

/// `ncclMultimemHandle_t`, passed by value (one pointer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclMultimemHandle {
    /// The multicast object's base address.
    pub mc_base_ptr: *mut c_void,
}

/// What the one-sided calls answer.
fn no_rma(what: &str) -> Failure {
    Failure::usage(format!(
        "{what} (NCCL 2.29's host-initiated one-sided operations into a peer's window) is not supported by this library: its windows are not one-sided targets, and a put cannot be served by matching ncclSend/ncclRecv since the target does not take part; use ncclSend/ncclRecv"
    ))
}

/// What every one-sided call answers: the communicator looked up and the call's own `checks`
/// made, then refused.
fn refuse_rma(name: &'static str, comm: NcclComm, checks: impl FnOnce() -> Res<()>) -> NcclResult {
    guard(name, || {
        lookup_for_op(comm)?;
        checks()?;
        Err(no_rma(name))
    })
}

/// What the device-API window calls answer.
fn no_device_api(what: &str) -> Failure {
    Failure::usage(format!(
        "{what} (NCCL's device API: multimem, NVLink multicast) is not supported by this library: it never creates multicast objects; LSA pointers (ncclGetLsaDevicePointer) are served"
    ))
}

// ---------------------------------------------------------------------------------------------
// Windows

/// `ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr)` (NCCL
/// 2.29): native: the address the window was registered at, for windows inside `ncclMemAlloc`
/// memory (this library records the owner and offset of those only); a window of other memory
/// is `ncclInvalidUsage`.
///
/// # Safety
/// `outUserPtr` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclWinGetUserPtr(
    comm: NcclComm,
    win: NcclWindow,
    outUserPtr: *mut *mut c_void,
) -> NcclResult {
    guard("ncclWinGetUserPtr", || {
        let c = lookup(comm)?;
        if outUserPtr.is_null() {
            return Err(Failure::argument("outUserPtr is NULL"));
        }
        if win.is_null() {
            return Err(Failure::argument("win is NULL"));
        }
        let p = register::window_user_ptr(&c, win)?.ok_or_else(|| {
            Failure::usage(format!(
                "window {win:p} was registered over memory not from ncclMemAlloc, whose address this library does not record"
            ))
        })?;
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe { out(outUserPtr, "outUserPtr", p) }
    })
}

/// `ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void**
/// outPtr)` (NCCL 2.29 device API): not supported (`ncclInvalidUsage`).
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetLsaMultimemDevicePointer(
    window: NcclWindow,
    _offset: usize,
    outPtr: *mut *mut c_void,
) -> NcclResult {
    refuse_device_pointer("ncclGetLsaMultimemDevicePointer", window, outPtr)
}

/// `ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
/// ncclMultimemHandle_t multimem, void** outPtr)` (NCCL 2.29 device API): not supported.
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetMultimemDevicePointer(
    window: NcclWindow,
    _offset: usize,
    _multimem: NcclMultimemHandle,
    outPtr: *mut *mut c_void,
) -> NcclResult {
    refuse_device_pointer("ncclGetMultimemDevicePointer", window, outPtr)
}

/// `ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
/// void** outPtr)` (NCCL 2.29 device API): native for a symmetric window (the address of
/// `offset` in LSA rank `lsaRank`'s copy, as the device headers compute it).
///
/// # Safety
/// `outPtr` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetLsaDevicePointer(
    window: NcclWindow,
    offset: usize,
    lsaRank: c_int,
    outPtr: *mut *mut c_void,
) -> NcclResult {
    guard("ncclGetLsaDevicePointer", || {
        if window.is_null() {
            return Err(Failure::argument("window is NULL"));
        }
        if outPtr.is_null() {
            return Err(Failure::argument("outPtr is NULL"));
        }
        let lsa = usize::try_from(lsaRank)
            .map_err(|_| Failure::argument(format!("lsaRank {lsaRank} is negative")))?;
        let p = crate::register::symmetric_pointer(window, offset, Some(lsa), None)?;
        // SAFETY: the caller's out-pointer (checked for NULL by `out`).
        unsafe { out(outPtr, "outPtr", p as *mut c_void) }
    })
}

/// `ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void**
/// outPtr)` (NCCL 2.29 device API): native for a symmetric window and a peer of this rank's
/// LSA team (world rank `peer`).
///
/// # Safety
/// `outPtr` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetPeerDevicePointer(
    window: NcclWindow,
    offset: usize,
    peer: c_int,
    outPtr: *mut *mut c_void,
) -> NcclResult {
    guard("ncclGetPeerDevicePointer", || {
        if window.is_null() {
            return Err(Failure::argument("window is NULL"));
        }
        if outPtr.is_null() {
            return Err(Failure::argument("outPtr is NULL"));
        }
        let p = usize::try_from(peer)
            .map_err(|_| Failure::argument(format!("peer {peer} is negative")))?;
        let a = crate::register::symmetric_pointer(window, offset, None, Some(p))?;
        // SAFETY: the caller's out-pointer (checked for NULL by `out`).
        unsafe { out(outPtr, "outPtr", a as *mut c_void) }
    })
}

/// What every device-pointer call answers: its arguments checked, then refused.
fn refuse_device_pointer(
    name: &'static str,
    window: NcclWindow,
    out_ptr: *mut *mut c_void,
) -> NcclResult {
    guard(name, || {
        if window.is_null() {
            return Err(Failure::argument("window is NULL"));
        }
        if out_ptr.is_null() {
            return Err(Failure::argument("outPtr is NULL"));
        }
        Err(no_device_api(name))
    })
}

/// `ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int
/// nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)` (NCCL's
/// device API, GPU-initiated networking): a requirement of `nBarriers * max(team.nRanks, 2)`
/// GIN signals (what NCCL's device code of 2.30 to 2.32.6 indexes), whose first id
/// `ncclDevCommCreate` writes into the handle's `signal0`.
///
/// # Safety
/// `comm` is a handle (checked); `outHandle` (8 bytes) and `outReq` (56 bytes) must be valid
/// for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGinBarrierCreateRequirement(
    comm: NcclComm,
    team: NcclTeam,
    nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    guard("ncclGinBarrierCreateRequirement", || {
        lookup(comm)?;
        if outHandle.is_null() || outReq.is_null() {
            return Err(Failure::argument("outHandle or outReq is NULL"));
        }
        if nBarriers < 0 || team.n_ranks < 1 {
            return Err(Failure::argument(format!(
                "{nBarriers} barriers over a team of {} ranks",
                team.n_ranks
            )));
        }
        let h = outHandle.cast::<u32>();
        let r = crate::devapi::layout::Requirement {
            bytes: 0,
            align: 0,
            out_buffer: std::ptr::null_mut(),
            signals: crate::devapi::gin::barrier_signals(nBarriers as u32, team.n_ranks as usize),
            out_signal: outHandle,
        };
        // SAFETY: the caller's handle (`signal0`, unused) and requirement (56 bytes).
        unsafe {
            h.write_unaligned(0);
            h.add(1).write_unaligned(0);
            r.write(outReq, crate::devapi::layout::reqs::resource::BYTES)
                .map_err(Failure::argument)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// One-sided operations

/// `ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype,
/// int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int
/// flags, ncclComm_t comm, cudaStream_t stream)` (NCCL 2.29): not supported
/// (`ncclInvalidUsage`).
///
/// # Safety
/// `comm` is a handle (checked); nothing is read or written through the pointers.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclPutSignal(
    _localbuff: *const c_void,
    _count: usize,
    _datatype: c_int,
    _peer: c_int,
    _peerWin: NcclWindow,
    _peerWinOffset: usize,
    _sigIdx: c_int,
    _ctx: c_int,
    _flags: u32,
    comm: NcclComm,
    _stream: CudaStream,
) -> NcclResult {
    refuse_rma("ncclPutSignal", comm, || Ok(()))
}

/// `ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
/// cudaStream_t stream)` (NCCL 2.29): not supported (`ncclInvalidUsage`).
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSignal(
    _peer: c_int,
    _sigIdx: c_int,
    _ctx: c_int,
    _flags: u32,
    comm: NcclComm,
    _stream: CudaStream,
) -> NcclResult {
    refuse_rma("ncclSignal", comm, || Ok(()))
}

/// `ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
/// cudaStream_t stream)` (NCCL 2.29): not supported (`ncclInvalidUsage`).
///
/// # Safety
/// `comm` is a handle (checked); `signalDescs` is not read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut c_void,
    comm: NcclComm,
    _stream: CudaStream,
) -> NcclResult {
    refuse_rma("ncclWaitSignal", comm, || {
        if nDesc < 0 {
            return Err(Failure::argument(format!("nDesc {nDesc} is negative")));
        }
        if nDesc > 0 && signalDescs.is_null() {
            return Err(Failure::argument("signalDescs is NULL"));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;

    /// Runs `call` and checks its code and that the last error starts with `name` and holds
    /// `says`.
    fn answers(name: &str, code: NcclResult, says: &str, call: impl FnOnce() -> NcclResult) {
        assert_eq!(call(), code, "{name}");
        let e = last_error();
        assert!(e.starts_with(name) && e.contains(says), "{name}: {e}");
    }

    /// Every device-pointer call checks its pointers; the multimem ones then refuse as
    /// `ncclInvalidUsage` naming themselves, the LSA ones refuse a window they do not know; the one-sided calls refuse a handle that is not a communicator first.
    #[test]
    fn device_pointer_and_one_sided_calls_refuse_naming_themselves() {
        let mut p: *mut c_void = std::ptr::null_mut();
        let out: *mut *mut c_void = &mut p;
        let w = std::ptr::NonNull::<u8>::dangling()
            .as_ptr()
            .cast::<c_void>();
        let null = std::ptr::null_mut::<c_void>();
        let mm = NcclMultimemHandle { mc_base_ptr: null };
        let api = "device API";
        // The calls read and write nothing through these pointers (NULL ones are checked
        // first), and a handle is checked against the live ones: what every SAFETY line means.
        let name = "ncclGetLsaMultimemDevicePointer";
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_USAGE, api, || unsafe {
            ncclGetLsaMultimemDevicePointer(w, 0, out)
        });
        let name = "ncclGetMultimemDevicePointer";
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_USAGE, api, || unsafe {
            ncclGetMultimemDevicePointer(w, 0, mm, out)
        });
        let name = "ncclGetLsaDevicePointer";
        let unknown = "not returned by ncclCommWindowRegister";
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_ARGUMENT, unknown, || unsafe {
            ncclGetLsaDevicePointer(w, 0, 0, out)
        });
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_ARGUMENT, "outPtr is NULL", || unsafe {
            ncclGetLsaDevicePointer(w, 0, 0, std::ptr::null_mut())
        });
        let name = "ncclGetPeerDevicePointer";
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_ARGUMENT, unknown, || unsafe {
            ncclGetPeerDevicePointer(w, 0, 1, out)
        });
        // SAFETY: as said above the first call.
        answers(name, NCCL_INVALID_ARGUMENT, "window is NULL", || unsafe {
            ncclGetPeerDevicePointer(null, 0, 1, out)
        });
        assert!(p.is_null(), "an out-pointer was written");

        let no_comm = "not a communicator";
        // SAFETY: as said above the first call.
        answers("ncclSignal", NCCL_INVALID_ARGUMENT, no_comm, || unsafe {
            ncclSignal(0, 0, 0, 0, w, null)
        });
        answers(
            "ncclWaitSignal",
            NCCL_INVALID_ARGUMENT,
            no_comm,
            // SAFETY: as said above the first call.
            || unsafe { ncclWaitSignal(0, null, w, null) },
        );
        // SAFETY: as said above the first call.
        answers("ncclPutSignal", NCCL_INVALID_ARGUMENT, no_comm, || unsafe {
            ncclPutSignal(std::ptr::null(), 0, 0, 0, null, 0, 0, 0, 0, w, null)
        });
    }
}
