//! What collective kernels receive: the collective kinds and the argument struct of the
//! LL-packet algorithm, shared by every backend's implementation (host: Rust; CUDA/HIP:
//! `kernels/{cuda,hip}/collectives.*`).
//!
//! ## The LL-packet algorithm (`mscclpp_collective_ll`)
//! Every rank owns a scratch buffer that every peer maps. It holds two halves; each half holds
//! one slot of `slot_bytes` packet bytes per source rank (at most [`MAX_RANKS`]). Data moves in
//! rounds of at most `slot_bytes / 2` data bytes per peer (LL16: 8 data bytes per 16-byte
//! packet). In round `k` of a call the flag is `base + 1 + k`, where `base` is the 64-bit counter
//! at `flag` (device memory), and the round uses half `flag % 2`; the kernel advances the counter
//! by the number of rounds when it ends. Flags are never reset, so a call can be replayed (CUDA
//! graphs) and stale packets never match. Writing round `k + 2` into the half of round `k` is
//! safe: a rank finishes reading round `k + 1` only after every peer has written it, which each
//! peer does only after it finished reading round `k`.
//!
//! | collective | input | output | each round sends to peer `j` | and receives from peer `p` |
//! | --- | --- | --- | --- | --- |
//! | all-reduce | `count` | `count` | piece `k` of the input | piece `k`, reduced into the output |
//! | all-gather | `count` | `nranks * count` | piece `k` of the input | into output block `p` |
//! | reduce-scatter | `nranks * count` | `count` | piece `k` of input block `j` | reduced into the output |
//! | broadcast | `count` (root) | `count` | root: piece `k`; others: an acknowledgement | from the root (the root: acknowledgements) |
//! | all-to-all | `nranks * count` | `nranks * count` | piece `k` of input block `j` | into output block `p` |
//!
//! Broadcast is the one collective where data flows one way, so each non-root also writes one
//! *acknowledgement* packet (value 0, the round's flag) into word 0 of its slot in the root's
//! scratch after it has read the round, and the root reads those acknowledgements after sending
//! the round. That keeps the invariant the slot reuse rests on — in every round every rank writes
//! to and reads from every peer it exchanges with — so neither the root's next round nor the
//! next call can overwrite a half a peer is still reading.
//!
//! A rank's own contribution goes straight from its input to its output. `Avg` is a sum divided
//! by `nranks` at the end (integer division for integer types).

use crate::dev::LL16Packet;
use crate::error::{Error, Result};
use crate::kernel::KernelArgs;

/// Most ranks the intra-node collectives serve (one node of GPUs).
pub const MAX_RANKS: usize = 8;

/// Collective kinds; the discriminant is the code in kernel arguments.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// Every rank gets the reduction of all inputs.
    AllReduce = 0,
    /// Every rank gets every rank's input, concatenated by rank.
    AllGather = 1,
    /// Rank `r` gets the reduction of block `r` of every input.
    ReduceScatter = 2,
    /// Every rank gets the root's input.
    Broadcast = 3,
    /// Rank `r` gets block `r` of every rank's input, concatenated by source rank.
    AllToAll = 4,
}

impl CollectiveKind {
    /// Every kind.
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
        CollectiveKind::AllToAll,
    ];

    /// The kind of a kernel-argument code.
    pub fn from_code(code: u32) -> Result<Self> {
        CollectiveKind::ALL
            .into_iter()
            .find(|k| *k as u32 == code)
            .ok_or_else(|| Error::invalid(format!("unknown collective code {code}")))
    }

    /// Name (as in NCCL, lower case).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "allreduce",
            CollectiveKind::AllGather => "allgather",
            CollectiveKind::ReduceScatter => "reducescatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllToAll => "alltoall",
        }
    }

    /// Whether the collective reduces.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
        )
    }

    /// Elements of the input and of the output for `count` and `nranks` (see the module table).
    pub fn buffer_elements(self, count: u64, nranks: u64) -> (u64, u64) {
        match self {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => (count, count),
            CollectiveKind::AllGather => (count, nranks * count),
            CollectiveKind::ReduceScatter => (nranks * count, count),
            CollectiveKind::AllToAll => (nranks * count, nranks * count),
        }
    }
}

/// Arguments of `mscclpp_collective_ll` ([`crate::KernelId::COLLECTIVE_LL`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlCollectiveArgs {
    /// Device address of the input.
    pub input: u64,
    /// Device address of the output.
    pub output: u64,
    /// Element count (per rank block; see the module table).
    pub count: u64,
    /// Address of the 64-bit flag counter (device memory, zero at creation, never reset).
    pub flag: u64,
    /// This rank's scratch buffer.
    pub scratch: u64,
    /// Packet bytes of one slot (per source rank, per half); a multiple of 16.
    pub slot_bytes: u64,
    /// Every rank's scratch buffer mapped here (this rank's own at index `rank`).
    pub peer_scratch: [u64; MAX_RANKS],
    /// [`CollectiveKind`] code.
    pub kind: u32,
    /// [`crate::DataType`] code.
    pub dtype: u32,
    /// [`crate::ReduceOp`] code.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Root rank (broadcast).
    pub root: u32,
}

// SAFETY: repr(C), integers only, no implicit padding (six u64, an array of u64, six u32);
// every bit pattern is valid.
unsafe impl KernelArgs for LlCollectiveArgs {}

impl LlCollectiveArgs {
    /// Data bytes one round moves per peer.
    pub fn round_bytes(&self) -> u64 {
        self.slot_bytes / LL16Packet::DATA_BYTES as u64 * (LL16Packet::DATA_BYTES as u64) / 2
    }

    /// Scratch bytes a rank needs for `slot_bytes` per slot.
    pub fn scratch_bytes(slot_bytes: u64) -> u64 {
        2 * MAX_RANKS as u64 * slot_bytes
    }

    /// Address of the slot, in `dst_rank`'s scratch as mapped here, that `src_rank` writes in
    /// the half of `flag`.
    pub fn slot(&self, dst_rank: usize, src_rank: usize, flag: u64) -> u64 {
        self.peer_scratch[dst_rank]
            + (flag % 2) * (MAX_RANKS as u64 * self.slot_bytes)
            + src_rank as u64 * self.slot_bytes
    }
}
