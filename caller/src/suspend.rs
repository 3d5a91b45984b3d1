//! Suspending a communicator's memory (NCCL 2.29.7's `ncclCommSuspend(NCCL_SUSPEND_MEM)` and
//! `ncclCommResume`) and what `ncclCommMemStats` reports.
//!
//! The memory a suspend releases is the collectives' (scratch, flags, staging, their channels
//! and the peers' mappings of them): the collectives are dropped on every rank and made again
//! at resume, each a collective call like their first set-up. What stays is the rest of the
//! caller side (its stream, the reduce sink). The bytes counted are what each set-up allocated
//! on its thread (`mscclpp_hal::memory::allocated_here`); buffers an algorithm grows later
//! (copy-engine gathers, multi-host staging) are released too but not counted.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use mscclpp_hal::{Error, Result};

use crate::{Caller, typed_collectives};

/// A caller side's byte counts and live windows. (Whether it is suspended is not kept: it is a
/// caller side with collectives whose collectives are gone.)
#[derive(Debug)]
pub(crate) struct MemState {
    /// Bytes the collectives' last set-up allocated.
    colls_bytes: AtomicU64,
    /// Bytes the rest of the caller side allocated.
    persistent: u64,
    /// Windows registered with the collectives and not deregistered.
    windows: AtomicUsize,
}

impl MemState {
    pub(crate) fn new(colls_bytes: u64, persistent: u64) -> Self {
        MemState {
            colls_bytes: AtomicU64::new(colls_bytes),
            persistent,
            windows: AtomicUsize::new(0),
        }
    }

    pub(crate) fn window_added(&self) {
        self.windows.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn window_removed(&self) {
        let _ = self
            .windows
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| w.checked_sub(1));
    }
}

/// `ncclCommMemStats`' figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemStats {
    /// Bytes a suspend releases (0 while suspended).
    pub suspendable: u64,
    /// Whether the memory is suspended.
    pub suspended: bool,
    /// Bytes a suspend keeps.
    pub persistent: u64,
}

/// The error of an operation on a suspended communicator.
pub(crate) fn suspended_error() -> Error {
    Error::invalid(
        "the communicator is suspended (ncclCommSuspend with NCCL_SUSPEND_MEM): call ncclCommResume before using it",
    )
}

impl Caller {
    /// Whether the collectives' memory is suspended.
    fn suspended(&self) -> bool {
        self.has_colls && self.colls().is_none()
    }

    /// Releases the collectives' memory on every rank (a collective call: every rank makes it,
    /// with no operation of the communicator in flight, as NCCL requires); returns the bytes
    /// released. Refused while windows are registered (they live in that memory's
    /// registrations). A communicator without collectives has nothing to release; suspending
    /// twice releases nothing more.
    pub fn suspend(&self) -> Result<u64> {
        let mem = &self.mem;
        if !self.has_colls || self.suspended() {
            return Ok(0);
        }
        let w = mem.windows.load(Ordering::Acquire);
        if w > 0 {
            return Err(Error::invalid(format!(
                "{w} registered window(s): deregister them (ncclCommWindowDeregister / ncclCommDeregister) before suspending the communicator's memory"
            )));
        }
        // This rank's own work has finished, and every rank has come this far (no kernel of
        // any rank still reads what is about to be unmapped).
        self.internal.synchronize()?;
        let boot = self.comm.bootstrap();
        boot.barrier()?;
        let taken = self.colls.write().unwrap_or_else(|p| p.into_inner()).take();
        drop(taken);
        boot.barrier()?;
        Ok(mem.colls_bytes.load(Ordering::Acquire))
    }

    /// Makes the collectives again after [`Caller::suspend`] (a collective call, as their
    /// first set-up). Refused when nothing is suspended.
    pub fn resume(&self) -> Result<()> {
        let mem = &self.mem;
        if !self.suspended() {
            return Err(Error::invalid(
                "the communicator is not suspended (ncclCommResume without ncclCommSuspend(NCCL_SUSPEND_MEM))",
            ));
        }
        let before = mscclpp_hal::memory::allocated_here();
        let colls = typed_collectives(self.comm.clone())?;
        // The new collectives' proxy is told as the old one was.
        if let Some(o) = self.proxy_observer.get() {
            colls.observe_proxy(o.clone())?;
        }
        mem.colls_bytes.store(
            mscclpp_hal::memory::allocated_here() - before,
            Ordering::Release,
        );
        *self.colls.write().unwrap_or_else(|p| p.into_inner()) = Some(colls);
        Ok(())
    }

    /// What `ncclCommMemStats` reports.
    pub fn mem_stats(&self) -> MemStats {
        let suspended = self.suspended();
        MemStats {
            suspendable: if suspended {
                0
            } else {
                self.mem.colls_bytes.load(Ordering::Acquire)
            },
            suspended,
            persistent: self.mem.persistent,
        }
    }
}
