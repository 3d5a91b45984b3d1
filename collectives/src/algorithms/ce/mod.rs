//! Copy engine (`ce`): all-gather, broadcast and all-to-all with no kernel at all — the data moves
//! by [`Stream::copy`] (the copy engines on GPUs) and ranks order each other with flags written
//! by [`Stream::write_value64`] and waited on by [`Stream::wait_value64`], all enqueued on the
//! caller's stream and capturable in a graph. It leaves every SM to the caller's compute.
//! Reduce-scatter moves its data the same way and reduces with a few blocks of a small kernel
//! ([`reduce`]); all-reduce is that reduce-scatter followed by an all-gather in place.
//!
#![doc = include_str!("spec.md")]

use std::sync::{Arc, OnceLock};

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    Api, BufferSlice, Device, DeviceApi, DeviceBuffer, Error, LaunchConfig, MemoryKind, Result,
    StreamApi,
};
use mscclpp_transports::RegisteredMemory;

use super::base::{Algorithm, LazyKernel, MAX_RANKS, Plan};
use super::id::AlgorithmId;

pub(crate) mod reduce;
mod release;

use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;
use crate::policy::{Choice, Settings};
use crate::scratch::{PeerMaps, map_peers};
use reduce::{CE_REDUCE, CeReduceArgs};
use release::{Release, take};

/// Byte offset of the `ready[BUFFERS][MAX_RANKS]` words in a rank's CE scratch.
const READY: usize = 0;
/// Byte offset of the `done[BUFFERS][MAX_RANKS]` words (their own 128-byte lines).
const DONE: usize = 256;
/// Byte offset of the data regions.
const DATA: usize = 4096;
/// Data regions start and are sized on this alignment (copy-engine friendly).
const ALIGN: u64 = 256;
/// Chunk `k` of a call goes through buffer `k % BUFFERS`: while consumers copy one out, the
/// publisher stages the next into the other.
const BUFFERS: usize = 2;

/// Default data bytes of a rank's CE scratch on GPUs: two buffers of 32 MiB, the chunk of a
/// 2-rank all-gather. Larger chunks amortise the per-chunk handshake; smaller ones cost less
/// memory per communicator.
pub(crate) const DEFAULT_GPU_BYTES: u64 = 64 << 20;
/// The same on the host backend (shared memory of every communicator of a process).
pub(crate) const DEFAULT_HOST_BYTES: u64 = 1 << 20;

#[derive(Debug)]
pub(crate) struct Ce<A: Api> {
    /// This rank's scratch: flags, then the data regions.
    mine: DeviceBuffer,
    /// Every rank's scratch as seen here (`None` at this rank's index).
    peers: Vec<Option<BufferSlice>>,
    _maps: Vec<RegisteredMemory>,
    /// Data bytes of the scratch (after [`DATA`]).
    data_bytes: u64,
    /// The stream that publishes (stages) while the caller's stream consumes, and the events
    /// that fork it from and join it to the caller's stream.
    side: Arc<A::Stream>,
    fork: Arc<A::Event>,
    join: Arc<A::Event>,
    /// Reduce-scatter: where the peers' pieces are gathered before the reduction (this rank's
    /// only, not mapped), laid out as the scratch's buffers, allocated at the first
    /// reduce-scatter (communicators that never run one do not pay for it); and the reduction,
    /// loaded (compiled, on a GPU) then too.
    gather: OnceLock<DeviceBuffer>,
    device: Arc<dyn Device>,
    reduce: LazyKernel<CeReduceArgs, A>,
    /// Blocks and threads of the reduction.
    reduce_grid: LaunchConfig,
    /// The listener that releases this rank's waits when the communicator fails
    /// ([`release`]), removed from `comm` on drop.
    comm: Arc<Communicator>,
    abort_listener: u64,
}

/// Word `[b][i]` (buffer, rank) of the flag array at `at` in `scratch`.
fn flag(scratch: &BufferSlice, at: usize, b: usize, i: usize) -> Result<BufferSlice> {
    let w = at + 8 * (b * MAX_RANKS + i);
    scratch.slice(w..w + 8)
}

