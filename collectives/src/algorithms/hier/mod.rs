//! Hierarchical collectives for communicators that span hosts: within a host over the
//! single-host algorithms on a per-host communicator, between hosts over port channels (the host
//! proxy and a network transport) among the ranks of one local rank — a "rail". Its inter-host
//! kernel is `mscclpp_hier_xchg` ([`MODULE`]: `kernels/collectives/hier.cu`), its host kernel
//! [`host`].
//!
#![doc = include_str!("spec.md")]

use std::sync::{Arc, Mutex};

use mscclpp_comm::Communicator;
use mscclpp_comm::proxy::{ProxyObserver, ProxyOpInfo, ProxyService};
use mscclpp_comm::semaphore::Host2DeviceSemaphore;
use mscclpp_hal::dev::PortChannelDeviceHandle;
use mscclpp_hal::{
    Api, BufferSlice, DataType, DeviceBuffer, Error, KernelDef, KernelId, KernelModule,
    LaunchConfig, MemoryKind, ReduceOp, Result, StreamApi, TypedKernel,
};
use mscclpp_transports::{EndpointConfig, Transport, TransportFlags};

pub(crate) mod args;
pub(crate) mod host;

use args::{HierArgs, MAX_HOSTS};

use super::base::{MAX_RANKS, load};
use crate::call::Checked;
use crate::{CollectiveKind, Collectives};

/// The inter-host exchange kernel.
pub(crate) const XCHG: KernelId = KernelId("mscclpp_hier_xchg");

/// The inter-host module.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/hier.cu",
    source: include_str!("../../../../kernels/collectives/hier.cu"),
    headers: &[],
    kernels: &[KernelDef::new::<HierArgs>(XCHG.0, host::hier_xchg)],
};

/// Bytes per peer of one inter-host round (`MSCCLPP_HIER_SLOT_BYTES`, default 4 MiB).
const DEFAULT_SLOT_BYTES: u64 = 4 << 20;
/// All-reduce bytes per rank up to which the small path serves (`MSCCLPP_HIER_SMALL_BYTES`):
/// below, the per-host reduce-scatter and all-gather cost more than carrying the whole message
/// on every rail.
const DEFAULT_SMALL_BYTES: u64 = 64 << 10;
/// Proxy FIFO slots (two triggers per peer per round at most are in flight).
const FIFO_SLOTS: usize = 512;

/// Where the ranks of a communicator lie: `hosts` hosts of `per_host` ranks each, rank
/// `host * per_host + local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Topology {
    pub hosts: usize,
    pub per_host: usize,
    pub host: usize,
    pub local: usize,
}

impl Topology {
    /// The topology of `comm` from its bootstrap's host identities; `None` on one host. Refuses,
    /// naming what it found, hosts of different sizes and ranks not placed host by host.
    pub fn of(comm: &Communicator) -> Result<Option<Topology>> {
        Self::from_hosts(comm.bootstrap().hosts(), comm.rank())
    }

    pub fn from_hosts(hosts: &[u32], rank: usize) -> Result<Option<Topology>> {
        // Numbered by first appearance (a split view keeps its parent's numbers).
        let mut seen: Vec<u32> = Vec::new();
        let hosts: Vec<u32> = hosts
            .iter()
            .map(|h| match seen.iter().position(|s| s == h) {
                Some(i) => i as u32,
                None => {
                    seen.push(*h);
                    (seen.len() - 1) as u32
                }
            })
            .collect();
        let n = hosts.len();
        let count = seen.len();
        if count <= 1 {
            return Ok(None);
        }
        let per_host = n / count;
        let placed = n % count == 0
            && hosts
                .iter()
                .enumerate()
                .all(|(r, &h)| h as usize == r / per_host.max(1));
        if !placed {
            return Err(Error::invalid(format!(
                "multi-host collectives need the same number of ranks on every host, placed host \
                 by host (rank = host * ranks_per_host + local rank, as mpirun --map-by slot, srun \
                 --distribution=block and torchrun place them); the hosts of ranks 0..{n} are \
                 {hosts:?} (numbered by first appearance)"
            )));
        }
        if count > MAX_HOSTS || per_host > MAX_RANKS {
            return Err(Error::invalid(format!(
                "multi-host collectives serve up to {MAX_HOSTS} hosts of up to {MAX_RANKS} ranks; \
                 this communicator has {count} hosts of {per_host}"
            )));
        }
        Ok(Some(Topology {
            hosts: count,
            per_host,
            host: rank / per_host,
            local: rank % per_host,
        }))
    }
}

