//! A communicator's collectives: the algorithms set up on it, the policy choosing among them,
//! and the one entry point every caller shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_comm::Communicator;
use mscclpp_comm::proxy::ProxyObserver;
use mscclpp_hal::{Api, BufferSlice, DataType, Error, ReduceOp, Result};

use crate::CollectiveKind;
use crate::algorithms::base::MAX_RANKS;

use crate::agree::agree;
use crate::algorithms::base::Algorithm;
use crate::algorithms::ce::Ce;
use crate::algorithms::direct::Direct;
use crate::algorithms::hier::{Hier, Topology};
use crate::algorithms::id::AlgorithmId;
use crate::algorithms::ll::{Ll, LlGrid, LlScratch};
use crate::algorithms::ll_short::LlShort;
use crate::algorithms::ll128::{self, Ll128};
use crate::algorithms::p2p::{P2p, P2pOp};
use crate::algorithms::read::Read;
use crate::call::{self, CollectiveCall};
use crate::order::LaunchOrder;
use crate::policy::{Policy, REGISTERED_READ_RANGE, Settings, Tuning};
use crate::window::Window;

/// Packet bytes of one LL scratch slot: 2 MiB of packets carry 1 MiB of data per peer per round
/// (so an LL all-reduce up to 1 MiB takes one round).
pub const DEFAULT_SLOT_BYTES: u64 = 2 << 20;

/// The collectives of one communicator (all ranks create it together).
#[derive(Debug)]
pub struct Collectives<A: Api> {
    comm: Arc<Communicator>,
    /// The communicator's device as backend `A`'s (the launches' ordering events).
    device: Arc<A::Device>,
    policy: Policy,
    /// Single-host parts: `None` on a communicator that spans hosts.
    ll: Option<Ll<A>>,
    ll_short: Option<LlShort<A>>,
    /// Where every rank can use it.
    ll128: Option<Ll128<A>>,
    /// Where the backend has the kernels.
    direct: Option<Direct<A>>,
    read: Option<Read<A>>,
    /// The copy-engine algorithm (every backend: it launches no kernel).
    ce: Option<Ce<A>>,
    /// Sends and receives.
    p2p: Option<P2p<A>>,
    /// A communicator that spans hosts: the hierarchical collectives serve every call.
    hier: Option<Box<Hier<A>>>,
    /// All-reduces that read a registered input in place ([`Collectives::zero_copy_calls`]).
    zero_copy: AtomicU64,
    /// Keeps launches on different streams from overlapping.
    order: LaunchOrder<A>,
}

/// Checks the `MSCCLPP_*` variables the collectives read (`MSCCLPP_ALGO_*`, thread and packet
/// counts, sizes) without setting anything up: communicators that make no collectives (one rank,
/// too many ranks) refuse a malformed value at creation as the others do.
pub fn check_env() -> Result<()> {
    Settings::from_env().map(drop)
}

