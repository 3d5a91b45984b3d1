//! Point-to-point: sends and receives between pairs of ranks, alone or in groups of any mix,
//! through LL packets in the receiver's point-to-point scratch with a per-(pair, lane) sequence
//! of flags and an acknowledgement per round, so that no rank waits for a peer it does not
//! exchange with. One kernel serves a whole group of one rank: a block per (peer, direction,
//! lane), so a send to a peer and a receive from it never wait on each other (gather, scatter,
//! all-to-all-v, rings and hypercubes run without deadlock). Its kernel is
//! `kernels/collectives/p2p.cu` ([`MODULE`]), its host kernel [`host`].
//!
#![doc = include_str!("spec.md")]

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    Api, BufferSlice, Error, KernelDef, KernelId, KernelModule, LaunchConfig, Result, StreamApi,
    TypedKernel,
};

pub(crate) mod args;
pub(crate) mod host;

use args::{P2P_MAX_CHANNELS, P2P_MAX_OPS, P2pArgs, P2pChannel, P2pOpDesc};

use super::base::{HEADERS, block_threads, load};
use crate::agree::agree;
use crate::scratch::Scratch;

/// The point-to-point kernel.
pub(crate) const P2P: KernelId = KernelId("mscclpp_p2p");

/// The point-to-point module.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/p2p.cu",
    source: include_str!("../../../../kernels/collectives/p2p.cu"),
    headers: HEADERS,
    kernels: &[KernelDef::new::<P2pArgs>(P2P.0, host::p2p)],
};

/// Whether an operation sends or receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum P2pKind {
    /// Sends the buffer to the peer.
    Send,
    /// Receives into the buffer from the peer.
    Recv,
}

/// One send or receive of a group ([`crate::Collectives::send_recv`]).
#[derive(Debug, Clone, Copy)]
pub struct P2pOp<'a> {
    /// Send or receive.
    pub kind: P2pKind,
    /// The peer rank (this rank itself: a copy to the matching receive from itself).
    pub peer: usize,
    /// The data (send) or the destination (receive): at least `bytes` long.
    pub buffer: &'a BufferSlice,
    /// Bytes sent or received; a send and its receive must agree.
    pub bytes: usize,
}

/// Lanes per channel on GPUs, and the bytes from which a message takes one more lane.
const GPU_LANES: u32 = 8;
const LANE_MIN_BYTES: u64 = 256 << 10;
/// Threads per block on GPUs.
const THREADS: u32 = 512;
/// Packet bytes of a lane's slot half at most (each lane of each source rank has two).
const MAX_SLOT_BYTES: u64 = 256 << 10;

#[derive(Debug)]
pub(crate) struct P2p<A: Api> {
    scratch: Scratch,
    slot_bytes: u64,
    lanes: u32,
    threads: u32,
    kernel: TypedKernel<P2pArgs, A>,
}

impl<A: Api> P2p<A> {
    /// The scratch and kernel (a collective call); slots of `slot_bytes` packet bytes at most.
    pub fn setup(comm: &Communicator, slot_bytes: u64) -> Result<P2p<A>> {
        let info = comm.device().info().clone();
        let kernel = load(comm, &MODULE, P2P)?;
        let host = info.warp_size == 1;
        let (lanes, threads) = if host {
            (1, 1)
        } else {
            (
                GPU_LANES,
                block_threads(&info, &**kernel.kernel(), None, THREADS),
            )
        };
        let slot_bytes = (slot_bytes.min(MAX_SLOT_BYTES) / 16 * 16).max(32);
        agree(
            comm,
            "point-to-point settings",
            format!("{lanes} lanes, {slot_bytes} B slots"),
        )?;
        let scratch = Scratch::exchange(
            comm,
            P2pArgs::scratch_bytes(lanes, slot_bytes),
            "point-to-point scratch",
        )?;
        Ok(P2p {
            scratch,
            slot_bytes,
            lanes,
            threads,
            kernel,
        })
    }

