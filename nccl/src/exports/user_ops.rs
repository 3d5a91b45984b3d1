//! User-defined operators (PreMulSum, native) and device communicators (the real NCCL's).

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, guard, out};
use crate::premul;
use crate::real::RealResults;
use crate::registry::lookup;

/// `ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t
/// datatype, ncclScalarResidence_t residence, ncclComm_t comm)`: native — `sum(scalar * x_i)`
/// served as `scalar * sum(x_i)` (a sum, then the output scaled on the same stream). A host
/// scalar (`ncclScalarHostImmediate`) is copied now; a device one (`ncclScalarDevice`) is read
/// when each operation runs, so graph replays see its current value. With a real NCCL, its own
/// operator is made beside ours for the operations that fall back.
///
/// # Safety
/// As NCCL's: `op` valid for a write; `scalar` a host or device scalar per `residence`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: NcclComm,
) -> NcclResult {
    guard("ncclRedOpCreatePreMulSum", || {
        let c = lookup(comm)?;
        if op.is_null() {
            return Err(Failure::argument("op is NULL"));
        }
        // SAFETY: forwarded contract.
        let code = unsafe { premul::create(&c, comm, scalar, datatype, residence)? };
        // SAFETY: non-null; the caller's out-pointer.
        unsafe { out(op, "op", code) }
    })
}

/// `ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)`: frees an operator made by
/// `ncclRedOpCreatePreMulSum` for this communicator.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, comm: NcclComm) -> NcclResult {
    guard("ncclRedOpDestroy", || premul::destroy(&lookup(comm)?, op))
}

/// `ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
/// ncclDevComm_t* outDevComm)` (NCCL's device API): native (`devapi::devcomm`: LSA served;
/// GIN, multimem and CFT refused naming the field), collective; through the real NCCL for a
/// communicator it made.
///
/// # Safety
/// As NCCL's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: NcclComm,
    reqs: *const c_void,
    outDevComm: *mut c_void,
) -> NcclResult {
    guard("ncclDevCommCreate", || {
        let c = lookup(comm)?;
        if reqs.is_null() || outDevComm.is_null() {
            return Err(Failure::argument("reqs or outDevComm is NULL"));
        }
        if c.native.is_some() {
            let (r, o) = (reqs as usize, outDevComm as usize);
            let headers = c.config.headers;
            return crate::group::run_collective(&c.clone(), "ncclDevCommCreate", move || {
                let n = c
                    .native
                    .as_ref()
                    .ok_or_else(|| Failure::internal("no native side"))?;
                let space = n.devapi.space(n.communicator())?;
                // SAFETY: the caller's requirements and out-struct, as NCCL's contract has them
                // (valid until the call, or its group, ends).
                let d = unsafe {
                    crate::devapi::devcomm::create(
                        &space,
                        r as *const c_void,
                        o as *mut c_void,
                        headers,
                    )?
                };
                n.devapi.keep(d);
                Ok(())
            });
        }
        let (lib, rc) = c.require_real("ncclDevCommCreate (NCCL's device API)")?;
        let f = lib.need(lib.dev_comm_create, "ncclDevCommCreate")?;
        // SAFETY: the caller's arguments with the real communicator.
        lib.check("ncclDevCommCreate", unsafe { f(rc, reqs, outDevComm) })
    })
}

/// `ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm)`.
///
/// # Safety
/// As NCCL's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommDestroy(comm: NcclComm, devComm: *const c_void) -> NcclResult {
    guard("ncclDevCommDestroy", || {
        let c = lookup(comm)?;
        if devComm.is_null() {
            return Err(Failure::argument("devComm is NULL"));
        }
        if let Some(n) = c.native.as_ref() {
            // SAFETY: the caller's device communicator, which this library wrote.
            let key = unsafe { crate::devapi::devcomm::resource_window(devComm) };
            let d = n.devapi.forget(key).ok_or_else(|| {
                Failure::argument(format!(
                    "devComm {devComm:p} was not made by ncclDevCommCreate on this communicator, or was destroyed already"
                ))
            })?;
            let super::super::devapi::devcomm::DevComm { gin, resources } = d;
            // The proxy stops before the memory it copies into leaves the space.
            drop(gin);
            if let Some((m, _buf)) = resources {
                n.devapi.space(n.communicator())?.unmap(m)?;
            }
            return Ok(());
        }
        let (lib, rc) = c.require_real("ncclDevCommDestroy (NCCL's device API)")?;
        let f = lib.need(lib.dev_comm_destroy, "ncclDevCommDestroy")?;
        // SAFETY: a device communicator the real NCCL made for this communicator.
        lib.check("ncclDevCommDestroy", unsafe { f(rc, devComm) })
    })
}