impl<A: Api> Drop for Ce<A> {
    fn drop(&mut self) {
        self.comm.remove_abort_listener(self.abort_listener);
    }
}

/// What a rank does with chunk `k` of a call: publish (stage into its own scratch) and/or
/// consume (copy out of the peers').
#[derive(Debug, Clone, Copy)]
struct Roles {
    publish: bool,
    /// Whether this rank copies from publisher `p`.
    consume_from: [bool; MAX_RANKS],
    /// Whether rank `p` copies from this rank's scratch.
    consumed_by: [bool; MAX_RANKS],
}

fn roles(kind: CollectiveKind, rank: usize, n: usize, root: usize) -> Roles {
    let mut r = Roles {
        publish: false,
        consume_from: [false; MAX_RANKS],
        consumed_by: [false; MAX_RANKS],
    };
    match kind {
        CollectiveKind::Broadcast => {
            r.publish = rank == root;
            for p in (0..n).filter(|&p| p != rank) {
                r.consumed_by[p] = rank == root;
                r.consume_from[p] = p == root;
            }
        }
        _ => {
            r.publish = true;
            for p in (0..n).filter(|&p| p != rank) {
                r.consumed_by[p] = true;
                r.consume_from[p] = true;
            }
        }
    }
    r
}

impl<A: Api> Ce<A> {
    /// The scratch, mapped by every peer (a collective call). `data_bytes` must agree.
    pub fn setup(comm: &Arc<Communicator>, settings: &Settings) -> Result<Ce<A>> {
        let (rank, n) = (comm.rank(), comm.nranks());
        let host = comm.device().info().warp_size == 1;
        let data_bytes = settings.ce_scratch_bytes.unwrap_or(if host {
            DEFAULT_HOST_BYTES
        } else {
            DEFAULT_GPU_BYTES
        });
        agree(
            comm,
            "copy-engine settings",
            format!("{data_bytes} B of scratch"),
        )?;
        let total = usize::try_from(data_bytes)
            .ok()
            .and_then(|b| b.checked_add(DATA))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "copy-engine scratch of {data_bytes} bytes does not fit this host"
                ))
            })?;
        let device = comm.device();
        let typed = A::device_of(device)?;
        let mine = device.alloc(total, MemoryKind::Device)?;
        let stream = device.create_stream()?;
        // Zero everything, then mark every peer as done with this rank's (empty) scratch: the
        // first publication need not wait for anyone.
        stream.fill(&mine.full(), 0)?;
        for b in 0..BUFFERS {
            for p in (0..n).filter(|&p| p != rank) {
                stream.write_value64(&flag(&mine.full(), DONE, b, p)?, 1)?;
            }
        }
        stream.synchronize()?;
        let maps: PeerMaps = map_peers(comm, &mine.full(), "copy-engine scratch")?;
        let mut peers: Vec<Option<BufferSlice>> = vec![None; n];
        for (m, p) in maps.peers.iter().zip((0..n).filter(|&p| p != rank)) {
            let view = m.mapped_slice().ok_or_else(|| {
                Error::invalid(format!(
                    "rank {p}'s copy-engine scratch is not mapped on rank {rank}"
                ))
            })?;
            if view.len() != total {
                return Err(Error::Remote {
                    rank: p,
                    message: format!(
                        "copy-engine scratch of {} bytes, expected {total}",
                        view.len()
                    ),
                });
            }
            peers[p] = Some(view);
        }
        // Its own stream: the caller's and the side stream may be blocked in a wait it must end.
        let release = Release::new(device.create_stream()?, mine.full(), rank, n);
        let abort_listener = comm.on_abort(Arc::new(move || release.start()));
        let ce = Ce {
            mine,
            peers,
            _maps: maps.peers,
            data_bytes,
            side: DeviceApi::create_stream(&*typed)?,
            fork: DeviceApi::create_ordering_event(&*typed)?,
            join: DeviceApi::create_ordering_event(&*typed)?,
            gather: OnceLock::new(),
            device: device.clone(),
            reduce: LazyKernel::new(comm, &reduce::MODULE, CE_REDUCE)?,
            // A few blocks: the SMs belong to the caller's compute (GPUs: 4 of 512 threads).
            reduce_grid: if host {
                LaunchConfig::linear(1, 1)
            } else {
                LaunchConfig::linear(4, 512)
            },
            comm: Arc::clone(comm),
            abort_listener,
        };
        let forced = |k: CollectiveKind| {
            settings.policy.choices[k as usize] == Choice::Forced(AlgorithmId::Ce)
        };
        if forced(CollectiveKind::AllReduce) || forced(CollectiveKind::ReduceScatter) {
            // Forced: calls of these kinds are expected, and may first come in a capture.
            ce.alloc_gather()?;
        }
        Ok(ce)
    }

    fn chunk_bytes(&self, kind: CollectiveKind, n: usize) -> u64 {
        chunk_bytes(self.data_bytes, kind, n)
    }

    /// The gather buffer of reduce-scatter (allocated by [`Ce::prepare_reduce`]).
    fn gather(&self) -> Result<&DeviceBuffer> {
        self.gather
            .get()
            .ok_or_else(|| Error::Internal("copy-engine gather buffer not allocated".into()))
    }

    /// Allocates the gather buffer and loads the reduction at the first reduce-scatter or
    /// all-reduce; refused while capturing (an allocation cannot be part of a graph): the first
    /// one must be eager, unless the environment forced the copy engines for a reducing
    /// collective, which prepares at set-up.
    fn prepare_reduce(&self, stream: &A::Stream) -> Result<()> {
        if self.gather.get().is_some() {
            return Ok(());
        }
        if stream.is_capturing()? {
            return Err(Error::invalid(
                "reduce-scatter or all-reduce by the copy engines: the first call allocates its \
                 gather buffer, which cannot happen while the stream is captured; make one call \
                 before capturing (or force them with MSCCLPP_ALGO_ALLREDUCE=ce or \
                 MSCCLPP_ALGO_REDUCESCATTER=ce, which allocates it at set-up)",
            ));
        }
        self.alloc_gather()
    }

    fn alloc_gather(&self) -> Result<()> {
        self.reduce.get()?;
        let bytes = DATA + self.data_bytes as usize;
        let buffer = self.device.alloc(bytes, MemoryKind::Device)?;
        // Two threads may race here: either buffer serves, the other is dropped.
        let _ = self.gather.set(buffer);
        Ok(())
    }

    fn peer(&self, p: usize) -> Result<&BufferSlice> {
        self.peers
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal(format!("copy-engine scratch of rank {p} not mapped")))
    }

    /// The first `len` bytes of data region `region` (regions of `chunk` bytes) of buffer `b`
    /// of `scratch`.
    fn data(
        &self,
        scratch: &BufferSlice,
        chunk: u64,
        b: usize,
        region: usize,
        len: u64,
    ) -> Result<BufferSlice> {
        let start = region_start(self.data_bytes, chunk, b, region);
        scratch.slice(start..start + len as usize)
    }
}

