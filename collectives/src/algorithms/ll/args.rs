//! The argument struct of the LL module's kernels and the layout of the LL scratch (`spec.md`).

use mscclpp_hal::KernelArgs;
use mscclpp_hal::dev::LL16Packet;

use crate::algorithms::base::MAX_RANKS;

/// Bytes of an LL128 line.
pub const LL128_LINE_BYTES: u64 = 128;

/// Data bytes of an LL128 line (the rest is the flag word).
pub const LL128_LINE_DATA_BYTES: u64 = 120;

/// Bytes of the per-communicator LL state that [`LlCollectiveArgs::flag`] points at.
pub const LL_STATE_BYTES: usize = 64;

/// Arguments of every kernel of the LL module: the general LL kernels
/// (`mscclpp_collective_ll_copy`, `mscclpp_collective_ll_reduce_<type>_<op>`), the short ones
/// and LL128 (see `spec.md` of `ll`, `ll_short` and `ll128`). Mirrored in
/// `kernels/collectives/args.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlCollectiveArgs {
    /// Device address of the input.
    pub input: u64,
    /// Device address of the output.
    pub output: u64,
    /// Element count (per rank block; see the module table).
    pub count: u64,
    /// Address of the communicator's LL state: [`LL_STATE_BYTES`] of device memory, zero at
    /// creation, never reset. Its first 8 bytes are the 64-bit flag counter; the GPU kernels keep
    /// their arrival counts and grid barrier after it (one state per communicator, so that two
    /// communicators on one device never share them).
    pub flag: u64,
    /// This rank's scratch buffer.
    pub scratch: u64,
    /// Packet bytes of one slot (per source rank, per half); a multiple of 16.
    pub slot_bytes: u64,
    /// Every rank's scratch buffer mapped here (this rank's own at index `rank`).
    pub peer_scratch: [u64; MAX_RANKS],
    /// [`crate::CollectiveKind`] code.
    pub kind: u32,
    /// [`mscclpp_hal::DataType`] code.
    pub dtype: u32,
    /// [`mscclpp_hal::ReduceOp`] code.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Root rank (broadcast).
    pub root: u32,
    /// Device address of the communicator's abort word (0: none): the GPU kernels' waits give
    /// up once it is set. Filled at launch from the launching thread's abort scope
    /// ([`mscclpp_hal::dev::current_abort`]), which the host kernels poll directly.
    pub abort: u64,
}

// SAFETY: repr(C), integers only, no implicit padding (six u64, an array of u64, six u32, one
// u64); every bit pattern is valid.
unsafe impl KernelArgs for LlCollectiveArgs {}

impl LlCollectiveArgs {
    /// Data bytes one round moves per peer.
    pub fn round_bytes(&self) -> u64 {
        self.slot_bytes / LL16Packet::DATA_BYTES as u64 * (LL16Packet::DATA_BYTES as u64) / 2
    }

    /// Data bytes an LL128 call may carry per rank (one round: 120 per 128-byte line of a slot).
    pub fn ll128_round_bytes(&self) -> u64 {
        Self::ll128_round_bytes_of(self.slot_bytes)
    }

    /// [`Self::ll128_round_bytes`] for slots of `slot_bytes`.
    pub fn ll128_round_bytes_of(slot_bytes: u64) -> u64 {
        slot_bytes / LL128_LINE_BYTES * LL128_LINE_DATA_BYTES
    }

    /// Scratch bytes a rank needs for `slot_bytes` per slot: two LL halves, and two LL128 halves
    /// after them where LL128 lines are used.
    pub fn scratch_bytes(slot_bytes: u64, ll128: bool) -> u64 {
        (if ll128 { 4 } else { 2 }) * MAX_RANKS as u64 * slot_bytes
    }

    /// Address of the slot, in `dst_rank`'s scratch as mapped here, that `src_rank` writes in
    /// the half of `flag`.
    pub fn slot(&self, dst_rank: usize, src_rank: usize, flag: u64) -> u64 {
        self.peer_scratch[dst_rank]
            + (flag % 2) * (MAX_RANKS as u64 * self.slot_bytes)
            + src_rank as u64 * self.slot_bytes
    }
}
