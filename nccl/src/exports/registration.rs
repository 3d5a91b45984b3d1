//! Registration (see `register`: windows of ncclMemAlloc memory register for zero copy).

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res, guard, out};
use crate::register;
use crate::registry::lookup;

use super::memory::mem_owner;

/// `ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void**
/// handle)`: local, as NCCL's: records the range (keeping `ncclMemAlloc` memory alive until
/// deregistered); the calls copy as without it (only the collective window API maps buffers
/// into the peers, see `register`).
///
/// # Safety
/// `handle` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    guard("ncclCommRegister", || {
        let c = lookup(comm)?;
        check_range(buff, size, handle.is_null(), "handle")?;
        let h = register::register_local(&c, mem_owner(buff, size).map(|(b, _)| b));
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe { out(handle, "handle", h) }
    })
}

/// `ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle)`.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDeregister(comm: NcclComm, handle: *mut c_void) -> NcclResult {
    guard("ncclCommDeregister", || {
        register::deregister(&lookup(comm)?, handle, register::Kind::Local)
    })
}

/// `ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t*
/// win, int winFlags)`: collective, as NCCL 2.27's. When every rank's buffer came from
/// `ncclMemAlloc`, the buffers are registered with the collectives (mapped into every peer now),
/// and all-reduces whose input lies in the window read it in place where that pays; otherwise
/// the window is recorded and calls copy. With `NCCL_WIN_COLL_SYMMETRIC` the window is also
/// mapped into every LSA rank's symmetric space and `*win` is the device address of its record,
/// which kernels of NCCL's device API read (see `devapi`).
///
/// # Safety
/// `win` must be NULL or valid for a write; `buff` `size` bytes of the caller's device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    win: *mut NcclWindow,
    winFlags: c_int,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        let c = lookup(comm)?;
        check_range(buff, size, win.is_null(), "win")?;
        let owner = mem_owner(buff, size);
        let win = win as usize;
        crate::group::run_collective(&c.clone(), "ncclCommWindowRegister", move || {
            let h = register::register_window(&c, owner, size, winFlags)?;
            // SAFETY: non-null (checked); the caller's out-pointer, valid until the call (or
            // its group) ends.
            unsafe { out(win as *mut NcclWindow, "win", h) }
        })
    })
}

/// The checks both registration calls make before anything is recorded.
fn check_range(buff: *mut c_void, size: usize, out_null: bool, what: &str) -> Res<()> {
    if buff.is_null() {
        return Err(Failure::argument("buff is NULL"));
    }
    if size == 0 {
        return Err(Failure::argument("size is 0"));
    }
    if (buff as usize).checked_add(size).is_none() {
        return Err(Failure::argument(format!(
            "{size} bytes at {buff:p} wrap around the address space"
        )));
    }
    if out_null {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    Ok(())
}

/// `ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)`: collective when
/// the window was registered for zero copy (every rank, in the same order).
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: NcclComm, win: NcclWindow) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        let c = lookup(comm)?;
        let w = win as usize;
        crate::group::run_collective(&c.clone(), "ncclCommWindowDeregister", move || {
            register::deregister(&c, w as *mut c_void, register::Kind::Window)
        })
    })
}

/// `ncclResult_t mscclppNcclZeroCopyCalls(ncclComm_t comm, uint64_t* calls)` (this library's
/// own): how many all-reduces of the communicator read a registered input in place — what tests
/// and benchmarks check to see the zero-copy path taken.
///
/// # Safety
/// `calls` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppNcclZeroCopyCalls(comm: NcclComm, calls: *mut u64) -> NcclResult {
    guard("mscclppNcclZeroCopyCalls", || {
        let c = lookup(comm)?;
        let n = c.caller().map_or(0, |caller| caller.zero_copy_calls());
        // SAFETY: forwarded contract.
        unsafe { out(calls, "calls", n) }
    })
}
