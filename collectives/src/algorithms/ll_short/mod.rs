//! The short LL kernels: the LL protocol for calls of one round, with a thread per packet of a
//! rank block, so no thread loops and no grid barrier is needed. They run the same protocol on
//! the same scratch and flag as the general LL kernels, so ranks may differ in which they take.
//! Broadcast keeps its acknowledgements in the general kernel.
//!
//! The kernels are entry points of the LL modules (`ll/module.rs`, `kernels/collectives/ll.cu`
//! and `ll_wide.cu`) and take their [`LlCollectiveArgs`]; on the host the LL host kernel (`ll/host.rs`) serves them,
//! since the protocol is the same.
//!
#![doc = include_str!("spec.md")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, LaunchConfig, Result};

use super::base::{Algorithm, ByType, Plan};
use super::id::AlgorithmId;
use super::ll::module::{
    MODULE, SHORT_ALLGATHER, SHORT_ALLGATHER_WIDE, SHORT_ALLREDUCE, SHORT_ALLTOALL,
    SHORT_ALLTOALL_WIDE, SHORT_REDUCE_SCATTER, WIDE_MODULE,
};
use super::ll::{ByTypeAndOp, LlCollectiveArgs, LlGrid, LlScratch, load_all};
use crate::CollectiveKind;
use crate::call::Checked;

#[derive(Debug)]
pub(crate) struct LlShort<A: Api> {
    shared: Arc<LlScratch>,
    grid: LlGrid,
    /// All-reduce and reduce-scatter by element type and operator.
    allreduce: ByTypeAndOp<A>,
    reduce_scatter: ByTypeAndOp<A>,
    allgather: ByType<LlCollectiveArgs, A>,
    alltoall: ByType<LlCollectiveArgs, A>,
    /// `MSCCLPP_LL_SHORT`, [`crate::Collectives::use_short_kernels`]; per rank.
    enabled: AtomicBool,
}

impl<A: Api> LlShort<A> {
    pub fn new(
        comm: &Communicator,
        shared: Arc<LlScratch>,
        grid: LlGrid,
        enabled: bool,
    ) -> Result<LlShort<A>> {
        Ok(LlShort {
            allreduce: load_all(comm, &SHORT_ALLREDUCE)?,
            reduce_scatter: load_all(comm, &SHORT_REDUCE_SCATTER)?,
            allgather: ByType::load(
                comm,
                (&MODULE, SHORT_ALLGATHER),
                (&WIDE_MODULE, SHORT_ALLGATHER_WIDE),
            )?,
            alltoall: ByType::load(
                comm,
                (&MODULE, SHORT_ALLTOALL),
                (&WIDE_MODULE, SHORT_ALLTOALL_WIDE),
            )?,
            enabled: AtomicBool::new(enabled),
            shared,
            grid,
        })
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }
}

/// Whether a short kernel serves `bytes` per rank block launched as `cfg`: one round of
/// `round_bytes`, and a thread per packet unless the backend's kernel serves any grid (the host).
pub(crate) fn short_fits(bytes: u64, round_bytes: u64, cfg: &LaunchConfig, any_grid: bool) -> bool {
    let threads = u64::from(cfg.grid[0]) * u64::from(cfg.block[0]);
    bytes > 0 && bytes <= round_bytes && (any_grid || threads * 8 >= bytes)
}

impl<A: Api> Algorithm<A> for LlShort<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::LlShort
    }

    fn fits(&self, kind: CollectiveKind, block_bytes: u64) -> bool {
        self.enabled.load(Ordering::Relaxed)
            && kind != CollectiveKind::Broadcast
            && short_fits(
                block_bytes,
                self.shared.round_bytes(),
                &self.grid.config(block_bytes),
                self.grid.host,
            )
    }

    /// The grid covers one rank block (the general kernel's covers the larger buffer).
    fn plan(&self, call: &Checked) -> Result<Plan> {
        Ok(Plan::grid(self.grid.config(call.block_bytes)))
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let kernel = match call.kind() {
            CollectiveKind::AllReduce => self.allreduce.get(call)?,
            CollectiveKind::ReduceScatter => self.reduce_scatter.get(call)?,
            CollectiveKind::AllGather => self.allgather.get(call.call.dtype)?,
            CollectiveKind::AllToAll => self.alltoall.get(call.call.dtype)?,
            CollectiveKind::Broadcast => {
                return Err(mscclpp_hal::Error::Internal(
                    "the short LL kernels do not serve broadcast".into(),
                ));
            }
        };
        // SAFETY: the caller's contract.
        unsafe { self.shared.launch(kernel, call, plan.config, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ll::ll_grid;
    use super::*;

    const SLOT: u64 = crate::DEFAULT_SLOT_BYTES;
    const ROUND: u64 = SLOT / 8 * 8 / 2;

    /// An H200: 132 SMs, 1024 threads per block.
    fn h200(bytes: u64, ll_threads: Option<u32>) -> LaunchConfig {
        ll_grid(bytes, SLOT, 256, ll_threads, 132, 1024)
    }

    #[test]
    fn every_one_round_call_gets_a_short_grid_with_the_defaults() {
        // Every size up to one round, odd ones included, for 2-byte and 4-byte elements.
        let mut bytes = 2;
        while bytes <= ROUND {
            let cfg = h200(bytes, None);
            assert!(short_fits(bytes, ROUND, &cfg, false), "{bytes} B: {cfg:?}");
            assert!(cfg.grid[0] <= 132 && cfg.block[0] <= 1024 && cfg.block[0] % 32 == 0);
            bytes = if bytes < 4096 {
                bytes + 2
            } else {
                bytes * 3 / 2 / 4 * 4 + 4
            };
        }
        assert!(short_fits(ROUND, ROUND, &h200(ROUND, None), false));
    }

    #[test]
    fn the_general_kernel_serves_what_a_short_one_cannot() {
        // More than one round, nothing, or a forced block size that leaves threads short.
        assert!(!short_fits(ROUND + 2, ROUND, &h200(ROUND + 2, None), false));
        assert!(!short_fits(0, ROUND, &h200(0, None), false));
        let forced = h200(ROUND, Some(32));
        assert_eq!(forced.block[0], 32);
        assert!(!short_fits(ROUND, ROUND, &forced, false));
        // The host's kernel serves any grid.
        assert!(short_fits(ROUND, ROUND, &LaunchConfig::linear(1, 1), true));
        // A device with few SMs cannot give 1 MiB a thread per packet.
        let small = ll_grid(ROUND, SLOT, 256, None, 8, 1024);
        assert!(!short_fits(ROUND, ROUND, &small, false));
        assert!(short_fits(
            64 << 10,
            ROUND,
            &ll_grid(64 << 10, SLOT, 256, None, 8, 1024),
            false
        ));
    }
}
