//! [`Executor`]: sets up what a plan needs on a communicator (channels, remote buffers, scratch,
//! semaphores, the device plan) once per plan and buffers, then enqueues the interpreter kernel.
//!
//! Set-up is collective: every rank executes the same plan with buffers of the same sizes, as
//! with MSCCL++. It exchanges over the bootstrap and synchronises; later executions with the
//! same plan name and buffers only launch the kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_comm::Communicator;
use mscclpp_comm::proxy::ProxyService;
use mscclpp_comm::semaphore::{Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore};
use mscclpp_hal::dev::{BaseMemoryChannelDeviceHandle, PortChannelDeviceHandle};
use mscclpp_hal::{
    BackendKind, BufferSlice, DataType, DeviceBuffer, DynKernel, DynStream, Error, KernelArgs,
    LaunchConfig, MemoryKind, ReduceOp, Result,
};
use mscclpp_transports::{EndpointConfig, RegisteredMemory, Transport, TransportFlags};

use crate::flat::{FlatBlock, FlatOp, Sizes, flatten};
use crate::kernel::{
    DevicePlan, EXECUTOR_KERNEL, EXECUTOR_MODULE, ExecutorArgs, MAX_THREADS_PER_BLOCK,
    STATE_HEADER_WORDS, switch_table_words,
};
use crate::plan::{BufferType, ChannelType, OpKind, Plan};

/// The element types the device interpreter reduces (`kernels/executor/executor.cu`); the host
/// interpreter reduces every [`DataType`]. Copying plans move any type.
const DEVICE_DTYPES: [DataType; 5] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
];

/// Whether `rank`'s part of `plan` reduces (any `re*`/`rre*` op, pipeline bodies included).
fn reduces(plan: &Plan, rank: usize) -> bool {
    let reducing =
        |k: OpKind| (OpKind::Reduce.code()..=OpKind::ReadReduceSend.code()).contains(&k.code());
    plan.gpus.get(rank).is_some_and(|g| {
        g.threadblocks.iter().flat_map(|tb| &tb.ops).any(|op| {
            reducing(op.kind)
                || op
                    .pipeline
                    .as_ref()
                    .is_some_and(|p| p.ops.iter().any(|o| reducing(o.kind)))
        })
    })
}

/// What of `plan` joins ranks of two hosts but needs one (memory channels, memory access to a
/// peer's buffer, switch channels), named with the ranks and their hosts: the same answer on
/// every rank (`hosts` is every rank's host).
fn crosses_hosts(plan: &Plan, hosts: &[u32]) -> Option<String> {
    let spans = hosts.iter().any(|&h| Some(&h) != hosts.first());
    if !spans {
        return None;
    }
    let host = |r: usize| hosts.get(r).copied().unwrap_or(u32::MAX);
    for (r, gpu) in plan.gpus.iter().enumerate() {
        if let Some(&p) = gpu
            .peers(ChannelType::Memory)
            .iter()
            .find(|&&p| host(p) != host(r))
        {
            return Some(format!(
                "rank {r}'s memory channel to rank {p} (hosts {} and {})",
                host(r),
                host(p)
            ));
        }
        if let Some(b) = gpu
            .remote_buffers
            .iter()
            .find(|b| b.access.contains(&ChannelType::Memory) && host(b.rank) != host(r))
        {
            return Some(format!(
                "rank {r}'s memory access to buffer {} of rank {} (hosts {} and {})",
                b.buffer.name(),
                b.rank,
                host(r),
                host(b.rank)
            ));
        }
        if !gpu.switch_channels().is_empty() {
            return Some(format!(
                "rank {r}'s switch channels, over ranks of {} hosts",
                hosts.iter().collect::<std::collections::HashSet<_>>().len()
            ));
        }
    }
    None
}

/// FIFO slots of an executor context's proxy.
const PROXY_FIFO_SLOTS: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ContextKey {
    plan: String,
    input: (u64, usize),
    output: (u64, usize),
}

/// Runs execution plans on one communicator.
#[derive(Debug)]
pub struct Executor {
    comm: Arc<Communicator>,
    kernel: DynKernel<ExecutorArgs>,
    contexts: Mutex<HashMap<ContextKey, Arc<Context>>>,
}

