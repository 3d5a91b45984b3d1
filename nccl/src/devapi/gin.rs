//! GIN (GPU-initiated networking) of NCCL's device API, served through the *proxy* GIN type:
//! device code that a client compiled against NCCL's headers writes descriptors ("GFDs") into
//! queues of host memory the device can write, one queue per (context, peer); a thread of this
//! library finds them by their flag bits, performs each (a copy into the peer's symmetric
//! memory, a signal added into the peer's signal array, a counter bumped here), and tells the
//! device how many it finished (`cis`). The device structures are NCCL's facts (offsets and bit
//! positions from its public headers, 2.30.3 to 2.32.6); the service is ours.
//!
//! A peer of this rank's LSA team (its host) has its memory mapped in this process's symmetric
//! space, so a put to it is a copy on a stream of ours and a signal a one-thread kernel adding
//! at system scope after it. A peer on another host is reached through the transport between
//! hosts ([`super::hosts`]): puts are writes into its registration of the window, signals and
//! gets records its proxy serves.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp::hal::{
    DeviceBuffer, DevicePtr, Kernel, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig,
    MemoryKind, Stream,
};

use super::hosts::{Hosts, Record, kind};
use super::space::Space;
use crate::error::{Failure, Res};

/// The signal-add kernel.
const SIGNAL_ADD: KernelId = KernelId("mscclpp_gin_signal_add");

/// The module of the proxy's one kernel (`kernels/nccl/gin.cu`).
pub static MODULE: KernelModule = KernelModule {
    name: "nccl/gin.cu",
    source: include_str!("../../../kernels/nccl/gin.cu"),
    headers: &[],
    kernels: &[KernelDef::new::<GinAddArgs>(SIGNAL_ADD.0, host_signal_add)],
};

/// Arguments of `mscclpp_gin_signal_add`, mirrored in `kernels/nccl/gin.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GinAddArgs {
    /// Device address of the u64 to add to (8-byte aligned).
    pub addr: u64,
    /// What to add.
    pub value: u64,
}

// SAFETY: repr(C), two u64, no padding; every bit pattern is valid.
unsafe impl KernelArgs for GinAddArgs {}

/// The host backend's signal add: the address is host memory of this process (the symmetric
/// space maps every rank's memory here).
fn host_signal_add(_cfg: &LaunchConfig, args: &[u8]) -> mscclpp::hal::Result<()> {
    let word = |i: usize| {
        args.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| mscclpp::hal::Error::invalid("gin signal add: short arguments"))
    };
    let (addr, value) = (word(0)?, word(1)?);
    if addr == 0 || addr % 8 != 0 {
        return Err(mscclpp::hal::Error::invalid(format!(
            "gin signal add: address {addr:#x} is not an aligned u64"
        )));
    }
    // SAFETY: the proxy checked that the word lies in a mapped symmetric memory of this
    // process (`Proxy::signal_addr`, `Proxy::resolve`); other ranks add to it atomically too.
    unsafe { AtomicU64::from_ptr(addr as *mut u64).fetch_add(value, Ordering::AcqRel) };
    Ok(())
}

/// The first client version GIN is served to, and why not where it is not: NCCL itself serves
/// no GIN to 2.29 clients; the per-context struct of 2.32.0 to 2.32.2 was not checked.
pub fn context_stride(version: u32) -> Result<usize, String> {
    match version {
        23003..=23004 => Ok(48),
        23005..=23199 => Ok(72),
        23203..=23299 => Ok(80),
        v if v < 23003 => Err(format!(
            "a client built against NCCL {} asks for GIN, which this library serves to clients of NCCL 2.30.3 on (the proxy descriptors of 2.28 and 2.29 have another format): rebuild against 2.30.3 or newer",
            super::layout::version_name(v)
        )),
        v => Err(format!(
            "a client built against NCCL {} asks for GIN; this library lays GIN out for 2.30.3 to 2.31.x and 2.32.3 to 2.32.6",
            super::layout::version_name(v)
        )),
    }
}

