//! Copy engine (`ce`): all-gather, broadcast and all-to-all with no kernel at all — the data moves
//! by [`Stream::copy`] (the copy engines on GPUs) and ranks order each other with flags written
//! by [`Stream::write_value64`] and waited on by [`Stream::wait_value64`], all enqueued on the
//! caller's stream and capturable in a graph. It leaves every SM to the caller's compute.
//! Reduce-scatter moves its data the same way and reduces with a few blocks of a small kernel
//! ([`reduce`]).
//!
#![doc = include_str!("spec.md")]

use std::sync::{Arc, OnceLock};

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    BufferSlice, Device, DeviceBuffer, Error, Event, LaunchConfig, MemoryKind, Result, Stream,
};
use mscclpp_transports::RegisteredMemory;

use super::{Algorithm, AlgorithmId, LazyKernel, MAX_RANKS, Plan};

pub(crate) mod reduce;
mod release;

use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;
use crate::policy::Settings;
use crate::scratch::map_peers;
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
pub(crate) struct Ce {
    /// This rank's scratch: flags, then the data regions.
    mine: DeviceBuffer,
    /// Every rank's scratch as seen here (`None` at this rank's index).
    peers: Vec<Option<BufferSlice>>,
    _maps: Vec<RegisteredMemory>,
    /// Data bytes of the scratch (after [`DATA`]).
    data_bytes: u64,
    /// The stream that publishes (stages) while the caller's stream consumes, and the events
    /// that fork it from and join it to the caller's stream.
    side: Arc<dyn Stream>,
    fork: Arc<dyn Event>,
    join: Arc<dyn Event>,
    /// Reduce-scatter: where the peers' pieces are gathered before the reduction (this rank's
    /// only, not mapped), laid out as the scratch's buffers, allocated at the first
    /// reduce-scatter (communicators that never run one do not pay for it); and the reduction,
    /// loaded (compiled, on a GPU) then too.
    gather: OnceLock<DeviceBuffer>,
    device: Arc<dyn Device>,
    reduce: LazyKernel<CeReduceArgs>,
    /// Blocks and threads of the reduction.
    reduce_grid: LaunchConfig,
    /// The listener that releases this rank's waits when the communicator fails
    /// ([`release`]), removed from `comm` on drop.
    comm: Arc<Communicator>,
    abort_listener: u64,
}

