//! The host functions of NCCL 2.32's `nccl_device/host.h`: the teams (world, LSA, rail) and
//! the LSA barrier and LL all-to-all requirements served (`devapi`); CFT and GIN's outbox and
//! inbox refused naming the call: `ncclInvalidUsage` (or, where the call returns no result
//! code, an empty team or -1, with the same message for `ncclGetLastError`), after its
//! NULL-pointer checks.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res, guard};
use crate::exports_229::NcclTeam;
use crate::registry::lookup;

/// What a refused call answers.
fn no_device_api(name: &str) -> Failure {
    Failure::usage(format!(
        "{name} is part of NCCL's device API that this library does not serve (CFT load/store entries, GIN's outbox and inbox); LSA is served"
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

/// This rank's LSA team in `comm` (`(lsaSize, lsaRank)`): the ranks of its host when every
/// host holds the same run of consecutive ranks, else itself (`devapi::space::lsa_team`).
fn lsa(comm: NcclComm) -> Res<(usize, usize)> {
    let c = lookup(comm)?;
    let n = c.native.as_ref().ok_or_else(|| {
        Failure::usage(
            "the communicator was made by the real NCCL: this library's device API serves its own",
        )
    })?;
    let boot = n.communicator().bootstrap();
    Ok(crate::devapi::lsa_of(boot.hosts(), boot.rank()))
}

/// `ncclTeam_t ncclTeamLsa(ncclComm_t comm)`: native, the ranks this rank reaches by load and
/// store through symmetric windows (stride 1).
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamLsa(comm: NcclComm) -> NcclTeam {
    answer("ncclTeamLsa", NO_TEAM, || {
        let (size, rank) = lsa(comm)?;
        Ok(NcclTeam {
            n_ranks: size as c_int,
            rank: rank as c_int,
            stride: 1,
        })
    })
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

/// `ncclTeam_t ncclTeamRail(ncclComm_t comm)`: native, the ranks of the same LSA index on
/// every LSA team (`{nRanks / lsaSize, rank / lsaSize, lsaSize}`).
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamRail(comm: NcclComm) -> NcclTeam {
    answer("ncclTeamRail", NO_TEAM, || {
        let c = lookup(comm)?;
        let (size, _) = lsa(comm)?;
        Ok(NcclTeam {
            n_ranks: (c.nranks / size) as c_int,
            rank: (c.rank / size) as c_int,
            stride: size as c_int,
        })
    })
}

/// `int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank)`: native, NCCL's team
/// arithmetic (this rank's LSA rank plus `(rank - team.rank) * team.stride`); -1 for a result
/// outside the LSA team.
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclTeamRankToLsa(comm: NcclComm, team: NcclTeam, rank: c_int) -> c_int {
    answer("ncclTeamRankToLsa", -1, || {
        let (size, me) = lsa(comm)?;
        let l = i64::from(rank)
            .checked_sub(i64::from(team.rank))
            .and_then(|d| d.checked_mul(i64::from(team.stride)))
            .and_then(|d| d.checked_add(me as i64))
            .filter(|l| (0..size as i64).contains(l));
        l.map(|l| l as c_int).ok_or_else(|| {
            Failure::argument(format!(
                "rank {rank} of team {{nRanks {}, rank {}, stride {}}} is outside the LSA team of {size}",
                team.n_ranks, team.rank, team.stride
            ))
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Resource requirements

/// `int ncclLLA2ACalcSlots(int maxElts, int maxEltSize)`: NCCL's arithmetic (a slot holds 8
/// bytes: `maxElts * ceil(maxEltSize / 8)`); -1 for negative or overflowing arguments.
#[unsafe(no_mangle)]
pub extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    answer("ncclLLA2ACalcSlots", -1, || {
        if maxElts < 0 || maxEltSize < 0 {
            return Err(Failure::argument(format!(
                "maxElts {maxElts} and maxEltSize {maxEltSize} must not be negative"
            )));
        }
        maxElts
            .checked_mul((maxEltSize + 7) / 8)
            .ok_or_else(|| Failure::argument("the slot count overflows an int"))
    })
}

/// Fills an `ncclDevResourceRequirements` (zeroed first, at the size the client declared: 56
/// bytes, or 32 for a client of NCCL 2.28.3, [`crate::headers`]) with a buffer of `bytes`
/// aligned to `align` whose handle goes to `out`.
///
/// # Safety
/// `req` is valid for writes of the client's `ncclDevResourceRequirements`.
unsafe fn buffer_requirement(
    req: *mut c_void,
    bytes: usize,
    align: usize,
    out: *mut c_void,
) -> Res<()> {
    let r = crate::devapi::layout::Requirement {
        bytes,
        align,
        out_buffer: out,
        signals: 0,
        out_signal: std::ptr::null_mut(),
    };
    let bytes = crate::headers::resource_requirement_bytes()?;
    // SAFETY: forwarded contract.
    unsafe { r.write(req, bytes) }.map_err(Failure::argument)
}

/// `ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
/// ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq)`: native, NCCL's
/// sizes (`(3 + team.nRanks) * 4` bytes per barrier); the handle's buffer is set when
/// `ncclDevCommCreate` places the requirement.
///
/// # Safety
/// `outHandle` (8 bytes) and `outReq` (the client's `ncclDevResourceRequirements`) must be NULL
/// or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclLsaBarrierCreateRequirement(
    team: NcclTeam,
    nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    guard("ncclLsaBarrierCreateRequirement", || {
        if outHandle.is_null() {
            return Err(Failure::argument("outHandle is NULL"));
        }
        if outReq.is_null() {
            return Err(Failure::argument("outReq is NULL"));
        }
        if nBarriers < 0 || team.n_ranks < 1 {
            return Err(Failure::argument(format!(
                "{nBarriers} barriers over a team of {} ranks",
                team.n_ranks
            )));
        }
        let bytes = (3 + team.n_ranks as usize) * 4 * nBarriers as usize;
        let h = outHandle.cast::<u32>();
        // SAFETY: the caller's handle (`bufHandle`, `nBarriers`) and requirement.
        unsafe {
            h.write_unaligned(0);
            h.add(1).write_unaligned(nBarriers as u32);
            buffer_requirement(outReq, bytes, 4, outHandle)?;
        }
        Ok(())
    })
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
/// outHandle, ncclDevResourceRequirements_t* outReq)`: native, NCCL's sizes
/// (`nBlocks * (1 + 2 * nSlots) * 16` bytes, aligned to 16).
///
/// # Safety
/// `outHandle` (8 bytes) and `outReq` (the client's `ncclDevResourceRequirements`) must be NULL
/// or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> NcclResult {
    guard("ncclLLA2ACreateRequirement", || {
        if outHandle.is_null() {
            return Err(Failure::argument("outHandle is NULL"));
        }
        if outReq.is_null() {
            return Err(Failure::argument("outReq is NULL"));
        }
        if nBlocks < 0 || nSlots < 0 {
            return Err(Failure::argument(format!(
                "{nBlocks} blocks of {nSlots} slots"
            )));
        }
        let bytes = nBlocks as usize * (1 + 2 * nSlots as usize) * 16;
        let h = outHandle.cast::<u32>();
        // SAFETY: the caller's handle (`bufHandle`, `nSlots`) and requirement.
        unsafe {
            h.write_unaligned(0);
            h.add(1).write_unaligned(nSlots as u32);
            buffer_requirement(outReq, bytes, 16, outHandle)?;
        }
        Ok(())
    })
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