/// Offsets in the per-context proxy struct (`ncclGinProxyGpuCtx_t`; the last three from 2.30.5,
/// `flushesAllPutsOnAnySignal` from 2.32.3), checked against NCCL's headers by
/// `nccl/tests/devapi_layout.rs`.
pub mod ctx {
    /// `int nranks`.
    pub const NRANKS: usize = 0;
    /// `uint32_t queueSize`.
    pub const QUEUE_SIZE: usize = 4;
    /// `ncclGinProxyGfd_t* queues`.
    pub const QUEUES: usize = 8;
    /// `uint32_t* pis`.
    pub const PIS: usize = 16;
    /// `uint32_t* cis`.
    pub const CIS: usize = 24;
    /// `uint64_t* counters`.
    pub const COUNTERS: usize = 32;
    /// `uint64_t* signals`.
    pub const SIGNALS: usize = 40;
    /// `uint64_t* signalOffsets`.
    pub const SIGNAL_OFFSETS: usize = 48;
    /// `uint32_t* lastIssuedGet`.
    pub const LAST_ISSUED_GET: usize = 56;
    /// `uint32_t* lastVisibleGet`.
    pub const LAST_VISIBLE_GET: usize = 64;
    /// `bool flushesAllPutsOnAnySignal`.
    pub const FLUSHES_ALL_PUTS: usize = 72;
}

/// The ops of a GFD (`ncclGinProxyOp_t` bits).
pub mod op {
    /// `ncclGinProxyOpPut`.
    pub const PUT: u64 = 0x01;
    /// `ncclGinProxyOpWithInline`.
    pub const INLINE: u64 = 0x02;
    /// `ncclGinProxyOpWithCounter`.
    pub const COUNTER: u64 = 0x04;
    /// `ncclGinProxyOpWithSignalInc`.
    pub const SIGNAL_INC: u64 = 0x08;
    /// `ncclGinProxyOpWithSignalAdd`.
    pub const SIGNAL_ADD: u64 = 0x10;
    /// `ncclGinProxyOpVASignal`.
    pub const VA_SIGNAL: u64 = 0x20;
    /// `ncclGinProxyOpGet`.
    pub const GET: u64 = 0x40;
    /// `ncclGinProxyOpFlush`.
    pub const FLUSH: u64 = 0x80;
}

/// Bytes of a queue slot (`ncclGinProxyGfd_t`: 16 qwords; version 3 writes only the first 8).
pub const SLOT: usize = 128;
/// Descriptors taken from one queue in one pass (so that one busy queue starves none).
const BATCH: usize = 32;
/// How long the proxy waits for its stream before it gives up and raises the abort flag.
const STREAM_DEADLINE: Duration = Duration::from_secs(60);

/// One decoded descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gfd {
    /// The header's version (1: 2.30.3, 2: 2.30.7 to 2.32.3, 3: 2.32.6).
    pub version: u32,
    /// Op bits.
    pub op: u64,
    /// Bytes.
    pub size: u64,
    /// Put: source (offset, handle); get: remote; VA signal: the signal's.
    pub src: (u64, u64),
    /// Put: destination (offset, handle); get: local.
    pub dst: (u64, u64),
    /// Counter id.
    pub counter: u32,
    /// Signal id.
    pub signal: u32,
    /// Signal value (Add).
    pub signal_value: u64,
    /// The inline value's bytes (little-endian), for `INLINE`.
    pub inline: u64,
}

impl Gfd {
    /// Decodes the qwords of one slot (flag bits set; reserved bits masked).
    pub fn decode(q: &[u64; 16]) -> Gfd {
        let h = |w: u64| w >> 1;
        let op = (q[7] >> 8) & 0xFFFF;
        // An inline put carries its value where a put carries its source.
        let (src, inline) = if op & op::INLINE != 0 {
            let v = ((q[1] >> 8) & 0xFFFF_FFFF)
                | ((q[1] >> 40) & 0xFFFF) << 32
                | ((q[2] >> 8) & 0xFFFF) << 48;
            ((0, 0), v)
        } else {
            ((h(q[1]), h(q[2])), 0)
        };
        Gfd {
            version: ((q[0] >> 1) & 0xF) as u32,
            size: q[0] >> 7,
            op,
            src,
            dst: (h(q[3]), h(q[4])),
            counter: ((q[5] >> 1) & 0x7F_FFFF) as u32,
            signal: ((q[5] >> 24) & 0xFF_FFFF) as u32,
            signal_value: (q[5] >> 48)
                | ((q[6] >> 8) & 0xFFFF) << 16
                | ((q[6] >> 24) & 0xFFFF_FFFF) << 32,
            inline,
        }
    }