/// What one (plan, buffers) pair holds. Fields are kept for their lifetime: the device plan
/// points into them.
#[derive(Debug)]
struct Context {
    device_plan: DeviceBuffer,
    /// Threadblocks of the plan (the grid on GPUs; the device plan is not readable from here).
    n_blocks: u32,
    state: DeviceBuffer,
    scratch: DeviceBuffer,
    scratch_bytes: u64,
    double_scratch: bool,
    n_semaphores: u32,
    _memory_semaphores: Vec<Arc<MemoryDevice2DeviceSemaphore>>,
    _registered: Vec<Arc<RegisteredMemory>>,
    _anchor: Option<DeviceBuffer>,
    _proxy: Option<ProxyService>,
}

impl Executor {
    /// An executor on `comm` (loads the interpreter kernel on its device).
    pub fn new(comm: Arc<Communicator>) -> Result<Executor> {
        let kernel = DynKernel::load(&**comm.device(), &EXECUTOR_MODULE, EXECUTOR_KERNEL)?;
        Ok(Executor {
            comm,
            kernel,
            contexts: Mutex::new(HashMap::new()),
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// Enqueues `plan` on `stream` with `send` as the input buffer and `recv` as the output
    /// buffer (their lengths are the plan's input and output sizes; in-place plans take the same
    /// memory twice, or, for an all-gather, `send` inside `recv`). `op` overrides the operator of
    /// every reducing op (`None`: each op's `reduce_op`, sum by default).
    ///
    /// The first execution of a plan with given buffers is a collective set-up (every rank
    /// must make it); later ones only enqueue the kernel, without host synchronisation. The
    /// buffers, and this executor, must stay alive until the stream has passed the execution.
    pub fn execute(
        &self,
        plan: &Plan,
        send: &BufferSlice,
        recv: &BufferSlice,
        dtype: DataType,
        op: Option<ReduceOp>,
        stream: &DynStream,
    ) -> Result<()> {
        // A communicator whose peer died is refused at once (naming the rank); otherwise the
        // waits of this launch poll its abort word, so a peer dying mid-plan ends them too.
        self.comm.check_live()?;
        let _abort = self.comm.abort_scope();
        self.check(plan, send.len(), recv.len(), dtype)?;
        let info = self.comm.device().info();
        let gpu = info.warp_size > 1;
        let key = ContextKey {
            plan: plan.name.clone(),
            input: (send.ptr().0, send.len()),
            output: (recv.ptr().0, recv.len()),
        };
        let cached = self
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let ctx = match cached {
            Some(c) => c,
            None => {
                let c = Arc::new(self.setup(plan, send, recv).map_err(|e| {
                    e.with_context(|| format!("setting up execution plan {}", plan.name))
                })?);
                self.contexts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, c.clone());
                c
            }
        };
        let args = ExecutorArgs {
            plan: ctx.device_plan.ptr().0,
            state: ctx.state.ptr().0,
            input: send.ptr().0,
            output: recv.ptr().0,
            scratch: ctx.scratch.ptr().0,
            scratch_bytes: ctx.scratch_bytes,
            dtype: dtype as u32,
            op: op.map_or(u32::MAX, |o| o as u32),
            double_scratch: u32::from(ctx.double_scratch),
            n_semaphores: ctx.n_semaphores,
            // The scope installed above: the communicator's word.
            abort: mscclpp_hal::dev::current_abort(),
        };
        let blocks = ctx.n_blocks;
        // The host interpreter runs every block on a thread of its own whatever the grid; GPUs
        // get one block per threadblock of the plan.
        let cfg = if gpu {
            let limit = MAX_THREADS_PER_BLOCK.min(info.max_threads_per_block.max(1));
            LaunchConfig::linear(blocks.max(1), plan.threads_per_block.clamp(1, limit))
        } else {
            LaunchConfig::linear(1, 1)
        };
        tracing::debug!(plan = %plan.name, blocks, ?dtype, "execute");
        // SAFETY: the device plan's blocks/ops are read with the same structs it was built
        // from; every address is the caller's buffers (alive until the stream passes the
        // execution, documented above) or this context's memory (held by the executor).
        unsafe { self.kernel.launch(stream, cfg, &args) }
    }

    /// Whether [`Executor::execute`] can run `plan` here with buffers of these sizes and
    /// `dtype`, without setting anything up: the rank count, the message range and chunking
    /// (see [`crate::flat::check_sizes`]), and on GPUs the types the device interpreter reduces,
    /// the threadblocks the device can hold at once, and no NVLS. The answer depends only on the
    /// plan, the sizes, the type and the device, so ranks that agree on those agree on it: what
    /// a caller choosing between a plan and another algorithm asks (the NCCL library does).
    pub fn check(
        &self,
        plan: &Plan,
        input_bytes: usize,
        output_bytes: usize,
        dtype: DataType,
    ) -> Result<()> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        if plan.nranks() != n {
            return Err(Error::invalid(format!(
                "plan {} is for {} ranks but the communicator has {n}",
                plan.name,
                plan.nranks()
            )));
        }
        let info = self.comm.device().info();
        if info.backend != BackendKind::Host {
            // NVLS needs multicast objects, which this build never creates on a GPU; the host
            // backend emulates a switch channel with every member's buffer mapped there.
            let why = format!(
                "NVLS (switch channel) operations run on the host backend only: this build creates no multicast objects on {} devices",
                info.backend
            );
            if let Some(op) = plan.first_multicast_op(rank) {
                return Err(Error::unavailable(
                    format!("multicast operation {op} of plan {}", plan.name),
                    why,
                ));
            }
            if !plan.gpus[rank].switch_channels().is_empty() {
                return Err(Error::unavailable(
                    format!("switch channels of plan {} (rank {rank})", plan.name),
                    why,
                ));
            }
        }
        if info.warp_size > 1 {
            if !DEVICE_DTYPES.contains(&dtype) && reduces(plan, rank) {
                return Err(Error::unavailable(
                    format!("execution plan {} with {dtype} data", plan.name),
                    "the device interpreter reduces f32, f16, bf16, i32 and u32 only",
                ));
            }
            // Blocks wait for each other (barriers, semaphores) and for the peers' blocks: all
            // must be resident at once, one per multiprocessor at most.
            let blocks = plan.gpus[rank].threadblocks.len();
            if info.multiprocessors > 0 && blocks > info.multiprocessors as usize {
                return Err(Error::unavailable(
                    format!(
                        "execution plan {} with {blocks} threadblocks per rank",
                        plan.name
                    ),
                    format!(
                        "{} has {} multiprocessors, and every threadblock of a plan must run at once",
                        info.name, info.multiprocessors
                    ),
                ));
            }
        }
        self.check_hosts(plan)?;
        let sizes = Sizes {
            input: input_bytes as u64,
            output: output_bytes as u64,
        };
        crate::flat::check_sizes(plan, rank, sizes)
    }

    /// Refuses a plan whose memory or switch channels would join ranks of two hosts.
    fn check_hosts(&self, plan: &Plan) -> Result<()> {
        match crosses_hosts(plan, self.comm.bootstrap().hosts()) {
            Some(what) => Err(Error::unavailable(
                format!("execution plan {}: {what}", plan.name),
                "memory and switch channels join ranks of one host (they map the peer's memory); between hosts a plan uses port channels, which run over IB, an NCCL net plugin or Ethernet",
            )),
            None => Ok(()),
        }
    }

    fn setup(&self, plan: &Plan, send: &BufferSlice, recv: &BufferSlice) -> Result<Context> {
        let comm = &*self.comm;
        let (rank, n) = (comm.rank(), comm.nranks());
        if plan.nranks() != n {
            return Err(Error::invalid(format!(
                "plan {} is for {} ranks but the communicator has {n}",
                plan.name,
                plan.nranks()
            )));
        }
        let gpu = &plan.gpus[rank];
        // GPUs never get here with switch channels (`check` refused them).
        let switch = gpu.switch_channels();
        let sizes = Sizes {
            input: send.len() as u64,
            output: recv.len() as u64,
        };
        // `execute` ran `check` (hosts included) before this set-up.
        let flat = flatten(plan, rank, sizes)?;
        let device = comm.device().clone();
        let stream = device.create_stream()?;

        // Scratch, zeroed: packets of flag 0 never match a launch's flag.
        let scratch_bytes = flat.scratch_bytes;
        let scratch = device.alloc((scratch_bytes as usize).max(16), MemoryKind::Device)?;
        stream.fill(&scratch.full(), 0)?;

        // Port channels to the ranks of other hosts take the transport every path between
        // hosts takes (chosen by every rank together, where the communicator spans hosts).
        let hosts = comm.bootstrap().hosts().to_vec();
        let between = if hosts.iter().any(|&h| h != hosts[0]) {
            Some(mscclpp_comm::inter_host_transport(comm, &scratch.full())?)
        } else {
            None
        };
        let ipc = TransportFlags::single(Transport::CudaIpc);
        let flags = between.map_or(ipc, |t| ipc | t);
        let endpoint = |p: usize| match between {
            Some(t) if hosts[p] != hosts[rank] => {
                let mut cfg = EndpointConfig::new(t);
                cfg.connect_timeout = comm.bootstrap().timeout();
                cfg
            }
            _ => EndpointConfig::new(Transport::CudaIpc),
        };

        // Channels: per peer, as many connections (and semaphores) of each type as the larger
        // of the two sides declares, in order, so that both sides pair them the same way.
        let mut memory_semaphores = Vec::new();
        let mut memory_handles = Vec::new();
        let mut port_semaphores: Vec<Arc<Host2DeviceSemaphore>> = Vec::new();
        let mut port_peer_of = Vec::new();
        for ty in [ChannelType::Memory, ChannelType::Port] {
            let mine = gpu.peers(ty);
            let mut by_peer: HashMap<usize, Vec<usize>> = HashMap::new();
            for p in (0..n).filter(|&p| p != rank) {
                let theirs = plan.gpus[p]
                    .peers(ty)
                    .iter()
                    .filter(|&&q| q == rank)
                    .count();
                let ours = mine.iter().filter(|&&q| q == p).count();
                for _ in 0..ours.max(theirs) {
                    let cfg = endpoint(p);
                    let t = cfg.transport;
                    let conn = comm.connect(p, cfg).map_err(|x| {
                        // Which channel of which plan, between which ranks and hosts, over what.
                        let ctx = format!(
                            "plan {}: the {} channel from rank {rank} (host {}) to rank {p} (host {}) over {t}",
                            plan.name,
                            ty.name(),
                            hosts[rank],
                            hosts[p]
                        );
                        match x {
                            Error::Unavailable { what, reason } => Error::Unavailable {
                                what: format!("{what} for {ctx}"),
                                reason,
                            },
                            Error::InvalidUsage(m) => Error::InvalidUsage(format!("{ctx}: {m}")),
                            other => other.with_context(|| ctx),
                        }
                    })?;
                    let slot = match ty {
                        ChannelType::Memory => {
                            memory_semaphores
                                .push(Arc::new(MemoryDevice2DeviceSemaphore::new(comm, &conn)?));
                            memory_semaphores.len() - 1
                        }
                        _ => {
                            port_semaphores.push(Arc::new(Host2DeviceSemaphore::new(comm, conn)?));
                            port_peer_of.push(p);
                            port_semaphores.len() - 1
                        }
                    };
                    by_peer.entry(p).or_default().push(slot);
                }
            }
            if ty == ChannelType::Memory {
                // The j-th memory channel to p takes the j-th semaphore made with p; port
                // channels are paired the same way once the proxy has its memories (below).
                let mut used: HashMap<usize, usize> = HashMap::new();
                for &p in &mine {
                    let j = used.entry(p).or_insert(0);
                    let slot = by_peer[&p][*j];
                    *j += 1;
                    memory_handles.push(BaseMemoryChannelDeviceHandle {
                        semaphore: memory_semaphores[slot].device_handle(),
                    });
                }
            }
        }

        // Local buffers, registered for the peers (CudaIpc within the host, and the transport
        // between hosts where there are others) and the proxy.
        let mut registered = Vec::new();
        let local = |slice: &BufferSlice| -> Result<Option<Arc<RegisteredMemory>>> {
            if slice.is_empty() {
                Ok(None)
            } else {
                Ok(Some(Arc::new(comm.register_memory(slice, flags)?)))
            }
        };
        let locals = [
            local(send)?,
            local(recv)?,
            local(&scratch.full().slice(..scratch_bytes as usize)?)?,
        ];
        let local_of = |b: BufferType| locals[b as usize].clone();

        // Remote buffers: for each peer, what it declares of ours and we declare of its, in
        // order; one exchange per step (an empty message where one side has nothing).
        let mut remote_regs: Vec<Option<Arc<RegisteredMemory>>> =
            vec![None; gpu.remote_buffers.len()];
        for p in (0..n).filter(|&p| p != rank) {
            let sends: Vec<BufferType> = plan.gpus[p]
                .remote_buffers
                .iter()
                .filter(|b| b.rank == rank)
                .map(|b| b.buffer)
                .collect();
            let recvs: Vec<usize> = (0..gpu.remote_buffers.len())
                .filter(|&i| gpu.remote_buffers[i].rank == p)
                .collect();
            for j in 0..sends.len().max(recvs.len()) {
                let out = match sends.get(j) {
                    Some(&b) => local_of(b)
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "rank {p} accesses buffer {} of rank {rank}, which is empty",
                                b.name()
                            ))
                        })?
                        .to_bytes(),
                    None => Vec::new(),
                };
                let got = comm.exchange(p, &out)?;
                if let Some(&i) = recvs.get(j) {
                    if got.is_empty() {
                        return Err(Error::Remote {
                            rank: p,
                            message: format!(
                                "sent no buffer for remote buffer {i} of rank {rank}'s plan"
                            ),
                        });
                    }
                    let mem = RegisteredMemory::from_bytes(comm.context(), &got)?;
                    remote_regs[i] = Some(Arc::new(mem));
                }
            }
        }
        let (switch_members, switch_regs) =
            self.emulated_switch(plan, &switch, &locals, [send, recv, &scratch.full()])?;
        let mut remote_addrs = Vec::with_capacity(remote_regs.len());
        for (i, m) in remote_regs.iter().enumerate() {
            let m = m
                .as_ref()
                .ok_or_else(|| Error::Internal(format!("remote buffer {i} not received")))?;
            let mapped = gpu.remote_buffers[i].access.contains(&ChannelType::Memory);
            remote_addrs.push(match (mapped, m.mapped_slice()) {
                (false, _) => 0,
                (true, Some(s)) => s.ptr().0,
                (true, None) => {
                    return Err(Error::invalid(format!(
                        "remote buffer {i} (rank {}) is not mapped here: memory channels need every rank on one host",
                        m.rank()
                    )));
                }
            });
        }

        // The proxy, where port channels are used.
        let mut remote_ids = vec![u32::MAX; remote_regs.len()];
        let mut local_ids = [u32::MAX; 4];
        let mut port_handles: Vec<PortChannelDeviceHandle> = Vec::new();
        let mut anchor = None;
        let mut proxy = None;
        let any_port = (0..n).any(|p| !plan.gpus[p].peers(ChannelType::Port).is_empty());
        if any_port {
            let mut svc = ProxyService::new(&device, PROXY_FIFO_SLOTS)?;
            let sem_ids = port_semaphores
                .iter()
                .map(|s| svc.add_semaphore(s.clone()))
                .collect::<Result<Vec<_>>>()?;
            for (b, l) in locals.iter().enumerate() {
                if let Some(l) = l {
                    local_ids[b] = svc.add_memory(l.clone())?;
                    registered.push(l.clone());
                }
            }
            for (i, m) in remote_regs.iter().enumerate() {
                if let Some(m) = m
                    && gpu.remote_buffers[i].access.contains(&ChannelType::Port)
                {
                    remote_ids[i] = svc.add_memory(m.clone())?;
                }
            }
            // A port channel handle names a destination of its peer and a local source; ops
            // replace both, so each channel starts with a small anchor buffer of its peer.
            let a = device.alloc(64, MemoryKind::Device)?;
            let mine = Arc::new(comm.register_memory(&a.full(), flags)?);
            let anchor_local = svc.add_memory(mine.clone())?;
            let mut anchor_ids = HashMap::new();
            for p in (0..n).filter(|&p| p != rank) {
                let linked = plan.gpus[rank].peers(ChannelType::Port).contains(&p)
                    || plan.gpus[p].peers(ChannelType::Port).contains(&rank);
                if linked {
                    let theirs = Arc::new(comm.exchange_memory(&mine, p)?);
                    anchor_ids.insert(p, svc.add_memory(theirs.clone())?);
                    registered.push(theirs);
                }
            }
            registered.push(mine);
            let mut used: HashMap<usize, usize> = HashMap::new();
            for &p in &gpu.peers(ChannelType::Port) {
                // The j-th port channel to p takes the j-th semaphore made with p.
                let j = used.entry(p).or_insert(0);
                let slot = (0..port_semaphores.len())
                    .filter(|&s| port_peer_of[s] == p)
                    .nth(*j)
                    .ok_or_else(|| Error::Internal(format!("no port semaphore {j} with {p}")))?;
                *j += 1;
                port_handles.push(svc.port_channel(sem_ids[slot], anchor_ids[&p], anchor_local)?);
            }
            svc.start()?;
            anchor = Some(a);
            proxy = Some(svc);
        }
        registered.extend(remote_regs.into_iter().flatten());
        registered.extend(locals.into_iter().flatten());
        registered.extend(switch_regs);

        // Semaphores and barriers: the state block; then, for the host interpreter, the
        // emulated switch channels' member addresses.
        let n_semaphores = gpu.semaphores.len();
        let mut state_words = vec![0u64; STATE_HEADER_WORDS + n_semaphores];
        for (i, v) in gpu.semaphores.iter().enumerate() {
            state_words[STATE_HEADER_WORDS + i] = u64::from(*v);
        }
        state_words.extend(switch_table_words(&switch_members));
        let state = device.alloc(state_words.len() * 8, MemoryKind::Device)?;
        stream.write_from_host(&state.full(), &words_bytes(&state_words))?;

        // The device plan: header, blocks, ops, channel tables, remote tables.
        let device_plan = upload_plan(
            &device,
            &*stream,
            &flat.blocks,
            &flat.ops,
            &memory_handles,
            &port_handles,
            &remote_addrs,
            &remote_ids,
            local_ids,
        )?;
        stream.synchronize()?;
        // Nobody writes into a peer's scratch before the peer has zeroed it.
        comm.bootstrap().barrier()?;
        tracing::debug!(
            plan = %plan.name, rank, blocks = flat.blocks.len(), ops = flat.ops.len(),
            memory_channels = memory_handles.len(), port_channels = port_handles.len(),
            scratch_bytes, "execution plan set up"
        );
        Ok(Context {
            device_plan,
            n_blocks: flat.blocks.len() as u32,
            state,
            scratch,
            scratch_bytes,
            double_scratch: plan.double_scratch,
            n_semaphores: n_semaphores as u32,
            _memory_semaphores: memory_semaphores,
            _registered: registered,
            _anchor: anchor,
            _proxy: proxy,
        })
    }
}

