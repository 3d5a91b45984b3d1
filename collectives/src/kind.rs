//! The collective kinds: what a call computes, and the code kernels receive for it.

use mscclpp_hal::{Error, Result};

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