    /// Encodes (what the device's `postGfd` writes): `version` 2 or 3 qword layout, flag bits
    /// set. The inverse of [`Gfd::decode`]; `nccl/tests/devapi_layout.rs` compares it with
    /// qwords built through the bitfields of NCCL's own headers.
    pub fn encode(&self) -> [u64; 16] {
        let mut q = [1u64; 16];
        q[0] = 1 | u64::from(self.version & 0xF) << 1 | self.size << 7;
        let inline = self.op & op::INLINE != 0;
        if inline {
            q[1] = 1 | (self.inline & 0xFFFF_FFFF) << 8 | ((self.inline >> 32) & 0xFFFF) << 40;
            q[2] = 1 | ((self.inline >> 48) & 0xFFFF) << 8;
        } else {
            q[1] = 1 | self.src.0 << 1;
            q[2] = 1 | self.src.1 << 1;
        }
        q[3] = 1 | self.dst.0 << 1;
        q[4] = 1 | self.dst.1 << 1;
        q[5] = 1
            | u64::from(self.counter & 0x7F_FFFF) << 1
            | u64::from(self.signal & 0xFF_FFFF) << 24
            | (self.signal_value & 0xFFFF) << 48;
        q[6] = 1 | ((self.signal_value >> 16) & 0xFFFF) << 8 | (self.signal_value >> 32) << 24;
        q[7] = 1 | (self.op & 0xFFFF) << 8;
        q
    }
}

/// What `ncclDevCommCreate` decided for GIN.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Contexts.
    pub contexts: usize,
    /// Slots per queue (a power of two).
    pub queue: usize,
    /// Signals per context (every requirement's).
    pub signals: usize,
    /// Counters per context.
    pub counters: usize,
    /// Bytes of the client's per-context struct.
    pub ctx_stride: usize,
    /// Byte offset of the signal arrays in the resource allocation (context-major).
    pub signals_at: usize,
}

/// The memory of one device communicator's GIN, and its proxy thread.
#[derive(Debug)]
pub struct Gin {
    /// The per-context structs (`ginHandles[0]`).
    pub contexts: DeviceBuffer,
    /// The abort word (`abortFlag`): raised by the proxy when it fails.
    pub abort: DeviceBuffer,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    // Kept alive while the thread runs (and after: the device may still read them).
    _keep: Vec<DeviceBuffer>,
}

impl Drop for Gin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The host memory a proxy reads and writes, as raw words (host-mapped allocations).
struct Words {
    queues: *mut u64,
    cis: *mut u32,
    counters: *mut u64,
    abort: *mut u32,
}

// SAFETY: the pointers name host-mapped allocations that `Gin` keeps alive until the proxy
// thread has been joined; only the proxy thread writes `cis`, `counters` (besides the device)
// and the slots it has taken.
unsafe impl Send for Words {}

/// The proxy of one device communicator.
struct Proxy {
    space: Arc<Space>,
    /// The ranks of other hosts (`None` where one host holds every rank).
    hosts: Option<Hosts>,
    /// Every (rank, handle)'s registration for the transport between hosts, looked up once.
    registered: HashMap<(usize, u64), Arc<mscclpp::transports::RegisteredMemory>>,
    shape: Shape,
    rank: usize,
    nranks: usize,
    /// The resource allocation's offset in every slot of the space.
    resources_offset: usize,
    words: Words,
    stream: Arc<dyn Stream>,
    kernel: Arc<dyn Kernel>,
    /// Every (member, handle)'s mapping, wrapped once.
    wrapped: HashMap<(usize, u64), DeviceBuffer>,
    /// Descriptors taken from each queue (context-major).
    seen: Vec<u32>,
    /// Descriptors finished per queue.
    done: Vec<u32>,
}

/// One descriptor taken, waiting for its stream work.
struct Taken {
    queue: usize,
    counter: Option<usize>,
}

