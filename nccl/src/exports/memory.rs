//! Memory: `ncclMemAlloc` / `ncclMemFree`, and the map of their buffers that registration
//! looks ranges up in.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use mscclpp::hal::{Device, DeviceBuffer, MemoryKind};

use crate::abi::*;
use crate::error::{Failure, Res, guard, out};

/// Buffers handed out by `ncclMemAlloc`, by address.
fn mem_map() -> &'static Mutex<HashMap<usize, DeviceBuffer>> {
    static M: OnceLock<Mutex<HashMap<usize, DeviceBuffer>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The `ncclMemAlloc` buffer holding `[ptr, ptr + len)` and the range's offset in it.
pub(super) fn mem_owner(ptr: *mut c_void, len: usize) -> Option<(DeviceBuffer, usize)> {
    let p = ptr as usize;
    let m = mem_map().lock().unwrap_or_else(|e| e.into_inner());
    m.iter().find_map(|(&base, b)| {
        let off = p.checked_sub(base)?;
        (off.checked_add(len)? <= b.len()).then(|| (b.clone(), off))
    })
}

/// The device `ncclMemAlloc` allocates on: the caller's current one (CUDA), else device 0.
fn mem_device() -> Res<Arc<dyn Device>> {
    type Devices = Mutex<HashMap<usize, Arc<dyn Device>>>;
    static BACKEND: OnceLock<Result<Arc<dyn mscclpp::hal::Backend>, Failure>> = OnceLock::new();
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    let backend = BACKEND
        .get_or_init(|| mscclpp::registry::select().map_err(Failure::from))
        .as_ref()
        .map_err(Clone::clone)?;
    let ordinal = backend.current_device()?.unwrap_or(0);
    let mut devs = DEVICES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = devs.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = backend.open_device(ordinal)?;
    devs.insert(ordinal, d.clone());
    Ok(d)
}

/// `ncclResult_t ncclMemAlloc(void** ptr, size_t size)`: device memory of the current device
/// through the HAL (host backend: shared host memory).
///
/// # Safety
/// `ptr` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Failure::argument("ptr is NULL"));
        }
        if size == 0 {
            return Err(Failure::argument("size is 0"));
        }
        // Shareable memory where the device has it: what symmetric windows (NCCL's device API)
        // map into every LSA rank, as NCCL's own ncclMemAlloc returns virtual-memory
        // allocations with exportable handles.
        let dev = mem_device()?;
        let buf = match dev.shareable() {
            Some(sh) => sh.alloc(size)?,
            None => dev.alloc(size, MemoryKind::Device)?,
        };
        let p = buf.ptr().0 as usize;
        mem_map()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p, buf);
        // SAFETY: forwarded contract.
        unsafe { out(ptr, "ptr", p as *mut c_void) }
    })
}

/// `ncclResult_t ncclMemFree(void* ptr)`: frees what `ncclMemAlloc` returned.
///
/// # Safety
/// No outstanding work may use the memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Err(Failure::argument("ptr is NULL"));
        }
        mem_map()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr as usize))
            .map(|buf| {
                drop(buf);
                // Communicators drop their wrappers of caller memory: a call on a pointer into
                // this memory is checked (and refused) again, not trusted.
                mscclpp_caller::memory_freed();
            })
            .ok_or_else(|| Failure::argument(format!("{ptr:p} was not allocated by ncclMemAlloc")))
    })
}