impl<A: Api> Collectives<A> {
    /// Sets up the collectives of `comm` over backend `A`'s own types (a collective call: every
    /// rank makes it). `comm`'s device must be an `A` device; the front ends, which pick the
    /// backend at run time, make them through the caller's erasure point instead.
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        Self::with_slot_bytes(comm, DEFAULT_SLOT_BYTES)
    }

    /// As [`Collectives::new`] with a chosen LL slot size (tests use small slots to exercise
    /// messages that take many rounds).
    pub fn with_slot_bytes(comm: Arc<Communicator>, slot_bytes: u64) -> Result<Self> {
        Self::on_backend(comm, slot_bytes)
    }

    /// As [`Collectives::with_slot_bytes`], launching on backend `A`'s own types: `comm`'s
    /// device must be an `A` device, and the streams the calls come on `A` streams. Over a
    /// backend's `Api` the launch path has no downcast from [`Collectives::run`] to the vendor
    /// call (the chosen algorithm is still reached through `&dyn Algorithm<A>`).
    pub fn on_backend(comm: Arc<Communicator>, slot_bytes: u64) -> Result<Self> {
        let device = A::device_of(comm.device())?;
        if let Some(topo) = Topology::of(&comm)? {
            return Self::hierarchical(comm, device, slot_bytes, topo);
        }
        let (rank, n) = (comm.rank(), comm.nranks());
        if !(2..=MAX_RANKS).contains(&n) {
            return Err(Error::invalid(format!(
                "collectives serve 2 to {MAX_RANKS} ranks of one node; this communicator has {n}"
            )));
        }
        if slot_bytes < 16 || slot_bytes % 16 != 0 {
            return Err(Error::invalid(format!(
                "slot of {slot_bytes} bytes: a positive multiple of 16 is needed"
            )));
        }
        let mut settings = Settings::from_env()?;
        // The choice by size follows this backend's measurements (a CPU's costs are not a GPU's).
        settings.policy.tuning = Tuning::of(comm.device().info().backend);
        // The short kernels' switch is not agreed: they interoperate with the general ones.
        agree(
            &comm,
            "collective settings",
            format!(
                "slot {slot_bytes} B, algorithms {:?} ({:?} thresholds), copy engines by size \
                 from {:?} B, LL threads {:?}, LL packets per block {}",
                settings.policy.choices,
                settings.policy.tuning,
                settings.policy.ce_from,
                settings.ll_threads,
                settings.ll_packets_per_block
            ),
        )?;
        let ll128 = ll128::candidate(&comm, slot_bytes, settings.ll_threads)?;
        let shared = LlScratch::new(&comm, slot_bytes, ll128.is_some())?;
        let direct = Direct::setup(&comm, &settings)?;
        let read = Read::setup(&comm, &settings)?;
        let ce = Ce::setup(&comm, &settings)?;
        let info = comm.device().info();
        let grid = LlGrid {
            slot_bytes,
            packets_per_block: settings.ll_packets_per_block,
            threads: settings.ll_threads,
            multiprocessors: info.multiprocessors,
            max_threads_per_block: info.max_threads_per_block,
            host: info.warp_size == 1,
        };
        let ll = Ll::new(&comm, shared.clone(), grid)?;
        let ll_short = LlShort::new(&comm, shared.clone(), grid, settings.ll_short)?;
        let ll128 = ll128.map(|c| Ll128::new(&comm, shared, c)).transpose()?;
        let p2p = P2p::setup(&comm, slot_bytes)?;
        // Nobody writes into a peer's scratch before that peer has zeroed it.
        comm.bootstrap().barrier()?;
        tracing::debug!(rank, nranks = n, slot_bytes, "collectives ready");
        Ok(Collectives {
            comm,
            device,
            policy: settings.policy,
            ll: Some(ll),
            ll_short: Some(ll_short),
            ll128,
            direct,
            read,
            ce: Some(ce),
            p2p: Some(p2p),
            hier: None,
            zero_copy: AtomicU64::new(0),
            order: LaunchOrder::default(),
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    fn get(&self, id: AlgorithmId) -> Option<&dyn Algorithm<A>> {
        match id {
            AlgorithmId::Ll => self.ll.as_ref().map(|a| a as &dyn Algorithm<A>),
            AlgorithmId::LlShort => self.ll_short.as_ref().map(|a| a as &dyn Algorithm<A>),
            AlgorithmId::Hier => None,
            AlgorithmId::Ll128 => self.ll128.as_ref().map(|a| a as &dyn Algorithm<A>),
            AlgorithmId::Direct => self.direct.as_ref().map(|a| a as &dyn Algorithm<A>),
            AlgorithmId::Read => self.read.as_ref().map(|a| a as &dyn Algorithm<A>),
            AlgorithmId::Ce => self.ce.as_ref().map(|a| a as &dyn Algorithm<A>),
        }
    }

    /// The algorithm that serves `kind` for rank blocks of `block_bytes` on this rank.
    pub fn algorithm(&self, kind: CollectiveKind, block_bytes: u64) -> AlgorithmId {
        if self.hier.is_some() {
            return AlgorithmId::Hier;
        }
        self.policy.choose(kind, block_bytes, |id| {
            self.get(id).is_some_and(|a| a.fits(kind, block_bytes))
        })
    }

    /// Enqueues `call` on `stream`: checks it, lets the policy pick the algorithm and launches
    /// that algorithm's kernel. No host synchronisation; the buffers must stay allocated until
    /// the stream has passed the call. Calls on different streams run one after the other in
    /// the order they were made, as NCCL orders the work of a communicator.
    pub fn run(&self, call: &CollectiveCall, stream: &A::Stream) -> Result<()> {
        let backend = self.comm.device().info().backend;
        let checked = call::check(call, self.comm.rank(), self.comm.nranks(), backend)?;
        if let Some(hier) = &self.hier {
            return self.run_hier(hier, &checked, stream);
        }
        let id = match call.algorithm {
            Some(id) => self.asked(id, call.kind, checked.block_bytes)?,
            None => self.chosen(call, &checked),
        };
        let algorithm = self
            .get(id)
            .ok_or_else(|| Error::Internal(format!("{id} was chosen but is not set up")))?;
        debug_assert_eq!(algorithm.id(), id);
        let plan = algorithm.plan(&checked)?;
        let _abort = self.live_scope()?;
        self.order.run(&self.device, stream, || {
            // SAFETY: `checked` was checked against this communicator just above and `plan`
            // planned by the same algorithm; the caller keeps the buffers alive (documented
            // above).
            unsafe { algorithm.launch(&checked, &plan, stream) }
        })
    }

    /// The algorithm a call asked for ([`CollectiveCall::algorithm`]), where it serves the call
    /// here; the short LL kernels stand in for LL (they run its protocol) where they fit.
    fn asked(
        &self,
        id: AlgorithmId,
        kind: CollectiveKind,
        block_bytes: u64,
    ) -> Result<AlgorithmId> {
        let fits = |id| {
            self.get(id)
                .is_some_and(|a: &dyn Algorithm<A>| a.fits(kind, block_bytes))
        };
        if id == AlgorithmId::Ll && fits(AlgorithmId::LlShort) {
            return Ok(AlgorithmId::LlShort);
        }
        if fits(id) {
            return Ok(id);
        }
        Err(Error::invalid(format!(
            "{}: the call asks for the {id} algorithm, which {} here",
            kind.name(),
            if self.get(id).is_none() {
                format!(
                    "is not set up on the {} backend",
                    self.comm.device().info().backend
                )
            } else {
                format!(
                    "does not serve {} of {block_bytes}-byte blocks",
                    kind.name()
                )
            }
        )))
    }

    /// The policy's algorithm for `call` (or the zero-copy read path).
    fn chosen(&self, call: &CollectiveCall, checked: &call::Checked) -> AlgorithmId {
        match self.zero_copy_read(call, checked.block_bytes, checked.in_bytes) {
            Some(id) => {
                self.zero_copy.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    count = call.count,
                    bytes = checked.block_bytes,
                    "all-reduce reads the registered input in place (zero copy)"
                );
                id
            }
            None => self.algorithm(call.kind, checked.block_bytes),
        }
    }

    /// The read algorithm for an all-reduce whose input is registered here, when the caller
    /// promised symmetric registration ([`CollectiveCall::registered`]), the algorithm is chosen
    /// by size and the size is one where reading in place pays ([`REGISTERED_READ_RANGE`]).
    fn zero_copy_read(
        &self,
        call: &CollectiveCall,
        block_bytes: u64,
        in_bytes: u64,
    ) -> Option<AlgorithmId> {
        let read = self.read.as_ref()?;
        (call.registered
            && call.kind == CollectiveKind::AllReduce
            && self.policy.is_auto(call.kind)
            && REGISTERED_READ_RANGE.contains(&block_bytes)
            && read.fits(call.kind, block_bytes)
            && read.holds(call.input.ptr().0, in_bytes))
        .then_some(AlgorithmId::Read)
    }

    /// All-reduces so far that read a registered input in place instead of a copy (the
    /// zero-copy path of [`CollectiveCall::registered`]): what tests and benchmarks check.
    pub fn zero_copy_calls(&self) -> u64 {
        self.zero_copy.load(Ordering::Relaxed)
    }

    /// Enqueues a group of sends and receives of this rank on `stream` (NCCL's `ncclSend` and
    /// `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`; one operation alone is a group
    /// too): one kernel, in which no operation waits for another, so any pattern whose every
    /// send has its receive (in the same order per pair) completes — gather, scatter,
    /// all-to-all-v, rings, hypercubes. Not a collective call: only the ranks named exchange.
    /// No host synchronisation; the buffers must stay allocated until the stream has passed
    /// the call.
    pub fn send_recv(&self, ops: &[P2pOp], stream: &A::Stream) -> Result<()> {
        let p2p = self.p2p.as_ref().ok_or_else(|| {
            Error::unavailable(
                "sends and receives",
                "this communicator spans hosts; point-to-point is served within one host only",
            )
        })?;
        let _abort = self.live_scope()?;
        self.order.run(&self.device, stream, || {
            // SAFETY: the caller keeps the buffers alive (documented above).
            unsafe { p2p.run(&self.comm, ops, stream) }
        })
    }

    /// Runs `enqueue` (work of this communicator that keeps state between calls, enqueued on
    /// `stream` by another component, e.g. an execution plan on staged buffers) in the same
    /// order as the collectives: after every earlier call, whatever stream it came on.
    /// `enqueue` must not call back into these collectives.
    pub fn ordered<T>(&self, stream: &A::Stream, enqueue: impl FnOnce() -> Result<T>) -> Result<T> {
        self.order.run(&self.device, stream, enqueue)
    }

    /// Refuses a communicator whose peer died (naming the rank), else installs its abort word
    /// for the waits of the kernels this thread launches while the scope lives.
    fn live_scope(&self) -> Result<mscclpp_hal::dev::AbortScope> {
        self.comm.check_live()?;
        Ok(self.comm.abort_scope())
    }

    /// Lets one-round all-reduce, reduce-scatter, all-gather and all-to-all calls take the short
    /// kernels (`true`, the default unless `MSCCLPP_LL_SHORT=0`) or keeps them on the general LL
    /// kernel. A per-rank choice, for measurements and debugging: ranks may differ, since both
    /// kernels run the same protocol. Takes effect from the next call.
    pub fn use_short_kernels(&self, on: bool) {
        if let Some(s) = &self.ll_short {
            s.set_enabled(on);
        }
    }

    /// Registers `slice` with every rank's collectives (a collective call: every rank registers
    /// one buffer of its own, in the same order on every rank). All-reduces whose input lies in a
    /// registered buffer let the peers read it where it is instead of a copy — when the read
    /// algorithm is forced, or when the call promises symmetric registration
    /// ([`CollectiveCall::registered`]) and its size is one where that pays; the IPC mappings
    /// are made here, once. The buffer stays alive until [`Collectives::deregister`].
    pub fn register(&self, slice: &BufferSlice) -> Result<Window> {
        self.register_mapped(slice, None)
    }

    /// As [`Collectives::register`], with every rank's buffer already mapped here by the caller
    /// (`mapped[r]`: rank `r`'s address and length; a symmetric window's flat range), so that
    /// no IPC mapping is made; the mappings must outlive the window.
    pub fn register_mapped(
        &self,
        slice: &BufferSlice,
        mapped: Option<&[(u64, u64)]>,
    ) -> Result<Window> {
        if self.hier.is_some() {
            return Err(Error::unavailable(
                "registering a buffer with the collectives",
                "this communicator spans hosts; registration is served within one host only",
            ));
        }
        let read = self.read.as_ref().ok_or_else(|| {
            Error::unavailable(
                "registering a buffer with the collectives",
                format!(
                    "the {} backend has no read all-reduce kernel",
                    self.comm.device().info().backend
                ),
            )
        })?;
        read.register(&self.comm, slice, mapped)
    }

    /// Deregisters a window (a collective call, in the same order on every rank). Every call
    /// that used it must have finished on its stream, on every rank.
    pub fn deregister(&self, window: Window) -> Result<()> {
        let read = self
            .read
            .as_ref()
            .ok_or_else(|| Error::invalid("deregister: no buffer was ever registered here"))?;
        read.deregister(&self.comm, window)
    }

    /// `output = reduce(op, input of every rank)`; `count` elements each. In place when both
    /// slices are the same memory.
    pub fn all_reduce(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &A::Stream,
    ) -> Result<()> {
        let call = CollectiveCall::new(CollectiveKind::AllReduce, input, output, count, dtype);
        self.run(&call.op(op), stream)
    }

    /// `output` (`nranks * count` elements) = every rank's `input` (`count`), by rank.
    pub fn all_gather(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &A::Stream,
    ) -> Result<()> {
        let call = CollectiveCall::new(CollectiveKind::AllGather, input, output, count, dtype);
        self.run(&call, stream)
    }

    /// `output` (`count`) = reduction over ranks of block `rank` of `input` (`nranks * count`).
    pub fn reduce_scatter(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &A::Stream,
    ) -> Result<()> {
        let call = CollectiveCall::new(CollectiveKind::ReduceScatter, input, output, count, dtype);
        self.run(&call.op(op), stream)
    }

    /// `output` = `input` of `root` (`count` elements; only the root's input is read).
    pub fn broadcast(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &A::Stream,
    ) -> Result<()> {
        let call = CollectiveCall::new(CollectiveKind::Broadcast, input, output, count, dtype);
        self.run(&call.root(root), stream)
    }

    /// Block `p` of `output` = block `rank` of rank `p`'s `input` (`nranks * count` each).
    pub fn all_to_all(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &A::Stream,
    ) -> Result<()> {
        let call = CollectiveCall::new(CollectiveKind::AllToAll, input, output, count, dtype);
        self.run(&call, stream)
    }
}

/// Communicators that span hosts (`algorithms/hier/spec.md`).
impl<A: Api> Collectives<A> {
    /// The hierarchical collectives of `comm`, which spans hosts as `topo` says (a collective
    /// call, as [`Collectives::new`]).
    fn hierarchical(
        comm: Arc<Communicator>,
        device: Arc<A::Device>,
        slot_bytes: u64,
        topo: Topology,
    ) -> Result<Self> {
        if slot_bytes < 16 || slot_bytes % 16 != 0 {
            return Err(Error::invalid(format!(
                "slot of {slot_bytes} bytes: a positive multiple of 16 is needed"
            )));
        }
        let settings = Settings::from_env()?;
        let hier = Hier::setup(&comm, topo, slot_bytes)?;
        // Nobody's proxy writes into a peer before that peer has set up.
        comm.bootstrap().barrier()?;
        tracing::debug!(
            rank = comm.rank(),
            nranks = comm.nranks(),
            hosts = topo.hosts,
            per_host = topo.per_host,
            "hierarchical collectives ready"
        );
        Ok(Collectives {
            comm,
            device,
            policy: settings.policy,
            ll: None,
            ll_short: None,
            ll128: None,
            direct: None,
            read: None,
            ce: None,
            p2p: None,
            hier: Some(Box::new(hier)),
            zero_copy: AtomicU64::new(0),
            order: LaunchOrder::default(),
        })
    }

    /// Tells `observer` of the work of the proxy that carries this communicator's inter-host
    /// transfers (a profiler's proxy events); `false` where no proxy serves (one host).
    pub fn observe_proxy(&self, observer: Arc<dyn ProxyObserver>) -> Result<bool> {
        match &self.hier {
            Some(h) => h.observe(observer).map(|()| true),
            None => Ok(false),
        }
    }

    /// Hosts and ranks per host when this communicator spans hosts (`None` on one host).
    pub fn hosts(&self) -> Option<(usize, usize)> {
        self.hier.as_ref().map(|h| (h.topo.hosts, h.topo.per_host))
    }

    fn run_hier(&self, hier: &Hier<A>, checked: &call::Checked, stream: &A::Stream) -> Result<()> {
        let _abort = self.live_scope()?;
        self.order.run(&self.device, stream, || {
            // SAFETY: `checked` was checked against this communicator; the caller keeps the
            // buffers alive (as for every call of [`Collectives::run`]).
            unsafe { hier.run(checked, stream) }
        })
    }
}