impl Gin {
    /// Allocates the GIN memory of a device communicator, writes its per-context structs and
    /// starts its proxy. `resources_offset`: where the devcomm's resource allocation sits in
    /// the space's slots (the signals are in it, `shape.signals_at` bytes in).
    pub fn start(space: &Arc<Space>, shape: Shape, resources_offset: usize) -> Res<Gin> {
        let comm = space.communicator();
        let device = comm.device();
        let (rank, n) = (comm.rank(), comm.nranks());
        let (c, q, s, k) = (shape.contexts, shape.queue, shape.signals, shape.counters);
        let host = |bytes: usize| -> Res<DeviceBuffer> {
            let b = device.alloc(bytes.max(8), MemoryKind::HostMapped)?;
            let p = b
                .host_ptr()
                .ok_or_else(|| Failure::internal("host-mapped memory without a host address"))?;
            // SAFETY: a fresh allocation of at least `bytes` bytes, host-accessible.
            unsafe { std::ptr::write_bytes(p, 0, bytes.max(8)) };
            Ok(b)
        };
        let stream = device.create_stream()?;
        let dev = |bytes: usize| -> Res<DeviceBuffer> {
            let b = device.alloc(bytes.max(8), MemoryKind::Device)?;
            stream.fill(&b.full(), 0)?;
            Ok(b)
        };
        let queues = host(c * n * q * SLOT)?;
        let cis = host(c * n * 4)?;
        let counters = host(c * k * 8)?;
        let abort = host(8)?;
        let pis = dev(c * 2 * n * 4)?;
        let issued = dev(c * n * 4)?;
        let visible = dev(c * n * 4)?;
        let offsets = dev(c * s * 8)?;
        let own_signals = space.flat(space.lsa_rank, resources_offset + shape.signals_at);
        let mut ctx = vec![0u8; c * shape.ctx_stride];
        for i in 0..c {
            let e = &mut ctx[i * shape.ctx_stride..(i + 1) * shape.ctx_stride];
            let mut put = |at: usize, v: u64, bytes: usize| {
                e[at..at + bytes].copy_from_slice(&v.to_le_bytes()[..bytes]);
            };
            put(ctx::NRANKS, n as u64, 4);
            put(ctx::QUEUE_SIZE, q as u64, 4);
            put(ctx::QUEUES, queues.ptr().0 + (i * n * q * SLOT) as u64, 8);
            put(ctx::PIS, pis.ptr().0 + (i * 2 * n * 4) as u64, 8);
            put(ctx::CIS, cis.ptr().0 + (i * n * 4) as u64, 8);
            put(ctx::COUNTERS, counters.ptr().0 + (i * k * 8) as u64, 8);
            put(ctx::SIGNALS, own_signals + (i * s * 8) as u64, 8);
            if shape.ctx_stride > ctx::LAST_VISIBLE_GET {
                put(ctx::SIGNAL_OFFSETS, offsets.ptr().0 + (i * s * 8) as u64, 8);
                put(ctx::LAST_ISSUED_GET, issued.ptr().0 + (i * n * 4) as u64, 8);
                put(
                    ctx::LAST_VISIBLE_GET,
                    visible.ptr().0 + (i * n * 4) as u64,
                    8,
                );
            }
            // 80-byte structs: flushesAllPutsOnAnySignal (72) stays false: a signal here
            // orders only its own queue's earlier puts.
        }
        let contexts = device.alloc(ctx.len(), MemoryKind::Device)?;
        stream.write_from_host(&contexts.full(), &ctx)?;
        stream.synchronize()?;
        let word = |b: &DeviceBuffer| {
            b.host_ptr()
                .ok_or_else(|| Failure::internal("host-mapped memory without a host address"))
        };
        let words = Words {
            queues: word(&queues)?.cast(),
            cis: word(&cis)?.cast(),
            counters: word(&counters)?.cast(),
            abort: word(&abort)?.cast(),
        };
        let kernel = device.load(&MODULE, SIGNAL_ADD)?;
        let hosts = Hosts::connect(space, STREAM_DEADLINE)?;
        let proxy = Proxy {
            space: space.clone(),
            hosts,
            registered: HashMap::new(),
            shape,
            rank,
            nranks: n,
            resources_offset,
            words,
            stream,
            kernel,
            wrapped: HashMap::new(),
            seen: vec![0; c * n],
            done: vec![0; c * n],
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("mscclpp-gin-{rank}"))
            .spawn(move || proxy.run(&flag))
            .map_err(|e| Failure::internal(format!("starting the GIN proxy thread: {e}")))?;
        Ok(Gin {
            contexts,
            abort,
            stop,
            thread: Some(thread),
            _keep: vec![queues, cis, counters, pis, issued, visible, offsets],
        })
    }
}

