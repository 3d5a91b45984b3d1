//! The argument structs of the expert-parallel kernels and the layout of the exchange buffer
//! (`spec.md`), mirrored in `kernels/collectives/args.cuh` and checked by
//! `kernels/collectives/args_check.h`.

use mscclpp_hal::KernelArgs;

/// Ranks an exchange serves at most (`kMoeMaxRanks` in `kernels/collectives/args.cuh`): more
/// than the collectives' 8, since an MoE layer spans hosts of 8 GPUs each.
pub const MOE_MAX_RANKS: usize = 32;

/// Bytes of the buffer's header (flags, counts, acknowledgements, sequences, block counters).
pub const HEADER_BYTES: u64 = 4096;

/// Word offsets (in bytes) of the header; `s` and `d` are ranks.
pub mod hdr {
    use super::MOE_MAX_RANKS;
    const N: u64 = MOE_MAX_RANKS as u64;
    /// Written by source `s`: the sequence of its last complete dispatch to this rank.
    pub fn dispatch_flag(s: u64) -> u64 {
        8 * s
    }
    /// Written by source `s` before its flag: how many rows it sent in that dispatch.
    pub fn dispatch_count(s: u64) -> u64 {
        8 * (N + s)
    }
    /// Written by destination `d`: the last dispatch whose rows from this rank it has read.
    pub fn dispatch_ack(d: u64) -> u64 {
        8 * (2 * N + d)
    }
    /// Written by rank `s` (that holds tokens of this rank): its last complete combine here.
    pub fn combine_flag(s: u64) -> u64 {
        8 * (3 * N + s)
    }
    /// Written by rank `d`: the last combine whose rows from this rank it has read.
    pub fn combine_ack(d: u64) -> u64 {
        8 * (4 * N + d)
    }
    /// This rank's own: the dispatches (and combines) it has run, stored by the call's last
    /// block to finish (every block has read it by then).
    pub fn dispatch_seq() -> u64 {
        8 * (5 * N)
    }
    pub fn combine_seq() -> u64 {
        8 * (6 * N)
    }
    /// This rank's own: blocks that finished reading the combine rows (the last acknowledges).
    pub fn combine_done() -> u64 {
        8 * (7 * N)
    }
    /// This rank's own: blocks that finished reading the dispatch rows and counts (the last
    /// acknowledges every source, so that no source rewrites a count another block still reads).
    pub fn dispatch_done() -> u64 {
        8 * (7 * N + 1)
    }
    /// Written by rank `s` before its combine flag: how many rows it sent back.
    pub fn combine_count(s: u64) -> u64 {
        8 * (8 * N + s)
    }
    /// Written by source `s` before its dispatch flag: its row and scale bytes
    /// (`payload | scales << 32`), which the receiver's must equal.
    pub fn dispatch_shape(s: u64) -> u64 {
        8 * (9 * N + s)
    }
    // Only the GPU kernels use these two (the host's one worker needs no block counters);
    // written here so that the header's words are listed in one place and checked apart.
    /// This rank's own, GPU grids only: its blocks that finished sending dispatch rows to rank
    /// `d` (combine rows back to rank `d`); the one completing a call's share publishes the flag.
    #[allow(dead_code)]
    pub fn dispatch_sent(d: u64) -> u64 {
        8 * (10 * N + d)
    }
    #[allow(dead_code)]
    pub fn combine_sent(d: u64) -> u64 {
        8 * (11 * N + d)
    }
    /// Written by source `s` (expert-major combine): the last combine whose weights it wrote
    /// into the rows it dispatched here.
    pub fn weights_flag(s: u64) -> u64 {
        8 * (12 * N + s)
    }
    /// This rank's own, GPU grids only: blocks that finished writing weights to rank `d` (the
    /// one completing a group of the grid's blocks publishes the flag).
    #[allow(dead_code)]
    pub fn weights_sent(d: u64) -> u64 {
        8 * (13 * N + d)
    }
}

/// Status bits a call leaves in its handle (`status`, 0: served): an expert index outside
/// `-1..E` (the entry dropped); more rows than the outputs hold (the rows past them dropped); a
/// source whose rows differ in size from this rank's (its rows dropped); a combine that found a
/// token's row missing (not sent back, or more tokens than the dispatch had: summed without it).
pub const STATUS_EXPERT_RANGE: i32 = 1;
pub const STATUS_CAPACITY: i32 = 2;
pub const STATUS_ROW_SIZE: i32 = 4;
pub const STATUS_COMBINE_MISSING: i32 = 8;

