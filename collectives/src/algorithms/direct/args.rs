//! The argument struct of the direct kernel, the layout of its scratch and its planner
//! (`spec.md`).

use mscclpp_hal::KernelArgs;

use crate::CollectiveKind;
use crate::algorithms::base::MAX_RANKS;

/// Arguments of `mscclpp_collective_direct` (see `spec.md` for the protocol and the scratch
/// layout). Mirrored in `kernels/collectives/args.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectCollectiveArgs {
    /// Device address of the input.
    pub input: u64,
    /// Device address of the output.
    pub output: u64,
    /// Element count (per rank block; see the module table).
    pub count: u64,
    /// This rank's scratch buffer (`peer_scratch[rank]`); its per-block sequence counters are
    /// at its start.
    pub scratch: u64,
    /// Bytes of one data slot: the layout's stride, fixed for the scratch's lifetime; a multiple
    /// of 16.
    pub slot_bytes: u64,
    /// Data bytes per peer per step for this call: a multiple of 16, `16..=slot_bytes`.
    pub chunk_bytes: u64,
    /// Every rank's scratch buffer mapped here (this rank's own at index `rank`).
    pub peer_scratch: [u64; MAX_RANKS],
    /// [`crate::CollectiveKind`] code (all-reduce, all-gather or reduce-scatter).
    pub kind: u32,
    /// [`mscclpp_hal::DataType`] code.
    pub dtype: u32,
    /// [`mscclpp_hal::ReduceOp`] code.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Root rank (unused by the implemented kinds; 0).
    pub root: u32,
    /// Blocks the scratch was laid out for (the layout's `MB`, fixed for the scratch's
    /// lifetime); the grid must not exceed it.
    pub max_blocks: u32,
    /// Zero.
    pub _pad: u32,
    /// Device address of the communicator's abort word (0: none): the GPU kernels' waits give
    /// up once it is set. Filled at launch from the launching thread's abort scope
    /// ([`mscclpp_hal::dev::current_abort`]), which the host kernels poll directly.
    pub abort: u64,
}

// SAFETY: repr(C), integers only, no implicit padding (six u64, an array of u64, eight u32, one
// u64); every bit pattern is valid.
unsafe impl KernelArgs for DirectCollectiveArgs {}

impl DirectCollectiveArgs {
    /// Smallest chunk [`DirectCollectiveArgs::plan`] picks (unless `slot_bytes` is smaller).
    pub const MIN_CHUNK_BYTES: u64 = 4096;

    /// Slot and flag buffers per (phase, block): sequence `q` uses buffer `q % 3`.
    pub const BUFFERS: u64 = 3;

    /// Offset of the flag words in a scratch laid out for `max_blocks`.
    pub fn flags_offset(max_blocks: u32) -> u64 {
        (8 * u64::from(max_blocks)).div_ceil(128) * 128
    }

    /// Offset of the data slots in a scratch laid out for `max_blocks`.
    pub fn data_offset(max_blocks: u32) -> u64 {
        Self::flags_offset(max_blocks)
            + 2 * Self::BUFFERS * MAX_RANKS as u64 * 8 * u64::from(max_blocks)
    }

    /// Scratch bytes a rank needs: `roundup(8 MB, 128) + 384 MB + 6 MB n S`.
    pub fn scratch_bytes(slot_bytes: u64, nranks: u32, max_blocks: u32) -> u64 {
        Self::data_offset(max_blocks)
            + 2 * Self::BUFFERS * u64::from(max_blocks) * u64::from(nranks) * slot_bytes
    }

    /// The buffer (0..3) of sequence `seq`.
    pub fn buffer_of(seq: u64) -> u64 {
        seq % Self::BUFFERS
    }

    /// Offset, in any rank's scratch, of the flag word (`phase` 0/1, `buffer` 0..3) that `src`
    /// writes for block `block`.
    pub fn flag_offset(&self, phase: u64, buffer: u64, block: u64, src: u64) -> u64 {
        let mb = u64::from(self.max_blocks);
        Self::flags_offset(self.max_blocks)
            + (((phase * Self::BUFFERS + buffer) * mb + block) * MAX_RANKS as u64 + src) * 8
    }

    /// Offset, in any rank's scratch, of the data slot (`phase`, `buffer`) that `src` writes for
    /// block `block`.
    pub fn slot_offset(&self, phase: u64, buffer: u64, block: u64, src: u64) -> u64 {
        Self::data_offset(self.max_blocks)
            + (((block * 2 + phase) * Self::BUFFERS + buffer) * u64::from(self.nranks) + src)
                * self.slot_bytes
    }

    /// Grid blocks and chunk bytes for a call that moves `block_bytes` per rank block
    /// (`count * size_of(dtype)`): spread the data over up to `max_blocks` blocks, each step at
    /// least [`Self::MIN_CHUNK_BYTES`] per peer (or `slot_bytes` when smaller) and at most
    /// `slot_bytes`. Depends on the sizes only, so every rank picks the same.
    pub fn plan(
        kind: CollectiveKind,
        block_bytes: u64,
        nranks: u32,
        slot_bytes: u64,
        max_blocks: u32,
    ) -> (u32, u64) {
        let per_peer = match kind {
            CollectiveKind::AllReduce => block_bytes.div_ceil(u64::from(nranks.max(1))),
            _ => block_bytes,
        };
        let cap = (slot_bytes / 16 * 16).max(16);
        let chunk = per_peer
            .div_ceil(u64::from(max_blocks.max(1)))
            .div_ceil(16)
            .saturating_mul(16)
            .clamp(Self::MIN_CHUNK_BYTES.min(cap), cap);
        let blocks = per_peer
            .div_ceil(chunk)
            .clamp(1, u64::from(max_blocks.max(1)));
        (blocks as u32, chunk)
    }
}