/// Bytes of each buffer: the same for every kind, so that a buffer's flags guard the same bytes
/// whatever kind of call last used it.
fn buffer_bytes(data_bytes: u64) -> u64 {
    data_bytes / BUFFERS as u64 / ALIGN * ALIGN
}

/// Bytes of one chunk per destination: the data of a buffer, which all-to-all splits into a
/// region per rank.
fn chunk_bytes(data_bytes: u64, kind: CollectiveKind, n: usize) -> u64 {
    let buffer = buffer_bytes(data_bytes);
    let per = match kind {
        CollectiveKind::AllToAll | CollectiveKind::ReduceScatter => buffer / n as u64,
        _ => buffer,
    };
    (per / ALIGN * ALIGN).max(ALIGN)
}

/// Byte offset in a rank's scratch of region `region` of buffer `b`.
fn region_start(data_bytes: u64, chunk: u64, b: usize, region: usize) -> usize {
    DATA + b * buffer_bytes(data_bytes) as usize + region * chunk as usize
}

/// Offset and length of rank block `q` of a buffer of `total` bytes cut every `stride` bytes
/// (the last blocks shorter, some empty).
fn block(stride: u64, total: u64, q: usize) -> (u64, u64) {
    let at = q as u64 * stride;
    (at, stride.min(total.saturating_sub(at)))
}

