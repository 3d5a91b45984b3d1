//! Copy engine (`ce`): all-gather, broadcast and all-to-all with no kernel at all — the data moves
//! by [`Stream::copy`] (the copy engines on GPUs) and ranks order each other with flags written
//! by [`Stream::write_value64`] and waited on by [`Stream::wait_value64`], all enqueued on the
//! caller's stream and capturable in a graph. It leaves every SM to the caller's compute.
//!
#![doc = include_str!("spec.md")]

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    BufferSlice, DeviceBuffer, Error, LaunchConfig, MemoryKind, Result, Stream, WaitCmp,
};
use mscclpp_transports::RegisteredMemory;

use super::{Algorithm, AlgorithmId, MAX_RANKS, Plan};
use crate::CollectiveKind;
use crate::agree::agree;
use crate::call::Checked;
use crate::policy::Settings;
use crate::scratch::map_peers;

/// Byte offset of the `ready[MAX_RANKS]` words in a rank's CE scratch.
const READY: usize = 0;
/// Byte offset of the `done[MAX_RANKS]` words (their own 128-byte lines).
const DONE: usize = 128;
/// Byte offset of the data regions.
const DATA: usize = 4096;
/// Data regions start and are sized on this alignment (copy-engine friendly).
const ALIGN: u64 = 256;

/// Default data bytes of a rank's CE scratch on GPUs: a chunk of a 2-rank all-gather. Larger
/// chunks amortise the per-chunk handshake; smaller ones cost less memory per communicator.
pub(crate) const DEFAULT_GPU_BYTES: u64 = 32 << 20;
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
    pub fn setup(comm: &Communicator, settings: &Settings) -> Result<Ce> {
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
        for p in (0..n).filter(|&p| p != rank) {
            stream.write_value64(&mine.slice(DONE + 8 * p..DONE + 8 * p + 8)?, 1)?;
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
        Ok(Ce {
            mine,
            peers,
            _maps: maps.peers,
            data_bytes,
        })
    }

    /// Bytes of one chunk per destination: all-to-all splits the data into a region per rank.
    fn chunk_bytes(&self, kind: CollectiveKind, n: usize) -> u64 {
        let per = match kind {
            CollectiveKind::AllToAll => self.data_bytes / n as u64,
            _ => self.data_bytes,
        };
        (per / ALIGN * ALIGN).max(ALIGN)
    }

    fn peer(&self, p: usize) -> Result<&BufferSlice> {
        self.peers
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal(format!("copy-engine scratch of rank {p} not mapped")))
    }

    /// Word `i` (a rank) of the flag array at `at` in `scratch`.
    fn flag(scratch: &BufferSlice, at: usize, i: usize) -> Result<BufferSlice> {
        scratch.slice(at + 8 * i..at + 8 * i + 8)
    }

    /// The first `len` bytes of data region `region` (regions of `chunk` bytes) of `scratch`.
    fn data(scratch: &BufferSlice, chunk: u64, region: usize, len: u64) -> Result<BufferSlice> {
        let start = DATA + region * chunk as usize;
        scratch.slice(start..start + len as usize)
    }
}

impl Algorithm for Ce {
    fn id(&self) -> AlgorithmId {
        AlgorithmId::Ce
    }

    fn fits(&self, kind: CollectiveKind, _block_bytes: u64) -> bool {
        matches!(
            kind,
            CollectiveKind::AllGather | CollectiveKind::Broadcast | CollectiveKind::AllToAll
        )
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
        let roles = roles(kind, rank, n, c.root);
        let mine = self.mine.full();
        let mut off = 0;
        while off < block {
            let len = chunk.min(block - off);
            if roles.publish {
                // Every consumer of the last publication has copied it out.
                for p in (0..n).filter(|&p| roles.consumed_by[p]) {
                    let done = Ce::flag(&mine, DONE, p)?;
                    stream.wait_value64(&done, 1, WaitCmp::Eq)?;
                    stream.write_value64(&done, 0)?;
                }
                match kind {
                    CollectiveKind::AllToAll => {
                        for p in (0..n).filter(|&p| p != rank) {
                            let src = sub(c.input, p as u64 * block + off, len)?;
                            stream.copy(&Ce::data(&mine, chunk, p, len)?, &src)?;
                        }
                    }
                    _ => {
                        let src = sub(c.input, off, len)?;
                        stream.copy(&Ce::data(&mine, chunk, 0, len)?, &src)?;
                    }
                }
                for p in (0..n).filter(|&p| roles.consumed_by[p]) {
                    stream.write_value64(&Ce::flag(self.peer(p)?, READY, rank)?, 1)?;
                }
            }
            for p in (0..n).filter(|&p| roles.consume_from[p]) {
                let ready = Ce::flag(&mine, READY, p)?;
                stream.wait_value64(&ready, 1, WaitCmp::Eq)?;
                stream.write_value64(&ready, 0)?;
                let theirs = self.peer(p)?;
                let (src, dst_at) = match kind {
                    CollectiveKind::AllToAll => {
                        (Ce::data(theirs, chunk, rank, len)?, p as u64 * block + off)
                    }
                    CollectiveKind::AllGather => {
                        (Ce::data(theirs, chunk, 0, len)?, p as u64 * block + off)
                    }
                    _ => (Ce::data(theirs, chunk, 0, len)?, off),
                };
                stream.copy(&sub(c.output, dst_at, len)?, &src)?;
                stream.write_value64(&Ce::flag(theirs, DONE, rank)?, 1)?;
            }
            off += len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
