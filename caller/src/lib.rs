//! # mscclpp-caller — the caller side the C library and the Python package share
//!
//! Both front ends take a caller's call — raw pointers or arrays, a stream handle or none, a
//! count — and turn it into work of the collectives on the caller's stream. Everything between
//! the front end's own types and [`mscclpp_collectives::Collectives`] is here, once:
//!
//! - **streams** ([`Caller::stream`]): a borrowed native handle is wrapped once per
//!   communicator and cached; handle 0 is the device's legacy default stream. The host backend
//!   has no native streams: there a call names none and runs on the communicator's own stream,
//!   and returns once it has run ([`Caller::finish`]);
//! - **caller memory** ([`Caller::wrap`]): a pointer and a byte count become a buffer of the
//!   communicator's device, not owned, kept per communicator so that steady-state calls on the
//!   same buffers neither query the driver nor allocate ([`memory`]);
//! - **sizes** ([`buffer_bytes`]): the input and output bytes of a collective, checked for
//!   overflow, from [`CollectiveKind::buffer_elements`];
//! - **who serves the ranks** ([`Caller::new`]): one rank copies; the ranks of one host take the
//!   collectives; ranks on several hosts take the hierarchical ones where they can; otherwise no
//!   collectives, and [`Caller::no_collectives`] says why (the C library then falls back);
//! - **what a call asks for** ([`Tuning`], [`Caller::collective_tuned`]): an algorithm, and
//!   whether the policy's choice may serve where that one cannot;
//! - **reduce** ([`Caller::reduce`], `reduce.rs`): NCCL's rooted reduction as chunked
//!   all-reduces into a sink the communicator allocates once;
//! - **registration** ([`Caller::register`], `windows.rs`): caller buffers mapped into every
//!   peer where every rank can export its own, else recorded on every rank;
//! - **point to point** ([`Caller::send_recv`]): a group's sends and receives, or with one rank
//!   the copies between its sends and receives to itself;
//! - **execution plans** ([`Caller::run_plan`]): a plan runs on buffers of the library, arranged
//!   as the plan says (in place or not), between two copies on the caller's stream, inside the
//!   communicator's launch order.
//!
//! The front ends reach the collectives only through these methods (there is no accessor for
//! them), so each rule above is written once.
//!
//! What stays in the front ends is theirs alone: the C ABI, its handle registry and groups; the
//! Python objects, array protocols and the GIL.
#![deny(unsafe_op_in_unsafe_fn)]

mod completion;
pub mod memory;
mod plans;
mod reduce;
mod streams;
mod suspend;
mod windows;

use std::sync::{Arc, RwLock, RwLockReadGuard};

pub use mscclpp::typed::expert_exchange;
use mscclpp_collectives::{
    AnyCollectives, CollectiveCall, CollectiveKind, DEFAULT_SLOT_BYTES, MAX_RANKS, P2pKind, P2pOp,
};
use mscclpp_comm::Communicator;
use mscclpp_comm::proxy::ProxyObserver;
use mscclpp_hal::{
    BackendKind, BufferSlice, DataType, DeviceBuffer, DynStream, Error, ReduceOp, Result, Stream,
};

pub use memory::memory_freed;
pub use mscclpp_collectives::{AlgorithmId, Window};
pub use plans::MAX_STAGED;
pub use reduce::{REDUCE_CHUNK_BYTES, ReduceCall};
pub use suspend::MemStats;

/// One communicator's caller side: its collectives (or why there are none), its own stream,
/// the wrapped streams of its callers and the staged buffers of its plans.
#[derive(Debug)]
pub struct Caller {
    comm: Arc<Communicator>,
    /// The collectives (`None` without them, and while suspended). Written only by
    /// [`Caller::suspend`] and [`Caller::resume`], which NCCL's contract keeps apart from the
    /// communicator's operations.
    colls: RwLock<Option<Box<dyn AnyCollectives>>>,
    /// Whether this communicator has collectives at all (fixed at creation).
    has_colls: bool,
    /// Suspension and memory accounting ([`Caller::suspend`]).
    mem: suspend::MemState,
    no_colls: Option<String>,
    internal: Arc<dyn Stream>,
    streams: streams::StreamCache,
    memory: memory::WrapCache,
    plans: plans::PlanStage,
    /// Where a reduce leaves its chunks on the ranks other than the root (with collectives).
    reduce_sink: Option<DeviceBuffer>,
    /// The observer of the inter-host proxy ([`Caller::observe_proxy`]), kept for a resume.
    proxy_observer: std::sync::OnceLock<Arc<dyn ProxyObserver>>,
    /// The last call finished, where a completion record is kept ([`completion`]).
    completion: Option<Arc<completion::Completion>>,
    host: bool,
}