/// The hierarchical collectives of one rank.
pub(crate) struct Hier<A: Api> {
    pub topo: Topology,
    /// The collectives of this host's ranks (`None` with one rank per host).
    intra: Option<Box<Collectives<A>>>,
    /// The ranks of this local rank on every host, rank = host.
    rail: Arc<Communicator>,
    pub transport: Transport,
    /// Keeps the proxy thread, semaphores, connections and registrations alive.
    service: ProxyService,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    chans: DeviceBuffer,
    /// The rail's round counter (see [`HierArgs::counter`]).
    counter: DeviceBuffer,
    slot_bytes: u64,
    kernel: TypedKernel<HierArgs, A>,
    /// Threads of the one block (the host backend's one worker).
    threads: u32,
    /// All-reduces of up to this many bytes per rank take the small path
    /// (`MSCCLPP_HIER_SMALL_BYTES`).
    small_bytes: u64,
    /// Staging for the steps that need a buffer of their own; grown, never shrunk. Buffers
    /// grown out of stay allocated (a call still queued may use them) until these collectives
    /// are dropped.
    stage: Mutex<Vec<DeviceBuffer>>,
}

impl<A: Api> std::fmt::Debug for Hier<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hier")
            .field("topo", &self.topo)
            .field("transport", &self.transport)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