impl Executor {
    /// The host backend's switch channels: for channel `c` of this rank, the address of its
    /// buffer in every member of its rank group (group order), this rank's own included.
    ///
    /// A multicast group of the HAL would want page-granular buffers bound whole; a plan's
    /// buffers are the caller's, of any size, so each member's buffer is mapped here through
    /// the same IPC registration as remote buffers (what the HAL's host emulation does inside a
    /// group). Collective: per pair of ranks and buffer type, one exchange when either side has
    /// a switch channel over that buffer that holds the other, in the same order on both sides.
    #[allow(clippy::type_complexity)]
    fn emulated_switch(
        &self,
        plan: &Plan,
        switch: &[(BufferType, u64, Vec<usize>)],
        locals: &[Option<Arc<RegisteredMemory>>; 3],
        bases: [&BufferSlice; 3],
    ) -> Result<(Vec<Vec<u64>>, Vec<Arc<RegisteredMemory>>)> {
        let comm = &*self.comm;
        let (rank, n) = (comm.rank(), comm.nranks());
        let any_switch = (0..n).any(|p| !plan.gpus[p].switch_channels().is_empty());
        if !any_switch {
            return Ok((Vec::new(), Vec::new()));
        }
        // Whether rank `x` has a switch channel over buffer `b` whose group holds rank `y`.
        let needs = |x: usize, y: usize, b: BufferType| {
            plan.gpus[x]
                .switch_channels()
                .iter()
                .any(|(bt, _, ranks)| *bt == b && ranks.contains(&y))
        };
        let types = [BufferType::Input, BufferType::Output, BufferType::Scratch];
        let mut mapped: HashMap<(usize, BufferType), u64> = HashMap::new();
        let mut regs = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            for b in types {
                let (mine, theirs) = (needs(rank, p, b), needs(p, rank, b));
                if !mine && !theirs {
                    continue;
                }
                let out = match (&locals[b as usize], theirs) {
                    (Some(l), true) => l.to_bytes(),
                    _ => Vec::new(),
                };
                let got = comm.exchange(p, &out)?;
                if !mine {
                    continue;
                }
                if got.is_empty() {
                    return Err(Error::Remote {
                        rank: p,
                        message: format!(
                            "has no buffer {} for a switch channel of rank {rank}'s plan {} (empty)",
                            b.name(),
                            plan.name
                        ),
                    });
                }
                let mem = Arc::new(RegisteredMemory::from_bytes(comm.context(), &got)?);
                let addr = mem.mapped_slice().map(|s| s.ptr().0).ok_or_else(|| {
                    Error::invalid(format!(
                        "buffer {} of rank {p} is not mapped here: emulated switch channels need every member on one host",
                        b.name()
                    ))
                })?;
                mapped.insert((p, b), addr);
                regs.push(mem);
            }
        }
        let mut members = Vec::with_capacity(switch.len());
        for (c, (b, _, ranks)) in switch.iter().enumerate() {
            let mut addrs = Vec::with_capacity(ranks.len());
            for &q in ranks {
                let a = if q == rank {
                    bases[*b as usize].ptr().0
                } else {
                    *mapped.get(&(q, *b)).ok_or_else(|| {
                        Error::Internal(format!(
                            "switch channel {c}: buffer {} of rank {q} was not exchanged",
                            b.name()
                        ))
                    })?
                };
                addrs.push(a);
            }
            members.push(addrs);
        }
        tracing::debug!(
            plan = %plan.name, rank, switch_channels = switch.len(),
            "switch channels emulated over mapped peer buffers"
        );
        Ok((members, regs))
    }
}