impl Caller {
    /// The caller side of `comm` (collective over its ranks: the collectives connect them).
    pub fn new(comm: Arc<Communicator>) -> Result<Caller> {
        let n = comm.nranks();
        let boot = comm.bootstrap();
        let hosts = boot.hosts();
        let one_host = hosts.iter().all(|&h| h == hosts[comm.rank()]);
        let start = mscclpp_hal::memory::allocated_here();
        let (colls, no_colls) = if n == 1 {
            // No collectives to set up (operations are copies), but the same settings are
            // refused as with several ranks.
            mscclpp_collectives::check_env()?;
            (None, None)
        } else if !one_host {
            // Across hosts: the hierarchical collectives, unless this layout or backend is one
            // they cannot serve (the same answer on every rank: it depends on the host table and
            // the backend only).
            match typed_collectives(comm.clone()) {
                Ok(c) => (Some(c), None),
                Err(e @ (Error::InvalidUsage(_) | Error::Unavailable { .. })) => (
                    None,
                    Some(format!(
                        "the ranks are on several hosts and the multi-host collectives cannot serve them: {e}"
                    )),
                ),
                Err(e) => return Err(e),
            }
        } else if n > MAX_RANKS {
            mscclpp_collectives::check_env()?;
            (
                None,
                Some(format!(
                    "{n} ranks: mscclpp's collectives serve at most {MAX_RANKS}"
                )),
            )
        } else {
            (Some(typed_collectives(comm.clone())?), None)
        };
        if let Some(why) = &no_colls {
            tracing::info!("no native collectives for this communicator: {why}");
        }
        let colls_bytes = mscclpp_hal::memory::allocated_here() - start;
        let memory = memory::WrapCache::from_env()?;
        let internal = comm.device().create_stream()?;
        let host = comm.device().info().backend == BackendKind::Host;
        let reduce_sink = match &colls {
            Some(_) => Some(reduce::sink(&**comm.device())?),
            None => None,
        };
        let completion = if completion::Completion::wanted()? {
            Some(completion::Completion::attach(&comm)?)
        } else {
            None
        };
        let total = mscclpp_hal::memory::allocated_here() - start;
        Ok(Caller {
            memory,
            reduce_sink,
            plans: plans::PlanStage::new(),
            comm,
            has_colls: colls.is_some(),
            colls: RwLock::new(colls),
            mem: suspend::MemState::new(colls_bytes, total - colls_bytes),
            no_colls,
            internal,
            streams: streams::StreamCache::default(),
            completion,
            proxy_observer: std::sync::OnceLock::new(),
            host,
        })
    }

    /// The watchdog's verdict (`MSCCLPP_WATCHDOG_SECONDS`, [`completion`]): where this rank's
    /// streams have finished nothing for that long with a call outstanding, a line saying so
    /// and naming the ranks behind this one (surveyed once per stall); `None` while they keep
    /// up, without a watchdog, or when no rank is behind (the stall is this rank's own).
    pub fn stalled(&self) -> Result<Option<String>> {
        let Some((c, after)) = self
            .completion
            .as_ref()
            .and_then(|c| Some((c, c.watchdog()?)))
        else {
            return Ok(None);
        };
        let boot = self.comm.bootstrap();
        let verdict = c.stalled(after, || boot.laggards(SURVEY_WAIT));
        Ok(verdict.and_then(|(done, stuck, behind)| {
            behind.map(|b| {
                format!(
                    "watchdog: call #{} has not completed after {:.1} s (MSCCLPP_WATCHDOG_SECONDS); {b}",
                    done + 1,
                    stuck.as_secs_f64()
                )
            })
        }))
    }