/// Bytes of every rank block of an all-reduce of `count` elements of `size` bytes on `n` ranks:
/// `ceil(count / n)` elements.
fn all_reduce_stride(count: u64, size: u64, n: usize) -> u64 {
    count.div_ceil(n as u64) * size
}

/// How one pass over the chunks moves the data (a call of one kind, or one phase of an
/// all-reduce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The rank's own block (at `own_at` of the source) to every peer, which copies it into
    /// the sender's block of its destination (all-gather; the all-reduce's second phase).
    Gather,
    /// The root's whole source into every destination.
    Broadcast,
    /// Block `q` of the source to rank `q`, which copies it into the sender's block of its
    /// destination (all-to-all).
    Scatter,
    /// As [`Mode::Scatter`] into the gather buffer, then reduced with the own block into the
    /// destination at `own_at` (reduce-scatter; the all-reduce's first phase).
    ReduceScatter,
}

/// One pass over the chunks as the publisher and consumer steps see it. Rank block `q` spans
/// bytes `[q stride, q stride + len_q)` of the block-structured buffer, `len_q = min(stride,
/// total - q stride)`, so that blocks may differ (an all-reduce's count need not divide by the
/// number of ranks: the last blocks are shorter, some empty); every rank computes the same
/// blocks, hence the same chunks and flags.
struct Step<'a, A: Api> {
    ce: &'a Ce<A>,
    call: &'a Checked<'a>,
    mode: Mode,
    roles: Roles,
    chunk: u64,
    src: &'a BufferSlice,
    dst: &'a BufferSlice,
    stride: u64,
    total: u64,
    /// Where the own block lies in the buffer that is not block-structured (the source of
    /// [`Mode::Gather`], the destination of [`Mode::ReduceScatter`]).
    own_at: u64,
}

