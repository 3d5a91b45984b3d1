//! The host functions of NCCL 2.32's `nccl_device/host.h` that this library did not export:
//! the world team served (every rank, stride 1: nothing of the device API is needed for it),
//! the rest refused naming the call. NCCL's device API (teams beyond the world, barriers, the
//! LL all-to-all, GIN, CFT load/store entries) is served by a later issue; until then a call
//! here answers `ncclInvalidUsage` (or, where it returns no result code, an empty team or -1,
//! with the same message for `ncclGetLastError`), after its NULL-pointer checks.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res, guard};
use crate::exports_229::NcclTeam;
use crate::registry::lookup;

/// What a refused call answers.
fn no_device_api(name: &str) -> Failure {
    Failure::usage(format!(
        "{name} is part of NCCL's device API (nccl_device/host.h), which this library does not serve yet (a later issue serves it)"
    ))
}

/// The team a refused team call returns: no ranks, and no rank in it.
const NO_TEAM: NcclTeam = NcclTeam {
    n_ranks: 0,
    rank: -1,
    stride: 0,
};

/// Runs the body of an export that returns a value rather than a result code: under the
/// guard (no panic crosses the ABI; a failure is logged and kept for `ncclGetLastError`),
/// `fallback` on failure.
fn answer<T: Copy>(name: &'static str, fallback: T, body: impl FnOnce() -> Res<T>) -> T {
    let mut v = fallback;
    guard(name, || {
        v = body()?;
        Ok(())
    });
    v
}

/// A refused `CreateRequirement` call: the out-pointers checked, then refused.
fn refuse_requirement(
    name: &'static str,
    out_handle: *mut c_void,
    out_req: *mut c_void,
) -> NcclResult {
    guard(name, || {
        if out_handle.is_null() {
            return Err(Failure::argument("outHandle is NULL"));
        }
        if out_req.is_null() {
            return Err(Failure::argument("outReq is NULL"));
        }
        Err(no_device_api(name))
    })
}

/// A refused `LeInfo` call: the window and out-pointers checked, then refused.
fn refuse_le_info(
    name: &'static str,
    window: NcclWindow,
    le_id: *mut c_void,
    le_offset: *mut usize,
) -> NcclResult {
    guard(name, || {
        if window.is_null() {
            return Err(Failure::argument("window is NULL"));
        }
        if le_id.is_null() {
            return Err(Failure::argument("leId is NULL"));
        }
        if le_offset.is_null() {
            return Err(Failure::argument("leOffset is NULL"));
        }
        Err(no_device_api(name))
    })
}

// ---------------------------------------------------------------------------------------------
// Teams

/// `ncclTeam_t ncclTeamWorld(ncclComm_t comm)`: native, every rank of the communicator with
/// stride 1 (an unknown `comm`: the empty team, and `ncclGetLastError` says why).
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamWorld(comm: NcclComm) -> NcclTeam {
    answer("ncclTeamWorld", NO_TEAM, || {
        let c = lookup(comm)?;
        Ok(NcclTeam {
            n_ranks: c.nranks as c_int,
            rank: c.rank as c_int,
            stride: 1,
        })
    })
}

/// `int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank)`: native, NCCL's team
/// arithmetic (this rank's world rank plus `(rank - team.rank) * team.stride`); -1 for an
/// unknown `comm` or a result outside the communicator.
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamRankToWorld(comm: NcclComm, team: NcclTeam, rank: c_int) -> c_int {
    answer("ncclTeamRankToWorld", -1, || {
        let c = lookup(comm)?;
        let world = i64::from(rank)
            .checked_sub(i64::from(team.rank))
            .and_then(|d| d.checked_mul(i64::from(team.stride)))
            .and_then(|d| d.checked_add(c.rank as i64))
            .filter(|w| (0..c.nranks as i64).contains(w));
        world.map(|w| w as c_int).ok_or_else(|| {
            Failure::argument(format!(
                "rank {rank} of team {{nRanks {}, rank {}, stride {}}} is no rank of the communicator's {}",
                team.n_ranks, team.rank, team.stride, c.nranks
            ))
        })
    })
}

/// `ncclTeam_t ncclTeamLsa(ncclComm_t comm)`: refused (the empty team).
///
/// # Safety
/// Nothing is read through `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamLsa(_comm: NcclComm) -> NcclTeam {
    answer("ncclTeamLsa", NO_TEAM, || Err(no_device_api("ncclTeamLsa")))
}

/// `ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode)`: refused (the empty
/// team).
///
/// # Safety
/// Nothing is read through `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamCft(_comm: NcclComm, _mode: c_int) -> NcclTeam {
    answer("ncclTeamCft", NO_TEAM, || Err(no_device_api("ncclTeamCft")))
}