    /// Enqueues `ops` (a group of this rank) on `stream`; `backend` is the communicator's.
    ///
    /// # Safety
    /// The buffers must stay allocated until the stream has passed the call.
    pub unsafe fn run(&self, comm: &Communicator, ops: &[P2pOp], stream: &A::Stream) -> Result<()> {
        let (rank, n) = (comm.rank(), comm.nranks());
        let backend = comm.device().info().backend;
        for (i, op) in ops.iter().enumerate() {
            let what = match op.kind {
                P2pKind::Send => "send to",
                P2pKind::Recv => "receive from",
            };
            if op.peer >= n {
                return Err(Error::invalid(format!(
                    "{what} rank {} (operation {i} of the group): not a rank of {n}",
                    op.peer
                )));
            }
            if op.buffer.len() < op.bytes {
                return Err(Error::invalid(format!(
                    "{what} rank {} (operation {i} of the group): buffer of {} bytes for {} bytes",
                    op.peer,
                    op.buffer.len(),
                    op.bytes
                )));
            }
            if op.buffer.buffer().backend() != backend {
                return Err(Error::invalid(format!(
                    "{what} rank {}: the buffer belongs to the {} backend, the communicator to {backend}",
                    op.peer,
                    op.buffer.buffer().backend()
                )));
            }
        }
        // To and from this rank: copies, the k-th send matched with the k-th receive.
        let sends: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer == rank && o.kind == P2pKind::Send && o.bytes > 0)
            .collect();
        let recvs: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer == rank && o.kind == P2pKind::Recv && o.bytes > 0)
            .collect();
        if sends.len() != recvs.len() {
            return Err(Error::invalid(format!(
                "rank {rank} sends {} messages to itself and receives {} from itself in one group: each send to oneself needs a receive from oneself in the same group",
                sends.len(),
                recvs.len()
            )));
        }
        for (k, (s, r)) in sends.iter().zip(&recvs).enumerate() {
            if s.bytes != r.bytes {
                return Err(Error::invalid(format!(
                    "rank {rank} sends {} bytes to itself and receives {} (its message {k} to itself): a send and its receive must have the same size",
                    s.bytes, r.bytes
                )));
            }
            let src = s.buffer.slice(..s.bytes)?;
            let dst = r.buffer.slice(..r.bytes)?;
            if src.ptr() != dst.ptr() {
                stream.copy(&dst, &src)?;
            }
        }
        // The rest: channels (peer, direction), operations in call order.
        let mut channels: Vec<P2pChannel> = Vec::new();
        let mut descs: Vec<P2pOpDesc> = Vec::new();
        for peer in (0..n).filter(|&p| p != rank) {
            for kind in [P2pKind::Send, P2pKind::Recv] {
                let first = descs.len();
                for op in ops.iter().filter(|o| o.peer == peer && o.kind == kind) {
                    descs.push(P2pOpDesc {
                        addr: op.buffer.ptr().0,
                        bytes: op.bytes as u64,
                    });
                }
                if descs.len() > first {
                    channels.push(P2pChannel {
                        peer: peer as u32,
                        send: u32::from(kind == P2pKind::Send),
                        first_op: first as u32,
                        nops: (descs.len() - first) as u32,
                    });
                }
            }
        }
        if channels.is_empty() {
            return Ok(());
        }
        if descs.len() > P2P_MAX_OPS {
            return Err(Error::invalid(format!(
                "{} sends and receives with other ranks in one group: at most {P2P_MAX_OPS} are served (split the group where the pattern allows)",
                descs.len()
            )));
        }
        debug_assert!(channels.len() <= P2P_MAX_CHANNELS);
        let mut args = P2pArgs {
            scratch: self.scratch.addrs[rank],
            slot_bytes: self.slot_bytes,
            lane_min_bytes: LANE_MIN_BYTES,
            peer_scratch: self.scratch.addrs,
            rank: rank as u32,
            nranks: n as u32,
            lanes: self.lanes,
            nchannels: channels.len() as u32,
            channels: [P2pChannel::default(); P2P_MAX_CHANNELS],
            ops: [P2pOpDesc::default(); P2P_MAX_OPS],
            abort: mscclpp_hal::dev::current_abort(),
        };
        args.channels[..channels.len()].copy_from_slice(&channels);
        args.ops[..descs.len()].copy_from_slice(&descs);
        let cfg = LaunchConfig::linear(channels.len() as u32 * self.lanes, self.threads);
        tracing::trace!(
            ops = descs.len(),
            channels = channels.len(),
            ?cfg,
            "launch p2p"
        );
        // SAFETY: the caller keeps the buffers alive until the stream passes the call; the
        // scratch mappings are held in `self`.
        unsafe { self.kernel.launch(stream, cfg, &args) }
    }
}