impl<A: Api> Hier<A> {
    /// Sets up both levels on `comm` (a collective call over every rank of it); `slot_bytes` is
    /// the LL slot of the per-host collectives.
    pub fn setup(comm: &Arc<Communicator>, topo: Topology, slot_bytes: u64) -> Result<Hier<A>> {
        let boot = comm.bootstrap();
        let device = comm.device().clone();
        let rank = comm.rank() as u32;
        // Both splits are made by every rank, in this order.
        let intra_boot = boot
            .split(Some(topo.host as u32), rank)?
            .ok_or_else(|| Error::Internal("per-host split returned no view".into()))?;
        let rail_boot = boot
            .split(Some(topo.local as u32), rank)?
            .ok_or_else(|| Error::Internal("rail split returned no view".into()))?;
        let kernel = load::<HierArgs, A>(comm, &MODULE, XCHG).map_err(|e| {
            Error::unavailable(
                "multi-host collectives",
                format!(
                    "the inter-host kernel does not load on the {} backend: {e}",
                    device.info().backend
                ),
            )
        })?;
        let threads = match device.info().warp_size {
            1 => 1,
            _ => super::base::block_threads(device.info(), &**kernel.kernel(), None, 512),
        };
        let intra = if topo.per_host > 1 {
            let c = Arc::new(Communicator::new(Arc::new(intra_boot), device.clone()));
            Some(Box::new(Collectives::on_backend(c, slot_bytes)?))
        } else {
            None
        };
        let rail = Arc::new(Communicator::new(Arc::new(rail_boot), device.clone()));
        let g = topo.hosts;
        let me = rail.rank();
        let slot_bytes = match mscclpp_hal::env::parse::<u64>(
            "MSCCLPP_HIER_SLOT_BYTES",
            "a byte count",
        )? {
            Some(b) if b >= 4096 && b % 4096 == 0 && b <= 64 << 20 => b,
            Some(b) => {
                return Err(Error::invalid(format!(
                    "MSCCLPP_HIER_SLOT_BYTES={b}: expected a multiple of 4096 from 4096 to 64 MiB"
                )));
            }
            None => DEFAULT_SLOT_BYTES,
        };
        let small_bytes =
            mscclpp_hal::env::parse::<u64>("MSCCLPP_HIER_SMALL_BYTES", "a byte count")?
                .unwrap_or(DEFAULT_SMALL_BYTES);
        let bytes = usize::try_from(g as u64 * slot_bytes)
            .map_err(|_| Error::invalid("inter-host scratch does not fit this host"))?;
        let send = device.alloc(bytes, MemoryKind::Device)?;
        let recv = device.alloc(bytes, MemoryKind::Device)?;
        let transport = mscclpp_comm::inter_host_transport(&rail, &send.full())?;
        // Every rank of the communicator takes the same path: agreed over the whole of it.
        crate::agree::agree(
            comm,
            "multi-host settings",
            format!("slot {slot_bytes} B, small all-reduce up to {small_bytes} B"),
        )?;
        crate::agree::agree(&rail, "multi-host transport", format!("{transport}"))?;
        let flags = TransportFlags::single(transport);
        let send_mem = Arc::new(rail.register_memory(&send.full(), flags)?);
        let recv_mem = rail.register_memory(&recv.full(), flags)?;
        let mut service = ProxyService::new(&device, FIFO_SLOTS)?;
        let src = service.add_memory(send_mem)?;
        let mut handles = vec![PortChannelDeviceHandle::default(); g];
        // Peers in ascending order on every rank: each pair's set-up steps meet.
        for p in (0..g).filter(|&p| p != me) {
            let mut cfg = EndpointConfig::new(transport);
            cfg.connect_timeout = boot.timeout();
            let conn = rail.connect(p, cfg)?;
            let sem = Arc::new(Host2DeviceSemaphore::new(&rail, conn)?);
            let theirs = rail.exchange_memory(&recv_mem, p)?;
            if theirs.len() != bytes as u64 {
                return Err(Error::Remote {
                    rank: p,
                    message: format!(
                        "inter-host scratch of {} bytes, expected {bytes}",
                        theirs.len()
                    ),
                });
            }
            let sid = service.add_semaphore(sem)?;
            let did = service.add_memory(Arc::new(theirs))?;
            handles[p] = service.port_channel(sid, did, src)?;
        }
        // The registration of the receive scratch must outlive the peers' writes: the service
        // keeps it.
        service.add_memory(Arc::new(recv_mem))?;
        let chans = device.alloc(
            g * std::mem::size_of::<PortChannelDeviceHandle>(),
            MemoryKind::Device,
        )?;
        let raw: Vec<u8> = handles
            .iter()
            .flat_map(|h| {
                // SAFETY: a `#[repr(C)]` struct of integers without padding, read as bytes.
                unsafe {
                    std::slice::from_raw_parts(
                        (h as *const PortChannelDeviceHandle).cast::<u8>(),
                        std::mem::size_of::<PortChannelDeviceHandle>(),
                    )
                }
                .to_vec()
            })
            .collect();
        let stream = device.create_stream()?;
        stream.write_from_host(&chans.full(), &raw)?;
        let counter = device.alloc(8, MemoryKind::Device)?;
        stream.write_from_host(&counter.full(), &0u64.to_le_bytes())?;
        service.start()?;
        tracing::debug!(
            rank,
            hosts = g,
            per_host = topo.per_host,
            %transport,
            slot_bytes,
            "multi-host collectives ready"
        );
        Ok(Hier {
            topo,
            intra,
            rail,
            transport,
            service,
            send,
            recv,
            chans,
            counter,
            slot_bytes,
            threads,
            small_bytes,
            kernel,
            stage: Mutex::new(Vec::new()),
        })
    }