fn words_bytes(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_of<T: Copy>(items: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(items);
    let mut out = vec![0u8; n];
    // SAFETY: `T` is one of this crate's `#[repr(C)]` plain-data records (no implicit padding
    // that would be uninitialised: each declares its padding as fields), read as `n` bytes.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr().cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

#[allow(clippy::too_many_arguments)]
fn upload_plan(
    device: &Arc<dyn mscclpp_hal::Device>,
    stream: &DynStream,
    blocks: &[FlatBlock],
    ops: &[FlatOp],
    memory: &[BaseMemoryChannelDeviceHandle],
    port: &[PortChannelDeviceHandle],
    remote_addrs: &[u64],
    remote_ids: &[u32],
    local_ids: [u32; 4],
) -> Result<DeviceBuffer> {
    let parts: [Vec<u8>; 6] = [
        bytes_of(blocks),
        bytes_of(ops),
        bytes_of(memory),
        bytes_of(port),
        bytes_of(remote_addrs),
        bytes_of(remote_ids),
    ];
    let header = std::mem::size_of::<DevicePlan>().next_multiple_of(64);
    let mut offsets = [0usize; 6];
    let mut at = header;
    for (i, p) in parts.iter().enumerate() {
        offsets[i] = at;
        at = (at + p.len()).next_multiple_of(64);
    }
    let buf = device.alloc(at, MemoryKind::Device)?;
    let base = buf.ptr().0;
    let count = |n: usize, what: &str| {
        u32::try_from(n).map_err(|_| Error::invalid(format!("{n} {what} in one plan")))
    };
    let head = DevicePlan {
        n_blocks: count(blocks.len(), "threadblocks")?,
        n_ops: count(ops.len(), "operations")?,
        blocks: base + offsets[0] as u64,
        ops: base + offsets[1] as u64,
        memory_channels: base + offsets[2] as u64,
        port_channels: base + offsets[3] as u64,
        remote_addrs: base + offsets[4] as u64,
        remote_ids: base + offsets[5] as u64,
        local_ids,
        n_memory: count(memory.len(), "memory channels")?,
        n_port: count(port.len(), "port channels")?,
        n_remote: count(remote_addrs.len(), "remote buffers")?,
        _pad: 0,
    };
    let mut image = vec![0u8; at];
    image[..std::mem::size_of::<DevicePlan>()].copy_from_slice(head.as_bytes());
    for (i, p) in parts.iter().enumerate() {
        image[offsets[i]..offsets[i] + p.len()].copy_from_slice(p);
    }
    stream.write_from_host(&buf.full(), &image)?;
    Ok(buf)
}
