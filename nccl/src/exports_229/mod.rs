//! The exports NCCL added after 2.28's `nccl.h` up to 2.30.7 (2.31–2.32's are in `exports_232`),
//! plus the host functions of NCCL's device-API headers (`nccl_device/*.h`) that take a
//! communicator or a window and that `exports` does not export yet. The communicator calls (and
//! `ncclResetDebugInit`) are here; the window and one-sided calls are in `windows.rs`, the
//! parameter registry in `params.rs`.
//!
//! Every symbol of the newest `nccl.h` must be this library's: under `LD_PRELOAD`, a symbol we
//! leave undefined resolves to the real `libnccl.so`, which would be handed our handle (a serial
//! number, not its `struct ncclComm*`) and crash. So each one here is either served natively
//! over what this library has, or refused with a clear error naming the function (the message
//! is `ncclGetLastError`'s, set by [`guard`]).
//!
//! | function | since | here |
//! | --- | --- | --- |
//! | `ncclCommRevoke` | 2.28 | native: aborts the native side (kernels give up), aborts the real side; then only destroy, split and shrink |
//! | `ncclCommGetUniqueId`, `ncclCommGrow` | 2.29 | native: the parent's ranks keep theirs, new ranks join on the grow id |
//! | `ncclWinGetUserPtr` | 2.29 | native for windows inside `ncclMemAlloc` memory |
//! | `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal` | 2.29 | `ncclInvalidUsage`: one-sided operations are not supported |
//! | `ncclCommSuspend`, `ncclCommResume`, `ncclCommMemStats` | 2.29.7 | native: the collectives' memory released and made again, counted |
//! | `ncclParam*` | 2.30.4 | native: an empty parameter registry |
//! | `ncclResetDebugInit` | 2.24 | a no-op |
//! | `ncclCommQueryProperties` (`nccl_device/core.h`) | 2.29 | native: what we know, size/magic/version respected |
//! | `ncclGet{Lsa,Peer,LsaMultimem,Multimem}DevicePointer` | 2.28/2.29 | `ncclInvalidUsage` |
//!
//! The real NCCL's binding (`mscclpp-nccl-real`) binds NCCL 2.28's functions only, so nothing
//! here forwards to it: a communicator the real NCCL made gets the same answers (or errors) as a
//! native one.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi::*;
use crate::error::{Failure, guard, out};
use crate::registry::lookup;

mod params;
mod windows;

pub use params::*;
pub use windows::*;

/// `NCCL_API_MAGIC`: the magic of NCCL's versioned structs (`ncclCommProperties_t` too).
const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_REVOKE_DEFAULT`: the only `revokeFlags` NCCL accepts.
const NCCL_REVOKE_DEFAULT: c_int = 0;
/// `NCCL_SUSPEND_MEM`: release the communicator's dynamic GPU memory.
const NCCL_SUSPEND_MEM: c_int = 1;
/// `ncclCommMemStat_t` values.
mod mem_stat {
    use std::ffi::c_int;
    /// `ncclStatGpuMemSuspend`: bytes a suspend would release.
    pub const SUSPEND: c_int = 0;
    /// `ncclStatGpuMemSuspended`: 1 while suspended.
    pub const SUSPENDED: c_int = 1;
    /// `ncclStatGpuMemPersist`: bytes a suspend keeps.
    pub const PERSIST: c_int = 2;
    /// `ncclStatGpuMemTotal`: every byte the memory manager tracks.
    pub const TOTAL: c_int = 3;
}
/// `NCCL_VERSION(2, 29, 0)`: the first version with `ncclCommProperties_t`.
const PROPERTIES_SINCE: u32 = 22900;
/// `NCCL_VERSION(2, 29, 3)`: callers of later versions get `nLsaTeams`, `hostRmaSupport` and
/// `railedGinType` (the fields 2.29.7 appended).
const PROPERTIES_V2: u32 = 22903;
/// `NCCL_GIN_TYPE_NONE`.
const NCCL_GIN_TYPE_NONE: c_int = 0;

/// `ncclCommProperties_t` as NCCL 2.30's `nccl_device/core.h` lays it out. Callers built
/// against 2.29.2 pass the prefix up to `gin_type` (their `size` says so).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommProperties {
    /// `sizeof(ncclCommProperties_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// This rank.
    pub rank: c_int,
    /// Number of ranks.
    pub n_ranks: c_int,
    /// The CUDA device ordinal.
    pub cuda_dev: c_int,
    /// The NVML device index.
    pub nvml_dev: c_int,
    /// NCCL's device API (`ncclDevCommCreate`, symmetric windows) is usable.
    pub device_api_support: bool,
    /// NVLink multicast is usable.
    pub multimem_support: bool,
    /// `ncclGinType_t` of the GPU-initiated networking.
    pub gin_type: c_int,
    /// Number of load/store-accessible teams (2.29.7).
    pub n_lsa_teams: c_int,
    /// Host-initiated one-sided operations (`ncclPutSignal`) are usable (2.29.7).
    pub host_rma_support: bool,
    /// `ncclGinType_t` of the railed GIN (2.29.7).
    pub railed_gin_type: c_int,
}