    /// Tells `observer` of the inter-host proxy's work (a profiler's proxy events).
    pub fn observe(&self, observer: Arc<dyn ProxyObserver>) -> Result<()> {
        self.service.observe(observer)
    }

    /// The rail communicator (tests, diagnostics).
    #[allow(dead_code)]
    pub fn rail(&self) -> &Arc<Communicator> {
        &self.rail
    }

    fn intra(&self) -> Result<&Collectives<A>> {
        self.intra
            .as_deref()
            .ok_or_else(|| Error::Internal("per-host step with one rank per host".into()))
    }

    /// A staging buffer of at least `bytes` (see [`Hier::stage`]). Growing it allocates, which a
    /// stream capture forbids: then the error says to run the call once outside the capture.
    fn stage(&self, bytes: u64, stream: &A::Stream) -> Result<BufferSlice> {
        let mut st = self.stage.lock().unwrap_or_else(|p| p.into_inner());
        if st.last().is_none_or(|b| (b.len() as u64) < bytes) {
            if stream.is_capturing()? {
                return Err(Error::invalid(format!(
                    "a multi-host reduce-scatter or all-to-all needs {bytes} bytes of staging, \
                     more than it has grown to, and the stream is capturing (no allocation \
                     there): run a call of this size once before capturing"
                )));
            }
            let want = usize::try_from(bytes.next_power_of_two().max(4096))
                .map_err(|_| Error::invalid(format!("{bytes} bytes of staging")))?;
            st.push(self.rail.device().alloc(want, MemoryKind::Device)?);
        }
        let b = st
            .last()
            .ok_or_else(|| Error::Internal("no staging buffer".into()))?;
        b.slice(0..bytes as usize)
    }

