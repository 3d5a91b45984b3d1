//! What collective kernels receive: the collective kinds and the argument struct of the
//! LL-packet algorithm, shared by every backend's implementation (host: Rust; CUDA/HIP:
//! `kernels/{cuda,hip}/collectives.*`).
//!
//! ## The LL-packet algorithm (`mscclpp_collective_ll_*`)
//! Every rank owns a scratch buffer that every peer maps. It holds two halves; each half holds
//! one slot of `slot_bytes` packet bytes per source rank (at most [`MAX_RANKS`]). Data moves in
//! rounds of at most `slot_bytes / 2` data bytes per peer (LL16: 8 data bytes per 16-byte
//! packet). In round `k` of a call the flag is `base + 1 + k`, where `base` is the 64-bit counter
//! at `flag` (device memory), and the round uses half `flag % 2`; the kernel advances the counter
//! by the number of rounds when it ends (on GPUs block 0 does, once every other block has counted
//! itself in after reading the counter, so that no block waits for the others at the end). Flags
//! are never reset, so a call can be replayed (CUDA graphs) and stale packets never match.
//! Writing round `k + 2` into the half of round `k` is safe: a rank finishes reading round `k + 1`
//! only after every peer has written it, which each peer does only after it finished reading
//! round `k`.
//!
//! | collective | input | output | each round sends to peer `j` | and receives from peer `p` |
//! | --- | --- | --- | --- | --- |
//! | all-reduce | `count` | `count` | piece `k` of the input | piece `k`, reduced into the output |
//! | all-gather | `count` | `nranks * count` | piece `k` of the input | into output block `p` |
//! | reduce-scatter | `nranks * count` | `count` | piece `k` of input block `j` | reduced into the output |
//! | broadcast | `count` (root) | `count` | root: piece `k`; others: an acknowledgement | from the root (the root: acknowledgements) |
//! | all-to-all | `nranks * count` | `nranks * count` | piece `k` of input block `j` | into output block `p` |
//!
//! Broadcast is the one collective where data flows one way, so each non-root also writes
//! *acknowledgement* packets (value 0, the round's flag) into its slot in **every** peer's
//! scratch after it has read the round — packet `b` for block `b` of its grid (one block, packet
//! 0, on the host; every rank launches the same grid, of at most one block per packet of a slot
//! and at least one thread per peer) — and every rank reads the acknowledgements of every other
//! non-root after the round (the root: of all). That keeps the invariant the slot reuse rests on
//! — in every round every rank writes to and reads from every peer — so neither the next round
//! nor the next call of any rank can overwrite a half a peer is still reading (acknowledging to
//! the root alone left two non-roots unsynchronised with 3 ranks or more).
//!
//! A rank's own contribution goes straight from its input to its output. `Avg` is a sum divided
//! by `nranks` at the end (integer division for integer types).
//!
//! ## The short kernels (`mscclpp_collective_ll_short_*`)
//! An all-reduce, reduce-scatter, all-gather or all-to-all whose rank block fits one round
//! (`count * size <=` [`LlCollectiveArgs::round_bytes`]), launched with at least one thread per
//! packet of a rank block, may run a short kernel instead of the general LL one. It is the same
//! protocol — the same packets, slots, halves, flag (`base + 1`) and counter advance — so the
//! kernels interleave freely, and ranks may even pick differently for the same call
//! (`MSCCLPP_LL_SHORT`). Thread `i` of the grid sends packet `i` to every peer (reduce-scatter,
//! all-to-all: of the input block of that peer), then receives packet `i` from every peer:
//! reduced in rank order into the output (all-reduce, reduce-scatter; the own word from the
//! input, of the own block for reduce-scatter) or copied into output block `p` (all-gather,
//! all-to-all, which also store their own word into block `rank`). Broadcast keeps the general
//! kernel (its acknowledgements). Nothing loops over packets and no round barrier exists. The
//! general kernel's path for one round costs about 0.2 µs more on 2 x H200 (1 KiB all-reduce:
//! 2.4 against 2.1 µs; `experiments/ll-latency`).
//!
//! ## LL128 lines (`mscclpp_collective_ll128_allreduce`)
//! All-reduce of a message that fits one round, in 128-byte *lines* that carry 120 data bytes and
//! an 8-byte flag word (the flag in both 32-bit halves) — LL16 packets carry 8 of 16. They share
//! the LL flag counter and slot size, but have halves of their own, after the two LL halves
//! (LL128 half `h` at `(2 + h) * MAX_RANKS * slot_bytes`): an LL reader polling where a line's
//! data lay could take two data words equal to its flag for a packet. A call is one round, flag
//! `base + 1` in LL128 half `flag % 2`, and the counter advances by one (a call of no bytes
//! leaves it); LL and LL128 calls may follow each other in any order, since any two calls with
//! consecutive flags exchange with every peer. Line `i` of the slot `src` writes in a peer's scratch carries
//! data bytes `[120 i, 120 i + 120)` of `src`'s input: bytes `16 j .. 16 j + 16` of the line are
//! data for `j < 7`, bytes `112..120` the last 8 data bytes and `120..128` the flag word. A
//! call fits when `count * size <= ` [`LlCollectiveArgs::ll128_round_bytes`]. Used only where
//! [`crate::Capabilities::ll128`] holds: a GPU kernel writes a line with one instruction of eight
//! neighbouring threads (16 bytes each) and reads it the same way, accepting it once the flag
//! word carries the flag; the host kernel stores the flag word after the data (release) and loads
//! it before the data (acquire). Each rank reduces in rank order, its own input in place of a
//! line at its own rank, as LL does.
//!
//! ## The direct algorithm (`mscclpp_collective_direct`)
//! A bandwidth path for large messages: plain 16-byte stores of data into the peers' scratch,
//! pipelined in *steps*, with a 64-bit flag word per (phase, buffer, block, source rank) that the
//! writer stores (system-scope release) after its data. Every kind.
//!
//! **Scratch layout** (every rank's alike; `MB` = `max_blocks`, `S` = `slot_bytes`, `n` =
//! `nranks`; see [`DirectCollectiveArgs::scratch_bytes`]):
//!
//! | offset | what |
//! | --- | --- |
//! | `0` | `seq[MB]`: one u64 sequence counter per block index, touched only by the owner |
//! | `F = roundup(8 MB, 128)` | `flag[2 phase][3 buffer][MB block][MAX_RANKS src]`: u64 words written by the peers |
//! | `D = F + 384 MB` | `slot[MB block][2 phase][3 buffer][n src]`: `S` data bytes each |
//!
//! Everything is zero at set-up (before any peer can write into it) and never reset.
//!
//! **Sequences.** Block `b` (of a grid of `G <= MB` blocks, the same `G` on every rank) reads
//! `base = seq[b]` at start; its `c`-th iteration uses sequence `q = base + 1 + c` and buffer
//! `q % 3`; at the end it stores `seq[b] = base + iterations`. Since every rank makes the same
//! calls with the same grid, `seq[b]` agrees on all ranks; the counters only grow (CUDA-graph
//! replays stay consistent; there is no grid-wide synchronisation and no separate flag counter).
//! A *signal* (phase `f`, buffer `h`, sequence `q`) is: every thread of the block finishes its
//! stores, then one thread fences (system scope) and stores `q` into `flag[f][h][b][rank]` of
//! every peer. A *wait* is: one thread per peer polls its own `flag[f][h][b][p]` until it is
//! `>= q` (acquire), then the block synchronises.
//!
//! **Steps.** `B = count * size_of(dtype)`, `C = chunk_bytes` (a multiple of 16, at most `S`).
//! All-reduce: step `s` covers buffer bytes `[s n C, s n C + L)`, `L = min(n C, B - s n C)`,
//! split into `n` pieces of `P = min(C, roundup(ceil(L / n), 16))` bytes (piece `j` is
//! `[j P, min((j + 1) P, L))`, possibly empty). The other kinds: step `s` covers bytes
//! `[s C, s C + L)` of each rank block (of the root's buffer for broadcast),
//! `L = min(C, B - s C)`. Block `b` takes the steps `b, b + G, b + 2 G, ...` (its `c`-th
//! iteration is step `b + c G`).
//!
//! **All-reduce** (phase 0 = reduce-scatter slots, phase 1 = all-gather slots), iteration `c`:
//! 1. (`c = 0` only) push: piece `j` of the step's input into `slot[b][0][h][rank]` of peer `j`;
//!    signal (0, h, q).
//! 2. wait (0, h, q); reduce piece `rank`: the combination, in rank order, of every rank's piece
//!    (own from the input, the others from the own phase-0 slots); store it into the output and
//!    into `slot[b][1][h][rank]` of every peer; signal (1, h, q).
//! 3. if there is a next iteration: its push (step 1 with `q + 1`, the next buffer) and signal —
//!    the look-ahead that overlaps the next step's transfer with this step's last handshake.
//! 4. wait (1, h, q); copy the peers' pieces from the own phase-1 slots into the output.
//!
//! **The one-phase kinds** (phase 0 only), iteration `c` with step `s`, sequence `q`, buffer
//! `h = q % 3`:
//! 1. (`c = 0` only) push step `s` with `q` (below) and signal (0, h, q);
//! 2. wait (0, h, q);
//! 3. if there is a next iteration: push step `s + G` with `q + 1` into buffer `(q + 1) % 3` and
//!    signal (0, (q + 1) % 3, q + 1) — the look-ahead that keeps the links busy while this
//!    iteration consumes;
//! 4. consume step `s` from the own buffer-`h` slots.
//!
//! | kind | push (into `slot[b][0][h][rank]` of peer `j`) | consume |
//! | --- | --- | --- |
//! | all-gather | the step of the input (also into output block `rank`) | slot of `p` into output block `p` |
//! | reduce-scatter | the step of input block `j` | reduce (rank order, own block from the input) into the output |
//! | broadcast | root: the step of its input (also into its output); others: nothing | non-roots: the root's slot into the output |
//! | all-to-all | the step of input block `j` (and input block `rank` into output block `rank`) | slot of `p` into output block `p` |
//!
//! Every rank signals in step 1/3 even when it pushed nothing (broadcast's non-roots): the
//! signal also tells the peer that the sender consumed everything up to sequence `q - 2`.
//!
//! **Why three buffers suffice.** A rank writes buffer `h` of a peer's slot (or its flag) for
//! sequence `q + 3` only after it saw a signal that the peer gave after consuming sequence `q`
//! from that buffer: one-phase kinds — the write of `q + 3` follows the wait (0, q + 2), which the
//! peer signals (its step 3 of iteration `q + 1`, or step 1) after its step 4 of `q`; all-reduce —
//! the phase-0 write of `q + 1` follows the wait (0, q), given after the peer reduced `q - 1`;
//! the phase-1 write of `q` follows the wait (0, q), given after the peer copied `q - 2`'s
//! phase-1 slots. The same holds across calls of any kinds, since the sequences of a block
//! continue from call to call and every kind keeps these orders.
//!
//! **In place.** All-reduce (`input == output`): a piece's input is read (push, or the reduction
//! of the own piece by the same thread) before its output is written. All-gather (`input ==`
//! output block `rank`) and reduce-scatter (`output ==` input block `rank`) likewise; broadcast's
//! non-roots never read their input; all-to-all is never in place.
//!
//! **Rounding.** The GPU kernels accumulate 16-bit floats in f32 and round once per element; the
//! host kernel rounds after every combination (as the LL host kernel does): results agree
//! exactly for two ranks and in the last bit otherwise (and for `Avg`).
//!
//! ## The read algorithm (`mscclpp_collective_read_allreduce`)
//! A one-shot all-reduce for mid-size messages in which every rank *reads* every peer's input
//! where it lies and reduces it locally: the data crosses each link once, as plain 16-byte
//! loads, with no packet overhead and no fence on the data path. A rank's input is read in place
//! when it lies in a *window* registered with the communicator (user-buffer registration: the
//! IPC mapping is made once, when the window is registered); otherwise the rank first copies it
//! into the *staging area* of its read scratch, and the peers read that. Ranks may differ in
//! this: each one tells the others, in the call, where its input is.
//!
//! **Windows.** Every rank holds a *window table* in its device memory: `u64
//! table[2][MAX_WINDOWS][MAX_RANKS]`, entry `[0][w][p]` = the address, mapped in this rank, where
//! rank `p`'s window `w` starts, and `[1][w][p]` its length in bytes; a key whose offset plus
//! the call's bytes runs past the window is refused (the GPU kernel traps, the host errs). Window 0 is each rank's staging area; windows `1..` are
//! registered by collective calls (every rank registers its own buffer for the same index). An
//! input is named by a *key*: `w << 48 | offset` ([`read_key`]).
//!
//! **Scratch layout** (every rank's alike; `MB` = `max_blocks`, `S` = `staging_bytes`):
//!
//! | offset | what |
//! | --- | --- |
//! | `0` | `seq[MB]`: one u64 sequence counter per block index, touched only by the owner |
//! | `P = roundup(8 MB, 128)` | `start[MB block][MAX_RANKS src]`: LL16 packets written by the peers |
//! | `P + 16 MB MAX_RANKS` | `done[MB block][MAX_RANKS src]`: LL16 packets written by the peers |
//! | `D = P + 32 MB MAX_RANKS` | the staging area: `S` bytes |
//!
//! **Work split.** `B = count * size_of(dtype)` bytes, `U = ceil(B / 16)` units of 16 bytes
//! (the last one possibly partial). The grid has `G <= MB` blocks of `T` threads, the same on
//! every rank ([`ReadCollectiveArgs::grid`]); block `b` owns units `[b W, min((b + 1) W, U))`,
//! `W = ceil(U / G)`, and its thread `t` units `b W + t + j T` for `j < ceil(W / T)`, at most
//! [`ReadCollectiveArgs::MAX_UNITS_PER_THREAD`] (the GPU kernels keep a thread's results in
//! registers). Block `b` of every rank owns the same units, so block `b` only ever waits for block
//! `b` of the peers.
//!
//! **A call**, block `b`, sequence `q = seq[b] + 1`, flag `q` (truncated to 32 bits in packets):
//! 1. If the input is not in a window: copy the block's units into the staging area (same byte
//!    offsets), then fence (system scope) — the peers read them after step 2.
//! 2. Write the *start* packet `{key, q}` into `start[b][rank]` of every peer.
//! 3. Wait for `start[b][p]` of every peer `p` to carry `q`; rank `p`'s input is at
//!    `table[w][p] + offset` for its key.
//! 4. Reduce the owned units: every rank's data in rank order (this rank's from its input, the
//!    peers' read from where they are), kept (registers / a buffer) — not yet stored.
//! 5. Write the *done* packet `{0, q}` into `done[b][rank]` of every peer, then wait for
//!    `done[b][p]` of every peer: from then on no peer reads this rank's input any more.
//! 6. Store the results into the output; `seq[b] = q`.
//!
//! Storing only after step 5 is what makes the call safe in place (a peer may still be reading
//! the input the output overwrites) and what lets the caller reuse the input as soon as the call
//! has ended on its stream. **Reuse.** A peer writes `start[b][src]` for `q + 1` only after it
//! passed its step 5 of `q`, which needs this rank's done packet of `q`, sent after this rank
//! read the start packet of `q`; it writes `done[b][src]` for `q + 1` only after reading this
//! rank's start packet of `q + 1`, sent after this rank finished `q`; this rank overwrites its
//! staging area for `q + 1` only after every peer's done packet of `q`. Counters only grow, so
//! graph replays stay consistent and a stale packet never matches. Calls of the other algorithms
//! in between touch none of this memory.

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

