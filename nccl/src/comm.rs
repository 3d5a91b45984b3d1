//! What an `ncclComm_t` of this library points to: its mscclpp side, its real NCCL side and
//! the state the C API reports. Making one is in [`crate::init`], its handle in
//! [`crate::registry`], running operations on it in [`crate::native`].

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp::comm::Communicator;
use mscclpp::hal::{Device, DeviceBuffer, Stream};

use mscclpp_caller::Caller;

use crate::abi::*;
use crate::config::CommConfig;
use crate::error::{Failure, Res};
use crate::job::Job;
use crate::real::{RealNccl, RealResults, no_real};

/// The mscclpp side of a communicator.
#[derive(Debug)]
pub struct Native {
    /// The caller side the Python package shares: the communicator, its collectives (none with
    /// one rank, where operations are copies, or where they cannot serve the ranks: then every
    /// operation falls back), its own stream (what `stream == NULL` means on the host backend)
    /// and the wrapped streams of callers.
    pub(crate) caller: Caller,
    /// NCCL's device API: the symmetric space and the device communicators.
    pub(crate) devapi: crate::devapi::State,
    /// Execution plans of `MSCCLPP_EXECUTION_PLAN_DIR`, tried ahead of the collectives.
    pub(crate) plans: Option<crate::plans::Plans>,
    /// Where a PreMulSum reduce-scatter or reduce scales this rank's input (the caller's send
    /// buffer is read-only): the current buffer last, grown on demand; the earlier ones stay
    /// allocated with the communicator since calls already enqueued may still read them.
    pub(crate) premul_staging: Mutex<Vec<DeviceBuffer>>,
    /// The id `ncclCommGetUniqueId` made on this rank for an `ncclCommGrow` not yet run (NCCL
    /// allows one unconsumed grow id per communicator).
    pub(crate) grow_id: Mutex<Option<mscclpp::comm::UniqueId>>,
}

impl Native {
    /// The mscclpp communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        self.caller.communicator()
    }

    /// Whether the device is the host backend's.
    pub fn comm_backend_is_host(&self) -> bool {
        self.caller.is_host()
    }

    /// Waits for the communicator's own stream.
    pub fn sync_internal(&self) -> Res<()> {
        Ok(self.caller.internal().synchronize()?)
    }

    /// The stream of a call: NULL is the legacy default stream on GPUs and the communicator's
    /// own on the host backend (which refuses any other).
    pub(crate) fn stream(&self, stream: CudaStream) -> Res<Arc<dyn Stream>> {
        let h = stream as u64;
        // The caller side's one refusal of a stream (a named one on the host backend) is a bad
        // argument here, NCCL's code for any other bad pointer.
        self.caller
            .stream((h != 0).then_some(h))
            .map_err(|e| match e {
                mscclpp::hal::Error::InvalidUsage(m) => Failure::argument(m),
                e => e.into(),
            })
    }
}

/// A real NCCL communicator and the library it belongs to.
#[derive(Debug)]
pub struct RealComm {
    /// The library.
    pub lib: &'static RealNccl,
    /// Its `ncclComm_t`.
    pub comm: NcclComm,
}

// SAFETY: an ncclComm_t may be used from any thread (NCCL serialises what needs it); we only
// pass the handle to NCCL.
unsafe impl Send for RealComm {}
// SAFETY: as above.
unsafe impl Sync for RealComm {}

/// What an `ncclComm_t` of this library points to.
#[derive(Debug)]
pub struct Comm {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// The CUDA (or host-backend) device ordinal.
    pub device: i32,
    /// The mscclpp communicator (`None` for communicators made by the real NCCL: split,
    /// shrink, init-all).
    pub native: Option<Native>,
    /// The real NCCL communicator, when `MSCCLPP_NCCL_LIB_PATH` is set.
    pub real: Mutex<Option<RealComm>>,
    /// An error that made the communicator unusable (`ncclCommGetAsyncError`).
    pub async_error: AtomicI32,
    /// The `ncclConfig_t` it was made with (a split or shrink without one inherits it).
    pub config: CommConfig,
    /// A non-blocking `ncclCommFinalize` still running: `ncclInProgress` until it is done.
    pub busy: Mutex<Option<Arc<Job>>>,
    /// Whether `busy` holds a job: every operation asks, and almost always there is none.
    pub has_busy: AtomicBool,
    /// `ncclCommFinalize` has run: only destroy and abort remain.
    pub finalized: AtomicBool,
    /// An identity every rank computes alike (NCCL's `commHash`: a profiler plugin's
    /// `commId`): from the unique id, or the parent's and the child's place among its
    /// children.
    pub id: u64,
    /// Children made so far (splits, shrinks): each child's [`Comm::id`] counts it.
    pub children: std::sync::atomic::AtomicU64,
    /// The profiler plugin's context for this communicator, if a plugin is loaded.
    pub profiler: Option<Arc<crate::profiler::Attached>>,
}