/// Handles `ncclCommRevoke` has revoked (handles are never reused, so a set of values is
/// exact).
fn revoked() -> &'static Mutex<HashSet<usize>> {
    static R: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashSet::new()))
}

pub(crate) fn is_revoked(comm: NcclComm) -> bool {
    revoked()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&(comm as usize))
}

// ---------------------------------------------------------------------------------------------
// Communicators

/// `ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)` (NCCL 2.28): native. Ends
/// the communicator's in-flight native operations (its kernels give up at their next poll of
/// the abort word), aborts its real communicator if it has one, and refuses operations from
/// then on; destroy, split and shrink remain (a split or shrink of a revoked communicator has no
/// real side). NULL is `ncclSuccess`, as in NCCL; a finalized or already revoked communicator,
/// or flags other than `NCCL_REVOKE_DEFAULT`, are `ncclInvalidArgument`. A communicator made by
/// the real NCCL cannot be revoked (its `ncclCommRevoke` is not bound): `ncclInvalidUsage`.
///
/// # Safety
/// `comm` is a handle (checked against the live ones).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRevoke(comm: NcclComm, revokeFlags: c_int) -> NcclResult {
    guard("ncclCommRevoke", || {
        if comm.is_null() {
            return Ok(());
        }
        if revokeFlags != NCCL_REVOKE_DEFAULT {
            return Err(Failure::argument(format!(
                "revokeFlags {revokeFlags}: must be NCCL_REVOKE_DEFAULT (0)"
            )));
        }
        let c = lookup(comm)?;
        if is_revoked(comm) {
            return Err(Failure::argument(format!(
                "comm {comm:p} was revoked already"
            )));
        }
        if c.finalized.load(Ordering::Acquire) {
            return Err(Failure::argument(format!(
                "comm {comm:p} was finalized (ncclCommFinalize): it cannot be revoked"
            )));
        }
        if c.native.is_none() {
            return Err(Failure::usage(format!(
                "comm {comm:p} was made by the real NCCL, whose ncclCommRevoke this library does not bind: use ncclCommAbort"
            )));
        }
        revoked()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(comm as usize);
        c.abort_native();
        // As NCCL: a revoked communicator counts as finalized (operations are refused,
        // ncclCommFinalize does nothing more).
        c.finalized.store(true, Ordering::Release);
        c.release_real(true)
    })
}

/// `ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId)` (NCCL 2.29):
/// native. The id of an `ncclCommGrow` of `comm`: a fresh bootstrap whose root this rank runs
/// when it grows. As NCCL, each call makes a new id (an earlier one never used is dropped).
///
/// # Safety
/// `comm` is a handle (checked); `uniqueId` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetUniqueId(
    comm: NcclComm,
    uniqueId: *mut NcclUniqueId,
) -> NcclResult {
    guard("ncclCommGetUniqueId", || {
        let c = lookup(comm)?;
        if uniqueId.is_null() {
            return Err(Failure::argument("uniqueId is NULL"));
        }
        let id = crate::lifecycle::grow_id(&c)?;
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe {
            out(
                uniqueId,
                "uniqueId",
                NcclUniqueId {
                    internal: id.to_bytes(),
                },
            )
        }
    })
}