impl Proxy {
    fn run(mut self, stop: &AtomicBool) {
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            match self.pass() {
                Ok(0) => {
                    idle = idle.saturating_add(1);
                    if idle > 2000 {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                Ok(_) => idle = 0,
                Err(e) => {
                    tracing::error!(
                        "rank {}: the GIN proxy stops, raising the device communicator's abort flag: {}",
                        self.rank,
                        e.message
                    );
                    // SAFETY: the abort word, host-mapped and alive while this thread runs.
                    unsafe { AtomicU32::from_ptr(self.words.abort).store(1, Ordering::Release) };
                    return;
                }
            }
        }
    }

    /// One pass over every queue: takes what the device posted, performs it, finishes it in
    /// order. Returns how many descriptors it took.
    fn pass(&mut self) -> Res<usize> {
        let (c, n, q) = (self.shape.contexts, self.nranks, self.shape.queue);
        let arrived = self.drain()?;
        let mut taken = Vec::new();
        for ctx in 0..c {
            for peer in 0..n {
                let qi = ctx * n + peer;
                for _ in 0..BATCH {
                    let idx = self.seen[qi] as usize & (q - 1);
                    // SAFETY: slot `idx` of queue `qi`: inside the queues allocation.
                    let slot = unsafe { self.words.queues.add((qi * q + idx) * SLOT / 8) };
                    let Some(words) = take(slot) else { break };
                    self.seen[qi] = self.seen[qi].wrapping_add(1);
                    let g = Gfd::decode(&words);
                    let counter = self.perform(ctx, peer, &g).map_err(|e| {
                        Failure::internal(format!(
                            "context {ctx}, peer {peer}: descriptor {g:?}: {}",
                            e.message
                        ))
                    })?;
                    taken.push(Taken { queue: qi, counter });
                }
            }
        }
        if taken.is_empty() && arrived == 0 {
            return Ok(0);
        }
        self.stream
            .synchronize_timeout(STREAM_DEADLINE)
            .map_err(|e| Failure::internal(format!("the proxy's stream: {e}")))?;
        // What went to other hosts has landed, and every get asked of them is served, before
        // any descriptor finishes.
        if let Some(h) = self.hosts.as_mut() {
            h.flush()?;
            let deadline = h.deadline();
            while self.hosts.as_ref().is_some_and(|h| !h.gets_done()) {
                if self.drain()? == 0 {
                    std::thread::yield_now();
                }
                if Instant::now() > deadline {
                    return Err(Failure::internal(format!(
                        "GIN gets from other hosts unserved after {} s",
                        STREAM_DEADLINE.as_secs()
                    )));
                }
            }
            // Signals added for records drained meanwhile run on the stream in order; no
            // descriptor of this pass waits for them.
        }
        for t in &taken {
            if let Some(k) = t.counter {
                // SAFETY: counter `k` of this context, inside the counters allocation (checked
                // in `perform`); the device only resets it while nothing is outstanding.
                unsafe { AtomicU64::from_ptr(self.words.counters.add(k)) }
                    .fetch_add(1, Ordering::AcqRel);
            }
            self.done[t.queue] = self.done[t.queue].wrapping_add(1);
            // SAFETY: `cis[queue]`, inside the cis allocation.
            unsafe { AtomicU32::from_ptr(self.words.cis.add(t.queue)) }
                .store(self.done[t.queue], Ordering::Release);
        }
        Ok(taken.len() + arrived)
    }

    /// Serves what the ranks of other hosts sent this rank's inbox (signals to add, gets to
    /// answer) and gives them credit; returns how many records it took.
    fn drain(&mut self) -> Res<usize> {
        let Some(h) = self.hosts.as_mut() else {
            return Ok(0);
        };
        let records = h.arrived();
        for (from, r) in &records {
            self.apply(*from, r).map_err(|e| {
                Failure::internal(format!("a record of rank {from} ({r:?}): {}", e.message))
            })?;
        }
        if !records.is_empty()
            && let Some(h) = self.hosts.as_mut()
        {
            h.give_credit()?;
        }
        Ok(records.len())
    }

    /// Performs one record of rank `from` (another host's) on this rank's memory.
    fn apply(&mut self, from: usize, r: &Record) -> Res<()> {
        let me = self.space.lsa_rank;
        match r.kind {
            kind::SIGNAL => {
                let (c, s) = (self.shape.contexts, self.shape.signals);
                if r.ctx as usize >= c || r.id as usize >= s {
                    return Err(Failure::internal(format!(
                        "signal {} of context {} ({s} signals, {c} contexts)",
                        r.id, r.ctx
                    )));
                }
                let at = self.signal_addr(me, r.ctx as usize, r.id as usize);
                self.add(at, r.value)
            }
            kind::VA_SIGNAL => {
                let word = self.resolve(me, r.at, 8)?;
                if word.ptr().0 % 8 != 0 {
                    return Err(Failure::internal("a VA signal at an unaligned address"));
                }
                self.add(word.ptr(), r.value)
            }
            kind::GET => {
                let src = self.registered(self.rank, r.at.1)?;
                let dst = self.registered(from, r.back.1)?;
                // The bytes asked are read as they are now: the sender's device posted the get
                // after whatever it ordered before it (this proxy's stream writes only into
                // the peers' memory, so nothing of it need finish first).
                self.hosts()?
                    .serve_get(from, &dst, r.back.0, &src, r.at.0, r.value)
            }
            k => Err(Failure::internal(format!("record kind {k}"))),
        }
    }

    fn hosts(&mut self) -> Res<&mut Hosts> {
        self.hosts
            .as_mut()
            .ok_or_else(|| Failure::internal("no ranks on other hosts"))
    }

    /// Sends `r` to `peer` (another host's), draining this rank's inbox while `peer`'s ring
    /// for it is full.
    fn send(&mut self, peer: usize, r: Record) -> Res<()> {
        let deadline = self.hosts()?.deadline();
        while !self.hosts()?.has_room(peer) {
            if self.drain()? == 0 {
                std::thread::yield_now();
            }
            if Instant::now() > deadline {
                return Err(Failure::internal(format!(
                    "rank {peer} took none of this rank's GIN records for {} s",
                    STREAM_DEADLINE.as_secs()
                )));
            }
        }
        self.hosts()?.send(peer, &r)
    }

    /// `rank`'s registration of the memory `handle` names, for the transport between hosts.
    fn registered(
        &mut self,
        rank: usize,
        handle: u64,
    ) -> Res<Arc<mscclpp::transports::RegisteredMemory>> {
        if let Some(m) = self.registered.get(&(rank, handle)) {
            return Ok(m.clone());
        }
        let region = self.space.gin_region(handle).ok_or_else(|| {
            Failure::internal(format!("GIN handle {handle:#x} names no symmetric memory"))
        })?;
        let found = if rank == self.rank {
            region.local
        } else {
            region
                .peers
                .get(rank)
                .cloned()
                .unwrap_or_else(|| Err(format!("no rank {rank}")))
        };
        let m = found.map_err(|why| {
            Failure::internal(format!("GIN handle {handle:#x} between hosts: {why}"))
        })?;
        self.registered.insert((rank, handle), m.clone());
        Ok(m)
    }

    /// Enqueues the work of `g` for `peer`, a rank of another host.
    fn perform_remote(&mut self, ctx: usize, peer: usize, g: &Gfd) -> Res<()> {
        let o = g.op;
        let value = if o & op::SIGNAL_INC != 0 {
            1
        } else {
            g.signal_value
        };
        if o == op::GET {
            return self.send(
                peer,
                Record {
                    kind: kind::GET,
                    value: g.size,
                    at: g.src,
                    back: g.dst,
                    ..Record::default()
                },
            );
        }
        if o & op::VA_SIGNAL != 0 {
            return self.send(
                peer,
                Record {
                    kind: kind::VA_SIGNAL,
                    value,
                    at: g.src,
                    ..Record::default()
                },
            );
        }
        if o & op::INLINE != 0 {
            let dst = self.registered(peer, g.dst.1)?;
            let bytes = g.inline.to_le_bytes();
            self.hosts()?
                .put_inline(peer, &dst, g.dst.0, &bytes[..g.size as usize])?;
        } else if g.size > 0 {
            let dst = self.registered(peer, g.dst.1)?;
            let src = self.registered(self.rank, g.src.1)?;
            self.hosts()?
                .put(peer, &dst, g.dst.0, &src, g.src.0, g.size)?;
        }
        if o & (op::SIGNAL_INC | op::SIGNAL_ADD) != 0 {
            self.send(
                peer,
                Record {
                    kind: kind::SIGNAL,
                    ctx: ctx as u32,
                    id: g.signal,
                    value,
                    ..Record::default()
                },
            )?;
        }
        Ok(())
    }

    /// Enqueues the work of `g` from queue (`ctx`, `peer`); returns its counter's index.
    fn perform(&mut self, ctx: usize, peer: usize, g: &Gfd) -> Res<Option<usize>> {
        if !(1..=3).contains(&g.version) {
            return Err(Failure::internal(format!(
                "descriptor version {} (1 to 3 are known)",
                g.version
            )));
        }
        let (s, k) = (self.shape.signals, self.shape.counters);
        let o = g.op;
        if o == op::FLUSH {
            // Gets complete when their copy has (the stream is synchronized, and gets asked of
            // other hosts are served, before any descriptor finishes), so a flush has nothing
            // left to wait for.
            return Ok(None);
        }
        // The LSA team's member `peer` is, or `None` for a rank of another host.
        let member = self.space.member(peer);
        if member.is_none() && !self.hosts.as_ref().is_some_and(|h| h.reaches(peer)) {
            return Err(Failure::internal(format!(
                "rank {peer} is neither of this host nor reached between hosts"
            )));
        }
        if o == op::GET {
            match member {
                Some(m) => {
                    let dst = self.resolve(self.space.lsa_rank, g.dst, g.size)?;
                    let src = self.resolve(m, g.src, g.size)?;
                    if g.size > 0 {
                        self.stream.copy(&dst, &src)?;
                    }
                }
                None => self.perform_remote(ctx, peer, g)?,
            }
            return Ok(None);
        }
        let signal = o & (op::SIGNAL_INC | op::SIGNAL_ADD);
        if signal == op::SIGNAL_INC | op::SIGNAL_ADD {
            return Err(Failure::internal("both SignalInc and SignalAdd"));
        }
        let value = if o & op::SIGNAL_INC != 0 {
            1
        } else {
            g.signal_value
        };
        if o & op::VA_SIGNAL != 0 {
            if o & (op::PUT | op::INLINE | op::COUNTER | op::GET) != 0 || signal == 0 {
                return Err(Failure::internal(format!("op {o:#x}")));
            }
            match member {
                Some(m) => {
                    let word = self.resolve(m, g.src, 8)?;
                    if word.ptr().0 % 8 != 0 {
                        return Err(Failure::internal("a VA signal at an unaligned address"));
                    }
                    self.add(word.ptr(), value)?;
                }
                None => self.perform_remote(ctx, peer, g)?,
            }
            return Ok(None);
        }
        if o & op::PUT == 0 || o & (op::GET | op::FLUSH) != 0 {
            return Err(Failure::internal(format!("op {o:#x}")));
        }
        if o & op::INLINE != 0 && !matches!(g.size, 1 | 2 | 4 | 8) {
            return Err(Failure::internal(format!(
                "an inline put of {} bytes",
                g.size
            )));
        }
        if signal != 0 && g.signal as usize >= s {
            return Err(Failure::internal(format!(
                "signal {} of {s} (ginSignalCount)",
                g.signal
            )));
        }
        if o & op::COUNTER != 0 && g.counter as usize >= k {
            return Err(Failure::internal(format!(
                "counter {} of {k} (ginCounterCount)",
                g.counter
            )));
        }
        match member {
            Some(m) => {
                if o & op::INLINE != 0 {
                    let dst = self.resolve(m, g.dst, g.size)?;
                    self.stream
                        .write_from_host(&dst, &g.inline.to_le_bytes()[..g.size as usize])?;
                } else if g.size > 0 {
                    let src = self.resolve(self.space.lsa_rank, g.src, g.size)?;
                    let dst = self.resolve(m, g.dst, g.size)?;
                    self.stream.copy(&dst, &src)?;
                }
                if signal != 0 {
                    let at = self.signal_addr(m, ctx, g.signal as usize);
                    self.add(at, value)?;
                }
            }
            None => self.perform_remote(ctx, peer, g)?,
        }
        Ok((o & op::COUNTER != 0).then(|| ctx * k + g.counter as usize))
    }

    /// LSA member `member`'s signal `signal` of context `ctx`.
    fn signal_addr(&self, member: usize, ctx: usize, signal: usize) -> DevicePtr {
        let at =
            self.resources_offset + self.shape.signals_at + (ctx * self.shape.signals + signal) * 8;
        DevicePtr(self.space.flat(member, at))
    }

    fn add(&self, at: DevicePtr, value: u64) -> Res<()> {
        let args = GinAddArgs { addr: at.0, value };
        // SAFETY: the kernel adds to one aligned u64 of a symmetric memory mapped here (a
        // signal array, or a window word checked by `resolve`), which stays mapped while the
        // device communicator lives.
        unsafe {
            self.stream
                .launch(&*self.kernel, LaunchConfig::linear(1, 1), &args)?
        };
        Ok(())
    }

    /// `bytes` at (offset, handle) of `member`'s copy of the memory `handle` names, checked to
    /// lie in it.
    fn resolve(
        &mut self,
        member: usize,
        (off, handle): (u64, u64),
        bytes: u64,
    ) -> Res<mscclpp::hal::BufferSlice> {
        let b = match self.wrapped.entry((member, handle)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let region = self.space.gin_region(handle).ok_or_else(|| {
                    Failure::internal(format!("GIN handle {handle:#x} names no symmetric memory"))
                })?;
                let len = *region.lens.get(member).ok_or_else(|| {
                    Failure::internal(format!(
                        "LSA member {member} of a team of {}",
                        region.lens.len()
                    ))
                })?;
                let at = DevicePtr(self.space.flat(member, region.offset));
                // SAFETY: `len` bytes of `member`'s copy, mapped in this process's space while
                // the memory stays registered (the device communicator is destroyed first).
                e.insert(unsafe { self.space.communicator().device().wrap_external(at, len)? })
            }
        };
        let end = off.checked_add(bytes).filter(|&e| e <= b.len() as u64);
        match end {
            Some(e) => Ok(b.slice(off as usize..e as usize)?),
            None => Err(Failure::internal(format!(
                "{bytes} bytes at offset {off} of a memory of {} bytes (handle {handle:#x}, rank {member})",
                b.len()
            ))),
        }
    }
}