/// `mscclpp::moe::layout`: per-rank and per-expert token counts of a routing, and which ranks each
/// token goes to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeLayoutArgs {
    /// `[tokens, topk]` i64 expert indices (-1: none).
    pub topk_idx: u64,
    pub tokens: u64,
    /// `[nranks]` i32, `[num_experts]` i32, `[tokens, nranks]` u8 (0 or 1); all zeroed before.
    pub per_rank: u64,
    pub per_expert: u64,
    pub in_rank: u64,
    /// `[1]` i32: STATUS_EXPERT_RANGE where an index is outside -1..num_experts.
    pub status: u64,
    pub topk: u32,
    pub num_experts: u32,
    pub nranks: u32,
    pub _pad: u32,
}

// SAFETY: `#[repr(C)]` plain old data with no padding (checked by the layout test).
unsafe impl KernelArgs for MoeLayoutArgs {}

/// `mscclpp::moe::dispatch` and `mscclpp::moe::combine` (a grid of B blocks per rank; spec.md).
///
/// Dispatch: `x` (`tokens` rows of `payload_bytes`), `topk_idx` (i64), `topk_weights` (f32,
/// optional), `scales` (`scale_bytes` a row, optional) go to the ranks that hold the experts;
/// what arrives is written to `out_x`, `out_idx` (i64, local expert or -1), `out_weights` (f32,
/// 0 where not local), `out_scales`, `out_src` (i32: the token's index at its source), at most
/// `out_capacity` rows, sources in rank order. Combine: `x` holds the received rows (now in
/// `dtype`, `payload_bytes` each) and `topk_weights` their weights; each goes back to its source,
/// which sums them (f32, then rounded once) into `out_x` and the weights into `out_weights`.
/// `handle`: `[nranks]` i32 rows from each source, `[1]` i32 status, `[num_local]` i32 rows per
/// local expert, `[max_tokens * nranks]` i32 where each token went (row at the destination, -1).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeArgs {
    pub buffer: u64,
    pub peer_buffer: [u64; MOE_MAX_RANKS],
    /// Where this rank's dispatch rows (combine rows) for rank `d` go: its region in `d`'s
    /// buffer, or in the compact mirror of it (`mirror_bytes`) where `d` is on another host.
    pub peer_dispatch: [u64; MOE_MAX_RANKS],
    pub peer_combine: [u64; MOE_MAX_RANKS],
    pub max_tokens: u64,
    /// A row of the buffer's regions: its stride, and where its scales and metadata start.
    pub row_bytes: u64,
    pub scales_at: u64,
    pub meta_at: u64,
    pub tokens: u64,
    pub payload_bytes: u64,
    pub scale_bytes: u64,
    pub x: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub scales: u64,
    pub out_x: u64,
    pub out_idx: u64,
    pub out_weights: u64,
    pub out_scales: u64,
    pub out_src: u64,
    pub out_capacity: u64,
    pub handle: u64,
    pub topk: u32,
    pub num_experts: u32,
    pub rank: u32,
    pub nranks: u32,
    pub dtype: u32,
    /// Which halves the launch runs: [`HALF_SEND`], [`HALF_RECEIVE`] or both (a call sent in one
    /// launch and received in a later one: DeepEP's receive hook).
    pub phases: u32,
    pub abort: u64,
    /// The expert-major ("low-latency") form, where `em_flags` has [`EM_ON`]. Dispatch: each
    /// received (row, top-k entry) with a local expert also lands at `em_x[expert][slot]`
    /// (`em_capacity` slots an expert, payload bytes each), its source token in `em_src`
    /// (`[local, em_capacity]` i32), its scales in `em_scales` (f32, or packed UE8M0 where
    /// [`EM_UE8M0`], at element `expert * s0 + slot * s1 + block * s2` of `em_scale_strides`),
    /// per expert and source `begin << 32 | count` in `em_range` (`[local, nranks]` i64), the
    /// counts added to `em_count` (and `em_stats` where set), each entry's slot in `em_slots`
    /// (`[nranks * max_tokens, topk]` i32, -1: none). Combine: `x` is `[local, em_capacity]` rows;
    /// the source first writes its `em_weights` (`[tokens, topk]` f32) into the rows it
    /// dispatched, and each rank sends back, per row, the weighted sum of its experts' outputs.
    pub em_x: u64,
    pub em_scales: u64,
    pub em_scale_strides: [u64; 3],
    pub em_src: u64,
    pub em_range: u64,
    pub em_count: u64,
    pub em_slots: u64,
    pub em_stats: u64,
    pub em_weights: u64,
    pub em_capacity: u64,
    pub em_flags: u32,
    pub _pad: u32,
}