impl<A: Api> Step<'_, A> {
    fn sub(s: &BufferSlice, off: u64, len: u64) -> Result<BufferSlice> {
        s.slice(off as usize..(off + len) as usize)
    }

    /// Offset and length of rank block `q`.
    fn block(&self, q: usize) -> (u64, u64) {
        block(self.stride, self.total, q)
    }

    /// Bytes of block `q`'s chunk at offset `off` (0 past its end).
    fn piece(&self, q: usize, off: u64) -> u64 {
        self.chunk.min(self.block(q).1.saturating_sub(off))
    }

    /// The chunks' offsets in every block: as many as the longest block (block 0) needs.
    fn chunks(&self) -> Vec<u64> {
        (0..self.block(0).1.div_ceil(self.chunk))
            .map(|k| k * self.chunk)
            .collect()
    }

    /// Chunk `k` (from byte `off` of each rank block) staged into the own buffer
    /// `k % BUFFERS` once every consumer has copied out what was there, then announced.
    fn publish(&self, k: usize, off: u64, stream: &A::Stream) -> Result<()> {
        let (rank, n) = (self.call.rank, self.call.nranks);
        let b = k % BUFFERS;
        let mine = self.ce.mine.full();
        for p in (0..n).filter(|&p| self.roles.consumed_by[p]) {
            take(stream, &mine, &flag(&mine, DONE, b, p)?)?;
        }
        match self.mode {
            Mode::Scatter | Mode::ReduceScatter => {
                for q in (0..n).filter(|&q| q != rank && self.piece(q, off) > 0) {
                    let len = self.piece(q, off);
                    let src = Self::sub(self.src, self.block(q).0 + off, len)?;
                    stream.copy(&self.ce.data(&mine, self.chunk, b, q, len)?, &src)?;
                }
            }
            Mode::Gather | Mode::Broadcast => {
                let len = self.piece(if self.mode == Mode::Gather { rank } else { 0 }, off);
                if len > 0 {
                    let src = Self::sub(self.src, self.own_at + off, len)?;
                    stream.copy(&self.ce.data(&mine, self.chunk, b, 0, len)?, &src)?;
                }
            }
        }
        for p in (0..n).filter(|&p| self.roles.consumed_by[p]) {
            stream.write_value64(&flag(self.ce.peer(p)?, READY, b, rank)?, 1)?;
        }
        Ok(())
    }

    /// Chunk `k` copied out of every publisher's buffer `k % BUFFERS` into the output, each
    /// publisher told when its buffer is free again.
    fn consume(&self, k: usize, off: u64, stream: &A::Stream) -> Result<()> {
        let (rank, n) = (self.call.rank, self.call.nranks);
        let b = k % BUFFERS;
        let mine = self.ce.mine.full();
        for p in (0..n).filter(|&p| self.roles.consume_from[p]) {
            take(stream, &mine, &flag(&mine, READY, b, p)?)?;
            let theirs = self.ce.peer(p)?;
            // The region of `p`'s buffer to copy out and its bytes (0: nothing for this rank
            // in this chunk, but the flags still complete their cycle).
            let (region, len) = match self.mode {
                Mode::Scatter | Mode::ReduceScatter => (rank, self.piece(rank, off)),
                Mode::Gather => (0, self.piece(p, off)),
                Mode::Broadcast => (0, self.piece(0, off)),
            };
            if len > 0 {
                let dst = match self.mode {
                    Mode::Scatter | Mode::Gather => {
                        Self::sub(self.dst, self.block(p).0 + off, len)?
                    }
                    Mode::ReduceScatter => {
                        let gather = self.ce.gather()?.full();
                        self.ce.data(&gather, self.chunk, b, p, len)?
                    }
                    Mode::Broadcast => Self::sub(self.dst, off, len)?,
                };
                stream.copy(&dst, &self.ce.data(theirs, self.chunk, b, region, len)?)?;
            }
            stream.write_value64(&flag(theirs, DONE, b, rank)?, 1)?;
        }
        if self.mode == Mode::ReduceScatter {
            self.reduce(b, off, stream)?;
        }
        Ok(())
    }

    /// Reduce-scatter: the own chunk = the combination, in rank order, of the own source block's
    /// chunk and the peers' pieces gathered in buffer `b` (on the consuming stream, so the next
    /// pull into buffer `b` waits for it).
    fn reduce(&self, b: usize, off: u64, stream: &A::Stream) -> Result<()> {
        let (rank, n, c) = (self.call.rank, self.call.nranks, self.call.call);
        let len = self.piece(rank, off);
        if len == 0 {
            return Ok(());
        }
        let gather = self.ce.gather()?.full();
        let mut srcs = [0u64; MAX_RANKS];
        for (p, src) in srcs.iter_mut().enumerate().take(n) {
            *src = if p == rank {
                Self::sub(self.src, self.block(rank).0 + off, len)?.ptr().0
            } else {
                self.ce.data(&gather, self.chunk, b, p, len)?.ptr().0
            };
        }
        let args = CeReduceArgs {
            dst: Self::sub(self.dst, self.own_at + off, len)?.ptr().0,
            srcs,
            bytes: len,
            nsrc: n as u32,
            dtype: c.dtype as u32,
            op: c.op as u32,
            _pad: 0,
        };
        let (kernel, _) = self.ce.reduce.get()?;
        // SAFETY: the caller's checked slices (kept alive until the stream passes the call) and
        // the gather buffer held by the algorithm; every source and the destination hold `len`
        // bytes (sub-slices made above).
        unsafe { kernel.launch(stream, self.ce.reduce_grid, &args) }
    }

    /// Every chunk: on the side stream (publish) and `stream` (consume) at once, or on
    /// `stream` alone, chunk by chunk, when `serial`.
    fn run(&self, stream: &A::Stream, serial: bool) -> Result<()> {
        let chunks = self.chunks();
        if serial || chunks.is_empty() {
            for (k, &off) in chunks.iter().enumerate() {
                if self.roles.publish {
                    self.publish(k, off, stream)?;
                }
                self.consume(k, off, stream)?;
            }
            return Ok(());
        }
        let side = &*self.ce.side;
        if self.roles.publish {
            stream.record(&*self.ce.fork)?;
            side.wait_event(&*self.ce.fork)?;
            for (k, &off) in chunks.iter().enumerate() {
                self.publish(k, off, side)?;
            }
        }
        for (k, &off) in chunks.iter().enumerate() {
            self.consume(k, off, stream)?;
        }
        if self.roles.publish {
            // The pass ends when both have: the caller may overwrite its input after it.
            side.record(&*self.ce.join)?;
            stream.wait_event(&*self.ce.join)?;
        }
        Ok(())
    }
}

