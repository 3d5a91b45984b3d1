//! Registration of caller buffers with every rank's collectives (windows), the one place both
//! front ends register: NCCL's `ncclCommWindowRegister` and the Python package's `register`.
//!
//! Registration maps a buffer into every peer, so it is collective, and every rank must take the
//! same path: a rank failing inside the mapping would leave the others waiting for its handle.
//! So each rank first says whether it has a buffer the peers can map (the front end's candidate,
//! exported alone: cheap, the handle is cached), and only when every rank has one are they
//! registered together; otherwise the registration is recorded on every rank (`None`) and calls
//! on it copy as without it.

use mscclpp_collectives::Window;
use mscclpp_hal::{BufferSlice, Result};
use mscclpp_transports::{Transport, TransportFlags};

use crate::Caller;

impl Caller {
    /// Registers this rank's `candidate` with every rank's collectives (a collective call, in
    /// the same order on every rank): `Some(window)` where every rank passed a buffer its peers
    /// can map, `None` where some rank could not (recorded: calls copy), with one rank, or
    /// without collectives (the reason is logged; [`Caller::require`] refuses that case for a
    /// front end that has no fallback). `candidate`: `None` where the front end knows this
    /// rank's memory is not one to map (NCCL: not from `ncclMemAlloc`).
    pub fn register(&self, candidate: Option<&BufferSlice>) -> Result<Option<Window>> {
        let guard = self.live()?;
        let Some(colls) = guard.as_ref() else {
            tracing::info!(
                rank = self.comm.rank(),
                "register: {}; the registration is recorded and calls on it copy",
                self.no_colls
                    .as_deref()
                    .unwrap_or("one rank: nothing to map")
            );
            return Ok(None);
        };
        if colls.hosts().is_some() {
            // The same on every rank: the hierarchical collectives map no buffers.
            tracing::info!(
                rank = self.comm.rank(),
                "register: the ranks span hosts, where the collectives map no buffers; the registration is recorded and calls on it copy"
            );
            return Ok(None);
        }
        let mine = match candidate {
            None => Err("its memory is not one this library maps (not from ncclMemAlloc)".into()),
            Some(slice) => self
                .comm
                .register_memory(slice, TransportFlags::single(Transport::CudaIpc))
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        let all = self
            .comm
            .bootstrap()
            .all_gather(&[u8::from(mine.is_ok())])?;
        let missing: Vec<usize> = (0..all.len()).filter(|&r| all[r] != [1]).collect();
        match (candidate, missing.is_empty()) {
            (Some(slice), true) => {
                let w = colls.register(slice)?;
                self.mem.window_added();
                Ok(Some(w))
            }
            _ => {
                let why = mine
                    .err()
                    .map_or_else(String::new, |e| format!("; this rank: {e}"));
                tracing::info!(
                    rank = self.comm.rank(),
                    "register: ranks {missing:?} passed memory the peers cannot map (not from \
                     ncclMemAlloc, or of the virtual-memory calls such as PyTorch's expandable \
                     segments, which have no IPC handle){why}; the registration is recorded and \
                     calls on it copy"
                );
                Ok(None)
            }
        }
    }

    /// Registers `slice` with every rank's collectives where the front end mapped every rank's
    /// buffer itself (`mapped[r]`: rank `r`'s address here and its length; a symmetric window),
    /// so no IPC mapping is needed (collective; every rank calls it for the same window).
    /// `None` without collectives, as [`Caller::register`].
    pub fn register_mapped(
        &self,
        slice: &BufferSlice,
        mapped: &[(u64, u64)],
    ) -> Result<Option<Window>> {
        match self.live()?.as_ref() {
            Some(c) => {
                let w = c.register_mapped(slice, mapped)?;
                self.mem.window_added();
                Ok(Some(w))
            }
            None => Ok(None),
        }
    }

    /// Deregisters a window of [`Caller::register`] (collective, in the same order on every
    /// rank; every call that used it has finished on its stream, on every rank).
    pub fn deregister(&self, window: Window) -> Result<()> {
        match self.colls().as_ref() {
            Some(c) => {
                c.deregister(window)?;
                self.mem.window_removed();
                Ok(())
            }
            None => Err(mscclpp_hal::Error::Internal(
                "a window without collectives".into(),
            )),
        }
    }

    /// All-reduces so far whose peers read a registered input in place instead of a copy.
    pub fn zero_copy_calls(&self) -> u64 {
        self.colls().as_ref().map_or(0, |c| c.zero_copy_calls())
    }
}
