//! LL128 lines: the LL scheme with 120 data bytes and one flag word per 128-byte line, written
//! and read by a group of eight threads at once; all-reduce of one round, through the LL scratch
//! (whose LL128 halves exist only where this runs).
//!
//! A line is only safe where the device delivers it whole: `Capabilities::ll128` (NVIDIA over
//! NVLink; the host, whose kernel orders each line's flag after its data), and on GPUs only for
//! two ranks on their own devices, the configuration verified correct. With four ranks on two
//! GPUs a line was once seen with its flag but not all of its data (docs/performance.md).
//!
//! The kernel is an entry point of the LL modules (`ll/module.rs`: `kernels/collectives/ll.cu`,
//! and `ll_wide.cu` for the wide element types, loaded at their first call) and takes their
//! [`LlCollectiveArgs`]; its host kernel is [`host`].
//!
#![doc = include_str!("spec.md")]

use std::sync::Arc;

use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, DeviceInfo, LaunchConfig, Result, TypedKernel};

pub(crate) mod host;

use super::base::{Algorithm, ByType, LazyKernel, Plan, block_threads, load};
use super::id::AlgorithmId;
use super::ll::args::{LL128_LINE_BYTES, LL128_LINE_DATA_BYTES};
use super::ll::module::{LL128_ALLREDUCE, LL128_ALLREDUCE_WIDE, MODULE, WIDE_MODULE};
use super::ll::{LlCollectiveArgs, LlScratch};
use crate::CollectiveKind;
use crate::call::Checked;

/// The LL128 kernel and its block size, before the LL scratch exists.
pub(crate) type Candidate<A> = (TypedKernel<LlCollectiveArgs, A>, u32);

/// The LL128 kernel where every rank can use it, decided alike on every rank (a collective
/// call: a rank that sends lines to one expecting packets would hang it). `ll_threads` is
/// `MSCCLPP_LL_THREADS`.
pub(crate) fn candidate<A: Api>(
    comm: &Communicator,
    slot_bytes: u64,
    ll_threads: Option<u32>,
) -> Result<Option<Candidate<A>>> {
    let device = comm.device();
    let mine = if device.info().caps.ll128 && slot_bytes % LL128_LINE_BYTES == 0 {
        match load(comm, &MODULE, LL128_ALLREDUCE) {
            Ok(k) => {
                let threads = block_threads(device.info(), &**k.kernel(), ll_threads, 512);
                Some((k, threads))
            }
            Err(e) => {
                tracing::info!("LL128 all-reduce unavailable: {e}");
                None
            }
        }
    } else {
        None
    };
    let identity = {
        let info = device.info();
        let id = info
            .pci_bus_id
            .clone()
            .unwrap_or_else(|| info.ordinal.to_string());
        format!("{}:{}:{}", u8::from(mine.is_some()), info.backend, id)
    };
    let all = comm.bootstrap().all_gather(identity.as_bytes())?;
    let everywhere = all.iter().all(|v| v.first() == Some(&b'1'));
    let devices: Vec<&[u8]> = all.iter().map(|v| v.get(2..).unwrap_or_default()).collect();
    let own_devices = (1..devices.len()).all(|i| !devices[..i].contains(&devices[i]));
    let line_safe = device.info().warp_size == 1 || (comm.nranks() == 2 && own_devices);
    Ok(mine.filter(|_| everywhere && line_safe))
}

#[derive(Debug)]
pub(crate) struct Ll128<A: Api> {
    shared: Arc<LlScratch>,
    /// The base types' kernel and the wide types' (loaded at their first call).
    kernels: ByType<LlCollectiveArgs, A>,
    /// Threads per block of the base kernel (within its limit); a wide kernel's are within
    /// its own too (a multiple of 8, a line's group of threads, as the limit is of 32).
    threads: u32,
    /// Bytes a call carries at most (one round).
    round_bytes: u64,
    info: DeviceInfo,
}

impl<A: Api> Ll128<A> {
    pub fn new(
        comm: &Communicator,
        shared: Arc<LlScratch>,
        (kernel, threads): Candidate<A>,
    ) -> Result<Ll128<A>> {
        Ok(Ll128 {
            round_bytes: LlCollectiveArgs::ll128_round_bytes_of(shared.slot_bytes()),
            info: comm.device().info().clone(),
            kernels: ByType::new(
                kernel,
                LazyKernel::new(comm, &WIDE_MODULE, LL128_ALLREDUCE_WIDE)?,
            ),
            shared,
            threads,
        })
    }

    /// The kernel of `call`'s element type and its threads per block.
    fn kernel(&self, call: &Checked) -> Result<(&TypedKernel<LlCollectiveArgs, A>, u32)> {
        self.kernels.with_threads(call.call.dtype, self.threads)
    }
}

impl<A: Api> Algorithm<A> for Ll128<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Ll128
    }

    fn fits(&self, kind: CollectiveKind, block_bytes: u64) -> bool {
        kind == CollectiveKind::AllReduce && block_bytes <= self.round_bytes
    }

    /// A group of eight threads per line, up to one block per SM, threads looping over lines
    /// beyond that.
    fn plan(&self, call: &Checked) -> Result<Plan> {
        if self.info.warp_size == 1 {
            return Ok(Plan::grid(LaunchConfig::linear(1, 1)));
        }
        let (_, threads) = self.kernel(call)?;
        let lines = call.block_bytes.div_ceil(LL128_LINE_DATA_BYTES);
        let blocks = (lines * 8)
            .div_ceil(u64::from(threads))
            .clamp(1, u64::from(self.info.multiprocessors.max(1)));
        Ok(Plan::grid(LaunchConfig::linear(blocks as u32, threads)))
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let (kernel, _) = self.kernel(call)?;
        // SAFETY: the caller's contract.
        unsafe { self.shared.launch(kernel, call, plan.config, stream) }
    }
}