    /// Tells `observer` of the work of the proxy that carries this communicator's inter-host
    /// transfers, now and after a resume (a profiler's proxy events; once per communicator);
    /// `false` where no proxy serves (one host, no collectives).
    pub fn observe_proxy(&self, observer: Arc<dyn ProxyObserver>) -> Result<bool> {
        if self.proxy_observer.set(observer.clone()).is_err() {
            return Err(Error::invalid(
                "the communicator's proxy already has an observer",
            ));
        }
        match self.live()?.as_ref() {
            Some(c) => c.observe_proxy(observer),
            None => Ok(false),
        }
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// Why several ranks have no collectives (`None` with collectives, or with one rank).
    pub fn no_collectives(&self) -> Option<&str> {
        self.no_colls.as_deref()
    }

    /// Whether the collectives serve these ranks (several ranks, see [`Caller::new`]).
    pub fn has_collectives(&self) -> bool {
        self.has_colls
    }

    /// The collectives, read-locked for a call (`None` without them or while suspended).
    fn colls(&self) -> RwLockReadGuard<'_, Option<Box<dyn AnyCollectives>>> {
        // A panic while holding the lock leaves the option itself consistent.
        self.colls.read().unwrap_or_else(|p| p.into_inner())
    }

    /// As [`Caller::colls`] for an operation: refused while the communicator is suspended.
    fn live(&self) -> Result<RwLockReadGuard<'_, Option<Box<dyn AnyCollectives>>>> {
        let g = self.colls();
        if self.has_colls && g.is_none() {
            return Err(suspend::suspended_error());
        }
        Ok(g)
    }

    /// `Ok` where collectives-level work runs natively (one rank, or collectives); else the
    /// error a front end without a fallback returns, naming `what` and why.
    pub fn require(&self, what: &str) -> Result<()> {
        if self.serves() {
            Ok(())
        } else {
            Err(self.unavailable(what))
        }
    }

    /// The algorithm the collectives take for `kind` at `block_bytes` per rank block (`None`
    /// without collectives).
    pub fn algorithm(&self, kind: CollectiveKind, block_bytes: u64) -> Option<AlgorithmId> {
        self.colls()
            .as_ref()
            .map(|c| c.algorithm(kind, block_bytes))
    }

    /// Whether the ranks span hosts and the hierarchical collectives serve them.
    pub fn spans_hosts(&self) -> bool {
        self.colls().as_ref().is_some_and(|c| c.hosts().is_some())
    }

    /// Whether the collectives use the short-message kernels (see
    /// `Collectives::use_short_kernels`); nothing without collectives.
    pub fn use_short_kernels(&self, on: bool) {
        if let Some(c) = self.colls().as_ref() {
            c.use_short_kernels(on);
        }
    }

    /// Whether collectives-level work can run natively: one rank (copies) or collectives.
    pub fn serves(&self) -> bool {
        self.has_colls || self.comm.nranks() == 1
    }

    /// Whether the device is the host backend's (no native streams; calls complete on return).
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// The communicator's own stream.
    pub fn internal(&self) -> &Arc<dyn Stream> {
        &self.internal
    }

    /// The stream a call runs on. `handle`: the caller's native stream (`Some(0)`: the legacy
    /// default stream), or `None` for none named. On the host backend only none (or 0) is
    /// accepted, and the call runs on the communicator's own stream.
    pub fn stream(&self, handle: Option<u64>) -> Result<Arc<dyn Stream>> {
        if self.host {
            return match handle {
                None | Some(0) => Ok(self.internal.clone()),
                Some(h) => Err(Error::invalid(format!(
                    "stream {h:#x}: the host backend has no native streams; name none (the call runs on the communicator's own stream and returns once done)"
                ))),
            };
        }
        // SAFETY: the front ends' contract with their callers (NCCL's, and the Python
        // package's documented one): a named handle is a live stream of the communicator's
        // device that outlives the calls made on it; 0 is the legacy default stream.
        unsafe {
            self.streams
                .get_or_wrap(&**self.comm.device(), handle.unwrap_or(0))
        }
    }

    /// The caller's `bytes` at `ptr` as a buffer of the communicator's device (not owned, not
    /// copied): the wrapper of an earlier call on the same range where one is kept.
    ///
    /// # Safety
    /// `bytes` of memory of the communicator's device at `ptr` (host memory on the host
    /// backend) that stay allocated until every call using the buffer has run on its stream.
    pub unsafe fn wrap(&self, ptr: u64, bytes: usize) -> Result<DeviceBuffer> {
        // SAFETY: forwarded contract.
        unsafe { self.memory.wrap(&**self.comm.device(), ptr, bytes) }
    }

    /// The caller's `bytes` at `ptr` as a slice for a call: of a kept wrapper of the range, or
    /// of a kept allocation that holds it (then neither a driver query nor an allocation); a
    /// range outside both is checked and its allocation learnt, as [`Caller::wrap`] does.
    ///
    /// # Safety
    /// As for [`Caller::wrap`].
    pub unsafe fn wrap_slice(&self, ptr: u64, bytes: usize) -> Result<BufferSlice> {
        // SAFETY: forwarded contract.
        unsafe { self.memory.wrap_slice(&**self.comm.device(), ptr, bytes) }
    }

    /// A call's input and output as slices ([`Caller::wrap_slice`]); an in-place call (the
    /// same range) takes one cache look-up for both.
    ///
    /// # Safety
    /// As for [`Caller::wrap`], for both ranges.
    pub unsafe fn wrap_pair(
        &self,
        (input, in_bytes): (u64, usize),
        (output, out_bytes): (u64, usize),
    ) -> Result<(BufferSlice, BufferSlice)> {
        let device = &**self.comm.device();
        // SAFETY: forwarded contract.
        let i = unsafe { self.memory.wrap_slice(device, input, in_bytes)? };
        if (output, out_bytes) == (input, in_bytes) {
            return Ok((i.clone(), i));
        }
        // SAFETY: forwarded contract.
        let o = unsafe { self.memory.wrap_slice(device, output, out_bytes)? };
        Ok((i, o))
    }

    /// Ends a call enqueued on `stream`: on the host backend it waits for it (its callers have
    /// no stream of their own to wait on); on GPUs it returns at once.
    pub fn finish(&self, stream: &DynStream) -> Result<()> {
        if self.host {
            stream.synchronize()
        } else {
            Ok(())
        }
    }

    /// Runs `enqueue` in the communicator's launch order on `stream` (the order every launch
    /// of its collectives keeps across streams), or at once without collectives.
    pub fn ordered<T>(&self, stream: &DynStream, enqueue: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.live()?.as_ref() {
            Some(c) => c.ordered(stream, enqueue),
            None => enqueue(),
        }
    }

    /// Enqueues a collective on `stream` (then [`Caller::finish`]): the collectives' with
    /// several ranks, a copy with one (nothing in place). Several ranks without collectives
    /// are an error saying why (a front end that can fall back checks
    /// [`Caller::no_collectives`] first).
    pub fn collective(&self, call: &CollectiveCall<'_>, stream: &DynStream) -> Result<()> {
        let bytes = call.input.len().max(call.output.len()) as u64;
        self.noted(call.kind.name(), bytes, stream, || {
            match self.live()?.as_ref() {
                Some(c) => c.run(call, stream)?,
                None if self.comm.nranks() > 1 => {
                    return Err(self.unavailable(call.kind.name()));
                }
                None if call.input.ptr() != call.output.ptr() => {
                    stream.copy(call.output, call.input)?
                }
                None => {}
            }
            self.finish(stream)
        })
    }

    /// Runs `call` as this rank's next call (`op` over `bytes`, noted for its peers' surveys:
    /// see [`mscclpp_comm::bootstrap::Bootstrap::survey`]); a call that waited past its
    /// deadline fails naming the ranks behind this one and their last calls, as their event
    /// loops answer. Where a completion record is kept, `stream` stores the call's number
    /// once it has done the call's work.
    fn noted<T>(
        &self,
        op: &str,
        bytes: u64,
        stream: &DynStream,
        call: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let boot = self.comm.bootstrap();
        let seq = boot.note_call(op, bytes);
        // The completion record, where kept and the call is not captured.
        let counted = match &self.completion {
            Some(c) if c.issue(stream, seq)? => Some(c),
            _ => None,
        };
        let done = call().and_then(|t| {
            if let Some(c) = counted {
                c.mark(stream, seq)?;
            }
            Ok(t)
        });
        if let (Some(c), Err(_)) = (counted, &done) {
            c.withdraw(seq);
        }
        done.map_err(|e| match e {
            Error::Timeout { waiting_for, after } => {
                let behind = boot.laggards(SURVEY_WAIT).map_or_else(
                    || "; every rank has issued as many calls as this one".to_string(),
                    |l| format!("; {l}"),
                );
                Error::Timeout {
                    waiting_for: format!("{waiting_for} ({op}){behind}"),
                    after,
                }
            }
            other => other,
        })
    }

    /// As [`Caller::collective`], with the algorithm `tuning` asks for (see [`Tuning`]).
    pub fn collective_tuned(
        &self,
        call: &CollectiveCall<'_>,
        tuning: Tuning,
        stream: &DynStream,
    ) -> Result<()> {
        tuning.apply(call.kind, |algorithm| {
            self.collective(&(*call).algorithm(algorithm), stream)
        })
    }

    /// Enqueues a group of sends and receives as one launch on `stream` (then
    /// [`Caller::finish`]); with one rank, each send to itself lands in the matching receive.
    pub fn send_recv(&self, ops: &[P2pOp<'_>], stream: &DynStream) -> Result<()> {
        let bytes = ops.iter().map(|o| o.bytes as u64).sum();
        self.noted("send/recv", bytes, stream, || {
            match self.live()?.as_ref() {
                Some(c) => c.send_recv(ops, stream)?,
                None if self.comm.nranks() > 1 => return Err(self.unavailable("send/recv")),
                None => self_copies(ops, stream)?,
            }
            self.finish(stream)
        })
    }

    /// Enqueues execution `plan` with `send` as its input and `recv` as its output (the
    /// caller's memory, in place or not: the plan runs on staged buffers arranged as it says)
    /// on `stream`, inside the communicator's launch order; then [`Caller::finish`]. `Ok(false)`
    /// when [`MAX_STAGED`] (plan, size) pairs are staged already (nothing was enqueued).
    pub fn run_plan(
        &self,
        plan: &mscclpp_executor::Plan,
        send: &BufferSlice,
        recv: &BufferSlice,
        dtype: DataType,
        op: Option<ReduceOp>,
        stream: &DynStream,
    ) -> Result<bool> {
        let bytes = send.len().max(recv.len()) as u64;
        // The plan's name as the operation (no allocation per call).
        self.noted(&plan.name, bytes, stream, || {
            let ran = self.ordered(stream, || {
                self.plans
                    .run(&self.comm, plan, send, recv, dtype, op, stream)
            })?;
            if ran {
                self.finish(stream)?;
            }
            Ok(ran)
        })
    }

    /// The communicator's plan executor, made at its first use (it loads its kernel).
    pub fn executor(&self) -> Result<Arc<mscclpp_executor::Executor>> {
        self.plans.executor(&self.comm)
    }

    /// Whether `plan` can run here with buffers of these sizes and `dtype` (see
    /// [`mscclpp_executor::Executor::check`]); makes the executor on first use.
    pub fn check_plan(
        &self,
        plan: &mscclpp_executor::Plan,
        input_bytes: usize,
        output_bytes: usize,
        dtype: DataType,
    ) -> Result<()> {
        self.plans
            .executor(&self.comm)?
            .check(plan, input_bytes, output_bytes, dtype)
    }

    /// Records `tuning`'s launch event, if any, on `stream` (after the call's work there).
    ///
    /// # Safety
    /// The event is a live event of the communicator's device (the front end's contract with
    /// its caller).
    pub unsafe fn record_launch(&self, tuning: Tuning, stream: &DynStream) -> Result<()> {
        match tuning.launch_event {
            // SAFETY: forwarded contract.
            Some(e) => unsafe { stream.record_native_event(e) },
            None => Ok(()),
        }
    }

    /// `root` is a rank of the communicator, or an error naming `what`.
    fn check_root(&self, what: &str, root: usize) -> Result<()> {
        let n = self.comm.nranks();
        if root < n {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{what}: root {root} is not a rank of {n}"
            )))
        }
    }

    fn unavailable(&self, what: &str) -> Error {
        Error::unavailable(
            what,
            self.no_colls
                .clone()
                .unwrap_or_else(|| "no collectives for this communicator".into()),
        )
    }
}

