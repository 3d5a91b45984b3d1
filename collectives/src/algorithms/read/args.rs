//! The argument struct of the read kernel, the window table and keys, and the layout of the
//! read scratch (`spec.md`).

use mscclpp_hal::KernelArgs;

use crate::algorithms::base::MAX_RANKS;

/// Windows a read-algorithm window table holds (window 0 is the staging area).
pub const MAX_WINDOWS: usize = 256;

/// Bytes of a window table: `u64 [2][MAX_WINDOWS][MAX_RANKS]` (addresses, then lengths).
pub const WINDOW_TABLE_BYTES: usize = 2 * 8 * MAX_WINDOWS * MAX_RANKS;

/// Bits of a key that hold the offset inside a window.
pub const READ_KEY_OFFSET_BITS: u32 = 48;

/// The key naming byte `offset` of window `window` (see the read algorithm); `None` when
/// either does not fit.
pub fn read_key(window: usize, offset: u64) -> Option<u64> {
    (window < MAX_WINDOWS && offset < 1 << READ_KEY_OFFSET_BITS)
        .then_some(((window as u64) << READ_KEY_OFFSET_BITS) | offset)
}

/// The window and offset of a key.
pub fn split_read_key(key: u64) -> (usize, u64) {
    (
        (key >> READ_KEY_OFFSET_BITS) as usize,
        key & ((1 << READ_KEY_OFFSET_BITS) - 1),
    )
}

/// Arguments of `mscclpp_collective_read_allreduce` (see `spec.md` for the protocol, the
/// windows and the scratch layout). Mirrored in `kernels/collectives/args.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCollectiveArgs {
    /// Device address of the input (`count` elements).
    pub input: u64,
    /// Device address of the output (`count` elements; may equal `input`).
    pub output: u64,
    /// Element count.
    pub count: u64,
    /// This rank's read scratch (`peer_scratch[rank]`), 128-aligned.
    pub scratch: u64,
    /// This rank's window table ([`WINDOW_TABLE_BYTES`] of device memory).
    pub table: u64,
    /// Where this rank's input is, for the peers: [`read_key`] of a registered window, or of
    /// window 0 offset 0 (the staging area, which the kernel fills first).
    pub in_key: u64,
    /// Bytes of the staging area (the layout's `S`); a staged input must fit.
    pub staging_bytes: u64,
    /// Every rank's read scratch mapped here (this rank's own at index `rank`).
    pub peer_scratch: [u64; MAX_RANKS],
    /// [`mscclpp_hal::DataType`] code.
    pub dtype: u32,
    /// [`mscclpp_hal::ReduceOp`] code.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Blocks the scratch was laid out for (the layout's `MB`); the grid must not exceed it.
    pub max_blocks: u32,
    /// Zero.
    pub _pad: u32,
    /// Device address of the communicator's abort word (0: none): the GPU kernels' waits give
    /// up once it is set. Filled at launch from the launching thread's abort scope
    /// ([`mscclpp_hal::dev::current_abort`]), which the host kernels poll directly.
    pub abort: u64,
}

// SAFETY: repr(C), integers only, no implicit padding (seven u64, an array of u64, six u32, one
// u64); every bit pattern is valid.
unsafe impl KernelArgs for ReadCollectiveArgs {}

impl ReadCollectiveArgs {
    /// Units (16 bytes) one thread reduces at most in a call.
    pub const MAX_UNITS_PER_THREAD: u64 = 4;

    /// Offset of the start packets in a scratch laid out for `max_blocks`.
    pub fn packets_offset(max_blocks: u32) -> u64 {
        (8 * u64::from(max_blocks)).div_ceil(128) * 128
    }

    /// Offset of the start packet `src` writes for block `block`.
    pub fn start_offset(max_blocks: u32, block: u64, src: u64) -> u64 {
        Self::packets_offset(max_blocks) + (block * MAX_RANKS as u64 + src) * 16
    }

    /// Offset of the done packet `src` writes for block `block`.
    pub fn done_offset(max_blocks: u32, block: u64, src: u64) -> u64 {
        Self::start_offset(max_blocks, block, src) + 16 * MAX_RANKS as u64 * u64::from(max_blocks)
    }

    /// Offset of the staging area.
    pub fn staging_offset(max_blocks: u32) -> u64 {
        Self::packets_offset(max_blocks) + 32 * MAX_RANKS as u64 * u64::from(max_blocks)
    }

    /// Scratch bytes a rank needs.
    pub fn scratch_bytes(staging_bytes: u64, max_blocks: u32) -> u64 {
        Self::staging_offset(max_blocks) + staging_bytes
    }

    /// The grid (blocks) for `bytes` with `threads` per block, at most `max_blocks`, or `None`
    /// when a thread would have more than [`Self::MAX_UNITS_PER_THREAD`] units.
    pub fn grid(bytes: u64, threads: u32, max_blocks: u32) -> Option<u32> {
        let units = bytes.div_ceil(16);
        let t = u64::from(threads.max(1));
        let blocks = units.div_ceil(t).clamp(1, u64::from(max_blocks.max(1)));
        let per_thread = units.div_ceil(blocks).div_ceil(t);
        (per_thread <= Self::MAX_UNITS_PER_THREAD).then_some(blocks as u32)
    }
}