impl<A: Api> Algorithm<A> for Ce<A> {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Ce
    }

    fn fits(&self, _kind: CollectiveKind, _block_bytes: u64) -> bool {
        // Every collective, every size (chunked through the scratch).
        true
    }

    fn plan(&self, call: &Checked) -> Result<Plan> {
        // All-reduce: the chunk of its first phase (a reduce-scatter).
        let kind = match call.kind() {
            CollectiveKind::AllReduce => CollectiveKind::ReduceScatter,
            k => k,
        };
        Ok(Plan {
            // No kernel: the grid is never launched.
            config: LaunchConfig::linear(1, 1),
            chunk_bytes: self.chunk_bytes(kind, call.nranks),
        })
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &A::Stream) -> Result<()> {
        let c = call.call;
        let (rank, n, kind) = (call.rank, call.nranks, c.kind);
        let block = call.block_bytes;
        tracing::trace!(
            collective = kind.name(),
            count = c.count,
            chunk = plan.chunk_bytes,
            "launch ce"
        );
        let sub = |s: &BufferSlice, off: u64, len: u64| s.slice(off as usize..(off + len) as usize);
        let in_place = c.input.ptr() == c.output.ptr();
        // The rank's own block, which no peer sends.
        match kind {
            CollectiveKind::AllGather => {
                let own = sub(c.output, rank as u64 * block, block)?;
                if own.ptr() != c.input.ptr() && block > 0 {
                    stream.copy(&own, &sub(c.input, 0, block)?)?;
                }
            }
            CollectiveKind::AllToAll if !in_place && block > 0 => {
                let at = rank as u64 * block;
                stream.copy(&sub(c.output, at, block)?, &sub(c.input, at, block)?)?;
            }
            CollectiveKind::Broadcast if rank == c.root && !in_place && block > 0 => {
                stream.copy(&sub(c.output, 0, block)?, &sub(c.input, 0, block)?)?;
            }
            _ => {}
        }
        if matches!(
            kind,
            CollectiveKind::ReduceScatter | CollectiveKind::AllReduce
        ) {
            self.prepare_reduce(stream)?;
        }
        // The side stream stages while this one copies out, unless this stream is being
        // captured (the side stream's work would not be part of the graph the way this code
        // keeps it alive) or an in-place all-to-all must stage a chunk before overwriting it.
        let serial = (kind == CollectiveKind::AllToAll && in_place) || stream.is_capturing()?;
        let step = |mode, src, dst, stride, total, own_at| Step {
            ce: self,
            call,
            mode,
            roles: roles(kind, rank, n, c.root),
            chunk: self.chunk_bytes(
                match mode {
                    Mode::Scatter | Mode::ReduceScatter => CollectiveKind::AllToAll,
                    Mode::Gather | Mode::Broadcast => CollectiveKind::AllGather,
                },
                n,
            ),
            src,
            dst,
            stride,
            total,
            own_at,
        };
        let all = n as u64 * block;
        match kind {
            CollectiveKind::AllGather => {
                step(Mode::Gather, c.input, c.output, block, all, 0).run(stream, serial)
            }
            CollectiveKind::Broadcast => {
                step(Mode::Broadcast, c.input, c.output, block, block, 0).run(stream, serial)
            }
            CollectiveKind::AllToAll => {
                step(Mode::Scatter, c.input, c.output, block, all, 0).run(stream, serial)
            }
            CollectiveKind::ReduceScatter => {
                step(Mode::ReduceScatter, c.input, c.output, block, all, 0).run(stream, serial)
            }
            CollectiveKind::AllReduce => {
                // Rank blocks of ceil(count / n) elements, the last ones shorter or empty:
                // reduce-scatter into the output's own block, then all-gather it in place.
                let stride = all_reduce_stride(c.count as u64, c.dtype.size() as u64, n);
                let own = rank as u64 * stride;
                step(Mode::ReduceScatter, c.input, c.output, stride, block, own)
                    .run(stream, serial)?;
                step(Mode::Gather, c.output, c.output, stride, block, own).run(stream, serial)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer is the same bytes whatever the kind: a publisher that waited for the consumers
    /// of its buffer `b` never overwrites bytes of its other buffer, which a call of another
    /// kind may still be copying out.
    #[test]
    fn each_buffer_keeps_to_its_own_bytes_for_every_kind() {
        for data_bytes in [4096, 4096 + 256, 1 << 20, 64 << 20, (1 << 30) - 256] {
            let buffer = buffer_bytes(data_bytes) as usize;
            assert!(DATA + BUFFERS * buffer <= DATA + data_bytes as usize);
            for n in 2..=MAX_RANKS {
                for kind in [
                    CollectiveKind::AllGather,
                    CollectiveKind::Broadcast,
                    CollectiveKind::AllToAll,
                ] {
                    let chunk = chunk_bytes(data_bytes, kind, n);
                    let regions = if kind == CollectiveKind::AllToAll {
                        n
                    } else {
                        1
                    };
                    for b in 0..BUFFERS {
                        let lo = region_start(data_bytes, chunk, b, 0);
                        let hi = region_start(data_bytes, chunk, b, regions - 1) + chunk as usize;
                        assert!(
                            lo >= DATA + b * buffer && hi <= DATA + (b + 1) * buffer,
                            "{kind:?} n={n} D={data_bytes}: buffer {b} spans {lo}..{hi}"
                        );
                    }
                }
            }
        }
    }

    /// Every all-reduce count from 0 up: the blocks cut the array into `n` contiguous pieces on
    /// element boundaries, none longer than block 0 (whose chunks every pass counts).
    #[test]
    fn all_reduce_blocks_cover_every_count_exactly() {
        for n in 2..=MAX_RANKS {
            for size in [1u64, 2, 4, 8] {
                for count in 0..300u64 {
                    let (stride, total) = (all_reduce_stride(count, size, n), count * size);
                    let mut next = 0;
                    for q in 0..n {
                        let (at, len) = block(stride, total, q);
                        assert!(len <= block(stride, total, 0).1);
                        if len > 0 {
                            assert_eq!(at, next, "n={n} size={size} count={count} q={q}");
                            assert_eq!(at % size, 0);
                            assert_eq!(len % size, 0);
                            next = at + len;
                        }
                    }
                    assert_eq!(next, total, "n={n} size={size} count={count}");
                }
            }
        }
    }

    #[test]
    fn every_consumer_has_its_publisher() {
        for n in 2..=MAX_RANKS {
            for kind in [
                CollectiveKind::AllGather,
                CollectiveKind::Broadcast,
                CollectiveKind::AllToAll,
            ] {
                for root in 0..n {
                    let all: Vec<Roles> = (0..n).map(|r| roles(kind, r, n, root)).collect();
                    for r in 0..n {
                        for p in 0..n {
                            assert_eq!(
                                all[r].consume_from[p], all[p].consumed_by[r],
                                "{kind:?} n={n} root={root}: {r} from {p}"
                            );
                            if all[r].consume_from[p] {
                                assert!(all[p].publish);
                            }
                        }
                        assert!(!all[r].consume_from[r] && !all[r].consumed_by[r]);
                    }
                }
            }
        }
    }
}