/// `ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int
/// rank, ncclComm_t* newcomm, ncclConfig_t* config)` (NCCL 2.29): native, NCCL's parameter
/// usage: an existing rank passes `comm` and rank -1 (the one that called
/// `ncclCommGetUniqueId` passes its id, the others NULL) and keeps its rank; a new rank passes
/// NULL, the id and its rank (from the parent's size up). Blocking or not as `config` (an
/// existing rank's NULL config inherits the parent's), inside groups too. See
/// [`crate::lifecycle::grow`].
///
/// # Safety
/// `comm` is NULL or a handle (checked); `uniqueId` NULL or valid; `newcomm` NULL or valid for
/// a write; `config` NULL or an `ncclConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGrow(
    comm: NcclComm,
    nRanks: c_int,
    uniqueId: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclComm,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommGrow", || {
        let parent = if comm.is_null() {
            None
        } else {
            Some(lookup(comm)?)
        };
        // SAFETY: NULL or a valid id (caller's contract).
        let id = unsafe { uniqueId.as_ref() };
        // SAFETY: forwarded contract.
        unsafe { crate::lifecycle::grow(parent.as_ref(), nRanks, id, rank, newcomm, config) }
    })
}

/// `ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags)` (NCCL 2.29.7): native.
/// `NCCL_SUSPEND_MEM` releases the collectives' memory on every rank (a collective call, made
/// at the outermost `ncclGroupEnd` inside a group; see `mscclpp_caller::Caller::suspend`): the
/// communicator refuses operations until `ncclCommResume`. Refused while windows are
/// registered. No flag suspends nothing (`ncclSuccess`); other bits are `ncclInvalidArgument`.
/// A communicator the real NCCL made (no native side) answers as NCCL with its memory manager
/// disabled: `ncclInvalidUsage`.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSuspend(comm: NcclComm, flags: c_int) -> NcclResult {
    guard("ncclCommSuspend", || {
        let c = lookup(comm)?;
        if flags & !NCCL_SUSPEND_MEM != 0 {
            return Err(Failure::argument(format!(
                "flags {flags:#x}: only NCCL_SUSPEND_MEM ({NCCL_SUSPEND_MEM:#x}) is defined"
            )));
        }
        if flags & NCCL_SUSPEND_MEM == 0 {
            return Ok(());
        }
        if c.caller().is_none() {
            return Err(Failure::usage(
                "NCCL_SUSPEND_MEM on a communicator the real NCCL made: this library does not bind its memory manager",
            ));
        }
        let c2 = Arc::clone(&c);
        crate::group::run_collective(&c, "ncclCommSuspend", move || {
            let caller = c2
                .caller()
                .ok_or_else(|| Failure::internal("suspend without a caller side"))?;
            let bytes = caller.suspend().map_err(|e| match e {
                mscclpp::hal::Error::InvalidUsage(m) => Failure::usage(m),
                e => e.into(),
            })?;
            tracing::info!(
                target: crate::debug::INIT,
                "ncclCommSuspend: rank {} released {bytes} bytes of collective memory",
                c2.rank
            );
            Ok(())
        })
    })
}

/// `ncclResult_t ncclCommResume(ncclComm_t comm)` (NCCL 2.29.7): native. Makes the
/// collectives again on every rank (a collective call, as their first set-up; inside a group,
/// at its outermost end). `ncclInvalidUsage` when nothing is suspended.
///
/// # Safety
/// `comm` is a handle (checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommResume(comm: NcclComm) -> NcclResult {
    guard("ncclCommResume", || {
        let c = lookup(comm)?;
        if c.caller().is_none() {
            return Err(Failure::usage(
                "nothing is suspended: a communicator the real NCCL made is not suspended by this library",
            ));
        }
        let c2 = Arc::clone(&c);
        crate::group::run_collective(&c, "ncclCommResume", move || {
            let caller = c2
                .caller()
                .ok_or_else(|| Failure::internal("resume without a caller side"))?;
            caller.resume().map_err(|e| match e {
                mscclpp::hal::Error::InvalidUsage(m) => Failure::usage(m),
                e => e.into(),
            })
        })
    })
}

