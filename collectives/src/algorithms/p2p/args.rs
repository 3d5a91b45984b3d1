//! The argument struct of the point-to-point kernel and the layout of the point-to-point scratch
//! (`spec.md`).

use mscclpp_hal::KernelArgs;

use crate::algorithms::base::MAX_RANKS;

/// Operations (sends and receives to or from other ranks) one launch carries at most.
pub const P2P_MAX_OPS: usize = 64;

/// Channels (a peer and a direction) one launch serves at most: a send and a receive channel
/// per peer.
pub const P2P_MAX_CHANNELS: usize = 2 * MAX_RANKS;

/// Lanes (blocks, each with its own slots, sequence and acknowledgement) per channel at most.
pub const P2P_MAX_LANES: u32 = 16;

/// One channel of a launch: the operations with one peer in one direction, in call order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct P2pChannel {
    /// The peer rank.
    pub peer: u32,
    /// 1: sends to `peer`; 0: receives from it.
    pub send: u32,
    /// Index of the channel's first operation in [`P2pArgs::ops`].
    pub first_op: u32,
    /// Number of its operations (consecutive in `ops`).
    pub nops: u32,
}

/// One send or receive: the buffer and its bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct P2pOpDesc {
    /// Device address of the data (send) or of the destination (receive).
    pub addr: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Arguments of `mscclpp_p2p` (see `spec.md`). Mirrored in `kernels/collectives/args.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pArgs {
    /// This rank's point-to-point scratch (`peer_scratch[rank]`), 128-aligned.
    pub scratch: u64,
    /// Packet bytes of one half of a lane's slot (a multiple of 16).
    pub slot_bytes: u64,
    /// Bytes from which a message is split over two lanes, three from twice that, ...
    pub lane_min_bytes: u64,
    /// Every rank's point-to-point scratch mapped here.
    pub peer_scratch: [u64; MAX_RANKS],
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Lanes per channel: the layout's `L`, fixed for the scratch's lifetime; the grid is
    /// `nchannels * lanes` blocks.
    pub lanes: u32,
    /// Channels of this launch.
    pub nchannels: u32,
    /// The channels (`nchannels` used).
    pub channels: [P2pChannel; P2P_MAX_CHANNELS],
    /// The operations, grouped by channel.
    pub ops: [P2pOpDesc; P2P_MAX_OPS],
    /// Device address of the communicator's abort word (0: none): the GPU kernels' waits give
    /// up once it is set. Filled at launch from the launching thread's abort scope
    /// ([`mscclpp_hal::dev::current_abort`]), which the host kernels poll directly.
    pub abort: u64,
}

// SAFETY: repr(C), integers only, no implicit padding (three u64, an array of u64, four u32,
// arrays of 16-byte integer structs, one u64); every bit pattern is valid.
unsafe impl KernelArgs for P2pArgs {}

impl P2pArgs {
    /// Offset of the send sequence counter of (peer, lane) (this rank's own use).
    pub fn send_seq_offset(lanes: u32, peer: u32, lane: u32) -> u64 {
        u64::from(peer * lanes + lane) * 8
    }

    /// Offset of the receive sequence counter of (peer, lane).
    pub fn recv_seq_offset(lanes: u32, peer: u32, lane: u32) -> u64 {
        (MAX_RANKS as u64 * u64::from(lanes) + u64::from(peer * lanes + lane)) * 8
    }

    /// Offset, in a sender's scratch, of the acknowledgement word receiver `dst` writes for
    /// `lane`: the last flag it has consumed.
    pub fn ack_offset(lanes: u32, dst: u32, lane: u32) -> u64 {
        (2 * MAX_RANKS as u64 * u64::from(lanes) + u64::from(dst * lanes + lane)) * 8
    }

    /// Offset of the slots.
    pub fn slots_offset(lanes: u32) -> u64 {
        (3 * MAX_RANKS as u64 * u64::from(lanes) * 8).div_ceil(128) * 128
    }

    /// Offset, in a receiver's scratch, of the half `half` of the slot `src` writes on `lane`.
    pub fn slot_offset(lanes: u32, slot_bytes: u64, src: u32, lane: u32, half: u64) -> u64 {
        Self::slots_offset(lanes) + (u64::from(src * lanes + lane) * 2 + half) * slot_bytes
    }

    /// Scratch bytes a rank needs.
    pub fn scratch_bytes(lanes: u32, slot_bytes: u64) -> u64 {
        Self::slots_offset(lanes) + MAX_RANKS as u64 * u64::from(lanes) * 2 * slot_bytes
    }

    /// Lanes a message of `bytes` uses (`lanes` at most).
    pub fn lanes_used(bytes: u64, lane_min_bytes: u64, lanes: u32) -> u32 {
        bytes
            .div_ceil(lane_min_bytes.max(1))
            .clamp(1, u64::from(lanes.max(1))) as u32
    }

    /// The part of a message of `bytes` that `lane` carries: offset and bytes.
    pub fn lane_part(bytes: u64, used: u32, lane: u32) -> (u64, u64) {
        let per = bytes.div_ceil(u64::from(used.max(1))).div_ceil(16) * 16;
        let off = (u64::from(lane) * per).min(bytes);
        (off, per.min(bytes - off))
    }

    /// Packets of a lane's stream for a part of `part` bytes: the header and the data.
    pub fn stream_packets(part: u64) -> u64 {
        1 + part.div_ceil(8)
    }
}