/// The qwords of the slot at `slot` once the device has written all of them (its flag bits),
/// after which the slot is zeroed for the device's next lap; `None` while the first is unset.
fn take(slot: *mut u64) -> Option<[u64; 16]> {
    // SAFETY: 16 aligned u64 of host-mapped memory the device writes with 16-byte stores.
    let w = |i: usize| unsafe { AtomicU64::from_ptr(slot.add(i)) };
    let first = w(0).load(Ordering::Acquire);
    if first & 1 == 0 {
        return None;
    }
    let version = (first >> 1) & 0xF;
    let count = if version >= 3 { 8 } else { 16 };
    let mut q = [0u64; 16];
    q[0] = first;
    let start = Instant::now();
    for (i, v) in q.iter_mut().enumerate().take(count).skip(1) {
        loop {
            let x = w(i).load(Ordering::Acquire);
            if x & 1 != 0 {
                *v = x;
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                // A torn descriptor: the device wrote its first qword and stopped. Leave it.
                return None;
            }
            std::hint::spin_loop();
        }
    }
    for i in 0..16 {
        w(i).store(0, Ordering::Relaxed);
    }
    std::sync::atomic::fence(Ordering::Release);
    Some(q)
}

/// The GIN signal and counter ids of one device communicator: the user's first, from 0, then
/// each barrier's and requirement's run.
#[derive(Debug, Default)]
pub struct Ids {
    /// Signals given out.
    pub signals: u32,
    /// Counters given out.
    pub counters: u32,
}