/// `ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value)`
/// (NCCL 2.29.7): native. `ncclStatGpuMemSuspend`: the bytes a suspend releases (the
/// collectives' set-up; 0 while suspended); `ncclStatGpuMemSuspended`: 1 while suspended;
/// `ncclStatGpuMemPersist`: the rest of the communicator's caller side; `ncclStatGpuMemTotal`:
/// their sum. A communicator the real NCCL made reports 0. Another `stat` is
/// `ncclInvalidArgument`.
///
/// # Safety
/// `value` must be NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommMemStats(
    comm: NcclComm,
    stat: c_int,
    value: *mut u64,
) -> NcclResult {
    guard("ncclCommMemStats", || {
        let c = lookup(comm)?;
        if value.is_null() {
            return Err(Failure::argument("value is NULL"));
        }
        let m = c.caller().map(|k| k.mem_stats());
        let (susp, suspended, persist) = m.map_or((0, false, 0), |m| {
            (m.suspendable, m.suspended, m.persistent)
        });
        let v = match stat {
            mem_stat::SUSPEND => susp,
            mem_stat::SUSPENDED => u64::from(suspended),
            mem_stat::PERSIST => persist,
            mem_stat::TOTAL => susp + persist,
            other => {
                return Err(Failure::argument(format!(
                    "stat {other} is not an ncclCommMemStat_t"
                )));
            }
        };
        // SAFETY: non-null (checked); the caller's out-pointer.
        unsafe { out(value, "value", v) }
    })
}

/// `ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props)` (NCCL
/// 2.29, `nccl_device/core.h`): native. `props` must come from
/// `NCCL_COMM_PROPERTIES_INITIALIZER` (magic checked, `ncclInvalidUsage` otherwise); only the
/// fields within the caller's `size` are written, and the 2.29.7 ones only for callers newer
/// than 2.29.3, as NCCL does. Written: `rank`, `nRanks`, `cudaDev`; `nvmlDev` -1 (this library
/// does not know the NVML index); no device API, multicast, GIN or host RMA (`false`,
/// `NCCL_GIN_TYPE_NONE`, `nLsaTeams` 0): this library serves none of them itself.
///
/// # Safety
/// `props` must be NULL or valid for reads and writes of its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommQueryProperties(
    comm: NcclComm,
    props: *mut CommProperties,
) -> NcclResult {
    guard("ncclCommQueryProperties", || {
        let c = lookup(comm)?;
        if props.is_null() {
            return Err(Failure::argument("props is NULL"));
        }
        let head = offset_of!(CommProperties, rank);
        // SAFETY: non-null; every caller's struct starts with size, magic, version (16 bytes).
        let (size, magic, version) = unsafe {
            (
                props.cast::<usize>().read(),
                props
                    .cast::<u8>()
                    .add(offset_of!(CommProperties, magic))
                    .cast::<u32>()
                    .read(),
                props
                    .cast::<u8>()
                    .add(offset_of!(CommProperties, version))
                    .cast::<u32>()
                    .read(),
            )
        };
        if magic != NCCL_API_MAGIC {
            return Err(Failure::usage(format!(
                "props->magic {magic:#x}: ncclCommProperties_t must be initialised with NCCL_COMM_PROPERTIES_INITIALIZER"
            )));
        }
        if version < PROPERTIES_SINCE {
            return Err(Failure::usage(format!(
                "props->version {version}: ncclCommProperties_t exists from NCCL 2.29 (22900)"
            )));
        }
        if size < head {
            return Err(Failure::argument(format!(
                "props->size {size}: smaller than the struct's header ({head} bytes)"
            )));
        }
        let fits = |offset: usize, len: usize| offset + len <= size;
        let base = props.cast::<u8>();
        let put_int = |offset: usize, v: c_int| {
            if fits(offset, size_of::<c_int>()) {
                // SAFETY: within the caller's `size` bytes, at the field's (aligned) offset.
                unsafe { base.add(offset).cast::<c_int>().write(v) };
            }
        };
        let put_bool = |offset: usize, v: bool| {
            if fits(offset, size_of::<bool>()) {
                // SAFETY: as above.
                unsafe { base.add(offset).cast::<bool>().write(v) };
            }
        };
        // The device API (LSA) is served on a native communicator whose device has shareable
        // memory; NCCL tells 2.29 clients it is there only when one LSA team holds every rank.
        let lsa = c.native.as_ref().and_then(|n| {
            let comm = n.communicator();
            comm.device().shareable()?;
            let boot = comm.bootstrap();
            Some(crate::devapi::lsa_of(boot.hosts(), boot.rank()).0)
        });
        let device_api = match lsa {
            Some(size) if version < 23000 => size == c.nranks,
            Some(_) => true,
            None => false,
        };
        put_int(offset_of!(CommProperties, rank), c.rank as c_int);
        put_int(offset_of!(CommProperties, n_ranks), c.nranks as c_int);
        put_int(offset_of!(CommProperties, cuda_dev), c.device);
        put_int(offset_of!(CommProperties, nvml_dev), -1);
        put_bool(offset_of!(CommProperties, device_api_support), device_api);
        put_bool(offset_of!(CommProperties, multimem_support), false);
        // GIN (proxy type; between hosts through their transport) where the client's headers
        // have the descriptor format this library serves (2.30.3 on; NCCL tells 2.29 clients
        // NONE).
        let gin = device_api && crate::devapi::gin::context_stride(version).is_ok();
        let gin_type = if gin {
            c_int::from(crate::devapi::layout::GIN_TYPE_PROXY)
        } else {
            NCCL_GIN_TYPE_NONE
        };
        put_int(offset_of!(CommProperties, gin_type), gin_type);
        if version >= 23100 {
            // 2.31's fields (GIN: a minimum stride of 1, FULL connections, the proxy type
            // supported), and 2.32's CFT flags (none).
            use crate::devapi::layout::props;
            if fits(props::COMM_HASH, 8) {
                // SAFETY: within the caller's `size` bytes, at the field's (aligned) offset.
                unsafe {
                    base.add(props::COMM_HASH)
                        .cast::<u64>()
                        .write(Arc::as_ptr(&c) as u64)
                };
            }
            put_int(props::GIN_MIN_STRIDE, c_int::from(gin));
            put_int(props::GIN_CONNECTION_TYPE, c_int::from(gin));
            for i in 0..64 {
                put_bool(
                    props::GIN_SUPPORT + i,
                    gin && i == usize::from(crate::devapi::layout::GIN_TYPE_PROXY),
                );
            }
            if fits(props::DEV_COMM_RUNTIME_VERSION_SIZE, 8) {
                // SAFETY: as above. The size of the newest ncclDevComm (2.31's on).
                unsafe {
                    base.add(props::DEV_COMM_RUNTIME_VERSION_SIZE)
                        .cast::<usize>()
                        .write(crate::devapi::layout::DevCommLayout::V2310.offsets().size)
                };
            }
            if version >= 23200 {
                for i in 0..3 {
                    put_bool(props::CFT_SUPPORT + i, false);
                }
            }
        }
        if version > PROPERTIES_V2 {
            put_int(
                offset_of!(CommProperties, n_lsa_teams),
                lsa.map_or(0, |s| (c.nranks / s) as c_int),
            );
            put_bool(offset_of!(CommProperties, host_rma_support), false);
            put_int(offset_of!(CommProperties, railed_gin_type), gin_type);
        }
        Ok(())
    })
}