/// `ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm)`: refused (the empty team).
///
/// # Safety
/// Nothing is read through `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamCftMultimem(_comm: NcclComm) -> NcclTeam {
    answer("ncclTeamCftMultimem", NO_TEAM, || {
        Err(no_device_api("ncclTeamCftMultimem"))
    })
}

/// `ncclTeam_t ncclTeamRail(ncclComm_t comm)`: refused (the empty team).
///
/// # Safety
/// Nothing is read through `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamRail(_comm: NcclComm) -> NcclTeam {
    answer("ncclTeamRail", NO_TEAM, || {
        Err(no_device_api("ncclTeamRail"))
    })
}

/// `int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank)`: refused (-1).
///
/// # Safety
/// Nothing is read through `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamRankToLsa(
    _comm: NcclComm,
    _team: NcclTeam,
    _rank: c_int,
) -> c_int {
    answer("ncclTeamRankToLsa", -1, || {
        Err(no_device_api("ncclTeamRankToLsa"))
    })
}

// ---------------------------------------------------------------------------------------------
// Resource requirements

/// `int ncclLLA2ACalcSlots(int maxElts, int maxEltSize)`: refused (-1).
#[unsafe(no_mangle)]
pub extern "C" fn ncclLLA2ACalcSlots(_maxElts: c_int, _maxEltSize: c_int) -> c_int {
    answer("ncclLLA2ACalcSlots", -1, || {
        Err(no_device_api("ncclLLA2ACalcSlots"))
    })
}

/// `ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
/// ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)`: refused.
///
/// # Safety
/// Nothing is written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclLsaBarrierCreateRequirement(
    _team: NcclTeam,
    _nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    refuse_requirement("ncclLsaBarrierCreateRequirement", outHandle, outReq)
}

/// `ncclResult_t ncclCftBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
/// ncclCftBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)`: refused.
///
/// # Safety
/// Nothing is written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCftBarrierCreateRequirement(
    _team: NcclTeam,
    _nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    refuse_requirement("ncclCftBarrierCreateRequirement", outHandle, outReq)
}

/// `ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t*
/// outHandle, ncclDevResourceRequirements_t* outReq)`: refused.
///
/// # Safety
/// Nothing is written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclLLA2ACreateRequirement(
    _nBlocks: c_int,
    _nSlots: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    refuse_requirement("ncclLLA2ACreateRequirement", outHandle, outReq)
}

/// `ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2,
/// ncclGinOutboxHandle* outHandle, ncclDevResourceRequirements* outReq)` (declared for Windows
/// builds of the header; exported so that no build's call reaches the real NCCL): refused.
///
/// # Safety
/// Nothing is written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGinOutboxCreateRequirement(
    _nBlocks: c_int,
    _size_log2: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    refuse_requirement("ncclGinOutboxCreateRequirement", outHandle, outReq)
}

/// `ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam peers, int nBlocks, int size_log2,
/// ncclGinInboxA2AHandle* outHandle, ncclDevResourceRequirements* outReq)` (as
/// [`ncclGinOutboxCreateRequirement`]): refused.
///
/// # Safety
/// Nothing is written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGinInboxA2ACreateRequirement(
    _peers: NcclTeam,
    _nBlocks: c_int,
    _size_log2: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    refuse_requirement("ncclGinInboxA2ACreateRequirement", outHandle, outReq)
}

// ---------------------------------------------------------------------------------------------
// CFT load/store entries

/// `ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
/// ncclCftLeId* leId, size_t* leOffset)`: refused.
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetPeerDeviceLeInfo(
    window: NcclWindow,
    _offset: usize,
    _peerWorld: c_int,
    leId: *mut c_void,
    leOffset: *mut usize,
) -> NcclResult {
    refuse_le_info("ncclGetPeerDeviceLeInfo", window, leId, leOffset)
}

/// `ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId*
/// leId, size_t* leOffset)`: refused.
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetMultimemDeviceLeInfo(
    window: NcclWindow,
    _offset: usize,
    leId: *mut c_void,
    leOffset: *mut usize,
) -> NcclResult {
    refuse_le_info("ncclGetMultimemDeviceLeInfo", window, leId, leOffset)
}

/// `ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
/// ncclTeam_t cftTeam, ncclCftLeId* leId, size_t* leOffset)`: refused.
///
/// # Safety
/// Nothing is read or written through the pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetCftDeviceLeInfo(
    window: NcclWindow,
    _offset: usize,
    _peerCft: c_int,
    _cftTeam: NcclTeam,
    leId: *mut c_void,
    leOffset: *mut usize,
) -> NcclResult {
    refuse_le_info("ncclGetCftDeviceLeInfo", window, leId, leOffset)
}