impl Ids {
    /// Takes `n` signals; returns the first.
    pub fn signals(&mut self, n: u32) -> Res<u32> {
        take_ids(&mut self.signals, n, 1 << 24, "signals")
    }

    /// Takes `n` counters; returns the first.
    pub fn counters(&mut self, n: u32) -> Res<u32> {
        take_ids(&mut self.counters, n, 1 << 23, "counters")
    }
}

/// Takes `n` ids from `next`, below `limit` (the width of the descriptor's id field).
fn take_ids(next: &mut u32, n: u32, limit: u32, what: &str) -> Res<u32> {
    let first = *next;
    *next = next.checked_add(n).filter(|&s| s < limit).ok_or_else(|| {
        Failure::argument(format!("ncclDevCommCreate: {limit} or more GIN {what}"))
    })?;
    Ok(first)
}

/// Signals a GIN barrier of `n` barriers over a team of `team` ranks takes.
pub fn barrier_signals(n: u32, team: usize) -> u32 {
    n.saturating_mul(team.max(2) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_through_their_bit_layout() {
        let g = Gfd {
            version: 3,
            op: op::PUT | op::SIGNAL_ADD | op::COUNTER,
            size: 1 << 40 | 5,
            src: (0x1234_5678_9abc, 7),
            dst: (99, 0x7fff_ffff_ffff_ffff),
            counter: 0x7F_FFFE,
            signal: 0xFF_FFFD,
            signal_value: 0xfedc_ba98_7654_3210,
            inline: 0,
        };
        let q = g.encode();
        assert!(q.iter().all(|w| w & 1 == 1), "every qword flagged");
        assert_eq!(Gfd::decode(&q), g);
        let v = Gfd {
            op: op::PUT | op::INLINE,
            size: 8,
            src: (0, 0),
            inline: 0x0102_0304_0506_0708,
            ..g
        };
        assert_eq!(Gfd::decode(&v.encode()), v);
    }

    #[test]
    fn context_structs_follow_the_client_version() {
        assert_eq!(context_stride(23003), Ok(48));
        assert_eq!(context_stride(23007), Ok(72));
        assert_eq!(context_stride(23102), Ok(72));
        assert_eq!(context_stride(23206), Ok(80));
        assert!(context_stride(22907).unwrap_err().contains("2.30.3"));
        assert!(context_stride(23201).unwrap_err().contains("2.32.3"));
    }
}