/// `void ncclResetDebugInit(void)` (deprecated in NCCL's header since 2.24): a no-op. This
/// library's logging is configured once per process, at its first call, from `NCCL_DEBUG*` or
/// `MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG` (see [`crate::debug`]).
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {
    guard("ncclResetDebugInit", || {
        tracing::debug!(
            "ncclResetDebugInit: a no-op (logging is set once, at the first call, from NCCL_DEBUG* or MSCCLPP_LOG_LEVEL)"
        );
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of NCCL 2.30's `ncclCommProperties_t` on LP64 (what `offsetof` gives for
    /// its header); 2.29.2's struct ends after `ginType` (40 bytes).
    #[test]
    fn properties_layout_is_nccl_2_30s() {
        assert_eq!(offset_of!(CommProperties, rank), 16);
        assert_eq!(offset_of!(CommProperties, nvml_dev), 28);
        assert_eq!(offset_of!(CommProperties, device_api_support), 32);
        assert_eq!(offset_of!(CommProperties, multimem_support), 33);
        assert_eq!(offset_of!(CommProperties, gin_type), 36);
        assert_eq!(offset_of!(CommProperties, n_lsa_teams), 40);
        assert_eq!(offset_of!(CommProperties, host_rma_support), 44);
        assert_eq!(offset_of!(CommProperties, railed_gin_type), 48);
        assert_eq!(size_of::<CommProperties>(), 56);
        assert_eq!(size_of::<NcclTeam>(), 12);
    }
}