/// The algorithm a call asks for, and what happens where it cannot serve the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The algorithm asked for (`None`: the policy's choice).
    pub algorithm: Option<AlgorithmId>,
    /// Where that algorithm cannot serve the call, take the policy's choice instead of failing.
    /// The collectives refuse such an algorithm (`InvalidUsage`) before they enqueue anything,
    /// and every rank gets the same answer for the same call, so the ranks still agree.
    pub fallback: bool,
    /// A caller's native event (`cudaEvent_t`) to record on the call's stream once the call is
    /// enqueued (NCCL's `launchCompletionEvent`); the front end records it
    /// ([`Caller::record_launch`]).
    pub launch_event: Option<u64>,
}

impl Tuning {
    /// Runs `launch` with the algorithm asked for, then (see [`Tuning::fallback`]) with none.
    fn apply(
        self,
        kind: CollectiveKind,
        mut launch: impl FnMut(Option<AlgorithmId>) -> Result<()>,
    ) -> Result<()> {
        match (self.algorithm, launch(self.algorithm)) {
            (Some(a), Err(e)) if self.fallback && matches!(e, Error::InvalidUsage(_)) => {
                tracing::info!(
                    target: "mscclpp_caller::tuning",
                    "{}: the {a} algorithm the call asked for cannot serve it ({e}); the policy chooses",
                    kind.name()
                );
                launch(None)
            }
            (_, r) => r,
        }
    }
}