impl Drop for Ce {
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

impl Ce {
    /// The scratch, mapped by every peer (a collective call). `data_bytes` must agree.
    pub fn setup(comm: &Arc<Communicator>, settings: &Settings) -> Result<Ce> {
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
        let mine = device.alloc(total, MemoryKind::Device)?;
        let stream = device.create_stream()?;
        // Zero everything, then mark every peer as done with this rank's (empty) scratch: the
        // first publication need not wait for anyone.
        stream.fill(&mine.full(), 0)?;
        for b in 0..BUFFERS {
            for p in (0..n).filter(|&p| p != rank) {
                stream.write_value64(&Ce::flag(&mine.full(), DONE, b, p)?, 1)?;
            }
        }
        stream.synchronize()?;
        let maps = map_peers(comm, &mine.full(), "copy-engine scratch")?;
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
        Ok(Ce {
            mine,
            peers,
            _maps: maps.peers,
            data_bytes,
            side: device.create_stream()?,
            fork: device.create_ordering_event()?,
            join: device.create_ordering_event()?,
            gather: OnceLock::new(),
            device: device.clone(),
            reduce: LazyKernel::new(comm, &reduce::MODULE, CE_REDUCE),
            // A few blocks: the SMs belong to the caller's compute (GPUs: 4 of 512 threads).
            reduce_grid: if host {
                LaunchConfig::linear(1, 1)
            } else {
                LaunchConfig::linear(4, 512)
            },
            comm: Arc::clone(comm),
            abort_listener,
        })
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

    /// Allocates the gather buffer and loads the reduction at the first reduce-scatter; refused
    /// while capturing (an allocation cannot be part of a graph): the first one must be eager.
    fn prepare_reduce(&self, stream: &dyn Stream) -> Result<()> {
        if self.gather.get().is_some() {
            return Ok(());
        }
        if stream.is_capturing()? {
            return Err(Error::invalid(
                "reduce-scatter by the copy engines: the first call allocates its gather buffer, \
                 which cannot happen while the stream is captured; make one call before capturing",
            ));
        }
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

    /// Word `[b][i]` (buffer, rank) of the flag array at `at` in `scratch`.
    fn flag(scratch: &BufferSlice, at: usize, b: usize, i: usize) -> Result<BufferSlice> {
        let w = at + 8 * (b * MAX_RANKS + i);
        scratch.slice(w..w + 8)
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

/// One call as the publisher and consumer steps see it.
struct Step<'a> {
    ce: &'a Ce,
    call: &'a Checked<'a>,
    roles: Roles,
    chunk: u64,
}

impl Step<'_> {
    fn sub(s: &BufferSlice, off: u64, len: u64) -> Result<BufferSlice> {
        s.slice(off as usize..(off + len) as usize)
    }

    /// Chunk `k` (bytes `[off, off + len)` of each rank block) staged into the own buffer
    /// `k % BUFFERS` once every consumer has copied out what was there, then announced.
    fn publish(&self, k: usize, off: u64, len: u64, stream: &dyn Stream) -> Result<()> {
        let (rank, n, c) = (self.call.rank, self.call.nranks, self.call.call);
        let b = k % BUFFERS;
        let mine = self.ce.mine.full();
        for p in (0..n).filter(|&p| self.roles.consumed_by[p]) {
            take(stream, &mine, &Ce::flag(&mine, DONE, b, p)?)?;
        }
        if matches!(
            c.kind,
            CollectiveKind::AllToAll | CollectiveKind::ReduceScatter
        ) {
            let block = self.call.block_bytes;
            for p in (0..n).filter(|&p| p != rank) {
                let src = Step::sub(c.input, p as u64 * block + off, len)?;
                stream.copy(&self.ce.data(&mine, self.chunk, b, p, len)?, &src)?;
            }
        } else {
            let src = Step::sub(c.input, off, len)?;
            stream.copy(&self.ce.data(&mine, self.chunk, b, 0, len)?, &src)?;
        }
        for p in (0..n).filter(|&p| self.roles.consumed_by[p]) {
            stream.write_value64(&Ce::flag(self.ce.peer(p)?, READY, b, rank)?, 1)?;
        }
        Ok(())
    }

    /// Chunk `k` copied out of every publisher's buffer `k % BUFFERS` into the output, each
    /// publisher told when its buffer is free again.
    fn consume(&self, k: usize, off: u64, len: u64, stream: &dyn Stream) -> Result<()> {
        let (rank, n, c) = (self.call.rank, self.call.nranks, self.call.call);
        let (b, block) = (k % BUFFERS, self.call.block_bytes);
        let mine = self.ce.mine.full();
        for p in (0..n).filter(|&p| self.roles.consume_from[p]) {
            take(stream, &mine, &Ce::flag(&mine, READY, b, p)?)?;
            let theirs = self.ce.peer(p)?;
            let (region, dst_at) = match c.kind {
                CollectiveKind::AllToAll | CollectiveKind::ReduceScatter => {
                    (rank, p as u64 * block + off)
                }
                CollectiveKind::AllGather => (0, p as u64 * block + off),
                _ => (0, off),
            };
            let src = self.ce.data(theirs, self.chunk, b, region, len)?;
            let dst = if c.kind == CollectiveKind::ReduceScatter {
                self.ce
                    .data(&self.ce.gather()?.full(), self.chunk, b, p, len)?
            } else {
                Step::sub(c.output, dst_at, len)?
            };
            stream.copy(&dst, &src)?;
            stream.write_value64(&Ce::flag(theirs, DONE, b, rank)?, 1)?;
        }
        if c.kind == CollectiveKind::ReduceScatter {
            self.reduce(b, off, len, stream)?;
        }
        Ok(())
    }

    /// Reduce-scatter: output chunk = the combination, in rank order, of the own input block's
    /// chunk and the peers' pieces gathered in buffer `b` (on the consuming stream, so the next
    /// pull into buffer `b` waits for it).
    fn reduce(&self, b: usize, off: u64, len: u64, stream: &dyn Stream) -> Result<()> {
        let (rank, n, c) = (self.call.rank, self.call.nranks, self.call.call);
        let gather = self.ce.gather()?.full();
        let mut srcs = [0u64; MAX_RANKS];
        for (p, src) in srcs.iter_mut().enumerate().take(n) {
            *src = if p == rank {
                Step::sub(c.input, rank as u64 * self.call.block_bytes + off, len)?
                    .ptr()
                    .0
            } else {
                self.ce.data(&gather, self.chunk, b, p, len)?.ptr().0
            };
        }
        let args = CeReduceArgs {
            dst: Step::sub(c.output, off, len)?.ptr().0,
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
}

impl Algorithm for Ce {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Ce
    }

    fn fits(&self, kind: CollectiveKind, _block_bytes: u64) -> bool {
        crate::policy::ce_serves(kind)
    }

    fn plan(&self, call: &Checked) -> Result<Plan> {
        Ok(Plan {
            // No kernel: the grid is never launched.
            config: LaunchConfig::linear(1, 1),
            chunk_bytes: self.chunk_bytes(call.kind(), call.nranks),
        })
    }

    unsafe fn launch(&self, call: &Checked, plan: &Plan, stream: &dyn Stream) -> Result<()> {
        let c = call.call;
        let (rank, n, kind) = (call.rank, call.nranks, c.kind);
        let block = call.block_bytes;
        let chunk = plan.chunk_bytes;
        tracing::trace!(
            collective = kind.name(),
            count = c.count,
            chunk,
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
        if kind == CollectiveKind::ReduceScatter {
            self.prepare_reduce(stream)?;
        }
        let step = Step {
            ce: self,
            call,
            roles: roles(kind, rank, n, c.root),
            chunk,
        };
        let chunks: Vec<(u64, u64)> = (0..block.div_ceil(chunk))
            .map(|k| (k * chunk, chunk.min(block - k * chunk)))
            .collect();
        // The side stream stages while this one copies out, unless this stream is being
        // captured (the side stream's work would not be part of the graph the way this code
        // keeps it alive) or an in-place all-to-all must stage a chunk before overwriting it.
        let serial = chunks.is_empty()
            || (kind == CollectiveKind::AllToAll && in_place)
            || stream.is_capturing()?;
        if serial {
            for (k, &(off, len)) in chunks.iter().enumerate() {
                if step.roles.publish {
                    step.publish(k, off, len, stream)?;
                }
                step.consume(k, off, len, stream)?;
            }
            return Ok(());
        }
        let side = &*self.side;
        if step.roles.publish {
            stream.record(&*self.fork)?;
            side.wait_event(&*self.fork)?;
            for (k, &(off, len)) in chunks.iter().enumerate() {
                step.publish(k, off, len, side)?;
            }
        }
        for (k, &(off, len)) in chunks.iter().enumerate() {
            step.consume(k, off, len, stream)?;
        }
        if step.roles.publish {
            // The call ends when both have: the caller may overwrite its input after it.
            side.record(&*self.join)?;
            stream.wait_event(&*self.join)?;
        }
        Ok(())
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