// SAFETY: `#[repr(C)]` plain old data with no padding (checked by the layout test).
unsafe impl KernelArgs for MoeArgs {}

/// `MoeArgs::phases` bits.
pub const HALF_SEND: u32 = 1;
pub const HALF_RECEIVE: u32 = 2;
/// `MoeArgs::em_flags` bits: the expert-major form; its scales packed as UE8M0; its send half
/// casting bf16 rows to E4M3 with a scale per 128 channels (`payload_bytes`: the channels),
/// the scales rounded up to powers of two.
pub const EM_ON: u32 = 1;
pub const EM_UE8M0: u32 = 2;
pub const EM_CAST_FP8: u32 = 4;
pub const EM_ROUND_SCALE: u32 = 8;
/// Local experts the expert-major form serves at most (the GPU kernel counts them in shared
/// memory).
pub const EM_MAX_LOCAL: usize = 1024;

/// Where the pieces of a row sit (dispatch: payload, scales, then the source index, the local
/// experts and the weights; combine: payload, then the weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    pub payload_cap: u64,
    pub scale_cap: u64,
    pub topk: u64,
}

impl RowLayout {
    pub fn scales_at(&self) -> u64 {
        self.payload_cap
    }
    pub fn meta_at(&self) -> u64 {
        self.payload_cap + self.scale_cap
    }
    pub fn row_bytes(&self) -> u64 {
        (self.meta_at() + 4 * (1 + 2 * self.topk)).div_ceil(16) * 16
    }
}

/// Offsets in the exchange buffer of `nranks` regions of `max_tokens` rows each.
pub fn dispatch_region(row_bytes: u64, max_tokens: u64, src: u64) -> u64 {
    HEADER_BYTES + src * max_tokens * row_bytes
}

pub fn combine_region(row_bytes: u64, max_tokens: u64, nranks: u64, src: u64) -> u64 {
    HEADER_BYTES + (nranks + src) * max_tokens * row_bytes
}

/// A mirror of a peer's buffer on another host holds only what this rank writes there: the
/// header, then this rank's dispatch region, then its combine region (`spec.md`, "Ranks on
/// other hosts"): `2 max_tokens` rows, not `2 n max_tokens`.
pub fn mirror_bytes(row_bytes: u64, max_tokens: u64) -> u64 {
    HEADER_BYTES + 2 * max_tokens * row_bytes
}
pub fn mirror_dispatch() -> u64 {
    HEADER_BYTES
}
pub fn mirror_combine(row_bytes: u64, max_tokens: u64) -> u64 {
    HEADER_BYTES + max_tokens * row_bytes
}

/// `None` where the size does not fit 64 bits.
pub fn buffer_bytes(row_bytes: u64, max_tokens: u64, nranks: u64) -> Option<u64> {
    (2 * nranks)
        .checked_mul(max_tokens)?
        .checked_mul(row_bytes)?
        .checked_add(HEADER_BYTES)
}

/// The handle's pieces (i32 each): per-source rows, status, the dispatch's tokens,
/// per-local-expert rows, positions.
pub fn handle_status(nranks: u64) -> u64 {
    nranks
}
pub fn handle_tokens(nranks: u64) -> u64 {
    nranks + 1
}
pub fn handle_experts(nranks: u64) -> u64 {
    nranks + 2
}
pub fn handle_positions(nranks: u64, num_local: u64) -> u64 {
    nranks + 2 + num_local
}
pub fn handle_words(nranks: u64, num_local: u64, max_tokens: u64) -> u64 {
    handle_positions(nranks, num_local) + max_tokens * nranks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_words_are_distinct_and_inside_the_header() {
        let n = MOE_MAX_RANKS as u64;
        let mut words = vec![hdr::combine_done(), hdr::dispatch_done()];
        words.extend([hdr::dispatch_seq(), hdr::combine_seq()]);
        for r in 0..n {
            words.extend([
                hdr::dispatch_flag(r),
                hdr::dispatch_count(r),
                hdr::dispatch_ack(r),
                hdr::combine_flag(r),
                hdr::combine_ack(r),
                hdr::combine_count(r),
                hdr::dispatch_shape(r),
                hdr::dispatch_sent(r),
                hdr::combine_sent(r),
                hdr::weights_flag(r),
                hdr::weights_sent(r),
            ]);
        }
        let all = words.len();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), all, "two header words coincide");
        assert!(words.iter().all(|&w| w % 8 == 0 && w + 8 <= HEADER_BYTES));
    }
}