/// How long a call that timed out waits for its peers' answers to the survey naming the ranks
/// behind it.
const SURVEY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The collectives of `comm` over its backend's own types (the facade's erasure point,
/// [`mscclpp::typed`]), with the default LL slots.
pub fn typed_collectives(comm: Arc<Communicator>) -> Result<Box<dyn AnyCollectives>> {
    mscclpp::typed::collectives(comm, DEFAULT_SLOT_BYTES)
}

/// Input and output bytes of `kind` for `count` elements of `dtype` per rank block over
/// `nranks`, or an error naming the overflow.
pub fn buffer_bytes(
    kind: CollectiveKind,
    count: usize,
    dtype: DataType,
    nranks: usize,
) -> Result<(usize, usize)> {
    let overflow = || {
        Error::invalid(format!(
            "{}: {count} elements of {dtype} per rank over {nranks} ranks overflow the address space",
            kind.name()
        ))
    };
    // `buffer_elements` multiplies by the rank count: that product must not wrap.
    if (count as u64).checked_mul(nranks as u64).is_none() {
        return Err(overflow());
    }
    let (i, o) = kind.buffer_elements(count as u64, nranks as u64);
    let bytes = |e: u64| {
        e.checked_mul(dtype.size() as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(overflow)
    };
    Ok((bytes(i)?, bytes(o)?))
}

/// One rank: the k-th send to itself lands in the k-th receive from itself (same sizes).
fn self_copies(ops: &[P2pOp<'_>], stream: &DynStream) -> Result<()> {
    let sends: Vec<&P2pOp> = ops.iter().filter(|o| o.kind == P2pKind::Send).collect();
    let recvs: Vec<&P2pOp> = ops.iter().filter(|o| o.kind == P2pKind::Recv).collect();
    if sends.len() != recvs.len() {
        return Err(Error::invalid(format!(
            "{} sends and {} receives in a group of one rank: each send needs its receive in the same group",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.iter().zip(&recvs) {
        if s.bytes != r.bytes {
            return Err(Error::invalid(format!(
                "a send of {} bytes and its receive of {} bytes: they must have the same size",
                s.bytes, r.bytes
            )));
        }
        if s.buffer.ptr() != r.buffer.ptr() {
            stream.copy(r.buffer, s.buffer)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