    /// Enqueues one inter-host exchange (see [`HierArgs`]).
    ///
    /// # Safety
    /// Every non-zero address names `bytes` of live memory until the stream has passed it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn xchg(
        &self,
        src: &[u64],
        dst: &[u64],
        bytes: u64,
        reduce: bool,
        dtype: DataType,
        op: ReduceOp,
        stream: &A::Stream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut a = HierArgs {
            chans: self.chans.ptr().0,
            send: self.send.ptr().0,
            recv: self.recv.ptr().0,
            slot_bytes: self.slot_bytes,
            bytes,
            rank: self.topo.host as u32,
            nranks: self.topo.hosts as u32,
            reduce: u32::from(reduce),
            dtype: dtype as u32,
            op: op as u32,
            abort: self.rail.abort_addr(),
            counter: self.counter.ptr().0,
            ..HierArgs::default()
        };
        a.src[..src.len()].copy_from_slice(src);
        a.dst[..dst.len()].copy_from_slice(dst);
        let mut told = None;
        if let Some(o) = self.service.observer() {
            if stream.is_capturing()? {
                o.captured();
            } else {
                self.tell(&**o, src, bytes);
                told = Some(o);
            }
        }
        // SAFETY: the caller's contract for the data; the scratch and channels are ours.
        let launched = unsafe {
            self.kernel
                .launch(stream, LaunchConfig::linear(1, self.threads), &a)
        };
        if let (Err(_), Some(o)) = (&launched, told) {
            o.withdrawn();
        }
        launched
    }

    /// Tells the observer what one exchange of `bytes` pushes (the kernel's pattern, per round
    /// of half a slot: a put with signal, or a bare signal where this rank sends the peer
    /// nothing, then an acknowledging signal, to every other host).
    fn tell(&self, o: &dyn ProxyObserver, src: &[u64], bytes: u64) {
        let half = (self.slot_bytes / 2).max(1);
        let rounds = bytes.div_ceil(half);
        let (hosts, me) = (self.topo.hosts, self.topo.host);
        let ops: Vec<ProxyOpInfo> = (0..hosts)
            .filter(|&p| p != me && src.get(p).is_some_and(|&a| a != 0))
            .map(|p| ProxyOpInfo {
                peer: p * self.topo.per_host + self.topo.local,
                conn_peer: p,
                steps: u32::try_from(rounds).unwrap_or(u32::MAX),
                step_bytes: half.min(bytes),
            })
            .collect();
        o.enqueued(rounds * 2 * (hosts as u64 - 1), &ops);
    }

    /// Enqueues `call` (checked against the whole communicator) on `stream`.
    ///
    /// # Safety
    /// The caller keeps the call's buffers alive until the stream has passed it.
    pub unsafe fn run(&self, c: &Checked, stream: &A::Stream) -> Result<()> {
        let call = c.call;
        let (dtype, op, count) = (call.dtype, call.op, call.count);
        if count == 0 {
            return Ok(());
        }
        let Topology {
            hosts: g,
            per_host: l_n,
            host: h,
            local: l,
        } = self.topo;
        let es = dtype.size() as u64;
        let cb = count as u64 * es;
        let hb = l_n as u64 * cb;
        let (input, output) = (call.input, call.output);
        let (ip, op_) = (input.ptr().0, output.ptr().0);
        let sub = |s: &BufferSlice, off: u64, len: u64| s.slice(off as usize..(off + len) as usize);
        // SAFETY (every `xchg` below): the ranges are within the call's buffers, whose sizes
        // `call::check` verified, or within a staging buffer kept until drop.
        match call.kind {
            CollectiveKind::AllReduce => {
                if l_n == 1 {
                    // SAFETY: see the note above the match.
                    return unsafe { self.xchg(&vec![ip; g], &[op_], cb, true, dtype, op, stream) };
                }
                let intra = self.intra()?;
                // Small messages: fewer steps; every rail carries the whole message.
                let whole = |i: &BufferSlice, o: &BufferSlice, n: usize| -> Result<()> {
                    intra.all_reduce(i, o, n, dtype, op, stream)?;
                    let m = o.ptr().0;
                    let b = n as u64 * es;
                    // SAFETY: see the note above the match.
                    unsafe { self.xchg(&vec![m; g], &[m], b, true, dtype, op, stream) }
                };
                if cb <= self.small_bytes {
                    return whole(input, output, count);
                }
                // Large: a shard per local rank crosses hosts; the last `count % L` elements
                // (fewer than the ranks of a host) take the small path.
                let body = count - count % l_n;
                let shard = body / l_n;
                let sb = shard as u64 * es;
                let body_in = sub(input, 0, body as u64 * es)?;
                let body_out = sub(output, 0, body as u64 * es)?;
                let mine = sub(&body_out, l as u64 * sb, sb)?;
                intra.reduce_scatter(&body_in, &mine, shard, dtype, op, stream)?;
                let m = mine.ptr().0;
                // SAFETY: see the note above the match.
                unsafe { self.xchg(&vec![m; g], &[m], sb, true, dtype, op, stream)? };
                intra.all_gather(&mine, &body_out, shard, dtype, stream)?;
                let rest = count - body;
                if rest > 0 {
                    let at = body as u64 * es;
                    let len = rest as u64 * es;
                    whole(&sub(input, at, len)?, &sub(output, at, len)?, rest)?;
                }
                Ok(())
            }
            CollectiveKind::AllGather => {
                let host_block = sub(output, h as u64 * hb, hb)?;
                match &self.intra {
                    Some(intra) => intra.all_gather(input, &host_block, count, dtype, stream)?,
                    None if ip != host_block.ptr().0 => {
                        stream.copy(&host_block, &sub(input, 0, cb)?)?
                    }
                    None => {}
                }
                let dst: Vec<u64> = (0..g).map(|p| op_ + p as u64 * hb).collect();
                let src = vec![host_block.ptr().0; g];
                // SAFETY: see the note above the match.
                unsafe { self.xchg(&src, &dst, hb, false, dtype, op, stream) }
            }
            CollectiveKind::ReduceScatter => {
                let src: Vec<u64> = (0..g).map(|p| ip + p as u64 * hb).collect();
                match &self.intra {
                    None =>
                    // SAFETY: see the note above the match.
                    unsafe { self.xchg(&src, &[op_], hb, true, dtype, op, stream) },
                    Some(intra) => {
                        let t = self.stage(hb, stream)?;
                        let tp = t.ptr().0;
                        // SAFETY: see the note above the match.
                        unsafe { self.xchg(&src, &[tp], hb, true, dtype, op, stream)? };
                        intra.reduce_scatter(&t, output, count, dtype, op, stream)
                    }
                }
            }
            CollectiveKind::AllToAll => {
                let src: Vec<u64> = (0..g).map(|p| ip + p as u64 * hb).collect();
                match &self.intra {
                    None => {
                        let dst: Vec<u64> = (0..g).map(|p| op_ + p as u64 * hb).collect();
                        // SAFETY: see the note above the match.
                        unsafe { self.xchg(&src, &dst, hb, false, dtype, op, stream) }
                    }
                    Some(intra) => {
                        // Host `q`'s ranks sent this rank, as one piece, what they have for
                        // every rank of this host; the per-host all-to-all of each piece puts
                        // every block where it belongs.
                        let t = self.stage(g as u64 * hb, stream)?;
                        let dst: Vec<u64> = (0..g).map(|p| t.ptr().0 + p as u64 * hb).collect();
                        // SAFETY: see the note above the match.
                        unsafe { self.xchg(&src, &dst, hb, false, dtype, op, stream)? };
                        for q in 0..g {
                            let from = sub(&t, q as u64 * hb, hb)?;
                            let to = sub(output, q as u64 * hb, hb)?;
                            intra.all_to_all(&from, &to, count, dtype, stream)?;
                        }
                        Ok(())
                    }
                }
            }
            CollectiveKind::Broadcast => {
                let (root_host, root_local) = (call.root / l_n, call.root % l_n);
                if l == root_local {
                    let mut src = vec![0; g];
                    let mut dst = vec![0; g];
                    if h == root_host {
                        src = vec![ip; g];
                        if l_n == 1 {
                            dst[h] = op_;
                        }
                    } else {
                        dst[root_host] = op_;
                    }
                    // SAFETY: see the note above the match.
                    unsafe { self.xchg(&src, &dst, cb, false, dtype, op, stream)? };
                }
                if let Some(intra) = &self.intra {
                    let from = if h == root_host { input } else { output };
                    intra.broadcast(from, output, count, dtype, root_local, stream)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_from_host_ids() {
        assert_eq!(Topology::from_hosts(&[0, 0, 0, 0], 2).unwrap(), None);
        // A split view keeps its parent's numbers.
        assert_eq!(Topology::from_hosts(&[3, 3], 1).unwrap(), None);
        let t = Topology::from_hosts(&[5, 5, 2, 2, 7, 7], 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            t,
            Topology {
                hosts: 3,
                per_host: 2,
                host: 1,
                local: 1
            }
        );
        let t = Topology::from_hosts(&[0, 1], 1).unwrap().unwrap();
        assert_eq!((t.hosts, t.per_host, t.host, t.local), (2, 1, 1, 0));
    }

    #[test]
    fn topology_refuses_uneven_or_interleaved_hosts() {
        for hosts in [&[0u32, 0, 1][..], &[0, 1, 0, 1], &[0, 0, 1, 1, 1, 0]] {
            let e = Topology::from_hosts(hosts, 0).unwrap_err().to_string();
            assert!(e.contains("placed host by host"), "{e}");
        }
        let e = Topology::from_hosts(
            &[0; 9].iter().chain(&[1; 9]).copied().collect::<Vec<_>>(),
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("up to 8 ranks"), "{e}");
    }
}