/// Bytes of an LL128 line.
pub const LL128_LINE_BYTES: u64 = 128;

/// Data bytes of an LL128 line (the rest is the flag word).
pub const LL128_LINE_DATA_BYTES: u64 = 120;

/// Bytes of the per-communicator LL state that [`LlCollectiveArgs::flag`] points at.
pub const LL_STATE_BYTES: usize = 64;

/// Arguments of the LL kernels (`mscclpp_collective_ll_copy` and
/// `mscclpp_collective_ll_reduce_<type>_<op>`; see [`crate::KernelId::collective_ll`]).
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

/// Arguments of `mscclpp_collective_direct` ([`crate::KernelId::COLLECTIVE_DIRECT`]; see the
/// module documentation for the protocol and the scratch layout).
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
    /// [`CollectiveKind`] code (all-reduce, all-gather or reduce-scatter).
    pub kind: u32,
    /// [`crate::DataType`] code.
    pub dtype: u32,
    /// [`crate::ReduceOp`] code.
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
}

// SAFETY: repr(C), integers only, no implicit padding (six u64, an array of u64, eight u32);
// every bit pattern is valid.
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

/// Arguments of `mscclpp_collective_read_allreduce` ([`crate::KernelId::COLLECTIVE_READ_ALLREDUCE`];
/// see the module documentation for the protocol and the scratch layout).
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
    /// [`crate::DataType`] code.
    pub dtype: u32,
    /// [`crate::ReduceOp`] code.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks (2..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// Blocks the scratch was laid out for (the layout's `MB`); the grid must not exceed it.
    pub max_blocks: u32,
    /// Zero.
    pub _pad: u32,
}

// SAFETY: repr(C), integers only, no implicit padding (seven u64, an array of u64, six u32);
// every bit pattern is valid.
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