/// Mixes `b` into the identity `a` (splitmix64's finaliser over their combination).
pub fn mix_id(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(a << 6)
        .wrapping_add(a >> 2);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Comm {
    /// The identity of this communicator's next child (every rank makes its children in the
    /// same order, so they agree), mixed with what tells siblings made at once apart.
    pub fn child_id(&self, salt: u64) -> u64 {
        let n = self.children.fetch_add(1, Ordering::Relaxed) + 1;
        mix_id(mix_id(self.id, n), salt)
    }

    /// The real communicator, if any.
    pub(crate) fn real_comm(&self) -> Option<(&'static RealNccl, NcclComm)> {
        self.real
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| (r.lib, r.comm))
    }

    /// The real communicator and its library, if any (split, shrink, async errors).
    pub fn real_parts(&self) -> Option<(&'static RealNccl, NcclComm)> {
        self.real_comm()
    }

    /// Marks the communicator in progress until `job` ends (a non-blocking finalize, or a
    /// split or shrink of it).
    pub fn set_busy(&self, job: Arc<Job>) {
        let mut g = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        *g = Some(job);
        self.has_busy.store(true, Ordering::Release);
    }

    /// The job that keeps the communicator in progress, if it is still running.
    pub fn busy_job(&self) -> Option<Arc<Job>> {
        if !self.has_busy.load(Ordering::Acquire) {
            return None;
        }
        let g = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().filter(|j| j.result().is_none()).cloned()
    }

    /// Takes the last in-progress job, finished or not.
    pub fn take_busy(&self) -> Option<Arc<Job>> {
        let mut g = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        self.has_busy.store(false, Ordering::Release);
        g.take()
    }

    /// The native communicator's failure (a dead rank, named, or an abort), if any.
    pub fn native_failure(&self) -> Option<mscclpp::hal::Error> {
        self.native
            .as_ref()
            .and_then(|n| n.communicator().failure())
    }

    /// Marks the native communicator aborted: its kernels' waits end at their next poll.
    pub fn abort_native(&self) {
        if let Some(n) = &self.native {
            n.communicator().abort();
        }
    }

    /// Frees the real communicator (destroy or abort).
    pub fn release_real(&self, abort: bool) -> Res<()> {
        let taken = self.real.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(rc) = taken {
            let (f, name) = if abort {
                (rc.lib.comm_abort, "ncclCommAbort")
            } else {
                (rc.lib.comm_destroy, "ncclCommDestroy")
            };
            let f = rc.lib.need(f, name)?;
            // SAFETY: the real communicator, released once (taken out of the slot).
            rc.lib.check(name, unsafe { f(rc.comm) })?;
        }
        Ok(())
    }

    /// `ncclCommFinalize`: waits for the native work on the internal stream and finalizes the
    /// real communicator.
    pub fn finalize(&self) -> Res<()> {
        if let Some(n) = &self.native {
            if n.comm_backend_is_host() {
                n.sync_internal()?;
            }
        }
        if let Some((lib, c)) = self.real_comm() {
            if let Some(f) = lib.comm_finalize {
                // SAFETY: live real communicator.
                lib.check("ncclCommFinalize", unsafe { f(c) })?;
            }
        }
        Ok(())
    }

    /// The real communicator for an operation that only the real NCCL serves.
    pub fn require_real(&self, what: &str) -> Res<(&'static RealNccl, NcclComm)> {
        self.real_comm().ok_or_else(|| no_real(what))
    }

    /// The caller side, where this communicator has a native side.
    pub fn caller(&self) -> Option<&Caller> {
        self.native.as_ref().map(|n| &n.caller)
    }

    /// The native communicator's device, if it has a native side.
    pub fn native_device(&self) -> Option<Arc<dyn Device>> {
        self.native
            .as_ref()
            .map(|n| n.communicator().device().clone())
    }

    /// The real NCCL's PreMulSum operator made beside ours (for the operations that fall
    /// back), when this communicator has a real one.
    ///
    /// # Safety
    /// As `ncclRedOpCreatePreMulSum`'s arguments.
    pub unsafe fn create_real_premul(
        &self,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
    ) -> Res<Option<c_int>> {
        let Some((lib, rc)) = self.real_comm() else {
            return Ok(None);
        };
        let made = (|| -> Res<c_int> {
            let f = lib.need(lib.red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum")?;
            let mut op: c_int = 0;
            // SAFETY: the caller's arguments with the real communicator and a valid out-pointer.
            lib.check("ncclRedOpCreatePreMulSum", unsafe {
                f(&mut op, scalar, datatype, residence, rc)
            })?;
            Ok(op)
        })();
        match made {
            Ok(op) => Ok(Some(op)),
            // The native side serves the operator; only fallbacks will lack it.
            Err(e) if self.native.is_some() => {
                tracing::warn!("{}", e.message);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Destroys the real NCCL's operator `op` of this communicator.
    pub fn destroy_real_premul(&self, op: c_int) -> Res<()> {
        let Some((lib, rc)) = self.real_comm() else {
            return Ok(());
        };
        let f = lib.need(lib.red_op_destroy, "ncclRedOpDestroy")?;
        // SAFETY: an operator the real NCCL made for this communicator.
        lib.check("ncclRedOpDestroy", unsafe { f(op, rc) })
    }
}
